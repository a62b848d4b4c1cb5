//! The seam between the wire and whatever decides: one trait that the server talks to, with
//! the embedded [`Limiter`] (one redb file) as one implementation and PostgreSQL mode (the crate
//! `redb-limiter-postgres`) as another. Requests arrive validated; answers are the engine's
//! types, so the server, the wire's reply bodies and the contract suite are shared.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use crate::limiter::{Acquired, Limiter, LimiterError, Peeked, StatePage, WaitAnswer};
use crate::metrics::Metrics;
use crate::request::{
    AcquireRequest, LeaveRequest, LiftRequest, ReleaseRequest, SettleRequest, ThrottleRequest, UndoRequest, WaitRequest,
};
use crate::time::Millis;

/// Every method of the wire, whoever decides it.
pub trait Backend: Send + Sync + 'static {
    /// `"redb"` or `"postgres"`, as `/health` names it.
    fn kind(&self) -> &'static str;
    /// The file served, for a backend that has one.
    fn path(&self) -> Option<&Path>;
    /// Why nothing can be committed now, if so (`/health` answers 503 with it).
    fn outage(&self) -> impl Future<Output = Option<String>> + Send;
    /// The clock requests are judged against (the throttle bound, the feed's instants).
    fn now(&self) -> Millis;
    fn uptime(&self) -> Duration;
    fn metrics(&self) -> &Metrics;

    /// An acquire, with the figures after it when the request asked for a report.
    fn acquire(&self, req: AcquireRequest) -> impl Future<Output = Result<Acquired, LimiterError>> + Send;
    fn peek(&self, req: AcquireRequest) -> impl Future<Output = Result<Peeked, LimiterError>> + Send;
    fn release(&self, req: ReleaseRequest) -> impl Future<Output = Result<bool, LimiterError>> + Send;
    /// `release {ticket}` (section 12.4): `true` when a live ticket left its lines. A backend
    /// that keeps no line knows no ticket: every one is unknown.
    fn leave(&self, req: LeaveRequest) -> impl Future<Output = Result<bool, LimiterError>> + Send {
        let _ = req;
        async { Ok(false) }
    }
    /// `release {id}` (section 16): undoes what the acquire named `req.id` got.
    fn undo(&self, req: UndoRequest) -> impl Future<Output = Result<bool, LimiterError>> + Send;
    fn settle(&self, req: SettleRequest) -> impl Future<Output = Result<bool, LimiterError>> + Send;
    fn throttle(&self, req: ThrottleRequest) -> impl Future<Output = Result<Option<Millis>, LimiterError>> + Send;
    fn lift(&self, req: LiftRequest) -> impl Future<Output = Result<bool, LimiterError>> + Send;
    /// Whether it keeps waits (section 15); the server answers `/wait` with 404 when not.
    fn keeps_waits(&self) -> bool {
        false
    }
    /// `/wait` (section 15), for a backend that [keeps waits](Backend::keeps_waits).
    fn wait(&self, req: WaitRequest) -> impl Future<Output = Result<WaitAnswer, LimiterError>> + Send {
        let _ = req;
        async { Err(LimiterError::Unavailable("this backend keeps no waits (wire section 15)".into())) }
    }
    /// Answers every pending wait at once, and every later one (the server's SIGTERM).
    fn end_waits(&self) {}
    /// One page of the live state (section 8's `/state`).
    fn state_page(
        &self,
        prefix: String,
        after: String,
        limit: usize,
    ) -> impl Future<Output = Result<StatePage, LimiterError>> + Send;
}

impl Backend for std::sync::Arc<Limiter> {
    fn kind(&self) -> &'static str {
        "redb"
    }
    fn path(&self) -> Option<&Path> {
        Some(Limiter::path(self))
    }
    async fn outage(&self) -> Option<String> {
        Limiter::outage(self)
    }
    fn now(&self) -> Millis {
        Limiter::now(self)
    }
    fn uptime(&self) -> Duration {
        Limiter::uptime(self)
    }
    fn metrics(&self) -> &Metrics {
        Limiter::metrics(self)
    }
    async fn acquire(&self, req: AcquireRequest) -> Result<Acquired, LimiterError> {
        self.acquire_reported(req).await
    }
    async fn peek(&self, req: AcquireRequest) -> Result<Peeked, LimiterError> {
        Limiter::peek(self, req).await
    }
    async fn release(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        Limiter::release(self, req).await
    }
    async fn leave(&self, req: LeaveRequest) -> Result<bool, LimiterError> {
        Limiter::leave(self, req).await
    }
    async fn undo(&self, req: UndoRequest) -> Result<bool, LimiterError> {
        Limiter::undo(self, req).await
    }
    async fn settle(&self, req: SettleRequest) -> Result<bool, LimiterError> {
        Limiter::settle(self, req).await
    }
    async fn throttle(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        Limiter::throttle(self, req).await
    }
    async fn lift(&self, req: LiftRequest) -> Result<bool, LimiterError> {
        Limiter::lift(self, req).await
    }
    fn keeps_waits(&self) -> bool {
        true
    }
    async fn wait(&self, req: WaitRequest) -> Result<WaitAnswer, LimiterError> {
        Limiter::wait(self, req).await
    }
    fn end_waits(&self) {
        Limiter::end_waits(self);
    }
    async fn state_page(&self, prefix: String, after: String, limit: usize) -> Result<StatePage, LimiterError> {
        // Built under the engine's lock: off the async threads.
        let limiter = self.clone();
        tokio::task::spawn_blocking(move || Limiter::state_page(&limiter, &prefix, &after, limit))
            .await
            .map_err(|e| LimiterError::Unavailable(format!("reading the state failed: {e}")))?
    }
}

/// A shared backend is a backend (PostgreSQL mode shares its limiter with its sweeper).
impl<B: Backend> Backend for std::sync::Arc<B> {
    fn kind(&self) -> &'static str {
        B::kind(self)
    }
    fn path(&self) -> Option<&Path> {
        B::path(self)
    }
    async fn outage(&self) -> Option<String> {
        B::outage(self).await
    }
    fn now(&self) -> Millis {
        B::now(self)
    }
    fn uptime(&self) -> Duration {
        B::uptime(self)
    }
    fn metrics(&self) -> &Metrics {
        B::metrics(self)
    }
    async fn acquire(&self, req: AcquireRequest) -> Result<Acquired, LimiterError> {
        B::acquire(self, req).await
    }
    async fn peek(&self, req: AcquireRequest) -> Result<Peeked, LimiterError> {
        B::peek(self, req).await
    }
    async fn release(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        B::release(self, req).await
    }
    async fn leave(&self, req: LeaveRequest) -> Result<bool, LimiterError> {
        B::leave(self, req).await
    }
    async fn undo(&self, req: UndoRequest) -> Result<bool, LimiterError> {
        B::undo(self, req).await
    }
    async fn settle(&self, req: SettleRequest) -> Result<bool, LimiterError> {
        B::settle(self, req).await
    }
    async fn throttle(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        B::throttle(self, req).await
    }
    async fn lift(&self, req: LiftRequest) -> Result<bool, LimiterError> {
        B::lift(self, req).await
    }
    fn keeps_waits(&self) -> bool {
        B::keeps_waits(self)
    }
    async fn wait(&self, req: WaitRequest) -> Result<WaitAnswer, LimiterError> {
        B::wait(self, req).await
    }
    fn end_waits(&self) {
        B::end_waits(self);
    }
    async fn state_page(&self, prefix: String, after: String, limit: usize) -> Result<StatePage, LimiterError> {
        B::state_page(self, prefix, after, limit).await
    }
}
