//! The limiter: engine + store + clock, usable in-process with no HTTP.
//!
//! This file is the public API: [`Limiter`] (open, acquire, release, throttle, peek, settle,
//! lift, state, close, in async and blocking forms), its [`LimiterOptions`] and [`LimiterError`]. How a request is
//! decided, committed and answered (group commit, caller commits, the replier, reopening after
//! a failed commit) is the commit pipeline, in `pipeline.rs`; when lapsed state is forgotten is
//! [`crate::policy`].
//!
//! Requests are decided at once, in the caller's thread, under one lock around the engine. A
//! refusal, a peek or a read is answered there and then (a peek writes nothing and never waits
//! for a commit); a change (a grant, a settle, a lift, a refusal that lengthens a bucket's
//! retention) is answered only once a commit holds it durably. Fail closed: when a commit fails, nothing that was not committed is granted, and
//! the file is reopened and the engine rebuilt from it.
//!
//! The line (section 12) is decided by the engine and its changes travel the same pipeline: a
//! refusal that files a ticket, a grant that ends one and a `leave` wait for their commit; a
//! renewal or a lapse rides with the next one (it may be lost in a crash). The file keeps the
//! tickets (format version 5): after a restart, or a reopen after a failed commit, every ticket
//! not lapsed at the file's latest instant keeps its place in every line, and lapses no sooner
//! than the restart plus its grace (section 12.6), so its host can ask again in time.

mod pipeline;
mod wait;

pub use wait::{WaitAnswer, Waits};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::engine::{
    DEFAULT_LINE_HORIZON_MS, DEFAULT_RECHECK_MS, Decision, Engine, EngineConfig, Figures, NoTicket, Refusal, StateView,
    TicketNote, Totals,
};
use crate::metrics::Metrics;
use crate::request::{
    AcquireRequest, BadRequest, LeaveRequest, LiftRequest, ReleaseRequest, SettleRequest, ThrottleRequest, UndoRequest,
};
use crate::store::{Opener, Store, StoreError, file_opener};
use crate::time::{Clock, Millis, SystemClock};
use pipeline::{Command, Core, File, LogGate, Reply, Shared, Writer, finish_restore, spawn_replier};

/// Why a request got no answer from the limiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// The request is malformed; nothing changed.
    #[error("{0}")]
    BadRequest(#[from] BadRequest),
    /// The store cannot commit (or the limiter is closing): the request was not granted. When a
    /// commit failed at its final sync its change may already be in the file, so the call may
    /// still count in its windows after a restart (never more than once, never as a grant), and
    /// a throttle may or may not have closed its key.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// How to open a limiter. `Default` is the production setup.
pub struct LimiterOptions {
    /// A call refused for concurrency is told to retry at most this long after `now`.
    pub recheck_ms: u64,
    /// The line's horizon (section 12.9, `--line-horizon-ms`).
    pub line_horizon_ms: u64,
    /// Seed for permit ids; `None` draws one from the OS at every open.
    pub id_seed: Option<u64>,
    /// The clock; `None` is the system clock floored at the file's last commit.
    pub clock: Option<Arc<dyn Clock>>,
    /// How the file is opened (tests inject faults here).
    pub opener: Opener,
    /// Let a request that finds the file idle commit its own effects in the calling thread
    /// (see the module docs). Off by default: an async caller then blocks its runtime thread for
    /// the commit's fsync (and, should that commit fail, for reopening the file), which a
    /// dedicated server runtime can afford and a host's may not. Async calls commit their own
    /// only on a multi-thread Tokio runtime with two or more workers: with one, every request
    /// arriving during a caller's commit would wait for it and then commit alone as well.
    pub caller_commits: bool,
    /// At most this many `/wait`s pending at once (section 15); past it a wait answers at once.
    pub max_waits: usize,
    /// Broken on purpose, for the crash test only: answer before the commit.
    #[doc(hidden)]
    pub ack_before_commit: bool,
}

/// Default bound on pending waits: a quarter of the server's default connections.
pub const DEFAULT_MAX_WAITS: usize = 1_024;

impl Default for LimiterOptions {
    fn default() -> Self {
        LimiterOptions {
            recheck_ms: DEFAULT_RECHECK_MS,
            line_horizon_ms: DEFAULT_LINE_HORIZON_MS,
            id_seed: None,
            clock: None,
            opener: file_opener(),
            caller_commits: false,
            max_waits: DEFAULT_MAX_WAITS,
            ack_before_commit: false,
        }
    }
}

impl std::fmt::Debug for LimiterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterOptions")
            .field("recheck_ms", &self.recheck_ms)
            .field("line_horizon_ms", &self.line_horizon_ms)
            .field("caller_commits", &self.caller_commits)
            .finish_non_exhaustive()
    }
}

/// The figures of a request's limits at the limiter's `now` (section 9.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    pub now: Millis,
    /// One entry per limit of the request, in its order.
    pub limits: Vec<Figures>,
}

/// An acquire's answer: the decision, the figures after it when the request asked with
/// `report`, and on a refusal the ticket it filed or renewed (section 12), if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquired {
    pub decision: Decision,
    pub report: Option<Report>,
    pub ticket: Option<TicketNote>,
    /// Why a refusal in the line filed no ticket (section 12.9).
    pub no_ticket: Option<NoTicket>,
}

/// A peek's answer: `refusal` is `None` exactly when an acquire at `report.now` would be granted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Peeked {
    pub refusal: Option<Refusal>,
    pub report: Report,
}

impl Peeked {
    #[must_use]
    pub fn fits(&self) -> bool {
        self.refusal.is_none()
    }
}

/// A snapshot of the live state.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub now: Millis,
    pub view: StateView,
    pub totals: Totals,
}

/// One page of the state (see [`Limiter::state_page`]).
#[derive(Debug, Clone)]
pub struct StatePage {
    pub snapshot: Snapshot,
    /// More buckets, permits or throttles may follow the page's last keys.
    pub truncated: bool,
}

/// The durable limiter. Cheap to share behind an `Arc`; dropping it (or [`Limiter::close`])
/// commits what is queued, answers every waiting request and closes the file.
pub struct Limiter {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
    path: PathBuf,
    started: Instant,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").field("path", &self.path).finish_non_exhaustive()
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.finish()
}

impl Limiter {
    /// Opens (creating when missing) the file at `path` with the production setup.
    pub fn open(path: impl AsRef<Path>) -> Result<Limiter, StoreError> {
        Limiter::open_with(path, LimiterOptions::default())
    }

    /// Opens the file at `path`: refuses a corrupt, foreign, unknown-version or busy file,
    /// rebuilds the engine, prunes what lapsed while closed, and starts the writer thread.
    pub fn open_with(path: impl AsRef<Path>, options: LimiterOptions) -> Result<Limiter, StoreError> {
        let path = std::path::absolute(path.as_ref()).unwrap_or_else(|_| path.as_ref().to_path_buf());
        let mut store = Store::open(&path, &options.opener)?;
        let config = EngineConfig {
            recheck_ms: options.recheck_ms,
            id_seed: options.id_seed.unwrap_or_else(random_seed),
            line_horizon_ms: options.line_horizon_ms,
        };
        let mut engine = Engine::new(config);
        if options.id_seed.is_none() {
            engine.draw_permit_key().map_err(|cause| StoreError::Io { path: path.clone(), cause })?;
        }
        let floor = store.load(&mut engine)?;
        let clock: Arc<dyn Clock> = match options.clock {
            Some(clock) => clock,
            None => Arc::new(SystemClock::new(floor)),
        };
        let now = floor.max(clock.now());
        finish_restore(&mut store, &mut engine, floor, now)?;
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                effects: Vec::new(),
                waiting: Vec::new(),
                last_now: now,
                deferred_since: None,
                broken: None,
                lost: false,
                failing: None,
                closing: false,
                committing: false,
                last_batch: 0,
                writer_sleeps_until: None,
                waits: wait::Waits::default(),
            }),
            wake: Condvar::new(),
            file: Mutex::new(File { store: Some(store), path: path.clone(), opener: options.opener, config }),
            clock,
            metrics: Arc::new(Metrics::default()),
            caller_commits: options.caller_commits,
            ack_before_commit: options.ack_before_commit,
            replier: OnceLock::new(),
            max_waits: options.max_waits,
            waits_ended: std::sync::atomic::AtomicBool::new(false),
            log_gate: Mutex::new(LogGate::default()),
        });
        let writer = Writer { shared: shared.clone(), file_checked: Instant::now() };
        let worker = std::thread::Builder::new()
            .name("redb-limiter-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::Io { path: path.clone(), cause: e })?;
        Ok(Limiter { shared, worker: Some(worker), path, started: Instant::now() })
    }

    /// The file this limiter serves (absolute).
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The limiter's clock reading (never behind the file's last commit).
    #[must_use]
    pub fn now(&self) -> Millis {
        self.shared.clock.now()
    }

    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// Why the store cannot commit now (its last commit failed, or the file cannot be reopened),
    /// or `None` while it can. Requests meanwhile are answered `Unavailable`.
    #[must_use]
    pub fn outage(&self) -> Option<String> {
        let core = self.shared.lock();
        core.broken.clone().or_else(|| core.failing.clone())
    }

    #[must_use]
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    fn send<T>(
        &self,
        direct: bool,
        may_commit: bool,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> oneshot::Receiver<Result<T, LimiterError>> {
        let (reply, rx) = oneshot::channel();
        self.shared.submit(make(reply), direct, may_commit);
        rx
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, LimiterError> {
        let runtime = tokio::runtime::Handle::try_current().ok();
        let replier = &self.shared.replier;
        if replier.get().is_none()
            && let Some(runtime) = &runtime
        {
            // Two first calls racing may both spawn one; the loser's ends at once.
            let _ = replier.set(spawn_replier(runtime, self.shared.metrics.clone()));
        }
        let direct = replier.get().is_none();
        // A caller blocked in its commit must leave another runtime thread to take the requests
        // that arrive meanwhile; on a runtime with one thread they would each commit alone.
        let may_commit = self.shared.caller_commits
            && runtime.is_some_and(|runtime| {
                runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
                    && runtime.metrics().num_workers() > 1
            });
        self.send(direct, may_commit, make).await.unwrap_or_else(|_| Err(closed()))
    }

    fn ask_blocking<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, LimiterError> {
        self.send(true, self.shared.caller_commits, make).blocking_recv().unwrap_or_else(|_| Err(closed()))
    }

    /// Decides an acquire; a grant (or a refusal that lengthens a bucket's retention or files a
    /// ticket) is answered only once it is durable. A request with `queue` or a `ticket` takes
    /// part in the line; the ticket a refusal names is in [`Limiter::acquire_reported`]'s answer.
    pub async fn acquire(&self, req: AcquireRequest) -> Result<Decision, LimiterError> {
        self.ask(|r| Command::Acquire(req, r)).await.map(|a| a.decision)
    }

    /// [`Limiter::acquire`] with the figures after the decision when `req.report` is set.
    pub async fn acquire_reported(&self, req: AcquireRequest) -> Result<Acquired, LimiterError> {
        self.ask(|r| Command::Acquire(req, r)).await
    }

    /// Releases a permit (settling `req.costs` first, in the same commit): `true` when it was
    /// live. A cost naming a bucket that was not a window of its grant is a `BadRequest`.
    pub async fn release(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        self.ask(|r| Command::Release(req, r)).await
    }

    /// Leaves the line (`release {ticket}`, section 12.4): `true` when a live ticket left its
    /// lines; answered once durable.
    pub async fn leave(&self, req: LeaveRequest) -> Result<bool, LimiterError> {
        self.ask(|r| Command::Leave(req, r)).await
    }

    /// Undoes what the acquire named `req.id` got (`release {id}`, section 16): its places freed,
    /// its ticket out of the line, with `costs` its windows settled. `true` when it changed
    /// something; an id never seen is remembered as released (`false`). Answered once durable.
    pub async fn undo(&self, req: UndoRequest) -> Result<bool, LimiterError> {
        self.ask(|r| Command::Undo(req, r)).await
    }

    /// [`Limiter::undo`] for threads outside an async runtime.
    pub fn undo_blocking(&self, req: UndoRequest) -> Result<bool, LimiterError> {
        self.ask_blocking(|r| Command::Undo(req, r))
    }

    /// [`Limiter::leave`] for threads outside an async runtime.
    pub fn leave_blocking(&self, req: LeaveRequest) -> Result<bool, LimiterError> {
        self.ask_blocking(|r| Command::Leave(req, r))
    }

    /// Decides `req` as an acquire would now, changing nothing; answered at once.
    pub async fn peek(&self, req: AcquireRequest) -> Result<Peeked, LimiterError> {
        self.ask(|r| Command::Peek(req, r)).await
    }

    /// Settles a permit's grant to its real costs: `true` when the permit was live; answered
    /// once durable.
    pub async fn settle(&self, req: SettleRequest) -> Result<bool, LimiterError> {
        self.ask(|r| Command::Settle(req, r)).await
    }

    /// Ends a caller's throttle now: `true` when one was in force; answered once durable.
    pub async fn lift(&self, req: LiftRequest) -> Result<bool, LimiterError> {
        self.ask(|r| Command::Lift(req, r)).await
    }

    /// Throttles a caller (only ever extends); returns the throttle in force. `until` more than
    /// 24 hours after the limiter's now is a `BadRequest`.
    pub async fn throttle(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        self.ask(|reply| Command::Throttle { key: req.key, until: req.until, permit: req.permit, reply }).await
    }

    /// The live state whose keys start with `prefix`.
    pub async fn state(&self, prefix: &str) -> Result<Snapshot, LimiterError> {
        self.ask(|reply| Command::State { prefix: prefix.to_owned(), reply }).await
    }

    /// At most `limit` live buckets, permits and throttles each whose keys start with `prefix`
    /// and sort after `after`, in key order (a permit's key is its id). Built without holding
    /// up decisions for more than a moment: one pass over the keys keeps the lowest (see
    /// [`Engine::page_keys`]) and only the page's views are built; nothing is serialized here.
    pub fn state_page(&self, prefix: &str, after: &str, limit: usize) -> Result<StatePage, LimiterError> {
        let limit = limit.max(1);
        let mut core = self.shared.lock();
        if let Some(why) = core.broken.clone().or_else(|| core.closing.then(|| "the limiter is closed".to_owned())) {
            return Err(LimiterError::Unavailable(why));
        }
        let now = self.shared.now(&mut core);
        // Twice the page, so that keys idle by now seldom shorten it.
        let keys = core.engine.page_keys(prefix, after, limit.saturating_mul(2));
        let (view, truncated) = core.engine.view_page(now, prefix, &keys, limit);
        let totals = core.engine.totals();
        drop(core);
        Ok(StatePage { snapshot: Snapshot { now, view, totals }, truncated })
    }

    /// [`Limiter::acquire`] for threads outside an async runtime.
    pub fn acquire_blocking(&self, req: AcquireRequest) -> Result<Decision, LimiterError> {
        self.ask_blocking(|r| Command::Acquire(req, r)).map(|a| a.decision)
    }

    /// [`Limiter::acquire_reported`] for threads outside an async runtime.
    pub fn acquire_reported_blocking(&self, req: AcquireRequest) -> Result<Acquired, LimiterError> {
        self.ask_blocking(|r| Command::Acquire(req, r))
    }

    /// [`Limiter::peek`] for threads outside an async runtime.
    pub fn peek_blocking(&self, req: AcquireRequest) -> Result<Peeked, LimiterError> {
        self.ask_blocking(|r| Command::Peek(req, r))
    }

    /// [`Limiter::settle`] for threads outside an async runtime.
    pub fn settle_blocking(&self, req: SettleRequest) -> Result<bool, LimiterError> {
        self.ask_blocking(|r| Command::Settle(req, r))
    }

    /// [`Limiter::lift`] for threads outside an async runtime.
    pub fn lift_blocking(&self, req: LiftRequest) -> Result<bool, LimiterError> {
        self.ask_blocking(|r| Command::Lift(req, r))
    }

    /// [`Limiter::release`] for threads outside an async runtime.
    pub fn release_blocking(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        self.ask_blocking(|r| Command::Release(req, r))
    }

    /// [`Limiter::throttle`] for threads outside an async runtime.
    pub fn throttle_blocking(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        self.ask_blocking(|reply| Command::Throttle { key: req.key, until: req.until, permit: req.permit, reply })
    }

    /// [`Limiter::state`] for threads outside an async runtime.
    pub fn state_blocking(&self, prefix: &str) -> Result<Snapshot, LimiterError> {
        self.ask_blocking(|reply| Command::State { prefix: prefix.to_owned(), reply })
    }

    /// Commits what is queued, answers every waiting request, and closes the file.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        {
            let mut core = self.shared.lock();
            core.closing = true;
            // Pending waits answer now, with their lists as they stand.
            core.waits.wake_all();
        }
        self.shared.wake.notify_one();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn closed() -> LimiterError {
    LimiterError::Unavailable("the limiter is closed".into())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::time::FakeClock;

    const T0: Millis = Millis(1_764_460_800_000);

    /// A throttle that finds a longer one in force reports it only once that one is durable:
    /// with the file held, so the first throttle's commit cannot end, the second gets no answer.
    #[test]
    fn a_throttle_reply_waits_for_the_commit_of_the_throttle_it_reports() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FakeClock::new(T0));
        let options = LimiterOptions { clock: Some(clock), id_seed: Some(1), ..LimiterOptions::default() };
        let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap());
        let throttle = |until: Millis| {
            let (tx, rx) = mpsc::channel();
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                let _ = tx.send(limiter.throttle_blocking(ThrottleRequest::new("caller", until, T0).unwrap()));
            });
            rx
        };
        let held = limiter.shared.lock_file();
        let first = throttle(T0.plus(60_000));
        while !limiter.shared.lock().committing {
            std::thread::sleep(Duration::from_millis(1));
        }
        let second = throttle(T0.plus(1_000));
        assert!(second.recv_timeout(Duration::from_millis(200)).is_err(), "answered before the commit it reports");
        drop(held);
        assert_eq!(first.recv().unwrap(), Ok(Some(T0.plus(60_000))));
        assert_eq!(second.recv().unwrap(), Ok(Some(T0.plus(60_000))));
    }

    /// A peek never waits for a commit: with the file held, so a grant's commit cannot end, a
    /// peek is answered at once (and sees the grant decided on top, as a refusal would), while a
    /// settle, a lift and a refusal that lengthens a retention wait for their commits.
    #[test]
    fn a_peek_never_waits_for_a_commit_and_changes_wait_for_theirs() {
        use crate::request::{Cost, LiftRequest, Limit, SettleRequest};
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FakeClock::new(T0));
        let options = LimiterOptions { clock: Some(clock), id_seed: Some(1), ..LimiterOptions::default() };
        let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap());
        let short = AcquireRequest::new("caller", vec![Limit::window("b", 2, 500).with_cost(2)]).unwrap().with_permit();
        let Decision::Granted { permit: Some(permit), .. } = limiter.acquire_blocking(short.clone()).unwrap() else {
            panic!("granted with a permit")
        };
        limiter.throttle_blocking(ThrottleRequest::new("closed", T0.plus(9_000), T0).unwrap()).unwrap();
        let in_thread = |f: Box<dyn FnOnce(&Limiter) -> String + Send>| {
            let (tx, rx) = mpsc::channel();
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                let _ = tx.send(f(&limiter));
            });
            rx
        };
        let held = limiter.shared.lock_file();
        let other = AcquireRequest::new("caller", vec![Limit::window("x", 1, 500)]).unwrap();
        let grant = in_thread(Box::new(move |l| format!("{:?}", l.acquire_blocking(other))));
        while !limiter.shared.lock().committing {
            std::thread::sleep(Duration::from_millis(1));
        }
        let peeked = limiter.peek_blocking(short.clone()).unwrap();
        assert_eq!(peeked.refusal.map(|r| r.reason), Some(crate::engine::Reason::Rate));
        let settle = SettleRequest::new(permit.to_string(), vec![Cost::new("b", 1)]).unwrap();
        let settled = in_thread(Box::new(move |l| format!("{:?}", l.settle_blocking(settle))));
        let lifted = in_thread(Box::new(|l| format!("{:?}", l.lift_blocking(LiftRequest::new("closed").unwrap()))));
        // Refused whether it is decided before the settle or after it (2 + 2 > 2, 1 + 2 > 2).
        let long = AcquireRequest::new("caller", vec![Limit::window("b", 2, 60_000).with_cost(2)]).unwrap();
        let lengthened = in_thread(Box::new(move |l| format!("{:?}", l.acquire_blocking(long))));
        for waiting in [&settled, &lifted, &lengthened] {
            assert!(waiting.recv_timeout(Duration::from_millis(100)).is_err(), "answered before its commit");
        }
        assert!(limiter.peek_blocking(short).unwrap().report.limits[0].window.is_some());
        drop(held);
        assert!(grant.recv().unwrap().starts_with("Ok(Granted"));
        assert_eq!(settled.recv().unwrap(), "Ok(true)");
        assert_eq!(lifted.recv().unwrap(), "Ok(true)");
        assert!(lengthened.recv().unwrap().starts_with("Ok(Refused"));
    }

    /// Section 12.6 through the pipeline: a refusal that files a ticket is answered once its
    /// commit holds it; a renewal of that ticket may be lost in a crash, so it does not wait
    /// for one; a ticket bound to another request is a bad request; `leave` ends it.
    #[test]
    fn a_filing_waits_for_its_commit_and_a_renewal_does_not() {
        use crate::request::{LeaveRequest, Limit};
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FakeClock::new(T0));
        let options = LimiterOptions { clock: Some(clock), id_seed: Some(1), ..LimiterOptions::default() };
        let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap());
        let r = AcquireRequest::new("caller", vec![Limit::window("b", 1, 60_000)]).unwrap();
        assert!(limiter.acquire_blocking(r.clone()).unwrap().is_granted());
        let held = limiter.shared.lock_file();
        let queued = r.clone().with_queue();
        let filing = {
            let (tx, rx) = mpsc::channel();
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                let _ = tx.send(limiter.acquire_reported_blocking(queued));
            });
            rx
        };
        assert!(filing.recv_timeout(Duration::from_millis(200)).is_err(), "a filing answered before its commit");
        drop(held);
        let filed = filing.recv().unwrap().unwrap();
        assert!(!filed.decision.is_granted());
        let note = filed.ticket.expect("a ticket filed");
        assert_eq!(note.now, T0);
        // With the file held again, a renewal is answered at once.
        let held = limiter.shared.lock_file();
        let again = r.clone().with_ticket(note.id.to_string()).unwrap();
        let renewed = limiter.acquire_reported_blocking(again.clone()).unwrap();
        assert_eq!(renewed.ticket.map(|t| t.id), Some(note.id));
        drop(held);
        let other = AcquireRequest::new("caller", vec![Limit::window("b", 2, 60_000)]).unwrap();
        let bad = limiter.acquire_reported_blocking(other.with_ticket(note.id.to_string()).unwrap());
        assert!(matches!(bad, Err(LimiterError::BadRequest(ref e)) if e.0.starts_with("ticket ")), "{bad:?}");
        assert!(limiter.leave_blocking(LeaveRequest::new(note.id.to_string()).unwrap()).unwrap());
        assert!(!limiter.leave_blocking(LeaveRequest::new(note.id.to_string()).unwrap()).unwrap());
        // Without the line the answers are those of before: no ticket.
        assert_eq!(limiter.acquire_reported_blocking(r).unwrap().ticket, None);
    }
}
