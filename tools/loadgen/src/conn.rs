//! One connection's request loop: the plan every connection shares, the request templates
//! (formatted once; only the key digits and `Content-Length` change), the key picker, and the
//! acquire / release exchanges with their counters.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::net::TcpStream;

use crate::http::{RecvBuf, Verdict, WireError, exchange, permit, verdict};
use crate::stats::Stats;
use crate::{BenchArgs, MAX_CONSECUTIVE_FAILURES, Mix, PREFILL_EXCHANGE_TIMEOUT};

/// `args` checked and resolved, shared by every connection.
pub(crate) struct Plan {
    pub(crate) addr: SocketAddr,
    pub(crate) connections: usize,
    pub(crate) keys: u64,
    pub(crate) calls: u64,
    pub(crate) per_ms: u64,
    pub(crate) cost: u64,
    pub(crate) concurrent: Option<u64>,
    /// Settle every grant (`--settle`).
    pub(crate) settle: bool,
    pub(crate) mix: Mix,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) seed: u64,
    /// Acquire request line and headers, up to and including `Content-Length: `.
    pub(crate) acquire_head: Vec<u8>,
    /// Release request line and headers, up to and including `Content-Length: `.
    pub(crate) release_head: Vec<u8>,
    /// The body after the bucket key's digits.
    pub(crate) acquire_tail: Vec<u8>,
}

impl Plan {
    pub(crate) async fn new(args: &BenchArgs) -> anyhow::Result<Plan> {
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
pub(crate) fn parse_url(url: &str) -> anyhow::Result<&str> {
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

pub(crate) fn has_port(authority: &str) -> bool {
    match authority.rfind(':') {
        Some(i) => !authority[i..].contains(']'),
        None => false,
    }
}

pub(crate) fn is_header_safe(s: &str) -> bool {
    !s.bytes().any(|b| b.is_ascii_control())
}

pub(crate) async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// One connection's state, carried from the prefill into the measured phase.
pub(crate) struct Conn {
    pub(crate) id: usize,
    pub(crate) stream: Option<TcpStream>,
    pub(crate) recv: RecvBuf,
    pub(crate) requests: Requests,
    pub(crate) keys: fastrand::Rng,
    pub(crate) failures: u32,
}

/// What one acquire exchange came to.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) verdict: Verdict,
    /// A release request is ready in `Requests` for a permit this reply granted.
    pub(crate) release: bool,
}

impl Conn {
    pub(crate) fn new(plan: &Plan, id: usize, stream: TcpStream) -> Conn {
        Conn {
            id,
            stream: Some(stream),
            recv: RecvBuf::new(),
            requests: Requests::new(plan, id),
            keys: fastrand::Rng::with_seed(plan.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            failures: 0,
        }
    }

    /// Send one acquire for `key` and read its reply; on `Connection: close` the stream is
    /// dropped after the reply, on failure at once.
    /// With `settle_to`, a grant's permit is settled to that cost in bucket `key` by the second
    /// request; without it, released.
    pub(crate) async fn acquire(
        &mut self,
        key: u64,
        want_permit: bool,
        settle_to: Option<u64>,
    ) -> Result<Answer, WireError> {
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
    pub(crate) async fn release(&mut self) -> Result<bool, WireError> {
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
    pub(crate) async fn ensure_connected(&mut self, plan: &Plan, until: Instant, stats: &mut Stats) -> bool {
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
    pub(crate) async fn prefill(&mut self, plan: &Plan) -> anyhow::Result<u64> {
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
    pub(crate) async fn drive(&mut self, plan: &Plan, measure_from: Instant, end: Instant, stats: &mut Stats) {
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
            let key = self.keys.u64(..plan.keys);
            let settle_to = plan.settle.then(|| self.keys.u64(..=plan.cost.saturating_mul(2)));
            match self.acquire(key, want_permit, settle_to).await {
                Ok(answer) => {
                    self.failures = 0;
                    pending_release = answer.release;
                    if !measured {
                        continue;
                    }
                    stats.record_latency(elapsed_us(started));
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

pub(crate) fn elapsed_us(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// A connection's request bytes: formatted once, only the key digits and length vary.
pub(crate) struct Requests {
    pub(crate) acquire_head: Vec<u8>,
    /// `{"key":"bench/caller:{conn}","cost":..,"limits":[{"key":"bench/b:`
    pub(crate) body_head: Vec<u8>,
    pub(crate) acquire_tail: Vec<u8>,
    pub(crate) release_head: Vec<u8>,
    pub(crate) acquire: Vec<u8>,
    pub(crate) release: Vec<u8>,
}

pub(crate) const RELEASE_BODY_HEAD: &[u8] = b"{\"permit\":\"";
pub(crate) const RELEASE_BODY_TAIL: &[u8] = b"\"}";

impl Requests {
    pub(crate) fn new(plan: &Plan, conn: usize) -> Requests {
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

    pub(crate) fn acquire(&mut self, key: u64) -> &[u8] {
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
    pub(crate) fn prepare_release(&mut self, permit: &[u8]) {
        let len = RELEASE_BODY_HEAD.len() + permit.len() + RELEASE_BODY_TAIL.len();
        self.start_permit_body(len, permit).extend_from_slice(RELEASE_BODY_TAIL);
    }

    /// Starts the release buffer's request: its head, a body of `len` bytes, and the body's
    /// start up to and including `permit`; the caller appends the rest.
    fn start_permit_body(&mut self, len: usize, permit: &[u8]) -> &mut Vec<u8> {
        let buf = &mut self.release;
        buf.clear();
        buf.extend_from_slice(&self.release_head);
        push_u64(buf, len as u64);
        buf.extend_from_slice(b"\r\n\r\n");
        buf.extend_from_slice(RELEASE_BODY_HEAD);
        buf.extend_from_slice(permit);
        buf
    }

    /// Format the settle of `permit`'s grant in bucket `key` to `cost`.
    pub(crate) fn prepare_settle(&mut self, permit: &[u8], key: u64, cost: u64) {
        const HEAD: &[u8] = b"\",\"costs\":[{\"key\":\"bench/b:";
        const MID: &[u8] = b"\",\"cost\":";
        const TAIL: &[u8] = b"}]}";
        let len =
            RELEASE_BODY_HEAD.len() + permit.len() + HEAD.len() + digits(key) + MID.len() + digits(cost) + TAIL.len();
        let buf = self.start_permit_body(len, permit);
        buf.extend_from_slice(HEAD);
        push_u64(buf, key);
        buf.extend_from_slice(MID);
        push_u64(buf, cost);
        buf.extend_from_slice(TAIL);
    }

    pub(crate) fn release(&self) -> &[u8] {
        &self.release
    }
}

pub(crate) fn digits(v: u64) -> usize {
    v.checked_ilog10().map_or(1, |d| d as usize + 1)
}

pub(crate) fn push_u64(buf: &mut Vec<u8>, mut v: u64) {
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
