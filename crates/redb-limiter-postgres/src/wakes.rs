//! Wake-ups in PostgreSQL mode (wire section 15): `/wait`, and the notifications that wake it
//! from whichever server made the change.
//!
//! Whether a ticket is ready is decided by the database, never here: one call of `wait_check()`
//! (`sql/schema.sql`) answers for every ticket of a wait (ready, gone, or not yet: until when,
//! and the keys a change wakes it by), and holds the waited tickets from lapsing. A wait with
//! none ready or gone registers those keys ([`Waits`]) and sleeps until the soonest `retryAt` a
//! ticket was told (a window reaching it is a timer here, not a poll; a concurrency refusal is
//! told the recheck at the latest, the backstop), its timeout, or a wake; then it asks again.
//!
//! Every change that can make a ticket ready (a place released, a ticket ended or gone, a
//! settle down, a throttle lifted, a lapse swept) sends, in its transaction, a notification per
//! key it freed on the channel named after the schema, delivered at commit to every server. The
//! listener owns one dedicated connection (not the pool's) that `LISTEN`s on it and wakes the
//! waits registered under each key notified. It starts with the first wait; a lost connection
//! is opened again, and every wait is woken once then, since notifications may have been missed
//! meanwhile. A wait looks again also when a notification arrived between its check and its
//! registration (the listener's generation moved), so none is lost in that gap.
//!
//! Pending waits are bounded ([`PgOptions::max_waits`]): past the bound a wait answers at once,
//! with empty lists. [`PgLimiter::end_waits`] (the server's SIGTERM) answers every pending wait
//! at once, and every later one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use redb_limiter::backend::Backend;
use redb_limiter::engine::Readiness;
use redb_limiter::limiter::{WaitAnswer, Waits};
use redb_limiter::request::WaitRequest;
use redb_limiter::{LimiterError, Millis, TicketId};
use serde_json::Value;
use tokio::sync::Notify;

use crate::{PgLimiter, millis_at, protocol, to_i64};

/// How long a first wait waits for the listener to be listening before it looks anyway.
const LISTEN_WITHIN: Duration = Duration::from_secs(2);
/// The listener's pause before it connects again, doubling up to [`RECONNECT_MAX`].
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The waits of one limiter and what wakes them.
pub(crate) struct Wakes {
    waits: Mutex<Waits>,
    /// Moves on every notification and every (re)connection of the listener.
    generation: AtomicU64,
    /// `end_waits` was called: every wait answers at once.
    ended: AtomicBool,
    /// True while the listener's connection is listening.
    listening: tokio::sync::watch::Sender<bool>,
    /// The listener task, started by the first wait.
    listener: OnceLock<tokio::task::AbortHandle>,
    max_waits: usize,
}

impl Wakes {
    pub(crate) fn new(max_waits: usize) -> Self {
        Wakes {
            waits: Mutex::new(Waits::default()),
            generation: AtomicU64::new(0),
            ended: AtomicBool::new(false),
            listening: tokio::sync::watch::Sender::new(false),
            listener: OnceLock::new(),
            max_waits,
        }
    }

    fn waits(&self) -> std::sync::MutexGuard<'_, Waits> {
        self.waits.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Wakes the waits registered under `key` (a notification's payload).
    fn wake(&self, key: &str) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.waits().wake(&[key]);
    }

    fn wake_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.waits().wake_all();
    }

    /// Stops the listener (its limiter is gone).
    pub(crate) fn stop(&self) {
        if let Some(listener) = self.listener.get() {
            listener.abort();
        }
    }
}

/// Unregisters a wait however it ends (answered, timed out, or its caller gone).
struct Registered<'a> {
    wakes: &'a Wakes,
    id: Option<u64>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.wakes.waits().unregister(id);
        }
    }
}

/// How one ticket stood at the database's check.
enum Stand {
    Ready,
    Gone,
    NotYet { retry_at: Millis, keys: Vec<Arc<str>> },
}

fn stand_from(v: &Value) -> Option<Stand> {
    match v.get("s")?.as_str()? {
        "r" => Some(Stand::Ready),
        "g" => Some(Stand::Gone),
        "n" => {
            let keys = v.get("keys")?.as_array()?.iter().map(|k| k.as_str().map(Arc::from)).collect::<Option<_>>()?;
            Some(Stand::NotYet { retry_at: millis_at(v, "retryAt")?, keys })
        }
        _ => None,
    }
}

impl PgLimiter {
    /// Waits until one of `req.tickets` is ready or gone, or `req.timeout_ms` passes (section
    /// 15); see the module docs. Counts nowhere and grants nothing.
    pub async fn wait(&self, req: WaitRequest) -> Result<WaitAnswer, LimiterError> {
        let wakes = &*self.wakes;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms);
        self.listen(deadline).await;
        let notify = Arc::new(Notify::new());
        let mut registered = Registered { wakes, id: None };
        // Only a string of ours can name a ticket: any other is unknown without asking.
        let ours: Vec<&str> =
            req.tickets.iter().map(String::as_str).filter(|t| t.parse::<TicketId>().is_ok()).collect();
        loop {
            let generation = wakes.generation();
            let ended = wakes.ended.load(Ordering::SeqCst);
            // The first look holds the tickets for the whole wait, unless the wait is to answer at
            // once (past the bound, or ended).
            let full = registered.id.is_none() && wakes.waits().len() >= wakes.max_waits;
            let hold = (registered.id.is_none() && !full && !ended).then_some(to_i64(req.timeout_ms));
            let (now, stands) =
                if ours.is_empty() { (Backend::now(self), Vec::new()) } else { self.wait_check(&ours, hold).await? };
            let mut answer = WaitAnswer { now, ..WaitAnswer::default() };
            let mut next: Option<Millis> = None;
            let mut keys: Vec<Arc<str>> = Vec::new();
            let mut stands = stands.into_iter();
            for ticket in &req.tickets {
                let stand = if ticket.parse::<TicketId>().is_ok() { stands.next() } else { Some(Stand::Gone) };
                match stand.ok_or_else(|| LimiterError::Unavailable("PostgreSQL answered too few tickets".into()))? {
                    Stand::Ready => answer.ready.push(ticket.clone()),
                    Stand::Gone => answer.gone.push(ticket.clone()),
                    Stand::NotYet { retry_at, keys: more } => {
                        next = Some(next.map_or(retry_at, |n| n.min(retry_at)));
                        keys.extend(more);
                    }
                }
            }
            if !answer.ready.is_empty()
                || !answer.gone.is_empty()
                || wakes.ended.load(Ordering::SeqCst)
                || tokio::time::Instant::now() >= deadline
            {
                return Ok(answer);
            }
            if registered.id.is_none() {
                if full {
                    self.metrics.decided("wait", "full", "");
                    return Ok(answer);
                }
                keys.sort_unstable();
                keys.dedup();
                registered.id = Some(wakes.waits().register(keys, notify.clone()));
            }
            // A notification between the check and the registration: look again at once.
            if wakes.generation() != generation {
                continue;
            }
            let mut wake_at = deadline;
            if let Some(next) = next {
                wake_at = wake_at.min(tokio::time::Instant::now() + Duration::from_millis(next.since(now).max(1)));
            }
            // Woken, or at the instant: either way it looks again.
            let _ = tokio::time::timeout_at(wake_at, notify.notified()).await;
        }
    }

    /// One call of `wait_check()`: the database's instant and how each of `tickets` stands, in
    /// order; with `hold`, the tickets are held from lapsing for that long past now (and their
    /// grace).
    async fn wait_check(&self, tickets: &[&str], hold: Option<i64>) -> Result<(Millis, Vec<Stand>), LimiterError> {
        let recheck_ms = to_i64(self.options.recheck_ms);
        let reply: Value = self.call(&self.sql.wait_check, &[&tickets, &hold, &recheck_ms, &self.at()]).await?;
        let now = millis_at(&reply, "now").ok_or_else(|| protocol(&reply))?;
        let stands = reply
            .get("tickets")
            .and_then(Value::as_array)
            .and_then(|all| all.iter().map(stand_from).collect::<Option<Vec<_>>>())
            .ok_or_else(|| protocol(&reply))?;
        Ok((now, stands))
    }

    /// How `ticket` stands now, as a wait's look sees it; with `hold_ms`, held as a wait that
    /// long holds it when it is not ready (tests: the engine's [`Readiness`] is the oracle).
    #[doc(hidden)]
    pub async fn readiness(&self, ticket: &str, hold_ms: Option<u64>) -> Result<Readiness, LimiterError> {
        if ticket.parse::<TicketId>().is_err() {
            return Ok(Readiness::Gone);
        }
        let (_, stands) = self.wait_check(&[ticket], hold_ms.map(to_i64)).await?;
        Ok(match stands.into_iter().next() {
            Some(Stand::Ready) => Readiness::Ready,
            Some(Stand::NotYet { retry_at, .. }) => Readiness::NotYet { retry_at },
            _ => Readiness::Gone,
        })
    }

    /// Answers every pending wait at once, and every later one as soon as it looks (SIGTERM).
    pub fn end_waits(&self) {
        self.wakes.ended.store(true, Ordering::SeqCst);
        self.wakes.wake_all();
    }

    /// How many waits are pending (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn pending_waits(&self) -> usize {
        self.wakes.waits().len()
    }

    /// Starts the listener with the first wait, and waits (a moment at most, never past the
    /// wait's `deadline`, and not at all once waits are ended) until it listens.
    async fn listen(&self, deadline: tokio::time::Instant) {
        let wakes = &self.wakes;
        wakes.listener.get_or_init(|| {
            let config = self.listen_config.clone();
            let channel = self.schema.clone();
            tokio::spawn(listener(Arc::downgrade(wakes), config, channel)).abort_handle()
        });
        if wakes.ended.load(Ordering::SeqCst) {
            return;
        }
        let mut listening = wakes.listening.subscribe();
        let until = deadline.min(tokio::time::Instant::now() + LISTEN_WITHIN);
        let _ = tokio::time::timeout_at(until, listening.wait_for(|on| *on)).await;
    }
}

/// The listener: one connection that `LISTEN`s on `channel` and wakes the waits of every key
/// notified, opened again whenever it is lost (every wait woken then), until the limiter is gone.
async fn listener(wakes: Weak<Wakes>, config: tokio_postgres::Config, channel: String) {
    let mut pause = RECONNECT_FIRST;
    loop {
        let (listened, why) = listen_once(&wakes, &config, &channel).await;
        let Some(limiter) = wakes.upgrade() else { return };
        limiter.listening.send_replace(false);
        drop(limiter);
        tracing::debug!(error = %why, "the wake listener's connection ended; opening it again");
        if listened {
            pause = RECONNECT_FIRST;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

/// Connects, listens and wakes until the connection ends: whether it listened, and why it
/// ended. Once it listens it wakes every wait once (notifications may have been missed before).
async fn listen_once(wakes: &Weak<Wakes>, config: &tokio_postgres::Config, channel: &str) -> (bool, String) {
    let (client, mut connection) = match config.connect(crate::tls()).await {
        Ok(connected) => connected,
        Err(e) => return (false, e.to_string()),
    };
    let (done, ended) = tokio::sync::oneshot::channel::<String>();
    let weak = wakes.clone();
    // The connection's messages: notifications wake, anything else is the connection's own.
    let messages = tokio::spawn(async move {
        let why = loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                    let Some(wakes) = weak.upgrade() else { break "the limiter is gone".to_owned() };
                    wakes.wake(n.payload());
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => break e.to_string(),
                None => break "the connection closed".to_owned(),
            }
        };
        let _ = done.send(why);
    });
    // (A connection lost meanwhile fails the statement.)
    if let Err(e) = client.batch_execute(&format!("LISTEN \"{channel}\"")).await {
        messages.abort();
        return (false, e.to_string());
    }
    if let Some(wakes) = wakes.upgrade() {
        wakes.listening.send_replace(true);
        // Every wait looks again: one that looked before this LISTEN took effect may have missed
        // a notification (and after a lost connection, notifications were surely missed).
        wakes.wake_all();
    }
    let why = ended.await.unwrap_or_else(|_| "the connection's task ended".to_owned());
    drop(client);
    (true, why)
}
