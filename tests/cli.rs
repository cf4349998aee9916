//! The command line as a person uses it: `plan` numbers and JSON, `rechunk`
//! end to end, and every refusal of bad input naming the file and problem
//! (non-zero exit, nothing written).

#[macro_use]
mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use rechunkfs::format::BlockFormat;

use common::{dtype, make_blocks, python, stderr, verify_output};

fn rechunkfs(args: &[&str]) -> Output {
    common::run_rechunkfs(args, 0)
}

fn plan_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["plan", "--json"];
    all.extend_from_slice(args);
    let output = rechunkfs(&all);
    assert!(output.status.success(), "plan failed: {}", stderr(&output));
    serde_json::from_slice(&output.stdout).expect("plan --json prints JSON")
}

#[test]
fn plan_prints_the_known_numbers() {
    for (a, i, o, rhat, keep, baseline) in [
        ("12,12,12", "4,4,4", "3,3,3", 4, 91, 723),
        ("50,50,50", "5,5,5", "10,10,10", 10, 1125, 26000),
        ("60,60,60", "6,6,6", "4,4,4", 6, 4375, 45000),
        ("30,30,30", "10,10,10", "30,30,30", 30, 28, 2727),
    ] {
        let report = plan_json(&["--array", a, "--blocks", i, "--dtype", "u1", "--shape", o]);
        assert_eq!(report["read_shape"], serde_json::json!([rhat, rhat, rhat]));
        assert_eq!(report["seeks"]["keep"], keep);
        assert_eq!(report["seeks"]["baseline"], baseline);
        assert_eq!(report["seeks"]["lower_bound"], keep);
        assert!(common::json_u64(&report, "peak_memory_bytes") > 0);
    }
    let config4 = plan_json(&[
        "--array",
        "3500,3500,3500",
        "--blocks",
        "175,175,175",
        "--dtype",
        "uint16",
        "--shape",
        "250,250,250",
    ]);
    assert_eq!(config4["seeks"]["keep"], 10_744);
    assert_eq!(config4["seeks"]["baseline"], 392_008_000u64);
}

#[test]
fn plan_of_a_huge_array_fits_and_reports_its_planning_time() {
    let report = plan_json(&[
        "--array",
        "8000,8000,8000",
        "--blocks",
        "200,200,200",
        "--dtype",
        "f16",
        "--shape",
        "160,160,160",
        "--mem",
        "4G",
    ]);
    assert!(common::json_u64(&report, "peak_memory_bytes") <= 4 << 30);
    // How much planning work this takes is held as a count of simulations
    // (`plan::tests::the_order_search_simulates_few_plans`), not as a time.
    assert!(report["planning_seconds"].as_f64().is_some());
    let seeks = common::json_u64(&report, "seeks.keep");
    assert!(seeks >= common::json_u64(&report, "seeks.lower_bound"));
    assert!(seeks * 1000 < common::json_u64(&report, "seeks.baseline"));
}

#[test]
fn plan_refuses_memory_too_small_and_says_the_minimum() {
    let output = rechunkfs(&[
        "plan",
        "--array",
        "100,100",
        "--blocks",
        "10,10",
        "--dtype",
        "u8",
        "--shape",
        "20,20",
        "--mem",
        "1",
        "--strategy",
        "baseline",
    ]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(
        message.contains("raise --mem to at least 200 B"),
        "{message}"
    );
}

#[test]
fn plan_reads_a_block_directory() {
    let root = tempfile::tempdir().unwrap();
    let dir = make_blocks(
        root.path(),
        "in",
        &[12, 12, 12],
        &[4, 4, 4],
        dtype("u8"),
        BlockFormat::Npy,
    );
    let report = plan_json(&[dir.to_str().unwrap(), "--shape", "3,3,3"]);
    assert_eq!(report["seeks"]["keep"], 91);
    assert_eq!(report["dtype"], "|u1");
}

#[test]
fn rechunk_writes_blocks_and_reports_seeks_as_json() {
    let root = tempfile::tempdir().unwrap();
    let dir = make_blocks(
        root.path(),
        "in",
        &[20, 18, 16],
        &[7, 6, 5],
        dtype(">f4"),
        BlockFormat::Hdf5,
    );
    let out = root.path().join("out");
    let output = rechunkfs(&[
        "rechunk",
        dir.to_str().unwrap(),
        out.to_str().unwrap(),
        "--shape",
        "8,8,8",
        "--json",
        "--mem",
        "64K",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        common::json_u64(&report, "seeks.made"),
        common::json_u64(&report, "seeks.planned")
    );
    assert!(common::json_u64(&report, "peak_memory_bytes") <= 64 << 10);
    verify_output(
        &out,
        &[20, 18, 16],
        &[8, 8, 8],
        dtype(">f4"),
        BlockFormat::Hdf5,
    );

    // Running again into the same, now full, directory is refused...
    let again = rechunkfs(&[
        "rechunk",
        dir.to_str().unwrap(),
        out.to_str().unwrap(),
        "--shape",
        "8,8,8",
    ]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("is not empty"),
        "{}",
        stderr(&again)
    );
    // ...unless --overwrite, which may change the format too.
    let over = rechunkfs(&[
        "rechunk",
        dir.to_str().unwrap(),
        out.to_str().unwrap(),
        "--shape",
        "5,9,16",
        "--overwrite",
        "--format",
        "npy",
    ]);
    assert!(over.status.success(), "{}", stderr(&over));
    verify_output(
        &out,
        &[20, 18, 16],
        &[5, 9, 16],
        dtype(">f4"),
        BlockFormat::Npy,
    );
}

/// Runs `rechunk` on a broken input: it must fail, name what the test
/// expects, and write nothing.
fn assert_refused(input: &Path, expected: &[&str]) {
    let out = refused_run(input, expected);
    assert!(
        !out.exists(),
        "nothing may be written when the input is refused"
    );
}

/// Runs `rechunk` of `input`, which must be refused saying `expected`;
/// returns the OUT it was given.
fn refused_run(input: &Path, expected: &[&str]) -> std::path::PathBuf {
    let out = input.parent().unwrap().join("refused-out");
    let output = rechunkfs(&[
        "rechunk",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--shape",
        "4,4,4",
    ]);
    assert!(
        !output.status.success(),
        "should refuse {}",
        input.display()
    );
    let message = stderr(&output);
    for part in expected {
        assert!(message.contains(part), "message lacks '{part}': {message}");
    }
    out
}

/// As [`assert_refused`], for a block the run reaches: the blocks it
/// finished before are kept (complete), none of its temporaries.
fn assert_refused_mid_run(input: &Path, expected: &[&str]) {
    let out = refused_run(input, expected);
    let left: Vec<String> = std::fs::read_dir(&out)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(".partial"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "temporaries left: {left:?}");
    let _ = std::fs::remove_dir_all(&out);
}

fn fresh_grid(root: &Path, format: BlockFormat) -> std::path::PathBuf {
    make_blocks(root, "in", &[8, 8, 8], &[4, 4, 4], dtype("u16"), format)
}

#[test]
fn refuses_a_missing_block() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Hdf5);
    fs::remove_file(dir.join("1_0_1.h5")).unwrap();
    assert_refused(&dir, &["block 1_0_1 is missing"]);
}

#[test]
fn refuses_a_duplicated_index() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Hdf5);
    fs::copy(dir.join("0_1_0.h5"), dir.join("0_01_0.h5")).unwrap();
    assert_refused(&dir, &["duplicates block 0_1_0"]);
    fs::remove_file(dir.join("0_01_0.h5")).unwrap();
    fs::copy(dir.join("0_1_0.h5"), dir.join("0_1_0.hdf5")).unwrap();
    assert_refused(&dir, &["duplicates block 0_1_0"]);
}

#[test]
fn refuses_a_block_whose_shape_disagrees_with_its_position() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Npy);
    let region = rechunkfs::array::geometry::Region::new(vec![0, 4, 0], vec![4, 3, 4]);
    rechunkfs::cli::sample::write_block_file(
        &dir.join("0_1_0.npy"),
        &[8, 8, 8],
        &region,
        dtype("u16"),
        BlockFormat::Npy,
        "/data",
    )
    .unwrap();
    assert_refused(
        &dir,
        &[
            "0_1_0.npy",
            "does not fit its position 0_1_0",
            "dimension 1",
        ],
    );
}

#[test]
fn refuses_mixed_dtypes() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Hdf5);
    let region = rechunkfs::array::geometry::Region::new(vec![4, 4, 4], vec![4, 4, 4]);
    rechunkfs::cli::sample::write_block_file(
        &dir.join("1_1_1.h5"),
        &[8, 8, 8],
        &region,
        dtype(">u2"),
        BlockFormat::Hdf5,
        "/data",
    )
    .unwrap();
    assert_refused(
        &dir,
        &["1_1_1.h5", "has dtype u16 (big-endian)", "share one dtype"],
    );
}

#[test]
fn refuses_a_truncated_file() {
    let root = tempfile::tempdir().unwrap();
    for format in [BlockFormat::Npy, BlockFormat::Hdf5] {
        let dir = fresh_grid(&root.path().join(format.extension()), format);
        cut_short(&dir.join(format!("1_1_0.{}", format.extension())));
        assert_refused(&dir, &["1_1_0", "truncated"]);
    }
}

/// Cuts the last 10 bytes off `file`.
fn cut_short(file: &Path) {
    let len = fs::metadata(file).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
}

/// 13³ in 3³ blocks: a 5×5×5 grid, most of whose blocks `rechunk` checks
/// as it reads them rather than at the scan (rechunkfs::input::HeaderChecks).
fn larger_grid(root: &Path, format: BlockFormat) -> std::path::PathBuf {
    make_blocks(root, "in", &[13, 13, 13], &[3, 3, 3], dtype("u16"), format)
}

/// Replaces block `index` of the 13³ sample (3³ blocks) with `shape` of `dt`.
fn replace_block(dir: &Path, index: [u64; 3], shape: [u64; 3], dt: &str, format: BlockFormat) {
    let region = rechunkfs::array::geometry::Region::new(
        index.iter().map(|i| i * 3).collect(),
        shape.to_vec(),
    );
    let name = format!(
        "{}_{}_{}.{}",
        index[0],
        index[1],
        index[2],
        format.extension()
    );
    rechunkfs::cli::sample::write_block_file(
        &dir.join(name),
        &[13, 13, 13],
        &region,
        dtype(dt),
        format,
        "/data",
    )
    .unwrap();
}

#[test]
fn refuses_a_bad_block_the_run_reaches_and_leaves_no_temporary() {
    for format in [BlockFormat::Npy, BlockFormat::Hdf5] {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().join(format.extension());
        let dir = larger_grid(&root.join("shape"), format);
        replace_block(&dir, [2, 1, 2], [3, 2, 3], "u16", format);
        assert_refused_mid_run(
            &dir,
            &["2_1_2.", "does not fit its position 2_1_2", "dimension 1"],
        );
        let dir = larger_grid(&root.join("dtype"), format);
        replace_block(&dir, [1, 3, 2], [3, 3, 3], ">u2", format);
        assert_refused_mid_run(
            &dir,
            &["1_3_2.", "has dtype u16 (big-endian)", "share one dtype"],
        );
        let dir = larger_grid(&root.join("truncated"), format);
        cut_short(&dir.join(format!("3_2_1.{}", format.extension())));
        assert_refused_mid_run(&dir, &["3_2_1", "truncated"]);
    }
}

#[test]
fn a_block_with_another_header_that_fits_is_read_by_its_own_layout() {
    let root = tempfile::tempdir().unwrap();
    // npy: the same dict with its keys in another order, data at 128.
    let dir = larger_grid(&root.path().join("npy"), BlockFormat::Npy);
    let region = rechunkfs::array::geometry::Region::new(vec![3, 6, 9], vec![3, 3, 3]);
    let mut header = "{'shape': (3, 3, 3), 'fortran_order': False, 'descr': '<u2'}".to_string();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(rechunkfs::cli::sample::region_bytes(
        &[13, 13, 13],
        &region,
        2,
    ));
    fs::write(dir.join("1_2_3.npy"), bytes).unwrap();
    // HDF5: an attribute added changes the object header.
    let dir5 = larger_grid(&root.path().join("h5"), BlockFormat::Hdf5);
    {
        let file = hdf5::File::open_rw(dir5.join("2_3_1.h5")).unwrap();
        let attribute = file
            .dataset("data")
            .unwrap()
            .new_attr::<u32>()
            .create("note")
            .unwrap();
        attribute.write_scalar(&7u32).unwrap();
    }
    for (input, format) in [(dir, BlockFormat::Npy), (dir5, BlockFormat::Hdf5)] {
        let out = root.path().join(format!("out-{}", format.extension()));
        let output = rechunkfs(&[
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            "4,5,6",
        ]);
        assert!(output.status.success(), "{}", stderr(&output));
        verify_output(&out, &[13, 13, 13], &[4, 5, 6], dtype("u16"), format);
    }
}

#[test]
fn refuses_a_file_that_is_not_what_its_extension_says() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Npy);
    fs::write(dir.join("0_0_1.npy"), b"this is not numpy data at all").unwrap();
    assert_refused(&dir, &["0_0_1.npy", "not a valid npy file"]);
    let dir5 = fresh_grid(&root.path().join("h5"), BlockFormat::Hdf5);
    fs::write(dir5.join("0_0_1.h5"), vec![7u8; 4096]).unwrap();
    assert_refused(&dir5, &["0_0_1.h5", "HDF5"]);
}

#[test]
fn refuses_names_that_do_not_parse() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Npy);
    fs::copy(dir.join("0_0_0.npy"), dir.join("0_x_0.npy")).unwrap();
    assert_refused(&dir, &["0_x_0.npy", "does not parse as a grid index"]);
}

#[test]
fn refuses_grid_names_of_different_ranks() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Npy);
    fs::copy(dir.join("0_0_0.npy"), dir.join("2_0.npy")).unwrap();
    assert_refused(&dir, &["2-dimensional grid index"]);
}

#[test]
fn refuses_an_empty_directory_and_a_bad_shape() {
    let root = tempfile::tempdir().unwrap();
    let empty = root.path().join("empty");
    fs::create_dir(&empty).unwrap();
    assert_refused(&empty, &["holds no block files"]);
    let dir = fresh_grid(root.path(), BlockFormat::Npy);
    let output = rechunkfs(&[
        "rechunk",
        dir.to_str().unwrap(),
        "/tmp/never-made",
        "--shape",
        "4,4",
    ]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--shape 4,4 has 2 dimensions but the input array 8×8×8 has 3")
    );
    assert!(!Path::new("/tmp/never-made").exists());
    let output = rechunkfs(&[
        "rechunk",
        dir.to_str().unwrap(),
        "/tmp/never-made",
        "--shape",
        "4,0,4",
    ]);
    assert!(!output.status.success(), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("'0' is not"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn an_os_error_says_where_and_what_once() {
    let root = tempfile::tempdir().unwrap();
    let dir = fresh_grid(root.path(), BlockFormat::Npy);
    // The output's parent is a file: the OS refuses to make it.
    let file = root.path().join("a-file");
    fs::write(&file, b"").unwrap();
    let output = rechunkfs(&[
        "rechunk",
        dir.to_str().unwrap(),
        file.join("out").to_str().unwrap(),
        "--shape",
        "4,4,4",
    ]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(message.contains(file.to_str().unwrap()), "{message}");
    assert_eq!(
        message.matches("Not a directory").count(),
        1,
        "the cause once: {message}"
    );
}

#[test]
fn numpy_and_h5py_read_every_output_block_exactly() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    for (fmt, dt) in [
        (BlockFormat::Hdf5, ">u2"),
        (BlockFormat::Npy, "<f2"),
        (BlockFormat::Hdf5, "<i8"),
    ] {
        let dir = make_blocks(
            &root.path().join(dt),
            "in",
            &[17, 13, 11],
            &[5, 6, 4],
            dtype(dt),
            BlockFormat::Hdf5,
        );
        let out = root.path().join(dt).join("out");
        let ext = fmt.extension();
        let output = rechunkfs(&[
            "rechunk",
            dir.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            "6,5,7",
            "--format",
            ext,
            "--quiet",
        ]);
        assert!(output.status.success(), "{}", stderr(&output));
        let check = Command::new(python())
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/verify.py"
            ))
            .args([
                out.to_str().unwrap(),
                "--array",
                "17,13,11",
                "--block",
                "6,5,7",
                "--dtype",
                dt,
                "--format",
                ext,
            ])
            .output()
            .expect("run python");
        assert!(
            check.status.success(),
            "python readers disagree: {}{}",
            String::from_utf8_lossy(&check.stdout),
            stderr(&check)
        );
        assert!(String::from_utf8_lossy(&check.stdout).contains("verified 18 blocks"));
    }
}

/// A memory cgroup of `limit` bytes made for one test (v1 or v2), removed on
/// drop.
struct MemoryCgroup {
    dir: std::path::PathBuf,
}

impl MemoryCgroup {
    fn new(name: &str, limit: u64) -> MemoryCgroup {
        let name = format!("{name}-{}", std::process::id());
        let (dir, file) = if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
            (
                Path::new("/sys/fs/cgroup/memory").join(name),
                "memory.limit_in_bytes",
            )
        } else {
            (Path::new("/sys/fs/cgroup").join(name), "memory.max")
        };
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("making {}: {e}", dir.display()));
        let group = MemoryCgroup { dir };
        fs::write(group.dir.join(file), limit.to_string())
            .unwrap_or_else(|e| panic!("limiting {}: {e}", group.dir.display()));
        group
    }

    /// Runs rechunkfs with `args` inside this cgroup.
    fn run(&self, args: &[&str]) -> Output {
        let procs = self.dir.join("cgroup.procs");
        Command::new("sh")
            .arg("-c")
            .arg(r#"echo $$ > "$0" && exec "$@""#)
            .arg(&procs)
            .arg(env!("CARGO_BIN_EXE_rechunkfs"))
            .args(args)
            .output()
            .expect("sh runs")
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.dir);
    }
}

#[test]
fn inside_a_memory_cgroup_plans_leave_half_of_it_to_the_page_cache() {
    require!(MemoryCgroup);
    let group = MemoryCgroup::new("rechunkfs-plan-test", 256 << 20);
    // W2: keep within --mem 192M holds 172 MiB outside a cgroup.
    let w2 = [
        "plan",
        "--json",
        "--array",
        "1750,1750,1750",
        "--blocks",
        "175,175,175",
        "--dtype",
        "u2",
        "--shape",
        "250,250,250",
        "--mem",
        "192M",
    ];
    let outside = plan_json(&w2[2..]);
    assert_eq!(outside["peak_memory_bytes"], 180_687_500);
    let output = group.run(&w2);
    assert!(output.status.success(), "{}", stderr(&output));
    let inside: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(inside["cgroup_memory_limit_bytes"], 256u64 << 20);
    assert_eq!(inside["mem_requested_bytes"], 192u64 << 20);
    assert_eq!(inside["mem_limit_bytes"], 128u64 << 20);
    // The same seeks as C order's plan (41,825,000 bytes) in less: the
    // planner counts each read shape's seeks in its best order of the axes.
    assert_eq!(inside["peak_memory_bytes"], 33_993_750);
    assert_eq!(inside["seeks"]["planned"], 7_744);
    assert_eq!(inside["c_order"]["peak_memory_bytes"], 41_825_000);

    // A --mem below half stands.
    let mut tight = w2;
    tight[tight.len() - 1] = "40M";
    let output = group.run(&tight);
    assert!(output.status.success(), "{}", stderr(&output));
    let inside: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(inside["mem_limit_bytes"], 40u64 << 20);

    // Where nothing fits in half (baseline holds 292 MiB input blocks, too
    // thin to be read in steps), --mem alone decides.
    let mut slabs = w2;
    slabs[3] = "100,1750,1750";
    slabs[5] = "50,1750,1750";
    slabs[slabs.len() - 1] = "600M";
    let slabs = [&slabs[..], &["--strategy", "baseline"]].concat();
    let outside = plan_json(&slabs[2..]);
    let output = group.run(&slabs);
    assert!(output.status.success(), "{}", stderr(&output));
    let inside: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(inside["mem_limit_bytes"], 600u64 << 20);
    assert_eq!(inside["peak_memory_bytes"], outside["peak_memory_bytes"]);
    assert!(common::json_u64(&inside, "peak_memory_bytes") > 128 << 20);
}

/// `mount --help` names every format a view serves, precomputed too.
#[test]
fn mount_help_names_every_format_a_view_serves() {
    let output = rechunkfs(&["mount", "--help"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let help = String::from_utf8_lossy(&output.stdout);
    let format = help
        .split("--format <FORMAT>")
        .nth(1)
        .unwrap_or_else(|| panic!("no --format in:\n{help}"));
    let format = &format[..format.find("\n  -").unwrap_or(format.len())];
    for name in [
        "h5",
        "npy",
        "nii",
        "nii2",
        "raw",
        "zarr",
        "zarr3",
        "precomputed",
    ] {
        assert!(
            format.contains(name),
            "--format leaves out {name}:\n{format}"
        );
    }
}

/// `--format` of every command that plans or writes blocks reads one text,
/// which names every format written (precomputed too): no command's help
/// drifts from the others'.
#[test]
fn every_command_helps_with_format_in_the_same_words() {
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let expected = words(rechunkfs::cli::FORMAT_HELP);
    for command in ["plan", "rechunk", "mount", "slurm"] {
        let output = rechunkfs(&[command, "--help"]);
        assert!(output.status.success(), "{command} --help");
        let help = String::from_utf8_lossy(&output.stdout).into_owned();
        // The option's text runs from its name to the next option.
        let start = help
            .find("--format <FORMAT>")
            .unwrap_or_else(|| panic!("{command} --help has no --format: {help}"));
        let mut lines = help[start + "--format <FORMAT>".len()..].lines();
        let first = lines.next().unwrap_or_default();
        let text: Vec<&str> = std::iter::once(first)
            .chain(lines.take_while(|line| !line.trim_start().starts_with('-')))
            .collect();
        assert_eq!(words(&text.join(" ")), expected, "{command} --help");
    }
    assert!(expected.contains("precomputed"), "{expected}");
}
