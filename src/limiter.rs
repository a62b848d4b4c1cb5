//! The limiter: engine + store + clock, usable in-process with no HTTP.
//!
//! Requests are decided at once, in the caller's thread, under one lock around the engine.
//! A decision that changes nothing (a refusal, a read) is answered there and then. A decision
//! that changes something leaves its effects in a queue and waits: one writer thread takes every
//! effect queued so far, commits them all in one durable transaction (group commit), and only
//! then answers the requests that made them. While that commit is in flight, new requests are
//! decided on top of it and queue for the next one, so throughput under concurrency is not one
//! fsync per request, and a refusal never waits for an fsync.
//!
//! Fail closed: when a commit fails, every request waiting for it, and every request decided on
//! top of it since, is answered `Unavailable`; the file is reopened and the engine rebuilt from
//! it (the last committed state). Nothing that was not committed is ever granted. A refusal
//! decided on top of an uncommitted grant errs on the safe side. The writer also sweeps lapsed
//! state at the engine's deadlines, at most every `SWEEP_GRAIN_MS` (a request sweeps for
//! itself before deciding, so these sweeps only tidy); what a sweep alone forgets rides along
//! with the next commit a request needs (or waits at most [`MAX_DEFERRED_MS`]), since a reopen
//! prunes it again.
//!
//! The answers a commit releases to async callers go back through one task (the replier) on the
//! runtime of the first async call, handed all at once: that wakes the runtime once per commit
//! instead of once per answer. Blocking calls, async calls made outside a Tokio runtime, and
//! commits releasing fewer than `REPLIER_MIN_ANSWERS` such answers are answered by the writer
//! itself.
//!
//! With [`LimiterOptions::caller_commits`], while requests come one at a time (the last commit
//! answered at most one), a request that finds no commit in flight and nothing queued commits its
//! own effects in the calling thread instead of waking the writer: that saves two thread
//! hand-offs per request. Requests that arrive meanwhile queue for the writer as before. At most
//! one commit is in flight at a time, whoever makes it (`Core::committing`); the file sits behind
//! its own lock, taken by that committer (and by the writer to reopen the file or close it).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::engine::{DEFAULT_RECHECK_MS, Decision, Effect, Engine, EngineConfig, StateView, Totals};
use crate::metrics::Metrics;
use crate::request::{AcquireRequest, BadRequest, ReleaseRequest, ThrottleRequest};
use crate::store::{Opener, Store, StoreError, file_opener};
use crate::time::{Clock, Millis, SystemClock};

/// Sweep effects wait for a request's commit until there are this many...
const MAX_DEFERRED_EFFECTS: usize = 4096;
/// ...or they are this old (ms).
pub const MAX_DEFERRED_MS: u64 = 1000;
/// Fewest async answers one commit hands to the replier (fewer are sent one by one).
const REPLIER_MIN_ANSWERS: usize = 4;
/// The writer sweeps at the engine's deadlines, but at most this often (ms).
const SWEEP_GRAIN_MS: u64 = 50;
/// How long the writer waits before trying again to reopen a file whose commit failed.
const REOPEN_BACKOFF: Duration = Duration::from_millis(100);

/// Why a request got no answer from the limiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimiterError {
    /// The request is malformed; nothing changed.
    #[error("{0}")]
    BadRequest(#[from] BadRequest),
    /// The store cannot commit (or the limiter is closing); nothing was granted.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// How to open a limiter. `Default` is the production setup.
pub struct LimiterOptions {
    /// A call refused for concurrency is told to retry at most this long after `now`.
    pub recheck_ms: u64,
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
    /// Broken on purpose, for the crash test only: answer before the commit.
    #[doc(hidden)]
    pub ack_before_commit: bool,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        LimiterOptions {
            recheck_ms: DEFAULT_RECHECK_MS,
            id_seed: None,
            clock: None,
            opener: file_opener(),
            caller_commits: false,
            ack_before_commit: false,
        }
    }
}

impl std::fmt::Debug for LimiterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterOptions")
            .field("recheck_ms", &self.recheck_ms)
            .field("caller_commits", &self.caller_commits)
            .finish_non_exhaustive()
    }
}

/// A snapshot of the live state.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub now: Millis,
    pub view: StateView,
    pub totals: Totals,
}

type Reply<T> = oneshot::Sender<Result<T, LimiterError>>;

enum Command {
    Acquire(AcquireRequest, Reply<Decision>),
    Release(ReleaseRequest, Reply<bool>),
    Throttle { key: String, until: Millis, reply: Reply<Option<Millis>> },
    State { prefix: String, reply: Reply<Snapshot> },
}

/// An answer held until its commit, and whether the writer sends it itself (`direct`) or hands
/// it to the replier.
struct Waiting {
    answer: Answer,
    direct: bool,
}

/// Hands the answers of one commit to the replier task.
type Replier = tokio::sync::mpsc::UnboundedSender<Vec<Answer>>;

/// Spawns the replier on `runtime`: it sends every answer it is handed, and ends when the
/// limiter is gone.
fn spawn_replier(runtime: &tokio::runtime::Handle, metrics: Arc<Metrics>) -> Replier {
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
struct Core {
    engine: Engine,
    /// Effects decided and not yet handed to a commit.
    effects: Vec<Effect>,
    /// Answers held until `effects` are committed.
    waiting: Vec<Waiting>,
    /// The latest `now` used; never runs backwards, and is the floor the next commit records.
    last_now: Millis,
    /// Since when `effects` holds only a sweep's effects, waiting to ride a request's commit.
    deferred_since: Option<Millis>,
    /// Why nothing can be decided now (a failed commit, until the file is reopened).
    broken: Option<String>,
    closing: bool,
    /// A commit is in flight (the writer's or a caller's); the next waits for it.
    committing: bool,
    /// How many requests the last commit answered.
    last_batch: usize,
    /// Until when the writer is parked (`Millis(u64::MAX)`: until woken); `None` while it runs.
    writer_sleeps_until: Option<Millis>,
}

impl Core {
    /// Forgets what lapsed by `now`. What that changes in the file waits for the next commit a
    /// request needs (see [`MAX_DEFERRED_MS`]).
    fn sweep(&mut self, now: Millis) {
        let before = self.effects.len();
        self.engine.sweep(now, &mut self.effects);
        if self.effects.len() > before && self.waiting.is_empty() {
            self.deferred_since.get_or_insert(now);
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
struct File {
    /// `None` after a failed commit until the file is reopened.
    store: Option<Store>,
    path: PathBuf,
    opener: Opener,
    config: EngineConfig,
}

struct Shared {
    core: Mutex<Core>,
    /// Wakes the writer: effects are queued, a caller's commit ended, or the limiter is closing.
    wake: Condvar,
    file: Mutex<File>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    caller_commits: bool,
    ack_before_commit: bool,
    /// Set by the first async call made on a Tokio runtime.
    replier: OnceLock<Replier>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock_file(&self) -> MutexGuard<'_, File> {
        self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self, core: &mut Core) -> Millis {
        core.last_now = core.last_now.max(self.clock.now());
        core.last_now
    }

    /// Decides `cmd`; answers it at once when it changed nothing, else queues the answer for
    /// the commit that will hold its effects (`direct`: the writer sends it, not the replier;
    /// `may_commit`: the caller may make that commit itself, see `caller_commits`).
    fn submit(&self, cmd: Command, direct: bool, may_commit: bool) {
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
        if core.effects.len() == before && !reports_pending {
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
    fn commit(&self, batch: Batch) {
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
                drop(file);
                std::mem::forget(unwinding); // the commit ends here, not on a later unwind
                self.end_commit();
                self.deliver(batch.answers);
            }
            Err(e) => {
                tracing::error!(error = %e, "commit failed; answering unavailable and reopening the file");
                let why = e.to_string();
                // Everything decided since was decided on top of this batch: it fails too.
                let later = self.lock().break_off(&why);
                // Reopen before answering, so a caller that asks again at once meets the
                // rebuilt limiter rather than the failure.
                self.reopen(&mut file);
                drop(file);
                std::mem::forget(unwinding);
                self.end_commit();
                for waiting in batch.answers.into_iter().chain(later) {
                    waiting.answer.fail(&why, metrics);
                }
            }
        }
    }

    /// Marks the commit in flight done, and wakes the writer if it has work, must close, or
    /// has a timer due earlier than it planned (after a caller's commit).
    fn end_commit(&self) {
        let mut core = self.lock();
        core.committing = false;
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
    fn reopen(&self, file: &mut File) {
        file.store = None;
        let now = {
            let mut core = self.lock();
            self.now(&mut core)
        };
        let config = EngineConfig { id_seed: random_seed(), ..file.config };
        let attempt = Store::open(&file.path, &file.opener)
            .and_then(|mut store| rebuild(&mut store, config, now).map(|engine| (store, engine)));
        let mut core = self.lock();
        match attempt {
            Ok((store, engine)) => {
                file.store = Some(store);
                core.engine = engine;
                core.broken = None;
                for waiting in std::mem::take(&mut core.waiting) {
                    waiting.answer.fail("the file was reopened after a failed commit", &self.metrics);
                }
                core.effects.clear();
            }
            Err(e) => {
                tracing::error!(error = %e, "reopening the file failed");
                core.broken =
                    Some(format!("{}: the file cannot be reopened after a failed commit: {e}", file.path.display()));
            }
        }
    }
}

/// Ends the commit in flight if its committer unwinds from a panic: the limiter turns
/// unavailable and the writer reopens the file, instead of every later change waiting for a
/// commit that never ends.
struct EndOnUnwind<'a>(&'a Shared);

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
fn decided_nothing(cmd: Command) -> Answer {
    match cmd {
        Command::Acquire(_, reply) => Answer::Acquire(reply, Decision::Granted { at: Millis::ZERO, permit: None }),
        Command::Release(_, reply) => Answer::Release(reply, false),
        Command::Throttle { reply, .. } => Answer::Throttle(reply, Ok(None)),
        Command::State { reply, .. } => {
            Answer::State(reply, Snapshot { now: Millis::ZERO, view: StateView::default(), totals: Totals::default() })
        }
    }
}

fn decide(core: &mut Core, cmd: Command, now: Millis) -> Answer {
    let Core { engine, effects, .. } = core;
    match cmd {
        Command::Acquire(req, reply) => Answer::Acquire(reply, engine.acquire(&req, now, effects)),
        Command::Release(req, reply) => Answer::Release(reply, engine.release(&req.permit, now, effects)),
        Command::Throttle { key, until, reply } => {
            let result =
                ThrottleRequest::new(key, until, now).map(|req| engine.throttle(&req.key, req.until, now, effects));
            Answer::Throttle(reply, result)
        }
        Command::State { prefix, reply } => {
            Answer::State(reply, Snapshot { now, view: engine.view(now, &prefix), totals: engine.totals() })
        }
    }
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
        let config =
            EngineConfig { recheck_ms: options.recheck_ms, id_seed: options.id_seed.unwrap_or_else(random_seed) };
        let mut engine = Engine::new(config);
        let floor = store.load(&mut engine)?;
        let clock: Arc<dyn Clock> = match options.clock {
            Some(clock) => clock,
            None => Arc::new(SystemClock::new(floor)),
        };
        let floor = floor.max(clock.now());
        finish_restore(&mut store, &mut engine, floor)?;
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                effects: Vec::new(),
                waiting: Vec::new(),
                last_now: floor,
                deferred_since: None,
                broken: None,
                closing: false,
                committing: false,
                last_batch: 0,
                writer_sleeps_until: None,
            }),
            wake: Condvar::new(),
            file: Mutex::new(File { store: Some(store), path: path.clone(), opener: options.opener, config }),
            clock,
            metrics: Arc::new(Metrics::default()),
            caller_commits: options.caller_commits,
            ack_before_commit: options.ack_before_commit,
            replier: OnceLock::new(),
        });
        let writer = Writer { shared: shared.clone() };
        let worker = std::thread::Builder::new()
            .name("redb-limiter-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| StoreError::Io { path: path.clone(), cause: e.to_string() })?;
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

    /// Decides an acquire; a grant is answered only once it is durable.
    pub async fn acquire(&self, req: AcquireRequest) -> Result<Decision, LimiterError> {
        self.ask(|r| Command::Acquire(req, r)).await
    }

    /// Releases a permit: `true` when it freed places.
    pub async fn release(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        self.ask(|r| Command::Release(req, r)).await
    }

    /// Throttles a caller (only ever extends); returns the throttle in force. `until` more than
    /// 24 hours after the limiter's now is a `BadRequest`.
    pub async fn throttle(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        self.ask(|reply| Command::Throttle { key: req.key, until: req.until, reply }).await
    }

    /// The live state whose keys start with `prefix`.
    pub async fn state(&self, prefix: &str) -> Result<Snapshot, LimiterError> {
        self.ask(|reply| Command::State { prefix: prefix.to_owned(), reply }).await
    }

    /// [`Limiter::acquire`] for threads outside an async runtime.
    pub fn acquire_blocking(&self, req: AcquireRequest) -> Result<Decision, LimiterError> {
        self.ask_blocking(|r| Command::Acquire(req, r))
    }

    /// [`Limiter::release`] for threads outside an async runtime.
    pub fn release_blocking(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        self.ask_blocking(|r| Command::Release(req, r))
    }

    /// [`Limiter::throttle`] for threads outside an async runtime.
    pub fn throttle_blocking(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        self.ask_blocking(|reply| Command::Throttle { key: req.key, until: req.until, reply })
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
        self.shared.lock().closing = true;
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

/// A fresh engine loaded from the store at `now`, with what lapsed while closed pruned from the
/// file.
fn rebuild(store: &mut Store, config: EngineConfig, now: Millis) -> Result<Engine, StoreError> {
    let mut engine = Engine::new(config);
    let floor = store.load(&mut engine)?;
    finish_restore(store, &mut engine, now.max(floor))?;
    Ok(engine)
}

/// Prunes what lapsed before `now` from a freshly loaded engine and from the file.
fn finish_restore(store: &mut Store, engine: &mut Engine, now: Millis) -> Result<(), StoreError> {
    let mut effects = Vec::new();
    engine.finish_restore(now, &mut effects);
    if effects.is_empty() { Ok(()) } else { store.commit_and_tidy(&effects, now) }
}

/// A decided request, answered at once or after the commit that holds its effects.
enum Answer {
    Acquire(Reply<Decision>, Decision),
    Release(Reply<bool>, bool),
    Throttle(Reply<Option<Millis>>, Result<Option<Millis>, BadRequest>),
    State(Reply<Snapshot>, Snapshot),
}

impl Answer {
    fn send(self, metrics: &Metrics) {
        match self {
            Answer::Acquire(reply, decision) => {
                match &decision {
                    Decision::Granted { .. } => metrics.decided("acquire", "granted", ""),
                    Decision::Refused { reason, .. } => metrics.decided("acquire", "refused", reason.as_str()),
                }
                let _ = reply.send(Ok(decision));
            }
            Answer::Release(reply, released) => {
                metrics.decided("release", if released { "released" } else { "unknown" }, "");
                let _ = reply.send(Ok(released));
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
            Answer::Release(reply, _) => {
                metrics.decided("release", "unavailable", "");
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
struct Writer {
    shared: Arc<Shared>,
}

/// What one commit carries.
struct Batch {
    effects: Vec<Effect>,
    answers: Vec<Waiting>,
    now: Millis,
}

impl Writer {
    fn run(self) {
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
    fn next_batch(&self) -> Option<Batch> {
        let shared = &self.shared;
        let mut core = shared.lock();
        loop {
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
            core = match wake {
                Some(at) => {
                    let wait = Duration::from_millis(at.since(now));
                    shared.wake.wait_timeout(core, wait).unwrap_or_else(std::sync::PoisonError::into_inner).0
                }
                None => shared.wake.wait(core).unwrap_or_else(std::sync::PoisonError::into_inner),
            };
            core.writer_sleeps_until = None;
        }
    }
}

fn update_gauges(metrics: &Metrics, engine: &Engine) {
    let totals = engine.totals();
    metrics.live_buckets.set(totals.buckets as i64);
    metrics.permits.set(totals.permits as i64);
    metrics.throttles.set(totals.throttles as i64);
    metrics.held_places.set(engine.held_places() as i64);
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
}
