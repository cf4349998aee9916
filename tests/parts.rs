//! A job cut into parts (`plan::parts`), each part run on its own.
//!
//! The property test draws arrays of 1 to 3 dimensions, input and output
//! blocks that do and do not divide them, npy or Zarr v2 inputs (padded
//! chunks, raw or compressed), part counts and memory limits. Inputs are
//! written and outputs read by the naive writers and readers of
//! `tests/property/` (nothing of rechunkfs), and every block's expected
//! bytes are cut from the whole array by plain index arithmetic. The parts
//! together must make one machine's output byte for byte, no block may be
//! written by two parts, and each part's counted seeks, peak memory and
//! bytes must equal its own prediction.
//!
//! The command-line tests check `plan --parts` on the keep paper's
//! configuration 4, a Zarr output in parts that `finish` completes (read by
//! zarr-python), `status` per part, and one part run twice at once.

#[macro_use]
mod common;

#[allow(dead_code)]
#[path = "property/files.rs"]
mod files;
#[allow(dead_code)]
#[path = "property/naive.rs"]
mod naive;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rechunkfs::format::BlockFormat;
use rechunkfs::input::{HeaderChecks, InputArray};
use rechunkfs::output::directory::{self, OutputSpec, PartOutput};
use rechunkfs::plan::{self, parts, Problem, Strategy as PlanStrategy};

use naive::Elem;

/// Cases run unless `PROPTEST_CASES` says otherwise.
const DEFAULT_CASES: u32 = 120;

/// How the input array is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Input {
    Npy,
    /// Zarr v2, chunks padded; compressed (read whole) or raw.
    Zarr {
        compressed: bool,
    },
}

#[derive(Clone, Debug)]
struct Case {
    array: Vec<u64>,
    input_block: Vec<u64>,
    output_block: Vec<u64>,
    elem: Elem,
    input: Input,
    parts: u64,
    /// Between 0 (the least the whole job can hold) and 1 (keep(r̂)'s
    /// peak); None: unlimited.
    mem: Option<f64>,
}

fn cases() -> impl Strategy<Value = Case> {
    (1usize..=3)
        .prop_flat_map(|ndim| {
            (
                prop::collection::vec(1u64..=11, ndim),
                prop::collection::vec(1u64..=12, ndim),
                prop::collection::vec(1u64..=12, ndim),
            )
        })
        .prop_flat_map(|(array, input, output)| {
            let output: Vec<u64> = output.iter().zip(&array).map(|(&o, &a)| o.min(a)).collect();
            let blocks: u64 = array
                .iter()
                .zip(&output)
                .map(|(&a, &o)| a.div_ceil(o))
                .product();
            (
                Just(array),
                Just(input),
                Just(output),
                prop::sample::select(vec![
                    Elem {
                        kind: 'u',
                        size: 1,
                        big: false,
                    },
                    Elem {
                        kind: 'u',
                        size: 2,
                        big: false,
                    },
                    Elem {
                        kind: 'i',
                        size: 4,
                        big: true,
                    },
                ]),
                prop::sample::select(vec![
                    Input::Npy,
                    Input::Zarr { compressed: false },
                    Input::Zarr { compressed: true },
                ]),
                1..=blocks.min(9),
                prop::option::of(0.0f64..=1.0),
            )
        })
        .prop_map(
            |(array, input_block, output_block, elem, input, parts, mem)| Case {
                array,
                input_block,
                output_block,
                elem,
                input,
                parts,
                mem,
            },
        )
}

/// Writes the input of `case` (the whole array `whole`) under `root`.
fn write_input(root: &Path, case: &Case, whole: &[u8]) -> PathBuf {
    let dir = root.join("in");
    std::fs::create_dir(&dir).unwrap();
    let grid = naive::blocks(&case.array, &case.input_block);
    match case.input {
        Input::Npy => {
            for block in &grid {
                let data = naive::cut(whole, &case.array, block, &block.shape, case.elem, 0);
                let name: Vec<String> = block.index.iter().map(u64::to_string).collect();
                let path = dir.join(format!("{}.npy", name.join("_")));
                files::write_npy(&path, &block.shape, case.elem, &data);
            }
        }
        Input::Zarr { compressed } => {
            let chunk = &case.input_block;
            let (name, text) =
                files::zarr_metadata(false, &case.array, chunk, case.elem, '.', compressed);
            std::fs::write(dir.join(name), &text).unwrap();
            for block in &grid {
                let path = dir.join(files::zarr_chunk_key(false, &block.index, '.'));
                let mut bytes = naive::cut(whole, &case.array, block, chunk, case.elem, 0xA5);
                if compressed {
                    bytes = files::zarr_encode(&text, &bytes, case.elem);
                }
                std::fs::write(path, bytes).unwrap();
            }
        }
    }
    dir
}

/// The memory limit `case` asks for, between the least the whole job can
/// hold and keep(r̂)'s peak.
fn mem_of(case: &Case, problem: &Problem) -> Option<u64> {
    let fraction = case.mem?;
    let most = plan::keep_rhat(problem).prediction.peak_bytes;
    let least = least_memory(problem).min(most);
    Some(least + ((most - least) as f64 * fraction) as u64)
}

/// The least memory any plan of `problem` holds (what a refusal names).
fn least_memory(problem: &Problem) -> u64 {
    match plan::plan(problem, PlanStrategy::Keep, Some(0)) {
        Err(rechunkfs::Error::DoesNotFit { needed, .. }) => needed,
        Ok(plan) => plan.prediction.peak_bytes,
        Err(e) => panic!("plan: {e}"),
    }
}

/// A part's plan within `mem`, or, if the part cannot fit there (its
/// clipped blocks can need more than the whole job's least), within the
/// least it can.
fn part_plan(part: &Problem, mem: Option<u64>) -> plan::Plan {
    plan::plan(part, PlanStrategy::Keep, mem).unwrap_or_else(|_| {
        plan::plan(part, PlanStrategy::Keep, Some(least_memory(part))).expect("the least fits")
    })
}

fn spec_of(input: &InputArray) -> OutputSpec {
    OutputSpec {
        format: BlockFormat::Npy,
        dataset: "/data".into(),
        dtype: input.dtype,
        space: input.space().unwrap(),
        axis_order: input.axis_order(),
        encoding: Default::default(),
        commit_batch_bytes: rechunkfs::output::directory::COMMIT_BATCH_BYTES,
    }
}

/// Every file in `dir` (flat), by name.
fn names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn run_case(case: &Case) {
    let root = tempfile::tempdir().unwrap();
    let whole = naive::whole_array(&case.array, case.elem);
    let dir = write_input(root.path(), case, &whole);
    let input = InputArray::scan_with(&dir, None, HeaderChecks::BeforeUse).unwrap();
    let problem =
        rechunkfs::output::problem_for(&input, case.output_block.clone(), BlockFormat::Npy)
            .unwrap();
    let mem = mem_of(case, &problem);

    let single = root.path().join("single");
    directory::prepare_output_dir(&single, false).unwrap();
    let one = plan::plan(&problem, PlanStrategy::Keep, mem).unwrap();
    directory::rechunk(&input, &one, &single, spec_of(&input), None, |_| {}).unwrap();

    let grid: Vec<u64> = (0..case.array.len())
        .map(|d| case.array[d].div_ceil(case.output_block[d]))
        .collect();
    let job = match parts::cut(&problem, case.parts) {
        Ok(job) => job,
        Err(e) => {
            // Only a count no grid of boxes of whole blocks makes.
            assert!(!can_cut(case.parts, &grid), "{} parts: {e}", case.parts);
            return;
        }
    };
    assert_eq!(job.count(), case.parts);
    let out = root.path().join("out");
    directory::prepare_output_dir(&out, false).unwrap();
    let mut written = 0;
    for k in 0..job.count() {
        let part = job.problem(k);
        let chosen = part_plan(&part, mem);
        let before = names(&out);
        let stats = directory::rechunk_part(
            &input,
            &chosen,
            (&out, problem.output()),
            spec_of(&input),
            PartOutput::of_plan(&chosen, k),
            None,
            |_| {},
        )
        .unwrap_or_else(|e| panic!("part {k}: {e}"));
        let predicted = chosen.prediction;
        assert_eq!(
            stats.read_seeks, predicted.read_seeks,
            "part {k}: read seeks"
        );
        assert_eq!(
            stats.write_seeks, predicted.write_seeks,
            "part {k}: write seeks"
        );
        assert_eq!(
            stats.peak_held_bytes, predicted.peak_bytes,
            "part {k}: peak"
        );
        let elem = case.elem.size as u64;
        let volume: u64 = part.array.iter().product();
        assert_eq!(
            stats.bytes_written,
            volume * elem,
            "part {k}: bytes written"
        );
        if case.input == Input::Npy {
            assert_eq!(
                stats.bytes_read, predicted.bytes_read,
                "part {k}: bytes read"
            );
        }
        // Its own blocks, and only they, appear: no block has two writers.
        let after = names(&out);
        let new: BTreeSet<&String> = after.difference(&before).collect();
        assert_eq!(new.len() as u64, part.output().count(), "part {k}: blocks");
        assert!(before.is_subset(&after), "part {k} removed a block");
        written += new.len();
    }
    assert_eq!(written as u64, problem.output().count());
    assert_eq!(names(&out), names(&single));
    for name in names(&single) {
        let (a, b) = (out.join(&name), single.join(&name));
        assert!(
            std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
            "{name}: parts and one machine differ"
        );
    }
    for block in naive::blocks(&case.array, &case.output_block) {
        let name: Vec<String> = block.index.iter().map(u64::to_string).collect();
        let read = files::read_npy(&out.join(format!("{}.npy", name.join("_"))));
        let expected = naive::cut(&whole, &case.array, &block, &block.shape, case.elem, 0);
        assert_eq!(read.shape, block.shape);
        assert!(
            read.data == expected,
            "block {:?}: wrong bytes",
            block.index
        );
    }
}

/// Whether `n` parts can be a grid of boxes over `grid` blocks per
/// dimension: `n` a product of one count per dimension, each at most
/// that dimension's blocks.
fn can_cut(n: u64, grid: &[u64]) -> bool {
    match grid.split_first() {
        None => n == 1,
        Some((&first, rest)) => {
            (1..=first.min(n)).any(|count| n % count == 0 && can_cut(n / count, rest))
        }
    }
}

#[test]
fn parts_together_make_one_machines_output_each_as_predicted() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&cases_strategy(), |case| {
            run_case(&case);
            Ok(())
        })
        .unwrap();
}

fn cases_strategy() -> impl Strategy<Value = Case> {
    cases()
}

fn rechunkfs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .args(args)
        .output()
        .expect("run rechunkfs")
}

fn text(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

fn json_of(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", common::stderr(output));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

#[test]
fn plan_cuts_config_4_in_four_at_the_lcm_for_nothing() {
    let report = json_of(&rechunkfs(&[
        "plan",
        "--array",
        "3500,3500,3500",
        "--blocks",
        "175,175,175",
        "--dtype",
        "u2",
        "--shape",
        "250,250,250",
        "--parts",
        "4",
        "--json",
    ]));
    let parts = &report["parts"];
    assert_eq!(parts["cuts"][0], serde_json::json!([0, 1750, 3500]));
    assert_eq!(parts["cuts"][1], serde_json::json!([0, 1750, 3500]));
    assert_eq!(parts["extra_seeks"], 0);
    assert_eq!(parts["extra_bytes_read"], 0);
    assert_eq!(parts["seeks"], 10_744);
    assert_eq!(parts["balance"], 1.0);
    // 16 parts: slabs of exact rows along the first dimension, one more
    // seek per input block a cut straddles, no byte more.
    let report = json_of(&rechunkfs(&[
        "plan",
        "--array",
        "3500,3500,3500",
        "--blocks",
        "175,175,175",
        "--dtype",
        "u2",
        "--shape",
        "250,250,250",
        "--parts",
        "16",
        "--json",
    ]));
    assert_eq!(report["parts"]["extra_bytes_read"], 0);
    assert_eq!(report["parts"]["count"], 16);
}

const ARRAY: [u64; 3] = [60, 50, 40];
const OUT_BLOCK: [u64; 3] = [20, 25, 15];

/// A Zarr v2 input by zarr-python, and the common rechunk arguments.
fn zarr_input(root: &Path) -> PathBuf {
    common::make_zarr(
        root,
        "in",
        &ARRAY,
        &[16, 16, 16],
        common::dtype("u2"),
        BlockFormat::Zarr,
    )
}

fn rechunk_part(input: &Path, out: &Path, part: &str, delay_ms: u64) -> Output {
    zarr3_part_with(input, out, part, &[], delay_ms)
}

#[test]
fn a_zarr_output_in_parts_is_finished_and_status_follows_it() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let input = zarr_input(root.path());
    let out = root.path().join("out");
    for k in 0..3 {
        let output = rechunk_part(&input, &out, &format!("{k}/4"), 0);
        assert!(output.status.success(), "{}", common::stderr(&output));
    }
    let status = json_of(&rechunkfs(&["status", text(&out), "--json"]));
    assert_eq!(status["state"], "in progress");
    let last = &status["parts"][3];
    assert_eq!(last["blocks_done"], 0);
    assert!(common::json_u64(last, "blocks") > 0);
    assert!(!out.join("zarr.json").exists(), "no metadata before finish");
    let refused = rechunkfs(&["finish", text(&out)]);
    assert!(!refused.status.success());
    assert!(common::stderr(&refused).contains("in part(s) 3 of 4"));
    let output = rechunk_part(&input, &out, "3/4", 0);
    assert!(output.status.success(), "{}", common::stderr(&output));
    let status = json_of(&rechunkfs(&["status", text(&out), "--json"]));
    assert_eq!(status["state"], "blocks complete, finish not run");
    let finished = rechunkfs(&["finish", text(&out)]);
    assert!(finished.status.success(), "{}", common::stderr(&finished));
    common::verify_zarr_output(
        &out,
        &ARRAY,
        &OUT_BLOCK,
        common::dtype("u2"),
        BlockFormat::Zarr3,
    );
    assert!(
        !out.join(".rechunkfs-job.json").exists(),
        "finish removes the record"
    );
}

#[test]
fn one_part_run_twice_at_once_is_harmless() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let input = zarr_input(root.path());
    let out = root.path().join("out");
    let (a, b) = std::thread::scope(|scope| {
        let first = scope.spawn(|| rechunk_part(&input, &out, "0/2", 60));
        let second = scope.spawn(|| rechunk_part(&input, &out, "0/2", 60));
        (first.join().unwrap(), second.join().unwrap())
    });
    assert!(a.status.success(), "{}", common::stderr(&a));
    assert!(b.status.success(), "{}", common::stderr(&b));
    let output = rechunk_part(&input, &out, "1/2", 0);
    assert!(output.status.success(), "{}", common::stderr(&output));
    let finished = rechunkfs(&["finish", text(&out)]);
    assert!(finished.status.success(), "{}", common::stderr(&finished));
    common::verify_zarr_output(
        &out,
        &ARRAY,
        &OUT_BLOCK,
        common::dtype("u2"),
        BlockFormat::Zarr3,
    );
    let left: Vec<PathBuf> = walk(&out)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// `rechunk IN OUT` as part `part` of a zarr3 job, with `extra`.
fn zarr3_part(input: &Path, out: &Path, part: &str, extra: &[&str]) -> Output {
    zarr3_part_with(input, out, part, extra, 0)
}

/// [`zarr3_part`], each step slowed by `delay_ms`.
fn zarr3_part_with(input: &Path, out: &Path, part: &str, extra: &[&str], delay_ms: u64) -> Output {
    let mut args = vec![
        "rechunk",
        text(input),
        text(out),
        "--shape",
        "20,25,15",
        "--format",
        "zarr3",
        "-q",
        "--part",
        part,
    ];
    args.extend(extra);
    common::run_rechunkfs(&args, delay_ms)
}

#[test]
fn parts_with_different_settings_are_refused_naming_the_setting() {
    let root = tempfile::tempdir().unwrap();
    let input = common::make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &[16, 16, 16],
        common::dtype("u2"),
        BlockFormat::Npy,
    );
    let zstd: &[&str] = &["--compress", "zstd:3"];
    // Either order: the first part's settings are the job's.
    for (first, second) in [(zstd, &[][..]), (&[][..], zstd)] {
        let out = root.path().join(format!("out{}", first.len()));
        let output = zarr3_part(&input, &out, "0/2", first);
        assert!(output.status.success(), "{}", common::stderr(&output));
        let refused = zarr3_part(&input, &out, "1/2", second);
        let message = common::stderr(&refused);
        assert_eq!(refused.status.code(), Some(1), "{message}");
        assert!(
            message.contains("holds blocks of another job") && message.contains("--compress"),
            "{message}"
        );
        // The part with the job's settings finishes it.
        let output = zarr3_part(&input, &out, "1/2", first);
        assert!(output.status.success(), "{}", common::stderr(&output));
        let finished = rechunkfs(&["finish", text(&out)]);
        assert!(finished.status.success(), "{}", common::stderr(&finished));
    }
}

#[test]
fn an_input_rewritten_with_its_mtime_restored_is_caught_by_the_next_part() {
    let root = tempfile::tempdir().unwrap();
    let input = common::make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &[16, 16, 16],
        common::dtype("u2"),
        BlockFormat::Npy,
    );
    let out = root.path().join("out");
    let output = zarr3_part(&input, &out, "0/2", &[]);
    assert!(output.status.success(), "{}", common::stderr(&output));
    // Same size, same mtime, other bytes: only ctime tells.
    let block = input.join("3_2_1.npy");
    let reference = root.path().join("reference");
    std::fs::copy(&block, &reference).unwrap();
    let touched = Command::new("touch")
        .arg("-r")
        .arg(&block)
        .arg(&reference)
        .status();
    assert!(touched.unwrap().success());
    let mut bytes = std::fs::read(&block).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&block, &bytes).unwrap();
    let restored = Command::new("touch")
        .arg("-r")
        .arg(&reference)
        .arg(&block)
        .status();
    assert!(restored.unwrap().success());
    let refused = zarr3_part(&input, &out, "1/2", &[]);
    let message = common::stderr(&refused);
    assert_eq!(refused.status.code(), Some(1), "{message}");
    assert!(
        message.contains("changed since") && message.contains("3_2_1.npy"),
        "{message}"
    );
    assert!(message.contains("ctime"), "{message}");
}

/// Parts cut across input blocks along every dimension read the blocks
/// they clip bridged: each clipped block in one call, so each part makes
/// exactly its own lower bound, its input blocks (clipped ones counted
/// once each) plus its output blocks. The overhead against one machine is
/// then one seek per extra (part, input block) pair, and the bytes of the
/// other parts' rows the bridged calls span, both predicted exactly.
#[test]
fn parts_cut_across_inner_dimensions_read_each_clipped_block_in_one_call() {
    let case = Case {
        array: vec![12, 12, 12],
        input_block: vec![6, 6, 6],
        output_block: vec![4, 4, 4],
        elem: Elem {
            kind: 'u',
            size: 2,
            big: false,
        },
        input: Input::Npy,
        parts: 27,
        mem: None,
    };
    let problem = Problem::new(
        case.array.clone(),
        case.input_block.clone(),
        case.output_block.clone(),
        2,
    )
    .unwrap();
    let job = parts::cut(&problem, case.parts).unwrap();
    assert_eq!(job.bridged, vec![false, true, true], "inner cuts bridged");
    let (mut seeks, mut bytes) = (0, 0);
    for k in 0..job.count() {
        let part = job.problem(k);
        let chosen = plan::keep_rhat(&part);
        assert_eq!(
            chosen.prediction.seeks(),
            part.lower_bound_seeks(),
            "part {k}"
        );
        seeks += chosen.prediction.seeks();
        bytes += chosen.prediction.bytes_read;
    }
    // 27 parts of 4³: along each dimension 3 parts meet 2 input intervals
    // in 4 pairs, so 4³ = 64 (part, input block) pairs against 8 input
    // blocks, and the 27 output blocks.
    assert_eq!(seeks, 64 + 27);
    let single = plan::keep_rhat(&problem).prediction;
    assert_eq!(single.seeks(), 8 + 27);
    assert!(bytes > single.bytes_read, "bridged calls read between rows");
    // Executed: each part's counted seeks, bytes read and peak equal its
    // plan's, and the parts' output is one machine's, byte for byte.
    run_case(&case);
}

/// The parts after the first take the input from the job's record: they
/// neither list the input's directory nor read its headers, so a stray
/// name there that a scan refuses goes unseen, and the output is still
/// one machine's, byte for byte as libhdf5 reads it. An input file
/// changed since the record, here replaced by a block of another shape, is
/// still refused by the next part, naming it, before that part writes any
/// block: a stat of each file finds it.
#[test]
fn parts_after_the_first_take_the_input_from_the_record_and_refuse_a_changed_one() {
    let root = tempfile::tempdir().unwrap();
    let input = common::make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &[16, 16, 16],
        common::dtype("u2"),
        BlockFormat::Hdf5,
    );
    let part = |out: &Path, k: &str| {
        rechunkfs(&[
            "rechunk",
            text(&input),
            text(out),
            "--shape",
            "20,25,15",
            "-q",
            "--part",
            k,
        ])
    };
    let out = root.path().join("out");
    let first = part(&out, "0/3");
    assert!(first.status.success(), "{}", common::stderr(&first));
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(".rechunkfs-job.json")).unwrap()).unwrap();
    let blocks = record["input_scan"]["blocks"].as_array().map(Vec::len);
    assert_eq!(blocks, Some(4 * 4 * 3), "the record holds the scan");
    std::fs::write(input.join("9_9_9.h5"), b"no block").unwrap();
    let scan = rechunkfs(&["plan", text(&input), "--shape", "20,25,15"]);
    assert!(!scan.status.success(), "a scan refuses the stray name");
    for k in ["1/3", "2/3"] {
        let output = part(&out, k);
        assert!(output.status.success(), "{}", common::stderr(&output));
    }
    let finished = rechunkfs(&["finish", text(&out)]);
    assert!(finished.status.success(), "{}", common::stderr(&finished));
    common::verify_output(
        &out,
        &ARRAY,
        &OUT_BLOCK,
        common::dtype("u2"),
        BlockFormat::Hdf5,
    );

    std::fs::remove_file(input.join("9_9_9.h5")).unwrap();
    let out = root.path().join("changed");
    let first = part(&out, "0/3");
    assert!(first.status.success(), "{}", common::stderr(&first));
    let sorted = |mut paths: Vec<PathBuf>| {
        paths.sort();
        paths
    };
    let before = sorted(walk(&out));
    // The last block (12×2×8) replaced by a copy of the first (16³), put in
    // its place by a rename as a careful writer does.
    let copy = input.join(".3_3_2.h5.new");
    std::fs::copy(input.join("0_0_0.h5"), &copy).unwrap();
    std::fs::rename(&copy, input.join("3_3_2.h5")).unwrap();
    let refused = part(&out, "2/3");
    let message = common::stderr(&refused);
    assert_eq!(refused.status.code(), Some(1), "{message}");
    assert!(
        message.contains("changed since") && message.contains("3_3_2.h5"),
        "{message}"
    );
    assert_eq!(sorted(walk(&out)), before, "the refused part wrote nothing");
}

/// A part from the job's record looks only at the input files it reads,
/// those its box overlaps: a file outside the box, changed since the
/// record (here no block at all), neither stops it nor is read by it,
/// while a part whose box holds that file refuses it, naming it, before
/// it writes anything.
#[test]
fn a_part_checks_only_the_input_files_its_box_reads() {
    let root = tempfile::tempdir().unwrap();
    let input = common::make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &[16, 16, 16],
        common::dtype("u2"),
        BlockFormat::Hdf5,
    );
    let part = |k: &str| {
        rechunkfs(&[
            "rechunk",
            text(&input),
            text(&root.path().join("out")),
            "--shape",
            "20,25,15",
            "-q",
            "--part",
            k,
        ])
    };
    let first = part("0/3");
    assert!(first.status.success(), "{}", common::stderr(&first));
    let out = root.path().join("out");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(".rechunkfs-job.json")).unwrap()).unwrap();
    // Part 0 reads input blocks 0_*_* and 1_*_* (0..32), parts 1 and 2
    // none of 0_*_* (0..16).
    assert_eq!(
        record["spec"]["cuts"],
        serde_json::json!([[0, 20, 40, 60], [0, 50], [0, 40]])
    );
    let stray = input.join(".0_0_0.h5.new");
    std::fs::write(&stray, b"no block").unwrap();
    std::fs::rename(&stray, input.join("0_0_0.h5")).unwrap();
    for k in ["1/3", "2/3"] {
        let output = part(k);
        assert!(
            output.status.success(),
            "part {k}: {}",
            common::stderr(&output)
        );
    }
    let before = walk(&out);
    let refused = part("0/3");
    let message = common::stderr(&refused);
    assert_eq!(refused.status.code(), Some(1), "{message}");
    assert!(
        message.contains("changed since") && message.contains("0_0_0.h5"),
        "{message}"
    );
    assert_eq!(walk(&out), before, "the refused part wrote nothing");
}

/// The record every part reads whole before it starts is compact and
/// names each input file from IN (`0_0_0.h5`), not by its whole path: for
/// W1's 8,000 files that is 1.1 MB instead of 2.5 MB. A record that names
/// them whole, indented, as earlier runs wrote it, is still read: the
/// later parts take the input from it and make one machine's output.
#[test]
fn the_job_record_names_input_files_from_in_and_still_reads_whole_paths() {
    let root = tempfile::tempdir().unwrap();
    let input = common::make_blocks(
        root.path(),
        "in",
        &ARRAY,
        &[16, 16, 16],
        common::dtype("u2"),
        BlockFormat::Hdf5,
    );
    let out = root.path().join("out");
    let part = |k: &str| {
        rechunkfs(&[
            "rechunk",
            text(&input),
            text(&out),
            "--shape",
            "20,25,15",
            "-q",
            "--part",
            k,
        ])
    };
    let first = part("0/3");
    assert!(first.status.success(), "{}", common::stderr(&first));
    let path = out.join(".rechunkfs-job.json");
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
    let mut record: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let names: Vec<String> = record["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 4 * 4 * 3);
    assert_eq!(names[0], "0_0_0.h5");
    assert_eq!(names[names.len() - 1], "3_3_2.h5");
    // As an earlier run wrote it: whole paths, indented.
    let whole = input.canonicalize().unwrap();
    for entry in record["inputs"].as_array_mut().unwrap() {
        let name = entry["path"].as_str().unwrap().to_string();
        let full = whole.join(name);
        entry["path"] = serde_json::Value::from(text(&full));
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
    for k in ["1/3", "2/3"] {
        let output = part(k);
        assert!(
            output.status.success(),
            "part {k}: {}",
            common::stderr(&output)
        );
    }
    let finished = rechunkfs(&["finish", text(&out)]);
    assert!(finished.status.success(), "{}", common::stderr(&finished));
    common::verify_output(
        &out,
        &ARRAY,
        &OUT_BLOCK,
        common::dtype("u2"),
        BlockFormat::Hdf5,
    );
}
