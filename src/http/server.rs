//! The socket layer: tiny_http parses requests and writes responses; each
//! request is answered on a thread of its own by [`Service::respond`].
//!
//! A request waiting for a pending block holds its thread, and only it:
//! other requests go on being answered. At most [`MAX_ANSWERING`] requests
//! are answered at once; the next ones wait in tiny_http's queue until a
//! thread ends. That cannot deadlock: a request waits only for the view's
//! materialiser (which ends every wait, with the bytes or an error) or,
//! on one connection, for the requests before it, which were taken first.
//! A client that disconnects makes its thread's writes fail; the thread
//! ends and its file closes.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::http::respond::{Request, Service};

/// Requests answered at once (each holds a thread and at most a chunk of
/// bytes; parked ones hold no bytes).
pub const MAX_ANSWERING: usize = 256;

/// Stack of a request's thread: it holds no large buffer there.
const THREAD_STACK: usize = 256 << 10;

/// A listening socket and what answers on it: the server, not yet started
/// (so that it can be made before a daemon forks, and started after).
pub struct HttpServer {
    listener: TcpListener,
    service: Arc<Service>,
}

impl HttpServer {
    pub fn new(listener: TcpListener, service: Service) -> HttpServer {
        HttpServer {
            listener,
            service: Arc::new(service),
        }
    }

    pub fn address(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::os("getsockname", "finding the server's address", e))
    }

    pub fn service(&self) -> &Service {
        &self.service
    }

    /// Starts answering requests on threads of its own; returns at once.
    pub fn start(self) -> Result<()> {
        let slots = Arc::new(Slots::default());
        start_listening(&self.listener, self.service, slots)
    }

    /// Answers requests on this thread until the process ends.
    pub fn run(self) -> Result<()> {
        self.start()?;
        loop {
            std::thread::park();
        }
    }
}

/// Starts tiny_http on a copy of `listener`, and a thread taking its
/// requests. tiny_http stops accepting after an accept error (too many
/// open files): the thread then starts another on a fresh copy, and goes
/// on answering the requests of the connections already open.
fn start_listening(listener: &TcpListener, service: Arc<Service>, slots: Arc<Slots>) -> Result<()> {
    let copy = listener
        .try_clone()
        .map_err(|e| Error::os("dup", "starting the HTTP server", e))?;
    let spare = listener
        .try_clone()
        .map_err(|e| Error::os("dup", "starting the HTTP server", e))?;
    let server = tiny_http::Server::from_listener(copy, None).map_err(|e| {
        Error::os(
            "listen",
            "starting the HTTP server",
            std::io::Error::other(e.to_string()),
        )
    })?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let mut spare = Some(spare);
            loop {
                match server.recv() {
                    Ok(request) => dispatch(request, &service, &slots),
                    Err(e) => {
                        log::error!("HTTP server: {e}; accepting again in a second");
                        std::thread::sleep(Duration::from_secs(1));
                        if let Some(listener) = spare.take() {
                            if let Err(e) =
                                start_listening(&listener, service.clone(), slots.clone())
                            {
                                log::error!("HTTP server: {e}");
                            }
                        }
                    }
                }
            }
        })
        .map_err(|e| Error::os("thread spawn", "starting the HTTP server", e))?;
    Ok(())
}

/// Answers `request` on a thread of its own, once fewer than
/// [`MAX_ANSWERING`] are being answered.
fn dispatch(request: tiny_http::Request, service: &Arc<Service>, slots: &Arc<Slots>) {
    slots.take();
    let (service, slots_held) = (service.clone(), slots.clone());
    let spawned = std::thread::Builder::new()
        .name("http-request".into())
        .stack_size(THREAD_STACK)
        .spawn(move || {
            answer(request, &service);
            slots_held.give_back();
        });
    if let Err(e) = spawned {
        // The request is dropped with the closure: its client sees the
        // connection close, and may retry.
        log::error!("HTTP server: cannot start a thread for a request: {e}");
        slots.give_back();
    }
}

/// Answers one request: the service decides, tiny_http writes.
fn answer(request: tiny_http::Request, service: &Service) {
    let method = request.method().as_str().to_string();
    let target = request.url().to_string();
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|h| (h.field.as_str().to_string(), h.value.as_str().to_string()))
        .collect();
    let response = service.respond(&Request {
        method: &method,
        target: &target,
        headers: headers
            .iter()
            .map(|(f, v)| (f.as_str(), v.as_str()))
            .collect(),
    });
    let len = usize::try_from(response.body.len()).unwrap_or(usize::MAX);
    let headers = response
        .headers
        .iter()
        .filter_map(|(field, value)| {
            tiny_http::Header::from_bytes(field.as_bytes(), value.as_bytes()).ok()
        })
        .collect();
    let reply = tiny_http::Response::new(
        tiny_http::StatusCode(response.status),
        headers,
        response.body,
        Some(len),
        None,
    )
    // Always a Content-Length, never chunked: clients check lengths.
    .with_chunked_threshold(usize::MAX);
    if let Err(e) = request.respond(reply) {
        // The client went away, or a read failed mid-body: tiny_http
        // closes the connection, which the client sees as a short body.
        log::info!("HTTP {method} {target}: {e}");
    }
}

/// How many requests are being answered, bounded by [`MAX_ANSWERING`].
#[derive(Default)]
struct Slots {
    taken: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn take(&self) {
        let mut taken = self.taken.lock();
        while *taken >= MAX_ANSWERING {
            self.freed.wait(&mut taken);
        }
        *taken += 1;
    }

    fn give_back(&self) {
        *self.taken.lock() -= 1;
        self.freed.notify_one();
    }
}
