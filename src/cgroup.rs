//! The memory cgroup this process runs in. Its limit counts the page cache
//! as well as the process's own memory, so input read ahead and output not
//! yet written back compete with the array bytes `--mem` allows: the
//! executor sizes its read-ahead window from what the cgroup leaves.

use std::fs;
use std::path::{Path, PathBuf};

/// The smallest memory limit on this process's cgroup and its ancestors
/// (cgroup v1 `memory.limit_in_bytes` or v2 `memory.max`), or `None` when
/// there is none or it cannot be read.
pub fn memory_limit() -> Option<u64> {
    let membership = fs::read_to_string("/proc/self/cgroup").ok()?;
    memory_limit_from(&membership, Path::new("/sys/fs/cgroup"))
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
