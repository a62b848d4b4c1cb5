//! The slot server: the wire spec over HTTP/1.1, on top of any [`Backend`] (the embedded
//! limiter on its redb file, or PostgreSQL mode).
//!
//! It owns routing, the order of checks (token first, then 404/405, then the 64 KiB body
//! limit, then parsing), the mapping of every error to its status and code, and draining on
//! shutdown. `GET /` is the live page (`page.html`, embedded; it needs no token, as it carries
//! no data) and `GET /recent` the feed of latest refusals it reads (see [`crate::recent`]).
//! It decides nothing itself: every request goes to the limiter, and a reply is
//! written only after the limiter answered (which is after the commit).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method as HttpMethod, Request as HttpRequest, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::recent::Recent;
use redb_limiter::backend::Backend;
use redb_limiter::limiter::LimiterError;
use redb_limiter::request::{EnvelopeError, Method, Request};
use redb_limiter::wire::{
    AcquireReply, ErrorBody, ErrorReply, HealthReply, LiftReply, PeekReply, ReleaseReply, SettleReply, StateReply,
    ThrottleReply, WaitReply, acquire_reply_with_report,
};

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The live page `GET /` serves: one self-contained HTML file (no external script, style or font).
pub const PAGE_HTML: &str = include_str!("page.html");

/// What the server needs besides the limiter.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// When set, every path but `GET /health` and the page (`GET /`) needs
    /// `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// A request's head and body must arrive within this long of its first byte.
    pub request_timeout: Duration,
    /// A keep-alive connection idle this long is closed.
    pub idle_timeout: Duration,
    /// At most this many connections are open at once; the rest wait to be accepted.
    pub max_connections: usize,
    /// On shutdown, connections still open this long after it began are closed unanswered.
    pub drain_deadline: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            token: None,
            request_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(120),
            max_connections: 4096,
            drain_deadline: Duration::from_secs(10),
        }
    }
}

struct App<B> {
    limiter: B,
    token: Option<Vec<u8>>,
    draining: AtomicBool,
    recent: Recent,
}

/// Serves the wire on `listener` until `shutdown` completes, then stops accepting, finishes the
/// requests in flight (answering any that arrive meanwhile `unavailable`) and returns, within
/// `config.drain_deadline` (connections idle or still sending a request are closed unanswered;
/// see the `connections` module). The caller then drops the limiter, which commits and closes the
/// file.
pub async fn serve<B: Backend>(
    listener: tokio::net::TcpListener,
    limiter: B,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Arc::new(App {
        limiter,
        token: config.token.map(|t| t.trim().as_bytes().to_vec()).filter(|t| !t.is_empty()),
        draining: AtomicBool::new(false),
        recent: Recent::default(),
    });
    let router = axum::Router::new().fallback(handle).with_state(app.clone());
    let limits = crate::connections::Limits {
        request_timeout: config.request_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
        drain_deadline: config.drain_deadline,
    };
    crate::connections::run(listener, router, limits, shutdown, move || {
        app.draining.store(true, Ordering::SeqCst);
        // SIGTERM answers every pending wait at once (section 15).
        app.limiter.end_waits();
    })
    .await
}

/// An error reply: status, code and a message naming the field at fault.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Failure { status, code, message: message.into() }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Failure::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn unavailable(message: impl Into<String>) -> Self {
        Failure::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl From<LimiterError> for Failure {
    fn from(e: LimiterError) -> Self {
        match e {
            LimiterError::BadRequest(bad) => Failure::bad_request(bad.0),
            LimiterError::Unavailable(why) => Failure::unavailable(why),
            other => Failure::unavailable(other.to_string()),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = ErrorReply { error: ErrorBody { code: self.code.to_owned(), message: self.message } };
        let mut response = (self.status, json_body(&body)).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The body was left unread, so the connection closes after this reply: say so, or a
            // client may send its next request on it and lose it to the close.
            response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        }
        response
    }
}

fn json_body<T: Serialize>(value: &T) -> ([(header::HeaderName, &'static str); 1], Vec<u8>) {
    ([(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(value).expect("replies always serialize"))
}

fn json<T: Serialize>(value: &T) -> Response {
    json_body(value).into_response()
}

/// Compares without an early exit, so the time taken does not tell how much of a guess matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn authorized(token: &[u8], headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        .is_some_and(|given| constant_time_eq(given, token))
}

#[derive(serde::Deserialize)]
struct StateQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: String,
    limit: Option<String>,
}

/// The page size of `GET /state` when the query names none, and the most it may name.
pub const STATE_LIMIT_DEFAULT: usize = 1000;
/// The wire version `/health` names (section 15): a server that keeps `/wait` speaks 4; one
/// that does not (it answers `/wait` 404) says 3, so a host waits on `retryAt` there.
pub const WIRE_WITH_WAITS: u32 = 4;
pub const WIRE_WITHOUT_WAITS: u32 = 3;
pub const STATE_LIMIT_MAX: usize = 100_000;

/// What a path serves and with which HTTP method.
enum Route {
    Call(Option<Method>), // None: the envelope
    Health,
    State,
    Metrics,
    Recent,
}

fn route(path: &str) -> Option<(Route, HttpMethod)> {
    Some(match path {
        "/acquire" => (Route::Call(Some(Method::Acquire)), HttpMethod::POST),
        "/release" => (Route::Call(Some(Method::Release)), HttpMethod::POST),
        "/throttle" => (Route::Call(Some(Method::Throttle)), HttpMethod::POST),
        "/peek" => (Route::Call(Some(Method::Peek)), HttpMethod::POST),
        "/settle" => (Route::Call(Some(Method::Settle)), HttpMethod::POST),
        "/lift" => (Route::Call(Some(Method::Lift)), HttpMethod::POST),
        "/wait" => (Route::Call(Some(Method::Wait)), HttpMethod::POST),
        "/" => (Route::Call(None), HttpMethod::POST),
        "/health" => (Route::Health, HttpMethod::GET),
        "/state" => (Route::State, HttpMethod::GET),
        "/metrics" => (Route::Metrics, HttpMethod::GET),
        "/recent" => (Route::Recent, HttpMethod::GET),
        _ => return None,
    })
}

async fn handle<B: Backend>(State(app): State<Arc<App<B>>>, req: HttpRequest<Body>) -> Response {
    match dispatch(&app, req).await {
        Ok(response) => response,
        Err(failure) => failure.into_response(),
    }
}

async fn dispatch<B: Backend>(app: &App<B>, req: HttpRequest<Body>) -> Result<Response, Failure> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    if path == "/" && parts.method == HttpMethod::GET {
        return Ok(([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE_HTML).into_response());
    }
    let is_health = path == "/health" && parts.method == HttpMethod::GET;
    if let Some(token) = &app.token
        && !is_health
        && !authorized(token, &parts.headers)
    {
        return Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "Authorization: Bearer <token> is required",
        ));
    }
    let Some((route, method)) = route(path) else {
        return Err(Failure::new(StatusCode::NOT_FOUND, "not_found", format!("no such path: {path}")));
    };
    if parts.method != method {
        return Err(Failure::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{path} takes {method}, not {}", parts.method),
        ));
    }
    if app.draining.load(Ordering::SeqCst) {
        return Err(Failure::unavailable("the server is shutting down"));
    }
    let limiter = &app.limiter;
    match route {
        Route::Health => {
            let reason = limiter.outage().await;
            let status = if reason.is_some() { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
            let reply = HealthReply {
                ok: reason.is_none(),
                backend: limiter.kind().to_owned(),
                path: limiter.path().map(|p| p.display().to_string()),
                uptime_ms: limiter.uptime().as_millis() as u64,
                wire: if limiter.keeps_waits() { WIRE_WITH_WAITS } else { WIRE_WITHOUT_WAITS },
                reason,
            };
            Ok((status, json(&reply)).into_response())
        }
        Route::Metrics => {
            Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], limiter.metrics().encode())
                .into_response())
        }
        Route::Recent => Ok(json(&app.recent.reply(limiter.now()))),
        Route::State => {
            let query = axum::extract::Query::<StateQuery>::try_from_uri(&parts.uri)
                .map_err(|e| Failure::bad_request(format!("prefix, after and limit must be strings: {e}")))?;
            let StateQuery { prefix, after, limit } = query.0;
            let limit = match limit {
                None => STATE_LIMIT_DEFAULT,
                Some(text) => {
                    text.parse::<usize>().ok().filter(|n| (1..=STATE_LIMIT_MAX).contains(n)).ok_or_else(|| {
                        Failure::bad_request(format!("limit must be an integer from 1 to {STATE_LIMIT_MAX}"))
                    })?
                }
            };
            let page = limiter.state_page(prefix, after, limit).await?;
            let snapshot = page.snapshot;
            let mut reply = StateReply::new(snapshot.now, &snapshot.view, snapshot.totals);
            reply.truncated = page.truncated;
            Ok(json(&reply))
        }
        Route::Call(method) => {
            let body = read_body(&parts.headers, body).await?;
            if let Some(conn) = parts.extensions.get::<Arc<crate::connections::Conn>>() {
                conn.body_read();
            }
            let now = limiter.now();
            let request = match method {
                Some(method) => Request::from_body(method, &body, now).map_err(|e| {
                    limiter.metrics().decided(method.name(), "bad_request", "");
                    Failure::bad_request(e.0)
                })?,
                None => Request::from_envelope(&body, now).map_err(|e| match e {
                    EnvelopeError::BadRequest(bad) => Failure::bad_request(bad.0),
                    EnvelopeError::UnknownMethod(name) => Failure::new(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        format!("method {name:?} is not acquire, release, throttle, peek, settle, lift or wait"),
                    ),
                })?,
            };
            call(app, request).await
        }
    }
}

async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, Failure> {
    let too_large = || {
        Failure::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", format!("body is over {MAX_BODY_BYTES} bytes"))
    };
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|e| {
        let e = e.into_inner();
        if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            too_large()
        } else {
            // A malformed chunked body, or one cut short.
            Failure::bad_request(format!("body could not be read: {e}"))
        }
    })
}

async fn call<B: Backend>(app: &App<B>, request: Request) -> Result<Response, Failure> {
    let limiter = &app.limiter;
    Ok(match request {
        Request::Acquire(req) => {
            let caller = req.key.clone();
            let acquired = limiter.acquire(req).await?;
            app.recent.record(limiter.now(), &caller, &acquired.decision);
            match &acquired.report {
                Some(report) => json(&acquire_reply_with_report(&AcquireReply::from(&acquired), report)),
                None => json(&AcquireReply::from(&acquired)),
            }
        }
        Request::Release(req) => json(&ReleaseReply { released: limiter.release(req).await? }),
        Request::Leave(req) => json(&ReleaseReply { released: limiter.leave(req).await? }),
        Request::Undo(req) => json(&ReleaseReply { released: limiter.undo(req).await? }),
        Request::Wait(req) => {
            if !limiter.keeps_waits() {
                return Err(Failure::new(StatusCode::NOT_FOUND, "not_found", "this server keeps no waits: /wait"));
            }
            let answer = limiter.wait(req).await?;
            json(&WaitReply { ready: answer.ready, gone: answer.gone, now: redb_limiter::wire::Instant(answer.now) })
        }
        Request::Peek(req) => json(&PeekReply::from(&limiter.peek(req).await?)),
        Request::Settle(req) => json(&SettleReply { settled: limiter.settle(req).await? }),
        Request::Lift(req) => {
            let key = req.key.clone();
            json(&LiftReply { key, lifted: limiter.lift(req).await? })
        }
        Request::Throttle(req) => {
            let key = req.key.clone();
            let until = limiter.throttle(req).await?;
            json(&ThrottleReply { key, until: until.map(redb_limiter::wire::Instant) })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "Bearer secret".parse().unwrap());
        assert!(authorized(b"secret", &headers));
        headers.insert(header::AUTHORIZATION, "bearer secret".parse().unwrap());
        assert!(!authorized(b"secret", &headers));
    }
}
