//! Test hooks: environment variables that the tests (and demos) set on
//! the `rechunkfs` binary to pace a run or make its records often. Only
//! the CLI reads them; the library takes what they say as options.
//!
//! - `RECHUNKFS_STEP_DELAY_MS=N`: a pause of N ms after every read block,
//!   in `rechunk` and in a view's materialiser, to watch a view fill or to
//!   interrupt a run at a point of the test's choosing.
//! - `RECHUNKFS_SYNC_BATCH_MS=N`: a view's durability batch closes after
//!   N ms instead of 2 s, so that a test that kills the daemon finds
//!   records to check.
//! - `RECHUNKFS_COMMIT_BATCH_BYTES=N`: `rechunk` commits its finished
//!   blocks every N bytes instead of every 256 MiB, so that a test of an
//!   interrupted run sees blocks committed one by one in a small array.

use std::time::Duration;

use crate::view::Pacing;

/// A number an environment variable holds, if it is set and one.
fn number(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|text| text.parse().ok())
}

/// `RECHUNKFS_STEP_DELAY_MS` (none when unset or 0).
pub(super) fn step_delay() -> Option<Duration> {
    number("RECHUNKFS_STEP_DELAY_MS")
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// A view's materialiser's pacing: the defaults, but for the hooks set.
pub(super) fn pacing() -> Pacing {
    let default = Pacing::default();
    Pacing {
        step_delay: step_delay(),
        sync_batch_age: number("RECHUNKFS_SYNC_BATCH_MS")
            .map_or(default.sync_batch_age, Duration::from_millis),
    }
}

/// `RECHUNKFS_COMMIT_BATCH_BYTES`, or the library's default.
pub(super) fn commit_batch_bytes() -> u64 {
    number("RECHUNKFS_COMMIT_BATCH_BYTES").unwrap_or(crate::output::directory::COMMIT_BATCH_BYTES)
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    /// What the library itself may read from the environment: the user's
    /// own settings, and what its unit tests read.
    const LIBRARY_SETTINGS: [&str; 5] = [
        "XDG_CACHE_HOME",
        "HOME",
        "PATH",
        "RECHUNKFS_PYTHON",
        "RECHUNKFS_TEST_ALL",
    ];

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn the_environment_is_read_by_the_cli_and_the_library_reads_only_user_settings() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let mut read = Vec::new();
        for file in files.iter().filter(|f| !f.starts_with(src.join("cli"))) {
            let text = std::fs::read_to_string(file).unwrap();
            for (at, _) in text.match_indices("env::var") {
                let name = text[at..].split('"').nth(1).unwrap_or_default();
                if !LIBRARY_SETTINGS.contains(&name) {
                    read.push(format!("{}: {name}", file.display()));
                }
            }
        }
        assert!(read.is_empty(), "the library reads {read:?}");
    }
}
