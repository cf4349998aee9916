//! Where output blocks go: what a command asks to make of its input
//! ([`request`]), the file tree an output array is made of (names, nested
//! directories, padded edge shapes), and `rechunk`'s sink that writes it
//! into a directory, atomically per block.

pub mod directory;
pub mod filetree;
pub mod inputs;
pub mod job;
pub mod pyramid;
pub mod request;

use crate::error::Result;
use crate::format::BlockFormat;
use crate::input::InputArray;
use crate::plan::Problem;

/// The problem of rechunking `input` into blocks of `output_block`
/// (internal order) written as `format`, whose files the format shapes
/// (Zarr pads edge chunks, which costs writes more seeks), with the
/// process's threads ([`crate::engine::workers::threads`]) as its workers.
pub fn problem_for(
    input: &InputArray,
    output_block: Vec<u64>,
    format: BlockFormat,
) -> Result<Problem> {
    let problem = Problem::new(
        input.shape.clone(),
        input.block_shape.clone(),
        output_block,
        input.dtype.size as u64,
    )?;
    let output_files = filetree::output_file_shape(format, &problem.output());
    Ok(problem
        .with_files(input.files.clone(), output_files)
        .with_workers(crate::engine::workers::threads()))
}
