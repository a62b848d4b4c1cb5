//! The fairness mix (`--mix fair`): does the line (section 12) keep a large call from starving
//! under a stream of small ones, and what does it cost?
//!
//! One window bucket (`calls` per `perMs`, short: a second by default). `--hosts` small hosts
//! (cost 1 to 100, drawn from a seeded generator per host) each wait for a grant and ask again
//! at once, saturating the window; one large host asks for 30% of `calls`, waits for its grant,
//! rests half a window, and asks again. Every host is a [`Client`] of its own (its own
//! in-process FIFO) over one limiter: the server at `--url`, or with `--in-process` an embedded
//! [`Limiter`] on a fresh file. Each of `--runs` runs lasts one window of warm-up and
//! `--windows` measured windows, with the line (the client's default), without it (`no_queue`),
//! and a third mode where the large call also waits on a limit of its own (its cost per
//! `--own-windows` windows, 2 by default) and only it queues: its ticket then stands in the
//! shared line while it waits for its own bucket, and section 12.9's backfill is what lets the
//! small hosts use the shared window meanwhile. Per mode it reports:
//!
//! - the large call's wait (its first ask to its grant, on the limiter's clock), the longest
//!   over every run, in windows, and how many large calls were never granted before their run
//!   ended (starved; their wait is counted up to the end);
//! - Jain's index of the cost granted to each small host in the measured windows (1 is equal);
//! - efficiency: the cost granted in the measured windows over their capacity (`calls` each).
//!
//! Then the cost of one answer, asked one at a time: a grant, a plain refusal, a refusal that
//! files a ticket, and a queued refusal (asking again with a ticket that keeps its place).
//! Everything goes through [`LimiterApi`], so the figures in-process and over HTTP are of the
//! same shape.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use redb_limiter::{AcquireRequest, Limit, Limiter, LimiterOptions, Millis};
use redb_limiter_client::{AcquireOptions, Client, HttpLimiter, LimiterApi, Outcome};
use serde::Serialize;

use crate::BenchArgs;

/// The figures of one mode (with or without the line) over every run.
#[derive(Clone, Debug, Serialize)]
pub struct ModeFigures {
    /// The large host queues.
    pub queue: bool,
    /// The small hosts queue.
    pub smalls_queue: bool,
    /// Large calls that asked in the measured windows.
    pub large_calls: u64,
    /// Of those, still waiting when their run ended (their wait is counted up to the end).
    pub large_starved: u64,
    /// The longest wait of a large call, in windows, per run.
    pub large_max_wait_windows: Vec<f64>,
    /// Jain's index of granted cost across the small hosts, per run.
    pub jain: Vec<f64>,
    /// Granted cost in the measured windows over their capacity, per run.
    pub efficiency: Vec<f64>,
}

/// Mean microseconds of one answer, asked one at a time.
#[derive(Clone, Debug, Serialize)]
pub struct AnswerCosts {
    pub samples: u64,
    pub grant_us: f64,
    pub plain_refusal_us: f64,
    /// A refusal that files a ticket (committed before its reply, like a grant).
    pub filing_refusal_us: f64,
    /// A refusal of a request asking again with its ticket (a renewal).
    pub queued_refusal_us: f64,
}

/// What `--mix fair` measured.
#[derive(Clone, Debug, Serialize)]
pub struct FairReport {
    pub target: String,
    pub hosts: usize,
    pub calls: u64,
    pub per_ms: u64,
    pub large_cost: u64,
    pub runs: usize,
    pub windows: u64,
    /// The large call's own limit in the third mode: its cost per this many windows.
    pub own_windows: u64,
    pub with_queue: ModeFigures,
    pub without_queue: ModeFigures,
    /// The large host also waits on a limit of its own, and only it queues.
    pub large_only_queues: ModeFigures,
    pub costs: AnswerCosts,
    pub seconds: f64,
}

impl FairReport {
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report serializes")
    }
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

impl fmt::Display for FairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fair mix on {}: {} small hosts (cost 1-100) + 1 large (cost {}; its own limit: that per {} windows), window {} per {} ms, {} runs of {} windows, {:.1} s",
            self.target,
            self.hosts,
            self.large_cost,
            self.own_windows,
            self.calls,
            self.per_ms,
            self.runs,
            self.windows,
            self.seconds
        )?;
        writeln!(f, "{:<40} {:>14} {:>14} {:>14}", "", "with queue", "without queue", "large + own")?;
        let (q, n, l) = (&self.with_queue, &self.without_queue, &self.large_only_queues);
        writeln!(
            f,
            "{:<40} {:>14} {:>14} {:>14}",
            "large calls (still waiting at the end)",
            format!("{} ({})", q.large_calls, q.large_starved),
            format!("{} ({})", n.large_calls, n.large_starved),
            format!("{} ({})", l.large_calls, l.large_starved)
        )?;
        writeln!(
            f,
            "{:<40} {:>14.2} {:>14.2} {:>14.2}",
            "large call's wait, max over runs (windows)",
            max(&q.large_max_wait_windows),
            max(&n.large_max_wait_windows),
            max(&l.large_max_wait_windows)
        )?;
        writeln!(
            f,
            "{:<40} {:>14.4} {:>14.4} {:>14.4}",
            "Jain's index, min over runs",
            min(&q.jain),
            min(&n.jain),
            min(&l.jain)
        )?;
        writeln!(
            f,
            "{:<40} {:>13.1}% {:>13.1}% {:>13.1}%",
            "efficiency, min over runs",
            100.0 * min(&q.efficiency),
            100.0 * min(&n.efficiency),
            100.0 * min(&l.efficiency)
        )?;
        let c = &self.costs;
        writeln!(f, "cost of one answer, mean of {} asked one at a time:", c.samples)?;
        writeln!(f, "  grant {:.1} us (1.00x)", c.grant_us)?;
        writeln!(f, "  plain refusal {:.1} us ({:.2}x)", c.plain_refusal_us, c.plain_refusal_us / c.grant_us)?;
        writeln!(
            f,
            "  refusal filing a ticket {:.1} us ({:.2}x)",
            c.filing_refusal_us,
            c.filing_refusal_us / c.grant_us
        )?;
        write!(
            f,
            "  queued refusal (asked with its ticket) {:.1} us ({:.2}x)",
            c.queued_refusal_us,
            c.queued_refusal_us / c.grant_us
        )
    }
}

/// Jain's fairness index of `x`: 1 when all are equal, `1/n` when one has everything.
#[must_use]
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if squares == 0.0 { 1.0 } else { sum * sum / (x.len() as f64 * squares) }
}

struct Shape {
    hosts: usize,
    calls: u64,
    per_ms: u64,
    windows: u64,
    runs: usize,
    seed: u64,
    samples: u64,
    /// The large call's own limit is its cost per this many windows (the third mode).
    own_windows: u64,
}

impl Shape {
    fn large_cost(&self) -> u64 {
        (self.calls * 3 / 10).max(1)
    }
}

/// Runs `--mix fair` against `--url`, or in-process with `--in-process`.
pub async fn run(args: &BenchArgs) -> anyhow::Result<FairReport> {
    let shape = Shape {
        hosts: args.hosts,
        calls: args.calls.unwrap_or(10_000),
        per_ms: args.per_ms.unwrap_or(1_000),
        windows: args.windows,
        runs: args.runs,
        seed: args.seed,
        samples: args.samples,
        own_windows: args.own_windows,
    };
    if shape.hosts < 2 || shape.runs == 0 || shape.windows == 0 || shape.samples == 0 || shape.own_windows == 0 {
        bail!(
            "--mix fair needs --hosts of at least 2, and --runs, --windows, --samples and --own-windows of at least 1"
        );
    }
    if shape.calls < 100 {
        bail!("--mix fair needs --calls of at least 100 (small calls cost up to 100)");
    }
    if args.in_process {
        let dir = std::env::temp_dir().join(format!(
            "redb-limiter-fair-{}-{}",
            std::process::id(),
            redb_limiter::time::wall_clock_now().0
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let options = LimiterOptions { recheck_ms: args.recheck_ms, ..LimiterOptions::default() };
        let limiter =
            Limiter::open_with(dir.join("limiter.redb"), options).context("opening the in-process limiter")?;
        let limiter = Arc::new(limiter);
        let report = measure(limiter.clone(), &shape, "in-process".into()).await;
        if let Ok(limiter) = Arc::try_unwrap(limiter) {
            limiter.close();
        }
        let _ = std::fs::remove_dir_all(&dir);
        report
    } else {
        let limiter = Arc::new(HttpLimiter::new(&args.url, args.token.clone()));
        measure(limiter, &shape, args.url.clone()).await
    }
}

async fn measure<L: LimiterApi>(limiter: Arc<L>, shape: &Shape, target: String) -> anyhow::Result<FairReport> {
    let started = Instant::now();
    let nonce = limiter.now().0;
    let mut with_queue = ModeFigures::new(true, true);
    let mut without_queue = ModeFigures::new(false, false);
    let mut large_only_queues = ModeFigures::new(true, false);
    for run in 0..shape.runs {
        for figures in [&mut with_queue, &mut without_queue, &mut large_only_queues] {
            let mode = match (figures.queue, figures.smalls_queue) {
                (true, true) => "queue",
                (true, false) => "large",
                _ => "plain",
            };
            let bucket = format!("bench/fair/{nonce}/{run}/{mode}");
            one_run(&limiter, shape, &bucket, run as u64, figures).await?;
        }
    }
    let costs = answer_costs(&limiter, shape, nonce).await?;
    Ok(FairReport {
        target,
        hosts: shape.hosts,
        calls: shape.calls,
        per_ms: shape.per_ms,
        large_cost: shape.large_cost(),
        runs: shape.runs,
        windows: shape.windows,
        own_windows: shape.own_windows,
        with_queue,
        without_queue,
        large_only_queues,
        costs,
        seconds: started.elapsed().as_secs_f64(),
    })
}

impl ModeFigures {
    fn new(queue: bool, smalls_queue: bool) -> Self {
        ModeFigures {
            queue,
            smalls_queue,
            large_calls: 0,
            large_starved: 0,
            large_max_wait_windows: Vec::new(),
            jain: Vec::new(),
            efficiency: Vec::new(),
        }
    }
}

/// One run: a window of warm-up, then `windows` measured ones.
async fn one_run<L: LimiterApi>(
    limiter: &Arc<L>,
    shape: &Shape,
    bucket: &str,
    run: u64,
    figures: &mut ModeFigures,
) -> anyhow::Result<()> {
    let per = shape.per_ms;
    let t0 = limiter.now();
    let from = t0.plus(per);
    let end = from.plus(shape.windows * per);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(end.since(t0));
    let (bucket, calls) = (bucket.to_owned(), shape.calls);
    let request = {
        let bucket = bucket.clone();
        move |key: String, cost: u64| {
            AcquireRequest::new(key, vec![Limit::window(bucket.clone(), calls, per).with_cost(cost)])
        }
    };
    // In the third mode the large call also needs room in a bucket of its own.
    let own = (figures.queue && !figures.smalls_queue).then(|| {
        Limit::window(format!("{bucket}/own"), shape.large_cost(), shape.own_windows.saturating_mul(per))
            .with_cost(shape.large_cost())
    });
    // Every wait is cut off at the run's end (dropped: it leaves the line).
    let small_options = AcquireOptions { no_queue: !figures.smalls_queue, ..AcquireOptions::default() };
    let options = AcquireOptions { no_queue: !figures.queue, ..AcquireOptions::default() };
    let mut smalls = Vec::with_capacity(shape.hosts);
    for host in 0..shape.hosts {
        let client = Client::new(limiter.clone());
        let mut rng = fastrand::Rng::with_seed(shape.seed ^ (run << 32) ^ host as u64);
        let request = request.clone();
        smalls.push(tokio::spawn(async move {
            // (granted at, cost) of every grant.
            let mut grants = Vec::new();
            loop {
                let cost = rng.u64(1..=100);
                let wait = client.acquire(request(format!("small-{host}"), cost)?, small_options);
                match tokio::time::timeout_at(deadline, wait).await {
                    Ok(Ok(permit)) => grants.push((permit.at(), cost)),
                    Ok(Err(e)) => return Err(anyhow::Error::from(e)),
                    Err(_) => break,
                }
            }
            Ok::<_, anyhow::Error>(grants)
        }));
    }
    // The large host starts once the window is saturated.
    let client = Client::new(limiter.clone());
    tokio::time::sleep(Duration::from_millis(per)).await;
    let mut waits = Vec::new();
    let mut large_granted = 0;
    while tokio::time::Instant::now() < deadline {
        let asked = limiter.now();
        let mut large = request("large".into(), shape.large_cost())?;
        large.limits.extend(own.clone());
        let wait = client.acquire(large, options);
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(permit)) => {
                waits.push(permit.at().since(asked));
                if measured(permit.at(), from, end) {
                    large_granted += shape.large_cost();
                }
                tokio::time::sleep(Duration::from_millis(per / 2)).await;
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {
                figures.large_starved += 1;
                waits.push(limiter.now().since(asked));
                break;
            }
        }
    }
    figures.large_calls += waits.len() as u64;
    figures.large_max_wait_windows.push(waits.iter().copied().max().unwrap_or(0) as f64 / per as f64);
    let mut costs = Vec::with_capacity(shape.hosts);
    // The large host's grants count in the capacity used, not in the fairness among equals.
    let mut granted = large_granted;
    for small in smalls {
        let grants = small.await.context("a small host panicked")??;
        let mine: u64 = grants.iter().filter(|(at, _)| measured(*at, from, end)).map(|(_, c)| c).sum();
        costs.push(mine as f64);
        granted += mine;
    }
    figures.jain.push(jain(&costs));
    figures.efficiency.push(granted as f64 / (shape.windows * shape.calls) as f64);
    Ok(())
}

/// The mean time of `f` over `n` calls, in microseconds.
async fn mean_us<F, Fut>(n: u64, mut f: F) -> anyhow::Result<f64>
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = anyhow::Result<Duration>>,
{
    let mut total = Duration::ZERO;
    for i in 0..n {
        total += f(i).await?;
    }
    Ok(total.as_secs_f64() * 1e6 / n as f64)
}

/// The cost of each kind of answer, one at a time, through `limiter`.
async fn answer_costs<L: LimiterApi>(limiter: &Arc<L>, shape: &Shape, nonce: u64) -> anyhow::Result<AnswerCosts> {
    let n = shape.samples;
    let req = |bucket: &str, calls: u64, queue: bool| -> anyhow::Result<AcquireRequest> {
        let req =
            AcquireRequest::new("cost", vec![Limit::window(format!("bench/fair/{nonce}/{bucket}"), calls, 60_000)])?;
        Ok(if queue { req.with_queue() } else { req })
    };
    let timed = |req: AcquireRequest, granted: bool| {
        let limiter = limiter.clone();
        async move {
            let t = Instant::now();
            let outcome = limiter.acquire(req).await?;
            let took = t.elapsed();
            if matches!(outcome, Outcome::Granted { .. }) != granted {
                bail!("expected {}, got {outcome:?}", if granted { "a grant" } else { "a refusal" });
            }
            Ok((took, outcome))
        }
    };
    let grant = req("grant", 1_000_000_000, false)?;
    let grant_us = mean_us(n, |_| {
        let f = timed(grant.clone(), true);
        async move { Ok(f.await?.0) }
    })
    .await?;
    let plain = req("plain", 1, false)?;
    timed(plain.clone(), true).await?;
    let plain_refusal_us = mean_us(n, |_| {
        let f = timed(plain.clone(), false);
        async move { Ok(f.await?.0) }
    })
    .await?;
    // Each filing leaves the line again (untimed), so the line stays short.
    let filing = req("filing", 1, true)?;
    timed(filing.clone(), true).await?;
    let filing_refusal_us = mean_us(n, |_| {
        let f = timed(filing.clone(), false);
        let limiter = limiter.clone();
        async move {
            let (took, outcome) = f.await?;
            let Outcome::Refused(refusal) = outcome else { unreachable!("checked") };
            let line = refusal.line.context("a queued refusal without a ticket")?;
            limiter.leave(line.ticket).await?;
            Ok(took)
        }
    })
    .await?;
    // One ticket, asked again and again (each renewal keeps it live).
    let queued = req("queued", 1, true)?;
    timed(queued.clone(), true).await?;
    let Outcome::Refused(first) = timed(queued.clone(), false).await?.1 else { unreachable!("checked") };
    let ticket = first.line.context("a queued refusal without a ticket")?.ticket;
    let with_ticket = queued.with_ticket(ticket.clone())?;
    let queued_refusal_us = mean_us(n, |_| {
        let f = timed(with_ticket.clone(), false);
        async move { Ok(f.await?.0) }
    })
    .await?;
    limiter.leave(ticket).await?;
    Ok(AnswerCosts { samples: n, grant_us, plain_refusal_us, filing_refusal_us, queued_refusal_us })
}

/// Whether `at` falls in the measured windows `[from, end)`.
fn measured(at: Millis, from: Millis, end: Millis) -> bool {
    at >= from && at < end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_has_all() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), 1.0);
        assert_eq!(jain(&[8.0, 0.0, 0.0, 0.0]), 0.25);
        assert!((jain(&[1.0, 2.0, 3.0]) - 36.0 / 42.0).abs() < 1e-12);
        assert_eq!(jain(&[0.0, 0.0]), 1.0, "nothing granted to anyone is equal");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_fair_run_in_process_reports_both_modes() {
        let args = BenchArgs {
            in_process: true,
            calls: Some(1_000),
            per_ms: Some(200),
            hosts: 3,
            runs: 1,
            windows: 2,
            samples: 20,
            ..crate::tests::args("http://127.0.0.1:9", &[])
        };
        let report = run(&args).await.unwrap();
        assert_eq!((report.large_cost, report.hosts, report.target.as_str()), (300, 3, "in-process"));
        for mode in [&report.with_queue, &report.without_queue] {
            assert_eq!((mode.jain.len(), mode.efficiency.len(), mode.large_max_wait_windows.len()), (1, 1, 1));
            assert!(mode.large_calls >= 1, "{mode:?}");
            assert!(mode.jain[0] > 1.0 / 3.0 && mode.jain[0] <= 1.0, "{mode:?}");
            assert!(mode.efficiency[0] > 0.0 && mode.efficiency[0] <= 1.0, "the window is never exceeded: {mode:?}");
        }
        let c = &report.costs;
        assert!(c.grant_us > 0.0 && c.plain_refusal_us > 0.0 && c.filing_refusal_us > 0.0 && c.queued_refusal_us > 0.0);
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["with_queue"]["queue"], true);
        assert!(report.to_string().contains("with queue"));
    }
}
