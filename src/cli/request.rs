//! The request `plan`, `rechunk` and `mount` build from their arguments.

use crate::cli::args::{mem_of, InputArgs, PlanningArgs, PyramidArgs};
use crate::cli::pyramid;
use crate::format::BlockFormat;

/// The request `plan`, `rechunk` and `mount` make of `input` from their
/// arguments: `--format` (`format`) and the planning, input and pyramid
/// options they share.
pub(super) fn request_of(
    input: &std::path::Path,
    format: Option<&str>,
    planning: &PlanningArgs,
    input_args: &InputArgs,
    pyramid: &PyramidArgs,
) -> anyhow::Result<crate::output::request::Request> {
    Ok(crate::output::request::Request {
        input: input.to_path_buf(),
        dataset: input_args.dataset.clone(),
        values: input_args.values()?,
        format: format.map(str::parse::<BlockFormat>).transpose()?,
        shape: planning.shape.clone(),
        shard: planning.shard.clone(),
        compress: planning.compress.clone(),
        mem: mem_of(planning)?,
        strategy: planning.strategy.parse()?,
        pyramid: pyramid::flags_of(pyramid),
    })
}
