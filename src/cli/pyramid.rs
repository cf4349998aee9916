//! The pyramid flags (`--levels`, `--factors`, `--downsample`) shared by
//! `plan`, `rechunk` and `mount`, turned into a [`Pyramid`], and how a
//! pyramid's cost and run are reported.

use anyhow::bail;
use serde_json::{json, Value};

use crate::array::axes::AxisOrder;
use crate::array::units::{parse_shape, show_bytes};
use crate::cli::PyramidArgs;
use crate::format::BlockFormat;
use crate::output::pyramid::files_of;
use crate::plan::pyramid::{
    pyramid_cost, spatial_dims, Downsample, LevelCount, Pyramid, PyramidCost,
};

/// The pyramid `args` ask for over an array of `shape` (internal order) in
/// blocks of `block`, written as `format`; `None` when there is none to make
/// (no `--levels`, and a format other than precomputed, which always has
/// at least its level 0 scale).
pub(super) fn pyramid_of(
    args: &PyramidArgs,
    shape: &[u64],
    block: &[u64],
    order: AxisOrder,
    format: BlockFormat,
) -> anyhow::Result<Option<Pyramid>> {
    let count = match &args.levels {
        Some(text) => text.parse::<LevelCount>()?,
        None if format == BlockFormat::Precomputed => LevelCount::Exactly(1),
        None => return Ok(None),
    };
    let method: Downsample = args.downsample.parse()?;
    let factors = factors_of(args.factors.as_deref(), shape.len(), order)?;
    if count == LevelCount::Exactly(1) && format != BlockFormat::Precomputed {
        return Ok(None);
    }
    Ok(Some(Pyramid::new(shape, block, factors, count, method)?))
}

/// `--factors` (per spatial axis, in the user's order, or per axis) as
/// factors per internal axis; 2 along each spatial axis by default.
fn factors_of(text: Option<&str>, ndim: usize, order: AxisOrder) -> anyhow::Result<Vec<u64>> {
    let spatial = spatial_dims(ndim);
    let Some(text) = text else {
        return Ok((0..ndim)
            .map(|d| if spatial.contains(&d) { 2 } else { 1 })
            .collect());
    };
    let given = parse_shape(text)?;
    let user: Vec<u64> = if given.len() == ndim {
        given
    } else if given.len() == spatial.len() {
        // The spatial axes are the last internal ones: the user's first
        // ones when the user's order is reversed (NIfTI).
        let rest = vec![1; ndim - spatial.len()];
        match order {
            AxisOrder::C => [rest, given].concat(),
            _ => [given, rest].concat(),
        }
    } else {
        bail!(
            "--factors {text} has {} values; give one per spatial axis ({}) or one per axis ({ndim})",
            given.len(),
            spatial.len()
        );
    };
    let internal = order.to_internal(&user);
    if let Some(d) = (0..ndim).find(|&d| !spatial.contains(&d) && internal[d] != 1) {
        bail!(
            "--factors {text}: axis {} is not spatial (the spatial axes are the last three in C \
             order) and is kept whole: give it a factor of 1",
            order.user_axis(d, ndim)
        );
    }
    Ok(internal)
}

/// The plan's account of a pyramid: levels, their shapes, and what
/// building them costs.
pub(super) fn cost_json(pyramid: &Pyramid, cost: &PyramidCost, order: AxisOrder) -> Value {
    let levels: Vec<Value> = pyramid
        .levels
        .iter()
        .enumerate()
        .map(|(k, grid)| {
            let block: Vec<u64> = (0..grid.ndim()).map(|d| grid.axis(d).extent(0)).collect();
            let mut level = json!({
                "level": k,
                "shape": order.to_user(&grid.array_shape()),
                "block": order.to_user(&block),
                "blocks": grid.count(),
            });
            if k > 0 {
                level["cost"] = json!(cost.levels[k - 1]);
            }
            level
        })
        .collect();
    json!({
        "levels": levels,
        "factors": order.to_user(&pyramid.factors),
        "downsample": pyramid.method,
        "peak_memory_bytes": cost.peak_bytes,
        "total": cost.total(),
    })
}

/// The pyramid's cost for `format`'s files.
pub(super) fn cost_of(
    pyramid: &Pyramid,
    format: BlockFormat,
    elem: u64,
    mem: Option<u64>,
) -> anyhow::Result<PyramidCost> {
    Ok(pyramid_cost(pyramid, &files_of(format), elem, mem)?)
}

/// Lines for `plan`'s report.
pub(super) fn print_cost(pyramid: &Pyramid, cost: &PyramidCost, order: AxisOrder) {
    let total = cost.total();
    println!(
        "pyramid       {} levels by {}, factors {:?}: {} more blocks, {} written, {} read back \
         from level k to make k+1 ({} reads), {} held at most",
        pyramid.levels.len(),
        pyramid.method.name(),
        order.to_user(&pyramid.factors),
        total.blocks,
        show_bytes(total.bytes_written),
        show_bytes(total.bytes_read),
        total.reads,
        show_bytes(cost.peak_bytes)
    );
}
