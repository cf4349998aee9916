//! Getting a view ready to serve: the input scanned, the plan made, the
//! formats' templates checked and the staging area opened, so that what a
//! mount would trip over is found before anything is mounted.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::format::BlockFormat;
use crate::input::{HeaderChecks, InputArray};
use crate::output::pyramid::{files_of, pyramid_axes};
use crate::output::request::Request;
use crate::plan::pyramid::{pyramid_cost, rows_per_pass};
use crate::plan::{Plan, Problem};
use crate::view::core::ViewCore;
use crate::view::layout::{BlockTemplates, ViewLayout, ViewPyramid};
use crate::view::materialise::{on_demand_bytes, on_demand_threads};
use crate::view::node::Access;
use crate::view::staging::{make_private_dir, Manifest, Staging};

/// What `rechunkfs mount` was asked for.
#[derive(Clone, Debug)]
pub struct MountRequest {
    /// What to make of the input, as `rechunk` is asked (uncompressed:
    /// a view's sizes are exact before its data exist).
    pub request: Request,
    pub view: PathBuf,
    pub staging: Option<PathBuf>,
    pub rebuild: bool,
    pub allow_other: bool,
    /// Never extract blocks ahead of the plan for waiting readers.
    pub in_order: bool,
}

/// A view ready to mount: everything checked, nothing running yet.
pub struct PreparedView {
    pub core: Arc<ViewCore>,
    pub input: InputArray,
    pub plan: Plan,
    pub view: PathBuf,
    pub allow_other: bool,
    /// Whether blocks readers wait for may be extracted ahead of the plan
    /// (the plan leaves their memory free: `status` shows how much).
    pub on_demand: bool,
}

/// Scans, plans and opens the staging area: everything short of mounting.
pub fn prepare(request: &MountRequest) -> Result<PreparedView> {
    let mut laps = Laps::new();
    let asked = &request.request;
    // Headers are checked as the materialiser reads each block (see
    // crate::input): a bad one stops it, and `status` says why.
    let input = asked.scan(HeaderChecks::BeforeUse)?;
    laps.mark("scan");
    let checked = asked.check(input)?;
    let (input, format, problem) = (&checked.input, checked.format, &checked.problem);
    let shard_chunks = checked.encoding.shard_chunks.clone();
    let pyramid = pyramid_of(asked, input, &problem.output_block, format)?;
    if pyramid.is_some() && shard_chunks.is_some() {
        return Err(Error::BadArgument(
            "--levels and --shard together are not served: a pyramid's levels are chunks of \
             --shape; leave out --shard for a pyramid, or --levels for shards"
                .into(),
        ));
    }
    let reserved = pyramid.as_ref().map_or(0, |p| p.peak_bytes);
    let (plan, on_demand) = match request.in_order {
        true => (plan_view(asked, problem, reserved)?, None),
        false => {
            plan_beside_extraction(asked, (input, problem), reserved, shard_chunks.as_deref())?
        }
    };
    laps.mark("plan");
    let format = format.for_output_blocks(&problem.output_block);
    let staging_dir = match &request.staging {
        Some(dir) => dir.clone(),
        None => {
            // A pyramid's description goes into the key: another pyramid
            // of the same blocks has an area of its own.
            let key = match &pyramid {
                Some(_) => format!("{}|{}", input.dataset, asked.pyramid.describe()),
                None => input.dataset.clone(),
            };
            let dir = Staging::default_dir(
                &input.source,
                &key,
                &problem.output_block,
                format,
                asked.values,
            )?;
            // Shards of other chunks lay their files out otherwise.
            let dir = match (&shard_chunks, dir.file_name()) {
                (Some(inner), Some(leaf)) => dir.with_file_name(format!(
                    "{}-shards-of-{}",
                    leaf.to_string_lossy(),
                    crate::array::geometry::show_shape(inner).replace('×', "x")
                )),
                _ => dir,
            };
            // ~/.cache/rechunkfs lists the areas, named by their inputs.
            if let Some(areas) = dir.parent() {
                make_private_dir(areas)?;
            }
            dir
        }
    };
    check_apart(&request.view, &input.source, &staging_dir)?;
    let layout = ViewLayout {
        source: input.source.clone(),
        array: input.shape.clone(),
        input_block: input.block_shape.clone(),
        output_block: problem.output_block.clone(),
        output: checked.output(format, input.space()?),
    };
    // Before the staging area: what the format cannot hold is refused
    // with nothing made.
    let templates = match &pyramid {
        Some(view) => {
            BlockTemplates::for_levels(&layout, &view.pyramid.levels, Some(&view.pyramid))?
        }
        None => BlockTemplates::for_view(&layout, &plan.output)?,
    };
    laps.mark("templates");
    let mut manifest = Manifest::new(input, &problem.output_block, format);
    manifest.shard_chunks = shard_chunks;
    if pyramid.is_some() {
        manifest = manifest.with_pyramid(asked.pyramid.describe());
    }
    let (staging, done) = Staging::open(&staging_dir, &manifest, request.rebuild)?;
    laps.mark("staging");
    let access = Access::of_inputs(&input.access()?);
    let core = Arc::new(
        ViewCore::with_levels(layout, &plan, templates, Arc::new(staging), &done, pyramid)
            .with_access(access),
    );
    let (reserve, threads) = on_demand.unwrap_or((0, 1));
    core.reserve_on_demand(reserve, threads);
    laps.mark("view");
    log::debug!(
        "prepared the view of {} input blocks: {laps}",
        input.blocks.len()
    );
    Ok(PreparedView {
        core,
        input: checked.input,
        plan,
        view: request.view.clone(),
        allow_other: request.allow_other,
        on_demand: on_demand.is_some(),
    })
}

/// The view's plan, made within `--mem` less `reserved` and what
/// extracting a block beside it holds ([`on_demand_bytes`]), with that
/// reserve and the threads it is for: as many threads as may help, or one
/// if `--mem` holds only that beside the plan. A `--mem` too small for
/// both is the plan's (no reserve).
fn plan_beside_extraction(
    asked: &Request,
    (input, problem): (&InputArray, &Problem),
    reserved: u64,
    shard_chunks: Option<&[u64]>,
) -> Result<(Plan, Option<(u64, usize)>)> {
    let most = on_demand_threads(input, &problem.output(), problem.workers);
    let mut refused = None;
    let tries = if most > 1 { vec![most, 1] } else { vec![1] };
    for threads in tries {
        let bytes = on_demand_bytes(input, &problem.output_block, shard_chunks, threads)?;
        match plan_view(asked, problem, reserved + bytes) {
            Ok(plan) => return Ok((plan, Some((bytes, threads)))),
            Err(error) => refused = Some((bytes, error)),
        }
    }
    if let Some((bytes, error)) = refused {
        log::warn!(
            "--mem holds the plan but not also the {bytes} bytes of extracting a block beside it \
             ({error}): blocks readers wait for wait for the plan; a larger --mem serves them at \
             once"
        );
    }
    Ok((plan_view(asked, problem, reserved)?, None))
}

/// Refuses a staging area inside the view (the mount would hide it from
/// the daemon writing it) or inside the input (whose files it would add
/// to), and a view inside the staging area. Compared by identity (device
/// and inode), so links and other spellings of a path are caught too.
fn check_apart(view: &Path, input: &Path, staging: &Path) -> Result<()> {
    let staging_within = ancestry(staging);
    let refuse = |problem: String| Err(Error::BadArgument(problem));
    if identity(view).is_some_and(|v| staging_within.contains(&v)) {
        return refuse(format!(
            "the staging area {} is inside the view {}: the mounted view would hide it. Pass \
             --staging a directory outside the view",
            staging.display(),
            view.display()
        ));
    }
    if identity(input).is_some_and(|i| staging_within.contains(&i)) {
        return refuse(format!(
            "the staging area {} is the input {} or inside it: it would add files to the \
             input. Pass --staging a directory outside the input",
            staging.display(),
            input.display()
        ));
    }
    if identity(staging).is_some_and(|s| ancestry(view).contains(&s)) {
        return refuse(format!(
            "the view {} is inside the staging area {}: mount it on a directory outside the \
             staging area",
            view.display(),
            staging.display()
        ));
    }
    Ok(())
}

/// The device and inode of the file at `path`, if there is one.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The identities of `path` (if it exists) and of every directory it is
/// in, resolved where it exists.
fn ancestry(path: &Path) -> Vec<(u64, u64)> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let resolved = absolute
        .ancestors()
        .find_map(|a| {
            let rest = absolute.strip_prefix(a).ok()?;
            Some(a.canonicalize().ok()?.join(rest))
        })
        .unwrap_or(absolute);
    resolved.ancestors().filter_map(identity).collect()
}

/// The pyramid `request` asks for, if any: its levels, axes, and passes
/// building a block in a quarter of `--mem` (whole blocks when that holds
/// them), which the plan of level 0 then leaves free.
fn pyramid_of(
    request: &Request,
    input: &InputArray,
    output_block: &[u64],
    format: BlockFormat,
) -> Result<Option<ViewPyramid>> {
    let Some(pyramid) =
        request
            .pyramid
            .pyramid(&input.shape, output_block, input.axis_order(), format)?
    else {
        return Ok(None);
    };
    let level0 = &pyramid.levels[0];
    let block: Vec<u64> = (0..level0.ndim())
        .map(|d| level0.axis(d).extent(0))
        .collect();
    let space = input.space()?;
    let (axes, rotated) = pyramid_axes(
        format,
        input.format,
        &space,
        &input.shape,
        &block,
        input.dtype,
    )?;
    if rotated {
        log::warn!(
            "the input's affine rotates its axes, which the pyramid's metadata cannot record: \
             it gives the voxel sizes and origin only"
        );
    }
    let files = files_of(format);
    let elem = input.dtype.size as u64;
    let budget = request.mem.map(|mem| mem / 4);
    let mut rows = vec![0];
    for k in 1..pyramid.levels.len() {
        rows.push(rows_per_pass(&pyramid, &files, k, elem, budget)?);
    }
    let cost = pyramid_cost(&pyramid, &files, elem, budget)?;
    Ok(Some(ViewPyramid {
        peak_bytes: cost.peak_bytes,
        pyramid,
        axes,
        rows,
    }))
}

/// The plan of `problem` within `request`'s memory less `reserved` bytes,
/// which building pyramid blocks and extracting blocks on demand hold
/// beside it.
fn plan_view(request: &Request, problem: &Problem, reserved: u64) -> Result<Plan> {
    let (plan, budget) = request.plan(problem, reserved)?;
    if reserved > 0 {
        log::debug!(
            "planning within {:?} bytes: {reserved} are for pyramid blocks and blocks \
             extracted on demand",
            budget.requested
        );
    } else if budget.used != request.mem {
        log::info!(
            "planning within {} bytes, half of the memory cgroup's {} bytes (--mem: {:?})",
            budget.used.unwrap_or(0),
            budget.cgroup_limit.unwrap_or(0),
            request.mem
        );
    }
    Ok(plan)
}

/// Where the time of a few steps went, for a debug log line.
struct Laps {
    started: Instant,
    last: Instant,
    steps: Vec<(&'static str, Duration)>,
}

impl Laps {
    fn new() -> Laps {
        let now = Instant::now();
        Laps {
            started: now,
            last: now,
            steps: Vec::new(),
        }
    }

    /// The step that ends now.
    fn mark(&mut self, step: &'static str) {
        let now = Instant::now();
        self.steps.push((step, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Laps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ms", self.started.elapsed().as_secs_f64() * 1e3)?;
        for (i, (step, took)) in self.steps.iter().enumerate() {
            let open = if i == 0 { " (" } else { ", " };
            write!(f, "{open}{step} {:.1}", took.as_secs_f64() * 1e3)?;
        }
        if !self.steps.is_empty() {
            write!(f, ")")?;
        }
        Ok(())
    }
}
