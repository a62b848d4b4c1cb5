//! The binary: parses arguments, sets up tracing, and hands over to the library.

use clap::Parser;
use redb_limiter_server::cli::{self, Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    match Cli::parse().command {
        Command::Serve(args) => cli::serve::run(args).await,
        Command::Status(args) => cli::status::run(args).await,
        Command::Check(args) => match args.postgres.clone() {
            Some(url) => cli::check::run_postgres(&url, &args.pg_schema).await,
            None => tokio::task::spawn_blocking(move || cli::check::run(args)).await?,
        },
        Command::Contract(args) => cli::contract::run(args).await,
        Command::Bench(args) => cli::bench::run(args).await,
        Command::Grind(args) => cli::grind::run(args).await,
    }
}

/// The server allocates a little per request on many threads; glibc's malloc/free/memcpy were
/// about a sixth of its CPU under load, and mimalloc answers ~6% more grants/s at 64 connections
/// (see `BENCHMARKS.md`). The library leaves the allocator to its host.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
