//! Progress as `rechunkfs status` and the status file show it. The status
//! is JSON because other processes read it through the view, and a daemon
//! of another version may be the one answering.

use std::sync::atomic::Ordering;

use serde::Serialize;

use crate::view::core::{Phase, ViewCore};

/// Progress, as `rechunkfs status` and the status file show it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct Status {
    pub state: String,
    pub blocks_done: u64,
    pub blocks_total: u64,
    /// Blocks found complete in the staging area at mount (not redone).
    pub blocks_resumed: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Seeks the plan's run has made (blocks extracted on demand are then
    /// skipped by the plan, so this can end below `seeks_planned`).
    pub seeks_made: u64,
    pub seeks_planned: u64,
    /// The most array bytes the plan's run has held so far, and what its
    /// plan predicts it holds at most (whatever `--threads`).
    #[serde(default)]
    pub peak_held_bytes: u64,
    #[serde(default)]
    pub peak_held_bytes_planned: u64,
    /// Blocks extracted ahead of the plan for waiting readers, and the
    /// extra seeks that took (counted apart from the plan's).
    #[serde(default)]
    pub on_demand_blocks: u64,
    #[serde(default)]
    pub on_demand_seeks: u64,
    /// Time spent extracting them (reading their input, writing them).
    #[serde(default)]
    pub on_demand_seconds: f64,
    /// Input bytes read for them.
    #[serde(default)]
    pub on_demand_bytes_read: u64,
    /// The most bytes one extraction held, and the bytes `--mem` sets
    /// aside for one beside the plan's (0: blocks wait for the plan).
    #[serde(default)]
    pub on_demand_peak_bytes: u64,
    #[serde(default)]
    pub on_demand_reserved_bytes: u64,
    /// Done blocks read ahead for readers sweeping the view in order.
    #[serde(default)]
    pub read_ahead_blocks: u64,
    pub rate_bytes_per_second: f64,
    pub eta_seconds: Option<f64>,
    pub elapsed_seconds: f64,
    pub waiting_reads: u64,
    /// The filesystem the materialiser waits for space on (it is full):
    /// it goes on by itself once space is freed there.
    #[serde(default)]
    pub waiting_for_space: Option<std::path::PathBuf>,
    pub error: Option<String>,
    pub staging: std::path::PathBuf,
    pub pid: u32,
    /// Per pyramid level (a view with `--levels`): blocks done of its total.
    #[serde(default)]
    pub levels: Vec<LevelProgress>,
}

/// One pyramid level's progress.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct LevelProgress {
    pub level: usize,
    pub blocks_done: u64,
    pub blocks_total: u64,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Materialising => "materialising",
            Phase::Complete => "complete",
            Phase::Failed => "failed",
            Phase::Stopping => "stopping",
        }
    }
}

impl ViewCore {
    pub fn status(&self) -> Status {
        let state = self.state.lock();
        let elapsed = self.started.elapsed().as_secs_f64();
        let bytes_total: u64 = self.array_bytes();
        let written = state.run.bytes_written;
        let rate = if elapsed > 0.0 {
            written as f64 / elapsed
        } else {
            0.0
        };
        let remaining = bytes_total.saturating_sub(state.done_bytes);
        Status {
            state: state.phase.name().to_string(),
            blocks_done: state.done_count,
            blocks_total: self.files().block_count(),
            blocks_resumed: state.resumed,
            bytes_done: state.done_bytes,
            bytes_total,
            seeks_made: state.run.seeks(),
            seeks_planned: self.planned_seeks,
            peak_held_bytes: state.run.peak_held_bytes,
            peak_held_bytes_planned: self.planned_peak_bytes,
            on_demand_blocks: state.on_demand_blocks,
            on_demand_seeks: state.on_demand_seeks,
            on_demand_seconds: state.on_demand_seconds,
            on_demand_bytes_read: state.on_demand_bytes_read,
            on_demand_peak_bytes: state.on_demand_peak_bytes,
            on_demand_reserved_bytes: state.on_demand_reserved_bytes,
            read_ahead_blocks: self.read_ahead_blocks.load(Ordering::Relaxed),
            rate_bytes_per_second: rate,
            eta_seconds: (state.phase == Phase::Materialising && rate > 0.0)
                .then(|| remaining as f64 / rate),
            elapsed_seconds: elapsed,
            waiting_reads: state.waiters.values().map(|w| w.len() as u64).sum(),
            waiting_for_space: state.waiting_for_space.clone(),
            error: state.failure.clone(),
            staging: self.staging.dir().to_path_buf(),
            pid: std::process::id(),
            levels: self.level_progress(&state.done),
        }
    }

    /// Blocks done per pyramid level (none without a pyramid).
    fn level_progress(&self, done: &[bool]) -> Vec<LevelProgress> {
        if self.pyramid().is_none() {
            return Vec::new();
        }
        let files = self.files();
        (0..files.level_count())
            .map(|level| {
                let ranks = files.level_ranks(level);
                let blocks_total = ranks.end - ranks.start;
                let blocks_done = done[ranks.start as usize..ranks.end as usize]
                    .iter()
                    .filter(|&&d| d)
                    .count() as u64;
                LevelProgress {
                    level,
                    blocks_done,
                    blocks_total,
                }
            })
            .collect()
    }

    /// The status file's bytes: the status as pretty JSON, one line feed.
    pub(super) fn status_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(&self.status()).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}
