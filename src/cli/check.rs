//! `redb-limiter check --path FILE`: open (creating when missing) and validate the file and its
//! journal (replayed into the file first), print what it holds, and fail with the reason when it
//! cannot be used. `listen-fire connect` runs it.
//! With `--postgres URL`, create (or validate) the schema in that database instead.

use std::path::PathBuf;

use redb_limiter::limiter::Limiter;
use redb_limiter::store::FORMAT_VERSION;

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    #[arg(long, env = "REDB_LIMITER_PATH", default_value = redb_limiter::DEFAULT_PATH)]
    pub path: PathBuf,
    /// Create or validate PostgreSQL mode's schema in this database instead of the file.
    #[arg(long, env = "REDB_LIMITER_POSTGRES", hide_env_values = true)]
    pub postgres: Option<String>,
    #[arg(long, env = "REDB_LIMITER_PG_SCHEMA", default_value = redb_limiter_postgres::DEFAULT_SCHEMA)]
    pub pg_schema: String,
}

/// PostgreSQL mode: connect, refuse fsync=off, create or validate the schema.
pub async fn run_postgres(url: &str, schema: &str) -> anyhow::Result<()> {
    let mut options = redb_limiter_postgres::PgOptions::new(url);
    options.schema = schema.to_owned();
    options.pool_size = 1;
    let limiter = redb_limiter_postgres::PgLimiter::connect(options).await?;
    let snapshot = limiter.state("", 1).await?;
    println!(
        "ok: PostgreSQL schema {} (format version {}): {} buckets, {} permits, {} throttles",
        limiter.schema(),
        redb_limiter_postgres::SCHEMA_VERSION,
        snapshot.totals.buckets,
        snapshot.totals.permits,
        snapshot.totals.throttles,
    );
    Ok(())
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let limiter = Limiter::open(&args.path)?;
    let snapshot = limiter.state_blocking("")?;
    let held: usize = snapshot.view.buckets.iter().map(|b| b.places_held).sum();
    println!(
        "ok: {} (format version {FORMAT_VERSION}): {} live buckets, {} permits holding {held} places, {} throttles",
        limiter.path().display(),
        snapshot.totals.buckets,
        snapshot.totals.permits,
        snapshot.totals.throttles,
    );
    let journal = redb_limiter::store::journal::journal_path(limiter.path());
    limiter.close();
    if journal.exists() {
        println!("ok: {} (its journal: every commit in it replayed into the file)", journal.display());
    }
    Ok(())
}
