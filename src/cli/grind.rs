//! `redb-limiter grind` (hidden): grants under load from many tasks and prints each grant only
//! after the limiter answered it, for the crash test that kills this process at random moments.
//!
//! Half the tasks ask in a tightly bounded window (`grind/bounded`: at most 300 calls an hour),
//! so that across every round of kills the test can check no window ever held more than its
//! calls; the other half ask in unbounded buckets, so every round has grants to lose.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use redb_limiter::engine::Decision;
use redb_limiter::limiter::{Limiter, LimiterOptions};
use redb_limiter::request::{AcquireRequest, Limit};

pub const BOUNDED_KEY: &str = "grind/bounded";
pub const BOUNDED_CALLS: u64 = 300;
pub const WINDOW_MS: u64 = 3_600_000;

#[derive(clap::Args, Debug)]
pub struct GrindArgs {
    #[arg(long)]
    pub path: PathBuf,
    #[arg(long, default_value_t = 32)]
    pub tasks: usize,
    /// Broken on purpose: answer before the commit (proves the crash test can fail).
    #[arg(long)]
    pub ack_before_commit: bool,
}

pub async fn run(args: GrindArgs) -> anyhow::Result<()> {
    // As the server runs it.
    let options =
        LimiterOptions { ack_before_commit: args.ack_before_commit, caller_commits: true, ..LimiterOptions::default() };
    let limiter = Arc::new(Limiter::open_with(&args.path, options)?);
    println!("ready");
    let mut tasks = Vec::new();
    for task in 0..args.tasks {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let bucket = if task % 2 == 0 { BOUNDED_KEY.to_owned() } else { format!("grind/free:{}", task % 8) };
            let calls = if task % 2 == 0 { BOUNDED_CALLS } else { 1_000_000_000 };
            let req =
                AcquireRequest::new(format!("grind/caller:{task}"), vec![Limit::window(&bucket, calls, WINDOW_MS)])
                    .expect("a valid request");
            loop {
                match limiter.acquire(req.clone()).await {
                    Ok(Decision::Granted { at, .. }) => {
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "G {bucket} {}", at.0)?;
                        out.flush()?;
                    }
                    Ok(Decision::Refused { .. }) => tokio::task::yield_now().await,
                    Err(e) => anyhow::bail!("{e}"),
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}
