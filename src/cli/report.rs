//! How results are shown to a person: progress bars on a terminal, the
//! report of a run (human or JSON), and numbers grouped so that block and
//! seek counts can be read at a glance.

use std::io::IsTerminal;
use std::time::Duration;

use serde_json::json;

use crate::array::axes::AxisOrder;
use crate::array::units::show_bytes;
use crate::engine::RunStats;
use crate::plan::Plan;

/// A progress bar on a terminal, nothing elsewhere.
pub(super) fn progress_bar(total_bytes: u64, quiet: bool) -> indicatif::ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total_bytes);
    let style = indicatif::ProgressStyle::with_template(
        "{elapsed_precise} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// A run's progress callback: bytes written and blocks done on `bar`, and
/// a pause of `delay` after each read block (the step-delay test hook).
pub(super) fn run_progress(
    bar: &indicatif::ProgressBar,
    delay: Option<Duration>,
) -> impl FnMut(&RunStats) + '_ {
    let mut read_blocks_done = 0;
    move |stats: &RunStats| {
        bar.set_position(stats.bytes_written);
        bar.set_message(format!(
            "blocks {}/{}",
            stats.output_blocks_done, stats.output_blocks_total
        ));
        if let Some(delay) = delay.filter(|_| stats.read_blocks_done > read_blocks_done) {
            std::thread::sleep(delay);
        }
        read_blocks_done = stats.read_blocks_done;
    }
}

pub(super) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Prints what a run of `plan` did, as text or one JSON object.
pub(super) fn report_run(
    plan: &Plan,
    stats: &RunStats,
    order: AxisOrder,
    elapsed: Duration,
    as_json: bool,
    pyramid: Option<serde_json::Value>,
) -> anyhow::Result<()> {
    let seconds = elapsed.as_secs_f64();
    if as_json {
        let mut report = json!({
            "strategy": plan.strategy,
            "read_shape": order.to_user(&plan.read_shape),
            "seeks": {
                "made": stats.seeks(),
                "read": stats.read_seeks,
                "write": stats.write_seeks,
                "planned": plan.prediction.seeks(),
            },
            "bytes_read": stats.bytes_read,
            "fill_bytes": stats.fill_bytes,
            "bytes_written": stats.bytes_written,
            "encoded_from_bytes": stats.encoded_from_bytes,
            "compression_ratio": compression_ratio(stats),
            "peak_memory_bytes": stats.peak_held_bytes,
            "planned_peak_memory_bytes": plan.prediction.peak_bytes,
            "output_blocks": stats.output_blocks_done,
            "peak_rss_bytes": peak_rss_bytes(),
            "seconds": seconds,
        });
        if let Some(pyramid) = pyramid {
            report["pyramid"] = pyramid;
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_run(plan, stats, seconds);
    }
    Ok(())
}

fn print_run(plan: &Plan, stats: &RunStats, seconds: f64) {
    println!(
        "wrote {} blocks ({}) in {:.2} s, {}/s",
        thousands(stats.output_blocks_done),
        show_bytes(stats.bytes_written),
        seconds,
        show_bytes((stats.bytes_written as f64 / seconds.max(1e-9)) as u64)
    );
    if let Some(ratio) = compression_ratio(stats) {
        println!(
            "encoded {} of blocks (padding included) into {}: compression ratio {ratio:.2}",
            show_bytes(stats.encoded_from_bytes),
            show_bytes(stats.bytes_written)
        );
    }
    println!(
        "seeks {} (reads {} + writes {}; planned {})",
        thousands(stats.seeks()),
        thousands(stats.read_seeks),
        thousands(stats.write_seeks),
        thousands(plan.prediction.seeks())
    );
    if stats.fill_bytes > 0 {
        println!(
            "{} came from absent Zarr chunks' fill value, read without I/O \
             (counted in the seeks as if read)",
            show_bytes(stats.fill_bytes)
        );
    }
    println!(
        "peak memory held {} (planned {}); peak RSS {}",
        show_bytes(stats.peak_held_bytes),
        show_bytes(plan.prediction.peak_bytes),
        peak_rss_bytes().map_or("unknown".into(), show_bytes)
    );
}

/// Bytes of encoded blocks before encoding per byte written, when blocks
/// were encoded.
fn compression_ratio(stats: &RunStats) -> Option<f64> {
    (stats.encoded_from_bytes > 0 && stats.bytes_written > 0)
        .then(|| stats.encoded_from_bytes as f64 / stats.bytes_written as f64)
}

/// This process's peak resident set size, from `getrusage`.
fn peak_rss_bytes() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid rusage.
    let status = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if status != 0 {
        return None;
    }
    // SAFETY: initialised by the successful call above.
    let usage = unsafe { usage.assume_init() };
    Some(usage.ru_maxrss as u64 * 1024)
}
