//! A view mounted by a test, unmounted when dropped whatever the test did.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{run_rechunkfs, stderr};

pub struct MountedView {
    pub view: PathBuf,
}

impl MountedView {
    /// Mounts `input` on `root/view` with staging in `root/staging` and
    /// `args` added, the materialiser paused `step_delay_ms` after each read
    /// block (0: none).
    pub fn new(input: &Path, root: &Path, args: &[&str], step_delay_ms: u64) -> MountedView {
        let view = root.join("view");
        std::fs::create_dir_all(&view).unwrap();
        let staging = root.join("staging");
        let mut all = vec![
            "mount",
            input.to_str().unwrap(),
            view.to_str().unwrap(),
            "--staging",
            staging.to_str().unwrap(),
        ];
        all.extend(args);
        let output = run_rechunkfs(&all, step_delay_ms);
        assert!(output.status.success(), "mount failed: {}", stderr(&output));
        MountedView { view }
    }

    /// `status --json` of the view.
    pub fn status(&self) -> serde_json::Value {
        let output = run_rechunkfs(&["status", "--json", self.view.to_str().unwrap()], 0);
        assert!(output.status.success(), "status: {}", stderr(&output));
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// The status once the view is complete (within 120 s).
    pub fn wait_complete(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let status = self.status();
            if status["state"] == "complete" {
                return status;
            }
            assert!(Instant::now() < deadline, "not finished: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn unmount(&self) {
        let output = run_rechunkfs(&["umount", self.view.to_str().unwrap()], 0);
        assert!(output.status.success(), "umount: {}", stderr(&output));
    }
}

impl Drop for MountedView {
    fn drop(&mut self) {
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = run_rechunkfs(&["umount", self.view.to_str().unwrap()], 0);
        }
        if rechunkfs::fuse::session::is_mounted(&self.view) {
            let _ = rechunkfs::fuse::session::detach(&self.view);
        }
    }
}
