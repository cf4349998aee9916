//! What some tests need from the machine beyond the crate: the Python
//! readers (numpy, h5py, nibabel, zarr-python, TensorStore), a FUSE device
//! to mount on, a memory cgroup to run in, a small tmpfs to fill, the NIfTI
//! library's `nifti_tool`.
//! `./scripts/test` installs them and sets `RECHUNKFS_TEST_ALL=1`: there a
//! missing one fails the test and names what is missing. Elsewhere (a bare
//! `cargo test`) the test says `skipped: …` on one line and passes, so a
//! quick run stays possible.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// One thing a test needs.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// A Python with numpy, h5py, nibabel, zarr, tensorstore, tifffile and
    /// imagecodecs.
    Readers,
    /// `/dev/fuse`, and root or `fusermount3`, to mount a view.
    Fuse,
    /// Root and a cgroup filesystem with the memory controller.
    MemoryCgroup,
    /// Root and mount(8) able to mount a tmpfs, to make a small
    /// filesystem to fill.
    TmpfsMount,
    /// Debian's minc-tools (rawtominc, mincresample, mincreshape), to make
    /// MINC2 images as users do.
    MincTools,
    /// `nifti_tool`, from Debian's nifti-bin (the NIfTI reference library's tools).
    NiftiTool,
    /// Root, and SLURM's daemons and commands with munge
    /// (`slurmctld slurmd slurm-client munge`), to run a one-node cluster.
    Slurm,
}

/// The modules the readers' Python must import.
const READER_MODULES: &str = "numpy, h5py, nibabel, zarr, tensorstore, tifffile, imagecodecs";

/// Whether every need is met. When one is not: under `./scripts/test`
/// (`RECHUNKFS_TEST_ALL=1`) the test fails naming it; otherwise it prints
/// one `skipped:` line and the caller returns.
pub fn met(test: &str, needs: &[Need]) -> bool {
    let missing: Vec<String> = needs.iter().filter_map(|need| missing(*need)).collect();
    if missing.is_empty() {
        return true;
    }
    let what = missing.join("; ");
    if std::env::var_os("RECHUNKFS_TEST_ALL").is_some_and(|v| v == "1") {
        panic!("{test}: missing prerequisite: {what} (./scripts/test installs it)");
    }
    // Straight to stderr, not eprintln!: the test harness hides what a
    // passing test prints, and a skip must show.
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {test}: needs {what} (./scripts/test installs it)"
    );
    false
}

/// Returns from the calling test, after one `skipped:` line, unless every
/// need is met (see [`met`]).
#[allow(unused_macros)]
macro_rules! require {
    ($($need:ident),+) => {
        fn here() {}
        let test = std::any::type_name_of_val(&here).trim_end_matches("::here");
        if !$crate::common::prerequisites::met(
            test,
            &[$($crate::common::prerequisites::Need::$need),+],
        ) {
            return;
        }
    };
}

/// What is missing for `need`, in words, or `None`.
fn missing(need: Need) -> Option<String> {
    match need {
        Need::Readers => readers_missing().clone(),
        Need::Fuse => fuse_missing(),
        Need::MemoryCgroup => cgroup_missing(),
        Need::TmpfsMount => tmpfs_missing().clone(),
        Need::MincTools => minc_tools_missing(),
        Need::NiftiTool => nifti_tool_missing(),
        Need::Slurm => slurm_missing(),
    }
}

fn slurm_missing() -> Option<String> {
    let programs = [
        "/usr/sbin/slurmctld",
        "/usr/sbin/slurmd",
        "/usr/sbin/munged",
        "/usr/bin/sbatch",
        "/etc/munge/munge.key",
    ];
    let absent: Vec<&str> = programs
        .into_iter()
        .filter(|path| !Path::new(path).exists())
        .collect();
    if !is_root() {
        Some("root, to run SLURM's daemons".into())
    } else if !absent.is_empty() {
        Some(format!(
            "SLURM and munge (apt-get install slurmctld slurmd slurm-client munge: {} absent)",
            absent.join(", ")
        ))
    } else {
        None
    }
}

fn nifti_tool_missing() -> Option<String> {
    let runs = Command::new("nifti_tool")
        .arg("-ver")
        .output()
        .is_ok_and(|output| output.status.success());
    (!runs).then(|| "nifti_tool (Debian package nifti-bin)".to_string())
}

/// The interpreter the readers live in: `RECHUNKFS_PYTHON`, else the venv
/// `scripts/setup` makes under target/.
pub fn python_path() -> PathBuf {
    match std::env::var_os("RECHUNKFS_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python"),
    }
}

fn readers_missing() -> &'static Option<String> {
    static MISSING: OnceLock<Option<String>> = OnceLock::new();
    MISSING.get_or_init(|| {
        let python = python_path();
        let imported = Command::new(&python)
            .args(["-c", &format!("import {READER_MODULES}")])
            .output();
        match imported {
            Ok(output) if output.status.success() => None,
            Ok(output) => Some(format!(
                "{} cannot import {READER_MODULES}: {}",
                python.display(),
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )),
            Err(e) => Some(format!(
                "a Python with {READER_MODULES} ({}: {e})",
                python.display()
            )),
        }
    })
}

fn minc_tools_missing() -> Option<String> {
    let on_path = |tool: &str| {
        std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).exists()))
    };
    let missing: Vec<&str> = ["rawtominc", "mincresample", "mincreshape", "mincinfo"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    (!missing.is_empty()).then(|| format!("minc-tools ({} not on PATH)", missing.join(", ")))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

fn fuse_missing() -> Option<String> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("/dev/fuse to mount a view ({e})"));
    }
    let fusermount = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| dir.join("fusermount3").exists())
    });
    (!is_root() && !fusermount).then(|| "root or fusermount3 to mount a view".to_string())
}

fn cgroup_missing() -> Option<String> {
    let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
        .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"));
    if !is_root() {
        Some("root, to make a memory cgroup".into())
    } else if !v1 && !v2 {
        Some("a cgroup filesystem with the memory controller".into())
    } else {
        None
    }
}

/// Whether a tmpfs can be mounted here: tried once, on a fresh directory.
fn tmpfs_missing() -> &'static Option<String> {
    static MISSING: OnceLock<Option<String>> = OnceLock::new();
    MISSING.get_or_init(|| {
        if !is_root() {
            return Some("root, to mount a small tmpfs".into());
        }
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => return Some(format!("a temporary directory ({e})")),
        };
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(output) if output.status.success() => {
                let _ = Command::new("umount").arg(dir.path()).status();
                None
            }
            Ok(output) => Some(format!(
                "mount(8) of a tmpfs: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )),
            Err(e) => Some(format!("mount(8) to mount a tmpfs ({e})")),
        }
    })
}
