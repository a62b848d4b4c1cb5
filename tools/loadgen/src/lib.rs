//! Load generator: the engine behind `redb-limiter bench`.
//!
//! This module owns the benchmark client and nothing else: the [`BenchArgs`] flags, a lean
//! HTTP/1.1 keep-alive client written directly on [`TcpStream`] (it shares the machine with the
//! server, so it must not be the bottleneck), the per-connection request loop, the log-bucketed
//! latency histogram, and the [`Report`] it hands back.
//!
//! The hot path allocates nothing and takes no lock: each connection owns a request template
//! (everything but the key digits and `Content-Length` is formatted once), a receive buffer, an
//! xorshift key picker and its own counters and histogram, all merged once the run is over.
//! Replies are read by `Content-Length`; chunked replies are refused with a clear error. A reply
//! is classified by scanning its body for `"granted":true` / `"granted":false`, and with
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

use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the benchmark asks the limiter for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mix {
    /// Limits so loose that every request is granted (calls 1000000 per 1000 ms).
    Granted,
    /// Tight limits (calls 10 per 60000 ms) whose windows are filled before measuring, so every
    /// measured request is refused.
    Refused,
}

impl Mix {
    fn default_calls(self) -> u64 {
        match self {
            Mix::Granted => 1_000_000,
            Mix::Refused => 10,
        }
    }

    fn default_per_ms(self) -> u64 {
        match self {
            Mix::Granted => 1_000,
            Mix::Refused => 60_000,
        }
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mix::Granted => "granted",
            Mix::Refused => "refused",
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

/// The unit of the CPU times in `/proc/<pid>/task/<tid>/stat` (Linux's `USER_HZ`).
const PROC_TICKS_PER_SECOND: f64 = 100.0;

/// CPU time (user + system, in `USER_HZ` ticks) of each of this process's threads, by thread
/// id; `None` where `/proc/self/task` cannot be read.
fn thread_cpu_ticks() -> Option<std::collections::HashMap<u32, u64>> {
    let mut out = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        // A thread may exit between listing and reading: skip it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the command name (which may hold spaces) start with the state (field 3);
        // utime and stime are fields 14 and 15.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
        let (Some(utime), Some(stime)) =
            (fields.get(11).and_then(|v| v.parse::<u64>().ok()), fields.get(12).and_then(|v| v.parse::<u64>().ok()))
        else {
            continue;
        };
        out.insert(tid, utime + stime);
    }
    Some(out)
}

/// This thread's id, where `/proc/thread-self` tells it.
fn current_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The built-in no-op server of `--sink`: a current-thread runtime on its own OS thread that
/// answers every request with the same granted reply. It lives until the process exits.
struct Sink {
    addr: SocketAddr,
    /// Its thread, whose CPU time is left out of the generator's.
    tid: Option<u32>,
}

/// The body of every sink reply: a grant, as the real server words it.
const SINK_BODY: &str = r#"{"granted":true,"at":"2026-01-01T00:00:00.000Z"}"#;
/// Largest request the sink buffers.
const SINK_MAX_REQUEST: usize = 1024 * 1024;

impl Sink {
    fn start() -> anyhow::Result<Sink> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("bench-sink".into()).spawn(move || {
            let _ = tid_tx.send(current_tid());
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(sink_connection(stream));
                    }
                }
            });
        })?;
        let tid = tid_rx.recv().ok().flatten();
        Ok(Sink { addr, tid })
    }
}

/// Answers every complete request on `stream` (pipelined ones together) until it closes or
/// sends something that is not a request.
async fn sink_connection(mut stream: TcpStream) {
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{SINK_BODY}",
        SINK_BODY.len()
    )
    .into_bytes();
    let mut buf = vec![0u8; RECV_BUF];
    let (mut start, mut end) = (0, 0);
    let mut out = Vec::with_capacity(reply.len());
    loop {
        while let Some(head) = find(&buf[start..end], b"\r\n\r\n") {
            let Some(body) = request_content_length(&buf[start..start + head]) else { return };
            let total = head + 4 + body;
            if end - start < total {
                break;
            }
            start += total;
            out.extend_from_slice(&reply);
        }
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if start == end {
            (start, end) = (0, 0);
        } else if end == buf.len() {
            if start > 0 {
                buf.copy_within(start..end, 0);
                (start, end) = (0, end - start);
            } else if buf.len() < SINK_MAX_REQUEST {
                buf.resize(buf.len() * 2, 0);
            } else {
                return;
            }
        }
        match stream.read(&mut buf[end..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => end += n,
        }
    }
}

/// The `Content-Length` of a request head (0 when absent); `None` when malformed.
fn request_content_length(head: &[u8]) -> Option<usize> {
    let mut length = 0;
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        if line[..colon].eq_ignore_ascii_case(b"content-length") {
            let value = line[colon + 1..].trim_ascii();
            if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
                return None;
            }
            length = value.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0'));
        }
    }
    (length <= SINK_MAX_REQUEST).then_some(length)
}

/// `args` checked and resolved, shared by every connection.
struct Plan {
    addr: SocketAddr,
    connections: usize,
    keys: u64,
    calls: u64,
    per_ms: u64,
    cost: u64,
    concurrent: Option<u64>,
    /// Settle every grant (`--settle`).
    settle: bool,
    mix: Mix,
    duration: Duration,
    warmup: Duration,
    seed: u64,
    /// Acquire request line and headers, up to and including `Content-Length: `.
    acquire_head: Vec<u8>,
    /// Release request line and headers, up to and including `Content-Length: `.
    release_head: Vec<u8>,
    /// The body after the bucket key's digits.
    acquire_tail: Vec<u8>,
}

impl Plan {
    async fn new(args: &BenchArgs) -> anyhow::Result<Plan> {
        let authority = parse_url(&args.url)?;
        let target = if has_port(authority) { authority.to_owned() } else { format!("{authority}:80") };
        let addr = tokio::net::lookup_host(&target)
            .await
            .with_context(|| format!("resolving {target}"))?
            .next()
            .with_context(|| format!("{target} resolves to no address"))?;

        let connections = if args.one_at_a_time { 1 } else { args.connections };
        if connections == 0 {
            bail!("--connections must be at least 1");
        }
        if args.keys == 0 {
            bail!("--keys must be at least 1");
        }
        if !(args.seconds.is_finite() && args.seconds > 0.0) {
            bail!("--seconds must be a positive number");
        }
        if !(args.warmup_seconds.is_finite() && args.warmup_seconds >= 0.0) {
            bail!("--warmup-seconds must be zero or a positive number");
        }
        let calls = args.calls.unwrap_or(args.mix.default_calls());
        let per_ms = args.per_ms.unwrap_or(args.mix.default_per_ms());
        if calls == 0 || per_ms == 0 {
            bail!("--calls and --per-ms must be at least 1");
        }
        if !args.path.starts_with('/') || !is_header_safe(&args.path) || args.path.contains(' ') {
            bail!("--path must start with '/' and hold no spaces or control characters");
        }
        let auth = match &args.token {
            Some(t) if !is_header_safe(t) => bail!("the token holds control characters"),
            Some(t) => format!("Authorization: Bearer {t}\r\n"),
            None => String::new(),
        };
        if args.settle && args.concurrent.is_some() {
            bail!("--settle and --concurrent do not go together: a settled grant's places would never be released");
        }
        let second = if args.settle { "settle" } else { "release" };
        let release_path = match args.path.strip_suffix("acquire") {
            Some(prefix) if prefix.ends_with('/') => format!("{prefix}{second}"),
            _ => format!("/{second}"),
        };
        let head = |path: &str| {
            format!(
                "POST {path} HTTP/1.1\r\nHost: {authority}\r\n{auth}\
                 Content-Type: application/json\r\nContent-Length: "
            )
            .into_bytes()
        };
        let concurrent = args.concurrent.map_or_else(String::new, |n| format!(",\"concurrent\":{n}"));
        Ok(Plan {
            addr,
            connections,
            keys: args.keys,
            calls,
            per_ms,
            cost: args.cost,
            concurrent: args.concurrent,
            settle: args.settle,
            mix: args.mix,
            duration: Duration::from_secs_f64(args.seconds),
            warmup: Duration::from_secs_f64(args.warmup_seconds),
            seed: args.seed,
            acquire_head: head(&args.path),
            release_head: head(&release_path),
            acquire_tail: format!("\",\"calls\":{calls},\"perMs\":{per_ms}{concurrent}}}]}}").into_bytes(),
        })
    }
}

/// The `host[:port]` of an `http://host[:port][/]` URL.
fn parse_url(url: &str) -> anyhow::Result<&str> {
    let Some(rest) = url.strip_prefix("http://") else {
        if url.starts_with("https://") {
            bail!("the load generator speaks plain HTTP only, not {url}");
        }
        bail!("--url must look like http://host:port, not {url}");
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) || !is_header_safe(authority) {
        bail!("--url must be http://host:port with no path, not {url}");
    }
    Ok(authority)
}

fn has_port(authority: &str) -> bool {
    match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    }
}

fn is_header_safe(s: &str) -> bool {
    !s.bytes().any(|b| b.is_ascii_control())
}

async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One connection's state, carried from the prefill into the measured phase.
struct Conn {
    id: usize,
    stream: Option<TcpStream>,
    recv: RecvBuf,
    requests: Requests,
    keys: XorShift,
    failures: u32,
}

/// What one acquire exchange came to.
struct Answer {
    status: u16,
    verdict: Verdict,
    /// A release request is ready in `Requests` for a permit this reply granted.
    release: bool,
}

impl Conn {
    fn new(plan: &Plan, id: usize, stream: TcpStream) -> Conn {
        Conn {
            id,
            stream: Some(stream),
            recv: RecvBuf::new(),
            requests: Requests::new(plan, id),
            keys: XorShift::new(plan.seed, id as u64),
            failures: 0,
        }
    }

    /// Send one acquire for `key` and read its reply; on `Connection: close` the stream is
    /// dropped after the reply, on failure at once.
    /// With `settle_to`, a grant's permit is settled to that cost in bucket `key` by the second
    /// request; without it, released.
    async fn acquire(&mut self, key: u64, want_permit: bool, settle_to: Option<u64>) -> Result<Answer, WireError> {
        let stream = self.stream.as_mut().ok_or(WireError::Eof)?;
        let req = self.requests.acquire(key);
        let result = exchange(stream, &mut self.recv, req).await;
        let reply = match result {
            Ok(reply) => reply,
            Err(e) => {
                self.stream = None;
                return Err(e);
            }
        };
        let body = self.recv.body(&reply);
        let verdict = verdict(body);
        let mut release = false;
        if want_permit
            && verdict == Verdict::Granted
            && let Some(permit) = permit(body)
        {
            match settle_to {
                Some(cost) => self.requests.prepare_settle(permit, key, cost),
                None => self.requests.prepare_release(permit),
            }
            release = true;
        }
        if reply.close {
            self.stream = None;
        }
        Ok(Answer { status: reply.status, verdict, release })
    }

    /// Send the release prepared by the last grant; `Ok(true)` when answered 2xx.
    async fn release(&mut self) -> Result<bool, WireError> {
        let stream = self.stream.as_mut().ok_or(WireError::Eof)?;
        match exchange(stream, &mut self.recv, self.requests.release()).await {
            Ok(reply) => {
                if reply.close {
                    self.stream = None;
                }
                Ok((200..300).contains(&reply.status))
            }
            Err(e) => {
                self.stream = None;
                Err(e)
            }
        }
    }

    /// Make sure there is a stream, reconnecting with backoff. `false` once this connection has
    /// failed too often in a row or `until` has passed.
    async fn ensure_connected(&mut self, plan: &Plan, until: Instant, stats: &mut Stats) -> bool {
        while self.stream.is_none() {
            if self.failures >= MAX_CONSECUTIVE_FAILURES {
                stats.note_error(|| {
                    format!("connection {} gave up after {MAX_CONSECUTIVE_FAILURES} consecutive failures", self.id)
                });
                return false;
            }
            let backoff = Duration::from_millis(10 << self.failures.min(6));
            let wake = (Instant::now() + backoff).min(until);
            if self.failures > 0 {
                tokio::time::sleep_until(wake.into()).await;
            }
            if Instant::now() >= until {
                return false;
            }
            match connect(plan.addr).await {
                Ok(stream) => {
                    self.stream = Some(stream);
                    self.recv.clear();
                    stats.reconnects += 1;
                }
                Err(e) => {
                    self.failures += 1;
                    stats.connect_failures += 1;
                    stats.note_error(|| format!("connect: {e}"));
                }
            }
        }
        true
    }

    /// Fill the windows of this connection's share of the keys (key `k` belongs to connection
    /// `k % connections`) until each refuses; the number of requests sent.
    async fn prefill(&mut self, plan: &Plan) -> anyhow::Result<u64> {
        let per_key = plan.calls.div_ceil(plan.cost.max(1)) + 1;
        let mut sent = 0;
        let mut scratch = Stats::new();
        let far = Instant::now() + Duration::from_secs(365 * 24 * 3600);
        let mut key = self.id as u64;
        while key < plan.keys {
            let mut tries = 0;
            loop {
                if !self.ensure_connected(plan, far, &mut scratch).await {
                    bail!("{}", scratch.first_error.unwrap_or_default());
                }
                tries += 1;
                sent += 1;
                let exchange = self.acquire(key, plan.concurrent.is_some(), None);
                let answer = match tokio::time::timeout(PREFILL_EXCHANGE_TIMEOUT, exchange).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(e)) => {
                        self.failures += 1;
                        scratch.note_error(|| e.to_string());
                        continue;
                    }
                    Err(_) => {
                        self.stream = None;
                        self.failures += 1;
                        scratch.note_error(|| "prefill request timed out".to_owned());
                        continue;
                    }
                };
                self.failures = 0;
                if answer.release {
                    self.ensure_connected(plan, far, &mut scratch).await;
                    let _ = tokio::time::timeout(PREFILL_EXCHANGE_TIMEOUT, self.release()).await;
                }
                match answer.verdict {
                    Verdict::Refused => break,
                    Verdict::Granted if tries < per_key => {}
                    Verdict::Granted => bail!(
                        "key bench/b:{key} still granted after {tries} requests; \
                         is the limit applied?"
                    ),
                    Verdict::None => bail!("prefill request answered HTTP {}", answer.status),
                }
            }
            key += plan.connections as u64;
        }
        Ok(sent)
    }

    /// The measured loop: acquire a random key, one request in flight, until `end`.
    async fn drive(&mut self, plan: &Plan, measure_from: Instant, end: Instant, stats: &mut Stats) {
        let want_permit = plan.concurrent.is_some() || plan.settle;
        let mut pending_release = false;
        loop {
            if !self.ensure_connected(plan, end, stats).await {
                break;
            }
            if pending_release {
                pending_release = false;
                match self.release().await {
                    Ok(true) => stats.released += 1,
                    Ok(false) => stats.release_errors += 1,
                    Err(e) => {
                        stats.release_errors += 1;
                        self.failures += 1;
                        stats.note_error(|| format!("release: {e}"));
                        continue;
                    }
                }
            }
            let started = Instant::now();
            if started >= end {
                break;
            }
            let measured = started >= measure_from;
            let key = self.keys.below(plan.keys);
            let settle_to = plan.settle.then(|| self.keys.below(plan.cost.saturating_mul(2).saturating_add(1)));
            match self.acquire(key, want_permit, settle_to).await {
                Ok(answer) => {
                    self.failures = 0;
                    pending_release = answer.release;
                    if !measured {
                        continue;
                    }
                    stats.latency.record(elapsed_us(started));
                    match answer.verdict {
                        Verdict::Granted => stats.granted += 1,
                        Verdict::Refused => stats.refused += 1,
                        Verdict::None if (200..300).contains(&answer.status) => stats.other += 1,
                        Verdict::None => {
                            stats.errors += 1;
                            stats.note_error(|| format!("acquire answered HTTP {}", answer.status));
                        }
                    }
                }
                Err(e) => {
                    self.failures += 1;
                    if measured {
                        stats.errors += 1;
                    }
                    stats.note_error(|| e.to_string());
                }
            }
        }
    }
}

fn elapsed_us(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

async fn exchange<S>(stream: &mut S, recv: &mut RecvBuf, request: &[u8]) -> Result<Reply, WireError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(request).await?;
    recv.read_reply(stream).await
}

/// A connection's request bytes: formatted once, only the key digits and length vary.
struct Requests {
    acquire_head: Vec<u8>,
    /// `{"key":"bench/caller:{conn}","cost":..,"limits":[{"key":"bench/b:`
    body_head: Vec<u8>,
    acquire_tail: Vec<u8>,
    release_head: Vec<u8>,
    acquire: Vec<u8>,
    release: Vec<u8>,
}

const RELEASE_BODY_HEAD: &[u8] = b"{\"permit\":\"";
const RELEASE_BODY_TAIL: &[u8] = b"\"}";

impl Requests {
    fn new(plan: &Plan, conn: usize) -> Requests {
        let permit = if plan.settle { ",\"permit\":true,\"holdMs\":10000" } else { "" };
        let body_head = format!(
            "{{\"key\":\"bench/caller:{conn}\",\"cost\":{}{permit},\"limits\":[{{\"key\":\"bench/b:",
            plan.cost
        )
        .into_bytes();
        Requests {
            acquire_head: plan.acquire_head.clone(),
            body_head,
            acquire_tail: plan.acquire_tail.clone(),
            release_head: plan.release_head.clone(),
            acquire: Vec::with_capacity(512),
            release: Vec::with_capacity(512),
        }
    }

    fn acquire(&mut self, key: u64) -> &[u8] {
        let len = self.body_head.len() + digits(key) + self.acquire_tail.len();
        let buf = &mut self.acquire;
        buf.clear();
        buf.extend_from_slice(&self.acquire_head);
        push_u64(buf, len as u64);
        buf.extend_from_slice(b"\r\n\r\n");
        buf.extend_from_slice(&self.body_head);
        push_u64(buf, key);
        buf.extend_from_slice(&self.acquire_tail);
        buf
    }

    /// Format the release of `permit` (the raw contents of its JSON string, copied verbatim).
    fn prepare_release(&mut self, permit: &[u8]) {
        let len = RELEASE_BODY_HEAD.len() + permit.len() + RELEASE_BODY_TAIL.len();
        let buf = &mut self.release;
        buf.clear();
        buf.extend_from_slice(&self.release_head);
        push_u64(buf, len as u64);
        buf.extend_from_slice(b"\r\n\r\n");
        buf.extend_from_slice(RELEASE_BODY_HEAD);
        buf.extend_from_slice(permit);
        buf.extend_from_slice(RELEASE_BODY_TAIL);
    }

    /// Format the settle of `permit`'s grant in bucket `key` to `cost`.
    fn prepare_settle(&mut self, permit: &[u8], key: u64, cost: u64) {
        const HEAD: &[u8] = b"\",\"costs\":[{\"key\":\"bench/b:";
        const MID: &[u8] = b"\",\"cost\":";
        const TAIL: &[u8] = b"}]}";
        let len =
            RELEASE_BODY_HEAD.len() + permit.len() + HEAD.len() + digits(key) + MID.len() + digits(cost) + TAIL.len();
        let buf = &mut self.release;
        buf.clear();
        buf.extend_from_slice(&self.release_head);
        push_u64(buf, len as u64);
        buf.extend_from_slice(b"\r\n\r\n");
        buf.extend_from_slice(RELEASE_BODY_HEAD);
        buf.extend_from_slice(permit);
        buf.extend_from_slice(HEAD);
        push_u64(buf, key);
        buf.extend_from_slice(MID);
        push_u64(buf, cost);
        buf.extend_from_slice(TAIL);
    }

    fn release(&self) -> &[u8] {
        &self.release
    }
}

fn digits(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn push_u64(buf: &mut Vec<u8>, mut v: u64) {
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    buf.extend_from_slice(&tmp[i..]);
}

/// Xorshift64 key picker, one per connection, seeded through splitmix64.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64, stream: u64) -> XorShift {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(stream.wrapping_add(1)));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShift(z.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform-enough in `0..n` (multiply-high, no division).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
enum WireError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server closed the connection")]
    Eof,
    #[error("reply uses Transfer-Encoding (chunked); the load generator needs Content-Length")]
    Chunked,
    #[error("reply has no Content-Length")]
    NoLength,
    #[error("malformed reply: {0}")]
    Malformed(&'static str),
    #[error("reply head larger than {RECV_BUF} bytes")]
    HeadTooLarge,
    #[error("reply body larger than {MAX_BODY} bytes")]
    BodyTooLarge,
}

/// A reply read into a [`RecvBuf`]; its body is valid until the next read.
#[derive(Debug)]
struct Reply {
    status: u16,
    close: bool,
    body: Range<usize>,
}

/// A connection's receive buffer: replies are parsed in place, leftovers kept for the next one.
struct RecvBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes of the last reply, consumed when the next one is read.
    pending: usize,
}

impl RecvBuf {
    fn new() -> RecvBuf {
        RecvBuf { buf: vec![0; RECV_BUF], start: 0, end: 0, pending: 0 }
    }

    fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
        self.pending = 0;
    }

    fn body(&self, reply: &Reply) -> &[u8] {
        &self.buf[reply.body.clone()]
    }

    /// Read more bytes after `end`, making room first (compacting, or growing when one reply
    /// does not fit: callers bound the size).
    async fn fill<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<(), WireError> {
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        let n = io.read(&mut self.buf[self.end..]).await?;
        if n == 0 {
            return Err(WireError::Eof);
        }
        self.end += n;
        Ok(())
    }

    async fn read_reply<R: AsyncRead + Unpin>(&mut self, io: &mut R) -> Result<Reply, WireError> {
        self.start += self.pending;
        self.pending = 0;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let mut scanned = 0;
        let head_len = loop {
            let available = &self.buf[self.start..self.end];
            if let Some(i) = find(&available[scanned..], b"\r\n\r\n") {
                break scanned + i + 4;
            }
            if available.len() >= RECV_BUF {
                return Err(WireError::HeadTooLarge);
            }
            scanned = available.len().saturating_sub(3);
            self.fill(io).await?;
        };
        let head = parse_head(&self.buf[self.start..self.start + head_len])?;
        if head.content_length > MAX_BODY {
            return Err(WireError::BodyTooLarge);
        }
        let total = head_len + head.content_length;
        while self.end - self.start < total {
            self.fill(io).await?;
        }
        self.pending = total;
        Ok(Reply { status: head.status, close: head.close, body: self.start + head_len..self.start + total })
    }
}

struct Head {
    status: u16,
    content_length: usize,
    close: bool,
}

/// Parse a reply head (status line and headers, through the blank line).
fn parse_head(head: &[u8]) -> Result<Head, WireError> {
    let mut lines = head.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = lines.next().unwrap_or_default();
    if status_line.len() < 12 || !status_line.starts_with(b"HTTP/1.") || status_line[8] != b' ' {
        return Err(WireError::Malformed("status line"));
    }
    let code = &status_line[9..12];
    if !code.iter().all(u8::is_ascii_digit) {
        return Err(WireError::Malformed("status code"));
    }
    let status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    let http10 = status_line[7] == b'0';
    let mut close = http10;
    let mut content_length = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let colon = line.iter().position(|&b| b == b':').ok_or(WireError::Malformed("header line"))?;
        let name = &line[..colon];
        let value = line[colon + 1..].trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            if value.is_empty() || value.len() > 18 || !value.iter().all(u8::is_ascii_digit) {
                return Err(WireError::Malformed("Content-Length"));
            }
            content_length = Some(value.iter().fold(0usize, |n, d| n * 10 + usize::from(d - b'0')));
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if !value.eq_ignore_ascii_case(b"identity") {
                return Err(WireError::Chunked);
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            if contains_ignore_case(value, b"close") {
                close = true;
            } else if contains_ignore_case(value, b"keep-alive") {
                close = false;
            }
        }
    }
    let content_length = match content_length {
        Some(n) => n,
        None if status < 200 || status == 204 || status == 304 => 0,
        None => return Err(WireError::NoLength),
    };
    Ok(Head { status, content_length, close })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn contains_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Granted,
    Refused,
    None,
}

/// The value after `"name"` and its colon, whitespace skipped.
fn json_value<'a>(body: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let at = find(body, name)?;
    let rest = body[at + name.len()..].trim_ascii_start();
    Some(rest.strip_prefix(b":")?.trim_ascii_start())
}

fn verdict(body: &[u8]) -> Verdict {
    match json_value(body, b"\"granted\"") {
        Some(v) if v.starts_with(b"true") => Verdict::Granted,
        Some(v) if v.starts_with(b"false") => Verdict::Refused,
        _ => Verdict::None,
    }
}

/// The raw contents of the `"permit"` string, escapes kept.
fn permit(body: &[u8]) -> Option<&[u8]> {
    let value = json_value(body, b"\"permit\"")?.strip_prefix(b"\"")?;
    let mut escaped = false;
    for (i, &b) in value.iter().enumerate() {
        match b {
            _ if escaped => escaped = false,
            b'\\' => escaped = true,
            b'"' => return Some(&value[..i]),
            _ => {}
        }
    }
    None
}

/// Per-connection counters, merged after the run.
struct Stats {
    latency: Histogram,
    granted: u64,
    refused: u64,
    other: u64,
    errors: u64,
    reconnects: u64,
    connect_failures: u64,
    released: u64,
    release_errors: u64,
    first_error: Option<String>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            latency: Histogram::new(),
            granted: 0,
            refused: 0,
            other: 0,
            errors: 0,
            reconnects: 0,
            connect_failures: 0,
            released: 0,
            release_errors: 0,
            first_error: None,
        }
    }

    fn note_error(&mut self, message: impl FnOnce() -> String) {
        if self.first_error.is_none() {
            self.first_error = Some(message());
        }
    }

    fn merge(&mut self, other: Stats) {
        self.latency.merge(&other.latency);
        self.granted += other.granted;
        self.refused += other.refused;
        self.other += other.other;
        self.errors += other.errors;
        self.reconnects += other.reconnects;
        self.connect_failures += other.connect_failures;
        self.released += other.released;
        self.release_errors += other.release_errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn into_report(
        self,
        plan: &Plan,
        args: &BenchArgs,
        seconds: f64,
        prefill_requests: u64,
        prefill_seconds: f64,
    ) -> Report {
        let answered = self.granted + self.refused + self.other;
        let h = &self.latency;
        Report {
            url: args.url.clone(),
            path: args.path.clone(),
            mix: plan.mix,
            connections: plan.connections,
            keys: plan.keys,
            calls: plan.calls,
            per_ms: plan.per_ms,
            cost: plan.cost,
            concurrent: plan.concurrent,
            requests: answered + self.errors,
            granted: self.granted,
            refused: self.refused,
            other: self.other,
            errors: self.errors,
            reconnects: self.reconnects,
            connect_failures: self.connect_failures,
            released: self.released,
            release_errors: self.release_errors,
            settle: plan.settle,
            seconds,
            rps: if seconds > 0.0 { answered as f64 / seconds } else { 0.0 },
            min_us: h.min(),
            mean_us: h.mean(),
            p50_us: h.quantile(0.50),
            p95_us: h.quantile(0.95),
            p99_us: h.quantile(0.99),
            p999_us: h.quantile(0.999),
            max_us: h.max(),
            prefill_requests,
            prefill_seconds,
            first_error: self.first_error,
            sink: false,
            cpu_seconds: None,
            cpu_us_per_request: None,
            cpu_share: None,
        }
    }
}

/// Log-linear histogram of `u64` values: exact below 256, then 128 buckets per power of two
/// (relative error under 0.8%, about two significant digits). Fixed size, no allocation per
/// record.
struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

const SUB_BITS: u32 = 7;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

impl Histogram {
    fn new() -> Histogram {
        Histogram { counts: vec![0; BUCKETS].into_boxed_slice(), total: 0, sum: 0, min: u64::MAX, max: 0 }
    }

    fn index(v: u64) -> usize {
        if v < SUB as u64 {
            v as usize
        } else {
            let shift = 63 - v.leading_zeros() - SUB_BITS;
            shift as usize * SUB + (v >> shift) as usize
        }
    }

    /// The largest value that lands in bucket `i`.
    fn upper(i: usize) -> u64 {
        if i < 2 * SUB {
            i as u64
        } else {
            let shift = i / SUB - 1;
            let top = (i - shift * SUB) as u64;
            (top << shift) | ((1u64 << shift) - 1)
        }
    }

    fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
        self.sum += u128::from(v);
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }

    fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    fn min(&self) -> u64 {
        if self.total == 0 { 0 } else { self.min }
    }

    fn max(&self) -> u64 {
        self.max
    }

    fn mean(&self) -> f64 {
        if self.total == 0 { 0.0 } else { self.sum as f64 / self.total as f64 }
    }

    /// The value at quantile `q` (0..=1): the highest value of the bucket holding the
    /// `ceil(q * total)`-th smallest record, clamped to the recorded range.
    fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::upper(i).clamp(self.min, self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::{Context as TaskContext, Poll};

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

    fn args(url: &str, extra: &[&str]) -> BenchArgs {
        let mut argv = vec!["bench", "--url", url];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).bench
    }

    // ---- histogram ----

    #[test]
    fn histogram_buckets_cover_every_value_tightly() {
        let mut last = 0;
        let mut probes: Vec<u64> = (0..5000).collect();
        for shift in 0..64 {
            let p = 1u64 << shift;
            probes.extend([p - 1, p, p + 1, p + p / 3, p.wrapping_mul(3) / 2]);
        }
        probes.push(u64::MAX);
        probes.sort_unstable();
        for v in probes {
            let i = Histogram::index(v);
            assert!(i < BUCKETS, "{v} -> {i}");
            assert!(i >= last, "index must not decrease");
            last = i;
            let up = Histogram::upper(i);
            assert!(up >= v, "{v} above its bucket's upper {up}");
            if i > 0 {
                assert!(Histogram::upper(i - 1) < v, "{v} belongs below bucket {i}");
            }
            assert!((up - v) as f64 <= v as f64 / SUB as f64, "{v} vs {up}");
        }
        assert_eq!(Histogram::index(u64::MAX), BUCKETS - 1);
        assert_eq!(Histogram::upper(BUCKETS - 1), u64::MAX);
    }

    #[test]
    fn histogram_percentiles_on_known_data() {
        let mut h = Histogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.quantile(0.5), 50);
        assert_eq!(h.quantile(0.95), 95);
        assert_eq!(h.quantile(0.99), 99);
        assert_eq!(h.quantile(0.999), 100);
        assert_eq!(h.quantile(0.0), 1);
        assert_eq!((h.min(), h.max()), (1, 100));
        assert!((h.mean() - 50.5).abs() < 1e-9);

        // 1..=100_000 in two halves merged: percentiles within the bucket error.
        let mut a = Histogram::new();
        let mut b = Histogram::new();
        for v in 1..=100_000u64 {
            if v % 2 == 0 { &mut a } else { &mut b }.record(v);
        }
        a.merge(&b);
        for (q, want) in [(0.5, 50_000.0), (0.95, 95_000.0), (0.99, 99_000.0), (0.999, 99_900.0)] {
            let got = a.quantile(q) as f64;
            assert!(got >= want && got <= want * 1.008, "q{q}: {got} vs {want}");
        }
        assert_eq!(a.max(), 100_000);
        assert_eq!(a.quantile(1.0), 100_000);

        // A long tail: 990 fast, 10 slow.
        let mut t = Histogram::new();
        for _ in 0..990 {
            t.record(80);
        }
        for _ in 0..10 {
            t.record(1_000_000);
        }
        assert_eq!(t.quantile(0.99), 80);
        assert_eq!(t.quantile(0.999), 1_000_000);
        assert_eq!(Histogram::new().quantile(0.5), 0);
    }

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

        let mut a = XorShift::new(7, 3);
        let mut b = XorShift::new(7, 3);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let k = a.below(10);
            assert_eq!(k, b.below(10));
            seen[k as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
        assert_ne!(XorShift::new(7, 3).next(), XorShift::new(7, 4).next());
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
