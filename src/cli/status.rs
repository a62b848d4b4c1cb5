//! `redb-limiter status`: a table of buckets (window use against the last `calls` seen, oldest
//! grant, places held), throttles with time left, and totals; from a running server's `/state`
//! (page by page) or straight from the file when no server holds it.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use redb_limiter::limiter::Limiter;
use redb_limiter::store::StoreError;
use redb_limiter::wire::StateReply;

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
    #[arg(long)]
    pub json: bool,
    /// How many buckets, permits and throttles each to ask a server for at once.
    #[arg(long, hide = true, default_value_t = 1000)]
    pub page_size: usize,
}

/// The whole state from a server's `/state`, page by page (each page at most `page_size` of
/// each kind, from `after`). A kind whose page came back full may have more: the next page
/// starts after the lowest of those kinds' last keys; what comes back twice is kept once.
async fn from_server(url: &str, token: Option<&str>, prefix: &str, page_size: usize) -> anyhow::Result<StateReply> {
    use std::collections::BTreeMap;
    let client = reqwest::Client::new();
    let (mut buckets, mut permits, mut throttles) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let mut after = String::new();
    loop {
        let limit = page_size.to_string();
        let query = [("prefix", prefix), ("after", after.as_str()), ("limit", limit.as_str())];
        let mut req = client.get(format!("{}/state", url.trim_end_matches('/'))).query(&query);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.with_context(|| format!("asking {url}"))?;
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

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let state = match (&args.url, &args.path) {
        (Some(url), _) => from_server(url, args.token.as_deref(), &args.prefix, args.page_size.max(1)).await?,
        (None, path) => {
            let path = path.clone().unwrap_or_else(|| PathBuf::from("limiter.redb"));
            let prefix = args.prefix.clone();
            tokio::task::spawn_blocking(move || from_file(path, &prefix)).await??
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&state)?);
    } else {
        print!("{}", render(&state));
    }
    Ok(())
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
