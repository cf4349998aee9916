//! `status` and `umount`: what other processes ask of a running view, and
//! `status` of a directory `rechunk` writes (a job in parts). The
//! wait is the daemon's answer to one read, so `status --wait` ends the
//! moment the view does, and its progress bar only polls for show.

use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use anyhow::bail;

use crate::array::units::show_bytes;
use crate::cli::args::{StatusArgs, UmountArgs};
use crate::cli::report::{progress_bar, thousands};
use crate::fuse::session;
use crate::output::job::{self, JobRecord};
use crate::view::Status;

/// How often `status --wait` moves its progress bar. The wait itself ends
/// when the daemon answers (see [`crate::fuse::session::wait_status`]), not on a tick.
const PROGRESS_TICK: Duration = Duration::from_millis(200);

pub(super) fn umount_command(args: UmountArgs) -> anyhow::Result<()> {
    match session::unmount(&args.view)? {
        session::Unmounted::Done => eprintln!("unmounted {}", args.view.display()),
        session::Unmounted::DaemonStopped(pid) => eprintln!(
            "unmounted {}, without its daemon (pid {pid}), which is stopped (SIGSTOP, a frozen \
             cgroup or a suspended job). It ends once continued (kill -CONT {pid}) and holds the \
             staging area until then; kill it to free the area now (completed blocks are kept)",
            args.view.display()
        ),
    }
    Ok(())
}

pub(super) fn status_command(args: StatusArgs) -> anyhow::Result<()> {
    session::check_daemon(&args.view)?;
    // Only a directory that is not mounted can hold a job record: looking
    // for one in a view would enter it unwatched, and wait for as long as
    // its daemon is stopped if it stops meanwhile.
    if !session::is_mounted(&args.view) {
        if let Some(record) = job_of_directory(&args.view)? {
            return directory_status(&args, &record);
        }
    }
    let mut status = session::read_status(&args.view)?;
    if args.wait && status.state == "materialising" {
        status = wait_for_end(&args, &status)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_status(&args.view, &status);
    }
    if args.wait && status.state != "complete" {
        bail!(
            "{}: the view is {} before every block was done{}",
            args.view.display(),
            status.state,
            status
                .error
                .as_deref()
                .map_or(String::new(), |e| format!(": {e}"))
        );
    }
    Ok(())
}

/// The job `path` holds, if it is an output directory of `rechunk` (and
/// not a mounted view, which serves no job record).
fn job_of_directory(path: &Path) -> anyhow::Result<Option<JobRecord>> {
    if !path.join(job::JOB_NAME).is_file() {
        return Ok(None);
    }
    Ok(job::read_job(path)?)
}

/// A directory run's progress per part, from the files in it: which
/// blocks are there, complete, and whether `finish` has run.
fn directory_status(args: &StatusArgs, record: &JobRecord) -> anyhow::Result<()> {
    let parts = job::progress(&args.view, record);
    let done: u64 = parts.iter().map(|p| p.blocks_done).sum();
    let total: u64 = parts.iter().map(|p| p.blocks).sum();
    let finished = record
        .metadata_files
        .iter()
        .all(|(name, _)| args.view.join(name).is_file());
    let state = match (done == total, finished) {
        (true, true) => "complete",
        (true, false) => "blocks complete, finish not run",
        _ => "in progress",
    };
    if args.json {
        let report = serde_json::json!({
            "state": state,
            "blocks_done": done,
            "blocks_total": total,
            "parts": parts,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{}: {state}: {} / {} blocks ({:.1}%) in {} part(s)",
            args.view.display(),
            thousands(done),
            thousands(total),
            100.0 * done as f64 / total.max(1) as f64,
            parts.len()
        );
        for part in parts.iter().filter(|p| p.blocks_done < p.blocks) {
            println!(
                "  part {:<6} {} / {} blocks",
                part.part,
                thousands(part.blocks_done),
                thousands(part.blocks)
            );
        }
    }
    if args.wait && state != "complete" {
        bail!(
            "{}: a directory run is not waited for; its parts run elsewhere (status shows \
             progress)",
            args.view.display()
        );
    }
    Ok(())
}

/// The view's status once materialising has ended, with a progress bar
/// meanwhile (from `status`, its status now).
fn wait_for_end(args: &StatusArgs, status: &Status) -> anyhow::Result<Status> {
    let bar = progress_bar(status.bytes_total, args.json);
    let (ended, end) = std::sync::mpsc::channel();
    let view = args.view.clone();
    std::thread::Builder::new()
        .name("wait".into())
        .spawn(move || {
            let _ = ended.send(session::wait_status(&view));
        })?;
    let status = loop {
        match end.recv_timeout(PROGRESS_TICK) {
            Ok(result) => break result?,
            Err(RecvTimeoutError::Timeout) => {
                if !bar.is_hidden() {
                    bar.set_position(session::read_status(&args.view)?.bytes_done);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                bail!(
                    "{}: the wait for the view ended without an answer",
                    args.view.display()
                )
            }
        }
    };
    bar.finish_and_clear();
    Ok(status)
}

fn print_status(view: &Path, status: &Status) {
    let percent = |done: u64, total: u64| {
        if total == 0 {
            100.0
        } else {
            done as f64 * 100.0 / total as f64
        }
    };
    println!("view      {}", view.display());
    match &status.waiting_for_space {
        Some(filesystem) => println!(
            "state     {}, waiting for space on {} (its filesystem is full; it goes on \
             once space is freed)",
            status.state,
            filesystem.display()
        ),
        None => println!("state     {}", status.state),
    }
    println!(
        "blocks    {} / {} done ({:.1}%), {} resumed from staging",
        thousands(status.blocks_done),
        thousands(status.blocks_total),
        percent(status.blocks_done, status.blocks_total),
        thousands(status.blocks_resumed)
    );
    if !status.levels.is_empty() {
        let levels: Vec<String> = status
            .levels
            .iter()
            .map(|l| format!("{}: {}/{}", l.level, l.blocks_done, l.blocks_total))
            .collect();
        println!("levels    {}", levels.join(", "));
    }
    println!(
        "bytes     {} / {}",
        show_bytes(status.bytes_done),
        show_bytes(status.bytes_total)
    );
    println!(
        "seeks     {} so far; the plan makes {}",
        thousands(status.seeks_made),
        thousands(status.seeks_planned)
    );
    println!(
        "memory    {} held at most so far; the plan holds {}",
        show_bytes(status.peak_held_bytes),
        show_bytes(status.peak_held_bytes_planned)
    );
    let eta = status
        .eta_seconds
        .map_or("-".to_string(), |s| format!("{:.0} s", s));
    println!(
        "rate      {}/s, ETA {eta}, running {:.0} s",
        show_bytes(status.rate_bytes_per_second as u64),
        status.elapsed_seconds
    );
    println!(
        "waiting   {} reads parked on pending blocks",
        status.waiting_reads
    );
    println!(
        "on demand {} blocks extracted ahead of the plan for waiting readers ({} extra seeks, \
         {} read, {:.2} s)",
        thousands(status.on_demand_blocks),
        thousands(status.on_demand_seeks),
        show_bytes(status.on_demand_bytes_read),
        status.on_demand_seconds
    );
    if status.on_demand_reserved_bytes > 0 {
        println!(
            "          {} of --mem set aside for them beside the plan (at most {} held)",
            show_bytes(status.on_demand_reserved_bytes),
            show_bytes(status.on_demand_peak_bytes)
        );
    } else if status.state == "materialising" {
        println!("          off: blocks wait for the plan (--in-order, or --mem too small)");
    }
    println!(
        "read ahead {} done blocks for readers opening the blocks in order",
        thousands(status.read_ahead_blocks)
    );
    println!("error     {}", status.error.as_deref().unwrap_or("none"));
    println!("staging   {}", status.staging.display());
    println!("daemon    pid {}", status.pid);
}
