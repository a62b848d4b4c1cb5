//! `redb-limiter status`: a table of buckets (window use against the last `calls` seen, oldest
//! grant, places held), throttles with time left, and totals; from a running server's `/state`
//! (page by page) or straight from the file when no server holds it.
//!
//! `--watch` redraws the same view in place once a second, as the live page shows it: bars,
//! fullest first, places about to lapse, and (from a server) the latest refusals and decisions
//! per second from `/recent`; q or Ctrl-C quits. [`render_live`] is the drawing, a pure function
//! of what was read; `watch` owns the terminal (its own screen, keys read unbuffered) and
//! gives it back as it was.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use redb_limiter::limiter::Limiter;
use redb_limiter::store::StoreError;
use redb_limiter::wire::StateReply;
use redb_limiter_client::HttpLimiter;

use crate::recent::RecentReply;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// A running server to ask.
    #[arg(long, env = "REDB_LIMITER_URL", conflicts_with = "path")]
    pub url: Option<String>,
    /// The file to read when no server holds it.
    #[arg(long, env = "REDB_LIMITER_PATH")]
    pub path: Option<PathBuf>,
    #[arg(long, env = "REDB_LIMITER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Only keys starting with this.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Print the `/state` JSON instead of a table.
    #[arg(long, conflicts_with = "watch")]
    pub json: bool,
    /// Redraw a live view once a second until q or Ctrl-C.
    #[arg(long)]
    pub watch: bool,
    /// How many buckets, permits and throttles each to ask a server for at once.
    #[arg(long, hide = true, default_value_t = 1000)]
    pub page_size: usize,
}

/// The whole state from a server's `/state`, page by page (each page at most `page_size` of
/// each kind, from `after`). A kind whose page came back full may have more: the next page
/// starts after the lowest of those kinds' last keys; what comes back twice is kept once.
async fn from_server(url: &str, token: Option<&str>, prefix: &str, page_size: usize) -> anyhow::Result<StateReply> {
    use std::collections::BTreeMap;
    let server = HttpLimiter::new(url, token.map(str::to_owned));
    let (mut buckets, mut permits, mut throttles) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let mut after = String::new();
    loop {
        let limit = page_size.to_string();
        let query = [("prefix", prefix), ("after", after.as_str()), ("limit", limit.as_str())];
        let resp = server
            .request(reqwest::Method::GET, "/state")
            .query(&query)
            .send()
            .await
            .with_context(|| format!("asking {url}"))?;
        let status = resp.status();
        let body = resp.text().await?;
        anyhow::ensure!(status.is_success(), "{url}/state answered {status}: {body}");
        let mut page: StateReply = serde_json::from_str(&body)?;
        let full_lasts = [
            (page.buckets.len() >= page_size).then(|| page.buckets.last().map(|b| b.key.clone())).flatten(),
            (page.permits.len() >= page_size).then(|| page.permits.last().map(|p| p.permit.clone())).flatten(),
            (page.throttles.len() >= page_size).then(|| page.throttles.last().map(|t| t.key.clone())).flatten(),
        ];
        buckets.extend(page.buckets.drain(..).map(|b| (b.key.clone(), b)));
        permits.extend(page.permits.drain(..).map(|p| (p.permit.clone(), p)));
        throttles.extend(page.throttles.drain(..).map(|t| (t.key.clone(), t)));
        let next = full_lasts.into_iter().flatten().min();
        match next {
            Some(next) if page.truncated && next > after => after = next,
            _ => {
                page.buckets = buckets.into_values().collect();
                page.permits = permits.into_values().collect();
                page.throttles = throttles.into_values().collect();
                page.truncated = false;
                return Ok(page);
            }
        }
    }
}

/// Reads `path` of a server as JSON, with its token.
async fn read<T: serde::de::DeserializeOwned>(
    server: &HttpLimiter,
    path: &str,
    query: &[(&str, &str)],
) -> anyhow::Result<T> {
    let url = server.url();
    let resp = server
        .request(reqwest::Method::GET, path)
        .query(query)
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = resp.status();
    let body = resp.text().await?;
    anyhow::ensure!(status.is_success(), "{url}{path} answered {status}: {body}");
    Ok(serde_json::from_str(&body)?)
}

fn from_file(path: PathBuf, prefix: &str) -> anyhow::Result<StateReply> {
    anyhow::ensure!(path.exists(), "{}: no such file (is the server's --path elsewhere?)", path.display());
    let limiter = match Limiter::open(&path) {
        Ok(limiter) => limiter,
        Err(e @ StoreError::HeldElsewhere { .. }) => {
            anyhow::bail!("{e}; ask the server that holds it with --url")
        }
        Err(e) => return Err(e.into()),
    };
    let s = limiter.state_blocking(prefix)?;
    limiter.close();
    Ok(StateReply::new(s.now, &s.view, s.totals))
}

async fn fetch(args: &StatusArgs) -> anyhow::Result<StateReply> {
    match (&args.url, &args.path) {
        (Some(url), _) => from_server(url, args.token.as_deref(), &args.prefix, args.page_size.max(1)).await,
        (None, path) => {
            let path = path.clone().unwrap_or_else(|| PathBuf::from(redb_limiter::DEFAULT_PATH));
            let prefix = args.prefix.clone();
            tokio::task::spawn_blocking(move || from_file(path, &prefix)).await?
        }
    }
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    if args.watch {
        return watch(&args).await;
    }
    let state = fetch(&args).await?;
    let text = if args.json { serde_json::to_string_pretty(&state)? + "\n" } else { render(&state) };
    write_quietly(&mut std::io::stdout().lock(), &text)
}

/// Writes `text` to `out`; a reader that closed the pipe early (`status --json | head`) ends
/// the output quietly, as it does for every command-line tool.
fn write_quietly(out: &mut impl std::io::Write, text: &str) -> anyhow::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn ago(now: u64, then: u64) -> String {
    let ms = now.saturating_sub(then);
    if ms < 10_000 { format!("{ms}ms ago") } else { format!("{}s ago", ms / 1000) }
}

fn ahead(now: u64, then: u64) -> String {
    let ms = then.saturating_sub(now);
    if ms < 10_000 { format!("{ms}ms") } else { format!("{}s", ms / 1000) }
}

/// The human table.
#[must_use]
pub fn render(state: &StateReply) -> String {
    let now = state.now.0.0;
    let mut out = String::new();
    let width = state.buckets.iter().map(|b| b.key.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(
        out,
        "{:width$}  {:>21}  {:>10}  {:>14}  {:>9}",
        "BUCKET", "WINDOW USE", "PER", "OLDEST GRANT", "PLACES"
    );
    for b in &state.buckets {
        let window = if b.per_ms > 0 { format!("{}/{}", b.window_used, b.calls) } else { "-".into() };
        let per = if b.per_ms > 0 { format!("{}ms", b.per_ms) } else { "-".into() };
        let oldest = b.oldest_grant.map_or("-".into(), |t| ago(now, t.0.0));
        let places = if b.concurrent > 0 { format!("{}/{}", b.places_held, b.concurrent) } else { "-".into() };
        let _ = writeln!(out, "{:width$}  {window:>21}  {per:>10}  {oldest:>14}  {places:>9}", b.key);
    }
    lines(&mut out, state, |ms| format!("{ms}ms"));
    levels(&mut out, state);
    ceilings(&mut out, state, span);
    if !state.throttles.is_empty() {
        let _ = writeln!(out, "\nTHROTTLED CALLER{}  TIME LEFT", " ".repeat(width.saturating_sub(16)));
        for t in &state.throttles {
            let _ = writeln!(out, "{:width$}  {}", t.key, ahead(now, t.until.0.0));
        }
    }
    let places: u64 = state.buckets.iter().map(|b| b.places_held).sum();
    let _ = writeln!(
        out,
        "\n{} buckets, {} permits holding {places} places, {} throttles (at {})",
        state.totals.buckets,
        state.totals.permits,
        state.totals.throttles,
        redb_limiter::time::format_instant(state.now.0)
    );
    out
}

/// The buckets with a line (section 12): how many tickets wait, and how long the first has
/// waited; nothing when no bucket has one.
fn lines(out: &mut String, state: &StateReply, span: impl Fn(u64) -> String) {
    let queued: Vec<_> = state.buckets.iter().filter(|b| b.queued > 0).collect();
    if queued.is_empty() {
        return;
    }
    let width = queued.iter().map(|b| b.key.len()).max().unwrap_or(0).max(6);
    let _ = writeln!(out, "\n{:width$}  {:>6}  FIRST WAITING", "LINE", "QUEUED");
    for b in queued {
        let waited = b.first_ticket_at.map_or("-".into(), |at| span(state.now.0.0.saturating_sub(at.0.0)));
        let _ = writeln!(out, "{:width$}  {:>6}  {waited}", b.key, b.queued);
    }
}

/// The token buckets (section 13): each one's level against its burst (`[###.......] 7/10`, a
/// debt named as one); nothing when no bucket keeps a level.
fn levels(out: &mut String, state: &StateReply) {
    let kept: Vec<_> = state.buckets.iter().filter_map(|b| Some((b.key.as_str(), b.level?, b.burst?))).collect();
    if kept.is_empty() {
        return;
    }
    let width = kept.iter().map(|(key, _, _)| key.len()).max().unwrap_or(0).max(12);
    let _ = writeln!(out, "\n{:width$}  TOKENS (LEVEL/BURST)", "TOKEN BUCKET");
    for (key, level, burst) in kept {
        let shown = meter(u64::try_from(level).unwrap_or(0), burst).replacen("] 0/", &format!("] {level}/"), 1);
        let debt = if level < 0 { "  in debt" } else { "" };
        let _ = writeln!(out, "{key:width$}  {shown}{debt}");
    }
}

/// The adaptive ceilings kept (section 14): each one's `C` and how long ago it was last cut;
/// nothing when none is kept.
fn ceilings(out: &mut String, state: &StateReply, span: impl Fn(u64) -> String) {
    if state.ceilings.is_empty() {
        return;
    }
    let width = state.ceilings.iter().map(|c| c.key.len()).max().unwrap_or(0).max(16);
    let _ = writeln!(out, "\n{:width$}  {:>10}  LAST CUT", "ADAPTIVE CEILING", "CEILING");
    for c in &state.ceilings {
        let cut = c.last_cut_at.map_or("-".into(), |at| format!("{} ago", span(state.now.0.0.saturating_sub(at.0.0))));
        let _ = writeln!(out, "{:width$}  {:>10}  {cut}", c.key, c.ceiling);
    }
}

/// A span of milliseconds as the live views write it: `800ms`, `44.4s`, `2m 05s`, `1h 02m`.
#[must_use]
pub fn span(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{}.{}s", ms / 1000, ms % 1000 / 100),
        60_000..3_600_000 => format!("{}m {:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h {:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// `[######....] 3/5`, or `-` without a limit.
fn meter(used: u64, max: u64) -> String {
    if max == 0 {
        return "-".into();
    }
    let filled = (used.min(max) * 10).div_ceil(max) as usize;
    let filled = if used < max { filled.min(9) } else { 10 };
    format!("[{}{}] {used}/{max}", "#".repeat(filled), ".".repeat(10 - filled))
}

/// One character a second, eight heights, scaled to the largest value.
fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let top = values.iter().copied().max().unwrap_or(0).max(1);
    values.iter().map(|&v| if v == 0 { ' ' } else { BARS[((v * 7).div_ceil(top)) as usize] }).collect()
}

/// How full a bucket is: the larger of window use and places held, as a share of its limit.
fn fullness(b: &redb_limiter::wire::BucketState) -> f64 {
    let share = |used: u64, max: u64| if max == 0 { 0.0 } else { used as f64 / max as f64 };
    share(b.window_used, b.calls).max(share(b.places_held, b.concurrent))
}

/// The live view: at most `bucket_rows` buckets, fullest first, then throttles, the places that
/// lapse next, and (with a feed) decisions in the last minute and the latest refusals.
#[must_use]
pub fn render_live(state: &StateReply, recent: Option<&RecentReply>, bucket_rows: usize) -> String {
    let now = state.now.0.0;
    let mut out = String::new();
    let t = &state.totals;
    let _ = writeln!(
        out,
        "redb-limiter  {}  {} buckets · {} permits · {} throttles  (q quits)\n",
        redb_limiter::time::format_instant(state.now.0),
        t.buckets,
        t.permits,
        t.throttles
    );
    let mut buckets: Vec<_> = state.buckets.iter().collect();
    buckets.sort_by(|a, b| fullness(b).total_cmp(&fullness(a)).then_with(|| a.key.cmp(&b.key)));
    let shown = &buckets[..buckets.len().min(bucket_rows)];
    let width = shown.iter().map(|b| b.key.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(
        out,
        "{:width$}  {:<24}  {:>7}  {:>13}  {:<20}  {:>11}",
        "BUCKET", "WINDOW USE", "PER", "OLDEST LEAVES", "PLACES", "NEXT LAPSE"
    );
    for b in shown {
        let per = if b.per_ms > 0 { span(b.per_ms) } else { "-".into() };
        let leaves = match b.oldest_grant {
            Some(at) if b.per_ms > 0 => format!("in {}", span((at.0.0 + b.per_ms).saturating_sub(now))),
            _ => "-".into(),
        };
        let lapse = b.next_lapse.map_or("-".into(), |at| format!("in {}", span(at.0.0.saturating_sub(now))));
        let _ = writeln!(
            out,
            "{:width$}  {:<24}  {per:>7}  {leaves:>13}  {:<20}  {lapse:>11}",
            b.key,
            meter(b.window_used, b.calls),
            meter(b.places_held, b.concurrent)
        );
    }
    if state.buckets.is_empty() {
        let _ = writeln!(out, "(no buckets)");
    } else if buckets.len() > shown.len() {
        let _ = writeln!(out, "… and {} emptier buckets (narrow with --prefix)", buckets.len() - shown.len());
    }
    lines(&mut out, state, span);
    levels(&mut out, state);
    ceilings(&mut out, state, span);
    if !state.throttles.is_empty() {
        let width = state.throttles.iter().map(|t| t.key.len()).max().unwrap_or(0).max(16);
        let _ = writeln!(out, "\n{:width$}  TIME LEFT", "THROTTLED CALLER");
        for t in &state.throttles {
            let _ = writeln!(out, "{:width$}  {}", t.key, span(t.until.0.0.saturating_sub(now)));
        }
    }
    let mut places: Vec<_> = state
        .permits
        .iter()
        .flat_map(|p| p.places.iter().map(move |pl| (pl.lapse.0.0, &p.permit, &pl.bucket)))
        .collect();
    if !places.is_empty() {
        places.sort();
        let _ = writeln!(out, "\nPLACES ABOUT TO LAPSE");
        for (lapse, permit, bucket) in places.iter().take(5) {
            let _ = writeln!(out, "{permit}  {bucket}  in {}", span(lapse.saturating_sub(now)));
        }
        if places.len() > 5 {
            let _ = writeln!(out, "… and {} more", places.len() - 5);
        }
    }
    if let Some(recent) = recent {
        let p = &recent.per_second;
        let last = |v: &[u64]| v[v.len().saturating_sub(60)..].to_vec();
        let sum = |v: &[u64]| last(v).iter().sum::<u64>();
        let refused: Vec<u64> = (0..p.granted.len()).map(|i| p.rate[i] + p.concurrency[i] + p.throttle[i]).collect();
        let _ = writeln!(
            out,
            "\nLAST MINUTE  {} granted · refused {} rate, {} concurrency, {} throttle",
            sum(&p.granted),
            sum(&p.rate),
            sum(&p.concurrency),
            sum(&p.throttle)
        );
        let _ = writeln!(out, "granted |{}|", sparkline(&last(&p.granted)));
        let _ = writeln!(out, "refused |{}|", sparkline(&last(&refused)));
        if !recent.refusals.is_empty() {
            let _ = writeln!(out, "\nLATEST REFUSALS");
            for r in recent.refusals.iter().take(8) {
                let _ = writeln!(
                    out,
                    "{:>9} ago  {}  {}  {}  told to wait {}",
                    span(now.saturating_sub(r.at.0.0)),
                    r.caller,
                    r.limit,
                    r.reason,
                    span(r.wait_ms)
                );
            }
        }
    }
    out
}

/// `status --watch`: reads and redraws once a second until q, Ctrl-C or SIGINT.
async fn watch(args: &StatusArgs) -> anyhow::Result<()> {
    let server = args.url.as_deref().map(|url| HttpLimiter::new(url, args.token.clone()));
    let keys = terminal::Keys::start();
    print!("\x1b[?1049h\x1b[?25l");
    let result = async {
        loop {
            let rows = terminal::rows().unwrap_or(40);
            let state = fetch(args).await;
            let recent = match &server {
                Some(server) => read::<RecentReply>(server, "/recent", &[]).await.ok(),
                None => None,
            };
            let text = match state {
                Ok(state) => render_live(&state, recent.as_ref(), rows.saturating_sub(34).max(5)),
                Err(e) => format!("redb-limiter status --watch: {e:#}\n(trying again each second; q quits)\n"),
            };
            // Home, clear, draw (the terminal still turns each LF into CR LF).
            print!("\x1b[H\x1b[2J{text}");
            std::io::Write::flush(&mut std::io::stdout())?;
            tokio::select! {
                () = keys.quit() => return Ok(()),
                _ = tokio::signal::ctrl_c() => return Ok(()),
                () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    }
    .await;
    print!("\x1b[?25h\x1b[?1049l");
    std::io::Write::flush(&mut std::io::stdout())?;
    drop(keys);
    result
}

/// The terminal while watching: keys read one at a time without echo, and its size.
mod terminal {
    use std::sync::Arc;

    /// Reads stdin unbuffered on a thread of its own while it lives (when stdin is a terminal),
    /// and restores the terminal's modes when dropped.
    pub struct Keys {
        quit: Arc<tokio::sync::Notify>,
        #[cfg(unix)]
        saved: Option<libc::termios>,
    }

    impl Keys {
        pub fn start() -> Self {
            let quit = Arc::new(tokio::sync::Notify::new());
            #[cfg(unix)]
            {
                let saved = raw();
                if saved.is_some() {
                    let quit = quit.clone();
                    std::thread::spawn(move || {
                        use std::io::Read;
                        let mut byte = [0u8; 1];
                        let mut stdin = std::io::stdin();
                        while let Ok(1) = stdin.read(&mut byte) {
                            if matches!(byte[0], b'q' | b'Q' | 3) {
                                quit.notify_one();
                            }
                        }
                    });
                }
                Keys { quit, saved }
            }
            #[cfg(not(unix))]
            Keys { quit }
        }

        /// Completes when q or Ctrl-C was pressed.
        pub async fn quit(&self) {
            self.quit.notified().await;
        }
    }

    /// Turns off line buffering, echo and the terminal's own Ctrl-C (read as a key instead);
    /// returns the modes to restore, or `None` when stdin is no terminal.
    #[cfg(unix)]
    fn raw() -> Option<libc::termios> {
        // SAFETY: tcgetattr and tcsetattr only read and write the struct passed, on fd 0.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::isatty(0) != 1 || libc::tcgetattr(0, &raw mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            (libc::tcsetattr(0, libc::TCSANOW, &raw const raw) == 0).then_some(saved)
        }
    }

    impl Drop for Keys {
        fn drop(&mut self) {
            #[cfg(unix)]
            if let Some(saved) = &self.saved {
                // SAFETY: restores the modes read by `raw` on the same fd.
                unsafe {
                    libc::tcsetattr(0, libc::TCSANOW, saved);
                }
            }
        }
    }

    /// The terminal's height in rows, when stdout is one.
    pub fn rows() -> Option<usize> {
        #[cfg(unix)]
        {
            // SAFETY: TIOCGWINSZ writes one winsize into the struct passed.
            let mut size: libc::winsize = unsafe { std::mem::zeroed() };
            let ok = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &raw mut size) } == 0;
            (ok && size.ws_row > 0).then_some(usize::from(size.ws_row))
        }
        #[cfg(not(unix))]
        None
    }
}

#[cfg(test)]
mod tests {
    /// A pipe whose reader is gone, as `status --json | head` leaves stdout.
    struct ClosedPipe;

    impl std::io::Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_ends_the_output_quietly_and_other_errors_do_not() {
        super::write_quietly(&mut ClosedPipe, "{}\n").unwrap();
        let mut full = [0u8; 2];
        let err = super::write_quietly(&mut &mut full[..], "{ \"a\": 1 }").unwrap_err();
        assert!(err.to_string().contains("write zero") || err.to_string().contains("whole buffer"), "{err}");
        let mut out = Vec::new();
        super::write_quietly(&mut out, "ok\n").unwrap();
        assert_eq!(out, b"ok\n");
    }

    use super::*;

    fn state() -> StateReply {
        serde_json::from_value(serde_json::json!({
            "now": "2027-01-15T08:00:00.600Z",
            "buckets": [
                {"key": "api/requests", "windowUsed": 3, "calls": 5, "perMs": 60000, "concurrent": 0,
                 "oldestGrant": "2027-01-15T08:00:00.000Z", "placesHeld": 0, "nextLapse": null},
                {"key": "api/streams", "windowUsed": 0, "calls": 0, "perMs": 0, "concurrent": 2,
                 "oldestGrant": null, "placesHeld": 2, "nextLapse": "2027-01-15T08:00:30.300Z"},
                {"key": "search/qps", "windowUsed": 1, "calls": 2, "perMs": 1000, "concurrent": 0,
                 "oldestGrant": "2027-01-15T08:00:00.400Z", "placesHeld": 0, "nextLapse": null}
            ],
            "permits": [{"permit": "p-1", "places": [{"bucket": "api/streams", "lapse": "2027-01-15T08:00:30.300Z"}]},
                        {"permit": "p-2", "places": [{"bucket": "api/streams", "lapse": "2027-01-15T08:00:31.000Z"}]}],
            "throttles": [{"key": "agent-2", "until": "2027-01-15T08:00:45.000Z"}],
            "totals": {"buckets": 3, "permits": 2, "throttles": 1},
            "truncated": false
        }))
        .unwrap()
    }

    fn recent() -> RecentReply {
        let mut granted = vec![0; 300];
        granted[299] = 8;
        granted[298] = 4;
        let mut rate = vec![0; 300];
        rate[299] = 1;
        serde_json::from_value(serde_json::json!({
            "now": "2027-01-15T08:00:00.600Z",
            "refusals": [{"at": "2027-01-15T08:00:00.600Z", "caller": "agent-2", "limit": "agent-2",
                          "reason": "throttle", "retryAt": "2027-01-15T08:00:45.000Z", "waitMs": 44400}],
            "perSecond": {"from": "2027-01-15T07:55:01.000Z", "granted": granted, "rate": rate,
                          "concurrency": vec![0; 300], "throttle": vec![0; 300]}
        }))
        .unwrap()
    }

    #[test]
    fn token_buckets_show_their_level_against_their_burst_and_a_debt_as_one() {
        let mut state = state();
        let bucket = |key: &str, level: i64| -> redb_limiter::wire::BucketState {
            serde_json::from_value(serde_json::json!({"key": key, "windowUsed": 0, "calls": 0, "perMs": 0,
                "concurrent": 0, "oldestGrant": null, "placesHeld": 0, "nextLapse": null, "level": level, "burst": 10}))
            .unwrap()
        };
        state.buckets.push(bucket("anthropic/itpm", 7));
        state.buckets.push(bucket("anthropic/otpm", -3));
        for out in [render(&state), render_live(&state, None, 10)] {
            assert!(out.contains("\nTOKEN BUCKET    TOKENS (LEVEL/BURST)\n"), "{out}");
            assert!(out.contains("anthropic/itpm  [#######...] 7/10\n"), "{out}");
            assert!(out.contains("anthropic/otpm  [..........] -3/10  in debt\n"), "{out}");
        }
        assert!(!render(&super::tests::state()).contains("TOKEN BUCKET"), "nothing where no bucket keeps a level");
    }

    #[test]
    fn adaptive_ceilings_show_their_ceiling_and_last_cut() {
        let mut state = state();
        state.ceilings = serde_json::from_value(serde_json::json!([
            {"key": "anthropic/rpm", "ceiling": 25, "lastCutAt": "2027-01-15T08:00:00.100Z"},
            {"key": "openai/rpm", "ceiling": 60, "lastCutAt": null}
        ]))
        .unwrap();
        for out in [render(&state), render_live(&state, None, 10)] {
            assert!(out.contains("\nADAPTIVE CEILING     CEILING  LAST CUT\n"), "{out}");
            assert!(out.contains("anthropic/rpm             25  500ms ago\n"), "{out}");
            assert!(out.contains("openai/rpm                60  -\n"), "{out}");
        }
        assert!(!render(&super::tests::state()).contains("ADAPTIVE CEILING"), "nothing where no ceiling is kept");
    }

    #[test]
    fn spans_read_like_the_page() {
        assert_eq!(span(0), "0ms");
        assert_eq!(span(800), "800ms");
        assert_eq!(span(44_400), "44.4s");
        assert_eq!(span(125_000), "2m 05s");
        assert_eq!(span(3_720_000), "1h 02m");
    }

    #[test]
    fn live_view_puts_the_fullest_first_with_bars_countdowns_and_refusals() {
        let text = render_live(&state(), Some(&recent()), 10);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "redb-limiter  2027-01-15T08:00:00.600Z  3 buckets · 2 permits · 1 throttles  (q quits)");
        assert!(lines[2].starts_with("BUCKET"), "{text}");
        assert!(lines[3].starts_with("api/streams   -  "), "{text}");
        assert!(lines[3].contains("[##########] 2/2") && lines[3].ends_with("in 29.7s"), "{text}");
        assert!(lines[4].starts_with("api/requests  [######....] 3/5"), "{text}");
        assert!(lines[4].contains("1m 00s") && lines[4].contains("in 59.4s"), "{text}");
        assert!(lines[5].starts_with("search/qps    [#####.....] 1/2"), "{text}");
        assert!(lines[5].contains("in 800ms"), "{text}");
        assert!(text.contains("\nTHROTTLED CALLER  TIME LEFT\nagent-2           44.4s\n"), "{text}");
        assert!(text.contains("\nPLACES ABOUT TO LAPSE\np-1  api/streams  in 29.7s\np-2  api/streams  in 30.4s\n"));
        assert!(text.contains("LAST MINUTE  12 granted · refused 1 rate, 0 concurrency, 0 throttle"), "{text}");
        assert!(text.contains(&format!("granted |{}▅█|", " ".repeat(58))), "{text}");
        assert!(text.contains(&format!("refused |{}█|", " ".repeat(59))), "{text}");
        assert!(text.contains("      0ms ago  agent-2  agent-2  throttle  told to wait 44.4s"), "{text}");
    }

    #[test]
    fn live_view_pages_long_lists_and_says_when_empty() {
        let text = render_live(&state(), None, 2);
        assert!(text.contains("… and 1 emptier buckets (narrow with --prefix)"), "{text}");
        assert!(!text.contains("search/qps") && !text.contains("LAST MINUTE"), "{text}");
        let empty: StateReply = serde_json::from_value(serde_json::json!({
            "now": "2027-01-15T08:00:00.000Z", "buckets": [], "permits": [], "throttles": [],
            "totals": {"buckets": 0, "permits": 0, "throttles": 0}
        }))
        .unwrap();
        let text = render_live(&empty, None, 10);
        assert!(text.contains("(no buckets)") && !text.contains("THROTTLED"), "{text}");
    }

    #[test]
    fn both_views_show_each_line_and_how_long_its_first_ticket_waited() {
        let mut state = state();
        assert!(!render(&state).contains("QUEUED") && !render_live(&state, None, 10).contains("QUEUED"));
        let mut line: redb_limiter::wire::BucketState = serde_json::from_value(serde_json::json!({
            "key": "api/tokens", "windowUsed": 0, "calls": 0, "perMs": 0, "concurrent": 0,
            "oldestGrant": null, "placesHeld": 0, "nextLapse": null,
            "queued": 3, "firstTicketAt": "2027-01-15T08:00:00.100Z"
        }))
        .unwrap();
        state.buckets.push(line.clone());
        let text = render_live(&state, None, 10);
        assert!(text.contains("\nLINE        QUEUED  FIRST WAITING\napi/tokens       3  500ms\n"), "{text}");
        let text = render(&state);
        assert!(text.contains("\nLINE        QUEUED  FIRST WAITING\napi/tokens       3  500ms\n"), "{text}");
        line.first_ticket_at = None;
        state.buckets[3] = line;
        assert!(render(&state).contains("api/tokens       3  -\n"));
    }

    #[test]
    fn meters_show_full_only_when_full() {
        assert_eq!(meter(0, 5), "[..........] 0/5");
        assert_eq!(meter(999, 1000), "[#########.] 999/1000");
        assert_eq!(meter(7, 5), "[##########] 7/5");
        assert_eq!(meter(1, 0), "-");
    }
}
