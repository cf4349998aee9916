//! What an array is, before any file: its shape and the boxes and grids
//! cut from it, element types, byte sizes, the axis order people write
//! shapes in, where voxels lie in the world, and how block files are
//! named. Pure values and arithmetic; no I/O.

pub mod axes;
pub mod dtype;
pub mod geometry;
pub mod names;
pub mod space;
pub mod units;
