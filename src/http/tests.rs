//! The service driven without sockets: statuses, headers and bytes for
//! files on disk, refusals, CORS, and a read that waits for its data.
//! Compiled for tests only (`#[cfg(test)] mod tests;` in the module).

use std::io::Read;
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};

use super::respond::{Request, Response};
use super::tree::{Content, Unreadable};
use super::*;

fn request<'a>(method: &'a str, target: &'a str, headers: &[(&'a str, &'a str)]) -> Request<'a> {
    let mut all = vec![("Host", "127.0.0.1:8000")];
    all.extend_from_slice(headers);
    Request {
        method,
        target,
        headers: all,
    }
}

fn header<'r>(response: &'r Response, name: &str) -> Option<&'r str> {
    response
        .headers
        .iter()
        .find(|(field, _)| field.eq_ignore_ascii_case(name))
        .map(|(_, value)| value.as_str())
}

fn body(response: Response) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut body = response.body;
    body.read_to_end(&mut bytes).unwrap();
    bytes
}

/// A directory with a file of `len` patterned bytes at `c/0/1`, a file
/// outside it, and links in and out of it.
fn served_dir(len: usize) -> (tempfile::TempDir, Service, Vec<u8>) {
    let top = tempfile::tempdir().unwrap();
    let root = top.path().join("root");
    std::fs::create_dir_all(root.join("c/0")).unwrap();
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(root.join("c/0/1"), &bytes).unwrap();
    std::fs::write(root.join(".zarray"), b"{}").unwrap();
    std::fs::write(top.path().join("secret"), b"secret").unwrap();
    std::os::unix::fs::symlink(top.path().join("secret"), root.join("out")).unwrap();
    std::os::unix::fs::symlink("../../secret", root.join("c/up")).unwrap();
    std::os::unix::fs::symlink("0/1", root.join("c/in")).unwrap();
    // Absolute, and inside: refused all the same (docs/serve.md, Security).
    std::os::unix::fs::symlink(root.join("c/0/1"), root.join("c/absolute")).unwrap();
    let tree = Arc::new(DirTree::new(&root).unwrap());
    let service = Service::new(tree, Cors::Any, Hosts::Loopback);
    (top, service, bytes)
}

#[test]
fn whole_files_and_ranges_with_exact_lengths() {
    let (_dir, service, bytes) = served_dir(700_000);
    let whole = service.respond(&request("GET", "/c/0/1", &[]));
    assert_eq!(whole.status, 200);
    assert_eq!(whole.body.len(), bytes.len() as u64);
    assert_eq!(header(&whole, "accept-ranges"), Some("bytes"));
    assert_eq!(body(whole), bytes);
    for (range, start, end) in [
        ("bytes=0-99", 0, 100),
        ("bytes=262100-600000", 262_100, 600_001),
        ("bytes=699990-", 699_990, 700_000),
        ("bytes=-300000", 400_000, 700_000),
    ] {
        let part = service.respond(&request("GET", "/c/0/1", &[("Range", range)]));
        assert_eq!(part.status, 206, "{range}");
        assert_eq!(
            header(&part, "content-range"),
            Some(format!("bytes {start}-{}/700000", end - 1).as_str())
        );
        assert_eq!(part.body.len(), (end - start) as u64);
        assert!(body(part) == bytes[start..end], "{range}");
    }
    let past = service.respond(&request("GET", "/c/0/1", &[("Range", "bytes=700000-")]));
    assert_eq!(past.status, 416);
    assert_eq!(header(&past, "content-range"), Some("bytes */700000"));
    let several = service.respond(&request("GET", "/c/0/1", &[("Range", "bytes=0-1,5-9")]));
    assert_eq!(several.status, 200, "several ranges: the whole file");
    let if_range = service.respond(&request(
        "GET",
        "/c/0/1",
        &[("Range", "bytes=0-1"), ("If-Range", "\"x\"")],
    ));
    assert_eq!(if_range.status, 200, "no validator matches: the whole file");
}

#[test]
fn head_has_the_length_and_no_body_read() {
    let (_dir, service, bytes) = served_dir(5000);
    let head = service.respond(&request("HEAD", "/c/0/1", &[]));
    assert_eq!(head.status, 200);
    assert_eq!(head.body.len(), bytes.len() as u64);
    let head = service.respond(&request("HEAD", "/c/0/1", &[("Range", "bytes=10-19")]));
    assert_eq!((head.status, head.body.len()), (206, 10));
    let meta = service.respond(&request("GET", "/.zarray", &[]));
    assert_eq!(header(&meta, "content-type"), Some("application/json"));
}

#[test]
fn paths_out_of_the_root_are_refused_and_links_inside_followed() {
    let (_dir, service, bytes) = served_dir(100);
    for target in [
        "/../secret",
        "/%2e%2e/secret",
        "/c/%2E%2E/%2e%2e/secret",
        "/c%2f0%2f1",
        "/out",
        "/c/up",
        "/c/absolute",
    ] {
        let response = service.respond(&request("GET", target, &[]));
        assert_eq!(response.status, 403, "{target}");
        assert!(!body(response).starts_with(b"secret"), "{target}");
    }
    let linked = service.respond(&request("GET", "/c/in", &[]));
    assert_eq!(linked.status, 200);
    assert_eq!(body(linked), bytes);
    for (target, status) in [
        ("/nothing", 404),
        ("/c", 404),
        ("/", 404),
        ("/c/0/1/x", 404),
        ("/a%zz", 400),
    ] {
        assert_eq!(
            service.respond(&request("GET", target, &[])).status,
            status,
            "{target}"
        );
    }
}

#[test]
fn writes_are_refused_and_options_answer_preflights() {
    let (_dir, service, _) = served_dir(100);
    for method in ["PUT", "POST", "DELETE", "PATCH", "MKCOL"] {
        let response = service.respond(&request(method, "/c/0/1", &[]));
        assert_eq!(response.status, 405, "{method}");
        assert_eq!(header(&response, "allow"), Some("GET, HEAD, OPTIONS"));
    }
    let preflight = service.respond(&request(
        "OPTIONS",
        "/c/0/1",
        &[
            ("Origin", "https://viewer.example"),
            ("Access-Control-Request-Method", "GET"),
            ("Access-Control-Request-Headers", "range"),
            ("Access-Control-Request-Private-Network", "true"),
        ],
    ));
    assert_eq!(preflight.status, 200);
    assert_eq!(preflight.body.len(), 0);
    assert_eq!(header(&preflight, "access-control-allow-origin"), Some("*"));
    assert_eq!(
        header(&preflight, "access-control-allow-headers"),
        Some("range")
    );
    assert_eq!(
        header(&preflight, "access-control-allow-methods"),
        Some("GET, HEAD, OPTIONS")
    );
    assert_eq!(
        header(&preflight, "access-control-allow-private-network"),
        Some("true")
    );
    let get = service.respond(&request(
        "GET",
        "/c/0/1",
        &[("Origin", "https://viewer.example")],
    ));
    assert!(
        header(&get, "access-control-expose-headers").is_some_and(|h| h.contains("Content-Range"))
    );
}

#[test]
fn a_configured_origin_is_named_and_other_hosts_are_refused() {
    let (dir, _, _) = served_dir(10);
    let tree = Arc::new(DirTree::new(&dir.path().join("root")).unwrap());
    let origin = Cors::Origin("https://viewer.example".into());
    let service = Service::new(tree.clone(), origin, Hosts::Loopback);
    let get = service.respond(&request("GET", "/c/0/1", &[]));
    assert_eq!(
        header(&get, "access-control-allow-origin"),
        Some("https://viewer.example")
    );
    assert_eq!(header(&get, "vary"), Some("Origin"));
    let rebound = Request {
        method: "GET",
        target: "/c/0/1",
        headers: vec![("Host", "attacker.example:8000")],
    };
    assert_eq!(service.respond(&rebound).status, 403);
    for host in ["localhost:1", "127.0.0.1", "[::1]:80", "LOCALHOST"] {
        let ok = Request {
            method: "GET",
            target: "/c/0/1",
            headers: vec![("Host", host)],
        };
        assert_eq!(service.respond(&ok).status, 200, "{host}");
    }
    let open = Service::new(tree, Cors::Off, Hosts::Any);
    let get = open.respond(&rebound);
    assert_eq!(get.status, 200);
    assert!(header(&get, "access-control-allow-origin").is_none());
}

#[test]
fn several_hosts_or_an_absolute_target_naming_another_host_are_bad_requests() {
    let (_dir, service, bytes) = served_dir(10);
    let asked = |target, hosts: &[&'static str]| {
        let request = Request {
            method: "GET",
            target,
            headers: hosts.iter().map(|host| ("Host", *host)).collect(),
        };
        service.respond(&request).status
    };
    // Judged by either header, one of these would be let through.
    assert_eq!(asked("/c/0/1", &["localhost", "attacker.example"]), 400);
    assert_eq!(asked("/c/0/1", &["attacker.example", "localhost"]), 400);
    assert_eq!(asked("http://attacker.example/c/0/1", &["localhost"]), 400);
    assert_eq!(
        asked("http://localhost:8000/c/0/1", &["127.0.0.1:8000"]),
        400
    );
    // The absolute form names the host when no Host header does.
    assert_eq!(asked("http://attacker.example/c/0/1", &[]), 403);
    assert_eq!(
        asked("http://LOCALHOST:8000/c/0/1", &["localhost:8000"]),
        200
    );
    let absolute = service.respond(&request("GET", "http://127.0.0.1:8000/c/0/1", &[]));
    assert_eq!(body(absolute), bytes);
}

#[test]
fn bind_addresses_cors_defaults_and_urls() {
    let loopback = parse_bind("0").unwrap();
    assert!(loopback.ip().is_loopback());
    let open = parse_bind("0.0.0.0:9000").unwrap();
    assert_eq!(cors_for(loopback, None), Cors::Any);
    assert_eq!(cors_for(open, None), Cors::Off);
    assert_eq!(cors_for(open, Some("*")), Cors::Any);
    assert_eq!(cors_for(loopback, Some("none")), Cors::Off);
    assert_eq!(
        cors_for(loopback, Some("https://viewer.example/")),
        Cors::Origin("https://viewer.example".into())
    );
    assert_eq!(hosts_for(open), Hosts::Any);
    assert_eq!(
        root_url(parse_bind("8000").unwrap()),
        "http://127.0.0.1:8000/"
    );
    assert!(parse_bind("nowhere").is_err());
    let (_dir, service, _) = served_dir(10);
    assert_eq!(
        viewer_source(service.tree(), "http://127.0.0.1:1/").as_deref(),
        Some("zarr://http://127.0.0.1:1/")
    );
}

/// A file whose bytes arrive when the test sends them, as a pending
/// block's do.
struct Pending {
    arrives: Mutex<Receiver<std::io::Result<Vec<u8>>>>,
}

impl Content for Pending {
    fn size(&self) -> u64 {
        4
    }

    fn read_at(&mut self, _offset: u64, _len: usize) -> std::io::Result<Vec<u8>> {
        self.arrives.lock().unwrap().recv().unwrap()
    }
}

struct PendingTree(Mutex<Option<Pending>>);

impl Tree for PendingTree {
    fn open(&self, _names: &[String]) -> Result<Box<dyn Content>, Unreadable> {
        match self.0.lock().unwrap().take() {
            Some(pending) => Ok(Box::new(pending)),
            None => Err(Unreadable::NotFound),
        }
    }
}

fn pending_service() -> (Service, std::sync::mpsc::Sender<std::io::Result<Vec<u8>>>) {
    let (send, arrives) = channel();
    let tree = PendingTree(Mutex::new(Some(Pending {
        arrives: Mutex::new(arrives),
    })));
    (Service::new(Arc::new(tree), Cors::Any, Hosts::Any), send)
}

#[test]
fn a_get_of_pending_data_waits_for_it_and_a_failure_is_an_error_status() {
    let (service, send) = pending_service();
    let head = service.respond(&request("HEAD", "/block", &[]));
    assert_eq!(
        (head.status, head.body.len()),
        (200, 4),
        "HEAD waits for nothing"
    );

    let (service, send_later) = pending_service();
    drop(send);
    let waiting = std::thread::spawn(move || {
        let response = service.respond(&request("GET", "/block", &[]));
        (response.status, body(response))
    });
    send_later.send(Ok(b"done".to_vec())).unwrap();
    assert_eq!(waiting.join().unwrap(), (200, b"done".to_vec()));

    let (service, send) = pending_service();
    send.send(Err(std::io::Error::from_raw_os_error(libc::EIO)))
        .unwrap();
    assert_eq!(service.respond(&request("GET", "/block", &[])).status, 500);
}

/// A file of two chunks whose second cannot be read.
struct FailsLate;

impl Content for FailsLate {
    fn size(&self) -> u64 {
        2 * (256 << 10)
    }

    fn read_at(&mut self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        if offset == 0 {
            Ok(vec![7; len])
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        }
    }
}

struct FailsLateTree;

impl Tree for FailsLateTree {
    fn open(&self, _names: &[String]) -> Result<Box<dyn Content>, Unreadable> {
        Ok(Box::new(FailsLate))
    }
}

#[test]
fn a_body_that_fails_after_its_headers_ends_short_and_the_connection_closes() {
    use std::io::Write;
    let listener = bind(parse_bind("0").unwrap()).unwrap();
    let address = listener.local_addr().unwrap();
    let service = Service::new(Arc::new(FailsLateTree), Cors::Any, Hosts::Any);
    HttpServer::new(listener, service).start().unwrap();
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    // A bound against hanging if the connection stayed open.
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    stream
        .write_all(b"GET /file HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut received = Vec::new();
    stream
        .read_to_end(&mut received)
        .expect("the server closes the connection");
    // hyper drops what it had not yet written: the client sees a short
    // response, or none, and never a whole one.
    if let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&received[..end]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("content-length: 524288"), "{head}");
        let body = &received[end + 4..];
        assert!(body.len() < 2 * (256 << 10), "the body ends short");
        assert!(body.iter().all(|&b| b == 7), "only bytes read are sent");
    }
}
