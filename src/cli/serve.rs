//! `redb-limiter serve`: open the file, listen, print the ready line, serve until SIGTERM or
//! SIGINT, then drain, commit and close.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::server::{ServerConfig, serve};
use redb_limiter::limiter::{Limiter, LimiterOptions};

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
}

impl ServeArgs {
    fn token(&self) -> anyhow::Result<Option<String>> {
        let token = match &self.token_file {
            Some(file) => Some(
                std::fs::read_to_string(file).with_context(|| format!("reading the token file {}", file.display()))?,
            ),
            None => self.token.clone(),
        };
        Ok(token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()))
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("installing SIGTERM");
        tokio::select! {
            _ = interrupt => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let token = args.token()?;
    // The runtime serves nothing else, so a request may commit in its own thread when the file
    // is idle: one at a time, that saves two thread hand-offs per request.
    let options = LimiterOptions { recheck_ms: args.recheck_ms, caller_commits: true, ..LimiterOptions::default() };
    let path = args.path.clone();
    let limiter = tokio::task::spawn_blocking(move || Limiter::open_with(&path, options)).await??;
    let limiter = Arc::new(limiter);
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let ready = serde_json::json!({
        "ready": true,
        "url": format!("http://{addr}"),
        "path": limiter.path().display().to_string(),
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{ready}")?;
        out.flush()?;
    }
    tracing::info!(%addr, path = %limiter.path().display(), "serving");
    serve(listener, limiter.clone(), ServerConfig { token }, shutdown_signal()).await?;
    tracing::info!("drained; closing the file");
    match Arc::into_inner(limiter) {
        Some(limiter) => tokio::task::spawn_blocking(move || limiter.close()).await?,
        None => tracing::warn!("a request still holds the limiter; the file closes at exit"),
    }
    Ok(())
}
