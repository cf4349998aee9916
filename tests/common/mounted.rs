//! A view mounted by a test through the `rechunkfs` binary, unmounted when
//! dropped whatever the test did: the one mount harness of the suites.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{run_rechunkfs, stderr};

/// How long a small test view may take to fill.
const FILL_PATIENCE: Duration = Duration::from_secs(120);

pub struct MountedView {
    pub view: PathBuf,
    /// The `mount` command's arguments, to mount the view again.
    pub args: Vec<String>,
    /// What `mount` printed on stderr (its summary, `--serve`'s link).
    pub said: String,
}

impl MountedView {
    /// Mounts `input` on `root/view` with staging in `root/staging` and
    /// `args` added, the materialiser paused `step_delay_ms` after each read
    /// block (0: none).
    pub fn new(input: &Path, root: &Path, args: &[&str], step_delay_ms: u64) -> MountedView {
        MountedView::at(
            input,
            &root.join("view"),
            &root.join("staging"),
            args,
            step_delay_ms,
        )
    }

    /// [`MountedView::new`] with the view and the staging area where given.
    pub fn at(
        input: &Path,
        view: &Path,
        staging: &Path,
        args: &[&str],
        step_delay_ms: u64,
    ) -> MountedView {
        std::fs::create_dir_all(view).unwrap();
        let all: Vec<String> = [
            "mount",
            input.to_str().unwrap(),
            view.to_str().unwrap(),
            "--staging",
            staging.to_str().unwrap(),
        ]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect();
        MountedView::mount(all, step_delay_ms)
    }

    /// Runs `rechunkfs` with `args`, a whole `mount` command line (the
    /// view third, as [`MountedView::args`] keeps it).
    pub fn mount(args: Vec<String>, step_delay_ms: u64) -> MountedView {
        let view = PathBuf::from(args.get(2).expect("mount INPUT VIEW ..."));
        let output = run_rechunkfs(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            step_delay_ms,
        );
        assert!(output.status.success(), "mount failed: {}", stderr(&output));
        MountedView {
            view,
            args,
            said: stderr(&output),
        }
    }

    /// A view mounted otherwise (by a test's own command), unmounted when
    /// dropped like the others.
    pub fn adopt(view: PathBuf) -> MountedView {
        MountedView {
            view,
            args: Vec::new(),
            said: String::new(),
        }
    }

    /// `status --json` of the view.
    pub fn status(&self) -> serde_json::Value {
        let output = run_rechunkfs(&["status", "--json", self.view.to_str().unwrap()], 0);
        assert!(output.status.success(), "status: {}", stderr(&output));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// The status once the view is complete, every block done (within
    /// [`FILL_PATIENCE`]).
    pub fn wait_complete(&self) -> serde_json::Value {
        let deadline = Instant::now() + FILL_PATIENCE;
        loop {
            let status = self.status();
            if status["state"] == "complete" {
                assert_eq!(status["blocks_done"], status["blocks_total"], "{status}");
                return status;
            }
            assert!(Instant::now() < deadline, "not finished: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `rechunkfs status --wait --json`, given [`FILL_PATIENCE`].
    pub fn wait(&self) -> Output {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
            .args(["status", "--wait", "--json", self.view.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run rechunkfs status --wait");
        let deadline = Instant::now() + FILL_PATIENCE;
        while child.try_wait().expect("status --wait").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("status --wait still waiting: {}", self.status());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("status --wait output")
    }

    /// `rechunkfs umount` of the view, as it went.
    pub fn umount(&self) -> Output {
        run_rechunkfs(&["umount", self.view.to_str().unwrap()], 0)
    }

    /// Unmounts the view, which must succeed.
    pub fn unmount(&self) {
        let output = self.umount();
        assert!(output.status.success(), "umount: {}", stderr(&output));
    }
}

impl Drop for MountedView {
    fn drop(&mut self) {
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = self.umount();
        }
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = rechunkfs::fuse::session::detach(&self.view);
        }
    }
}
