//! `redb-limiter serve`: open the file (or, with `--postgres`, connect to the database), listen,
//! print the ready line, serve until SIGTERM or SIGINT, then drain, commit and close.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::server::{ServerConfig, serve};
use redb_limiter::limiter::{Limiter, LimiterOptions};
use redb_limiter_postgres::{PgLimiter, PgOptions};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The redb file (created when missing).
    #[arg(long, env = "REDB_LIMITER_PATH", default_value = redb_limiter::DEFAULT_PATH)]
    pub path: PathBuf,
    /// Address to listen on; port 0 takes a free port.
    #[arg(long, env = "REDB_LIMITER_LISTEN", default_value = "127.0.0.1:7411")]
    pub listen: String,
    /// A file holding the bearer token every path but `GET /health` and the page `GET /` requires
    /// (trimmed).
    #[arg(long, env = "REDB_LIMITER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// The bearer token itself (prefer --token-file; the environment keeps it out of `ps`).
    #[arg(long, env = "REDB_LIMITER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A call refused for concurrency is told to retry at most this many ms later.
    #[arg(long, env = "REDB_LIMITER_RECHECK_MS", default_value_t = 250, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub recheck_ms: u64,
    /// The line's horizon (wire section 12.9): a request joins a line only when it could be
    /// granted within this many ms (or its own `maxWaitMs`, when shorter), and a ticket lapses
    /// this long after it was filed at the latest.
    #[arg(long, env = "REDB_LIMITER_LINE_HORIZON_MS", default_value_t = redb_limiter::engine::DEFAULT_LINE_HORIZON_MS, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub line_horizon_ms: u64,
    /// At most this many connections open at once; the rest wait to be accepted.
    #[arg(long, env = "REDB_LIMITER_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Serve from this PostgreSQL database instead of the file (PostgreSQL mode: servers on
    /// many machines share one set of limits). Never printed or logged: it may hold a password.
    #[arg(long, env = "REDB_LIMITER_POSTGRES", hide_env_values = true)]
    pub postgres: Option<String>,
    /// The schema holding the limiter's tables in PostgreSQL mode.
    #[arg(long, env = "REDB_LIMITER_PG_SCHEMA", default_value = redb_limiter_postgres::DEFAULT_SCHEMA)]
    pub pg_schema: String,
    /// Connections to PostgreSQL (PostgreSQL mode).
    #[arg(long, env = "REDB_LIMITER_PG_POOL", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub pg_pool: u64,
    /// Batch statements of one-window acquires in flight at once (PostgreSQL mode): while
    /// requests are concurrent, those waiting at once are decided in one statement; 0 sends
    /// each alone.
    #[arg(long, env = "REDB_LIMITER_PG_BATCHERS", default_value_t = redb_limiter_postgres::batch::DEFAULT_BATCHERS as u64, value_parser = clap::value_parser!(u64).range(0..=64))]
    pub pg_batchers: u64,
    /// On SIGTERM, connections still open this long after it are closed unanswered.
    #[arg(long, hide = true, default_value_t = 10_000)]
    pub drain_deadline_ms: u64,
}

impl ServeArgs {
    /// The token to require, if any. A token file that is empty or only whitespace, or an empty
    /// token, is an error: a server meant to be closed must not run open.
    fn token(&self) -> anyhow::Result<Option<String>> {
        if let Some(file) = &self.token_file {
            let token =
                std::fs::read_to_string(file).with_context(|| format!("reading the token file {}", file.display()))?;
            let token = token.trim();
            anyhow::ensure!(
                !token.is_empty(),
                "the token file {} is empty or only whitespace; refusing to serve without the token it was meant to hold",
                file.display()
            );
            return Ok(Some(token.to_owned()));
        }
        // Clap may pass an empty environment value on or drop it; either way it is refused.
        let empty_env = std::env::var_os("REDB_LIMITER_TOKEN").is_some_and(|v| v.to_string_lossy().trim().is_empty());
        match &self.token {
            Some(token) if !token.trim().is_empty() => Ok(Some(token.trim().to_owned())),
            Some(_) => {
                anyhow::bail!("the token (REDB_LIMITER_TOKEN or --token) is empty; refusing to serve without one")
            }
            None if empty_env => anyhow::bail!("REDB_LIMITER_TOKEN is empty; refusing to serve without a token"),
            None => Ok(None),
        }
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed at the call, not at the first
/// poll: a signal that arrives just after the ready line still drains instead of killing.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("installing SIGTERM");
        let mut interrupt = signal(SignalKind::interrupt()).expect("installing SIGINT");
        async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = interrupt.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let token = args.token()?;
    if token.is_none() {
        tracing::warn!("no token configured: every path is open to anyone who can reach the listen address");
    }
    let config = ServerConfig {
        token,
        max_connections: args.max_connections as usize,
        drain_deadline: std::time::Duration::from_millis(args.drain_deadline_ms),
        ..ServerConfig::default()
    };
    if let Some(url) = &args.postgres {
        return run_postgres(&args, url, config).await;
    }
    // The runtime serves nothing else, so a request may commit in its own thread when the file
    // is idle: one at a time, that saves two thread hand-offs per request.
    let options = LimiterOptions {
        recheck_ms: args.recheck_ms,
        line_horizon_ms: args.line_horizon_ms,
        caller_commits: true,
        ..LimiterOptions::default()
    };
    let path = args.path.clone();
    let limiter = tokio::task::spawn_blocking(move || Limiter::open_with(&path, options)).await??;
    let limiter = Arc::new(limiter);
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let shutdown = shutdown_signal();
    let ready = ready_line("path", &format!("http://{addr}"), &limiter.path().display().to_string());
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{ready}")?;
        out.flush()?;
    }
    tracing::info!(%addr, path = %limiter.path().display(), "serving");
    serve(listener, limiter.clone(), config, shutdown).await?;
    tracing::info!("drained; closing the file");
    match Arc::into_inner(limiter) {
        Some(limiter) => tokio::task::spawn_blocking(move || limiter.close()).await?,
        None => tracing::warn!("a request still holds the limiter; the file closes at exit"),
    }
    Ok(())
}

/// The ready line, its keys in the spec's order (`ready`, `url`, then `path` or `backend`):
/// `serde_json`'s maps sort their keys.
fn ready_line(last_key: &str, url: &str, last: &str) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    format!("{{\"ready\":true,\"url\":{},{}:{}}}", quote(url), quote(last_key), quote(last))
}

/// PostgreSQL mode: the same wire, decided in the database; a sweeper deletes what lapsed.
async fn run_postgres(args: &ServeArgs, url: &str, config: ServerConfig) -> anyhow::Result<()> {
    let mut options = PgOptions::new(url);
    options.schema = args.pg_schema.clone();
    options.pool_size = args.pg_pool as usize;
    options.batchers = args.pg_batchers as usize;
    options.recheck_ms = args.recheck_ms;
    options.line_horizon_ms = args.line_horizon_ms;
    let limiter = Arc::new(PgLimiter::connect(options).await?);
    limiter.spawn_sweeper(std::time::Duration::from_secs(1));
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let shutdown = shutdown_signal();
    // Never the URL: it may carry a password.
    let ready = ready_line("backend", &format!("http://{addr}"), "postgres");
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{ready}")?;
        out.flush()?;
    }
    tracing::info!(%addr, schema = %limiter.schema(), "serving from PostgreSQL");
    serve(listener, limiter, config, shutdown).await?;
    tracing::info!("drained");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ready_line_keeps_the_specs_key_order() {
        let line = super::ready_line("path", "http://127.0.0.1:7411", "/srv/a \"b\".redb");
        assert_eq!(line, r#"{"ready":true,"url":"http://127.0.0.1:7411","path":"/srv/a \"b\".redb"}"#);
        let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(parsed["path"], "/srv/a \"b\".redb");
        assert_eq!(
            super::ready_line("backend", "http://[::1]:1", "postgres"),
            r#"{"ready":true,"url":"http://[::1]:1","backend":"postgres"}"#
        );
    }
}
