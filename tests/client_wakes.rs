//! The Rust client and wake-ups (section 15 of the wire), against the real server binary this
//! package builds, started with a recheck of a minute: a caller refused for concurrency is
//! told to ask again a minute on, so only a wake serves it sooner. A head holding a ticket waits
//! on `/wait`, woken when another process releases; a release in its own process wakes it
//! without the server's help.

mod common;
use common::start_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redb_limiter::request::Cost;
use redb_limiter::{AcquireRequest, Limit, Millis};
use redb_limiter_client::{AcquireOptions, Client, ClientError, HttpLimiter, LimiterApi, Outcome, PeekOutcome};

fn place(bucket: &str) -> AcquireRequest {
    AcquireRequest::new("me", vec![Limit::concurrent(bucket, 1)]).unwrap()
}

/// A limiter of the wire that keeps no waits (as a server of wire version 3): every method goes
/// to the real server, `/wait` is never asked.
struct NoWaits(HttpLimiter);

impl LimiterApi for NoWaits {
    async fn acquire(&self, req: AcquireRequest) -> Result<Outcome, ClientError> {
        self.0.acquire(req).await
    }
    async fn acquire_within(&self, req: AcquireRequest, max_wait: Option<Duration>) -> Result<Outcome, ClientError> {
        self.0.acquire_within(req, max_wait).await
    }
    async fn release(&self, permit: String) -> Result<bool, ClientError> {
        self.0.release(permit).await
    }
    async fn throttle(&self, key: String, until: Millis) -> Result<Option<Millis>, ClientError> {
        self.0.throttle(key, until).await
    }
    async fn peek(&self, req: AcquireRequest) -> Result<PeekOutcome, ClientError> {
        self.0.peek(req).await
    }
    async fn settle(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        self.0.settle(permit, costs).await
    }
    async fn release_with_costs(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        self.0.release_with_costs(permit, costs).await
    }
    async fn leave(&self, ticket: String) -> Result<bool, ClientError> {
        self.0.leave(ticket).await
    }
    async fn lift(&self, key: String) -> Result<bool, ClientError> {
        self.0.lift(key).await
    }
    async fn undo(&self, id: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        self.0.undo(id, costs).await
    }
}

/// A second process's caller queued behind a held place is granted as soon as the first
/// process releases it: its `/wait` is woken by the release, not its retryAt a minute on.
#[tokio::test]
async fn a_release_by_another_process_wakes_the_head_waiting_on_its_ticket() {
    let server = start_server(&["--recheck-ms", "60000"]);
    let first = Client::new(Arc::new(HttpLimiter::new(&server.url, None)));
    let second = Client::new(Arc::new(HttpLimiter::new(&server.url, None)));
    let held = first.try_acquire(place("cross")).await.unwrap();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let permit = second.acquire(place("cross"), AcquireOptions::default()).await.unwrap();
        (permit.at(), started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "granted while the place was held");
    let released_at = Instant::now();
    assert!(held.release().await.unwrap());
    let (_, _) =
        tokio::time::timeout(Duration::from_secs(20), waiting).await.expect("served long before the recheck").unwrap();
    let served = released_at.elapsed();
    assert!(served < Duration::from_secs(10), "served {served:?} after the release: the recheck, not a wake");
}

/// Against a limiter that keeps no waits, a release in the same process wakes its waiter at
/// once: it asks again without waiting for its retryAt.
#[tokio::test]
async fn a_release_in_the_same_process_wakes_its_waiter_without_the_server() {
    let server = start_server(&["--recheck-ms", "60000"]);
    let client = Client::new(Arc::new(NoWaits(HttpLimiter::new(&server.url, None))));
    let held = client.try_acquire(place("local")).await.unwrap();
    let other = client.clone();
    let waiting = tokio::spawn(async move { other.acquire(place("local"), AcquireOptions::default()).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "granted while the place was held");
    let released_at = Instant::now();
    assert!(held.release().await.unwrap());
    tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("served long before the recheck")
        .unwrap()
        .unwrap();
    let served = released_at.elapsed();
    assert!(served < Duration::from_secs(10), "served {served:?} after the release: the recheck, not a wake");
}
