//! The socket layer: hyper parses requests and writes responses on a
//! small tokio runtime that only moves bytes; each request is answered by
//! [`Service::respond`] on a blocking thread of its own, which then reads
//! the body a chunk at a time into a channel the connection sends from.
//!
//! A request waiting for a pending block holds its blocking thread, and
//! only it: other requests go on being answered. At most [`MAX_ANSWERING`]
//! requests are answered at once; the next ones wait for a thread. That
//! cannot deadlock: a request waits only for the view's materialiser,
//! which ends every wait (with the bytes, or an error when the view fails
//! or stops), never for another request. A client that disconnects drops
//! its channel: the thread's next send fails, and it ends. A read that
//! fails after the headers were sent ends the body short, and hyper closes
//! the connection: the client sees a response cut short, or none, never
//! wrong bytes.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::http::respond::{Body, Request, Service};

/// Requests answered at once (each holds a blocking thread and at most a
/// chunk or two of bytes; parked ones hold no bytes).
pub const MAX_ANSWERING: usize = 256;

/// Threads moving bytes between sockets and channels.
const IO_THREADS: usize = 2;

/// Stack of a request's thread: it holds no large buffer there.
const THREAD_STACK: usize = 512 << 10;

/// Chunks read ahead of the socket per response.
const CHUNKS_AHEAD: usize = 1;

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
        let failed = |call, e| Error::os(call, "starting the HTTP server", e);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(IO_THREADS)
            .max_blocking_threads(MAX_ANSWERING)
            .thread_stack_size(THREAD_STACK)
            .thread_name("http")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| failed("tokio runtime", e))?;
        self.listener
            .set_nonblocking(true)
            .map_err(|e| failed("fcntl", e))?;
        let HttpServer { listener, service } = self;
        std::thread::Builder::new()
            .name("http-accept".into())
            .spawn(move || runtime.block_on(accept(listener, service)))
            .map_err(|e| failed("thread spawn", e))?;
        Ok(())
    }

    /// Answers requests until the process ends.
    pub fn run(self) -> Result<()> {
        self.start()?;
        loop {
            std::thread::park();
        }
    }
}

/// Accepts connections and serves each on its own task.
async fn accept(listener: TcpListener, service: Arc<Service>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => return log::error!("HTTP server: cannot listen: {e}"),
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                // Headers and body go out as soon as written (no 40 ms
                // wait for the client's delayed ACK between them).
                let _ = stream.set_nodelay(true);
                tokio::spawn(connection(stream, service.clone()));
            }
            Err(e) => {
                // Out of descriptors, most likely: wait for some to close.
                log::error!("HTTP server: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one connection's requests (HTTP/1.1, kept alive).
async fn connection(stream: tokio::net::TcpStream, service: Arc<Service>) {
    let io = hyper_util::rt::TokioIo::new(stream);
    let answer = hyper::service::service_fn(move |request| answer(request, service.clone()));
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, answer)
        .await
    {
        log::info!("HTTP connection: {e}");
    }
}

/// What the blocking thread hands back first: the status, headers and
/// body length.
type Head = (u16, Vec<(&'static str, String)>, u64);

/// Answers one request: [`Service::respond`] on a blocking thread, whose
/// body then flows through a channel.
async fn answer(
    request: hyper::Request<Incoming>,
    service: Arc<Service>,
) -> std::result::Result<hyper::Response<Streamed>, Infallible> {
    let method = request.method().as_str().to_string();
    let target = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().to_string(), |p| p.as_str().to_string());
    let headers: Vec<(String, String)> = request
        .headers()
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_string(), value)
        })
        .collect();
    let (head_sender, head) = oneshot::channel::<Head>();
    let (chunk_sender, chunks) = mpsc::channel(CHUNKS_AHEAD);
    let head_only = method == "HEAD";
    tokio::task::spawn_blocking(move || {
        let response = service.respond(&Request {
            method: &method,
            target: &target,
            headers: headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect(),
        });
        let len = response.body.len();
        if head_sender
            .send((response.status, response.headers, len))
            .is_ok()
            && !head_only
        {
            send_body(response.body, &chunk_sender, &method, &target);
        }
    });
    let Ok((status, fields, len)) = head.await else {
        // The thread panicked: a bug, answered as one.
        let mut failed = hyper::Response::new(Streamed::empty());
        *failed.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
        return Ok(failed);
    };
    let body = if head_only {
        Streamed::empty()
    } else {
        Streamed { chunks, left: len }
    };
    let mut response = hyper::Response::new(body);
    *response.status_mut() =
        hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in fields {
        if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
            headers.append(name, value);
        }
    }
    headers.insert(hyper::header::CONTENT_LENGTH, len.into());
    Ok(response)
}

/// Reads `body` a chunk at a time into `chunks`, until it ends, a read
/// fails (the body ends short) or the client is gone.
fn send_body(mut body: Body, chunks: &mpsc::Sender<Bytes>, method: &str, target: &str) {
    loop {
        match body.next_chunk() {
            Ok(None) => return,
            Ok(Some(chunk)) => {
                if chunks.blocking_send(Bytes::from(chunk)).is_err() {
                    log::info!("HTTP {method} {target}: the client went away");
                    return;
                }
            }
            Err(e) => {
                log::error!("HTTP {method} {target}: {e}; the response ends short");
                return;
            }
        }
    }
}

/// A response body arriving through a channel, of known length.
pub struct Streamed {
    chunks: mpsc::Receiver<Bytes>,
    left: u64,
}

impl Streamed {
    fn empty() -> Streamed {
        Streamed {
            chunks: mpsc::channel(1).1,
            left: 0,
        }
    }
}

impl HttpBody for Streamed {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<Frame<Bytes>, std::io::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        match self.chunks.poll_recv(context) {
            Poll::Ready(Some(chunk)) => {
                self.left = self.left.saturating_sub(chunk.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            Poll::Ready(None) => Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the body ended short",
            )))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
