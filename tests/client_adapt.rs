//! The Rust client and adaptive ceilings (wire section 14), against the real server binary this
//! package builds: a request that adapts asks for a permit by itself; a permit's explicit release
//! reports `clean` (the ceiling grows while it binds), one that saw a 429 through
//! `observe_response_for` throttles the caller and cuts the ceiling, once for the grants before
//! the cut; a dropped permit reports only a `limited` it saw; a floor on the remaining count
//! makes a success `limited`.

mod common;
use common::start_server;

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use redb_limiter::request::{Adapt, Signal};
use redb_limiter::{AcquireRequest, Limit};
use redb_limiter_client::{Client, HttpLimiter};

fn request(bucket: &str, adapt: Adapt) -> AcquireRequest {
    AcquireRequest::new("me", vec![Limit::window(bucket, 10, 60_000).with_adapt(adapt)]).unwrap()
}

async fn ceiling(client: &Client<HttpLimiter>, req: &AcquireRequest) -> u64 {
    client.peek(req.clone()).await.unwrap().limits[0].ceiling.expect("an adapted limit reports its ceiling")
}

/// Waits (at most 5 s) for the ceiling of `req` to become `want` (a dropped permit's release
/// runs in the background).
async fn until_ceiling(client: &Client<HttpLimiter>, req: &AcquireRequest, want: u64) {
    for _ in 0..100 {
        if ceiling(client, req).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the ceiling never became {want}: it is {}", ceiling(client, req).await);
}

#[tokio::test]
async fn a_429_seen_through_observe_response_for_throttles_and_cuts_once_for_the_grants_before_it() {
    let server = start_server(&[]);
    let client = Client::new(Arc::new(HttpLimiter::new(server.url.clone(), None)));
    let req = request("org/rpm", Adapt { min: 2, max: 20, increase: 1, keep_pct: 50 });
    assert_eq!(ceiling(&client, &req).await, 10, "it starts at calls");
    let mut a = client.try_acquire(req.clone()).await.unwrap();
    let mut b = client.try_acquire(req.clone()).await.unwrap();
    assert!(a.id().is_some() && a.adapted(), "a request that adapts asks for a permit by itself");
    let mut limited = HeaderMap::new();
    limited.insert("retry-after", "1".parse().unwrap());
    let until = client.observe_response_for("me", &mut a, 429, &limited, b"", None).await.unwrap();
    assert!(until.is_some(), "the 429 throttles the caller");
    assert_eq!(a.outcome(), Some(Signal::Limited));
    assert_eq!(ceiling(&client, &req).await, 5, "the throttle naming the permit cut the ceiling");
    // b was granted before that cut: the same overload, no second cut.
    client.observe_response_for("me", &mut b, 429, &limited, b"", None).await.unwrap();
    assert_eq!(ceiling(&client, &req).await, 5);
    assert!(a.release().await.unwrap());
    drop(b);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ceiling(&client, &req).await, 5);
}

#[tokio::test]
async fn an_explicit_release_is_clean_a_dropped_permit_reports_only_a_limited_it_saw() {
    let server = start_server(&[]);
    let client = Client::new(Arc::new(HttpLimiter::new(server.url.clone(), None)));
    let req = request("org/grow", Adapt { min: 1, max: 20, increase: 3, keep_pct: 50 });
    // Five grants in the window: the next one is in play (at least half of the ceiling, 10).
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(client.try_acquire(req.clone()).await.unwrap());
    }
    // Dropped without a release: no clean outcome, the ceiling does not grow.
    drop(client.try_acquire(req.clone()).await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ceiling(&client, &req).await, 10);
    // Released: clean, and the ceiling was in play at its grant: it grows by 3.
    let grown = client.try_acquire(req.clone()).await.unwrap();
    assert!(grown.release().await.unwrap());
    assert_eq!(ceiling(&client, &req).await, 13);
    // A success with 2 requests left, at a floor of 2, is limited; dropped, it still reports it.
    let mut low = client.try_acquire(req.clone()).await.unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-remaining-requests", "2".parse().unwrap());
    assert_eq!(low.observe(200, &headers, Some(2)), Some(Signal::Limited));
    assert_eq!(low.observe(200, &HeaderMap::new(), Some(2)), Some(Signal::Clean));
    assert_eq!(low.outcome(), Some(Signal::Limited), "limited stays");
    drop(low);
    until_ceiling(&client, &req, 6).await;
    for permit in held {
        permit.release_with_outcome(Signal::Clean).await.unwrap();
    }
}
