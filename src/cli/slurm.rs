//! `slurm`: a job in parts as a SLURM job array. It prints a script that
//! submits the array (one task per part, each `rechunk ... --part K/N`
//! with identical arguments) and a job depending on it (`afterok`) that
//! runs `finish`; `--submit` runs it. SLURM schedules, retries and
//! accounts; rechunkfs only says what each task is.
//!
//! Memory: a task's `--mem` becomes its memory cgroup's limit, and inside
//! a cgroup rechunkfs plans within half of it (`plan::budget`: the rest is
//! page cache). So each task asks for twice the largest part's planned
//! peak, plus what the process needs beside the array bytes: every part
//! then plans exactly as `plan --parts` shows.

use std::path::Path;

use anyhow::{bail, Context};

use crate::array::units::show_bytes;
use crate::cli::args::{mem_of, SlurmArgs};
use crate::cli::plan::plan_job_of;
use crate::format::BlockFormat;
use crate::input::InputArray;
use crate::output::request::problem_of;
use crate::plan::Strategy;

/// What a task needs beside the array bytes it holds: code, libhdf5,
/// buffers and allocator slack (20-50 MiB measured on W1 and W2), with
/// room to spare.
const PROCESS_BYTES: u64 = 64 << 20;

pub(super) fn slurm_command(args: SlurmArgs) -> anyhow::Result<()> {
    let input = InputArray::scan(&args.input, Some(&args.input_args.dataset))?;
    let format = match &args.format {
        Some(text) => text.parse::<BlockFormat>()?,
        None => input.format.default_output(),
    };
    let problem = problem_of(&input, &args.planning.shape, format)?;
    let strategy: Strategy = args.planning.strategy.parse()?;
    let requested = mem_of(&args.planning)?;
    // Planned as the tasks will plan: within --mem, whatever cgroup this
    // command runs in (the tasks' cgroups are sized to leave --mem whole).
    let job = plan_job_of(&problem, args.parts, strategy, requested)?;
    let task_bytes = task_memory(job.peak_bytes());
    let script = script(&args, format, task_bytes)?;
    if !args.submit {
        print!("{script}");
        eprintln!(
            "{} parts, each task asking for {} (twice the largest part's peak of {}, plus {} \
             for the process); run this with bash to submit it, or pass --submit",
            args.parts,
            show_bytes(task_bytes),
            show_bytes(job.peak_bytes()),
            show_bytes(PROCESS_BYTES)
        );
        return Ok(());
    }
    let status = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .arg("rechunkfs-slurm")
        .status()
        .context("running bash to submit the job (is bash installed?)")?;
    if !status.success() {
        bail!("submitting the job failed ({status}); sbatch said why above");
    }
    Ok(())
}

/// A task's memory for parts whose largest planned peak is `peak`: twice
/// it (rechunkfs plans within half its cgroup) plus [`PROCESS_BYTES`],
/// in whole MiB.
fn task_memory(peak: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    (2 * peak + PROCESS_BYTES).div_ceil(MIB) * MIB
}

/// The submitting script: `bash SCRIPT [INDICES [OFFSET]]` submits the
/// array (all parts, or the array indices given, part = index + OFFSET)
/// and the `finish` job after it.
fn script(args: &SlurmArgs, format: BlockFormat, task_bytes: u64) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("finding the rechunkfs executable")?;
    let exe = quote(&exe);
    let out = absolute(&args.output)?;
    let n = args.parts;
    let running = args.max_running.map_or(String::new(), |m| format!("%{m}"));
    let mut rechunk = format!(
        "{exe} rechunk {} {} --shape {} --format {} --dataset {} --strategy {} -q",
        quote(&absolute(&args.input)?),
        quote(&out),
        quote(Path::new(&args.planning.shape)),
        format.extension(),
        quote(Path::new(&args.input_args.dataset)),
        quote(Path::new(&args.planning.strategy)),
    );
    if let Some(mem) = &args.planning.mem {
        rechunk += &format!(" --mem {}", quote(Path::new(mem)));
    }
    // Each task gets the CPUs its threads use; without --threads, two (the
    // reader and the writer), and the task uses what SLURM gives it.
    let cpus = args.planning.threads.map_or(2, |n| n.max(2));
    if let Some(threads) = args.planning.threads {
        rechunk += &format!(" --threads {threads}");
    }
    let extra: String = args
        .sbatch_args
        .iter()
        .map(|arg| format!("#SBATCH {arg}\n"))
        .collect();
    let mib = task_bytes >> 20;
    Ok(format!(
        r#"#!/bin/bash
# rechunkfs in {n} parts as a SLURM job array, then `finish` once every part is done.
#   bash THIS                  submit every part, and finish after them
#   bash THIS 3,17             submit parts 3 and 17 again (failed ones), and finish after them
#   bash THIS 0-999 1000       array indices 0-999 run parts 1000-1999 (sites capping MaxArraySize)
# Each part keeps the blocks it finished; a part run again writes only the rest.
set -euo pipefail
indices=${{1:-0-{last}}}
offset=${{2:-0}}
array=$(sbatch --parsable --array="$indices{running}" --export=ALL,RECHUNKFS_PART_OFFSET="$offset" <<'TASK'
#!/bin/bash
#SBATCH --job-name=rechunkfs
#SBATCH --cpus-per-task={cpus}
#SBATCH --mem={mib}M
{extra}set -euo pipefail
part=$(( SLURM_ARRAY_TASK_ID + ${{RECHUNKFS_PART_OFFSET:-0}} ))
exec {rechunk} --part "$part/{n}"
TASK
)
finish=$(sbatch --parsable --dependency=afterok:"${{array%%;*}}" <<'TASK'
#!/bin/bash
#SBATCH --job-name=rechunkfs-finish
#SBATCH --cpus-per-task=1
#SBATCH --mem=256M
{extra}exec {exe} finish {out}
TASK
)
echo "submitted parts $indices (+$offset) of {n}: array job ${{array%%;*}}, finish job ${{finish%%;*}}"
"#,
        last = n - 1,
        out = quote(&out),
    ))
}

/// `path` made absolute (the tasks may start elsewhere).
fn absolute(path: &Path) -> anyhow::Result<std::path::PathBuf> {
    std::path::absolute(path).with_context(|| format!("{}: making it absolute", path.display()))
}

/// `path` quoted for the shell: single quotes, each inner one closed,
/// escaped and reopened.
fn quote(path: &Path) -> String {
    format!("'{}'", path.to_string_lossy().replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_ask_for_twice_the_peak_and_the_process() {
        assert_eq!(task_memory(100 << 20), 264 << 20);
        assert_eq!(task_memory(1), 65 << 20);
        assert_eq!(quote(Path::new("it's")), r"'it'\''s'");
    }
}
