//! A host that fans out 50 calls to a rate-limited provider through the waiting client.
//!
//! The provider is a local fake (axum on loopback) that answers some calls 429 with
//! `Retry-After` and reports its request budget in Anthropic's headers. The host asks the
//! embedded limiter (a redb file in a temp folder) before each call, with a requests-per-window
//! limit, a tokens-per-window limit and a concurrency limit, and prints every admission and wait.
//! Swap `Limiter::open` for `HttpLimiter::new(url, token)` to ask a running server instead.
//!
//! Run: `cargo run --example host`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use redb_limiter::time::format_instant;
use redb_limiter::{AcquireRequest, Limit, Limiter};
use redb_limiter_client::{AcquireOptions, Client, WaitReport};

/// The fake provider: every 9th call is a 429 asking for a 1 s pause; every other answer reports
/// the requests left in its own budget of 20 a second, which runs out on every 20th call.
async fn provider(
    calls: Arc<AtomicU64>,
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
) -> (StatusCode, HeaderMap) {
    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(40)).await;
    in_flight.fetch_sub(1, Ordering::SeqCst);
    let mut headers = HeaderMap::new();
    if n.is_multiple_of(9) {
        headers.insert("retry-after", HeaderValue::from_static("1"));
        return (StatusCode::TOO_MANY_REQUESTS, headers);
    }
    let left = (20 - n % 20) % 20;
    headers.insert("anthropic-ratelimit-requests-remaining", left.to_string().parse().unwrap());
    let reset = redb_limiter::time::wall_clock_now().plus(1_000);
    headers.insert("anthropic-ratelimit-requests-reset", format_instant(reset).parse().unwrap());
    (StatusCode::OK, headers)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let app = {
        let (calls, in_flight, peak) = (calls.clone(), in_flight.clone(), peak.clone());
        axum::Router::new().route(
            "/v1/messages",
            axum::routing::post(move || provider(calls.clone(), in_flight.clone(), peak.clone())),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider_url = format!("http://{}/v1/messages", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir()?;
    let limiter = Arc::new(Limiter::open(dir.path().join("limiter.redb"))?);
    let started = Instant::now();
    let stamp = move || format!("[{:>5.2}s]", started.elapsed().as_secs_f64());
    let client = Client::new(limiter).with_observer(move |w: &WaitReport| {
        println!("{} waited {:>4} ms for {} ({})", stamp(), w.waited_ms, w.limit, w.reason.as_str());
    });

    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    for call in 0..50u64 {
        let (client, http, provider_url) = (client.clone(), http.clone(), provider_url.clone());
        tasks.push(tokio::spawn(async move {
            let tokens = 100 + (call * 37) % 200;
            let req = AcquireRequest::new(
                "demo/cred:1",
                vec![
                    Limit::window("demo/rpm", 12, 1_000),
                    Limit::window("demo/tpm", 2_000, 1_000).with_cost(tokens),
                    Limit::concurrent("demo/conc", 4).with_hold_ms(30_000),
                ],
            )?;
            loop {
                let asked = Instant::now();
                let permit = client.acquire(req.clone(), AcquireOptions::default()).await?;
                println!(
                    "[{:>5.2}s] call {call:>2} admitted ({tokens} tokens) after {} ms",
                    started.elapsed().as_secs_f64(),
                    asked.elapsed().as_millis()
                );
                let resp = http.post(&provider_url).send().await?;
                let status = resp.status().as_u16();
                let headers = resp.headers().clone();
                let body = resp.bytes().await?;
                let throttled = client.observe_response("demo/cred:1", status, &headers, &body).await?;
                if let (200, Some(until)) = (status, throttled) {
                    println!(
                        "[{:>5.2}s] call {call:>2} done; the provider's budget is spent: caller throttled until {}",
                        started.elapsed().as_secs_f64(),
                        format_instant(until)
                    );
                }
                if status == 429 {
                    // Give the places back rather than sleep on them, then ask again.
                    permit.release().await?;
                    println!(
                        "[{:>5.2}s] call {call:>2} got 429: caller throttled until {}",
                        started.elapsed().as_secs_f64(),
                        throttled.map(format_instant).unwrap_or_default()
                    );
                    continue;
                }
                drop(permit);
                return anyhow::Ok(());
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    println!(
        "done: 50 calls in {:.2}s, {} provider requests, at most {} in flight at once",
        started.elapsed().as_secs_f64(),
        calls.load(Ordering::SeqCst),
        peak.load(Ordering::SeqCst)
    );
    Ok(())
}
