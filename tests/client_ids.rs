//! The Rust client and request ids (section 16 of the wire), against the real server binary
//! this package builds, behind a proxy of the test's own that delays or swallows the server's
//! replies: however the client stops waiting for an answer (its HTTP timeout, `max_wait`, a
//! dropped future), it undoes the ask by its id, so `/state` shows nothing it may have been
//! granted or filed; and a hung server makes every waiter of a shape fail after one timeout,
//! not one each.

mod common;
use common::{Server, start_server};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redb_limiter::{AcquireRequest, Limit};
use redb_limiter_client::{AcquireOptions, Client, ClientError, HttpLimiter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP proxy in front of the server: requests pass at once; each chunk of a reply is held
/// `delay_ms` (set while running) before it is passed on. `u64::MAX` holds replies for good.
struct Proxy {
    url: String,
    delay_ms: Arc<AtomicU64>,
}

async fn proxy(upstream: &str) -> Proxy {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let upstream = upstream.trim_start_matches("http://").to_owned();
    let delay_ms = Arc::new(AtomicU64::new(0));
    let delay = delay_ms.clone();
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else { return };
            let (upstream, delay) = (upstream.clone(), delay.clone());
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else { return };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move { tokio::io::copy(&mut client_read, &mut server_write).await });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let Ok(n) = server_read.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    match delay.load(Ordering::SeqCst) {
                        u64::MAX => std::future::pending::<()>().await,
                        ms => tokio::time::sleep(Duration::from_millis(ms)).await,
                    }
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Proxy { url, delay_ms }
}

/// The places held and tickets waiting under `prefix`, read from the server directly.
async fn held(server: &Server, prefix: &str) -> (u64, u64) {
    let state: serde_json::Value =
        reqwest::get(format!("{}/state?prefix={prefix}", server.url)).await.unwrap().json().await.unwrap();
    let buckets = state["buckets"].as_array().cloned().unwrap_or_default();
    let sum = |field: &str| buckets.iter().map(|b| b[field].as_u64().unwrap_or(0)).sum();
    (sum("placesHeld"), sum("queued"))
}

/// Polls `held` until it reads (0, 0), for at most `within`.
async fn nothing_held_within(server: &Server, prefix: &str, within: Duration) -> (u64, u64) {
    let until = Instant::now() + within;
    loop {
        let now = held(server, prefix).await;
        if now == (0, 0) || Instant::now() > until {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn place(bucket: &str) -> AcquireRequest {
    AcquireRequest::new("me", vec![Limit::concurrent(bucket, 1), Limit::window(format!("{bucket}-rpm"), 1, 60_000)])
        .unwrap()
}

#[tokio::test]
async fn a_grant_whose_answer_came_after_the_timeout_is_undone_and_counts_nowhere() {
    let server = start_server(&[]);
    let proxy = proxy(&server.url).await;
    proxy.delay_ms.store(400, Ordering::SeqCst);
    let slow = Client::new(Arc::new(HttpLimiter::new(&proxy.url, None).with_timeout(Duration::from_millis(150))));
    match slow.try_acquire(place("t1")).await {
        Err(ClientError::Unreachable(_)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(nothing_held_within(&server, "t1", Duration::from_secs(2)).await, (0, 0), "the place was undone");
    // Its window counts nowhere either: the next caller gets both at once.
    let direct = Client::new(Arc::new(HttpLimiter::new(&server.url, None)));
    assert!(direct.try_acquire(place("t1")).await.is_ok());
}

#[tokio::test]
async fn max_wait_holds_while_a_request_is_in_flight_and_what_it_got_is_undone() {
    let server = start_server(&[]);
    let proxy = proxy(&server.url).await;
    proxy.delay_ms.store(u64::MAX, Ordering::SeqCst);
    let client = Client::new(Arc::new(HttpLimiter::new(&proxy.url, None)));
    let started = Instant::now();
    let options = AcquireOptions { max_wait: Some(Duration::from_millis(300)), ..AcquireOptions::default() };
    match client.acquire(place("t2"), options).await {
        Err(ClientError::QueueTimeout { .. }) => {}
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2), "gave up after {:?}", started.elapsed());
    // The server granted it (only its reply is held): the undo, sent through the same proxy,
    // reached it too.
    assert_eq!(nothing_held_within(&server, "t2", Duration::from_secs(2)).await, (0, 0));
}

#[tokio::test]
async fn a_dropped_acquire_is_undone_at_once_whatever_it_was_granted_or_filed() {
    let server = start_server(&[]);
    let direct = Client::new(Arc::new(HttpLimiter::new(&server.url, None)));
    // A held place, so the next ask of the shape queues in the limiter's line.
    let first = direct.try_acquire(place("t3")).await.unwrap();
    let proxy = proxy(&server.url).await;
    proxy.delay_ms.store(u64::MAX, Ordering::SeqCst);
    let client = Client::new(Arc::new(HttpLimiter::new(&proxy.url, None)));
    let waiting =
        tokio::time::timeout(Duration::from_millis(300), client.acquire(place("t3"), AcquireOptions::default()));
    assert!(waiting.await.is_err(), "still waiting when dropped");
    drop(first);
    // The ticket its ask filed (its reply held back) left the line with its undo.
    assert_eq!(nothing_held_within(&server, "t3", Duration::from_secs(2)).await, (0, 0));
}

#[tokio::test]
async fn five_waiters_of_a_shape_against_a_hung_server_fail_after_one_timeout() {
    let server = start_server(&[]);
    let proxy = proxy(&server.url).await;
    proxy.delay_ms.store(u64::MAX, Ordering::SeqCst);
    let client = Client::new(Arc::new(HttpLimiter::new(&proxy.url, None).with_timeout(Duration::from_millis(500))));
    let started = Instant::now();
    let waits: Vec<_> = (0..5)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let result = client.acquire(place("t4"), AcquireOptions::default()).await;
                (result.map(drop), started.elapsed())
            })
        })
        .collect();
    for wait in waits {
        let (result, after) = wait.await.unwrap();
        assert!(matches!(result, Err(ClientError::Unreachable(_))), "{result:?}");
        assert!(after < Duration::from_millis(1_400), "a waiter failed after {after:?}: one timeout each");
    }
}
