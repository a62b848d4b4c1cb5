//! The host side: the limiter never waits, the host does.
//!
//! - [`LimiterApi`]: the methods of the wire, implemented by the in-process [`Limiter`] (no HTTP) and
//!   by [`HttpLimiter`] (any server of the wire), so a host switches between embedded and remote
//!   by changing one value.
//! - [`Client`]: waits as a host must. On a refusal it sleeps until `retryAt` and asks again;
//!   waiters of the same request shape are served first-in first-out (a large call is never
//!   starved by smaller ones behind it), and by default the head of each shape also queues in
//!   the limiter's own line (section 12), so neither are smaller calls from other hosts;
//!   `max_wait`, `max_waiters` and cancellation by drop are honoured, also while a request is
//!   in flight: every ask carries a request id (section 16), and whatever an ask whose answer
//!   the caller stopped waiting for (or lost) may have got is undone by it, never leaked; a
//!   ticket is left, never abandoned. Each
//!   ask in the line tells the limiter what remains of `max_wait` (section 12.9), so it files no
//!   ticket for a call it could not grant in time ([`NoTicket`]).
//! - [`Permit`]: the grant as a guard that holds its places until it is dropped or released;
//!   [`Permit::settle`] sets its grant's real costs after the call.
//! - [`Client::peek`]: would a call fit now, and how full is each limit; nothing changes.
//!   [`Client::usage`] adds how many callers of the same shape wait in this process, and a
//!   refusal from [`Client::try_acquire`] carries each limit's figures and names the refusing
//!   limit's in its message.
//! - [`Client::observe_response`]: a provider's 429 or exhausted budget throttles the caller.
//! - [`warn`]: observers told when a shape's line reaches a fraction of `max_waiters`, which may
//!   turn the joining acquire away.
//! - [`estimate`]: an LLM request's token estimate before the call, its real usage from the
//!   provider's reply after it, in all or per kind (input, output, cache reads and writes) with
//!   the costs of the input, output and tokens buckets a host declares.

pub mod contract;
pub mod estimate;
mod http;
mod permit;
pub mod vendor;
pub mod warn;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use http::HttpLimiter;
pub use permit::{Permit, PermitStream};

use crate::vendor::{vendor_budget, vendor_wait};
use crate::warn::{InvalidWarnFraction, LineUsage, WarnError, Warning};
use redb_limiter::engine::{Decision, Figures, Reason, TicketNote};
use redb_limiter::limiter::{Limiter, LimiterError};
use redb_limiter::request::{
    AcquireRequest, Cost, LeaveRequest, LiftRequest, ReleaseRequest, SettleRequest, Signal, ThrottleRequest,
    UndoRequest, WaitRequest,
};
use redb_limiter::time::{Millis, wall_clock_now};

/// The answer to one `acquire`, as any limiter of the wire gives it (the permit is opaque).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Granted { at: Millis, permit: Option<String> },
    Refused(Refusal),
}

impl Outcome {
    /// An engine's (or embedded limiter's) decision, with the ticket its refusal filed or
    /// renewed, as the waiting acquire reads it.
    #[must_use]
    pub fn from_decision(decision: Decision, ticket: Option<TicketNote>) -> Outcome {
        match decision {
            Decision::Granted { at, permit } => Outcome::Granted { at, permit: permit.map(|p| p.to_string()) },
            Decision::Refused { retry_at, reason, limit } => {
                let line = ticket.map(|t| InLine {
                    ticket: t.id.to_string(),
                    lapse_at: t.lapse_at,
                    ahead: t.ahead,
                    now: t.now,
                });
                Outcome::Refused(Refusal { retry_at, reason, limit, line, no_ticket: None, figures: Vec::new() })
            }
        }
    }
}

/// A refusal: when to ask again, why, and which limit (or caller key, for a throttle); `line`
/// is the ticket it filed or renewed when the request queued (section 12), `no_ticket` why a
/// queued request got none, when the limiter said (section 12.9). `figures` holds each limit's
/// figures at the refusal, in the request's order, when the limiter reported them
/// ([`Client::try_acquire`] asks for them); [`Refusal::limit_figures`] picks the refusing one's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub retry_at: Millis,
    pub reason: Reason,
    pub limit: String,
    pub line: Option<InLine>,
    pub no_ticket: Option<NoTicket>,
    pub figures: Vec<Figures>,
}

impl Refusal {
    /// A refusal that names no ticket and reports no figures.
    #[must_use]
    pub fn new(retry_at: Millis, reason: Reason, limit: impl Into<String>) -> Self {
        Refusal { retry_at, reason, limit: limit.into(), line: None, no_ticket: None, figures: Vec::new() }
    }

    /// The figures of the limit that refused, when they were reported (none for a throttle).
    #[must_use]
    pub fn limit_figures(&self) -> Option<&Figures> {
        self.figures.iter().find(|f| f.key == self.limit)
    }
}

impl std::fmt::Display for Refusal {
    /// `refused (rate) by a/rpm until 1800000060000 (used 50, remaining 0)`: the figures are
    /// those of the refusing limit, when reported.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused ({}) by {} until {}", self.reason.as_str(), self.limit, self.retry_at)?;
        let Some(figures) = self.limit_figures() else { return Ok(()) };
        let mut parts = Vec::new();
        if let Some((used, remaining)) = figures.window {
            parts.push(format!("used {used}, remaining {remaining}"));
        }
        if let Some((level, burst)) = figures.bucket {
            parts.push(format!("level {level}, burst {burst}"));
        }
        if let Some((held, free)) = figures.places {
            parts.push(format!("held {held}, free {free}"));
        }
        if let Some(queued) = figures.queued {
            parts.push(format!("queued {queued}"));
        }
        if parts.is_empty() { Ok(()) } else { write!(f, " ({})", parts.join(", ")) }
    }
}

/// How full each limit of a request is now, and how many callers of its shape wait for it in
/// this process ([`Client::usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeUsage {
    /// The limiter's clock at the reading.
    pub now: Millis,
    /// Each limit's figures, in the request's order.
    pub limits: Vec<Figures>,
    /// What an acquire would be refused with now; `None` when it would be granted.
    pub refusal: Option<Refusal>,
    /// Callers of this request's shape inside [`Client::acquire`] in this process (the one
    /// asking included).
    pub waiting: usize,
}

/// Why a refusal in the line filed no ticket (`noTicket`, section 12.9): the engine's own type.
/// The host then waits on `retryAt` alone, asking to join the line again; a cause this client
/// does not know (a later wire) reads as none.
pub use redb_limiter::engine::NoTicket;

/// A place in the limiter's line (section 12.1): the ticket to ask again with, when it lapses
/// unless asked again, how many live tickets stand ahead of it, and the limiter's clock at the
/// decision (a host sleeps `retryAt - now` on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InLine {
    pub ticket: String,
    pub lapse_at: Millis,
    pub ahead: u64,
    pub now: Millis,
}

/// The answer to a `/wait` (section 15): the tickets ready (asked with, each would be granted
/// now) and gone (unknown, ended or lapsed); both empty when it timed out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Waited {
    pub ready: Vec<String>,
    pub gone: Vec<String>,
}

/// The bounds of a `/wait`'s timeout (section 15).
const WAIT_TIMEOUT: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));
/// How long one `/wait` of a head waits at most before it asks again.
const WAIT_ROUND: Duration = Duration::from_secs(25);

/// The answer to a `peek`: `refusal` is `None` exactly when an acquire at `now` would be
/// granted; `limits` has the figures of each limit, in the request's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekOutcome {
    pub refusal: Option<Refusal>,
    pub now: Millis,
    pub limits: Vec<Figures>,
}

impl PeekOutcome {
    #[must_use]
    pub fn fits(&self) -> bool {
        self.refusal.is_none()
    }
}

/// Why the host got no grant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// `try_acquire` only: the limiter refused (a local limit, or a throttle a provider set).
    #[error("{0}")]
    Refused(Refusal),
    /// Waited `max_wait` without a grant; `last` is the refusal that stood then (none when the
    /// time ran out in line behind earlier callers of the same shape).
    #[error("no grant within {waited_ms} ms (last refusal: {last:?})")]
    QueueTimeout { waited_ms: u64, last: Option<Refusal> },
    /// `max_waiters` callers of this shape were already waiting.
    #[error("{waiting} callers already wait for this request shape")]
    QueueFull { waiting: usize },
    /// A wait-warning observer turned the acquire away ([`Client::with_warning`]); the text is
    /// its error's.
    #[error("turned away by a wait-warning observer: {0}")]
    TurnedAway(String),
    /// The limiter says the request is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The limiter answered but cannot decide now (its store cannot commit, or it is closing).
    #[error("limiter unavailable: {0}")]
    Unavailable(String),
    /// The limiter could not be reached at all.
    #[error("limiter unreachable: {0}")]
    Unreachable(String),
    /// The limiter answered something the wire does not allow.
    #[error("unexpected answer from the limiter: {0}")]
    Protocol(String),
}

impl From<LimiterError> for ClientError {
    fn from(e: LimiterError) -> Self {
        match e {
            LimiterError::BadRequest(bad) => ClientError::BadRequest(bad.0),
            LimiterError::Unavailable(why) => ClientError::Unavailable(why),
            other => ClientError::Unavailable(other.to_string()),
        }
    }
}

/// The methods of the wire, whoever serves them.
pub trait LimiterApi: Send + Sync + 'static {
    fn acquire(&self, req: AcquireRequest) -> impl Future<Output = Result<Outcome, ClientError>> + Send;
    /// An `acquire` from a host that waits at most `max_wait` more for it (section 12.9): in the
    /// line (`queue` or a `ticket`) a remote limiter is sent it as `maxWaitMs`, and files no
    /// ticket for a request it could not grant within it (the refusal says
    /// [`NoTicket::Horizon`]). `None`: the limiter's own horizon stands. The default ignores it
    /// and asks as [`LimiterApi::acquire`] does.
    fn acquire_within(
        &self,
        req: AcquireRequest,
        max_wait: Option<Duration>,
    ) -> impl Future<Output = Result<Outcome, ClientError>> + Send {
        let _ = max_wait;
        self.acquire(req)
    }
    /// `true` when the permit was live (its places, if any, are freed).
    fn release(&self, permit: String) -> impl Future<Output = Result<bool, ClientError>> + Send;
    /// The throttle in force for `key` afterwards.
    fn throttle(&self, key: String, until: Millis) -> impl Future<Output = Result<Option<Millis>, ClientError>> + Send;
    /// Decides `req` as an acquire would, changing nothing.
    fn peek(&self, req: AcquireRequest) -> impl Future<Output = Result<PeekOutcome, ClientError>> + Send;
    /// Settles a permit's grant to `costs`: `true` when the permit was live.
    fn settle(&self, permit: String, costs: Vec<Cost>) -> impl Future<Output = Result<bool, ClientError>> + Send;
    /// Settles `costs`, then releases, in one step: `true` when the permit was live.
    fn release_with_costs(
        &self,
        permit: String,
        costs: Vec<Cost>,
    ) -> impl Future<Output = Result<bool, ClientError>> + Send;
    /// Leaves the line (`release {ticket}`, section 12.4): `true` when a live ticket left.
    fn leave(&self, ticket: String) -> impl Future<Output = Result<bool, ClientError>> + Send;
    /// Waits until one of `tickets` is ready or gone, or `timeout` (1 to 60 s) passes
    /// (`/wait`, section 15). `Ok(None)` from a limiter that keeps no waits (the default): the
    /// host then waits on `retryAt`.
    fn wait(
        &self,
        tickets: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Waited>, ClientError>> + Send {
        let _ = (tickets, timeout);
        async { Ok(None) }
    }
    /// Undoes what the acquire named `id` got (`release {id}`, section 16), settling its windows
    /// to `costs` first (0: a call never made): `true` when that changed something. A limiter
    /// without section 16 answers `BadRequest`; the default is one.
    fn undo(&self, id: String, costs: Vec<Cost>) -> impl Future<Output = Result<bool, ClientError>> + Send {
        let _ = (id, costs);
        async { Err(ClientError::BadRequest("this limiter keeps no request ids (wire section 16)".into())) }
    }
    /// Ends the throttle of `key`: `true` when one was in force.
    fn lift(&self, key: String) -> impl Future<Output = Result<bool, ClientError>> + Send;
    /// Releases a permit (settling `costs` first when there are any), telling the adaptive
    /// ceilings of its grant's buckets what its call met (section 14): `true` when the permit
    /// was live. The default refuses: a limiter that keeps no adaptive ceilings.
    fn release_outcome(
        &self,
        permit: String,
        costs: Vec<Cost>,
        outcome: Signal,
    ) -> impl Future<Output = Result<bool, ClientError>> + Send {
        let _ = (permit, costs, outcome);
        async { Err(no_ceilings()) }
    }
    /// Settles a permit's grant to `costs` and tells its adaptive ceilings what its call met
    /// (section 14): `true` when the permit was live. The default refuses, as above.
    fn settle_outcome(
        &self,
        permit: String,
        costs: Vec<Cost>,
        outcome: Signal,
    ) -> impl Future<Output = Result<bool, ClientError>> + Send {
        let _ = (permit, costs, outcome);
        async { Err(no_ceilings()) }
    }
    /// A throttle of the caller `key` that names the `permit` whose call the provider refused:
    /// a `limited` outcome for that permit's adaptive ceilings too (section 14). The default
    /// refuses, as above.
    fn throttle_permit(
        &self,
        key: String,
        until: Millis,
        permit: String,
    ) -> impl Future<Output = Result<Option<Millis>, ClientError>> + Send {
        let _ = (key, until, permit);
        async { Err(no_ceilings()) }
    }
    /// The limiter's notion of now (the host's wall clock for a remote limiter).
    fn now(&self) -> Millis {
        wall_clock_now()
    }
}

/// A release of `permit` that settles `costs` first (none: a plain release) and reports `outcome`.
pub(crate) fn release_request(
    permit: String,
    costs: Vec<Cost>,
    outcome: Signal,
) -> Result<ReleaseRequest, ClientError> {
    let req = if costs.is_empty() { ReleaseRequest::new(permit) } else { ReleaseRequest::with_costs(permit, costs) };
    Ok(req.map_err(|e| ClientError::BadRequest(e.0))?.with_outcome(outcome))
}

/// Whether a limit of `req` adapts a ceiling (section 14); if so the request asks for a permit,
/// which its outcome travels on.
fn adapts(req: &mut AcquireRequest) -> bool {
    let adapted = req.limits.iter().any(|l| l.adapt.is_some());
    req.permit |= adapted;
    adapted
}

/// What a limiter without section 14 answers an outcome with.
fn no_ceilings() -> ClientError {
    ClientError::BadRequest("this limiter keeps no adaptive ceilings (wire section 14)".into())
}

/// What a host that waits at most `max_wait` more tells the limiter as `maxWaitMs` (section
/// 12.9): only in the line (`queue` or a `ticket`), in whole milliseconds rounded up, within the
/// wire's bounds (1 ms to 24 h).
pub(crate) fn max_wait_ms(req: &AcquireRequest, max_wait: Option<Duration>) -> Option<u64> {
    let wait = max_wait.filter(|_| req.in_line())?;
    let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    Some(ms.clamp(1, redb_limiter::request::MAX_WAIT_MS))
}

impl LimiterApi for Limiter {
    async fn acquire(&self, req: AcquireRequest) -> Result<Outcome, ClientError> {
        self.acquire_within(req, None).await
    }

    async fn acquire_within(
        &self,
        mut req: AcquireRequest,
        max_wait: Option<Duration>,
    ) -> Result<Outcome, ClientError> {
        if let Some(ms) = max_wait_ms(&req, max_wait) {
            req.max_wait_ms = Some(ms);
        }
        let acquired = Limiter::acquire_reported(self, req).await?;
        let mut outcome = Outcome::from_decision(acquired.decision, acquired.ticket);
        if let Outcome::Refused(refusal) = &mut outcome {
            refusal.no_ticket = acquired.no_ticket;
            refusal.figures = acquired.report.map(|r| r.limits).unwrap_or_default();
        }
        Ok(outcome)
    }

    async fn leave(&self, ticket: String) -> Result<bool, ClientError> {
        let req = LeaveRequest::new(ticket).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Limiter::leave(self, req).await?)
    }

    async fn release(&self, permit: String) -> Result<bool, ClientError> {
        let req = ReleaseRequest::new(permit).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Limiter::release(self, req).await?)
    }

    async fn throttle(&self, key: String, until: Millis) -> Result<Option<Millis>, ClientError> {
        let req = ThrottleRequest::new(key, until, Limiter::now(self)).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Limiter::throttle(self, req).await?)
    }

    async fn peek(&self, req: AcquireRequest) -> Result<PeekOutcome, ClientError> {
        let peeked = Limiter::peek(self, req).await?;
        Ok(PeekOutcome {
            refusal: peeked.refusal.map(|r| Refusal::new(r.retry_at, r.reason, r.limit)),
            now: peeked.report.now,
            limits: peeked.report.limits,
        })
    }

    async fn settle(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let req = SettleRequest::new(permit, costs).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Limiter::settle(self, req).await?)
    }

    async fn release_with_costs(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let req = ReleaseRequest::with_costs(permit, costs).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Limiter::release(self, req).await?)
    }

    async fn lift(&self, key: String) -> Result<bool, ClientError> {
        let req = LiftRequest::new(key).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Limiter::lift(self, req).await?)
    }

    async fn release_outcome(&self, permit: String, costs: Vec<Cost>, outcome: Signal) -> Result<bool, ClientError> {
        Ok(Limiter::release(self, release_request(permit, costs, outcome)?).await?)
    }

    async fn settle_outcome(&self, permit: String, costs: Vec<Cost>, outcome: Signal) -> Result<bool, ClientError> {
        let req = SettleRequest::new(permit, costs).map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Limiter::settle(self, req.with_outcome(outcome)).await?)
    }

    async fn throttle_permit(&self, key: String, until: Millis, permit: String) -> Result<Option<Millis>, ClientError> {
        let req = ThrottleRequest::new(key, until, Limiter::now(self)).and_then(|r| r.with_permit(permit));
        Ok(Limiter::throttle(self, req.map_err(|e| ClientError::BadRequest(e.0))?).await?)
    }

    async fn undo(&self, id: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let req = UndoRequest::with_costs(id, costs);
        Ok(Limiter::undo(self, req.map_err(|e| ClientError::BadRequest(e.0))?).await?)
    }

    async fn wait(&self, tickets: Vec<String>, timeout: Duration) -> Result<Option<Waited>, ClientError> {
        let timeout_ms = timeout.clamp(WAIT_TIMEOUT.0, WAIT_TIMEOUT.1).as_millis() as u64;
        let req = WaitRequest::new(tickets, timeout_ms).map_err(|e| ClientError::BadRequest(e.0))?;
        let answer = Limiter::wait(self, req).await?;
        Ok(Some(Waited { ready: answer.ready, gone: answer.gone }))
    }

    fn now(&self) -> Millis {
        Limiter::now(self)
    }
}

/// How long one `acquire` may wait, how many may wait for the same request shape, and whether
/// it takes a place in the limiter's line.
#[derive(Debug, Clone, Copy, Default)]
pub struct AcquireOptions {
    /// Give up with `QueueTimeout` after this long (at once when the next `retryAt` lies beyond
    /// it); `None` waits as long as it takes. Each ask in the line sends what remains of it
    /// ([`LimiterApi::acquire_within`]).
    pub max_wait: Option<Duration>,
    /// Refuse at once with `QueueFull` when this many already wait for the same shape.
    pub max_waiters: Option<usize>,
    /// Wait without a ticket: do not queue in the limiter's line (section 12), only sleep until
    /// each `retryAt` and ask again, as before the line existed. Off by default: the waiting
    /// acquire queues.
    pub no_queue: bool,
}

/// One wait, as the observer hook sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitReport {
    pub waited_ms: u64,
    pub reason: Reason,
    /// The limit key (for a throttle, the caller key) whose `retryAt` was slept on.
    pub limit: String,
}

type Observer = Arc<dyn Fn(&WaitReport) + Send + Sync>;

/// The FIFO line of one request shape: a fair lock held by the head while it waits.
struct Line {
    turn: tokio::sync::Mutex<()>,
    waiting: AtomicUsize,
    /// The buckets its shape names, and the wake a release in this process that frees one of
    /// them sends its head (which then asks again at once).
    buckets: Vec<String>,
    woken: tokio::sync::Notify,
    /// The refusal the head was last told: what the line waits for, as warnings report it.
    last: Mutex<Option<Refusal>>,
    /// The latest failure of a head to get an answer (the limiter unreachable or unavailable),
    /// and when: a waiter that was already waiting then fails with it at once, rather than ask
    /// again into the same outage, so the n-th waiter never waits n timeouts.
    failure: Mutex<Option<(tokio::time::Instant, ClientError)>>,
}

impl Line {
    fn new(req: &AcquireRequest) -> Self {
        Line {
            turn: tokio::sync::Mutex::new(()),
            waiting: AtomicUsize::new(0),
            buckets: req.limits.iter().map(|l| l.key.clone()).collect(),
            woken: tokio::sync::Notify::new(),
            last: Mutex::new(None),
            failure: Mutex::new(None),
        }
    }

    fn failed(&self, e: &ClientError) {
        if matches!(e, ClientError::Unreachable(_) | ClientError::Unavailable(_)) {
            *self.failure.lock().expect("failure lock") = Some((tokio::time::Instant::now(), e.clone()));
        }
    }

    /// The failure of a head since `since`, if any.
    fn failure_since(&self, since: tokio::time::Instant) -> Option<ClientError> {
        let failure = self.failure.lock().expect("failure lock");
        failure.as_ref().filter(|(at, _)| *at >= since).map(|(_, e)| e.clone())
    }
}

/// Wakes the heads of this process's lines that name one of `buckets` (a permit let them go).
#[derive(Clone)]
pub(crate) struct LocalWake {
    lines: Arc<Mutex<HashMap<String, Arc<Line>>>>,
    buckets: Arc<[String]>,
}

impl LocalWake {
    pub(crate) fn wake(&self) {
        let lines = self.lines.lock().expect("lines lock");
        for line in lines.values() {
            if line.buckets.iter().any(|b| self.buckets.contains(b)) {
                line.woken.notify_one();
            }
        }
    }
}

/// A fresh request id (section 16): 128 random bits drawn once per process, and a counter, so
/// ids never repeat across hosts or asks.
fn request_id() -> String {
    static PREFIX: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let mut bytes = [0u8; 16];
        // Without the OS's randomness, the clock and the process id keep ids apart.
        if getrandom::fill(&mut bytes).is_err() {
            let fallback = u128::from(wall_clock_now().0) << 64 | u128::from(std::process::id());
            bytes = fallback.to_le_bytes();
        }
        u128::from_le_bytes(bytes)
    });
    format!("r-{prefix:032x}-{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// How long an undo sent in the background may take before it is given up (the grant then
/// lapses as it would have).
const UNDO_WITHIN: Duration = Duration::from_secs(5);

/// What undoes one ask: its id, and a cost of 0 for each window and token bucket it names (a
/// call never made).
struct Undo<L: LimiterApi> {
    limiter: Arc<L>,
    id: String,
    zero: Vec<Cost>,
}

impl<L: LimiterApi> Clone for Undo<L> {
    fn clone(&self) -> Self {
        Undo { limiter: self.limiter.clone(), id: self.id.clone(), zero: self.zero.clone() }
    }
}

impl<L: LimiterApi> Undo<L> {
    fn new(limiter: Arc<L>, id: String, req: &AcquireRequest) -> Self {
        let zero = req
            .limits
            .iter()
            .filter(|l| l.window.is_some() || l.bucket.is_some())
            .map(|l| Cost::new(l.key.clone(), 0))
            .collect();
        Undo { limiter, id, zero }
    }

    /// `release {id}`; where the limiter keeps no ids, gives back what `late` (an answer that
    /// came after its caller left) holds: its places, or its ticket. True when the limiter took
    /// the undo by id (then nothing the acquire gets from now on can count).
    async fn run(&self, late: Option<Outcome>) -> bool {
        let undone = tokio::time::timeout(UNDO_WITHIN, self.limiter.undo(self.id.clone(), self.zero.clone())).await;
        match undone {
            Ok(Err(ClientError::BadRequest(_))) => match late {
                Some(Outcome::Granted { permit: Some(permit), .. }) => {
                    let _ = self.limiter.release(permit).await;
                }
                Some(Outcome::Refused(Refusal { line: Some(line), .. })) => {
                    let _ = self.limiter.leave(line.ticket).await;
                }
                _ => {}
            },
            Ok(Err(e)) => tracing::warn!(error = %e, "undoing an abandoned acquire failed; what it got lapses"),
            Err(_) => tracing::warn!("undoing an abandoned acquire timed out; what it got lapses"),
            Ok(Ok(_)) => return true,
        }
        false
    }
}

/// Undoes an ask whose caller stopped waiting (its future dropped), from a spawned task; once
/// the limiter took the undo by id, the request still in flight is abandoned too (whatever it
/// gets can no longer count), so a hung server holds no task.
struct UndoOnDrop<L: LimiterApi>(Option<(Undo<L>, tokio::task::AbortHandle)>);

impl<L: LimiterApi> Drop for UndoOnDrop<L> {
    fn drop(&mut self) {
        let Some((undo, in_flight)) = self.0.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if undo.run(None).await {
                        in_flight.abort();
                    }
                });
            }
            Err(_) => tracing::warn!("an acquire dropped outside a runtime is not undone; what it got lapses"),
        }
    }
}

/// A waiting client over any [`LimiterApi`]. Cheap to clone.
pub struct Client<L: LimiterApi> {
    limiter: Arc<L>,
    lines: Arc<Mutex<HashMap<String, Arc<Line>>>>,
    observer: Option<Observer>,
    /// Called as an acquire joins a line that reached their fraction of its `max_waiters`.
    warnings: Vec<Warning>,
    /// The wait a 429 stands for when the provider names none.
    throttle_after_ms: u64,
    /// Wait on `/wait` and local wakes (section 15); off, only on each `retryAt`.
    wakes: bool,
}

impl<L: LimiterApi> Clone for Client<L> {
    fn clone(&self) -> Self {
        Client {
            limiter: self.limiter.clone(),
            lines: self.lines.clone(),
            observer: self.observer.clone(),
            warnings: self.warnings.clone(),
            throttle_after_ms: self.throttle_after_ms,
            wakes: self.wakes,
        }
    }
}

/// Waiters queue per shape: the caller key and the buckets named, whatever the costs, so a
/// large call at the head of the line is never overtaken by smaller ones for the same buckets.
fn shape_of(req: &AcquireRequest) -> String {
    let mut shape = req.key.clone();
    for l in &req.limits {
        shape.push('\u{0}');
        shape.push_str(&l.key);
    }
    shape
}

impl<L: LimiterApi> Client<L> {
    #[must_use]
    pub fn new(limiter: Arc<L>) -> Self {
        Client {
            limiter,
            lines: Arc::default(),
            observer: None,
            warnings: Vec::new(),
            throttle_after_ms: 5_000,
            wakes: true,
        }
    }

    /// Waits on each refusal's `retryAt` alone, as a host did before wake-ups (section 15): no
    /// `/wait`, no wake from a release in this process. For comparisons; on by default.
    #[must_use]
    pub fn without_wakes(mut self) -> Self {
        self.wakes = false;
        self
    }

    /// Calls `observer` after every wait.
    #[must_use]
    pub fn with_observer(mut self, observer: impl Fn(&WaitReport) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Calls `observer` as an acquire with `max_waiters` joins the line of its request shape,
    /// once the callers waiting there (the joining one included) reach `warn_fraction` of its
    /// `max_waiters`, with the line's figures. An `Err` turns that acquire away with
    /// [`ClientError::TurnedAway`], after it gave back its place in the line (it has asked the
    /// limiter nothing). Observers are called in the order they were added; an acquire past
    /// `max_waiters` is refused with `QueueFull` before any is called. `warn_fraction` is above 0
    /// and at most 1.
    pub fn with_warning(
        mut self,
        warn_fraction: f64,
        observer: impl Fn(&LineUsage) -> Result<(), WarnError> + Send + Sync + 'static,
    ) -> Result<Self, InvalidWarnFraction> {
        self.warnings.push(Warning::new(warn_fraction, observer)?);
        Ok(self)
    }

    /// The throttle a 429 without any wait in its headers or body stands for.
    #[must_use]
    pub fn with_throttle_after(mut self, wait: Duration) -> Self {
        self.throttle_after_ms = wait.as_millis() as u64;
        self
    }

    #[must_use]
    pub fn limiter(&self) -> &Arc<L> {
        &self.limiter
    }

    /// Would `req` be granted now, and how full is each of its limits? Changes nothing.
    pub async fn peek(&self, req: AcquireRequest) -> Result<PeekOutcome, ClientError> {
        self.limiter.peek(req).await
    }

    /// How full each limit of `req` is now (a peek: nothing changes), and how many callers of
    /// its shape wait for it in this process.
    pub async fn usage(&self, req: AcquireRequest) -> Result<ShapeUsage, ClientError> {
        let waiting = self.waiting(&req);
        let peeked = self.limiter.peek(req).await?;
        Ok(ShapeUsage { now: peeked.now, limits: peeked.limits, refusal: peeked.refusal, waiting })
    }

    /// How many callers of `req`'s shape (its caller key and buckets) are inside
    /// [`Client::acquire`] in this process now, the one asking included.
    #[must_use]
    pub fn waiting(&self, req: &AcquireRequest) -> usize {
        let lines = self.lines.lock().expect("lines lock");
        lines.get(&shape_of(req)).map_or(0, |line| line.waiting.load(Ordering::SeqCst))
    }

    /// Asks once; never waits. A refusal ([`ClientError::Refused`]) carries each limit's
    /// figures at that instant, and says the refusing limit's.
    pub async fn try_acquire(&self, mut req: AcquireRequest) -> Result<Permit<L>, ClientError> {
        req.report = true;
        let adapted = adapts(&mut req);
        let wake = self.local_wake(&req);
        match self.ask(req, None).await? {
            Outcome::Granted { at, permit } => {
                Ok(Permit::new(self.limiter.clone(), at, permit, Some(wake)).adapting(adapted))
            }
            Outcome::Refused(refusal) => Err(ClientError::Refused(refusal)),
        }
    }

    /// The wake a permit of `req` sends this process's waiters on its buckets when it lets them go.
    fn local_wake(&self, req: &AcquireRequest) -> LocalWake {
        LocalWake { lines: self.lines.clone(), buckets: req.limits.iter().map(|l| l.key.clone()).collect() }
    }

    /// Sleeps until `wake` (a refusal's `retryAt`), or less. Holding `ticket` on a limiter that
    /// keeps waits, until the limiter says it is ready or gone (`/wait`, section 15: a release
    /// anywhere, this process's included, wakes it within a round trip). A release in this
    /// process does not end that wait: the limiter answers it at the same change, and only when
    /// the room freed is this ticket's, where an ask at the release would be refused whenever
    /// another host's ticket stands first. Otherwise (no ticket, or a limiter without waits) until
    /// a release in this process frees room in the line's buckets. A wait is bounded by
    /// `deadline` (the caller's `max_wait`).
    async fn pause(
        &self,
        line: &Line,
        ticket: Option<&str>,
        wake: tokio::time::Instant,
        deadline: Option<tokio::time::Instant>,
    ) {
        if !self.wakes {
            tokio::time::sleep_until(wake).await;
            return;
        }
        // A release while the head's ask was in flight is kept by `woken` (a stored permit).
        let local = line.woken.notified();
        tokio::pin!(local);
        if let Some(ticket) = ticket {
            let until = deadline
                .map_or(WAIT_ROUND, |d| d.saturating_duration_since(tokio::time::Instant::now()).min(WAIT_ROUND));
            if until >= WAIT_TIMEOUT.0 {
                match self.limiter.wait(vec![ticket.to_owned()], until).await {
                    // Ready or gone: ask again now.
                    Ok(Some(w)) if !w.ready.is_empty() || !w.gone.is_empty() => return,
                    // Its time passed (retryAt too, then), it was answered at once (the limiter's
                    // bound on waits, or its shutdown), it failed, or this limiter keeps no
                    // waits: on to retryAt.
                    Ok(_) | Err(_) => {}
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = &mut local => {}
        }
    }

    /// One acquire (from a host that waits at most `max_wait` more), named by a fresh request id
    /// (section 16) unless it has one. Whatever it got is undone (`release {id}`, with costs of
    /// 0) when the caller stops waiting for the answer (the future is dropped), when the answer
    /// is lost (an error other than a bad request: the server may have decided it), or when the
    /// caller is gone by the time the answer arrives. Against a limiter without section 16, a
    /// late grant's places are released and a late ticket leaves the line instead.
    async fn ask(&self, mut req: AcquireRequest, max_wait: Option<Duration>) -> Result<Outcome, ClientError> {
        let id = req.id.get_or_insert_with(request_id).clone();
        let undo = Undo::new(self.limiter.clone(), id, &req);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let limiter = self.limiter.clone();
        let late = undo.clone();
        let task = tokio::spawn(async move {
            let outcome = limiter.acquire_within(req, max_wait).await;
            let lost = matches!(outcome, Err(ref e) if !matches!(e, ClientError::BadRequest(_)));
            match tx.send(outcome) {
                // The caller was cancelled while the answer was on its way: undo what it got.
                Err(Ok(outcome)) => {
                    late.run(Some(outcome)).await;
                }
                // The answer was lost: the server may have granted it or filed a ticket.
                Ok(()) if lost => {
                    late.run(None).await;
                }
                _ => {}
            }
        });
        let mut guard = UndoOnDrop(Some((undo, task.abort_handle())));
        let answer = rx
            .await
            .unwrap_or_else(|_| Err(ClientError::Unavailable("the acquire task ended without an answer".into())));
        guard.0 = None;
        answer
    }

    /// Waits until granted: sleeps until each refusal's `retryAt` and asks again, first in
    /// first out among callers of the same request shape. Dropping the future cancels it.
    ///
    /// Unless `options.no_queue`, the head of the shape's line also queues in the limiter's line
    /// (section 12): its first refusal files a ticket, it asks again with that ticket at each
    /// `retryAt` (sleeping `retryAt - now` on the limiter's clock), and it leaves the line
    /// (`release {ticket}`) when it gives up: at `max_wait`, on an error, or when the future is
    /// dropped (then from a spawned task). Each ask in the line sends what remains of `max_wait`
    /// (section 12.9); a refusal that files no ticket ([`Refusal::no_ticket`]) is waited out on
    /// its `retryAt` alone, or ends the wait at once when that lies past `max_wait`.
    pub async fn acquire(&self, mut req: AcquireRequest, options: AcquireOptions) -> Result<Permit<L>, ClientError> {
        adapts(&mut req);
        let shape = shape_of(&req);
        let (line, waiting) = {
            let mut lines = self.lines.lock().expect("lines lock");
            let line = lines.entry(shape.clone()).or_insert_with(|| Arc::new(Line::new(&req))).clone();
            let waiting = line.waiting.fetch_add(1, Ordering::SeqCst);
            (line, waiting)
        };
        let _count = LineCount { lines: &self.lines, shape, line: &line };
        if let Some(max) = options.max_waiters {
            if waiting >= max {
                return Err(ClientError::QueueFull { waiting });
            }
            if !self.warnings.is_empty() {
                let usage = LineUsage {
                    key: req.key.clone(),
                    limits: line.buckets.clone(),
                    waiting: waiting + 1,
                    max_waiters: max,
                    last: line.last.lock().expect("last lock").clone(),
                };
                // `_count` gives the place in the line back as this returns.
                warn::warn(&self.warnings, &usage).map_err(ClientError::TurnedAway)?;
            }
        }
        let started = tokio::time::Instant::now();
        let deadline = options.max_wait.map(|d| tokio::time::Instant::now() + d);
        let timeout =
            |last: Option<Refusal>| ClientError::QueueTimeout { waited_ms: started.elapsed().as_millis() as u64, last };
        // The head of the line holds the turn while it waits, so nobody behind overtakes it.
        let _turn = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, line.turn.lock()).await.map_err(|_| timeout(None))?,
            None => line.turn.lock().await,
        };
        // The head before it could not reach the limiter while this one waited: the same outage.
        if let Some(failure) = line.failure_since(started) {
            return Err(failure);
        }
        let mut req = req;
        if !options.no_queue && req.ticket.is_none() {
            req.queue = true;
        }
        // Leaves the limiter's line however this wait ends, but by a grant.
        let mut ticket = Ticket { limiter: self.limiter.clone(), id: req.ticket.clone() };
        let mut last: Option<Refusal> = None;
        loop {
            req.ticket.clone_from(&ticket.id);
            let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            // A fresh id for each ask: a new ask at a new retryAt (section 16).
            req.id = None;
            let asked = match deadline {
                // max_wait holds while the request is in flight too: abandoned (and undone) at it.
                Some(deadline) => match tokio::time::timeout_at(deadline, self.ask(req.clone(), left)).await {
                    Ok(asked) => asked,
                    Err(_) => return Err(timeout(last)),
                },
                None => self.ask(req.clone(), left).await,
            };
            let asked = asked.inspect_err(|e| line.failed(e));
            let refusal = match asked? {
                Outcome::Granted { at, permit } => {
                    ticket.id = None; // a grant ends the ticket
                    *line.last.lock().expect("last lock") = None;
                    let permit = Permit::new(self.limiter.clone(), at, permit, Some(self.local_wake(&req)));
                    return Ok(permit.adapting(req.permit && req.limits.iter().any(|l| l.adapt.is_some())));
                }
                Outcome::Refused(refusal) => refusal,
            };
            last = Some(refusal.clone());
            *line.last.lock().expect("last lock") = last.clone();
            // A refusal naming no ticket (a throttle before any was filed, or `no_ticket`: beyond
            // the horizon, or full lines) leaves none standing: the ticket presented, if any, is
            // no longer live, and the next ask joins the line afresh.
            ticket.id = refusal.line.as_ref().map(|l| l.ticket.clone());
            // Asks again at its retryAt on the limiter's clock: a ticket behind others is told its
            // own instant in the line (section 12.5), after those ahead of it.
            let now = match &refusal.line {
                Some(line) => line.now,
                None => self.limiter.now(),
            };
            let wait = Duration::from_millis(refusal.retry_at.since(now).max(1));
            let wake = tokio::time::Instant::now() + wait;
            if deadline.is_some_and(|d| wake > d) {
                ticket.leave().await;
                return Err(timeout(Some(refusal)));
            }
            self.pause(&line, ticket.id.as_deref(), wake, deadline).await;
            if let Some(observer) = &self.observer {
                observer(&WaitReport {
                    waited_ms: wait.as_millis() as u64,
                    reason: refusal.reason,
                    limit: refusal.limit.clone(),
                });
            }
        }
    }

    /// Reads a provider's answer for `caller_key`: a 429 throttles the caller for the wait the
    /// provider asked (`Retry-After`, `retry-after-ms`, Google's `RetryInfo`; else the default
    /// `throttle_after`), clamped to 1–120 s; a success that reports an exhausted budget
    /// (Anthropic's or OpenAI's rate-limit headers) throttles it until the reset. Returns the
    /// throttle now in force, if this answer set or met one.
    pub async fn observe_response(
        &self,
        caller_key: &str,
        status: u16,
        headers: &::http::HeaderMap,
        body: &[u8],
    ) -> Result<Option<Millis>, ClientError> {
        self.throttle_from(caller_key, status, headers, body, None).await
    }

    /// [`Client::observe_response`] for the call made under `permit`: the answer is also its
    /// outcome for adaptive ceilings (section 14). The permit keeps what [`Permit::observe`]
    /// reads (`floor`: see there) for its release, and a 429's throttle names the permit, a
    /// `limited` outcome for its buckets at once.
    pub async fn observe_response_for(
        &self,
        caller_key: &str,
        permit: &mut Permit<L>,
        status: u16,
        headers: &::http::HeaderMap,
        body: &[u8],
        floor: Option<u64>,
    ) -> Result<Option<Millis>, ClientError> {
        permit.observe(status, headers, floor);
        self.throttle_from(caller_key, status, headers, body, permit.id()).await
    }

    /// The throttle a provider's answer asks for, if any; a 429's names `permit` when given.
    async fn throttle_from(
        &self,
        caller_key: &str,
        status: u16,
        headers: &::http::HeaderMap,
        body: &[u8],
        permit: Option<&str>,
    ) -> Result<Option<Millis>, ClientError> {
        let now = self.limiter.now();
        let until = if status == 429 {
            Some(now.plus(vendor_wait(headers, body, now, self.throttle_after_ms)))
        } else if (200..300).contains(&status) {
            vendor_budget(headers, now)
        } else {
            None
        };
        match (until, permit.filter(|_| status == 429)) {
            (Some(until), Some(id)) => self.limiter.throttle_permit(caller_key.to_owned(), until, id.to_owned()).await,
            (Some(until), None) => self.limiter.throttle(caller_key.to_owned(), until).await,
            (None, _) => Ok(None),
        }
    }
}

/// Counts a waiter out of its line, however the wait ends; the last one out removes the line.
struct LineCount<'a> {
    lines: &'a Mutex<HashMap<String, Arc<Line>>>,
    shape: String,
    line: &'a Line,
}

impl Drop for LineCount<'_> {
    fn drop(&mut self) {
        // Counting in and out under the map's lock keeps a line from being removed while a
        // newcomer is joining it.
        let mut lines = self.lines.lock().expect("lines lock");
        if self.line.waiting.fetch_sub(1, Ordering::SeqCst) == 1 {
            lines.remove(&self.shape);
        }
    }
}

/// The ticket a waiting acquire holds in the limiter's line: it leaves the line when the wait
/// ends without a grant (at once when asked to, from a spawned task when dropped).
struct Ticket<L: LimiterApi> {
    limiter: Arc<L>,
    id: Option<String>,
}

impl<L: LimiterApi> Ticket<L> {
    async fn leave(&mut self) {
        if let Some(id) = self.id.take()
            && let Err(e) = self.limiter.leave(id).await
        {
            tracing::warn!(error = %e, "leaving the line failed; the ticket lapses at its lapseAt");
        }
    }
}

impl<L: LimiterApi> Drop for Ticket<L> {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else { return };
        let limiter = self.limiter.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    if let Err(e) = limiter.leave(id).await {
                        tracing::warn!(error = %e, "leaving the line failed; the ticket lapses at its lapseAt");
                    }
                });
            }
            Err(_) => tracing::warn!("a wait dropped outside a runtime does not leave the line; its ticket lapses"),
        }
    }
}
