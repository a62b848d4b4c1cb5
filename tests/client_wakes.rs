//! The Rust client and wake-ups (section 15 of the wire), against the real server binary this
//! package builds, started with a recheck of a minute: a caller refused for concurrency is
//! told to ask again a minute on, so only a wake serves it sooner. A head holding a ticket waits
//! on `/wait`, woken when another process releases; a release in its own process wakes it
//! without the server's help.

mod common;
use common::start_server;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redb_limiter::request::Cost;
use redb_limiter::{AcquireRequest, Limit, Millis};
use redb_limiter_client::{AcquireOptions, Client, ClientError, HttpLimiter, LimiterApi, Outcome, PeekOutcome, Waited};

fn place(bucket: &str) -> AcquireRequest {
    AcquireRequest::new("me", vec![Limit::concurrent(bucket, 1)]).unwrap()
}

/// A limiter of the wire whose every method goes to the real server, but for `/wait` when it
/// keeps no waits (as a server of wire version 3), counting the refusals its acquires get.
struct Through {
    http: HttpLimiter,
    waits: bool,
    refused: Arc<AtomicUsize>,
}

impl Through {
    fn new(url: &str, waits: bool) -> Self {
        Through { http: HttpLimiter::new(url, None), waits, refused: Arc::default() }
    }
}

impl LimiterApi for Through {
    async fn acquire(&self, req: AcquireRequest) -> Result<Outcome, ClientError> {
        self.acquire_within(req, None).await
    }
    async fn acquire_within(&self, req: AcquireRequest, max_wait: Option<Duration>) -> Result<Outcome, ClientError> {
        let outcome = self.http.acquire_within(req, max_wait).await;
        if matches!(outcome, Ok(Outcome::Refused(_))) {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        outcome
    }
    async fn release(&self, permit: String) -> Result<bool, ClientError> {
        self.http.release(permit).await
    }
    async fn throttle(&self, key: String, until: Millis) -> Result<Option<Millis>, ClientError> {
        self.http.throttle(key, until).await
    }
    async fn peek(&self, req: AcquireRequest) -> Result<PeekOutcome, ClientError> {
        self.http.peek(req).await
    }
    async fn settle(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        self.http.settle(permit, costs).await
    }
    async fn release_with_costs(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        self.http.release_with_costs(permit, costs).await
    }
    async fn leave(&self, ticket: String) -> Result<bool, ClientError> {
        self.http.leave(ticket).await
    }
    async fn wait(&self, tickets: Vec<String>, timeout: Duration) -> Result<Option<Waited>, ClientError> {
        if self.waits { self.http.wait(tickets, timeout).await } else { Ok(None) }
    }
    async fn lift(&self, key: String) -> Result<bool, ClientError> {
        self.http.lift(key).await
    }
    async fn undo(&self, id: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        self.http.undo(id, costs).await
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
    let client = Client::new(Arc::new(Through::new(&server.url, false)));
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

/// Another process's ticket stands first: a release in this process frees the room for it, and
/// this process's waiter, on `/wait` behind it, keeps waiting rather than ask (an ask the line
/// would refuse); the limiter answers its wait when its own turn comes.
#[tokio::test]
async fn a_release_in_the_same_process_leaves_a_pending_wait_to_the_limiter() {
    let server = start_server(&["--recheck-ms", "60000"]);
    let through = Through::new(&server.url, true);
    let refused = through.refused.clone();
    let mine = Client::new(Arc::new(through));
    let other = Client::new(Arc::new(HttpLimiter::new(&server.url, None)));
    let held = mine.try_acquire(place("kept")).await.unwrap();
    let first = tokio::spawn(async move { other.acquire(place("kept"), AcquireOptions::default()).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiter = mine.clone();
    let second = tokio::spawn(async move { waiter.acquire(place("kept"), AcquireOptions::default()).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(refused.load(Ordering::SeqCst), 1, "the second holds a ticket behind the first");
    assert!(held.release().await.unwrap());
    let served = tokio::time::timeout(Duration::from_secs(20), first).await.expect("the first woken").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(refused.load(Ordering::SeqCst), 1, "no ask at the release: the room was the first's");
    assert!(!second.is_finished(), "granted while the place was held");
    let released_at = Instant::now();
    assert!(served.release().await.unwrap());
    let permit = tokio::time::timeout(Duration::from_secs(20), second).await.expect("the second woken").unwrap();
    assert!(released_at.elapsed() < Duration::from_secs(10), "served by the recheck, not a wake");
    assert_eq!(refused.load(Ordering::SeqCst), 1);
    permit.release().await.unwrap();
}
