//! `/wait` (section 15) in the embedded limiter: a wait answers as soon as one of its tickets is
//! ready or gone, or at its timeout.
//!
//! A wait never holds the engine's lock while it waits. It looks under the lock (the engine
//! says how each ticket stands, [`Engine::readiness`]), and when none is ready or gone it
//! registers the keys its tickets are woken by (their buckets, their caller key) and sleeps
//! until the soonest instant a ticket was told, its timeout, or a wake: after every decision and
//! sweep, the keys where the engine noted that room may have come back (a release, a ticket
//! ending or leaving, a settle down, a lift, a lapse) wake the waits registered under them, at
//! once, and each looks again. While it waits, each of its tickets is held from lapsing up to
//! the wait's end plus its grace (never past its horizon).
//!
//! Pending waits are bounded ([`LimiterOptions::max_waits`]): past the bound a wait answers at
//! once, with empty lists. [`Limiter::end_waits`] (the server's SIGTERM) answers every pending
//! wait at once, and every later one too.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Notify;

use super::pipeline::Shared;
use super::{Limiter, LimiterError};
use crate::engine::Readiness;
use crate::request::WaitRequest;
use crate::time::Millis;

/// How a wait ended: the tickets ready and gone (each possibly empty), at the limiter's `now`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WaitAnswer {
    pub ready: Vec<String>,
    pub gone: Vec<String>,
    pub now: Millis,
}

/// The pending waits, by id, and the ids registered under each key: each wait registers the keys
/// it is woken by with its [`Notify`], and a change wakes those registered under the keys it
/// freed. Shared with PostgreSQL mode, whose changes arrive as notifications.
#[derive(Debug, Default)]
pub struct Waits {
    next: u64,
    by_id: HashMap<u64, (Vec<Arc<str>>, Arc<Notify>)>,
    by_key: HashMap<Arc<str>, Vec<u64>>,
}

impl Waits {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// How many waits are registered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Registers a wait woken by `keys` through `notify`; its id, to [unregister](Waits::unregister) it.
    pub fn register(&mut self, keys: Vec<Arc<str>>, notify: Arc<Notify>) -> u64 {
        self.next += 1;
        let id = self.next;
        for key in &keys {
            self.by_key.entry(key.clone()).or_default().push(id);
        }
        self.by_id.insert(id, (keys, notify));
        id
    }

    pub fn unregister(&mut self, id: u64) {
        let Some((keys, _)) = self.by_id.remove(&id) else { return };
        for key in keys {
            if let Some(ids) = self.by_key.get_mut(&key) {
                ids.retain(|&other| other != id);
                if ids.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    /// Wakes every wait registered under one of `keys`.
    pub fn wake<K: std::borrow::Borrow<str>>(&self, keys: &[K]) {
        for key in keys {
            let key: &str = key.borrow();
            for id in self.by_key.get(key).into_iter().flatten() {
                if let Some((_, notify)) = self.by_id.get(id) {
                    notify.notify_one();
                }
            }
        }
    }

    /// Wakes every wait.
    pub fn wake_all(&self) {
        for (_, notify) in self.by_id.values() {
            notify.notify_one();
        }
    }
}

/// Unregisters a wait however it ends (answered, timed out, or its caller gone).
struct Registered<'a> {
    shared: &'a Shared,
    id: Option<u64>,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id else { return };
        let mut core = self.shared.lock();
        core.waits.unregister(id);
        if core.waits.is_empty() {
            core.engine.watch_freed(false);
        }
    }
}

impl Limiter {
    /// Waits until one of `req.tickets` is ready or gone, or `req.timeout_ms` passes (section
    /// 15); see the module docs. Counts nowhere and grants nothing.
    pub async fn wait(&self, req: WaitRequest) -> Result<WaitAnswer, LimiterError> {
        let shared = &*self.shared;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms);
        let notify = Arc::new(Notify::new());
        let mut registered = Registered { shared, id: None };
        loop {
            let next = {
                let mut core = shared.lock();
                if let Some(why) = core.broken.clone() {
                    return Err(LimiterError::Unavailable(why));
                }
                let now = shared.now(&mut core);
                if core.engine.next_deadline().is_some_and(|at| at <= now) {
                    core.sweep(now);
                }
                let mut answer = WaitAnswer { now, ..WaitAnswer::default() };
                let mut next: Option<Millis> = None;
                for ticket in &req.tickets {
                    match core.engine.readiness(ticket, now) {
                        Readiness::Ready => answer.ready.push(ticket.clone()),
                        Readiness::Gone => answer.gone.push(ticket.clone()),
                        Readiness::NotYet { retry_at } => next = Some(next.map_or(retry_at, |n| n.min(retry_at))),
                    }
                }
                let over = core.closing
                    || shared.waits_ended.load(Ordering::SeqCst)
                    || tokio::time::Instant::now() >= deadline;
                if !answer.ready.is_empty() || !answer.gone.is_empty() || over {
                    return Ok(answer);
                }
                if registered.id.is_none() {
                    if core.waits.len() >= shared.max_waits {
                        shared.metrics.decided("wait", "full", "");
                        return Ok(answer);
                    }
                    let mut keys: Vec<Arc<str>> =
                        req.tickets.iter().flat_map(|t| core.engine.wake_keys(t, now)).collect();
                    keys.sort_unstable();
                    keys.dedup();
                    registered.id = Some(core.waits.register(keys, notify.clone()));
                    core.engine.watch_freed(true);
                    // Held from lapsing while waited (its grace after the wait's end at least).
                    let until = now.plus(req.timeout_ms);
                    let before = core.effects.len();
                    let core = &mut *core;
                    for ticket in &req.tickets {
                        core.engine.hold_ticket(ticket, until, now, &mut core.effects);
                    }
                    if core.effects.len() > before && core.waiting.is_empty() {
                        core.deferred_since.get_or_insert(now);
                    }
                }
                next
            };
            let mut wake_at = deadline;
            if let Some(next) = next {
                let now = shared.clock.now();
                wake_at = wake_at.min(tokio::time::Instant::now() + Duration::from_millis(next.since(now).max(1)));
            }
            // Woken, or at the instant: either way it looks again.
            let _ = tokio::time::timeout_at(wake_at, notify.notified()).await;
        }
    }

    /// Answers every pending wait at once, and every later one as soon as it looks (SIGTERM).
    pub fn end_waits(&self) {
        self.shared.waits_ended.store(true, Ordering::SeqCst);
        self.shared.lock().waits.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::LimiterOptions;
    use crate::request::{AcquireRequest, LeaveRequest, Limit, ReleaseRequest};
    use crate::time::FakeClock;
    use crate::{Decision, Millis};

    const T0: Millis = Millis(1_764_460_800_000);

    /// A limiter on a fake clock whose recheck is a minute, so that only a wake (never a poll at
    /// the recheck) answers a wait on a concurrency refusal early.
    fn limiter(dir: &tempfile::TempDir, max_waits: usize) -> Arc<Limiter> {
        let options = LimiterOptions {
            clock: Some(Arc::new(FakeClock::new(T0))),
            id_seed: Some(1),
            recheck_ms: 60_000,
            max_waits,
            ..LimiterOptions::default()
        };
        Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap())
    }

    /// A place held in `c` (its permit), and a ticket of the same request queued behind it.
    async fn held_and_queued(limiter: &Limiter) -> (String, String) {
        let req = AcquireRequest::new("caller", vec![Limit::concurrent("c", 1)]).unwrap();
        let Decision::Granted { permit: Some(permit), .. } = limiter.acquire(req.clone()).await.unwrap() else {
            panic!("granted")
        };
        let ticket = limiter.acquire_reported(req.with_queue()).await.unwrap().ticket.expect("queued").id;
        (permit.to_string(), ticket.to_string())
    }

    fn wait(limiter: &Arc<Limiter>, ticket: &str, timeout_ms: u64) -> tokio::task::JoinHandle<WaitAnswer> {
        let (limiter, req) = (limiter.clone(), WaitRequest::new(vec![ticket.to_owned()], timeout_ms).unwrap());
        tokio::spawn(async move { limiter.wait(req).await.unwrap() })
    }

    /// Lets every task run until it blocks (the clock is paused: no time passes).
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_wakes_the_wait_on_a_ticket_it_makes_ready_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let limiter = limiter(&dir, 16);
        let (permit, ticket) = held_and_queued(&limiter).await;
        let started = tokio::time::Instant::now();
        let waiting = wait(&limiter, &ticket, 30_000);
        settle().await;
        assert!(!waiting.is_finished(), "not ready while the place is held");
        assert!(limiter.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
        let answer = waiting.await.unwrap();
        assert_eq!((answer.ready, answer.gone), (vec![ticket.clone()], vec![]));
        assert_eq!(started.elapsed(), Duration::ZERO, "woken by the release, not by a timer");
        assert!(limiter.shared.lock().waits.is_empty(), "unregistered");
        // Asked with its ticket, it is granted: one hand-off, measured from the release.
        let again =
            AcquireRequest::new("caller", vec![Limit::concurrent("c", 1)]).unwrap().with_ticket(ticket).unwrap();
        assert!(limiter.acquire(again).await.unwrap().is_granted());
        let metrics = limiter.metrics().encode();
        assert!(metrics.contains("redb_limiter_release_to_grant_seconds_count 1"), "{metrics}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_ticket_that_leaves_is_gone_and_a_wait_times_out_with_empty_lists() {
        let dir = tempfile::tempdir().unwrap();
        let limiter = limiter(&dir, 16);
        let (_permit, ticket) = held_and_queued(&limiter).await;
        let waiting = wait(&limiter, &ticket, 30_000);
        settle().await;
        assert!(limiter.leave(LeaveRequest::new(ticket.clone()).unwrap()).await.unwrap());
        assert_eq!(waiting.await.unwrap().gone, vec![ticket]);
        let req = AcquireRequest::new("caller", vec![Limit::concurrent("c", 1)]).unwrap().with_queue();
        let queued = limiter.acquire_reported(req).await.unwrap().ticket.expect("queued").id.to_string();
        let started = tokio::time::Instant::now();
        let answer = wait(&limiter, &queued, 1_000).await.unwrap();
        assert_eq!((answer.ready.len(), answer.gone.len()), (0, 0));
        assert_eq!(started.elapsed(), Duration::from_millis(1_000));
        assert_eq!(limiter.state("c").await.unwrap().view.buckets[0].queued, 1, "still in line");
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_bound_a_wait_answers_at_once_and_end_waits_answers_every_pending_one() {
        let dir = tempfile::tempdir().unwrap();
        let limiter = limiter(&dir, 1);
        let (_permit, ticket) = held_and_queued(&limiter).await;
        let first = wait(&limiter, &ticket, 30_000);
        settle().await;
        let started = tokio::time::Instant::now();
        let second = wait(&limiter, &ticket, 30_000).await.unwrap();
        assert_eq!((second.ready.len(), second.gone.len(), started.elapsed()), (0, 0, Duration::ZERO));
        assert!(!first.is_finished());
        limiter.end_waits();
        let answer = first.await.unwrap();
        assert_eq!((answer.ready.len(), answer.gone.len(), started.elapsed()), (0, 0, Duration::ZERO));
        let later = wait(&limiter, &ticket, 30_000).await.unwrap();
        assert!(later.ready.is_empty() && started.elapsed() == Duration::ZERO, "answered at once after the end");
    }
}
