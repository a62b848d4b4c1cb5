//! The hand-off mix (`--mix handoff`): how much of a concurrency limit its hosts actually use
//! when every freed place must reach the next waiter (section 15's wake-ups against the recheck).
//!
//! One bucket of `--concurrent` places (4 by default). `--hosts` hosts (each a [`Client`] of its
//! own over its own connection pool: separate processes, as far as the limiter can tell) run
//! `--workers` workers each, so the backlog stays saturated; every worker acquires a place,
//! holds it `--call-ms` (the provider call), releases it, and asks again at once. Two modes,
//! one after the other for `--seconds` each on buckets of their own: with recheck only (the
//! client waits on each `retryAt`, as before wake-ups) and with wake-ups (a head waits on
//! `/wait`, and a release in its own process wakes it). Per mode it reports:
//!
//! - calls completed against the ideal (`concurrent × seconds / call`, every place always held);
//! - the hand-off gap: for each release, the time from its answer to the next grant in the
//!   bucket (median and 99th percentile, in ms, on one machine's clock).
//!
//! With `--batch N` it measures a fixed backlog instead (issue 32's figure): N calls split
//! between the hosts, all asked at once, each holding its place `--call-ms`, `--runs` times;
//! per run the wall time against the ideal (`N × call / places`) and the hand-off gap.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use redb_limiter::{AcquireRequest, Limit};
use redb_limiter_client::{AcquireOptions, Client, HttpLimiter};
use serde::Serialize;

use crate::BenchArgs;

/// The figures of one mode.
#[derive(Clone, Debug, Serialize)]
pub struct HandoffMode {
    pub wakes: bool,
    pub completed: u64,
    pub ideal: f64,
    /// The places' time held by calls in the measured stretch over all of it: calls completed,
    /// counting the ones cut by its end in part, against the ideal.
    pub efficiency: f64,
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct HandoffReport {
    pub url: String,
    pub hosts: usize,
    pub workers: usize,
    pub concurrent: u64,
    pub call_ms: u64,
    pub seconds: f64,
    pub recheck_only: HandoffMode,
    pub with_wakes: HandoffMode,
}

impl HandoffReport {
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }
}

impl fmt::Display for HandoffReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "hand-off: {} hosts x {} workers on {} places, calls of {} ms, {:.0} s per mode, against {}",
            self.hosts, self.workers, self.concurrent, self.call_ms, self.seconds, self.url
        )?;
        for (name, m) in [("recheck only", &self.recheck_only), ("with wake-ups", &self.with_wakes)] {
            writeln!(
                f,
                "  {name:<14} completed {} of {:.0} ideal ({:.1}%), release-to-grant p50 {:.1} ms, p99 {:.1} ms",
                m.completed,
                m.ideal,
                100.0 * m.efficiency,
                m.gap_p50_ms,
                m.gap_p99_ms
            )?;
        }
        Ok(())
    }
}

/// One batch of `--batch` calls.
#[derive(Clone, Debug, Serialize)]
pub struct BatchRun {
    pub wall_ms: f64,
    pub gap_p50_ms: f64,
    pub gap_p90_ms: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct BatchReport {
    pub url: String,
    pub hosts: usize,
    pub concurrent: u64,
    pub calls: u64,
    pub call_ms: u64,
    pub ideal_ms: f64,
    pub runs: Vec<BatchRun>,
}

impl BatchReport {
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }

    /// The median run's wall time.
    #[must_use]
    pub fn median_ms(&self) -> f64 {
        let mut walls: Vec<f64> = self.runs.iter().map(|r| r.wall_ms).collect();
        walls.sort_by(f64::total_cmp);
        walls.get(walls.len() / 2).copied().unwrap_or(f64::NAN)
    }
}

impl fmt::Display for BatchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "hand-off batch: {} calls of {} ms through {} places from {} hosts, all at once, against {}; ideal {:.0} ms",
            self.calls, self.call_ms, self.concurrent, self.hosts, self.url, self.ideal_ms
        )?;
        for (i, r) in self.runs.iter().enumerate() {
            writeln!(
                f,
                "  run {}: {:.0} ms ({:.2}x the ideal), release-to-grant p50 {:.1} ms, p90 {:.1} ms",
                i + 1,
                r.wall_ms,
                r.wall_ms / self.ideal_ms,
                r.gap_p50_ms,
                r.gap_p90_ms
            )?;
        }
        let median = self.median_ms();
        writeln!(f, "  median {:.0} ms = {:.2}x the ideal", median, median / self.ideal_ms)
    }
}

/// `--batch`: the same backlog of calls, all asked at once from every host, `--runs` times.
pub async fn run_batch(args: &BenchArgs, calls: u64) -> anyhow::Result<BatchReport> {
    let concurrent = args.concurrent.unwrap_or(4);
    if args.hosts == 0 || calls == 0 || args.call_ms == 0 || args.runs == 0 {
        bail!("--mix handoff --batch needs --hosts, --batch, --call-ms and --runs above 0");
    }
    let nonce = redb_limiter::time::wall_clock_now().0;
    let mut runs = Vec::new();
    for run in 0..args.runs {
        let bucket = format!("bench/handoff/{nonce}/batch/{run}");
        runs.push(one_batch(args, &bucket, concurrent, calls).await?);
    }
    Ok(BatchReport {
        url: args.url.clone(),
        hosts: args.hosts,
        concurrent,
        calls,
        call_ms: args.call_ms,
        ideal_ms: (calls * args.call_ms) as f64 / concurrent as f64,
        runs,
    })
}

async fn one_batch(args: &BenchArgs, bucket: &str, concurrent: u64, calls: u64) -> anyhow::Result<BatchRun> {
    let events = Arc::new(Mutex::new(Events::default()));
    let req = AcquireRequest::new("bench/handoff", vec![Limit::concurrent(bucket.to_owned(), concurrent)])?;
    let clients: Vec<_> =
        (0..args.hosts).map(|_| Client::new(Arc::new(HttpLimiter::new(&args.url, args.token.clone())))).collect();
    // Opens each host's connection first, so that the run measures hand-offs, not connects.
    for client in &clients {
        client.peek(req.clone()).await?;
    }
    let call = Duration::from_millis(args.call_ms);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..calls {
        let (client, req, events) = (clients[i as usize % clients.len()].clone(), req.clone(), events.clone());
        tasks.push(tokio::spawn(async move {
            let permit = client.acquire(req, AcquireOptions::default()).await?;
            events.lock().expect("events").grants.push(redb_limiter::time::wall_clock_now().0);
            tokio::time::sleep(call).await;
            permit.release().await?;
            events.lock().expect("events").releases.push(redb_limiter::time::wall_clock_now().0);
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let wall_ms = started.elapsed().as_secs_f64() * 1000.0;
    let events = events.lock().expect("events");
    let gaps = handoff_gaps(&events.grants, &events.releases);
    Ok(BatchRun { wall_ms, gap_p50_ms: percentile(&gaps, 0.50), gap_p90_ms: percentile(&gaps, 0.90) })
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<HandoffReport> {
    let concurrent = args.concurrent.unwrap_or(4);
    let (hosts, workers) = (args.hosts, args.workers);
    if hosts == 0 || workers == 0 || args.call_ms == 0 || args.seconds <= 0.0 {
        bail!("--mix handoff needs --hosts, --workers, --call-ms and --seconds above 0");
    }
    if (hosts * workers) as u64 <= concurrent {
        bail!("--mix handoff needs more workers in all (--hosts x --workers) than --concurrent places");
    }
    let nonce = redb_limiter::time::wall_clock_now().0;
    let mut modes = Vec::new();
    for wakes in [false, true] {
        let bucket = format!("bench/handoff/{nonce}/{}", if wakes { "wakes" } else { "recheck" });
        modes.push(one_mode(args, &bucket, concurrent, wakes).await?);
    }
    let with_wakes = modes.pop().expect("two modes");
    let recheck_only = modes.pop().expect("two modes");
    Ok(HandoffReport {
        url: args.url.clone(),
        hosts,
        workers,
        concurrent,
        call_ms: args.call_ms,
        seconds: args.seconds,
        recheck_only,
        with_wakes,
    })
}

/// Grants (limiter's clock) and release answers (host's wall clock, the same machine's), in ms,
/// and the time each call held its place within the measured stretch.
#[derive(Default)]
struct Events {
    grants: Vec<u64>,
    releases: Vec<u64>,
    held: Duration,
}

async fn one_mode(args: &BenchArgs, bucket: &str, concurrent: u64, wakes: bool) -> anyhow::Result<HandoffMode> {
    let events = Arc::new(Mutex::new(Events::default()));
    let measure = Duration::from_secs_f64(args.seconds);
    let started = Instant::now();
    let end = started + measure;
    let req = AcquireRequest::new("bench/handoff", vec![Limit::concurrent(bucket.to_owned(), concurrent)])?;
    let mut tasks = Vec::new();
    for _ in 0..args.hosts {
        let limiter = Arc::new(HttpLimiter::new(&args.url, args.token.clone()));
        let client = if wakes { Client::new(limiter) } else { Client::new(limiter).without_wakes() };
        for _ in 0..args.workers {
            let (client, req, events) = (client.clone(), req.clone(), events.clone());
            let call = Duration::from_millis(args.call_ms);
            tasks.push(tokio::spawn(async move {
                let mut completed = 0u64;
                while Instant::now() < end {
                    let left = end.saturating_duration_since(Instant::now());
                    let options = AcquireOptions { max_wait: Some(left), ..AcquireOptions::default() };
                    let Ok(permit) = client.acquire(req.clone(), options).await else { break };
                    let granted = Instant::now();
                    events.lock().expect("events").grants.push(permit.at().0);
                    tokio::time::sleep(call).await;
                    let released = permit.release().await;
                    let mut events = events.lock().expect("events");
                    events.held += end.min(Instant::now()).saturating_duration_since(granted);
                    if released.is_err() {
                        break;
                    }
                    events.releases.push(redb_limiter::time::wall_clock_now().0);
                    drop(events);
                    // Only calls whose place came back within the measured time count.
                    if Instant::now() <= end {
                        completed += 1;
                    }
                }
                completed
            }));
        }
    }
    let mut completed = 0;
    for task in tasks {
        completed += task.await?;
    }
    let ideal = concurrent as f64 * measure.as_secs_f64() * 1000.0 / args.call_ms as f64;
    let events = events.lock().expect("events");
    let gaps = handoff_gaps(&events.grants, &events.releases);
    Ok(HandoffMode {
        wakes,
        completed,
        ideal,
        efficiency: events.held.as_secs_f64() / (concurrent as f64 * measure.as_secs_f64()),
        gap_p50_ms: percentile(&gaps, 0.50),
        gap_p99_ms: percentile(&gaps, 0.99),
    })
}

/// For each release, the time to the first grant at or after it that no earlier release
/// claimed (one grant per freed place), sorted.
fn handoff_gaps(grants: &[u64], releases: &[u64]) -> Vec<u64> {
    let (mut grants, mut releases) = (grants.to_vec(), releases.to_vec());
    grants.sort_unstable();
    releases.sort_unstable();
    let mut gaps = Vec::with_capacity(releases.len());
    let mut next = 0;
    for release in releases {
        // A grant can come a millisecond before the host reads its release's answer.
        let from = release.saturating_sub(1);
        while next < grants.len() && grants[next] < from {
            next += 1;
        }
        if let Some(&grant) = grants.get(next) {
            gaps.push(grant.saturating_sub(release));
            next += 1;
        }
    }
    gaps.sort_unstable();
    gaps
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_release_is_paired_with_the_next_unclaimed_grant() {
        let grants = [100, 105, 130, 400];
        let releases = [104, 104, 300];
        assert_eq!(handoff_gaps(&grants, &releases), vec![1, 26, 100]);
        assert_eq!(percentile(&[1, 2, 3, 4, 5], 0.5), 3.0);
    }
}
