//! `rechunkfs serve` and `mount --serve` through real HTTP clients: curl,
//! Python's http.client and urllib, and TensorStore's http kvstore. Bytes
//! are compared with the files served, and arrays with the source array
//! (the oracle and check_zarr.py's reader checks). Mount tests need
//! /dev/fuse.

#[macro_use]
mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rechunkfs::format::BlockFormat;

use common::oracle::{grid_blocks, padded, sample_bytes};
use common::{dtype, make_zarr, python, stderr, verify_zarr_output, zarr_chunk_key};

const CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/http_client.py");

/// How long anything here may take before the test gives up on it (a
/// bound against hanging, not a measurement).
const PATIENCE: Duration = Duration::from_secs(180);

/// How long a raw client waits for an answer that should come at once (a
/// bound against hanging, far above the time it takes).
const ANSWER_PATIENCE: Duration = Duration::from_secs(30);

/// A `rechunkfs serve` process, stopped when dropped.
struct Served {
    child: Child,
    url: String,
}

impl Served {
    fn new(path: &Path, extra: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
            .arg("serve")
            .arg(path)
            .args(["--bind", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run rechunkfs serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines
            .next()
            .expect("serve printed nothing")
            .expect("serve's output");
        let url = url_in(&first).unwrap_or_else(|| panic!("no URL in {first:?}"));
        // The rest of its output is drained, so that it never blocks on it.
        std::thread::spawn(move || lines.for_each(drop));
        Served { child, url }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first `http://…/` in `line`.
fn url_in(line: &str) -> Option<String> {
    let start = line.find("http://")?;
    let rest = &line[start..];
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    Some(rest[..end].to_string())
}

/// curl with `args`; its output (`-w '%{http_code}'` gives the status).
fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "600"])
        .args(args)
        .output()
        .expect("run curl (package curl)")
}

/// The status and body of a GET of `url` with curl's `extra` options.
fn curl_get(url: &str, extra: &[&str]) -> (u16, Vec<u8>) {
    let output = curl(&[extra, &["--write-out", "\n%{http_code}", url]].concat());
    assert!(output.status.success(), "curl {url}: {}", stderr(&output));
    let split = output.stdout.iter().rposition(|&b| b == b'\n').unwrap();
    let status = String::from_utf8_lossy(&output.stdout[split + 1..])
        .parse()
        .unwrap();
    (status, output.stdout[..split].to_vec())
}

/// The response headers of a request, lowercased names, as curl saw them.
fn curl_headers(url: &str, extra: &[&str]) -> Vec<(String, String)> {
    let output = curl(&[extra, &["--dump-header", "-", "--output", "/dev/null", url]].concat());
    assert!(output.status.success(), "curl {url}: {}", stderr(&output));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect()
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(field, _)| field == name)
        .map(|(_, value)| value.as_str())
}

fn run_client(args: &[&str]) {
    let output = Command::new(python())
        .arg(CLIENT)
        .args(args)
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "http_client.py {}: {}{}",
        args[0],
        String::from_utf8_lossy(&output.stdout),
        stderr(&output)
    );
}

const ARRAY: [u64; 3] = [37, 29, 23];
const OUT_CHUNK: [u64; 3] = [16, 9, 11];

/// A Zarr array (`format`) rechunked by rechunkfs from zarr-python's
/// writing of the sample array, and checked against the source.
fn zarr_output(root: &Path, format: BlockFormat) -> PathBuf {
    let input = make_zarr(root, "in", &ARRAY, &[10, 8, 7], dtype("<u2"), format);
    let out = root.join("out");
    let name = if format == BlockFormat::Zarr {
        "zarr"
    } else {
        "zarr3"
    };
    let output = common::run_rechunkfs(
        &[
            "rechunk",
            input.to_str().unwrap(),
            out.to_str().unwrap(),
            "--shape",
            "16,9,11",
            "--format",
            name,
            "-q",
        ],
        0,
    );
    assert!(output.status.success(), "rechunk: {}", stderr(&output));
    verify_zarr_output(&out, &ARRAY, &OUT_CHUNK, dtype("<u2"), format);
    out
}

#[test]
fn ranges_head_and_preflight_through_curl_and_urllib() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let out = zarr_output(root.path(), BlockFormat::Zarr);
    let served = Served::new(&out, &[]);
    let chunk = fs::read(out.join("2.3.2")).unwrap();
    let url = format!("{}2.3.2", served.url);
    let len = chunk.len();
    assert_eq!(curl_get(&url, &[]), (200, chunk.clone()));
    for (range, start, end) in [
        ("10-99", 10, 100),
        ("100-", 100, len),
        ("-33", len - 33, len),
        ("0-0", 0, 1),
        ("5-999999", 5, len),
    ] {
        let (status, body) = curl_get(&url, &["--range", range]);
        assert_eq!(status, 206, "{range}");
        assert!(
            body == chunk[start..end],
            "{range}: bytes differ from the file"
        );
        let headers = curl_headers(&url, &["--range", range]);
        assert_eq!(
            header(&headers, "content-length"),
            Some(&*(end - start).to_string())
        );
        assert_eq!(
            header(&headers, "content-range"),
            Some(&*format!("bytes {start}-{}/{len}", end - 1))
        );
    }
    let (status, _) = curl_get(&url, &["--range", &format!("{len}-")]);
    assert_eq!(status, 416, "a range past the end");

    let head = curl_headers(&url, &["--head"]);
    assert_eq!(header(&head, "content-length"), Some(&*len.to_string()));
    assert_eq!(header(&head, "accept-ranges"), Some("bytes"));
    assert_eq!(header(&head, "access-control-allow-origin"), Some("*"));

    let preflight = curl_headers(
        &url,
        &[
            "--request",
            "OPTIONS",
            "--header",
            "Origin: https://viewer.example",
            "--header",
            "Access-Control-Request-Method: GET",
            "--header",
            "Access-Control-Request-Headers: range",
        ],
    );
    assert_eq!(header(&preflight, "access-control-allow-origin"), Some("*"));
    assert_eq!(
        header(&preflight, "access-control-allow-headers"),
        Some("range")
    );
    assert!(header(&preflight, "access-control-allow-methods").is_some_and(|m| m.contains("GET")));

    let file = out.join("2.3.2");
    run_client(&["urllib", &served.url, "/2.3.2", file.to_str().unwrap()]);

    let origin = Served::new(&out, &["--cors-origin", "https://viewer.example"]);
    let named = curl_headers(&format!("{}.zarray", origin.url), &[]);
    assert_eq!(
        header(&named, "access-control-allow-origin"),
        Some("https://viewer.example")
    );
}

#[test]
fn paths_out_of_the_root_missing_files_and_writes_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let served_dir = root.path().join("served");
    fs::create_dir_all(served_dir.join("sub")).unwrap();
    fs::write(served_dir.join("sub/file"), b"inside").unwrap();
    fs::write(root.path().join("secret"), b"SECRET").unwrap();
    std::os::unix::fs::symlink(root.path().join("secret"), served_dir.join("out")).unwrap();
    std::os::unix::fs::symlink("../../secret", served_dir.join("sub/up")).unwrap();
    std::os::unix::fs::symlink("file", served_dir.join("sub/in")).unwrap();
    let served = Served::new(&served_dir, &[]);
    for target in [
        "../secret",
        "sub/../../secret",
        "%2e%2e/secret",
        "sub/%2E%2E/%2e%2e/secret",
        "sub%2f..%2f..%2fsecret",
        "sub%2ffile",
        "out",
        "sub/up",
    ] {
        let url = format!("{}{target}", served.url);
        let (status, body) = curl_get(&url, &["--path-as-is"]);
        assert_eq!(status, 403, "{target}");
        assert!(
            !String::from_utf8_lossy(&body).contains("SECRET"),
            "{target}"
        );
    }
    assert_eq!(
        curl_get(&format!("{}sub/in", served.url), &[]),
        (200, b"inside".to_vec())
    );
    for target in ["nothing", "sub", "sub/file/more", ""] {
        let (status, _) = curl_get(&format!("{}{target}", served.url), &[]);
        assert_eq!(status, 404, "{target:?}");
    }
    for method in ["PUT", "POST", "DELETE", "PATCH"] {
        let url = format!("{}sub/file", served.url);
        let (status, _) = curl_get(&url, &["--request", method, "--data", "x"]);
        assert_eq!(status, 405, "{method}");
        let allow = curl_headers(&url, &["--request", method]);
        assert_eq!(header(&allow, "allow"), Some("GET, HEAD, OPTIONS"));
    }
    assert_eq!(fs::read(served_dir.join("sub/file")).unwrap(), b"inside");
    // A page whose domain was made to resolve to 127.0.0.1 (DNS rebinding).
    let (status, _) = curl_get(
        &format!("{}sub/file", served.url),
        &["--header", "Host: attacker.example"],
    );
    assert_eq!(status, 403, "a request naming another host");
}

#[test]
fn tensorstore_and_zarr_python_read_zarr_outputs_over_http_equal_to_the_source() {
    require!(Readers);
    for (format, version) in [(BlockFormat::Zarr, "2"), (BlockFormat::Zarr3, "3")] {
        let root = tempfile::tempdir().unwrap();
        let out = zarr_output(root.path(), format);
        let served = Served::new(&out, &[]);
        run_client(&[
            "array",
            &served.url,
            "--array",
            "37,29,23",
            "--chunks",
            "16,9,11",
            "--dtype",
            "<u2",
            "--zarr-format",
            version,
        ]);
    }
}

#[test]
fn sixty_four_clients_of_a_hundred_random_ranges_each_are_byte_exact() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let out = zarr_output(root.path(), BlockFormat::Zarr3);
    let served = Served::new(&out, &[]);
    run_client(&[
        "ranges",
        &served.url,
        out.to_str().unwrap(),
        "--clients",
        "64",
        "--requests",
        "100",
    ]);
}

#[test]
fn clients_leaving_mid_response_harm_nothing() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let served_dir = root.path().join("served");
    fs::create_dir_all(&served_dir).unwrap();
    // Larger than the socket buffers, so a response is cut off mid-body.
    let big: Vec<u8> = sample_bytes(&[1 << 20], &[0], &[1 << 20], 8);
    fs::write(served_dir.join("big"), &big).unwrap();
    let served = Served::new(&served_dir, &[]);
    run_client(&["leave", &served.url, "/big", "--times", "20"]);
    let (status, body) = curl_get(&format!("{}big", served.url), &[]);
    assert_eq!(status, 200);
    assert!(body == big, "the server still serves every byte");
    run_client(&[
        "ranges",
        &served.url,
        served_dir.to_str().unwrap(),
        "--clients",
        "8",
        "--requests",
        "20",
    ]);
}

/// A view mounted by `rechunkfs mount` (in the plan's order, paused after
/// each block read), unmounted when dropped; `--serve` output kept.
struct Mounted {
    view: PathBuf,
    printed: String,
}

impl Mounted {
    fn new(root: &Path, input: &Path, extra: &[&str]) -> Mounted {
        let view = root.join("view");
        fs::create_dir_all(&view).unwrap();
        let staging = root.join("staging");
        let args = [
            "mount",
            input.to_str().unwrap(),
            view.to_str().unwrap(),
            "--shape",
            "16,9,11",
            "--format",
            "zarr",
            "--in-order",
            "--staging",
            staging.to_str().unwrap(),
        ];
        // Paused 100 ms after each of the 64 input blocks: the last chunks
        // stay pending for seconds after the mount returns.
        let output = common::run_rechunkfs(&[&args[..], extra].concat(), 100);
        assert!(output.status.success(), "mount: {}", stderr(&output));
        Mounted {
            view,
            printed: stderr(&output),
        }
    }

    fn url(&self) -> String {
        url_in(&self.printed).unwrap_or_else(|| panic!("no URL in {:?}", self.printed))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = common::run_rechunkfs(&["umount", self.view.to_str().unwrap()], 0);
    }
}

fn xattr_state(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new("user.rechunkfs.state").unwrap();
    let mut value = [0u8; 32];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    assert!(
        n >= 0,
        "getxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    String::from_utf8_lossy(&value[..n as usize]).into_owned()
}

/// Waits until `check` holds, giving up after [`PATIENCE`].
fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "gave up waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The chunk file a Zarr v2 view of the sample array holds at `index`,
/// from the oracle: the source's box, padded with zeros at the edges.
fn expected_chunk(index: &[u64]) -> Vec<u8> {
    let block = grid_blocks(&ARRAY, &OUT_CHUNK)
        .into_iter()
        .find(|block| block.index == index)
        .expect("a chunk of the grid");
    let data = sample_bytes(&ARRAY, &block.origin, &block.shape, 2);
    padded(&data, &block.shape, &OUT_CHUNK, 2)
}

/// Reads of the view parked now, from its status file at `status`.
fn waiting_reads(status: &[u8]) -> u64 {
    let status: serde_json::Value = serde_json::from_slice(status).expect("status is JSON");
    common::json_u64(&status, "waiting_reads")
}

#[test]
fn mount_serve_answers_pending_blocks_once_done_and_others_meanwhile() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let input = make_zarr(
        root.path(),
        "in",
        &ARRAY,
        &[10, 8, 7],
        dtype("<u2"),
        BlockFormat::Zarr,
    );
    let mounted = Mounted::new(root.path(), &input, &["--serve", "0"]);
    assert!(
        mounted.printed.contains("zarr://http://127.0.0.1:"),
        "the source to give Neuroglancer: {}",
        mounted.printed
    );
    let url = mounted.url();
    let last = zarr_chunk_key(
        &grid_blocks(&ARRAY, &OUT_CHUNK).last().unwrap().clone(),
        BlockFormat::Zarr,
    );
    assert_eq!(xattr_state(&mounted.view.join(&last)), "pending");

    let last_url = format!("{url}{last}");
    let parked = std::thread::spawn(move || curl_get(&last_url, &[]));
    let status_url = format!("{url}.rechunkfs-status.json");
    wait_until("the HTTP read of the last chunk is parked", || {
        waiting_reads(&curl_get(&status_url, &[]).1) >= 1
    });
    // Clients that ask for a pending chunk and go away harm nothing.
    run_client(&["leave", &url, "/2.3.1", "--times", "4"]);
    wait_until("the first chunk is done", || {
        xattr_state(&mounted.view.join("0.0.0")) == "done"
    });
    assert_eq!(
        curl_get(&format!("{url}0.0.0"), &[]),
        (200, expected_chunk(&[0, 0, 0]))
    );
    assert!(
        !parked.is_finished() || xattr_state(&mounted.view.join(&last)) == "done",
        "the pending chunk's request waits while the done one is answered"
    );
    let (status, body) = parked.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        body == expected_chunk(&[2, 3, 2]),
        "the waited-for chunk equals the source"
    );

    run_client(&[
        "array",
        &url,
        "--array",
        "37,29,23",
        "--chunks",
        "16,9,11",
        "--dtype",
        "<u2",
        "--zarr-format",
        "2",
    ]);
}

#[test]
fn serving_a_mounted_view_directory_waits_for_pending_blocks() {
    require!(Fuse, Readers);
    let root = tempfile::tempdir().unwrap();
    let input = make_zarr(
        root.path(),
        "in",
        &ARRAY,
        &[10, 8, 7],
        dtype("<u2"),
        BlockFormat::Zarr,
    );
    let mounted = Mounted::new(root.path(), &input, &[]);
    let served = Served::new(&mounted.view, &[]);
    assert_eq!(xattr_state(&mounted.view.join("2.3.2")), "pending");
    let last_url = format!("{}2.3.2", served.url);
    let parked = std::thread::spawn(move || curl_get(&last_url, &[]));
    let status = mounted.view.join(".rechunkfs-status.json");
    wait_until("the read of the last chunk is parked", || {
        waiting_reads(&fs::read(&status).unwrap()) >= 1
    });
    let (status, body) = parked.join().unwrap();
    assert_eq!(status, 200);
    assert!(
        body == expected_chunk(&[2, 3, 2]),
        "the waited-for chunk equals the source"
    );
    let (status, meta) = curl_get(&format!("{}.zarray", served.url), &[]);
    assert_eq!(
        (status, meta),
        (200, fs::read(mounted.view.join(".zarray")).unwrap())
    );
}

/// Starts filling `prepared`'s view, which its tests held back so that
/// their requests park first.
fn start_materialiser(
    prepared: &rechunkfs::view::PreparedView,
) -> rechunkfs::view::materialise::Materialiser {
    rechunkfs::view::materialise::Materialiser::start(
        prepared.core.clone(),
        prepared.input.clone(),
        prepared.plan.clone(),
        true,
    )
    .unwrap()
}

/// The service over a view's core, without sockets or FUSE: a prepared
/// view of zarr-python's writing of the sample array, its materialiser not
/// started yet, so that every block is pending.
fn view_service(root: &Path) -> (rechunkfs::view::PreparedView, rechunkfs::http::Service) {
    use rechunkfs::http::{Cors, Hosts, Service, ViewTree};
    let input = make_zarr(
        root,
        "in",
        &ARRAY,
        &[10, 8, 7],
        dtype("<u2"),
        BlockFormat::Zarr,
    );
    let prepared = rechunkfs::view::prepare(&rechunkfs::view::MountRequest {
        input,
        view: root.join("view"),
        output_block: OUT_CHUNK.to_vec(),
        mem: None,
        strategy: rechunkfs::plan::Strategy::Keep,
        staging: Some(root.join("staging")),
        format: Some(BlockFormat::Zarr),
        dataset: "/data".into(),
        rebuild: false,
        allow_other: false,
        in_order: false,
        shard: None,
        values: None,
        pyramid: Default::default(),
    })
    .expect("prepare the view");
    let tree = std::sync::Arc::new(ViewTree::new(prepared.core.clone()));
    (prepared, Service::new(tree, Cors::Any, Hosts::Any))
}

fn get(service: &rechunkfs::http::Service, target: &str, range: Option<&str>) -> (u16, Vec<u8>) {
    use std::io::Read;
    let mut headers = vec![("Host", "localhost")];
    headers.extend(range.map(|r| ("Range", r)));
    let response = service.respond(&rechunkfs::http::respond::Request {
        method: "GET",
        target,
        headers,
    });
    let mut body = Vec::new();
    let status = response.status;
    let mut reader = response.body;
    reader.read_to_end(&mut body).unwrap();
    (status, body)
}

#[test]
fn the_service_over_a_view_core_waits_for_pending_blocks_without_sockets() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let (prepared, service) = view_service(root.path());
    let core = prepared.core.clone();
    let service = std::sync::Arc::new(service);
    let head = service.respond(&rechunkfs::http::respond::Request {
        method: "HEAD",
        target: "/2.3.2",
        headers: vec![],
    });
    assert_eq!(
        (head.status, head.body.len()),
        (200, expected_chunk(&[2, 3, 2]).len() as u64)
    );
    let (status, zarray) = get(&service, "/.zarray", None);
    let meta: serde_json::Value = serde_json::from_slice(&zarray).unwrap();
    assert_eq!(
        (status, &meta["chunks"]),
        (200, &serde_json::json!(OUT_CHUNK))
    );

    let waiting = service.clone();
    let parked = std::thread::spawn(move || get(&waiting, "/2.3.2", Some("bytes=100-")));
    wait_until("the read is parked", || core.status().waiting_reads == 1);
    assert!(!parked.is_finished());
    let materialiser = start_materialiser(&prepared);
    let (status, body) = parked.join().unwrap();
    assert_eq!(status, 206);
    assert!(
        body == expected_chunk(&[2, 3, 2])[100..],
        "the waited-for bytes equal the source"
    );
    wait_until("every block is done", || core.status().state == "complete");
    for block in grid_blocks(&ARRAY, &OUT_CHUNK) {
        let key = zarr_chunk_key(&block, BlockFormat::Zarr);
        assert_eq!(
            get(&service, &format!("/{key}"), None),
            (200, expected_chunk(&block.index))
        );
    }
    assert!(materialiser.stop(Duration::from_secs(60)));
}

#[test]
fn a_read_parked_when_the_view_stops_is_an_error_status() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let (prepared, service) = view_service(root.path());
    let core = prepared.core.clone();
    let service = std::sync::Arc::new(service);
    let waiting = service.clone();
    let parked = std::thread::spawn(move || get(&waiting, "/1.1.1", None).0);
    wait_until("the read is parked", || core.status().waiting_reads == 1);
    core.shutdown();
    assert_eq!(parked.join().unwrap(), 500);
}

#[test]
fn more_parked_requests_than_threads_starve_no_other_and_all_end_with_exact_bytes() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // Served from a view's core whose materialiser is started only once
    // the requests are parked: every block stays pending until then.
    let (prepared, service) = view_service(root.path());
    let core = prepared.core.clone();
    let address = start_server(service, Default::default());
    let url = rechunkfs::http::root_url(address);
    let names = ["2.3.0", "2.3.1", "2.3.2", "0.0.0"];
    let bodies = root.path().join("bodies");
    fs::create_dir_all(&bodies).unwrap();
    let threads = rechunkfs::http::server::MAX_ANSWERING;
    let parked = threads + 44;
    let clients = parked.to_string();
    let (out, client_url) = (bodies.clone(), url.clone());
    let requests = std::thread::spawn(move || {
        let args = [
            "parked",
            &client_url,
            out.to_str().unwrap(),
            "--clients",
            &clients,
        ];
        run_client(&[&args[..], &names].concat())
    });
    // More requests than there are threads wait, holding none.
    wait_until(
        &format!("all {parked} requests of pending blocks are parked"),
        || core.status().waiting_reads >= parked as u64,
    );
    // And readers of the wait file wait (within the limits on waiting
    // requests and on connections).
    let mut end_waiters: Vec<TcpStream> = (0..64)
        .map(|_| raw_client(address, &raw_get("/.rechunkfs-wait.json")))
        .collect();
    for stream in &mut end_waiters {
        // Until the view is complete, then beyond the read timeout.
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
    }
    // Meanwhile, requests that need not wait are answered.
    let mut answerable = raw_client(address, &raw_get("/.zarray"));
    let (status, zarray) = raw_response(
        &mut answerable,
        &format!("a GET of .zarray while {} requests wait", parked + 64),
    )
    .expect("a response");
    assert_eq!(status, 200);
    assert!(zarray.starts_with(b"{"));
    assert!(!requests.is_finished());
    let materialiser = start_materialiser(&prepared);
    requests.join().unwrap();
    for (name, index) in names
        .iter()
        .zip([[2, 3, 0], [2, 3, 1], [2, 3, 2], [0, 0, 0]])
    {
        let body = fs::read(bodies.join(name)).unwrap();
        assert!(body == expected_chunk(&index), "{name} equals the source");
    }
    for (n, stream) in end_waiters.iter_mut().enumerate() {
        let what = format!("reader {n} of the wait file");
        let (status, body) = raw_response(stream, &what).expect("a response");
        let status_json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(
            (status, &status_json["state"]),
            (200, &serde_json::json!("complete")),
            "{what}"
        );
    }
    assert!(materialiser.stop(Duration::from_secs(60)));
}

#[test]
fn a_request_past_the_waiting_limit_is_busy_and_a_client_leaving_frees_its_place() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    let (prepared, service) = view_service(root.path());
    let core = prepared.core.clone();
    let limits = rechunkfs::http::server::Limits {
        waiting: 2,
        ..Default::default()
    };
    let address = start_server(service, limits);
    let waiting: Vec<TcpStream> = ["/2.3.2", "/2.3.1"]
        .iter()
        .map(|path| raw_client(address, &raw_get(path)))
        .collect();
    wait_until("both requests are parked", || {
        core.status().waiting_reads == 2
    });
    let mut third = raw_client(address, &raw_get("/0.0.0"));
    let (status, _) =
        raw_response(&mut third, "a third request of a pending block").expect("a response");
    assert_eq!(status, 503, "no place is left to wait in");
    let mut wait_file = raw_client(address, &raw_get("/.rechunkfs-wait.json"));
    let (status, _) = raw_response(&mut wait_file, "a read of the wait file").expect("a response");
    assert_eq!(status, 503, "no place is left to wait in");
    let mut answerable = raw_client(address, &raw_get("/.zarray"));
    let answer = raw_response(&mut answerable, "a GET of .zarray while two wait");
    assert_eq!(answer.map(|(status, _)| status), Some(200));
    // The waiting clients leave: their places are free again, though
    // their reads stay parked in the view until their blocks are done.
    drop(waiting);
    let mut parked = None;
    wait_until("a request parks in a place a departed client freed", || {
        let mut client = raw_client(address, &raw_get("/0.0.0"));
        client
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut head = [0u8; 12];
        match client.read(&mut head) {
            // Busy still: try again.
            Ok(_) => false,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                parked = Some(client);
                true
            }
            Err(e) => panic!("a request after the waiting clients left: {e}"),
        }
    });
    wait_until("the new request is parked", || {
        core.status().waiting_reads == 3
    });
    let mut parked = parked.expect("a parked client");
    parked.set_read_timeout(Some(PATIENCE)).unwrap();
    let materialiser = start_materialiser(&prepared);
    let (status, body) = raw_response(&mut parked, "the parked request").expect("a response");
    assert_eq!(status, 200);
    assert!(
        body == expected_chunk(&[0, 0, 0]),
        "the waited-for chunk equals the source"
    );
    assert!(materialiser.stop(Duration::from_secs(60)));
}

/// A client speaking HTTP/1.1 by hand, on loopback: it sends `request`
/// (whole, or the start of one) and reads with a deadline.
fn raw_client(address: SocketAddr, request: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connect to the server");
    stream.set_read_timeout(Some(ANSWER_PATIENCE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// A GET of `path` that closes the connection after its response.
fn raw_get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

/// The status and body of the response `stream` reads until the server
/// closes it; `None` when it closes with no response. Panics, naming
/// `what`, when nothing ends within the stream's read timeout.
fn raw_response(stream: &mut TcpStream, what: &str) -> Option<(u16, Vec<u8>)> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 64 << 10];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("{what}: no end within {ANSWER_PATIENCE:?} ({e})"),
        }
    }
    let end = received.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&received[..end]).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok())?;
    Some((status, received[end + 4..].to_vec()))
}

/// Starts `service` on a free loopback port with `limits`; its address.
fn start_server(
    service: rechunkfs::http::Service,
    limits: rechunkfs::http::server::Limits,
) -> SocketAddr {
    let listener = rechunkfs::http::bind(rechunkfs::http::parse_bind("0").unwrap()).unwrap();
    let address = listener.local_addr().unwrap();
    rechunkfs::http::HttpServer::new(listener, service)
        .with_limits(limits)
        .start()
        .unwrap();
    address
}

/// The service of a directory holding `file` (5 bytes).
fn dir_service(root: &Path) -> rechunkfs::http::Service {
    use rechunkfs::http::{Cors, DirTree, Hosts, Service};
    fs::write(root.join("file"), b"bytes").unwrap();
    let tree = DirTree::new(root).unwrap();
    Service::new(std::sync::Arc::new(tree), Cors::Any, Hosts::Loopback)
}

#[test]
fn a_connection_that_never_ends_its_headers_or_stays_idle_is_closed() {
    let root = tempfile::tempdir().unwrap();
    let limits = rechunkfs::http::server::Limits {
        header_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let address = start_server(dir_service(root.path()), limits);
    // Slow loris: the headers are never finished.
    let mut loris = raw_client(address, "GET /file HTTP/1.1\r\nHost: local");
    let answer = raw_response(&mut loris, "a request whose headers never end");
    assert!(
        answer.as_ref().is_none_or(|(status, _)| *status == 408),
        "{answer:?}"
    );
    // Idle: one request answered, then nothing.
    let mut idle = raw_client(address, "GET /file HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let (status, body) =
        raw_response(&mut idle, "an idle keep-alive connection").expect("a response");
    assert_eq!((status, body), (200, b"bytes".to_vec()));
}

#[test]
fn connections_past_the_limit_are_answered_busy_until_one_closes() {
    let root = tempfile::tempdir().unwrap();
    let limits = rechunkfs::http::server::Limits {
        connections: 4,
        ..Default::default()
    };
    let address = start_server(dir_service(root.path()), limits);
    // Keep-alive connections, each answered once and left open.
    let mut open: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut stream = raw_client(address, "GET /file HTTP/1.1\r\nHost: localhost\r\n\r\n");
            let mut head = [0u8; 12];
            stream
                .read_exact(&mut head)
                .expect("an answer to a connection within the limit");
            assert_eq!(&head, b"HTTP/1.1 200");
            stream
        })
        .collect();
    let mut past = raw_client(address, &raw_get("/file"));
    let answer = raw_response(&mut past, "a connection past the limit");
    assert!(
        answer.as_ref().is_none_or(|(status, _)| *status == 503),
        "{answer:?}"
    );
    // One closes: its place is another connection's.
    drop(open.pop());
    wait_until("a new connection is answered once one closed", || {
        let mut again = raw_client(address, &raw_get("/file"));
        raw_response(&mut again, "a connection after one closed").is_some_and(|(s, _)| s == 200)
    });
    drop(open);
}

#[test]
fn two_hosts_or_an_absolute_target_naming_another_host_are_bad_requests() {
    let root = tempfile::tempdir().unwrap();
    let served = Served::new(root.path(), &[]);
    fs::write(root.path().join("file"), b"bytes").unwrap();
    let address: SocketAddr = served.url["http://".len()..]
        .trim_end_matches('/')
        .parse()
        .unwrap();
    for (request, expected) in [
        (
            "GET /file HTTP/1.1\r\nHost: localhost\r\nHost: attacker.example\r\n",
            400,
        ),
        (
            "GET http://attacker.example/file HTTP/1.1\r\nHost: localhost\r\n",
            400,
        ),
        ("GET http://attacker.example/file HTTP/1.1\r\n", 403),
        (
            "GET http://localhost/file HTTP/1.1\r\nHost: localhost\r\n",
            200,
        ),
    ] {
        let mut client = raw_client(address, &format!("{request}Connection: close\r\n\r\n"));
        let answer = raw_response(&mut client, request);
        assert_eq!(
            answer.map(|(status, _)| status),
            Some(expected),
            "{request:?}"
        );
    }
}

/// What `serve` prints about `path` before it answers, up to its
/// Neuroglancer link and `after` lines more.
fn announcement(path: &Path, after: usize) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rechunkfs"))
        .arg("serve")
        .arg(path)
        .args(["--bind", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rechunkfs serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The announcement is printed whole before the server answers, so
    // reading it ends (it is a few lines).
    let mut said = Vec::new();
    for line in lines.by_ref().map_while(Result::ok).take(8) {
        let link = line.contains("#!");
        said.push(line);
        if link {
            break;
        }
    }
    said.extend(lines.map_while(Result::ok).take(after));
    let _ = child.kill();
    let _ = child.wait();
    said
}

#[test]
fn a_link_without_a_contrast_range_says_where_one_comes_from() {
    require!(Readers);
    let root = tempfile::tempdir().unwrap();
    // A Zarr array of one level: nothing gathers its range.
    let array = make_zarr(
        root.path(),
        "in",
        &[6, 5, 4],
        &[3, 3, 3],
        dtype("<u2"),
        BlockFormat::Zarr3,
    );
    let said = announcement(&array, 1).join("\n");
    assert!(said.contains("#!"), "{said}");
    assert!(
        said.contains("no contrast range in that link") && said.contains("level 1 is complete"),
        "{said}"
    );
}

/// The Neuroglancer state in the link `serve` prints for `path`.
fn printed_state(path: &Path) -> serde_json::Value {
    let said = announcement(path, 0);
    let link = said
        .iter()
        .find_map(|line| line.find("#!").map(|at| line[at + 2..].to_string()));
    let link = link.expect("serve printed no Neuroglancer state link");
    let output = Command::new(python())
        .args([
            "-c",
            "import sys, urllib.parse; print(urllib.parse.unquote(sys.argv[1]))",
        ])
        .arg(&link)
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout).expect("the link's state is JSON")
}

#[test]
fn serve_prints_a_neuroglancer_state_with_units_display_order_and_contrast() {
    require!(Readers);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("image.nii");
    // int16 in -200..=1500, 0.5 x 0.75 x 2 mm voxels.
    let make = r#"
import sys, numpy as np, nibabel as nib
data = np.random.default_rng(5).integers(-200, 1500, size=(21, 18, 13), endpoint=True).astype("<i2")
image = nib.Nifti1Image(data, np.diag([0.5, 0.75, 2.0, 1.0]))
image.header.set_xyzt_units("mm", "sec")
nib.save(image, sys.argv[1])
print(int(data.min()), int(data.max()))
"#;
    let made = Command::new(python())
        .args(["-c", make])
        .arg(&input)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    let range: Vec<f64> = String::from_utf8_lossy(&made.stdout)
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
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
        let state = printed_state(&out);
        let layer = &state["layers"][0];
        let source = layer["source"].as_str().unwrap_or_default();
        assert!(source.contains("://http://127.0.0.1:"), "{state}");
        assert_eq!(
            state["displayDimensions"],
            serde_json::json!(["x", "y", "z"])
        );
        let names: Vec<&String> = state["dimensions"].as_object().unwrap().keys().collect();
        assert_eq!(names, ["x", "y", "z"], "{format}: {state}");
        let voxel = |axis: &str| state["dimensions"][axis][0].as_f64().unwrap();
        for (axis, metres) in [("x", 0.5e-3), ("y", 0.75e-3), ("z", 2e-3)] {
            assert!(
                (voxel(axis) - metres).abs() < 1e-12,
                "{format} {axis}: {state}"
            );
            assert_eq!(state["dimensions"][axis][1], "m", "{format}: {state}");
        }
        // The omero window (precomputed: info's rechunkfs.window): the
        // image's own range, not int16's.
        assert_eq!(
            layer["shaderControls"]["normalized"]["range"],
            serde_json::json!(range),
            "{format}: {state}"
        );
    }
}
