//! The commit pipeline: how a decided request reaches the file and its answer reaches the caller.
//!
//! Requests are decided at once, in the caller's thread, under one lock around the engine.
//! A decision that changes nothing (a refusal, a peek, a read, a settle of an unknown permit) is
//! answered there and then. A decision that changes something (a grant, a release, a throttle,
//! a settle, a lift, and the one refusal that writes: one that lengthens a bucket's retention)
//! leaves its effects in a queue and waits: one writer thread takes every
//! effect queued so far, commits them all in one durable transaction (group commit), and only
//! then answers the requests that made them. While that commit is in flight, new requests are
//! decided on top of it and queue for the next one, so throughput under concurrency is not one
//! fsync per request, and a refusal never waits for an fsync.
//!
//! Fail closed: when a commit fails, every request waiting for it, and every request decided on
//! top of it since, is answered `Unavailable`; the file is reopened and the engine rebuilt from
//! it (the last committed state). Nothing that was not committed is ever granted. A refusal
//! decided on top of an uncommitted grant errs on the safe side. The writer also sweeps lapsed
//! state at the engine's deadlines, at most every [`SWEEP_GRAIN_MS`] (a request sweeps for
//! itself before deciding, so these sweeps only tidy); what a sweep alone forgets rides along
//! with the next commit a request needs (or waits at most [`MAX_DEFERRED_MS`]; see
//! [`crate::policy`]), since a reopen prunes it again.
//!
//! The answers a commit releases to async callers go back through one task (the replier) on the
//! runtime of the first async call, handed all at once: that wakes the runtime once per commit
//! instead of once per answer. Blocking calls, async calls made outside a Tokio runtime, and
//! commits releasing fewer than `REPLIER_MIN_ANSWERS` such answers are answered by the writer
//! itself.
//!
//! With [`LimiterOptions::caller_commits`](super::LimiterOptions::caller_commits), while
//! requests come one at a time (the last commit answered at most one), a request that finds no commit in flight and nothing queued commits its
//! own effects in the calling thread instead of waking the writer: that saves two thread
//! hand-offs per request. Requests that arrive meanwhile queue for the writer as before. At most
//! one commit is in flight at a time, whoever makes it (`Core::committing`); the file sits behind
//! its own lock, taken by that committer (and by the writer to reopen the file or close it).

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::wait::Waits;
use super::{Acquired, LimiterError, Peeked, Report, Snapshot, random_seed};
use crate::engine::{Decision, Effect, Engine, EngineConfig, Settled, StateView, TicketEnd, Totals};
use crate::metrics::Metrics;
use crate::policy::{MAX_DEFERRED_EFFECTS, MAX_DEFERRED_MS, SWEEP_GRAIN_MS};
use crate::request::{
    AcquireRequest, BadRequest, LeaveRequest, LiftRequest, ReleaseRequest, SettleRequest, Signal, ThrottleRequest,
    UndoRequest,
};
use crate::store::{Opener, Store, StoreError};
use crate::time::{Clock, Millis};

/// Fewest async answers one commit hands to the replier (fewer are sent one by one).
const REPLIER_MIN_ANSWERS: usize = 4;
/// How long the writer waits before trying again to reopen a file whose commit failed.
const REOPEN_BACKOFF: Duration = Duration::from_millis(100);
/// How often the writer checks that the file at the path is still the one it has open (a file
/// deleted or replaced while serving is noticed within a second).
const FILE_CHECK_EVERY: Duration = Duration::from_millis(500);

pub(super) type Reply<T> = oneshot::Sender<Result<T, LimiterError>>;

pub(super) enum Command {
    Acquire(AcquireRequest, Reply<Acquired>),
    Release(ReleaseRequest, Reply<bool>),
    Leave(LeaveRequest, Reply<bool>),
    /// `release {id}` (section 16).
    Undo(UndoRequest, Reply<bool>),
    Peek(AcquireRequest, Reply<Peeked>),
    Settle(SettleRequest, Reply<bool>),
    Lift(LiftRequest, Reply<bool>),
    Throttle {
        key: String,
        until: Millis,
        /// The permit whose call was limited (section 14), if named.
        permit: Option<String>,
        reply: Reply<Option<Millis>>,
    },
    State {
        prefix: String,
        reply: Reply<Snapshot>,
    },
}

/// An answer held until its commit, and whether the writer sends it itself (`direct`) or hands
/// it to the replier.
pub(super) struct Waiting {
    pub(super) answer: Answer,
    pub(super) direct: bool,
}

/// Hands the answers of one commit to the replier task.
pub(super) type Replier = tokio::sync::mpsc::UnboundedSender<Vec<Answer>>;

/// Spawns the replier on `runtime`: it sends every answer it is handed, and ends when the
/// limiter is gone.
pub(super) fn spawn_replier(runtime: &tokio::runtime::Handle, metrics: Arc<Metrics>) -> Replier {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Answer>>();
    runtime.spawn(async move {
        while let Some(answers) = rx.recv().await {
            for answer in answers {
                answer.send(&metrics);
            }
        }
    });
    tx
}

/// What the engine's lock guards: the engine and what it decided but the file does not hold yet.
pub(super) struct Core {
    pub(super) engine: Engine,
    /// Effects decided and not yet handed to a commit.
    pub(super) effects: Vec<Effect>,
    /// Answers held until `effects` are committed.
    pub(super) waiting: Vec<Waiting>,
    /// The latest `now` used; never runs backwards, and is the floor the next commit records.
    pub(super) last_now: Millis,
    /// Since when `effects` holds only a sweep's effects, waiting to ride a request's commit.
    pub(super) deferred_since: Option<Millis>,
    /// Why nothing can be decided now (a failed commit, until the file is reopened).
    pub(super) broken: Option<String>,
    /// The file was deleted or replaced while open: `broken` for good, never reopened (that
    /// would start from an empty file and forget what was granted).
    pub(super) lost: bool,
    /// Why the last commit failed, until one succeeds: the store cannot commit (an outage,
    /// which `/health` reports), even when the file reopened.
    pub(super) failing: Option<String>,
    pub(super) closing: bool,
    /// A commit is in flight (the writer's or a caller's); the next waits for it.
    pub(super) committing: bool,
    /// How many requests the last commit answered.
    pub(super) last_batch: usize,
    /// Until when the writer is parked (`Millis(u64::MAX)`: until woken); `None` while it runs.
    pub(super) writer_sleeps_until: Option<Millis>,
    /// The pending `/wait`s (section 15, `wait.rs`).
    pub(super) waits: Waits,
}

impl Core {
    /// Forgets what lapsed by `now`. What that changes in the file waits for the next commit a
    /// request needs (see [`MAX_DEFERRED_MS`]).
    pub(super) fn sweep(&mut self, now: Millis) {
        let before = self.effects.len();
        self.engine.sweep(now, &mut self.effects);
        if self.effects.len() > before && self.waiting.is_empty() {
            self.deferred_since.get_or_insert(now);
        }
        self.wake_waits();
    }

    /// Wakes the waits registered under the keys where the engine noted that room may have
    /// come back since it was last asked.
    pub(super) fn wake_waits(&mut self) {
        if !self.waits.is_empty() {
            let freed = self.engine.take_freed();
            self.waits.wake(&freed);
        }
    }

    /// When the writer has work of its own: the engine's next deadline, or the instant deferred
    /// sweep effects may wait no longer.
    fn writer_due(&self) -> Option<Millis> {
        let deferred_due = self.deferred_since.map(|since| since.plus(MAX_DEFERRED_MS));
        [self.engine.next_deadline(), deferred_due].into_iter().flatten().min()
    }

    /// Fails the file for `why`: nothing is decided until it is reopened, and what was decided
    /// but not committed is dropped. Returns the requests that were waiting, to fail.
    fn break_off(&mut self, why: &str) -> Vec<Waiting> {
        self.broken = Some(why.to_owned());
        self.failing = Some(why.to_owned());
        self.effects.clear();
        self.deferred_since = None;
        std::mem::take(&mut self.waiting)
    }

    /// Whether the writer, parked, must wake before it planned to: a timer or a deferred sweep
    /// is now due earlier. Marks it woken, so it is told once.
    fn writer_should_wake(&mut self) -> bool {
        match (self.writer_sleeps_until, self.writer_due()) {
            (Some(sleeps_until), Some(due)) if due.plus(SWEEP_GRAIN_MS) <= sleeps_until => {
                self.writer_sleeps_until = None;
                true
            }
            _ => false,
        }
    }

    /// Takes everything queued into one commit, which is now in flight.
    fn take_batch(&mut self) -> Batch {
        self.deferred_since = None;
        self.committing = true;
        self.last_batch = self.waiting.len();
        Batch {
            effects: std::mem::take(&mut self.effects),
            answers: std::mem::take(&mut self.waiting),
            now: self.last_now,
        }
    }
}

/// The file and how to reopen it; locked only by the one commit in flight.
pub(super) struct File {
    /// `None` after a failed commit until the file is reopened.
    pub(super) store: Option<Store>,
    pub(super) path: PathBuf,
    pub(super) opener: Opener,
    pub(super) config: EngineConfig,
}

pub(super) struct Shared {
    pub(super) core: Mutex<Core>,
    /// Wakes the writer: effects are queued, a caller's commit ended, or the limiter is closing.
    pub(super) wake: Condvar,
    pub(super) file: Mutex<File>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) caller_commits: bool,
    pub(super) ack_before_commit: bool,
    /// Set by the first async call made on a Tokio runtime.
    pub(super) replier: OnceLock<Replier>,
    /// At most this many `/wait`s pending at once (section 15).
    pub(super) max_waits: usize,
    /// Set at SIGTERM: every wait answers at once ([`super::Limiter::end_waits`]).
    pub(super) waits_ended: std::sync::atomic::AtomicBool,
    /// Keeps an outage's error log to a line a second.
    pub(super) log_gate: Mutex<LogGate>,
}

/// Logs an outage's failures once, then at most once a second, counting the lines it held back.
#[derive(Debug, Default)]
pub(super) struct LogGate {
    last: Option<Instant>,
    suppressed: u64,
}

impl LogGate {
    /// Whether to log now, and how many lines were held back since the last one.
    fn admit(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.duration_since(last) < Duration::from_secs(1)) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }

    /// The outage ended: the next failure logs at once. Returns the lines held back.
    fn reset(&mut self) -> u64 {
        self.last = None;
        std::mem::take(&mut self.suppressed)
    }
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn lock_file(&self) -> MutexGuard<'_, File> {
        self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Logs a failure of the store, once and then at most once a second.
    pub(super) fn log_failure(&self, what: &str, error: &dyn std::fmt::Display) {
        let admitted = self.log_gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admit(Instant::now());
        if let Some(suppressed) = admitted {
            tracing::error!(error = %error, suppressed, "{what}");
        }
    }

    pub(super) fn now(&self, core: &mut Core) -> Millis {
        core.last_now = core.last_now.max(self.clock.now());
        core.last_now
    }

    /// Decides `cmd`; answers it at once when it changed nothing, else queues the answer for
    /// the commit that will hold its effects (`direct`: the writer sends it, not the replier;
    /// `may_commit`: the caller may make that commit itself, see `caller_commits`).
    pub(super) fn submit(&self, cmd: Command, direct: bool, may_commit: bool) {
        let mut core = self.lock();
        if let Some(why) = core.broken.clone().or_else(|| core.closing.then(|| "the limiter is closed".to_owned())) {
            drop(core);
            decided_nothing(cmd).fail(&why, &self.metrics);
            return;
        }
        let now = self.now(&mut core);
        // Forget what has lapsed before deciding, so reads never list it; what that changes in
        // the file waits for a commit a request needs.
        if core.engine.next_deadline().is_some_and(|at| at <= now) {
            core.sweep(now);
        }
        let before = core.effects.len();
        // A throttle's reply reports the throttle in force, which a commit may still hold: then
        // it waits for that commit like a change of its own.
        let reports_pending = matches!(cmd, Command::Throttle { .. }) && (core.committing || !core.waiting.is_empty());
        let answer = decide(&mut core, cmd, now);
        core.wake_waits();
        for ms in core.engine.take_handoffs() {
            self.metrics.release_to_grant_seconds.observe(ms as f64 / 1000.0);
        }
        let idle_ms = core.engine.take_idle_place_ms();
        if idle_ms > 0 {
            self.metrics.line_idle_place_seconds.inc_by(idle_ms as f64 / 1000.0);
        }
        // A ticket's renewal or lapse may be lost in a crash (section 12.6): it rides with the
        // next commit, like a sweep's effects, and its answer does not wait.
        let needs_commit = core.effects[before..].iter().any(Effect::needs_commit);
        if !needs_commit && !reports_pending {
            if core.effects.len() > before && core.waiting.is_empty() {
                core.deferred_since.get_or_insert(now);
            }
            let wake_writer = core.writer_should_wake();
            drop(core);
            if wake_writer {
                self.wake.notify_one();
            }
            answer.send(&self.metrics);
        } else if self.ack_before_commit {
            core.deferred_since = None;
            drop(core);
            self.wake.notify_one();
            answer.send(&self.metrics);
        } else {
            core.deferred_since = None;
            // Only while requests come one at a time: under concurrency the writer's group
            // commits carry more per fsync, and the callers' runtime threads stay free.
            let own_commit = may_commit && !core.committing && core.waiting.is_empty() && core.last_batch <= 1;
            core.waiting.push(Waiting { answer, direct: direct || own_commit });
            if own_commit {
                let batch = core.take_batch();
                drop(core);
                self.commit(batch);
            } else if !core.committing {
                drop(core);
                self.wake.notify_one();
            }
            // else: whoever commits now hands the queue on when done.
        }
    }

    /// Commits `batch` (taken with [`Core::take_batch`]) and answers its requests; on failure
    /// fails them and everything decided on top, and reopens the file. Ends the commit in
    /// flight, waking the writer when more is queued.
    pub(super) fn commit(&self, batch: Batch) {
        let unwinding = EndOnUnwind(self);
        let mut file = self.lock_file();
        let metrics = &self.metrics;
        if !batch.answers.is_empty() {
            metrics.batch_size.observe(batch.answers.len() as f64);
        }
        let store = file.store.as_mut().expect("a store while not broken");
        let started = Instant::now();
        // A batch no request waits for (a sweep's, or what is left at close) also tidies.
        let result = if batch.answers.is_empty() {
            store.commit_and_tidy(&batch.effects, batch.now)
        } else {
            store.commit(&batch.effects, batch.now)
        };
        metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                metrics.file_bytes.set(i64::try_from(store.file_len()).unwrap_or(i64::MAX));
                count_line(metrics, &batch.effects);
                drop(file);
                std::mem::forget(unwinding); // the commit ends here, not on a later unwind
                self.end_commit(true);
                self.deliver(batch.answers);
            }
            Err(e) => {
                self.log_failure("commit failed; answering unavailable and reopening the file", &e);
                let why = e.to_string();
                // Everything decided since was decided on top of this batch: it fails too.
                let later = self.lock().break_off(&why);
                // Reopen before answering, so a caller that asks again at once meets the
                // rebuilt limiter rather than the failure.
                self.reopen(&mut file);
                drop(file);
                std::mem::forget(unwinding);
                self.end_commit(false);
                for waiting in batch.answers.into_iter().chain(later) {
                    waiting.answer.fail(&why, metrics);
                }
            }
        }
    }

    /// Marks the commit in flight done, and wakes the writer if it has work, must close, or
    /// has a timer due earlier than it planned (after a caller's commit).
    fn end_commit(&self, committed: bool) {
        let mut core = self.lock();
        core.committing = false;
        if committed && core.failing.take().is_some() {
            let suppressed = self.log_gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner).reset();
            tracing::info!(suppressed, "the store commits again");
        }
        update_gauges(&self.metrics, &core.engine);
        let more = !core.waiting.is_empty() || core.closing || core.broken.is_some();
        let wake_writer = core.writer_should_wake() || more;
        drop(core);
        if wake_writer {
            self.wake.notify_one();
        }
    }

    /// Sends the answers a commit released: the async ones through the replier when there are
    /// enough of them, the rest (or all, when the replier's runtime is gone) from this thread.
    fn deliver(&self, answers: Vec<Waiting>) {
        let metrics = &self.metrics;
        let handed = answers.iter().filter(|w| !w.direct).count();
        let (rest, direct): (Vec<Answer>, Vec<Waiting>) = match self.replier.get() {
            Some(replier) if handed >= REPLIER_MIN_ANSWERS => {
                let (to_replier, direct): (Vec<Waiting>, Vec<Waiting>) = answers.into_iter().partition(|w| !w.direct);
                match replier.send(to_replier.into_iter().map(|w| w.answer).collect()) {
                    Ok(()) => (Vec::new(), direct),
                    Err(gone) => (gone.0, direct),
                }
            }
            _ => (Vec::new(), answers),
        };
        for answer in rest.into_iter().chain(direct.into_iter().map(|w| w.answer)) {
            answer.send(metrics);
        }
    }

    /// Reopens the file and rebuilds the engine from its last commit; until that succeeds the
    /// limiter answers `Unavailable`.
    pub(super) fn reopen(&self, file: &mut File) {
        file.store = None;
        let now = {
            let mut core = self.lock();
            self.now(&mut core)
        };
        let config = EngineConfig { id_seed: random_seed(), ..file.config };
        // One durable commit proves the store commits again (the open alone may write nothing).
        let attempt = Store::open(&file.path, &file.opener).and_then(|mut store| {
            let mut engine = rebuild(&mut store, config, now)?;
            engine.draw_permit_key().map_err(|cause| StoreError::Io { path: file.path.clone(), cause })?;
            store.commit_and_tidy(&[], now)?;
            Ok((store, engine))
        });
        let mut core = self.lock();
        match attempt {
            Ok((store, engine)) => {
                file.store = Some(store);
                core.engine = engine;
                core.broken = None;
                // Pending waits look again at their next wake; the new engine notes for them.
                let watching = !core.waits.is_empty();
                core.engine.watch_freed(watching);
                core.waits.wake_all();
                // The open made durable commits of its own (with a journal, one checkpointed
                // into the file): the store commits again, and `/health` says so at once, with
                // no request needed to prove it.
                if core.failing.take().is_some() {
                    let suppressed = self.log_gate.lock().unwrap_or_else(PoisonError::into_inner).reset();
                    tracing::info!(suppressed, "the store commits again");
                }
                for waiting in std::mem::take(&mut core.waiting) {
                    waiting.answer.fail("the file was reopened after a failed commit", &self.metrics);
                }
                core.effects.clear();
            }
            Err(e) => {
                self.log_failure("reopening the file failed", &e);
                core.broken =
                    Some(format!("{}: the file cannot be reopened after a failed commit: {e}", file.path.display()));
            }
        }
    }
}

/// Ends the commit in flight if its committer unwinds from a panic: the limiter turns
/// unavailable and the writer reopens the file, instead of every later change waiting for a
/// commit that never ends.
pub(super) struct EndOnUnwind<'a>(&'a Shared);

impl Drop for EndOnUnwind<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let shared = self.0;
        let why = "a commit failed unexpectedly; reopening the file";
        let waiting = {
            let mut core = shared.lock();
            core.committing = false;
            core.break_off(why)
        };
        shared.wake.notify_one();
        for waiting in waiting {
            waiting.answer.fail(why, &shared.metrics);
        }
    }
}

/// An answer for a command that could not be decided (it is only ever failed).
pub(super) fn decided_nothing(cmd: Command) -> Answer {
    match cmd {
        Command::Acquire(_, reply) => Answer::Acquire(
            reply,
            Ok(Acquired {
                decision: Decision::Granted { at: Millis::ZERO, permit: None },
                report: None,
                ticket: None,
                no_ticket: None,
            }),
        ),
        Command::Release(_, reply) | Command::Undo(_, reply) => Answer::Release(reply, Ok(false)),
        Command::Leave(_, reply) => Answer::Leave(reply, false),
        Command::Peek(_, reply) => Answer::Peek(reply, Ok(Peeked::default())),
        Command::Settle(_, reply) => Answer::Settle(reply, Ok(Settled::Unknown)),
        Command::Lift(_, reply) => Answer::Lift(reply, false),
        Command::Throttle { reply, .. } => Answer::Throttle(reply, Ok(None)),
        Command::State { reply, .. } => {
            Answer::State(reply, Snapshot { now: Millis::ZERO, view: StateView::default(), totals: Totals::default() })
        }
    }
}

pub(super) fn decide(core: &mut Core, cmd: Command, now: Millis) -> Answer {
    let Core { engine, effects, .. } = core;
    match cmd {
        Command::Acquire(req, reply) => {
            let acquired = engine.acquire_in_line(&req, now, effects).map(|answer| Acquired {
                decision: answer.decision,
                report: req.report.then(|| Report { now, limits: engine.figures(&req, now) }),
                ticket: answer.ticket,
                no_ticket: answer.no_ticket,
            });
            Answer::Acquire(reply, acquired)
        }
        Command::Release(req, reply) => {
            Answer::Release(reply, engine.release_with_outcome(&req.permit, &req.costs, req.outcome, now, effects))
        }
        Command::Leave(req, reply) => Answer::Leave(reply, engine.leave(&req.ticket, now, effects)),
        Command::Undo(req, reply) => Answer::Release(reply, engine.undo(&req.id, &req.costs, now, effects)),
        Command::Peek(req, reply) => {
            let peeked = engine
                .peek_in_line(&req, now)
                .map(|refusal| Peeked { refusal, report: Report { now, limits: engine.figures(&req, now) } });
            Answer::Peek(reply, peeked)
        }
        Command::Settle(req, reply) => {
            Answer::Settle(reply, engine.settle_with_outcome(&req.permit, &req.costs, req.outcome, now, effects))
        }
        Command::Lift(req, reply) => Answer::Lift(reply, engine.lift(&req.key, now, effects)),
        Command::Throttle { key, until, permit, reply } => {
            let result = ThrottleRequest::new(key, until, now).map(|req| {
                // Section 14: the permit's call was limited, for each of its adapted buckets.
                if let Some(permit) = &permit {
                    engine.signal(permit, Signal::Limited, now, effects);
                }
                engine.throttle(&req.key, req.until, now, effects)
            });
            Answer::Throttle(reply, result)
        }
        Command::State { prefix, reply } => {
            Answer::State(reply, Snapshot { now, view: engine.view(now, &prefix), totals: engine.totals() })
        }
    }
}

/// A fresh engine loaded from the store at `now`, with what lapsed while closed pruned from the
/// file.
pub(super) fn rebuild(store: &mut Store, config: EngineConfig, now: Millis) -> Result<Engine, StoreError> {
    let mut engine = Engine::new(config);
    let floor = store.load(&mut engine)?;
    finish_restore(store, &mut engine, floor, now.max(floor))?;
    Ok(engine)
}

/// Resumes the line of a freshly loaded engine whose file's latest instant is `floor` (every
/// ticket live then keeps its place and lapses no sooner than `now` plus its grace), then
/// prunes what lapsed before `now`, from the engine and from the file.
pub(super) fn finish_restore(
    store: &mut Store,
    engine: &mut Engine,
    floor: Millis,
    now: Millis,
) -> Result<(), StoreError> {
    let mut effects = Vec::new();
    engine.resume_line(floor, now, &mut effects);
    engine.finish_restore(now, &mut effects);
    if effects.is_empty() { Ok(()) } else { store.commit_and_tidy(&effects, now) }
}

/// Counts the line's committed changes: tickets filed, granted (with their wait), lapsed, left;
/// and adaptive ceilings cut and grown.
fn count_line(metrics: &Metrics, effects: &[Effect]) {
    for effect in effects {
        match effect {
            Effect::TicketFiled { .. } => metrics.ticket("filed"),
            Effect::TicketEnded { end: TicketEnd::Granted { waited_ms }, .. } => metrics.ticket_granted(*waited_ms),
            Effect::TicketEnded { end: TicketEnd::Left, .. } => metrics.ticket("left"),
            Effect::TicketLapsed { .. } => metrics.ticket("lapsed"),
            Effect::CeilingSet { change: Some(change), .. } => metrics.ceiling_changed(change.as_str()),
            _ => {}
        }
    }
}

/// A decided request, answered at once or after the commit that holds its effects.
pub(super) enum Answer {
    Acquire(Reply<Acquired>, Result<Acquired, BadRequest>),
    Release(Reply<bool>, Result<bool, BadRequest>),
    Leave(Reply<bool>, bool),
    Peek(Reply<Peeked>, Result<Peeked, BadRequest>),
    Settle(Reply<bool>, Result<Settled, BadRequest>),
    Lift(Reply<bool>, bool),
    Throttle(Reply<Option<Millis>>, Result<Option<Millis>, BadRequest>),
    State(Reply<Snapshot>, Snapshot),
}

impl Answer {
    fn send(self, metrics: &Metrics) {
        match self {
            Answer::Acquire(reply, acquired) => {
                match acquired.as_ref().map(|a| &a.decision) {
                    Ok(Decision::Granted { .. }) => metrics.decided("acquire", "granted", ""),
                    Ok(Decision::Refused { reason, .. }) => metrics.decided("acquire", "refused", reason.as_str()),
                    Err(_) => metrics.decided("acquire", "bad_request", ""),
                }
                let _ = reply.send(acquired.map_err(LimiterError::from));
            }
            Answer::Leave(reply, left) => {
                metrics.decided("release", if left { "left" } else { "unknown" }, "");
                let _ = reply.send(Ok(left));
            }
            Answer::Release(reply, released) => {
                let outcome = match released {
                    Ok(true) => "released",
                    Ok(false) => "unknown",
                    Err(_) => "bad_request",
                };
                metrics.decided("release", outcome, "");
                let _ = reply.send(released.map_err(LimiterError::from));
            }
            Answer::Peek(reply, peeked) => {
                match peeked.as_ref().map(|p| &p.refusal) {
                    Ok(None) => metrics.decided("peek", "fits", ""),
                    Ok(Some(r)) => metrics.decided("peek", "refused", r.reason.as_str()),
                    Err(_) => metrics.decided("peek", "bad_request", ""),
                }
                let _ = reply.send(peeked.map_err(LimiterError::from));
            }
            Answer::Settle(reply, settled) => {
                metrics.decided("settle", settled.as_ref().map_or("bad_request", |s| s.as_str()), "");
                let _ = reply.send(settled.map(Settled::is_settled).map_err(LimiterError::from));
            }
            Answer::Lift(reply, lifted) => {
                metrics.decided("lift", if lifted { "lifted" } else { "none" }, "");
                let _ = reply.send(Ok(lifted));
            }
            Answer::Throttle(reply, result) => {
                let outcome = match &result {
                    Ok(Some(_)) => "in_force",
                    Ok(None) => "none",
                    Err(_) => "bad_request",
                };
                metrics.decided("throttle", outcome, "");
                let _ = reply.send(result.map_err(LimiterError::from));
            }
            Answer::State(reply, snapshot) => {
                let _ = reply.send(Ok(snapshot));
            }
        }
    }

    fn fail(self, why: &str, metrics: &Metrics) {
        let err = || LimiterError::Unavailable(why.to_owned());
        match self {
            Answer::Acquire(reply, _) => {
                metrics.decided("acquire", "unavailable", "");
                let _ = reply.send(Err(err()));
            }
            Answer::Release(reply, _) | Answer::Leave(reply, _) => {
                metrics.decided("release", "unavailable", "");
                let _ = reply.send(Err(err()));
            }
            Answer::Peek(reply, _) => {
                metrics.decided("peek", "unavailable", "");
                let _ = reply.send(Err(err()));
            }
            Answer::Settle(reply, _) => {
                metrics.decided("settle", "unavailable", "");
                let _ = reply.send(Err(err()));
            }
            Answer::Lift(reply, _) => {
                metrics.decided("lift", "unavailable", "");
                let _ = reply.send(Err(err()));
            }
            Answer::Throttle(reply, _) => {
                metrics.decided("throttle", "unavailable", "");
                let _ = reply.send(Err(err()));
            }
            Answer::State(reply, _) => {
                let _ = reply.send(Err(err()));
            }
        }
    }
}

/// The writer thread: commits what requests queued, sweeps at the engine's deadlines, and
/// retries reopening a file whose commit failed.
pub(super) struct Writer {
    pub(super) shared: Arc<Shared>,
    /// When the writer last checked that the file at the path is the one it has open.
    pub(super) file_checked: Instant,
}

/// What one commit carries.
pub(super) struct Batch {
    pub(super) effects: Vec<Effect>,
    pub(super) answers: Vec<Waiting>,
    pub(super) now: Millis,
}

impl Writer {
    pub(super) fn run(mut self) {
        while let Some(batch) = self.next_batch() {
            self.shared.commit(batch);
        }
        // Closed: delete the grants the store still holds for nothing.
        let floor = self.shared.lock().last_now;
        if let Some(store) = &mut self.shared.lock_file().store
            && let Err(e) = store.finish(floor)
        {
            tracing::error!(error = %e, "deleting lapsed grants at close failed");
        }
    }

    /// Waits until there is something to commit and no commit in flight: effects a request
    /// waits for, a sweep's effects that may wait no longer, or the close. `None` once closed
    /// with nothing left.
    fn next_batch(&mut self) -> Option<Batch> {
        let shared = self.shared.clone();
        let mut core = shared.lock();
        loop {
            if core.lost {
                if core.closing {
                    return None;
                }
                core = shared.wake.wait_timeout(core, FILE_CHECK_EVERY).unwrap_or_else(PoisonError::into_inner).0;
                continue;
            }
            if !core.committing && self.file_checked.elapsed() >= FILE_CHECK_EVERY {
                drop(core);
                self.check_file();
                core = shared.lock();
                continue;
            }
            // While a commit is in flight (a caller's), only sweep: its committer wakes us when
            // it ends with more queued, or with the file broken, or on close.
            if core.broken.is_some() && !core.committing {
                drop(core);
                std::thread::sleep(REOPEN_BACKOFF);
                {
                    let mut file = shared.lock_file();
                    if shared.lock().broken.is_some() {
                        shared.reopen(&mut file);
                    }
                }
                core = shared.lock();
                if core.closing && core.broken.is_some() {
                    return None;
                }
                continue;
            }
            let now = shared.now(&mut core);
            core.sweep(now);
            update_gauges(&shared.metrics, &core.engine);
            if !core.committing && core.broken.is_none() {
                let deferred_due = core.deferred_since.map(|since| since.plus(MAX_DEFERRED_MS));
                let sweep_due =
                    deferred_due.is_some_and(|due| due <= now) || core.effects.len() >= MAX_DEFERRED_EFFECTS;
                let requested = !core.waiting.is_empty()
                    || (shared.ack_before_commit && core.deferred_since.is_none() && !core.effects.is_empty());
                if requested || sweep_due || (core.closing && !core.effects.is_empty()) {
                    return Some(core.take_batch());
                }
                if core.closing {
                    return None;
                }
            }
            let wake = core.writer_due();
            // Requests sweep for themselves before deciding, so the writer's sweeps only tidy
            // memory and the file: they need not wake it more often than every SWEEP_GRAIN_MS.
            let wake = wake.map(|at| at.max(now.plus(SWEEP_GRAIN_MS)));
            core.writer_sleeps_until = Some(wake.unwrap_or(Millis(u64::MAX)));
            // However far the next deadline, wake in time to check the file.
            let wait = wake.map_or(FILE_CHECK_EVERY, |at| Duration::from_millis(at.since(now)).min(FILE_CHECK_EVERY));
            core = shared.wake.wait_timeout(core, wait).unwrap_or_else(PoisonError::into_inner).0;
            core.writer_sleeps_until = None;
        }
    }

    /// Checks that the file at the path is still the one open; when it was deleted or replaced,
    /// fails what waits and answers `Unavailable` from then on (see [`Core::lost`]). At a quiet
    /// moment (nothing queued or in flight) it also commits the notes waiting in the journal into
    /// the file and compacts the file when free space dominates it; requests decided meanwhile
    /// queue for the writer's next commit.
    fn check_file(&mut self) {
        let shared = &self.shared;
        let mut file = shared.lock_file();
        let checked = match &file.store {
            Some(store) => store.check_file(),
            None => Ok(()),
        };
        self.file_checked = Instant::now();
        if checked.is_ok() && file.store.is_some() {
            let quiet = {
                let mut core = shared.lock();
                let quiet = !core.committing && core.waiting.is_empty() && core.effects.is_empty() && !core.closing;
                core.committing |= quiet;
                quiet
            };
            if quiet {
                let started = Instant::now();
                let store = file.store.as_mut().expect("checked above");
                // Commits the notes waiting in the journal, then compacts if sparse.
                let compacted = store.compact_if_sparse();
                shared.metrics.file_bytes.set(i64::try_from(store.file_len()).unwrap_or(i64::MAX));
                match &compacted {
                    Ok(Some((before, after))) => tracing::info!(
                        before,
                        after,
                        ms = started.elapsed().as_millis() as u64,
                        "compacted the file: free space dominated it"
                    ),
                    Ok(None) => {}
                    Err(e) => {
                        shared.log_failure("compacting the file failed; reopening it", e);
                        let why = e.to_string();
                        let waiting = shared.lock().break_off(&why);
                        shared.reopen(&mut file);
                        for waiting in waiting {
                            waiting.answer.fail(&why, &shared.metrics);
                        }
                    }
                }
                drop(file);
                shared.end_commit(matches!(compacted, Ok(Some(_))));
            }
            return;
        }
        drop(file);
        if let Err(e) = checked {
            tracing::error!(error = %e, "the file is gone; answering unavailable until the server is restarted");
            let why = e.to_string();
            let waiting = {
                let mut core = shared.lock();
                core.lost = true;
                core.break_off(&why)
            };
            for waiting in waiting {
                waiting.answer.fail(&why, &shared.metrics);
            }
        }
    }
}

pub(super) fn update_gauges(metrics: &Metrics, engine: &Engine) {
    let totals = engine.totals();
    metrics.live_buckets.set(totals.buckets as i64);
    metrics.permits.set(totals.permits as i64);
    metrics.throttles.set(totals.throttles as i64);
    metrics.held_places.set(engine.held_places() as i64);
}
