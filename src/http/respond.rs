//! From a request to its response, without sockets: which file, which
//! bytes, which status and headers. The socket layer ([`super::server`])
//! only moves these across the network, so tests drive this directly.
//!
//! Waiting is a step of its own: [`Service::would_wait`] and
//! [`Service::when_ready`] before the file is opened (a view's wait file),
//! [`Body::would_wait`] and [`Body::when_ready`] before each chunk is read
//! (a pending block). The socket layer waits there holding no thread;
//! [`Service::respond`] runs the same steps, blocking.

use std::io::Read;
use std::sync::Arc;

use crate::http::range::{wanted, Wanted};
use crate::http::target::{absolute_form, path_names, BadTarget};
use crate::http::tree::{Content, Ready, Tree, Unreadable};

/// Bytes read from a file at once: a request holds at most this much.
const CHUNK: usize = 256 << 10;

/// How long browsers may keep a preflight's answer.
const PREFLIGHT_MAX_AGE: &str = "86400";

const ALLOWED_METHODS: &str = "GET, HEAD, OPTIONS";

/// Seconds a client refused for being one too many is told to wait.
const RETRY_AFTER: &str = "1";

/// Which web pages' scripts may read the responses (CORS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cors {
    /// Any page's (`*`).
    Any,
    /// This origin's only (`https://neuroglancer-demo.appspot.com`).
    Origin(String),
    /// None but the server's own origin: no CORS headers.
    Off,
}

/// Which `Host` headers are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hosts {
    /// Loopback names only (`localhost`, `127.0.0.1`, `[::1]`), so that a
    /// web page whose own domain is made to resolve to 127.0.0.1 (DNS
    /// rebinding) cannot read a server bound to loopback.
    Loopback,
    Any,
}

/// A request, as the socket layer hands it over.
pub struct Request<'a> {
    pub method: &'a str,
    pub target: &'a str,
    /// Header names and values, names in any case.
    pub headers: Vec<(&'a str, &'a str)>,
}

impl Request<'_> {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| *value)
    }
}

/// A response: its status, headers and body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
}

/// A response's body: exactly [`Body::len`] bytes, read a chunk at a time
/// from the file (waiting, in a view, for a pending block's data).
pub struct Body {
    source: Source,
    len: u64,
    sent: u64,
    buffer: Vec<u8>,
    consumed: usize,
}

enum Source {
    Bytes,
    File {
        content: Box<dyn Content>,
        start: u64,
    },
}

impl Body {
    fn bytes(bytes: Vec<u8>) -> Body {
        Body {
            source: Source::Bytes,
            len: bytes.len() as u64,
            sent: 0,
            buffer: bytes,
            consumed: 0,
        }
    }

    /// Bytes `start..start + len` of `content`.
    fn file(content: Box<dyn Content>, start: u64, len: u64) -> Body {
        Body {
            source: Source::File { content, start },
            len,
            sent: 0,
            buffer: Vec::new(),
            consumed: 0,
        }
    }

    /// The body's length: its Content-Length.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where and how many bytes the next chunk is read from, when it is
    /// read from a file (`None`: at the end, or buffered already).
    fn next_read(&self) -> Option<(u64, usize)> {
        let Source::File { start, .. } = &self.source else {
            return None;
        };
        if self.sent == self.len || self.consumed < self.buffer.len() {
            return None;
        }
        let want = (self.len - self.sent).min(CHUNK as u64) as usize;
        Some((start + self.sent, want))
    }

    /// Whether reading the next chunk would wait for data not there yet.
    pub fn would_wait(&self) -> bool {
        match (&self.source, self.next_read()) {
            (Source::File { content, .. }, Some((offset, len))) => content.would_wait(offset, len),
            _ => false,
        }
    }

    /// Calls `ready` once the next chunk can be read without waiting.
    pub fn when_ready(&mut self, ready: Ready) {
        match (self.next_read(), &mut self.source) {
            (Some((offset, len)), Source::File { content, .. }) => {
                content.when_ready(offset, len, ready)
            }
            _ => ready(),
        }
    }

    /// Reads the next chunk now, unless it is buffered already: a read
    /// that fails before the status line is still an error status.
    pub fn read_ahead(&mut self) -> std::io::Result<()> {
        if self.next_read().is_some() {
            self.refill()?;
        }
        Ok(())
    }

    /// The next bytes of the body: what is left of the buffer, or the next
    /// chunk read; `None` at its end.
    pub fn next_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.sent == self.len {
            return Ok(None);
        }
        if self.consumed == self.buffer.len() {
            self.refill()?;
        }
        let chunk = self.buffer.split_off(self.consumed);
        self.buffer.clear();
        self.consumed = 0;
        self.sent += chunk.len() as u64;
        Ok(Some(chunk))
    }

    /// Reads the next chunk into the buffer (the buffer was used up).
    fn refill(&mut self) -> std::io::Result<()> {
        let Source::File { content, start } = &mut self.source else {
            return Ok(());
        };
        let want = (self.len - self.sent).min(CHUNK as u64) as usize;
        let bytes = content.read_at(*start + self.sent, want)?;
        if bytes.len() != want {
            // The file shrank under the server: a short body would be
            // taken for the whole one.
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file is shorter than when it was opened",
            ));
        }
        self.buffer = bytes;
        self.consumed = 0;
        Ok(())
    }
}

impl Read for Body {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.sent == self.len || out.is_empty() {
            return Ok(0);
        }
        if self.consumed == self.buffer.len() {
            self.refill()?;
        }
        let n = out.len().min(self.buffer.len() - self.consumed);
        out[..n].copy_from_slice(&self.buffer[self.consumed..self.consumed + n]);
        self.consumed += n;
        self.sent += n as u64;
        Ok(n)
    }
}

/// Answers requests for the files of a tree.
pub struct Service {
    tree: Arc<dyn Tree>,
    cors: Cors,
    hosts: Hosts,
}

impl Service {
    pub fn new(tree: Arc<dyn Tree>, cors: Cors, hosts: Hosts) -> Service {
        Service { tree, cors, hosts }
    }

    pub fn tree(&self) -> &dyn Tree {
        self.tree.as_ref()
    }

    pub fn cors(&self) -> &Cors {
        &self.cors
    }

    /// The response to `request`, its first chunk read (for a GET): the
    /// steps the socket layer takes, each wait blocking the caller.
    pub fn respond(&self, request: &Request) -> Response {
        wait_blocking(|ready| self.when_ready(request, ready));
        let mut response = self.begin(request);
        if request.method == "GET" {
            wait_blocking(|ready| response.body.when_ready(ready));
            if let Err(e) = response.body.read_ahead() {
                return self.read_failed(request, &e);
            }
        }
        response
    }

    /// Whether opening the file `request` asks for would wait (a view's
    /// wait file while the view is being made).
    pub fn would_wait(&self, request: &Request) -> bool {
        self.names_to_open(request)
            .is_some_and(|names| self.tree.would_wait(&names))
    }

    /// Calls `ready` once the file `request` asks for can be opened
    /// without waiting; at once for every other request.
    pub fn when_ready(&self, request: &Request, ready: Ready) {
        match self.names_to_open(request) {
            Some(names) => self.tree.when_ready(&names, ready),
            None => ready(),
        }
    }

    /// The response to `request`, its body not read yet: call
    /// [`Body::read_ahead`] before sending a GET's status line.
    pub fn begin(&self, request: &Request) -> Response {
        let mut response = self.answer(request);
        self.add_cors(request, &mut response);
        response
    }

    /// The response to `request` when its body's first chunk could not be read.
    pub fn read_failed(&self, request: &Request, error: &std::io::Error) -> Response {
        let mut response = text(500, &format!("cannot read it: {error}\n"));
        self.add_cors(request, &mut response);
        response
    }

    /// The response to a request that would wait when too many wait
    /// already, or to a connection past the limit.
    pub fn busy(&self, request: &Request) -> Response {
        let mut response = text(
            503,
            "too many requests are waiting for data not made yet; try again shortly\n",
        );
        response.headers.push(("Retry-After", RETRY_AFTER.into()));
        self.add_cors(request, &mut response);
        response
    }

    /// The path names a GET or HEAD that will be answered from the tree
    /// asks for; `None` for any request refused before that.
    fn names_to_open(&self, request: &Request) -> Option<Vec<String>> {
        let reads = matches!(request.method, "GET" | "HEAD");
        (reads && self.refusal(request).is_none())
            .then(|| path_names(request.target).ok())
            .flatten()
    }

    /// Why `request` is refused whatever it asks for: the host it names.
    fn refusal(&self, request: &Request) -> Option<Response> {
        let host = match named_host(request) {
            Ok(host) => host,
            Err(why) => return Some(text(400, why)),
        };
        if self.hosts == Hosts::Loopback && !host.is_none_or(is_loopback_host) {
            return Some(text(
                403,
                "this server answers requests for localhost only\n",
            ));
        }
        None
    }

    fn answer(&self, request: &Request) -> Response {
        if let Some(refusal) = self.refusal(request) {
            return refusal;
        }
        match request.method {
            "GET" | "HEAD" => self.read(request),
            "OPTIONS" => self.options(request),
            _ => {
                let mut response = text(405, "read-only: GET, HEAD and OPTIONS only\n");
                response.headers.push(("Allow", ALLOWED_METHODS.into()));
                response
            }
        }
    }

    /// A GET or HEAD of a file, or of part of it.
    fn read(&self, request: &Request) -> Response {
        let (names, content) = match self.open(request.target) {
            Ok(opened) => opened,
            Err(refusal) => return refusal,
        };
        let len = content.size();
        let range = if request.header("if-range").is_some() {
            // No validators are offered, so none can match: the whole file.
            Wanted::Whole
        } else {
            wanted(request.header("range"), len)
        };
        let (status, start, end) = match range {
            Wanted::Whole => (200, 0, len),
            Wanted::Part { start, end } => (206, start, end),
            Wanted::Unsatisfiable => {
                let mut response = text(416, "the range is past the end of the file\n");
                response
                    .headers
                    .push(("Content-Range", format!("bytes */{len}")));
                return response;
            }
        };
        let mut headers = vec![
            ("Content-Type", content_type(&names).to_string()),
            ("Accept-Ranges", "bytes".to_string()),
        ];
        if status == 206 {
            headers.push(("Content-Range", format!("bytes {start}-{}/{len}", end - 1)));
        }
        Response {
            status,
            headers,
            body: Body::file(content, start, end - start),
        }
    }

    /// The file `target` names, and its path names; or the response
    /// saying why there is none.
    fn open(&self, target: &str) -> Result<(Vec<String>, Box<dyn Content>), Response> {
        let names = path_names(target).map_err(|bad| match bad {
            BadTarget::Malformed(why) => text(400, &format!("bad path: {why}\n")),
            BadTarget::Outside(why) => text(
                403,
                &format!("refused: {why} (nothing outside the root is served)\n"),
            ),
        })?;
        let content = self
            .tree
            .open(&names)
            .map_err(|unreadable| match unreadable {
                Unreadable::NotFound => text(404, "not found\n"),
                Unreadable::Directory => text(404, "a directory (no listings)\n"),
                Unreadable::Forbidden => text(403, "refused: outside the root or not readable\n"),
                Unreadable::Failed(e) => text(500, &format!("cannot read it: {e}\n")),
            })?;
        Ok((names, content))
    }

    /// OPTIONS: a CORS preflight, or a question about the methods.
    fn options(&self, request: &Request) -> Response {
        // 200 with an empty body, which every browser takes for a preflight's
        // success, where a 204 must carry no Content-Length.
        let mut response = Response {
            status: 200,
            headers: vec![("Allow", ALLOWED_METHODS.into())],
            body: Body::bytes(Vec::new()),
        };
        let preflight = request.header("origin").is_some()
            && request.header("access-control-request-method").is_some();
        if preflight && self.cors != Cors::Off {
            let headers = &mut response.headers;
            headers.push(("Access-Control-Allow-Methods", ALLOWED_METHODS.into()));
            if let Some(asked) = request.header("access-control-request-headers") {
                // Reading is all that is ever allowed: any request header may come.
                headers.push(("Access-Control-Allow-Headers", asked.to_string()));
            }
            headers.push(("Access-Control-Max-Age", PREFLIGHT_MAX_AGE.into()));
            if request.header("access-control-request-private-network") == Some("true") {
                headers.push(("Access-Control-Allow-Private-Network", "true".into()));
            }
        }
        response
    }

    fn add_cors(&self, request: &Request, response: &mut Response) {
        let origin = match &self.cors {
            Cors::Off => return,
            Cors::Any => "*".to_string(),
            Cors::Origin(origin) => origin.clone(),
        };
        let headers = &mut response.headers;
        headers.push(("Access-Control-Allow-Origin", origin));
        if matches!(self.cors, Cors::Origin(_)) {
            headers.push(("Vary", "Origin".into()));
        }
        if request.method != "OPTIONS" {
            // Scripts see these only when listed (Neuroglancer reads
            // Content-Range and Content-Length).
            headers.push((
                "Access-Control-Expose-Headers",
                "Content-Length, Content-Range, Accept-Ranges".into(),
            ));
        }
    }
}

/// The host `request` names: the authority of a target in absolute form,
/// else its `Host` header (RFC 9112 §3.2). Several `Host` headers, or an
/// absolute target naming another host than `Host`, are bad requests:
/// judging either by one of them would let the other through.
fn named_host<'r>(request: &Request<'r>) -> Result<Option<&'r str>, &'static str> {
    let mut hosts = request
        .headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("host"))
        .map(|(_, value)| *value);
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err("several Host headers\n");
    }
    match absolute_form(request.target) {
        Some((authority, _)) if host.is_some_and(|host| !host.eq_ignore_ascii_case(authority)) => {
            Err("the target names another host than the Host header\n")
        }
        Some((authority, _)) => Ok(Some(authority)),
        None => Ok(host),
    }
}

/// Runs `start`, then blocks until the [`Ready`] it was given is called
/// (or dropped: nothing is left to wait for).
fn wait_blocking(start: impl FnOnce(Ready)) {
    let (done, ready) = std::sync::mpsc::sync_channel(1);
    start(Box::new(move || {
        let _ = done.send(());
    }));
    let _ = ready.recv();
}

/// Whether `host` (a `Host` header: name or address, maybe a port) names
/// this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The media type of the file at `names`: JSON for the metadata files of
/// Zarr, OME-Zarr and Neuroglancer precomputed, bytes otherwise.
fn content_type(names: &[String]) -> &'static str {
    let last = names.last().map(String::as_str).unwrap_or("");
    let json = [
        ".zarray",
        ".zattrs",
        ".zgroup",
        ".zmetadata",
        "zarr.json",
        "info",
    ];
    if json.contains(&last) || last.ends_with(".json") {
        "application/json"
    } else {
        "application/octet-stream"
    }
}

/// A short plain-text response.
fn text(status: u16, message: &str) -> Response {
    Response {
        status,
        headers: vec![("Content-Type", "text/plain; charset=utf-8".into())],
        body: Body::bytes(message.as_bytes().to_vec()),
    }
}
