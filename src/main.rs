//! The binary: parses arguments, sets up tracing, and hands over to the library.

use clap::Parser;
use redb_limiter::cli::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    match Cli::parse().command {
        Command::Grind(args) => redb_limiter::cli::grind::run(args).await,
    }
}
