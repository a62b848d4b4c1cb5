//! The Rust client's figures, over the embedded limiter and the real server binary alike: a
//! refusal from `try_acquire` says which limit refused and its figures (also in its message),
//! and `usage()` reads each limit's figures with the count of this process's callers waiting
//! for the same shape. A token bucket with a burst above its rate (cuca's `burst`) reports its
//! level and burst the same way.

mod common;
use common::start_server;

use std::sync::Arc;
use std::time::Duration;

use redb_limiter::limiter::{Limiter, LimiterOptions};
use redb_limiter::{AcquireRequest, Limit};
use redb_limiter_client::{AcquireOptions, Client, ClientError, HttpLimiter, LimiterApi};

fn request(key: &str) -> AcquireRequest {
    AcquireRequest::new(
        "me",
        vec![Limit::window(format!("{key}/rpm"), 2, 60_000), Limit::concurrent(format!("{key}/conc"), 5)],
    )
    .unwrap()
}

async fn a_refusal_names_its_limit_and_figures<L: LimiterApi>(client: Client<L>) {
    let req = request("fig");
    let _a = client.try_acquire(req.clone()).await.unwrap();
    let _b = client.try_acquire(req.clone()).await.unwrap();
    let Err(ClientError::Refused(refusal)) = client.try_acquire(req.clone()).await else {
        panic!("the third of two a minute must be refused")
    };
    assert_eq!(refusal.limit, "fig/rpm");
    let figures = refusal.limit_figures().expect("the refusing limit's figures");
    assert_eq!(figures.window, Some((2, 0)));
    assert_eq!(refusal.figures.len(), 2, "every limit's, in the request's order");
    assert_eq!(refusal.figures[1].places, Some((2, 3)));
    let message = ClientError::Refused(refusal).to_string();
    assert!(
        message.starts_with("refused (rate) by fig/rpm until ") && message.ends_with("(used 2, remaining 0)"),
        "{message}"
    );
}

async fn usage_counts_this_processs_waiters<L: LimiterApi>(client: Client<L>) {
    let req = request("use");
    let usage = client.usage(req.clone()).await.unwrap();
    assert_eq!((usage.waiting, usage.limits[0].window, usage.refusal), (0, Some((0, 2)), None));
    let _a = client.try_acquire(req.clone()).await.unwrap();
    let _b = client.try_acquire(req.clone()).await.unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let (client, req) = (client.clone(), req.clone());
            tokio::spawn(async move { client.acquire(req, AcquireOptions::default()).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.waiting(&req) < 3 {
        assert!(tokio::time::Instant::now() < deadline, "the three never waited");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let usage = client.usage(req.clone()).await.unwrap();
    assert_eq!(usage.waiting, 3);
    assert_eq!(usage.limits[0].window, Some((2, 0)));
    assert_eq!(usage.refusal.map(|r| r.limit), Some("use/rpm".to_owned()));
    for waiter in waiters {
        waiter.abort();
    }
    while client.waiting(&req) > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the aborted waiters never left");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// cuca's shape: 10 a minute with a burst of 20, as a token bucket that starts full.
async fn a_bucket_with_a_burst_says_its_level<L: LimiterApi>(client: Client<L>) {
    let req = AcquireRequest::new("me", vec![Limit::bucket("cuca/rpm", 10, 60_000).with_burst(20)]).unwrap();
    for _ in 0..20 {
        client.try_acquire(req.clone()).await.unwrap();
    }
    let Err(ClientError::Refused(refusal)) = client.try_acquire(req.clone()).await else {
        panic!("the 21st of a burst of 20 must be refused")
    };
    assert_eq!(refusal.limit_figures().and_then(|f| f.bucket), Some((0, 20)));
    let message = ClientError::Refused(refusal.clone()).to_string();
    assert!(message.ends_with("(level 0, burst 20)"), "{message}");
    // A token every 6 s: the refusal names the instant the next one is in.
    let usage = client.usage(req).await.unwrap();
    assert_eq!((usage.limits[0].bucket, usage.waiting), (Some((0, 20)), 0));
    assert_eq!(usage.refusal.map(|r| r.retry_at), Some(refusal.retry_at));
}

#[tokio::test]
async fn embedded() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), LimiterOptions::default()).unwrap());
    a_refusal_names_its_limit_and_figures(Client::new(limiter.clone())).await;
    usage_counts_this_processs_waiters(Client::new(limiter.clone())).await;
    a_bucket_with_a_burst_says_its_level(Client::new(limiter)).await;
}

#[tokio::test]
async fn over_http() {
    let server = start_server(&[]);
    let limiter = Arc::new(HttpLimiter::new(server.url.clone(), None));
    a_refusal_names_its_limit_and_figures(Client::new(limiter.clone())).await;
    usage_counts_this_processs_waiters(Client::new(limiter.clone())).await;
    a_bucket_with_a_burst_says_its_level(Client::new(limiter)).await;
}
