//! Where output blocks go: the file tree an output array is made of (names,
//! nested directories, padded edge shapes), and `rechunk`'s sink that writes
//! it into a directory, atomically per block.

pub mod directory;
pub mod filetree;
