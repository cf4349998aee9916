//! rechunkfs: rechunk arrays stored as grids of block files, with the keep
//! plan (fewest seeks in the memory allowed), to real files or as a view.
//!
//! Stages, each using only the ones before it (`tests/layers.rs` checks):
//!
//! 1. [`error`] and [`sys`]: the error type; what is asked of the OS.
//! 2. [`array`]: shapes, grids, dtypes, axis order, world space, names.
//! 3. [`format`]: each block-file format's bytes.
//! 4. [`input`]: finding an input's block files and checking their grid.
//! 5. [`plan`]: the keep plan and its exact seek and memory costs.
//! 6. [`engine`]: running a plan, counting every seek.
//! 7. [`output`]: the output file tree, and `rechunk` into a directory.
//! 8. [`view`]: the view as plain methods, its staging area and materialiser.
//! 9. [`http`]: the read-only HTTP server of a view or an output directory.
//! 10. [`fuse`]: the FUSE adapter and the mount's daemon.
//! 11. [`cli`]: the commands.

pub mod error;
pub mod sys;

pub mod array;
pub mod cli;
pub mod engine;
pub mod format;
pub mod fuse;
pub mod http;
pub mod input;
pub mod output;
pub mod plan;
pub mod view;

pub use array::dtype::DType;
pub use error::{Error, Result};
