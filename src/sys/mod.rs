//! What rechunkfs asks of the operating system beyond plain file I/O: the
//! memory its cgroup allows, process limits, page-cache advice, free space
//! and where a path's space comes from, other processes' state, and the
//! signals that ask a command to stop, and which directories no other user
//! can change. The lowest stage: it knows nothing of arrays.

pub mod cgroup;
pub mod disk;
pub mod files;
pub mod limits;
pub mod pagecache;
pub mod process;
pub mod signals;
pub mod trust;
