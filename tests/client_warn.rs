//! The Rust client's wait warnings, against the real server binary this package builds: an
//! observer is told, with the line's figures, as each acquire joins a line of its request shape
//! that has reached its fraction of `max_waiters`; one that errs turns that acquire away, which
//! gives back its place in the line and leaves nothing in the limiter's.

mod common;
use common::start_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb_limiter::engine::Reason;
use redb_limiter::{AcquireRequest, Limit};
use redb_limiter_client::warn::{InvalidWarnFraction, LineUsage};
use redb_limiter_client::{AcquireOptions, Client, ClientError, HttpLimiter};

fn place(bucket: &str) -> AcquireRequest {
    AcquireRequest::new("me", vec![Limit::concurrent(bucket, 1)]).unwrap()
}

fn within(max_waiters: usize) -> AcquireOptions {
    AcquireOptions { max_waiters: Some(max_waiters), ..AcquireOptions::default() }
}

/// Waits (at most 10 s) until the limiter's line of `bucket` holds `tickets` tickets.
async fn until_queued(client: &Client<HttpLimiter>, bucket: &str, tickets: u64) {
    for _ in 0..200 {
        let peeked = client.peek(place(bucket)).await.unwrap();
        if peeked.limits[0].queued.unwrap_or(0) == tickets {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the line of {bucket} never held {tickets} tickets");
}

#[tokio::test]
async fn an_observer_is_told_of_each_acquire_joining_a_line_at_its_fraction_of_max_waiters() {
    let server = start_server(&[]);
    let seen: Arc<Mutex<Vec<LineUsage>>> = Arc::default();
    let told = seen.clone();
    // The head's waits (each to its retryAt, the server's recheck): once it has waited, it has
    // been refused, and the line knows why.
    let waits = Arc::new(AtomicUsize::new(0));
    let waited = waits.clone();
    let client = Client::new(Arc::new(HttpLimiter::new(&server.url, None)))
        .without_wakes()
        .with_observer(move |_| {
            waited.fetch_add(1, Ordering::SeqCst);
        })
        .with_warning(0.5, move |usage| {
            told.lock().unwrap().push(usage.clone());
            Ok(())
        })
        .unwrap();
    let held = client.try_acquire(place("warned")).await.unwrap();
    // Three callers join one after another: at 1 of 4 nobody is told; at 2 and 3 of 4 it is.
    let mut waiters = Vec::new();
    for joined in 1..=3usize {
        let c = client.clone();
        waiters.push(tokio::spawn(async move { c.acquire(place("warned"), within(4)).await.map(drop) }));
        if joined == 1 {
            for _ in 0..200 {
                if waits.load(Ordering::SeqCst) > 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(waits.load(Ordering::SeqCst) > 0, "the head never waited");
        }
        for _ in 0..200 {
            if seen.lock().unwrap().len() == joined.saturating_sub(1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let usages = seen.lock().unwrap().clone();
    assert_eq!(usages.iter().map(|u| u.waiting).collect::<Vec<_>>(), vec![2, 3], "{usages:?}");
    for usage in &usages {
        assert_eq!(
            (usage.key.as_str(), usage.limits.as_slice(), usage.max_waiters),
            ("me", &["warned".to_owned()][..], 4)
        );
        // What the line waits for: the head's refusal, for the place held.
        let last = usage.last.as_ref().expect("the head had been refused");
        assert_eq!((last.reason, last.limit.as_str()), (Reason::Concurrency, "warned"));
    }
    assert_eq!(usages[1].fraction(), 0.75);
    // Nobody was turned away: all three are served once the place is free.
    drop(held);
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(20), waiter).await.expect("served").unwrap().unwrap();
    }
}

#[tokio::test]
async fn an_observer_that_errs_turns_that_acquire_away_after_it_gave_back_its_place() {
    let server = start_server(&[]);
    let plain = Client::new(Arc::new(HttpLimiter::new(&server.url, None)));
    let seen: Arc<Mutex<Vec<LineUsage>>> = Arc::default();
    let told = seen.clone();
    // The same lines as `plain`, with an observer that turns a caller away from 2 of 3 waiting.
    let warned = plain
        .clone()
        .with_warning(0.6, move |usage| {
            told.lock().unwrap().push(usage.clone());
            Err(format!("{} of {} wait already", usage.waiting, usage.max_waiters).into())
        })
        .unwrap();
    let held = plain.try_acquire(place("crowded")).await.unwrap();
    let first = plain.clone();
    let head = tokio::spawn(async move { first.acquire(place("crowded"), within(3)).await });
    until_queued(&plain, "crowded", 1).await;

    match warned.acquire(place("crowded"), within(3)).await {
        Err(ClientError::TurnedAway(why)) => assert_eq!(why, "2 of 3 wait already"),
        other => panic!("expected TurnedAway, got {:?}", other.map(drop)),
    }
    assert_eq!(seen.lock().unwrap().len(), 1);
    // Its place in the line is given back: with room for 2, one more may still wait ...
    let second = plain.clone();
    let behind = tokio::spawn(async move { second.acquire(place("crowded"), within(2)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!behind.is_finished(), "it waits behind the head, not refused as full");
    // ... and it left nothing in the limiter's line: the head's ticket is the only one.
    assert_eq!(plain.peek(place("crowded")).await.unwrap().limits[0].queued, Some(1));

    drop(held);
    let head = tokio::time::timeout(Duration::from_secs(20), head).await.expect("served").unwrap().unwrap();
    drop(head);
    tokio::time::timeout(Duration::from_secs(20), behind).await.expect("served").unwrap().unwrap();
}

#[tokio::test]
async fn a_warn_fraction_outside_zero_to_one_is_refused_naming_it() {
    let server = start_server(&[]);
    let client = Client::new(Arc::new(HttpLimiter::new(&server.url, None)));
    for bad in [0.0, -0.5, 1.5, f64::NAN] {
        let refused = client.clone().with_warning(bad, |_| Ok(())).err().expect("refused");
        assert!(refused.to_string().starts_with("warn_fraction must be"), "{refused}");
        assert!(matches!(refused, InvalidWarnFraction(f) if f.to_bits() == bad.to_bits()));
    }
    assert!(client.with_warning(1.0, |_| Ok(())).is_ok());
}
