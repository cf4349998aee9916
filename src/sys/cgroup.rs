//! The memory this process can count on: its memory cgroup's limit and the
//! system's available memory. The cgroup's limit counts the page cache as
//! well as the process's own memory, so input read ahead and output not yet
//! written back compete with the array bytes `--mem` allows: the executor
//! sizes its read-ahead window from what the cgroup leaves, and arrays the
//! page cache cannot hold have their pages dropped once used.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The smallest memory limit on this process's cgroup and its ancestors
/// (cgroup v1 `memory.limit_in_bytes` or v2 `memory.max`), or `None` when
/// there is none or it cannot be read. Read once per process: the plan's
/// budget, the executor's read-ahead and the page-cache advice all count
/// on the same limit.
pub fn memory_limit() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let membership = fs::read_to_string("/proc/self/cgroup").ok()?;
        memory_limit_from(&membership, Path::new("/sys/fs/cgroup"))
    })
}

/// Whether the page cache cannot be expected to keep an array of `bytes`:
/// its input and output together (twice `bytes`) would take more than half
/// of what this process may use (the smaller of the cgroup's limit and the
/// system's available memory). Then rechunkfs drops the pages it is done
/// with ([`crate::engine::seekio::drop_cached_pages`]); for smaller arrays that
/// would be work for nothing (W1, 654 MiB with 23 GiB free: +0.5 s CPU).
pub fn page_cache_cannot_hold(bytes: u64) -> bool {
    let available = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_available(&text));
    let room = [memory_limit(), available].into_iter().flatten().min();
    room.is_some_and(|room| bytes.saturating_mul(4) > room)
}

/// `MemAvailable` from a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// [`memory_limit`] for a `/proc/self/cgroup` text and a cgroup mount root.
fn memory_limit_from(membership: &str, root: &Path) -> Option<u64> {
    let mut limits = Vec::new();
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let (base, file) = if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else {
            continue;
        };
        for dir in ancestors(&base, path) {
            let Ok(text) = fs::read_to_string(dir.join(file)) else {
                continue;
            };
            // "max" (v2) and v1's huge "unlimited" value both parse as no limit.
            if let Ok(bytes) = text.trim().parse::<u64>() {
                if bytes < 1 << 60 {
                    limits.push(bytes);
                }
            }
        }
    }
    limits.into_iter().min()
}

/// `base/path` and every directory above it up to `base`.
fn ancestors(base: &Path, path: &str) -> Vec<PathBuf> {
    let mut dirs = vec![base.to_path_buf()];
    let mut dir = base.to_path_buf();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        dir.push(part);
        dirs.push(dir.clone());
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_smallest_limit_on_the_path() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("memory");
        fs::create_dir_all(v1.join("outer/inner")).unwrap();
        fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        fs::write(v1.join("outer/memory.limit_in_bytes"), "268435456\n").unwrap();
        fs::write(v1.join("outer/inner/memory.limit_in_bytes"), "536870912\n").unwrap();
        let membership = "9:cpu,cpuacct:/\n4:memory:/outer/inner\n";
        assert_eq!(memory_limit_from(membership, root.path()), Some(256 << 20));
    }

    #[test]
    fn drops_pages_only_of_arrays_larger_than_memory() {
        assert!(!page_cache_cannot_hold(4096));
        assert!(page_cache_cannot_hold(1 << 60));
    }

    #[test]
    fn reads_available_memory() {
        let meminfo =
            "MemTotal:       24680000 kB\nMemFree:        1000 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(mem_available(meminfo), Some(2 << 20));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn reads_cgroup_v2_and_no_limit() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("user/job")).unwrap();
        fs::write(root.path().join("user/memory.max"), "max\n").unwrap();
        fs::write(root.path().join("user/job/memory.max"), "1073741824\n").unwrap();
        assert_eq!(
            memory_limit_from("0::/user/job\n", root.path()),
            Some(1 << 30)
        );
        assert_eq!(memory_limit_from("0::/user\n", root.path()), None);
        assert_eq!(memory_limit_from("", root.path()), None);
    }
}
