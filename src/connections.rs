//! Connections: the accept loop under the wire, and each connection's clock.
//!
//! It owns what axum's `serve` hides: at most `max_connections` connections open at once (the
//! rest wait in the listen backlog to be accepted); a request's head and body must arrive within
//! `request_timeout` of its first byte, and a keep-alive connection idle for `idle_timeout` is
//! closed; the errors hyper answers itself (a malformed head, an oversized head or URI) carry the
//! JSON error body; and draining: on shutdown it stops accepting, closes at once (unanswered)
//! every connection that is idle or still sending its request, lets the requests being decided
//! finish and be answered, and gives up on whatever is left after `drain_deadline`.
//!
//! It knows nothing of routes, tokens or the limiter: it hands each request to the router. A
//! connection's socket, its requests and its deadlines are all polled by one task, so the phase
//! it is in needs no lock.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

use redb_limiter::wire::{ErrorBody, ErrorReply};

/// How long requests and connections may take, and how many may be open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) request_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) drain_deadline: Duration,
}

/// Between requests (or before the first).
const IDLE: u8 = 0;
/// A request's first bytes arrived; its head is not complete.
const HEAD: u8 = 1;
/// The head is complete; the body is being read.
const BODY: u8 = 2;
/// The request is read and being decided; its answer is due.
const BUSY: u8 = 3;

/// Where one connection stands: its phase and since when (ms after it opened).
pub(crate) struct Conn {
    opened: Instant,
    phase: AtomicU8,
    since_ms: AtomicU64,
    /// Wakes the connection's task when its deadline moved earlier.
    changed: Notify,
}

impl Conn {
    fn new() -> Self {
        Conn { opened: Instant::now(), phase: AtomicU8::new(IDLE), since_ms: AtomicU64::new(0), changed: Notify::new() }
    }

    fn ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Relaxed)
    }

    fn enter(&self, phase: u8) {
        self.since_ms.store(self.ms(), Ordering::Relaxed);
        self.phase.store(phase, Ordering::Relaxed);
        self.changed.notify_one();
    }

    /// A request's head is complete: its body is read next (timed from the first byte), or it
    /// has none.
    fn head_read(&self, has_body: bool) {
        let phase = if has_body { BODY } else { BUSY };
        if self.phase() == IDLE {
            // Its head was already buffered (pipelined): it starts now.
            self.enter(phase);
        } else {
            self.phase.store(phase, Ordering::Relaxed);
        }
    }

    /// The handler has read the request's body: it is now decided, with no deadline.
    pub(crate) fn body_read(&self) {
        self.phase.store(BUSY, Ordering::Relaxed);
    }

    /// When the connection is closed unless its phase changes first.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        let within = match self.phase() {
            IDLE => limits.idle_timeout,
            HEAD | BODY => limits.request_timeout,
            _ => return None,
        };
        Some(self.opened + Duration::from_millis(self.since_ms.load(Ordering::Relaxed)) + within)
    }
}

/// The socket, watched: the first byte of a request starts its clock, and an error response
/// hyper writes by itself is given the JSON error body.
struct Watched {
    io: TcpStream,
    conn: Arc<Conn>,
    /// A rewritten response still to send, and how much of it is sent.
    pending: Vec<u8>,
    sent: usize,
}

impl Watched {
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before && self.conn.phase() == IDLE {
            self.conn.enter(HEAD);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        std::task::ready!(self.poll_pending(cx))?;
        if let Some(response) = json_error_for(buf) {
            self.pending = response;
            self.sent = 0;
            // Sent as far as the socket takes it now; flush and shutdown send the rest.
            let _ = self.poll_pending(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.poll_pending(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// When `buf` is an error response hyper wrote by itself (status 4xx or 5xx, no body, no
/// content type: every response of the router has one), the same status with the JSON error
/// body, closing the connection as hyper does after such an error.
fn json_error_for(buf: &[u8]) -> Option<Vec<u8>> {
    if !buf.starts_with(b"HTTP/1.") {
        return None;
    }
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&buf[..head_end]).ok()?;
    let status_line = head.lines().next()?;
    let rest = status_line.strip_prefix("HTTP/1.1 ").or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let status: u16 = rest.get(..3)?.parse().ok()?;
    let has_type = head.lines().any(|l| l.len() >= 13 && l[..13].eq_ignore_ascii_case("content-type:"));
    if status < 400 || has_type || buf.len() != head_end + 4 {
        return None;
    }
    let message = match status {
        414 => "the request URI is too long",
        431 => "the request head is too large",
        _ => "the request head is malformed (request line, a header, or Content-Length)",
    };
    let body = serde_json::to_vec(&ErrorReply {
        error: ErrorBody {
            code: if status < 500 { "bad_request" } else { "unavailable" }.to_owned(),
            message: message.to_owned(),
        },
    })
    .expect("replies always serialize");
    let mut out = format!(
        "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend(body);
    Some(out)
}

/// Accepts and serves connections until `shutdown` completes, then drains (see the module
/// docs); `on_shutdown` runs once accepting has stopped.
pub(crate) async fn run(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_shutdown: impl FnOnce(),
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop, stopping) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    // The head's deadline is ours (from its first byte, not from the end of the last request).
    http.header_read_timeout(None);
    tokio::pin!(shutdown);
    loop {
        while tasks.try_join_next().is_some() {}
        let slot = tokio::select! {
            biased;
            () = &mut shutdown => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was taken: wait
                    // a moment rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let connection = serve_connection(stream, router.clone(), http.clone(), limits, stopping.clone());
        tasks.spawn(async move {
            connection.await;
            drop(slot);
        });
    }
    on_shutdown();
    drop(listener);
    let _ = stop.send(true);
    let drained =
        tokio::time::timeout(limits.drain_deadline, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(open = tasks.len(), "the drain deadline passed; closing the connections left unanswered");
        tasks.shutdown().await;
    }
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    router: axum::Router,
    http: hyper::server::conn::http1::Builder,
    limits: Limits,
    mut stopping: watch::Receiver<bool>,
) {
    let conn = Arc::new(Conn::new());
    let io = TokioIo::new(Watched { io: stream, conn: conn.clone(), pending: Vec::new(), sent: 0 });
    let for_requests = conn.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let mut router = router.clone();
        let conn = for_requests.clone();
        async move {
            conn.head_read(!req.body().is_end_stream());
            let mut req = req.map(Body::new);
            req.extensions_mut().insert(conn.clone());
            let response = tower_service::Service::call(&mut router, req).await;
            conn.enter(IDLE);
            response
        }
    });
    let connection = http.serve_connection(io, service);
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        let deadline = conn.deadline(&limits);
        tokio::select! {
            _ = connection.as_mut() => return,
            () = sleep_until(deadline) => {
                if conn.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    return; // dropped: the socket closes, unanswered
                }
            }
            () = conn.changed.notified() => {}
            _ = stopping.changed(), if !draining => {
                draining = true;
                if conn.phase() != BUSY {
                    return; // idle or still sending its request: closed unanswered
                }
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
