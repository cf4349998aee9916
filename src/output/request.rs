//! What `plan`, `rechunk` and `mount` are asked to make of an input: the
//! output blocks (`--shape`, `--shard`), their format and encoding, the
//! input's values, the memory and strategy to plan with, and a pyramid.
//! Checked against the scanned input and planned here, once for the three
//! commands, so that they refuse alike and plan in the same budget
//! ([`plan_in_budget`]).

use std::path::PathBuf;

use crate::array::axes::AxisOrder;
use crate::array::geometry::show_shape;
use crate::array::space::Space;
use crate::array::units::{parse_shape, show_bytes};
use crate::error::{Error, Result};
use crate::format::encode::{Compressor, Encoding};
use crate::format::BlockFormat;
use crate::input::{HeaderChecks, InputArray, Values};
use crate::output::directory::{OutputSpec, COMMIT_BATCH_BYTES};
use crate::plan::pyramid::{Pyramid, PyramidFlags};
use crate::plan::{self, Plan, Problem, Strategy};

/// What a command was asked to make of one input.
#[derive(Clone, Debug)]
pub struct Request {
    /// IN: a directory of block files, one file, a Zarr array or a TIFF stack.
    pub input: PathBuf,
    /// The HDF5 dataset (or Zarr array in a group) to read.
    pub dataset: String,
    /// `--values`: the input's stored or scaled values (`None`: not said).
    pub values: Option<Values>,
    /// `--format` (`None`: the input's default output format).
    pub format: Option<BlockFormat>,
    /// `--shape` as given: the output blocks (or the chunks inside
    /// shards), comma-separated, in the input's user-facing order.
    pub shape: String,
    /// `--shard` as given: Zarr v3 shards of whole chunks of `shape`.
    pub shard: Option<String>,
    /// `--compress` as given.
    pub compress: Option<String>,
    /// `--mem` (`None`: no limit but the memory cgroup's).
    pub mem: Option<u64>,
    pub strategy: Strategy,
    /// `--levels`, `--factors`, `--downsample`.
    pub pyramid: PyramidFlags,
}

/// A request checked against its input: the format the blocks are
/// written in, how they are encoded, and the problem to plan.
pub struct Checked {
    /// The input, with the values asked for.
    pub input: InputArray,
    /// The format asked for (before [`BlockFormat::for_output_blocks`]).
    pub format: BlockFormat,
    pub encoding: Encoding,
    /// Sharded, its output blocks are the shards, each encoded whole.
    pub problem: Problem,
    /// The dataset asked for: also what an HDF5 output of a Zarr or MINC2
    /// input (whose image has no /data of its own) names its dataset.
    pub dataset: String,
}

impl Checked {
    /// How the output blocks are written: as `format` (the one asked
    /// for, or the one the largest block needs), placed in the world by
    /// `space` (the input's, or a job record's).
    pub fn output(&self, format: BlockFormat, space: Space) -> OutputSpec {
        OutputSpec {
            format,
            dataset: self.dataset.clone(),
            dtype: self.input.dtype,
            space,
            axis_order: self.input.axis_order(),
            encoding: self.encoding.clone(),
            commit_batch_bytes: COMMIT_BATCH_BYTES,
        }
    }
}

impl Request {
    /// The input scanned, its headers checked as `checks` says.
    pub fn scan(&self, checks: HeaderChecks) -> Result<InputArray> {
        InputArray::scan_with(&self.input, Some(&self.dataset), checks)
    }

    /// The output format: `--format`, or the input's default.
    fn format_for(&self, input: &InputArray) -> BlockFormat {
        self.format.unwrap_or_else(|| input.format.default_output())
    }

    /// `input` (scanned, or taken from a job's record) checked against
    /// the request: its values, the encoding the format can hold, shards
    /// of whole chunks, blocks with one side per dimension; and the
    /// problem they pose.
    pub fn check(&self, input: InputArray) -> Result<Checked> {
        let format = self.format_for(&input);
        let input = input.with_values(self.values, format)?;
        let order = input.axis_order();
        let encoding = self.encoding(&input.shape, order, format)?;
        let blocks = self.shard.as_deref().unwrap_or(&self.shape);
        let problem = problem_of(&input, blocks, format)?;
        Ok(Checked {
            input,
            format,
            problem: encoded(problem, &encoding),
            encoding,
            dataset: self.dataset.clone(),
        })
    }

    /// The encoding asked for (see [`encoding_of`]).
    fn encoding(&self, array: &[u64], order: AxisOrder, format: BlockFormat) -> Result<Encoding> {
        encoding_of(
            &self.shape,
            self.shard.as_deref(),
            self.compress.as_deref(),
            (array, order),
            format,
        )
    }

    /// The pyramid asked for over an array of `shape` in blocks of `block`
    /// (internal order), written as `format`, if any.
    pub fn pyramid(
        &self,
        shape: &[u64],
        block: &[u64],
        order: AxisOrder,
        format: BlockFormat,
    ) -> Result<Option<Pyramid>> {
        self.pyramid.pyramid(shape, block, order, format)
    }

    /// The plan of `problem` within `--mem` less `reserved` bytes (which
    /// building pyramid blocks holds beside it), and the budget it was
    /// made in.
    pub fn plan(&self, problem: &Problem, reserved: u64) -> Result<(Plan, Budget)> {
        let requested = self.mem.map(|mem| mem.saturating_sub(reserved));
        plan_in_budget(problem, self.strategy, requested)
    }
}

/// The plan of `problem` with `strategy` within `requested` bytes, capped
/// at half of the memory cgroup's limit when a plan fits there (see
/// [`plan::plan_within`]), and the budget it was made in.
pub fn plan_in_budget(
    problem: &Problem,
    strategy: Strategy,
    requested: Option<u64>,
) -> Result<(Plan, Budget)> {
    let cgroup_limit = crate::sys::cgroup::memory_limit();
    let (plan, used) = plan::plan_within(problem, strategy, requested, cgroup_limit)?;
    Ok((
        plan,
        Budget {
            used,
            requested,
            cgroup_limit,
        },
    ))
}

/// The memory a plan was made in, and why.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// What the plan was given (None: unlimited).
    pub used: Option<u64>,
    /// `--mem` (None: not given).
    pub requested: Option<u64>,
    /// The memory cgroup's limit, which caps `used` at half of it.
    pub cgroup_limit: Option<u64>,
}

impl Budget {
    /// " within 128 MiB (--mem 192 MiB, capped at half of the 256 MiB memory cgroup)".
    pub fn describe(&self) -> String {
        let Some(used) = self.used else {
            return " (no memory limit)".into();
        };
        let mut text = format!(" within {}", show_bytes(used));
        if self.used != self.requested {
            if let Some(limit) = self.cgroup_limit {
                text += &format!(
                    " ({}half of the {} memory cgroup: the rest is page cache for reading ahead and writing back)",
                    self.requested
                        .map_or(String::new(), |mem| format!("--mem {}, capped at ", show_bytes(mem))),
                    show_bytes(limit)
                );
            }
        }
        text
    }
}

/// The problem of rechunking `input` into blocks of `shape` (in the
/// input's user-facing order) written as `format` (which says how its
/// files are shaped: Zarr pads edge chunks).
pub fn problem_of(input: &InputArray, shape: &str, format: BlockFormat) -> Result<Problem> {
    let order = input.axis_order();
    let output = order.to_internal(&parse_shape(shape)?);
    if output.len() != input.ndim() {
        return Err(Error::BadArgument(format!(
            "--shape {} has {} dimensions but the input array {} has {}",
            shape,
            output.len(),
            show_shape(&order.to_user(&input.shape)),
            input.ndim()
        )));
    }
    crate::output::problem_for(input, output, format)
}

/// How `compress` and `shard` (`--compress`, `--shard`, of chunks of
/// `shape`, all in `order`) ask blocks of `format` of an array of `array`
/// (internal order) to be encoded; refuses what the format cannot hold,
/// and shards that are no whole number of chunks.
pub fn encoding_of(
    shape: &str,
    shard: Option<&str>,
    compress: Option<&str>,
    (array, order): (&[u64], AxisOrder),
    format: BlockFormat,
) -> Result<Encoding> {
    let compressor = compress.map(str::parse::<Compressor>).transpose()?;
    let shard_chunks = match shard {
        None => None,
        Some(shard) => Some(shard_chunks(array, order, shard, shape)?),
    };
    let encoding = Encoding {
        compressor,
        shard_chunks,
    };
    encoding.check(format)?;
    Ok(encoding)
}

/// `problem` with its output blocks encoded whole, if `encoding` says so.
pub fn encoded(problem: Problem, encoding: &Encoding) -> Problem {
    if encoding.is_encoded() {
        problem.with_encoded_outputs()
    } else {
        problem
    }
}

/// `text`, a shape given as `option`; refused saying which option it was.
fn parsed(text: &str, option: &str) -> Result<Vec<u64>> {
    parse_shape(text).map_err(|e| Error::BadArgument(format!("{option}: {e}")))
}

/// The chunk shape inside shards of `shard` (both as `--shard` and
/// `--shape` give them, in `order`), in internal order.
fn shard_chunks(array: &[u64], order: AxisOrder, shard: &str, chunk: &str) -> Result<Vec<u64>> {
    let parse = |text: &str, option: &str| -> Result<Vec<u64>> {
        let sides = order.to_internal(&parsed(text, option)?);
        if sides.len() != array.len() || sides.contains(&0) {
            return Err(Error::BadArgument(format!(
                "{option} {text} must have {} positive sides, one per dimension of the array {}",
                array.len(),
                show_shape(&order.to_user(array))
            )));
        }
        Ok(sides)
    };
    let (shards, chunks) = (parse(shard, "--shard")?, parse(chunk, "--shape")?);
    crate::format::encode::shard_chunks(array, &shards, &chunks, order)
}
