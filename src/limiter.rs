//! The limiter: engine + store + clock behind one writer thread, usable in-process with no HTTP.
//!
//! One thread owns the engine and the redb file. Requests queue on a channel; the thread takes
//! every request that has arrived, decides them in arrival order at one `now`, commits all their
//! effects in one durable transaction (group commit), and only then answers them. While a commit
//! is in flight, new requests queue and share the next one, so throughput under concurrency is
//! not one fsync per request. Refusals change nothing and need no commit.
//!
//! What the sweep finds at a deadline with no request waiting (lapsed grants, places, permits,
//! throttles, idle buckets) is deleted from the engine at once but committed with the next batch,
//! or [`SWEEP_COMMIT_DELAY`] later when none comes: such a commit would only make requests that
//! arrive during it wait, and a lapse missing from the file is found again when the file is
//! loaded.
//!
//! Answers to async calls go back through one task (the replier) on the runtime of the first
//! async call: the writer hands it each batch's answers at once, which wakes that runtime once
//! per batch instead of once per answer. Blocking calls, and async calls made outside a Tokio
//! runtime, are answered by the writer itself.
//!
//! Fail closed: when a commit fails, every request of that batch is answered `Unavailable`, the
//! file is reopened and the engine rebuilt from it (the last committed state); nothing that was
//! not committed is ever granted. The same thread sweeps lapsed state at the engine's deadlines.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::engine::{DEFAULT_RECHECK_MS, Decision, Effect, Engine, EngineConfig, StateView, Totals};
use crate::metrics::Metrics;
use crate::request::{AcquireRequest, BadRequest, ReleaseRequest, ThrottleRequest};
use crate::store::{Opener, Store, StoreError, file_opener};
use crate::time::{Clock, Millis, SystemClock};

/// Most requests decided together and sharing one commit.
const MAX_BATCH: usize = 4096;
/// Fewest async answers of one batch handed to the replier (fewer are sent one by one).
const REPLIER_MIN_ANSWERS: usize = 4;
/// Longest a sweep's deletions wait for a batch to share its commit.
const SWEEP_COMMIT_DELAY: Duration = Duration::from_millis(250);
/// How long the writer waits before trying to reopen a file whose commit failed.
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
            ack_before_commit: false,
        }
    }
}

impl std::fmt::Debug for LimiterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterOptions").field("recheck_ms", &self.recheck_ms).finish_non_exhaustive()
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

/// A command on its way to the writer, and whether the writer answers it itself (`direct`) or
/// through the replier.
struct Queued {
    cmd: Command,
    direct: bool,
}

/// Hands batches of answers to the replier task.
type Replier = tokio::sync::mpsc::UnboundedSender<Vec<Answer>>;

/// Spawns the replier on `runtime`: it sends every answer of every batch it is handed, and ends
/// when the writer is gone.
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

/// The durable limiter. Cheap to share behind an `Arc`; dropping the last handle (or
/// [`Limiter::close`]) finishes queued requests, commits and closes the file.
pub struct Limiter {
    tx: Option<Sender<Queued>>,
    /// Set by the first async call made on a Tokio runtime.
    replier: Arc<OnceLock<Replier>>,
    worker: Option<JoinHandle<()>>,
    path: PathBuf,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
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
        let (engine, floor) = rebuild(&mut store, config, None)?;
        let clock: Arc<dyn Clock> = match options.clock {
            Some(clock) => clock,
            None => Arc::new(SystemClock::new(floor)),
        };
        let metrics = Arc::new(Metrics::default());
        let (tx, rx) = mpsc::channel();
        let replier = Arc::new(OnceLock::new());
        let writer = Writer {
            engine,
            store: Some(store),
            path: path.clone(),
            opener: options.opener,
            config,
            clock: clock.clone(),
            last_now: floor,
            metrics: metrics.clone(),
            ack_before_commit: options.ack_before_commit,
            effects: Vec::new(),
            replier: replier.clone(),
        };
        // The engine is rebuilt with the floor as `now`; pruning at the real now happens on the
        // first batch or deadline.
        let worker = std::thread::Builder::new()
            .name("redb-limiter-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError::Io { path: path.clone(), cause: e.to_string() })?;
        Ok(Limiter { tx: Some(tx), replier, worker: Some(worker), path, clock, metrics, started: Instant::now() })
    }

    /// The file this limiter serves (absolute).
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The limiter's clock reading (never behind the file's last commit).
    #[must_use]
    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    #[must_use]
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    fn send<T>(
        &self,
        direct: bool,
        make: impl FnOnce(Reply<T>) -> Command,
    ) -> oneshot::Receiver<Result<T, LimiterError>> {
        let (reply, rx) = oneshot::channel();
        if let Some(tx) = &self.tx {
            // A send error drops the command and its reply: the receiver then reports Unavailable.
            let _ = tx.send(Queued { cmd: make(reply), direct });
        }
        rx
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, LimiterError> {
        if self.replier.get().is_none()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Two first calls racing may both spawn one; the loser's ends at once.
            let _ = self.replier.set(spawn_replier(&runtime, self.metrics.clone()));
        }
        let direct = self.replier.get().is_none();
        self.send(direct, make).await.unwrap_or_else(|_| Err(closed()))
    }

    fn ask_blocking<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, LimiterError> {
        self.send(true, make).blocking_recv().unwrap_or_else(|_| Err(closed()))
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

    /// Finishes every queued request, commits, and closes the file.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.tx.take();
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

/// A fresh engine loaded from the store, with what lapsed while closed pruned from the file.
fn rebuild(store: &mut Store, config: EngineConfig, now: Option<Millis>) -> Result<(Engine, Millis), StoreError> {
    let mut engine = Engine::new(config);
    let floor = store.load(&mut engine)?;
    let now = now.unwrap_or(floor).max(floor);
    let mut effects = Vec::new();
    engine.finish_restore(now, &mut effects);
    if !effects.is_empty() {
        store.commit(&effects, now)?;
    }
    Ok((engine, floor))
}

/// A decided request waiting for its commit.
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

/// The writer thread's state: the only owner of the engine and the file.
struct Writer {
    engine: Engine,
    /// `None` after a failed commit until the file is reopened.
    store: Option<Store>,
    path: PathBuf,
    opener: Opener,
    config: EngineConfig,
    clock: Arc<dyn Clock>,
    last_now: Millis,
    metrics: Arc<Metrics>,
    ack_before_commit: bool,
    effects: Vec<Effect>,
    replier: Arc<OnceLock<Replier>>,
}

impl Writer {
    fn now(&mut self) -> Millis {
        self.last_now = self.last_now.max(self.clock.now());
        self.last_now
    }

    fn run(mut self, rx: Receiver<Queued>) {
        let mut batch = Vec::new();
        // When the sweep's uncommitted deletions are committed even if no request comes.
        let mut flush_at: Option<Instant> = None;
        loop {
            let deadline = self.engine.next_deadline().map(|d| Duration::from_millis(d.since(self.now())));
            let flush = flush_at.map(|at| at.saturating_duration_since(Instant::now()));
            let first = match deadline.into_iter().chain(flush).min() {
                Some(wait) => match rx.recv_timeout(wait) {
                    Ok(cmd) => Some(cmd),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                },
                None => match rx.recv() {
                    Ok(cmd) => Some(cmd),
                    Err(_) => break,
                },
            };
            let Some(first) = first else {
                // A deadline or the flush is due and no request waits.
                if self.store.is_some() {
                    let now = self.now();
                    self.engine.sweep(now, &mut self.effects);
                    self.update_gauges();
                }
                if self.effects.is_empty() {
                    flush_at = None;
                } else if *flush_at.get_or_insert_with(|| Instant::now() + SWEEP_COMMIT_DELAY) <= Instant::now() {
                    self.run_batch(&mut batch);
                    flush_at = None;
                }
                continue;
            };
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(cmd) => batch.push(cmd),
                    Err(_) => break,
                }
            }
            self.run_batch(&mut batch);
            flush_at = None;
        }
        // Every handle is gone: commit what the sweep has left and close the file.
        self.run_batch(&mut batch);
        let floor = self.last_now;
        if let Some(store) = &mut self.store
            && let Err(e) = store.finish(floor)
        {
            tracing::error!(error = %e, "deleting lapsed window entries at close failed");
        }
    }

    /// Sends the answers of a committed batch: the async ones through the replier when there
    /// are enough of them, the rest (or all, when the replier is gone) from this thread.
    fn deliver(&self, answers: Vec<(Answer, bool)>) {
        let replier = self.replier.get();
        let via_replier = answers.iter().filter(|(_, direct)| !direct).count();
        let (answers, direct) = match replier {
            Some(replier) if via_replier >= REPLIER_MIN_ANSWERS => {
                let (handed, direct): (Vec<_>, Vec<_>) = answers.into_iter().partition(|(_, direct)| !direct);
                let handed: Vec<Answer> = handed.into_iter().map(|(answer, _)| answer).collect();
                match replier.send(handed) {
                    Ok(()) => (Vec::new(), direct),
                    // The replier's runtime is gone: answer here.
                    Err(e) => (e.0, direct),
                }
            }
            _ => (Vec::new(), answers),
        };
        for answer in answers.into_iter().chain(direct.into_iter().map(|(answer, _)| answer)) {
            answer.send(&self.metrics);
        }
    }

    fn update_gauges(&self) {
        let totals = self.engine.totals();
        self.metrics.live_buckets.set(totals.buckets as i64);
        self.metrics.permits.set(totals.permits as i64);
        self.metrics.throttles.set(totals.throttles as i64);
        self.metrics.held_places.set(self.engine.held_places() as i64);
    }

    fn run_batch(&mut self, batch: &mut Vec<Queued>) {
        if self.store.is_none() && !self.reopen() {
            let why = format!("{}: the file cannot be reopened after a failed commit", self.path.display());
            for queued in batch.drain(..) {
                self.decide(queued.cmd, Millis::ZERO, false).fail(&why, &self.metrics);
            }
            std::thread::sleep(REOPEN_BACKOFF);
            return;
        }
        let now = self.now();
        // `effects` may already hold a sweep's deletions, waiting for this commit.
        self.engine.sweep(now, &mut self.effects);
        if !batch.is_empty() {
            self.metrics.batch_size.observe(batch.len() as f64);
        }
        let mut answers: Vec<(Answer, bool)> =
            batch.drain(..).map(|queued| (self.decide(queued.cmd, now, true), queued.direct)).collect();
        if self.ack_before_commit {
            for (answer, _) in answers.drain(..) {
                answer.send(&self.metrics);
            }
        }
        if !self.effects.is_empty() {
            let started = Instant::now();
            let store = self.store.as_mut().expect("checked above");
            let result = store.commit(&self.effects, now);
            self.metrics.commit_seconds.observe(started.elapsed().as_secs_f64());
            self.effects.clear();
            if let Err(e) = result {
                tracing::error!(error = %e, "commit failed; answering the batch unavailable and reopening the file");
                let why = e.to_string();
                for (answer, _) in answers {
                    answer.fail(&why, &self.metrics);
                }
                self.store = None;
                self.reopen();
                return;
            }
        }
        self.deliver(answers);
        self.update_gauges();
    }

    fn decide(&mut self, cmd: Command, now: Millis, live: bool) -> Answer {
        let effects = &mut self.effects;
        match cmd {
            Command::Acquire(req, reply) => {
                let decision = if live {
                    self.engine.acquire(&req, now, effects)
                } else {
                    Decision::Granted { at: now, permit: None } // never sent: the answer fails
                };
                Answer::Acquire(reply, decision)
            }
            Command::Release(req, reply) => {
                Answer::Release(reply, live && self.engine.release(&req.permit, now, effects))
            }
            Command::Throttle { key, until, reply } => {
                let result = match ThrottleRequest::new(key, until, now) {
                    Ok(req) if live => {
                        let set = self.engine.throttle(&req.key, req.until, now, effects);
                        self.metrics.decided("throttle", if set == Some(req.until) { "set" } else { "unchanged" }, "");
                        Ok(set)
                    }
                    Ok(_) => Ok(None),
                    Err(e) => Err(e),
                };
                Answer::Throttle(reply, result)
            }
            Command::State { prefix, reply } => {
                let snapshot = Snapshot { now, view: self.engine.view(now, &prefix), totals: self.engine.totals() };
                Answer::State(reply, snapshot)
            }
        }
    }

    /// Reopens the file and rebuilds the engine from its last commit. False when it cannot.
    fn reopen(&mut self) -> bool {
        // Effects of the engine being replaced mean nothing to the rebuilt one.
        self.effects.clear();
        let attempt = Store::open(&self.path, &self.opener).and_then(|mut store| {
            let now = self.now();
            let config = EngineConfig { id_seed: random_seed(), ..self.config };
            rebuild(&mut store, config, Some(now)).map(|(engine, _)| (store, engine))
        });
        match attempt {
            Ok((store, engine)) => {
                self.store = Some(store);
                self.engine = engine;
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "reopening the file failed");
                // The in-memory state may hold uncommitted grants: replace it with nothing, and
                // refuse service until the file opens again.
                self.engine = Engine::new(self.config);
                false
            }
        }
    }
}
