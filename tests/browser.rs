//! A real Neuroglancer draws what rechunkfs serves: the client bundled in
//! the `neuroglancer` PyPI package, in Debian's headless Chromium driven by
//! selenium (tests/browser/neuroglancer_check.py), opens the state link
//! that `serve` and `mount --serve` print, waits until the viewer reports
//! every visible chunk loaded, and its screenshot is compared tile by tile
//! with the known pattern. A swapped and a truncated chunk must fail the
//! comparison, so that a pass means something.

#[macro_use]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{python, stderr};

const CHECK: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/browser/neuroglancer_check.py"
);

/// Whether Chromium, chromedriver, and neuroglancer, selenium and Pillow
/// in the readers' Python are there; under ./scripts/test
/// (RECHUNKFS_TEST_ALL=1) a missing one fails the test and names it.
fn browser_ready(test: &str) -> bool {
    let mut missing = Vec::new();
    for program in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        if !Path::new(program).exists() {
            missing.push(format!(
                "{program} (apt-get install chromium chromium-driver)"
            ));
        }
    }
    let imports = Command::new(python())
        .args(["-c", "import neuroglancer, selenium, PIL"])
        .output();
    if !imports.is_ok_and(|o| o.status.success()) {
        missing.push("neuroglancer, selenium and Pillow in the readers' Python".into());
    }
    if missing.is_empty() {
        return true;
    }
    let what = missing.join("; ");
    if std::env::var_os("RECHUNKFS_TEST_ALL").is_some_and(|v| v == "1") {
        panic!("{test}: missing prerequisite: {what} (./scripts/test installs it)");
    }
    let _ = writeln!(std::io::stderr(), "skipped: {test}: needs {what}");
    false
}

/// The known pattern, as HDF5 blocks of `blocks` written by h5py.
fn make_pattern(dir: &Path, blocks: &str) -> PathBuf {
    let input = dir.join("pattern");
    let output = Command::new(python())
        .arg(CHECK)
        .arg("make")
        .arg(&input)
        .args(["--blocks", blocks])
        .output()
        .unwrap();
    assert!(output.status.success(), "make: {}", stderr(&output));
    input
}

/// A process that prints a Neuroglancer state link on stderr (`serve`,
/// `mount --serve --foreground`), killed when dropped.
struct Announcing {
    child: Child,
    link: String,
}

impl Announcing {
    fn start(command: &mut Command) -> Announcing {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run rechunkfs");
        let (sender, receiver) = std::sync::mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(at) = line.find("https://") {
                    if line.contains("#!") {
                        let _ = sender.send(line[at..].to_string());
                    }
                }
            }
        });
        let link = receiver
            .recv_timeout(Duration::from_secs(120))
            .expect("no Neuroglancer state link printed within 120 s");
        Announcing { child, link }
    }
}

impl Drop for Announcing {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(path: &Path) -> Announcing {
    Announcing::start(
        Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
            .arg("serve")
            .arg(path)
            .args(["--bind", "127.0.0.1:0"]),
    )
}

/// The check's JSON summary, and whether every tile was right.
fn neuroglancer(link: &str, shot: &Path, extra: &[&str]) -> (serde_json::Value, bool) {
    // The script has its own deadline for the viewer; this one is for the
    // browser itself hanging.
    let mut child = Command::new(python())
        .arg(CHECK)
        .args(["check", link, "--shot"])
        .arg(shot)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("neuroglancer_check.py (Chromium) did not end within 240 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = child.wait_with_output().unwrap();
    let summary = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        panic!(
            "no summary from the check (exit {status}): {}",
            stderr(&output)
        )
    });
    (summary, status.success())
}

#[test]
fn neuroglancer_draws_served_pyramids_exactly_and_sees_a_swapped_or_truncated_chunk() {
    require!(Readers);
    if !browser_ready("neuroglancer_draws_served_pyramids") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = make_pattern(dir.path(), "16,32,32");
    for format in ["zarr", "zarr3", "precomputed"] {
        let out = dir.path().join(format);
        let output = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
            .arg("rechunk")
            .args([&input, &out])
            .args([
                "--shape", "8,8,8", "--levels", "auto", "-q", "--format", format,
            ])
            .output()
            .unwrap();
        assert!(output.status.success(), "{format}: {}", stderr(&output));
        let served = serve(&out);
        let shot = dir.path().join(format!("{format}.png"));
        let (summary, ok) = neuroglancer(&served.link, &shot, &[]);
        assert!(ok, "{format}: {summary}");
        assert_eq!(summary["wrong_tiles"], 0, "{format}: {summary}");
    }
    // Level 0 of the Zarr v2 pyramid, tampered with: two chunks of the
    // slice shown swapped, then one cut short.
    let zarr = dir.path().join("zarr");
    let a = zarr.join("0/0.0.0");
    let b = zarr.join("0/0.0.1");
    let (bytes_a, bytes_b) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    std::fs::write(&a, &bytes_b).unwrap();
    std::fs::write(&b, &bytes_a).unwrap();
    let served = serve(&zarr);
    let (summary, ok) = neuroglancer(&served.link, &dir.path().join("swapped.png"), &[]);
    assert!(!ok, "a swapped chunk passed: {summary}");
    assert_eq!(summary["wrong_tiles"], 2, "{summary}");
    drop(served);
    std::fs::write(&a, &bytes_a).unwrap();
    std::fs::write(&b, &bytes_b).unwrap();
    let c = zarr.join("0/0.1.1");
    let bytes_c = std::fs::read(&c).unwrap();
    std::fs::write(&c, &bytes_c[..bytes_c.len() / 2]).unwrap();
    let served = serve(&zarr);
    let extra = ["--deadline", "20"];
    let (summary, ok) = neuroglancer(&served.link, &dir.path().join("truncated.png"), &extra);
    // Neuroglancer never reports that chunk loaded (it may draw level 1
    // in its place, which this pattern makes look alike).
    assert!(!ok, "a truncated chunk passed: {summary}");
    assert!(
        summary["ready"] == false || summary["wrong_tiles"].as_u64() >= Some(1),
        "{summary}"
    );
}

#[test]
fn neuroglancer_draws_a_view_served_while_it_fills() {
    require!(Readers, Fuse);
    if !browser_ready("neuroglancer_draws_a_view_served_while_it_fills") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // 32 input blocks, each read followed by a pause: the view fills in
    // about ten seconds, while the browser reads it.
    let input = make_pattern(dir.path(), "8,16,16");
    let view = dir.path().join("view");
    std::fs::create_dir(&view).unwrap();
    // In the foreground, the materialiser paused after each block read: the
    // browser asks for chunks still pending, which wait for their data.
    let mounted = Announcing::start(
        Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
            .arg("mount")
            .args([&input, &view])
            .args(["--shape", "8,8,8", "--format", "zarr", "--levels", "auto"])
            .arg("--staging")
            .arg(dir.path().join("staging"))
            .args(["--serve", "0", "--foreground"])
            .env("RECHUNKFS_STEP_DELAY_MS", "300"),
    );
    let status = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(["status", "--json"])
        .arg(&view)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_ne!(
        status["state"], "complete",
        "the view filled before the browser came: {status}"
    );
    // A filling view's metadata has no window yet: the link printed at
    // mount gives no range.
    let shot = dir.path().join("view.png");
    let (summary, ok) = neuroglancer(&mounted.link, &shot, &["--range", "1000,3016"]);
    assert!(ok, "{summary}");
    assert_eq!(summary["wrong_tiles"], 0, "{summary}");
    // The browser asked for blocks not yet filled, which were extracted
    // ahead of the plan for it.
    let status = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(["status", "--json"])
        .arg(&view)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["on_demand_blocks"].as_u64() > Some(0),
        "the browser read no pending block: {status}"
    );
    // Once level 1 is done the view's metadata carries level 0's window:
    // a link made from the view then gives the range by itself.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let status = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
            .args(["status", "--json"])
            .arg(&view)
            .output()
            .unwrap();
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        if status["state"] == "complete" {
            break;
        }
        assert!(Instant::now() < deadline, "the view did not fill: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let served = serve(&view);
    let shot = dir.path().join("view-complete.png");
    let (summary, ok) = neuroglancer(&served.link, &shot, &[]);
    assert!(ok, "{summary}");
    assert_eq!(summary["wrong_tiles"], 0, "{summary}");
    drop(served);
    drop(mounted);
    // Killed in the foreground, the view is left for umount (it also
    // detaches a view whose daemon has died).
    let _ = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .arg("umount")
        .arg(&view)
        .output();
}
