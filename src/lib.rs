//! rechunkfs: rechunk arrays stored as grids of block files, with the keep
//! plan (fewest seeks in the memory allowed), to real files or as a view.

pub mod axes;
pub mod cgroup;
pub mod cli;
pub mod dtype;
pub mod error;
pub mod execute;
pub mod filetree;
pub mod format;
pub mod fuse;
pub mod geometry;
pub mod input;
pub mod materialise;
pub mod mount;
pub mod pieces;
pub mod plan;
pub mod rechunk;
pub mod sample;
pub mod seekio;
pub mod staging;
pub mod sweep;
pub mod units;
pub mod view;

pub use dtype::DType;
pub use error::{Error, Result};
