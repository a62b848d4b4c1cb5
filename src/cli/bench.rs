//! `redb-limiter bench`: the load generator (see the crate `loadgen`) from the command line.

use loadgen::{BenchArgs, run as run_load};

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let report = run_load(&args).await?;
    println!("{report}");
    println!("{}", report.to_json());
    Ok(())
}
