//! The pyramid flags (`--levels`, `--factors`, `--downsample`) shared by
//! `plan`, `rechunk` and `mount`, turned into a [`Pyramid`], and how a
//! pyramid's cost and run are reported.

use serde_json::{json, Value};

use crate::array::axes::AxisOrder;
use crate::array::units::show_bytes;
use crate::cli::args::PyramidArgs;
use crate::format::BlockFormat;
use crate::output::pyramid::files_of;
use crate::plan::pyramid::{rechunk_pyramid_cost, Pyramid, PyramidCost, PyramidFlags};
use crate::plan::Plan;

/// The pyramid `args` ask for over an array of `shape` (internal order) in
/// blocks of `block`, written as `format` (see [`PyramidFlags::pyramid`]).
pub(super) fn pyramid_of(
    args: &PyramidArgs,
    shape: &[u64],
    block: &[u64],
    order: AxisOrder,
    format: BlockFormat,
) -> anyhow::Result<Option<Pyramid>> {
    Ok(flags_of(args).pyramid(shape, block, order, format)?)
}

/// The flags as the library takes them.
pub(super) fn flags_of(args: &PyramidArgs) -> PyramidFlags {
    PyramidFlags {
        levels: args.levels.clone(),
        factors: args.factors.clone(),
        downsample: args.downsample.clone(),
    }
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
        "streamed": cost.streamed,
        "read_back_because": cost.read_back_because,
    })
}

/// The pyramid's cost for `format`'s files after level 0's `plan`.
pub(super) fn cost_of(
    plan: &Plan,
    pyramid: &Pyramid,
    format: BlockFormat,
    elem: u64,
    mem: Option<u64>,
) -> anyhow::Result<PyramidCost> {
    Ok(rechunk_pyramid_cost(
        plan,
        pyramid,
        &files_of(format),
        elem,
        mem,
    )?)
}

/// Lines for `plan`'s report.
pub(super) fn print_cost(pyramid: &Pyramid, cost: &PyramidCost, order: AxisOrder) {
    let total = cost.total();
    let built = if cost.streamed {
        "built in memory as level 0 is written, nothing read back".to_string()
    } else {
        format!(
            "{} read back from level k to make k+1 ({} reads)",
            show_bytes(total.bytes_read),
            total.reads
        )
    };
    println!(
        "pyramid       {} levels by {}, factors {:?}: {} more blocks, {} written, {built}, {} \
         held at most",
        pyramid.levels.len(),
        pyramid.method.name(),
        order.to_user(&pyramid.factors),
        total.blocks,
        show_bytes(total.bytes_written),
        show_bytes(cost.peak_bytes)
    );
    if let Some(because) = &cost.read_back_because {
        println!("              read back, not built as level 0 is written: {because}");
    }
}
