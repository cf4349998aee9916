//! What rechunkfs asks of the operating system beyond plain file I/O: the
//! memory its cgroup allows, process limits, page-cache advice, other
//! processes' state and where a path's space comes from. The lowest stage:
//! it knows nothing of arrays.

pub mod cgroup;
pub mod files;
pub mod limits;
pub mod pagecache;
pub mod process;
pub mod space;
