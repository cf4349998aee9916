//! The socket layer: hyper parses requests and writes responses on a
//! small tokio runtime that only moves bytes and waits; the steps of
//! [`Service`] that touch files (opening, reading a chunk) run on blocking
//! threads, one step at a time, and a body flows through a channel the
//! connection sends from.
//!
//! Waiting holds no thread. A request for data not made yet (a view's
//! pending block, its wait file) is parked in the view with a callback,
//! and its task sleeps until called; meanwhile the blocking threads go on
//! answering the rest. So that the waiting cannot crowd out the rest, each
//! kind has its limit ([`Limits`]): at most `waiting` requests wait at
//! once (the next one is answered 503 with `Retry-After`), at most
//! [`MAX_ANSWERING`] steps run on threads at once (more queue, briefly:
//! none of them waits for data), and at most `connections` connections
//! are open (the next one is answered 503 and closed, so descriptors
//! cannot run out). A connection that takes longer than `header_timeout`
//! to send a request's headers, or stays idle that long between requests,
//! is closed. This cannot deadlock: a parked request waits only for the
//! view's materialiser, which ends every wait (with the bytes, or an error
//! when the view fails or stops), never for another request.
//!
//! A client that disconnects while its request waits frees its place at
//! once (hyper drops the request's task when it sees the connection end);
//! while its body is sent, the next send fails and the task ends. A read
//! that fails after the headers were sent ends the body short, and hyper
//! closes the connection: the client sees a response cut short, or none,
//! never wrong bytes. A directory's reads through a mounted view wait in
//! the kernel, on a blocking thread: `mount --serve` waits holding none.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};
use crate::http::respond::{Body, Request, Response, Service};
use crate::http::tree::Ready;

/// Steps run on threads at once (each holds a blocking thread and at most
/// a chunk of bytes).
pub const MAX_ANSWERING: usize = 256;

/// Connections open at once, by default: half the usual limit of 1,024
/// descriptors, the rest left to the view.
pub const MAX_CONNECTIONS: usize = 512;

/// Requests waiting for data at once, by default: enough for many
/// viewers, while leaving connections for requests that need not wait.
pub const MAX_WAITING: usize = 384;

/// How long a connection may take to send a request's headers, or stay
/// idle between requests, by default.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Threads moving bytes between sockets and channels.
const IO_THREADS: usize = 2;

/// Stack of a request's thread: it holds no large buffer there.
const THREAD_STACK: usize = 512 << 10;

/// Chunks read ahead of the socket per response.
const CHUNKS_AHEAD: usize = 1;

/// What a connection past the limit is told before it is closed.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
    Retry-After: 1\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\
    Content-Length: 25\r\n\r\ntoo many connections open";

/// How much a server lets its clients hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; the next is answered 503 and closed.
    pub connections: usize,
    /// Requests waiting for data at once; the next is answered 503.
    pub waiting: usize,
    /// How long a connection may take to send a request's headers, or
    /// stay idle between requests, before it is closed.
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: MAX_CONNECTIONS,
            waiting: MAX_WAITING,
            header_timeout: HEADER_TIMEOUT,
        }
    }
}

/// A listening socket and what answers on it: the server, not yet started
/// (so that it can be made before a daemon forks, and started after).
pub struct HttpServer {
    listener: TcpListener,
    service: Arc<Service>,
    limits: Limits,
}

impl HttpServer {
    pub fn new(listener: TcpListener, service: Service) -> HttpServer {
        HttpServer {
            listener,
            service: Arc::new(service),
            limits: Limits::default(),
        }
    }

    /// The same server, letting its clients hold `limits`.
    pub fn with_limits(self, limits: Limits) -> HttpServer {
        HttpServer { limits, ..self }
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
        let HttpServer {
            listener,
            service,
            limits,
        } = self;
        let shared = Arc::new(Shared {
            service,
            answering: Arc::new(Semaphore::new(MAX_ANSWERING)),
            waiting: Arc::new(Semaphore::new(limits.waiting)),
            header_timeout: limits.header_timeout,
        });
        let connections = Arc::new(Semaphore::new(limits.connections));
        std::thread::Builder::new()
            .name("http-accept".into())
            .spawn(move || runtime.block_on(accept(listener, shared, connections)))
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

/// What every connection's requests share: the service and the places
/// of each kind.
struct Shared {
    service: Arc<Service>,
    answering: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    header_timeout: Duration,
}

/// Something that may have to wait before its next step: the file a
/// request asks for, or a body's next chunk.
trait Wait: Send + 'static {
    fn would_wait(&self) -> bool;
    fn when_ready(&mut self, ready: Ready);
}

impl Wait for (Arc<Service>, Arc<Asked>) {
    fn would_wait(&self) -> bool {
        self.0.would_wait(&self.1.request())
    }

    fn when_ready(&mut self, ready: Ready) {
        self.0.when_ready(&self.1.request(), ready)
    }
}

impl Wait for Body {
    fn would_wait(&self) -> bool {
        Body::would_wait(self)
    }

    fn when_ready(&mut self, ready: Ready) {
        Body::when_ready(self, ready)
    }
}

/// What a step yields when it cannot: the task panicked (a bug), or no
/// place was left to wait in.
enum Stopped {
    Failed,
    Busy,
}

impl Shared {
    /// Runs `job` on a blocking thread, with one of the answering places.
    async fn blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> std::result::Result<T, Stopped> {
        let place = self.answering.clone().acquire_owned().await;
        let place = place.map_err(|_| Stopped::Failed)?;
        tokio::task::spawn_blocking(move || {
            let out = job();
            drop(place);
            out
        })
        .await
        .map_err(|_| Stopped::Failed)
    }

    /// Returns `thing` once its next step would not wait: at once, or,
    /// holding a waiting place and no thread, once it is called back.
    /// [`Stopped::Busy`] when it would wait and `limited` places are all
    /// taken (a body already under way waits without one).
    async fn ready<W: Wait>(&self, mut thing: W, limited: bool) -> std::result::Result<W, Stopped> {
        let (called, ready) = oneshot::channel::<()>();
        let places = self.waiting.clone();
        let (thing, waits) = self
            .blocking(move || {
                if !thing.would_wait() {
                    return (thing, Ok(None));
                }
                let place = match places.try_acquire_owned() {
                    Ok(place) => Some(place),
                    Err(_) if limited => return (thing, Err(Stopped::Busy)),
                    Err(_) => None,
                };
                thing.when_ready(Box::new(move || {
                    let _ = called.send(());
                }));
                (thing, Ok(Some(place)))
            })
            .await?;
        let waits: Option<Option<OwnedSemaphorePermit>> = waits?;
        if let Some(_place) = waits {
            // An error when the callback was dropped uncalled: nothing is
            // left to wait for.
            let _ = ready.await;
        }
        Ok(thing)
    }
}

/// Accepts connections and serves each on its own task, while there are
/// places for them.
async fn accept(listener: TcpListener, shared: Arc<Shared>, connections: Arc<Semaphore>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => return log::error!("HTTP server: cannot listen: {e}"),
    };
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let Ok(place) = connections.clone().try_acquire_owned() else {
                    // Said if the socket takes it at once; closed either way.
                    let _ = stream.try_write(TOO_MANY_CONNECTIONS);
                    continue;
                };
                // Headers and body go out as soon as written (no 40 ms
                // wait for the client's delayed ACK between them).
                let _ = stream.set_nodelay(true);
                let shared = shared.clone();
                tokio::spawn(async move {
                    connection(stream, shared).await;
                    drop(place);
                });
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
async fn connection(stream: tokio::net::TcpStream, shared: Arc<Shared>) {
    let io = hyper_util::rt::TokioIo::new(stream);
    let header_timeout = shared.header_timeout;
    let answer = hyper::service::service_fn(move |request| answer(request, shared.clone()));
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        // Also runs while the connection is idle between requests.
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(io, answer)
        .await
    {
        log::info!("HTTP connection: {e}");
    }
}

/// A request as the service reads it, owned so that it can move between
/// threads.
struct Asked {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

impl Asked {
    fn of(request: &hyper::Request<Incoming>) -> Asked {
        Asked {
            method: request.method().as_str().to_string(),
            // Whole, so that an absolute-form target keeps its host.
            target: request.uri().to_string(),
            headers: request
                .headers()
                .iter()
                .map(|(name, value)| {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    (name.as_str().to_string(), value)
                })
                .collect(),
        }
    }

    fn request(&self) -> Request<'_> {
        Request {
            method: &self.method,
            target: &self.target,
            headers: self
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect(),
        }
    }
}

/// Answers one request: each step of [`Service`] on a blocking thread,
/// each wait on none; the body then flows through a channel.
async fn answer(
    request: hyper::Request<Incoming>,
    shared: Arc<Shared>,
) -> std::result::Result<hyper::Response<Streamed>, Infallible> {
    let asked = Arc::new(Asked::of(&request));
    let head_only = asked.method == "HEAD";
    let response = match respond(&shared, asked.clone()).await {
        Ok(response) => response,
        Err(Stopped::Busy) => shared.service.busy(&asked.request()),
        Err(Stopped::Failed) => {
            // A step panicked: a bug, answered as one.
            let mut failed = hyper::Response::new(Streamed::empty());
            *failed.status_mut() = hyper::StatusCode::INTERNAL_SERVER_ERROR;
            return Ok(failed);
        }
    };
    let Response {
        status,
        headers: fields,
        body,
    } = response;
    let len = body.len();
    let body = if head_only || body.is_empty() {
        Streamed::empty()
    } else {
        let (chunk_sender, chunks) = mpsc::channel(CHUNKS_AHEAD);
        tokio::spawn(send_body(shared, body, chunk_sender, asked));
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

/// The response to `asked`, a GET's first chunk read.
async fn respond(shared: &Shared, asked: Arc<Asked>) -> std::result::Result<Response, Stopped> {
    let service = shared.service.clone();
    shared.ready((service.clone(), asked.clone()), true).await?;
    let (service_now, asked_now) = (service.clone(), asked.clone());
    let mut response = shared
        .blocking(move || service_now.begin(&asked_now.request()))
        .await?;
    if asked.method != "GET" {
        return Ok(response);
    }
    let body = shared.ready(response.body, true).await?;
    let (body, read) = shared
        .blocking(move || {
            let mut body = body;
            let read = body.read_ahead();
            (body, read)
        })
        .await?;
    if let Err(e) = read {
        return Ok(service.read_failed(&asked.request(), &e));
    }
    response.body = body;
    Ok(response)
}

/// Reads `body` a chunk at a time into `chunks`, until it ends, a read
/// fails (the body ends short) or the client is gone.
async fn send_body(
    shared: Arc<Shared>,
    mut body: Body,
    chunks: mpsc::Sender<Bytes>,
    asked: Arc<Asked>,
) {
    let (method, target) = (&asked.method, &asked.target);
    loop {
        let Ok(ready) = shared.ready(body, false).await else {
            return;
        };
        let Ok((next, chunk)) = shared
            .blocking(move || {
                let mut body = ready;
                let chunk = body.next_chunk();
                (body, chunk)
            })
            .await
        else {
            return;
        };
        body = next;
        match chunk {
            Ok(None) => return,
            Ok(Some(chunk)) => {
                if chunks.send(Bytes::from(chunk)).await.is_err() {
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
