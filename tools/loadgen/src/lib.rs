//! Load generator: the engine behind `redb-limiter bench`.
//!
//! This crate owns the benchmark client and nothing else. Its parts:
//!
//! - this file: the [`BenchArgs`] flags, the run (connect, prefill, measure, merge) and the
//!   [`Report`] it hands back;
//! - `http.rs`: a lean HTTP/1.1 keep-alive client written directly on `TcpStream` (it shares
//!   the machine with the server, so it must not be the bottleneck);
//! - `conn.rs`: the per-connection request loop and the plan every connection shares;
//! - `stats.rs`: per-connection counters and an HdrHistogram of latencies;
//! - `sink.rs`: the built-in no-op server of `--sink`;
//! - `cpu.rs`: the generator's own CPU time;
//! - `fair.rs`: `--mix fair`, the line's fairness under a large call and a stream of small ones,
//!   over HTTP or in-process, through the host client;
//! - `handoff.rs`: `--mix handoff`, how much of a concurrency limit hosts use when each freed
//!   place must reach the next waiter, with the recheck only and with wake-ups (section 15).
//!
//! The hot path takes no lock: each connection owns a request template (everything but the key
//! digits and `Content-Length` is formatted once), a receive buffer, a seeded key picker
//! (`fastrand`) and its own counters and histogram, all merged once the run is over. Replies are
//! read by `Content-Length`; chunked replies are refused with a clear error. A reply is
//! classified by scanning its body for `"granted":true` / `"granted":false`, and with
//! `--concurrent` the `"permit"` of a grant is released by a second request on the same
//! connection before the next acquire; with `--settle` every acquire asks for a permit
//! (`"permit": true`) and the grant is settled to a random cost (0 to twice `--cost`) by a
//! second request on the same connection (`POST /settle`).
//!
//! The run is bounded: it stops by time, a reply still missing a few seconds after the end is cut
//! off and counted as an error, and a connection that keeps failing gives up after a few
//! consecutive reconnect attempts.
//!
//! The generator shares the machine with what it loads, so it reports its own CPU time in the
//! measured window (Linux: read from `/proc/self/task`). `--sink` points it at a built-in no-op
//! server instead (a minimal HTTP/1.1 responder on its own thread, whose CPU is not counted as
//! the generator's): the requests per second the generator reaches when the server costs
//! next to nothing.

mod conn;
mod cpu;
pub mod fair;
pub mod handoff;
mod http;
mod sink;
mod stats;

use conn::{Conn, Plan, connect};
use cpu::{PROC_TICKS_PER_SECOND, thread_cpu_ticks};
use sink::Sink;
use stats::Stats;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

/// What the benchmark asks the limiter for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mix {
    /// Limits so loose that every request is granted (calls 1000000 per 1000 ms).
    Granted,
    /// Tight limits (calls 10 per 60000 ms) whose windows are filled before measuring, so every
    /// measured request is refused.
    Refused,
    /// The line's fairness (see `fair.rs`): small hosts saturate one window (calls 10000 per
    /// 1000 ms) while a large host asks for 30% of it, with the line and without.
    Fair,
    /// Hand-offs (see `handoff.rs`): `--hosts` x `--workers` callers on `--concurrent` places
    /// (4 by default), each call holding its place `--call-ms`, with the recheck only and with
    /// wake-ups.
    Handoff,
}

impl Mix {
    fn default_calls(self) -> u64 {
        match self {
            Mix::Granted => 1_000_000,
            Mix::Refused => 10,
            Mix::Fair => 10_000,
            Mix::Handoff => 1_000_000,
        }
    }

    fn default_per_ms(self) -> u64 {
        match self {
            Mix::Granted | Mix::Fair | Mix::Handoff => 1_000,
            Mix::Refused => 60_000,
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mix::Granted => "granted",
            Mix::Refused => "refused",
            Mix::Fair => "fair",
            Mix::Handoff => "handoff",
        })
    }
}

/// Flags of `redb-limiter bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Server to load: `http://host:port` (plain HTTP only, no path).
    #[arg(long, env = "REDB_LIMITER_URL", default_value = "http://127.0.0.1:7411")]
    pub url: String,
    /// Bearer token sent as `Authorization: Bearer <token>`.
    #[arg(long, env = "REDB_LIMITER_TOKEN")]
    pub token: Option<String>,
    /// Keep-alive connections, each with one request in flight.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Distinct bucket keys (`bench/b:0` .. `bench/b:{keys-1}`), picked at random per request.
    #[arg(long, default_value_t = 1000)]
    pub keys: u64,
    /// `calls` of the limit [default: 1000000 with --mix granted, 10 with --mix refused].
    #[arg(long)]
    pub calls: Option<u64>,
    /// `perMs` of the limit [default: 1000 with --mix granted, 60000 with --mix refused].
    #[arg(long)]
    pub per_ms: Option<u64>,
    /// `cost` of each acquire.
    #[arg(long, default_value_t = 1)]
    pub cost: u64,
    /// Also put a concurrency limit of this many places on each bucket; every grant's permit is
    /// then released by a second request (`POST /release`) on the same connection.
    #[arg(long)]
    pub concurrent: Option<u64>,
    /// Workload: `granted` (loose limits) or `refused` (every key's window is filled first, with
    /// `keys * calls` unmeasured requests, so measured requests are refused).
    #[arg(long, value_enum, default_value_t = Mix::Granted)]
    pub mix: Mix,
    /// Measured duration in seconds.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// One request at a time: each request is sent after the previous reply. The same as
    /// `--connections 1` (and overrides it).
    #[arg(long)]
    pub one_at_a_time: bool,
    /// Path requests are sent to. Point it at a no-op endpoint to measure the generator's own
    /// overhead. With `--concurrent`, releases go to the sibling `release` path.
    #[arg(long, default_value = "/acquire")]
    pub path: String,
    /// Seconds of load before measuring starts (not counted).
    #[arg(long, default_value_t = 0.0)]
    pub warmup_seconds: f64,
    /// Seed of the per-connection key pickers (the same seed replays the same key sequence).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Load a built-in no-op server instead of `--url`: a minimal HTTP/1.1 responder on its own
    /// thread that answers every request with the same grant, deciding and storing nothing. It
    /// measures the generator's own ceiling (`--mix granted` only).
    #[arg(long)]
    pub sink: bool,
    /// Acquire with `"permit": true` (the permit lives 10 s) and settle each grant to a random
    /// cost from 0 to twice `--cost` with a second request on the same connection
    /// (`POST /settle`, the sibling of `--path`); not with `--concurrent` or `--sink`.
    #[arg(long)]
    pub settle: bool,
    /// `--mix fair`: the small hosts that saturate the window.
    #[arg(long, default_value_t = 8)]
    pub hosts: usize,
    /// `--mix fair`: runs per mode (with and without the line); `--mix handoff --batch`: batches.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// `--mix fair`: measured windows per run (after one of warm-up).
    #[arg(long, default_value_t = 5)]
    pub windows: u64,
    /// `--mix fair`: the third mode's large call also waits on a limit of its own, its cost per
    /// this many windows.
    #[arg(long, default_value_t = 2)]
    pub own_windows: u64,
    /// `--mix fair`: answers of each kind timed one at a time for their cost.
    #[arg(long, default_value_t = 2000)]
    pub samples: u64,
    /// `--mix fair`: run against an embedded limiter on a fresh file in the temp folder
    /// instead of `--url`.
    #[arg(long)]
    pub in_process: bool,
    /// `--mix fair --in-process`: the embedded limiter's `recheckMs`.
    #[arg(long, default_value_t = 250)]
    pub recheck_ms: u64,
    /// `--mix handoff`: workers per host, each with one call at a time.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// `--mix handoff`: how long each call holds its place, in ms.
    #[arg(long, default_value_t = 500)]
    pub call_ms: u64,
    /// `--mix handoff`: instead of the two timed modes, this many calls in all, split between
    /// the `--hosts`, all asked at once (with wake-ups), `--runs` times: the wall time of each
    /// batch against the ideal (calls x `--call-ms` / places).
    #[arg(long)]
    pub batch: Option<u64>,
}

/// The outcome of a run. Latencies are in microseconds, from writing an acquire to having read
/// its whole reply, for every acquire answered in the measured window (releases are not timed).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub url: String,
    pub path: String,
    pub mix: Mix,
    pub connections: usize,
    pub keys: u64,
    pub calls: u64,
    pub per_ms: u64,
    pub cost: u64,
    pub concurrent: Option<u64>,
    /// Acquires started in the measured window: `granted + refused + other + errors`.
    pub requests: u64,
    pub granted: u64,
    pub refused: u64,
    /// 2xx replies without a `granted` field (e.g. from a no-op endpoint).
    pub other: u64,
    /// Acquires that failed: I/O error, server closed mid-reply, malformed reply, non-2xx reply
    /// without a verdict, or no reply by the end of the run.
    pub errors: u64,
    /// Connections re-established (after an error or a `Connection: close`).
    pub reconnects: u64,
    /// Attempts to (re)connect that failed.
    pub connect_failures: u64,
    /// Permits released (with `--concurrent`) or grants settled (with `--settle`) with a 2xx
    /// reply.
    pub released: u64,
    /// Releases (or settles) that failed or were answered non-2xx.
    pub release_errors: u64,
    /// Whether each grant was settled (`--settle`) rather than released.
    pub settle: bool,
    /// Measured wall time.
    pub seconds: f64,
    /// Answered acquires (`granted + refused + other`) per second.
    pub rps: f64,
    pub min_us: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Unmeasured requests sent to fill the windows first (`--mix refused`).
    pub prefill_requests: u64,
    pub prefill_seconds: f64,
    /// The first error seen, to tell a wrong token from a dead server.
    pub first_error: Option<String>,
    /// Whether the requests went to the built-in no-op server (`--sink`).
    pub sink: bool,
    /// CPU time (user + system) the generator's threads used in the measured window, the
    /// sink's thread excluded. `None` where `/proc/self/task` cannot be read.
    pub cpu_seconds: Option<f64>,
    /// `cpu_seconds` per answered acquire, in microseconds.
    pub cpu_us_per_request: Option<f64>,
    /// `cpu_seconds` as a share of all the machine's cores over the measured window (0 to 1).
    pub cpu_share: Option<f64>,
}

impl Report {
    /// The report as one line of JSON.
    #[must_use]
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serializes")
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bench {}{}  mix {}  connections {}  keys {}  limit {} calls / {} ms  cost {}",
            self.url, self.path, self.mix, self.connections, self.keys, self.calls, self.per_ms, self.cost
        )?;
        if let Some(c) = self.concurrent {
            write!(f, "  concurrent {c}")?;
        }
        if self.sink {
            write!(f, "  (built-in no-op server)")?;
        }
        writeln!(f)?;
        if self.prefill_requests > 0 {
            writeln!(
                f,
                "  prefill      {:>12} requests in {:.2} s (not measured)",
                self.prefill_requests, self.prefill_seconds
            )?;
        }
        writeln!(f, "  seconds      {:>12.2}", self.seconds)?;
        writeln!(f, "  requests     {:>12}", self.requests)?;
        writeln!(f, "  answered/s   {:>12.0}", self.rps)?;
        writeln!(f, "  granted      {:>12}", self.granted)?;
        writeln!(f, "  refused      {:>12}", self.refused)?;
        if self.other > 0 {
            writeln!(f, "  other 2xx    {:>12}", self.other)?;
        }
        writeln!(f, "  errors       {:>12}", self.errors)?;
        if self.reconnects > 0 || self.connect_failures > 0 {
            writeln!(f, "  reconnects   {:>12}  (failed connects {})", self.reconnects, self.connect_failures)?;
        }
        if self.concurrent.is_some() {
            writeln!(f, "  released     {:>12}  (failed releases {})", self.released, self.release_errors)?;
        }
        if self.settle {
            writeln!(f, "  settled      {:>12}  (failed settles {})", self.released, self.release_errors)?;
            if self.seconds > 0.0 {
                writeln!(f, "  settled/s    {:>12.0}", self.released as f64 / self.seconds)?;
            }
        }
        writeln!(
            f,
            "  latency µs   {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "min", "mean", "p50", "p95", "p99", "p99.9", "max"
        )?;
        writeln!(
            f,
            "               {:>8} {:>8.0} {:>8} {:>8} {:>8} {:>8} {:>8}",
            self.min_us, self.mean_us, self.p50_us, self.p95_us, self.p99_us, self.p999_us, self.max_us
        )?;
        if let (Some(cpu), Some(per), Some(share)) = (self.cpu_seconds, self.cpu_us_per_request, self.cpu_share) {
            writeln!(
                f,
                "  generator    {cpu:>12.2} CPU s  ({per:.1} µs per request, {:.1}% of the machine)",
                share * 100.0
            )?;
        }
        if let Some(e) = &self.first_error {
            writeln!(f, "  first error: {e}")?;
        }
        Ok(())
    }
}

/// How long after the end of the run a missing reply is waited for before it is cut off.
const GRACE: Duration = Duration::from_secs(5);
/// How long one prefill exchange may take.
const PREFILL_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Consecutive failures (failed connects or failed exchanges) after which a connection gives up.
const MAX_CONSECUTIVE_FAILURES: u32 = 5;
/// Initial size of a connection's receive buffer; also the largest reply head accepted.
const RECV_BUF: usize = 16 * 1024;
/// Largest reply body accepted.
const MAX_BODY: usize = 1024 * 1024;

/// Run the benchmark described by `args` and report what was measured.
///
/// All connections are opened (and, with `--mix refused`, every key's window filled) before the
/// clock starts; failing to connect at that point is an error. Tasks are spawned on the current
/// Tokio runtime.
pub async fn run(args: &BenchArgs) -> anyhow::Result<Report> {
    if args.mix == Mix::Fair {
        bail!("--mix fair reports its own figures: run it with fair::run");
    }
    let mut plan = Plan::new(args).await?;
    let sink = if args.sink {
        if plan.mix != Mix::Granted {
            bail!("--sink grants everything: it takes --mix granted only");
        }
        if plan.settle {
            bail!("--sink gives no permits to settle: it takes no --settle");
        }
        let sink = Sink::start().context("starting the no-op server")?;
        plan.addr = sink.addr;
        Some(sink)
    } else {
        None
    };
    let plan = Arc::new(plan);

    let mut conns = Vec::with_capacity(plan.connections);
    for id in 0..plan.connections {
        let stream = connect(plan.addr).await.with_context(|| format!("connecting to {}", args.url))?;
        conns.push(Conn::new(&plan, id, stream));
    }

    let (prefill_requests, prefill_seconds) = if plan.mix == Mix::Refused {
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(conns.len());
        for mut conn in conns.drain(..) {
            let plan = plan.clone();
            tasks.push(tokio::spawn(async move {
                let sent = conn.prefill(&plan).await;
                (conn, sent)
            }));
        }
        let mut total = 0;
        for task in tasks {
            let (conn, sent) = task.await.context("prefill task panicked")?;
            total += sent.context("filling the windows before measuring")?;
            conns.push(conn);
        }
        (total, started.elapsed().as_secs_f64())
    } else {
        (0, 0.0)
    };

    let measure_from = Instant::now() + plan.warmup;
    let end = measure_from + plan.duration;
    let hard_end = end + GRACE;
    let cpu_at_start = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        thread_cpu_ticks()
    });
    let mut tasks = Vec::with_capacity(conns.len());
    for mut conn in conns {
        let plan = plan.clone();
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::new();
            let drive = conn.drive(&plan, measure_from, end, &mut stats);
            if tokio::time::timeout_at(hard_end.into(), drive).await.is_err() {
                stats.errors += 1;
                stats.note_error(|| format!("no reply within {GRACE:?} after the end of the run"));
            }
            stats
        }));
    }
    let mut total = Stats::new();
    for task in tasks {
        total.merge(task.await.context("connection task panicked")?);
    }
    let cpu_at_end = thread_cpu_ticks();
    let seconds = Instant::now().saturating_duration_since(measure_from).as_secs_f64();
    let cpu_at_start = cpu_at_start.await.context("CPU sampling task panicked")?;
    let mut report = total.into_report(&plan, args, seconds, prefill_requests, prefill_seconds);
    report.sink = sink.is_some();
    if let Some(sink) = &sink {
        report.url = format!("http://{}", sink.addr);
    }
    if let (Some(start), Some(end)) = (cpu_at_start, cpu_at_end) {
        let skip = sink.as_ref().and_then(|s| s.tid);
        let ticks: u64 = end
            .iter()
            .filter(|(tid, _)| Some(**tid) != skip)
            .map(|(tid, t)| t.saturating_sub(start.get(tid).copied().unwrap_or(0)))
            .sum();
        let cpu = ticks as f64 / PROC_TICKS_PER_SECOND;
        let answered = report.granted + report.refused + report.other;
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        report.cpu_seconds = Some(cpu);
        report.cpu_us_per_request = Some(if answered > 0 { cpu * 1e6 / answered as f64 } else { 0.0 });
        report.cpu_share = Some(if seconds > 0.0 { cpu / (seconds * cores) } else { 0.0 });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::*;
    use crate::cpu::current_tid;
    use crate::http::*;
    use crate::sink::*;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::{Context as TaskContext, Poll};
    use tokio::io::AsyncRead;

    use axum::extract::State;
    use axum::http::header::{CONNECTION, HeaderValue};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::{Json, Router};
    use clap::Parser;
    use serde_json::{Value, json};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    pub(crate) fn args(url: &str, extra: &[&str]) -> BenchArgs {
        let mut argv = vec!["bench", "--url", url];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).bench
    }

    // ---- histogram ----

    // ---- wire ----

    /// A reader handing out bytes in the given chunks, one chunk (or less) per read.
    struct Chunks(VecDeque<Vec<u8>>);

    impl Chunks {
        fn split(bytes: &[u8], size: usize) -> Chunks {
            Chunks(bytes.chunks(size).map(<[u8]>::to_vec).collect())
        }
    }

    impl AsyncRead for Chunks {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut TaskContext<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if let Some(mut chunk) = self.0.pop_front() {
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                if n < chunk.len() {
                    chunk.drain(..n);
                    self.0.push_front(chunk);
                }
            }
            Poll::Ready(Ok(()))
        }
    }

    fn reply(extra_headers: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{extra_headers}content-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn replies_parse_across_split_reads() {
        let granted = r#"{"granted":true,"at":"2026-01-01T00:00:00.000Z","permit":"p-7\"x"}"#;
        let refused = r#"{"granted" : false,"retryAt":"2026-01-01T00:00:01.000Z","reason":"rate","limit":"bench/b:1"}"#;
        let long_body = format!(r#"{{"granted":true,"pad":"{}"}}"#, "x".repeat(40_000));
        let mut wire = reply("", granted);
        wire += &reply("Connection: keep-alive\r\n", refused);
        wire += &reply("", &long_body);
        wire += "HTTP/1.1 401 Unauthorized\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{\"error\":{\"code\":\"no-auth\"}}";
        for size in [1, 2, 3, 7, 64, 1000, wire.len()] {
            let mut io = Chunks::split(wire.as_bytes(), size);
            let mut recv = RecvBuf::new();

            let r = recv.read_reply(&mut io).await.unwrap();
            assert_eq!((r.status, r.close), (200, false));
            assert_eq!(recv.body(&r), granted.as_bytes(), "chunk size {size}");
            assert_eq!(verdict(recv.body(&r)), Verdict::Granted);
            assert_eq!(permit(recv.body(&r)), Some(&br#"p-7\"x"#[..]));

            let r = recv.read_reply(&mut io).await.unwrap();
            assert_eq!(recv.body(&r), refused.as_bytes());
            assert_eq!(verdict(recv.body(&r)), Verdict::Refused);
            assert_eq!(permit(recv.body(&r)), None);

            let r = recv.read_reply(&mut io).await.unwrap();
            assert_eq!(recv.body(&r), long_body.as_bytes());

            let r = recv.read_reply(&mut io).await.unwrap();
            assert_eq!((r.status, r.close), (401, true));
            assert_eq!(verdict(recv.body(&r)), Verdict::None);

            assert!(matches!(recv.read_reply(&mut io).await, Err(WireError::Eof)));
        }
    }

    #[tokio::test]
    async fn unsupported_or_cut_replies_fail_clearly() {
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
        let mut recv = RecvBuf::new();
        let err = recv.read_reply(&mut Chunks::split(chunked.as_bytes(), 5)).await.unwrap_err();
        assert!(matches!(err, WireError::Chunked));
        assert!(err.to_string().contains("chunked"));

        let cut = "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"granted\":true}";
        let mut recv = RecvBuf::new();
        let err = recv.read_reply(&mut Chunks::split(cut.as_bytes(), 4)).await;
        assert!(matches!(err, Err(WireError::Eof)));

        let no_length = "HTTP/1.1 200 OK\r\n\r\n{}";
        let err = RecvBuf::new().read_reply(&mut Chunks::split(no_length.as_bytes(), 100)).await;
        assert!(matches!(err, Err(WireError::NoLength)));

        let garbage = "SSH-2.0-OpenSSH\r\n\r\n";
        let err = RecvBuf::new().read_reply(&mut Chunks::split(garbage.as_bytes(), 100)).await;
        assert!(matches!(err, Err(WireError::Malformed(_))));

        let http10 = "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        let mut recv = RecvBuf::new();
        let r = recv.read_reply(&mut Chunks::split(http10.as_bytes(), 100)).await.unwrap();
        assert!(r.close);
    }

    #[test]
    fn requests_are_well_formed_json() {
        let plan = Plan {
            addr: "127.0.0.1:1".parse().unwrap(),
            connections: 1,
            keys: 10,
            calls: 10,
            per_ms: 60_000,
            cost: 2,
            concurrent: Some(3),
            settle: false,
            mix: Mix::Refused,
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            seed: 1,
            acquire_head: b"POST /acquire HTTP/1.1\r\nHost: h\r\nContent-Length: ".to_vec(),
            release_head: b"POST /release HTTP/1.1\r\nHost: h\r\nContent-Length: ".to_vec(),
            acquire_tail: b"\",\"calls\":10,\"perMs\":60000,\"concurrent\":3}]}".to_vec(),
        };
        let mut reqs = Requests::new(&plan, 5);
        for key in [0, 9, 10, 12345, u64::MAX] {
            let req = reqs.acquire(key).to_vec();
            let split = find(&req, b"\r\n\r\n").unwrap();
            let head = std::str::from_utf8(&req[..split]).unwrap();
            let body = &req[split + 4..];
            assert!(head.ends_with(&format!("Content-Length: {}", body.len())));
            let v: Value = serde_json::from_slice(body).unwrap();
            assert_eq!(
                v,
                json!({"key": "bench/caller:5", "cost": 2, "limits": [
                    {"key": format!("bench/b:{key}"), "calls": 10, "perMs": 60000, "concurrent": 3}
                ]})
            );
        }
        reqs.prepare_release(br#"p-1\"2"#);
        let req = reqs.release();
        let split = find(req, b"\r\n\r\n").unwrap();
        let v: Value = serde_json::from_slice(&req[split + 4..]).unwrap();
        assert_eq!(v, json!({"permit": "p-1\"2"}));
        reqs.prepare_settle(b"p-9", 12345, 0);
        let req = reqs.release();
        let split = find(req, b"\r\n\r\n").unwrap();
        let head = std::str::from_utf8(&req[..split]).unwrap();
        assert!(head.ends_with(&format!("Content-Length: {}", req.len() - split - 4)), "{head}");
        let v: Value = serde_json::from_slice(&req[split + 4..]).unwrap();
        assert_eq!(v, json!({"permit": "p-9", "costs": [{"key": "bench/b:12345", "cost": 0}]}));
        let settling = Plan { settle: true, concurrent: None, ..plan };
        let mut reqs = Requests::new(&settling, 1);
        let req = reqs.acquire(7).to_vec();
        let split = find(&req, b"\r\n\r\n").unwrap();
        let v: Value = serde_json::from_slice(&req[split + 4..]).unwrap();
        assert_eq!((v["permit"].clone(), v["holdMs"].clone()), (json!(true), json!(10000)));
    }

    #[test]
    fn urls_and_keys() {
        assert_eq!(parse_url("http://127.0.0.1:7411").unwrap(), "127.0.0.1:7411");
        assert_eq!(parse_url("http://localhost/").unwrap(), "localhost");
        assert!(parse_url("https://x:1").unwrap_err().to_string().contains("plain HTTP"));
        assert!(parse_url("http://x:1/base").is_err());
        assert!(parse_url("x:1").is_err());
        assert!(has_port("[::1]:80") && !has_port("[::1]") && !has_port("host"));
    }

    // ---- end to end against a no-op server ----

    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Granted,
        Alternate,
        Permits,
        CloseEvery3,
    }

    #[derive(Default)]
    struct Counters {
        served: AtomicU64,
        granted: AtomicU64,
        refused: AtomicU64,
        released: AtomicU64,
        bad: AtomicU64,
    }

    type Shared = Arc<(Mode, Counters)>;

    async fn acquire(State(s): State<Shared>, Json(req): Json<Value>) -> Response {
        let (mode, c) = &*s;
        let well_formed = req["key"].as_str().is_some_and(|k| k.starts_with("bench/caller:"))
            && req["cost"] == 1
            && req["limits"][0]["key"].as_str().is_some_and(|k| k.starts_with("bench/b:"))
            && req["limits"][0]["perMs"].is_u64()
            && (*mode != Mode::Permits || req["limits"][0]["concurrent"] == 2);
        if !well_formed {
            c.bad.fetch_add(1, Ordering::Relaxed);
            return (axum::http::StatusCode::BAD_REQUEST, Json(json!({"error": {"code": "bad"}}))).into_response();
        }
        let n = c.served.fetch_add(1, Ordering::Relaxed);
        let at = "2026-01-01T00:00:00.000Z";
        match mode {
            Mode::Alternate if n % 2 == 1 => {
                c.refused.fetch_add(1, Ordering::Relaxed);
                Json(json!({"granted": false, "retryAt": at, "reason": "rate", "limit": "bench/b:0"})).into_response()
            }
            Mode::Permits => {
                c.granted.fetch_add(1, Ordering::Relaxed);
                Json(json!({"granted": true, "at": at, "permit": format!("p-{n}")})).into_response()
            }
            _ => {
                c.granted.fetch_add(1, Ordering::Relaxed);
                let mut res = Json(json!({"granted": true, "at": at})).into_response();
                if *mode == Mode::CloseEvery3 && n % 3 == 2 {
                    res.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
                }
                res
            }
        }
    }

    async fn release(State(s): State<Shared>, Json(req): Json<Value>) -> Json<Value> {
        if req["permit"].as_str().is_some_and(|p| p.starts_with("p-")) {
            s.1.released.fetch_add(1, Ordering::Relaxed);
        } else {
            s.1.bad.fetch_add(1, Ordering::Relaxed);
        }
        Json(json!({"released": true}))
    }

    async fn serve(mode: Mode) -> (String, Shared) {
        let shared: Shared = Arc::new((mode, Counters::default()));
        let app =
            Router::new().route("/acquire", post(acquire)).route("/release", post(release)).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, shared)
    }

    fn check_report(r: &Report) {
        assert!(r.requests > 0, "{r}");
        assert_eq!(r.requests, r.granted + r.refused + r.other + r.errors);
        assert_eq!(r.errors, 0, "{r}");
        assert!(r.seconds >= 0.5 && r.seconds < 2.0, "{r}");
        assert!(r.rps > 0.0);
        assert!(r.min_us <= r.p50_us, "{r}");
        assert!(r.p50_us <= r.p95_us && r.p95_us <= r.p99_us, "{r}");
        assert!(r.p99_us <= r.p999_us && r.p999_us <= r.max_us, "{r}");
        let json: Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["requests"], r.requests);
        assert!(!r.to_json().contains('\n'));
        assert!(r.to_string().contains("p99.9"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_against_a_granting_server() {
        let (url, s) = serve(Mode::Granted).await;
        let r = run(&args(&url, &["--connections", "4", "--seconds", "0.5"])).await.unwrap();
        check_report(&r);
        let c = &s.1;
        assert_eq!(c.bad.load(Ordering::Relaxed), 0);
        assert_eq!(r.granted, c.granted.load(Ordering::Relaxed));
        assert_eq!((r.refused, r.other, r.reconnects), (0, 0, 0));
        assert_eq!((r.connections, r.calls, r.per_ms), (4, 1_000_000, 1000));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_against_an_alternating_server() {
        let (url, s) = serve(Mode::Alternate).await;
        let r = run(&args(&url, &["--connections", "4", "--seconds", "0.5", "--keys", "3"])).await.unwrap();
        check_report(&r);
        let c = &s.1;
        assert_eq!(c.bad.load(Ordering::Relaxed), 0);
        assert_eq!(r.granted, c.granted.load(Ordering::Relaxed));
        assert_eq!(r.refused, c.refused.load(Ordering::Relaxed));
        assert!(r.granted.abs_diff(r.refused) <= 1, "{r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_releases_permits() {
        let (url, s) = serve(Mode::Permits).await;
        let r = run(&args(&url, &["--connections", "4", "--seconds", "0.5", "--concurrent", "2"])).await.unwrap();
        check_report(&r);
        let c = &s.1;
        assert_eq!(c.bad.load(Ordering::Relaxed), 0);
        assert_eq!(r.granted, c.granted.load(Ordering::Relaxed));
        assert_eq!(r.released, r.granted, "{r}");
        assert_eq!(r.released, c.released.load(Ordering::Relaxed));
        assert_eq!(r.release_errors, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_reconnects_after_connection_close() {
        let (url, s) = serve(Mode::CloseEvery3).await;
        let r = run(&args(&url, &["--connections", "4", "--seconds", "0.5"])).await.unwrap();
        check_report(&r);
        assert_eq!(r.granted, s.1.granted.load(Ordering::Relaxed));
        assert!(r.reconnects > 0, "{r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn refused_mix_prefills_then_measures_refusals() {
        // A server that grants `calls` per key then refuses, like a full window.
        let counts: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>> = Arc::default();
        let app = Router::new().route(
            "/acquire",
            post(move |Json(req): Json<Value>| {
                let counts = counts.clone();
                async move {
                    let key = req["limits"][0]["key"].as_str().unwrap().to_owned();
                    let calls = req["limits"][0]["calls"].as_u64().unwrap();
                    let mut counts = counts.lock().unwrap();
                    let used = counts.entry(key).or_default();
                    if *used < calls {
                        *used += 1;
                        Json(json!({"granted": true, "at": "2026-01-01T00:00:00.000Z"}))
                    } else {
                        Json(json!({"granted": false, "retryAt": "2026-01-01T00:01:00.000Z",
                            "reason": "rate", "limit": "bench/b:0"}))
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let r = run(&args(&url, &["--connections", "4", "--seconds", "0.5", "--keys", "50", "--mix", "refused"]))
            .await
            .unwrap();
        check_report(&r);
        assert_eq!(r.prefill_requests, 50 * 11, "{r}");
        assert_eq!(r.granted, 0, "{r}");
        assert_eq!(r.refused, r.requests);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_against_the_built_in_sink() {
        let r = run(&args("http://127.0.0.1:1", &["--sink", "--connections", "4", "--seconds", "0.5"])).await.unwrap();
        check_report(&r);
        assert!(r.sink && r.url.starts_with("http://127.0.0.1:"), "{r}");
        assert_eq!(r.granted, r.requests);
        assert!(r.to_string().contains("no-op server"));
        if cfg!(target_os = "linux") {
            let (cpu, per, share) = (r.cpu_seconds.unwrap(), r.cpu_us_per_request.unwrap(), r.cpu_share.unwrap());
            assert!(cpu >= 0.0 && per >= 0.0 && (0.0..=1.0).contains(&share), "{r}");
            assert!(r.to_string().contains("µs per request"));
        }
        let err = run(&args("http://127.0.0.1:1", &["--sink", "--mix", "refused"])).await.unwrap_err();
        assert!(err.to_string().contains("--mix granted"), "{err}");
    }

    #[test]
    fn sink_reads_request_lengths() {
        assert_eq!(request_content_length(b"POST / HTTP/1.1\r\nHost: h\r\ncontent-LENGTH:  12 "), Some(12));
        assert_eq!(request_content_length(b"GET /health HTTP/1.1\r\nHost: h"), Some(0));
        assert_eq!(request_content_length(b"POST / HTTP/1.1\r\nContent-Length: x"), None);
        assert_eq!(request_content_length(b"POST / HTTP/1.1\r\nContent-Length: 99999999999"), None);
    }

    #[test]
    fn thread_cpu_is_read_where_proc_is() {
        if cfg!(target_os = "linux") {
            let ticks = thread_cpu_ticks().unwrap();
            assert!(!ticks.is_empty());
            assert!(ticks.contains_key(&current_tid().unwrap()));
        }
    }

    #[tokio::test]
    async fn an_unreachable_server_is_an_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let err = run(&args(&url, &["--seconds", "0.1"])).await.unwrap_err();
        assert!(format!("{err:#}").contains("connecting to"), "{err:#}");
        let err = run(&args(&url, &["--connections", "0"])).await.unwrap_err();
        assert!(err.to_string().contains("--connections"));
    }
}
