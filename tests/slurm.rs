//! A job in parts run by a real SLURM: a one-node cluster (munged,
//! slurmctld, slurmd, with a private slurm.conf) that each test starts and
//! stops, and the script `rechunkfs slurm` prints, submitted as a user
//! would. The output must be byte-identical to one machine's, the parts'
//! seeks must sum to `plan --parts`' prediction, a part killed mid-way and
//! resubmitted must finish without rewriting the blocks it had finished,
//! and a changed input must be refused on resubmission.

#[macro_use]
mod common;

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use rechunkfs::format::BlockFormat;

use common::{dtype, json_u64, make_zarr, stderr};

const ARRAY: [u64; 3] = [60, 50, 40];
const CHUNK: [u64; 3] = [16, 16, 16];
const OUT_BLOCK: [u64; 3] = [20, 25, 15];
const SHAPE: &str = "20,25,15";
const MEM: &str = "200K";

/// One cluster at a time: the machine has two cores.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

/// A one-node SLURM cluster in a directory of its own, stopped when dropped.
struct Cluster {
    dir: tempfile::TempDir,
    daemons: Vec<Child>,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        // munged refuses a socket directory others cannot traverse.
        set_mode(dir.path(), 0o755);
        let munge = dir.path().join("munge");
        std::fs::create_dir(&munge).unwrap();
        set_mode(&munge, 0o755);
        run_ok(Command::new("chown").args(["munge:munge", text(&munge)]));
        let mut cluster = Cluster {
            dir,
            daemons: Vec::new(),
        };
        cluster.start_munged();
        cluster.write_conf();
        for daemon in [
            vec!["/usr/sbin/slurmctld", "-D", "-i", "-f"],
            vec!["/usr/sbin/slurmd", "-D", "-N", "localhost", "-f"],
        ] {
            let child = Command::new(daemon[0])
                .args(&daemon[1..])
                .arg(cluster.conf())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start a SLURM daemon");
            cluster.daemons.push(child);
        }
        cluster.wait_for(Duration::from_secs(60), "the node to be idle", |c| {
            c.slurm("sinfo", &["-h", "-o", "%t"]).trim() == "idle"
        });
        cluster
    }

    fn start_munged(&self) {
        let munge = self.dir.path().join("munge");
        let path = |name: &str| format!("--{name}={}", text(&munge.join(name)));
        run_ok(
            Command::new("runuser")
                .args(["-u", "munge", "--", "/usr/sbin/munged"])
                .arg(format!("--socket={}", text(&munge.join("munge.sock"))))
                .args([path("pid-file"), path("log-file"), path("seed-file")]),
        );
    }

    fn write_conf(&self) {
        let d = text(self.dir.path());
        let (ctld_port, slurmd_port) = (free_port(), free_port());
        let conf = format!(
            "ClusterName=rechunkfs\nSlurmctldHost=localhost\nSlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nAuthInfo=socket={d}/munge/munge.sock\nCredType=cred/munge\n\
             StateSaveLocation={d}\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd.log\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core_Memory\n\
             SchedulerType=sched/builtin\nReturnToService=2\nMpiDefault=none\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             MaxArraySize=1001\n\
             NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=UNKNOWN\n\
             PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n"
        );
        std::fs::write(self.conf(), conf).unwrap();
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// Where jobs are submitted from: their logs (slurm-%A_%a.out) go there.
    fn logs(&self) -> PathBuf {
        let logs = self.dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        logs
    }

    /// Runs a SLURM command; its stdout.
    fn slurm(&self, program: &str, args: &[&str]) -> String {
        let output = Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .output()
            .expect("run a SLURM command");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs the submitting `script` with bash (with `args`, and `env` set
    /// for the tasks, which inherit it); returns (array job, finish job).
    fn submit(&self, script: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, String) {
        let output = Command::new("bash")
            .arg(script)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .envs(env.iter().copied())
            .current_dir(self.logs())
            .output()
            .expect("run the script");
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "submitting: {}", stderr(&output));
        // "...: array job 12, finish job 13"
        let words: Vec<&str> = said.split_whitespace().collect();
        let jobs: Vec<String> = words
            .windows(2)
            .filter(|w| w[0] == "job")
            .map(|w| w[1].trim_end_matches(',').to_string())
            .collect();
        assert_eq!(jobs.len(), 2, "no job ids in: {said}");
        (jobs[0].clone(), jobs[1].clone())
    }

    /// Waits until `ready`, failing the test after `limit`.
    fn wait_for(&self, limit: Duration, what: &str, mut ready: impl FnMut(&Cluster) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The state of job `id` (of an array job: each task's).
    fn states(&self, id: &str) -> Vec<String> {
        self.slurm("scontrol", &["show", "job", id])
            .split_whitespace()
            .filter_map(|word| word.strip_prefix("JobState="))
            .map(str::to_string)
            .collect()
    }

    /// Waits until no job is queued or running.
    fn wait_until_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(180);
        while !self.slurm("squeue", &["-h"]).trim().is_empty() {
            assert!(
                Instant::now() < deadline,
                "the queue did not empty: {}\n{}",
                self.slurm("squeue", &[]),
                self.all_logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every job log, for a failure's message.
    fn all_logs(&self) -> String {
        let mut logs: Vec<(String, String)> = std::fs::read_dir(self.logs())
            .unwrap()
            .flatten()
            .map(|e| {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                (e.file_name().to_string_lossy().into_owned(), text)
            })
            .collect();
        logs.sort();
        logs.iter()
            .map(|(name, text)| format!("--- {name}\n{text}"))
            .collect()
    }

    /// The log of array task `task` of job `job`, or of job `job`.
    fn log(&self, job: &str, task: Option<u64>) -> String {
        let name = match task {
            Some(task) => format!("slurm-{job}_{task}.out"),
            None => format!("slurm-{job}.out"),
        };
        std::fs::read_to_string(self.logs().join(name)).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for mut daemon in self.daemons.drain(..).rev() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(daemon.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = daemon.wait();
        }
        let pid_file = self.dir.path().join("munge/pid-file");
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
}

fn text(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn run_ok(command: &mut Command) {
    let output = command.output().expect("run");
    assert!(output.status.success(), "{command:?}: {}", stderr(&output));
}

/// A TCP port nothing listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

fn rechunkfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(args)
        .output()
        .expect("run rechunkfs")
}

fn json_of(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// The script `rechunkfs slurm` prints for `parts` parts, saved in `root`.
fn slurm_script(root: &Path, input: &Path, out: &Path, parts: u64) -> PathBuf {
    let output = rechunkfs(&[
        "slurm",
        text(input),
        text(out),
        "--shape",
        SHAPE,
        "--mem",
        MEM,
        "--format",
        "h5",
        "--parts",
        &parts.to_string(),
        "--max-running",
        "4",
        "--sbatch-arg=--time=10",
    ]);
    assert!(output.status.success(), "slurm: {}", stderr(&output));
    let script = root.join("job.sh");
    std::fs::write(&script, &output.stdout).unwrap();
    script
}

/// The input (zarr-python's defaults, no compressor) and one machine's
/// output of it, checked by h5py.
fn input_and_single(root: &Path) -> (PathBuf, PathBuf) {
    let input = make_zarr(root, "in", &ARRAY, &CHUNK, dtype("u2"), BlockFormat::Zarr);
    let single = root.join("single");
    let output = rechunkfs(&[
        "rechunk",
        text(&input),
        text(&single),
        "--shape",
        SHAPE,
        "--mem",
        MEM,
        "--format",
        "h5",
        "-q",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    common::verify_output(&single, &ARRAY, &OUT_BLOCK, dtype("u2"), BlockFormat::Hdf5);
    (input, single)
}

/// Every block file in `out` is byte for byte the one in `single`, and
/// nothing else is there.
fn assert_identical(out: &Path, single: &Path) {
    let names = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(out), names(single), "the same files");
    for name in names(single) {
        assert!(
            std::fs::read(out.join(&name)).unwrap() == std::fs::read(single.join(&name)).unwrap(),
            "{name} differs from one machine's"
        );
    }
}

/// The seeks a task's log reports (`seeks N (...; planned M)`): (made, planned).
fn seeks_in_log(log: &str) -> (u64, u64) {
    let line = log
        .lines()
        .find(|line| line.starts_with("seeks "))
        .unwrap_or_else(|| panic!("no seeks in the log: {log}"));
    let number = |word: &str| word.trim_end_matches(')').replace(',', "").parse::<u64>();
    let words: Vec<&str> = line.split_whitespace().collect();
    let made = number(words[1]).expect("seeks made");
    let planned = words
        .windows(2)
        .find(|w| w[0] == "planned")
        .and_then(|w| number(w[1]).ok())
        .expect("seeks planned");
    (made, planned)
}

#[test]
fn eight_parts_in_a_job_array_make_one_machines_output_with_the_predicted_seeks() {
    require!(Slurm, Readers);
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::tempdir().unwrap();
    let (input, single) = input_and_single(root.path());
    let plan = json_of(&rechunkfs(&[
        "plan",
        text(&input),
        "--shape",
        SHAPE,
        "--mem",
        MEM,
        "--format",
        "h5",
        "--parts",
        "8",
        "--json",
    ]));
    let predicted = json_u64(&plan, "parts.seeks");
    let cluster = Cluster::start();
    let out = root.path().join("out");
    let script = slurm_script(root.path(), &input, &out, 8);
    let (array, finish) = cluster.submit(&script, &[], &[]);
    cluster.wait_until_idle();
    assert_eq!(cluster.states(&finish), ["COMPLETED"], "finish");
    let mut made = 0;
    for task in 0..8 {
        let log = cluster.log(&array, Some(task));
        let (seeks, planned) = seeks_in_log(&log);
        assert_eq!(seeks, planned, "part {task}: {log}");
        assert_eq!(
            seeks,
            json_u64(&plan["parts"]["list"][task as usize], "seeks"),
            "part {task}"
        );
        made += seeks;
    }
    assert_eq!(made, predicted, "the parts' seeks, summed");
    assert!(cluster
        .log(&finish, None)
        .contains("all 18 blocks are complete"));
    assert_identical(&out, &single);
    common::verify_output(&out, &ARRAY, &OUT_BLOCK, dtype("u2"), BlockFormat::Hdf5);
}

#[test]
fn a_killed_part_resubmitted_finishes_without_rewriting_and_a_changed_input_is_refused() {
    require!(Slurm, Readers);
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let root = tempfile::tempdir().unwrap();
    let (input, single) = input_and_single(root.path());
    let cluster = Cluster::start();
    let out = root.path().join("out");
    let script = slurm_script(root.path(), &input, &out, 2);
    // Slow steps, each block committed as it completes: a kill finds some
    // blocks of part 0 finished and some not.
    let slow = [
        ("RECHUNKFS_STEP_DELAY_MS", "400"),
        ("RECHUNKFS_COMMIT_BATCH_BYTES", "1"),
    ];
    let (array, finish) = cluster.submit(&script, &["0"], &slow);
    let part_done = |c: &Cluster| -> (u64, u64) {
        let _ = c;
        let status = rechunkfs(&["status", text(&out), "--json"]);
        if !status.status.success() {
            return (0, 1);
        }
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        let part = &status["parts"][0];
        (json_u64(part, "blocks_done"), json_u64(part, "blocks"))
    };
    cluster.wait_for(Duration::from_secs(120), "part 0 to finish a block", |c| {
        part_done(c).0 >= 1
    });
    kill_part(&out, 0);
    cluster.wait_for(Duration::from_secs(60), "the killed task to end", |c| {
        let states = c.states(&format!("{array}_0"));
        !states.is_empty() && states.iter().all(|s| s != "RUNNING" && s != "PENDING")
    });
    let (kept, total) = part_done(&cluster);
    assert!(kept >= 1 && kept < total, "kept {kept} of {total}");
    // Its finish can never run now.
    cluster.slurm("scancel", &[&finish]);
    cluster.wait_until_idle();
    let before = block_mtimes(&out);

    // A changed input: the resubmitted part refuses it. The input is set
    // aside and a changed copy put in its place: no change to a file can
    // be undone (its ctime records it), but the files set aside come back
    // as they were.
    let as_it_was = root.path().join("input-as-it-was");
    std::fs::rename(&input, &as_it_was).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&as_it_was)
        .arg(&input)
        .status();
    assert!(copied.unwrap().success());
    let chunk = input.join("0.0.0");
    let was = std::fs::metadata(&chunk).unwrap().modified().unwrap();
    set_mtime(&chunk, was + Duration::from_secs(7));
    let (refused, finish) = cluster.submit(&script, &["0"], &[]);
    cluster.wait_for(Duration::from_secs(60), "the refused task to end", |c| {
        c.states(&format!("{refused}_0")) == ["FAILED"]
    });
    let log = cluster.log(&refused, Some(0));
    assert!(
        log.contains("an input that has changed since") && log.contains("0.0.0"),
        "{log}"
    );
    cluster.slurm("scancel", &[&finish]);
    cluster.wait_until_idle();
    assert_eq!(block_mtimes(&out), before, "a refused part wrote nothing");

    // The input as it was: part 0 resubmitted, then part 1, and finish.
    std::fs::remove_dir_all(&input).unwrap();
    std::fs::rename(&as_it_was, &input).unwrap();
    let (_, finish) = cluster.submit(&script, &["0-1"], &[]);
    cluster.wait_until_idle();
    assert_eq!(cluster.states(&finish), ["COMPLETED"], "finish");
    let after = block_mtimes(&out);
    for (name, modified) in &before {
        assert_eq!(after.get(name), Some(modified), "{name} was written again");
    }
    assert_identical(&out, &single);
    common::verify_output(&out, &ARRAY, &OUT_BLOCK, dtype("u2"), BlockFormat::Hdf5);
}

/// Kills (SIGKILL) the running `rechunk` of part `part` into `out`: the
/// task's process, found by its command line.
fn kill_part(out: &Path, part: u64) {
    let wanted = format!("{part}/");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_part = args.iter().any(|a| a == text(out))
            && args.iter().any(|a| a == "rechunk")
            && args.iter().any(|a| a.starts_with(&wanted));
        if is_part {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("kill -9 the part");
            return;
        }
    }
    panic!("no running rechunk of part {part} into {}", out.display());
}

/// The mtime of every block file in `out`.
fn block_mtimes(out: &Path) -> HashMap<String, SystemTime> {
    std::fs::read_dir(out)
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().modified().unwrap(),
            )
        })
        .collect()
}

fn set_mtime(path: &Path, when: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|file| file.set_modified(when))
        .unwrap();
}
