//! `redb-limiter status`: a table of buckets (window use against the last `calls` seen, oldest
//! grant, places held), throttles with time left, and totals; from a running server's `/state`
//! or straight from the file when no server holds it.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use redb_limiter::limiter::Limiter;
use redb_limiter::store::StoreError;
use redb_limiter::wire::StateReply;
use redb_limiter_client::HttpLimiter;

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
}

async fn from_server(url: &str, token: Option<&str>, prefix: &str) -> anyhow::Result<StateReply> {
    let server = HttpLimiter::new(url, token.map(str::to_owned));
    let resp = server
        .request(reqwest::Method::GET, "/state")
        .query(&[("prefix", prefix)])
        .send()
        .await
        .with_context(|| format!("asking {url}"))?;
    let status = resp.status();
    let body = resp.text().await?;
    anyhow::ensure!(status.is_success(), "{url}/state answered {status}: {body}");
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

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let state = match (&args.url, &args.path) {
        (Some(url), _) => from_server(url, args.token.as_deref(), &args.prefix).await?,
        (None, path) => {
            let path = path.clone().unwrap_or_else(|| PathBuf::from(redb_limiter::DEFAULT_PATH));
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
