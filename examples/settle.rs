//! A host that pays for LLM calls with their real token counts: it estimates each request's
//! tokens, acquires with that estimate and `permit: true`, calls the provider, and settles the
//! grant to the usage the provider reports.
//!
//! The provider is a local fake of Anthropic's Messages API (axum on loopback) whose replies
//! use far fewer tokens than `max_tokens` allows, as real replies mostly do. The tokens-per-window
//! limit (3,000 a second) holds about two estimates at once; settling to the real usage frees
//! the rest at once, so the calls go through several times faster than the estimates alone
//! would allow. Each call prints its estimate, its usage, and the window's use after the settle
//! (read with a peek, which changes nothing).
//!
//! Run: `cargo run --example settle`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::Json;
use redb_limiter::{AcquireRequest, Cost, Limit, Limiter};
use redb_limiter_client::estimate::{Estimate, Provider};
use redb_limiter_client::{AcquireOptions, Client, WaitReport};
use serde_json::{Value, json};

/// The fake provider: a reply of 60 to 250 output tokens, with the input counted as the
/// provider would (here: a quarter of the prompt's characters, plus some read from its cache).
async fn messages(calls: Arc<AtomicU64>, Json(request): Json<Value>) -> Json<Value> {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    let prompt: usize = request["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["content"].as_str()).map(str::len).sum())
        .unwrap_or(0);
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    Json(json!({
        "type": "message",
        "content": [{"type": "text", "text": "..."}],
        "usage": {
            "input_tokens": prompt / 4,
            "output_tokens": 60 + (n * 53) % 190,
            "cache_read_input_tokens": 20,
        }
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let calls = Arc::new(AtomicU64::new(0));
    let app = {
        let calls = calls.clone();
        axum::Router::new().route("/v1/messages", axum::routing::post(move |body| messages(calls.clone(), body)))
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider_url = format!("http://{}/v1/messages", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let dir = tempfile::tempdir()?;
    let limiter = Arc::new(Limiter::open(dir.path().join("limiter.redb"))?);
    let started = Instant::now();
    let client = Client::new(limiter).with_observer(move |w: &WaitReport| {
        println!(
            "[{:>5.2}s] waited {:>4} ms for {} ({})",
            started.elapsed().as_secs_f64(),
            w.waited_ms,
            w.limit,
            w.reason.as_str()
        );
    });
    let estimate = Estimate::new(Provider::Anthropic);
    let tpm = |cost: u64| Limit::window("demo/tpm", 3_000, 1_000).with_cost(cost);
    let http = reqwest::Client::new();
    let (mut estimated, mut used) = (0, 0);
    for call in 0..12u64 {
        let body = json!({
            "model": "demo",
            "max_tokens": 1_200,
            "messages": [{"role": "user", "content": "Summarise the attached notes. ".repeat(10 + call as usize)}],
        });
        let guess = estimate.request_tokens(body.to_string().as_bytes())?;
        let req = AcquireRequest::new("demo/cred:1", vec![tpm(guess)])?.with_permit();
        let permit = client.acquire(req, AcquireOptions::default()).await?;
        let reply = http.post(&provider_url).json(&body).send().await?.bytes().await?;
        let real = estimate.usage_tokens(&reply)?;
        permit.settle(vec![Cost::new("demo/tpm", real)]).await?;
        let window = client.peek(AcquireRequest::new("demo/cred:1", vec![tpm(0)])?).await?.limits[0].window;
        let (in_window, _) = window.unwrap_or_default();
        println!(
            "[{:>5.2}s] call {call:>2}: estimated {guess:>4} tokens, used {real:>3}; the window holds {in_window:>4}/3000",
            started.elapsed().as_secs_f64()
        );
        (estimated, used) = (estimated + guess, used + real);
        drop(permit);
    }
    println!(
        "done: 12 calls in {:.2}s, {} provider requests; estimated {estimated} tokens, settled to {used}",
        started.elapsed().as_secs_f64(),
        calls.load(Ordering::SeqCst)
    );
    Ok(())
}
