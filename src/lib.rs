//! rechunkfs: rechunk arrays stored as grids of block files, with the keep
//! plan (fewest seeks in the memory allowed), to real files or as a view.

pub mod dtype;
pub mod error;
pub mod geometry;
pub mod plan;
pub mod units;

pub use dtype::DType;
pub use error::{Error, Result};
