//! Group commit of one-window acquires: while requests are concurrent, the one-window acquires
//! waiting at once are decided by one statement (`sql/acquire_window_batch.sql`) in one round
//! trip and one transaction, instead of one statement each.
//!
//! Shape: a `Batcher` has `slots` turns (the limiter's `batchers` option, default
//! [`DEFAULT_BATCHERS`]). A request that finds a turn free takes it and sends its own request
//! at once, through today's one-request statement, in its own task: when nothing else waits it
//! costs no extra task hop and no other statement. A request that finds every turn taken
//! queues. When a turn ends and requests queued meanwhile, one spawned task takes the turn over
//! and sends what queued (at most [`MAX_BATCH`]) as one batch, again and again while requests
//! keep queueing, then frees the turn; a lone queued request is sent back to its own task to
//! go alone. So at most `slots` statements of this path are in flight from one limiter, and a
//! batch gathers what arrived during the previous one, as a group commit does.
//!
//! What it owns: the queue, the turns and the batch statement's round trip, and mapping its
//! rows to decisions. What it must never do: decide. The statement decides, exactly as the
//! one-request statement would for each request at the batch's instant, or answers "alone":
//! then the request's own task sends it through the one-request statement after the batch
//! committed (see the statement's file for when, and for why a batch never waits for a lock).
//! A failed batch statement rolled back every one of its requests. When the database answered
//! with an error (one request's key, a constraint, a timeout: something of the statement, not
//! the database being out), each request is decided again, alone, so the one that failed it
//! answers its own error and the others what they would have been; when the database is out
//! (or whether the statement committed is unknown), each is answered `unavailable`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::Pool;
use redb_limiter::{Decision, LimiterError, Millis, Reason};
use tokio::sync::oneshot;

use crate::faults::Faults;
use crate::keys::escape;
use crate::unavailable;

/// Batches in flight at once from one limiter, unless the options say otherwise.
pub const DEFAULT_BATCHERS: usize = 4;
/// Most requests one batch statement decides.
pub const MAX_BATCH: usize = 64;

/// One one-window acquire, as the batch statement takes it.
pub(crate) struct Item {
    pub key: String,
    pub calls: i64,
    pub per_ms: i64,
    pub cost: i64,
    pub caller: String,
    /// The instant to decide at (the injected clock), or `None` for the database's.
    pub at: Option<i64>,
}

/// What a request does next.
pub(crate) enum Turn {
    /// Nothing else was in flight: send the request alone now, holding the turn (it passes on
    /// when the slot drops).
    Lead(Slot),
    /// A batch decided it (or failed: nothing of it was committed).
    Decided(Result<Decision, LimiterError>),
    /// A batch left it: send it alone.
    Alone,
}

/// A batch's answer to one of its requests.
enum Answer {
    Decided(Result<Decision, LimiterError>),
    Alone,
}

struct Waiting {
    item: Item,
    reply: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct State {
    /// Turns taken. Requests queue only while every turn is taken, and a turn is freed only
    /// when the queue is empty: a free turn means an empty queue.
    running: usize,
    queue: VecDeque<Waiting>,
}

/// The queue and the turns of one limiter's batched one-window acquires.
pub(crate) struct Batcher {
    pool: Pool,
    /// The batch statement, for the limiter's schema.
    sql: String,
    slots: usize,
    faults: Arc<Faults>,
    state: std::sync::Mutex<State>,
    /// Batch statements sent (two or more requests each), the requests they decided and those
    /// they left alone (tests).
    batches: AtomicU64,
    decided: AtomicU64,
    alone: AtomicU64,
    /// Batch statements that failed for a request's sake (their requests decided again).
    failed: AtomicU64,
}

/// A turn held; dropping it passes the turn to a task sending what queued meanwhile, or frees
/// it (also when its holder is cancelled or panics).
pub(crate) struct Slot {
    batcher: Arc<Batcher>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.batcher.lock();
        if state.queue.is_empty() {
            state.running -= 1;
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(state);
                runtime.spawn(Arc::clone(&self.batcher).drain());
            }
            // Dropped outside the runtime (it is shutting down): nothing will send what queued.
            Err(_) => {
                state.running -= 1;
                for waiting in state.queue.drain(..) {
                    let gone = LimiterError::Unavailable("PostgreSQL: the server is stopping".into());
                    let _ = waiting.reply.send(Answer::Decided(Err(gone)));
                }
            }
        }
    }
}

impl Batcher {
    pub(crate) fn new(pool: Pool, sql: String, slots: usize, faults: Arc<Faults>) -> Batcher {
        Batcher {
            pool,
            sql,
            slots,
            faults,
            state: std::sync::Mutex::new(State::default()),
            batches: AtomicU64::new(0),
            decided: AtomicU64::new(0),
            alone: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The batch statement as sent.
    pub(crate) fn sql(&self) -> &str {
        &self.sql
    }

    /// (batch statements sent, requests they decided, requests they left alone).
    pub(crate) fn paths(&self) -> (u64, u64, u64) {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        (load(&self.batches), load(&self.decided), load(&self.alone))
    }

    /// Batch statements that failed for a request's sake, their requests decided again.
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Takes a free turn, or queues the request (`item` builds it only then) for the next
    /// batch and waits for its answer.
    pub(crate) async fn submit(self: &Arc<Self>, item: impl FnOnce() -> Item) -> Turn {
        if self.slots == 0 {
            return Turn::Alone;
        }
        let answer = {
            let mut state = self.lock();
            if state.running < self.slots {
                state.running += 1;
                return Turn::Lead(Slot { batcher: Arc::clone(self) });
            }
            let (reply, answer) = oneshot::channel();
            state.queue.push_back(Waiting { item: item(), reply });
            answer
        };
        match answer.await {
            Ok(Answer::Decided(result)) => Turn::Decided(result),
            Ok(Answer::Alone) => Turn::Alone,
            // The task holding the batch ended without an answer (it panicked): whether the
            // batch committed is unknown, so nothing is granted.
            Err(_) => {
                Turn::Decided(Err(LimiterError::Unavailable("PostgreSQL: the batch ended without an answer".into())))
            }
        }
    }

    /// Holds a turn: sends what queued, batch after batch, until the queue is empty.
    async fn drain(self: Arc<Self>) {
        let _turn = Slot { batcher: Arc::clone(&self) };
        loop {
            let batch: Vec<Waiting> = {
                let mut state = self.lock();
                let n = state.queue.len().min(MAX_BATCH);
                state.queue.drain(..n).collect()
            };
            match batch.len() {
                0 => return,
                1 => {
                    // Alone anyway: its own task sends it, as if no batch had formed.
                    let _ = batch.into_iter().next().map(|w| w.reply.send(Answer::Alone));
                }
                _ => {
                    let result = self.decide(&batch).await;
                    match result {
                        Ok(answers) => {
                            for (waiting, answer) in batch.into_iter().zip(answers) {
                                // A request whose caller went away is not answered.
                                let _ = waiting.reply.send(answer);
                            }
                        }
                        Err(Failed::Rolledback) => {
                            self.failed.fetch_add(1, Ordering::Relaxed);
                            for waiting in batch {
                                let _ = waiting.reply.send(Answer::Alone);
                            }
                        }
                        Err(Failed::Out(e)) => {
                            for waiting in batch {
                                let _ = waiting.reply.send(Answer::Decided(Err(e.clone())));
                            }
                        }
                    }
                }
            }
        }
    }

    /// One batch statement: each request's answer, in batch order; else why it failed.
    async fn decide(&self, batch: &[Waiting]) -> Result<Vec<Answer>, Failed> {
        let keys: Vec<std::borrow::Cow<'_, str>> = batch.iter().map(|w| escape(&w.item.key)).collect();
        let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        let figure = |f: fn(&Item) -> i64| batch.iter().map(|w| f(&w.item)).collect::<Vec<i64>>();
        let (calls, per, costs) = (figure(|i| i.calls), figure(|i| i.per_ms), figure(|i| i.cost));
        let callers: Vec<std::borrow::Cow<'_, str>> = batch.iter().map(|w| escape(&w.item.caller)).collect();
        let callers: Vec<&str> = callers.iter().map(AsRef::as_ref).collect();
        let ats: Vec<Option<i64>> = batch.iter().map(|w| w.item.at).collect();
        let client = self.pool.get().await.map_err(|e| Failed::Out(self.faults.pool(&e)))?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [&keys, &calls, &per, &costs, &callers, &ats];
        let result = async { client.query(&client.prepare_cached(&self.sql).await?, &params).await }.await;
        let rows = result.map_err(|e| {
            let error = self.faults.database(&e);
            if crate::faults::database_out(&e) {
                // The session is closed rather than handed out again (see the limiter's).
                drop(deadpool_postgres::Object::take(client));
                Failed::Out(error)
            } else {
                Failed::Rolledback
            }
        })?;
        self.faults.answered();
        self.batches.fetch_add(1, Ordering::Relaxed);
        if rows.len() != batch.len() {
            return Err(Failed::Out(LimiterError::Unavailable(format!(
                "PostgreSQL answered {} rows for a batch of {}",
                rows.len(),
                batch.len()
            ))));
        }
        let mut answers = Vec::with_capacity(batch.len());
        for (i, (row, waiting)) in rows.iter().zip(batch).enumerate() {
            let answer = answer(row, i, &waiting.item);
            match &answer {
                Answer::Alone => self.alone.fetch_add(1, Ordering::Relaxed),
                Answer::Decided(_) => self.decided.fetch_add(1, Ordering::Relaxed),
            };
            answers.push(answer);
        }
        Ok(answers)
    }
}

/// Why a batch statement decided nothing.
enum Failed {
    /// The database answered an error: the statement rolled back, every request is to be
    /// decided again.
    Rolledback,
    /// The database is out, or whether the statement committed is unknown: every request is
    /// answered this.
    Out(LimiterError),
}

/// A row of the batch statement: ord, verdict, until, rate_at, now.
type Columns<'a> = (i64, &'a str, Option<i64>, Option<i64>, Option<i64>);

/// The answer in the batch statement's row `i` (0-based) for `item`.
fn answer(row: &tokio_postgres::Row, i: usize, item: &Item) -> Answer {
    let read = || -> Result<Columns<'_>, tokio_postgres::Error> {
        Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?, row.try_get(3)?, row.try_get(4)?))
    };
    let (ord, verdict, until, rate_at, now) = match read() {
        Ok(columns) => columns,
        Err(e) => return Answer::Decided(Err(unavailable(&e))),
    };
    let at = |v: i64| Millis(u64::try_from(v).unwrap_or(0));
    match (usize::try_from(ord) == Ok(i + 1), verdict, until, rate_at, now) {
        (true, "g", _, _, Some(now)) => Answer::Decided(Ok(Decision::Granted { at: at(now), permit: None })),
        (true, "r", _, Some(rate_at), _) => Answer::Decided(Ok(Decision::Refused {
            retry_at: at(rate_at),
            reason: Reason::Rate,
            limit: item.key.clone(),
        })),
        (true, "t", Some(until), _, _) => Answer::Decided(Ok(Decision::Refused {
            retry_at: at(until),
            reason: Reason::Throttle,
            limit: item.caller.clone(),
        })),
        (true, "a", ..) => Answer::Alone,
        _ => Answer::Decided(Err(LimiterError::Unavailable(format!(
            "PostgreSQL answered an unexpected batch row {ord}: verdict {verdict:?}"
        )))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batcher whose pool never connects: these tests never send a batch statement.
    fn batcher(slots: usize) -> Arc<Batcher> {
        let manager = deadpool_postgres::Manager::from_config(
            tokio_postgres::Config::new(),
            tokio_postgres::NoTls,
            deadpool_postgres::ManagerConfig::default(),
        );
        let pool = Pool::builder(manager).max_size(1).build().expect("a pool that is never used");
        Arc::new(Batcher::new(pool, String::new(), slots, Arc::new(Faults::new(None))))
    }

    fn item() -> Item {
        Item { key: "w".into(), calls: 1, per_ms: 1000, cost: 1, caller: "c".into(), at: None }
    }

    #[tokio::test]
    async fn a_free_turn_leads_and_a_lone_waiter_goes_alone_when_it_ends() {
        let b = batcher(1);
        let Turn::Lead(turn) = b.submit(item).await else { panic!("the turn was free") };
        let waiter = tokio::spawn({
            let b = Arc::clone(&b);
            async move { matches!(b.submit(item).await, Turn::Alone) }
        });
        while b.lock().queue.is_empty() {
            tokio::task::yield_now().await;
        }
        assert_eq!(b.lock().running, 1, "the waiter queued behind the turn");
        drop(turn);
        assert!(waiter.await.unwrap(), "a lone waiter is sent back to go alone");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while b.lock().running > 0 {
            assert!(std::time::Instant::now() < deadline, "the turn was never freed");
            tokio::task::yield_now().await;
        }
        assert!(matches!(b.submit(item).await, Turn::Lead(_)), "the turn is free again");
        assert_eq!(b.paths(), (0, 0, 0), "no batch statement was sent");
    }

    #[tokio::test]
    async fn no_turns_sends_every_request_alone() {
        let b = batcher(0);
        assert!(matches!(b.submit(item).await, Turn::Alone));
        assert_eq!(b.lock().running, 0);
    }
}
