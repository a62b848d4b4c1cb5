//! `redb-limiter check --path FILE`: open (creating when missing) and validate the file, print
//! what it holds, and fail with the reason when it cannot be used. `listen-fire connect` runs it.

use std::path::PathBuf;

use redb_limiter::limiter::Limiter;
use redb_limiter::store::FORMAT_VERSION;

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    #[arg(long, env = "REDB_LIMITER_PATH", default_value = redb_limiter::DEFAULT_PATH)]
    pub path: PathBuf,
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
    limiter.close();
    Ok(())
}
