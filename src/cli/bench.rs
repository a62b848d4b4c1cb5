//! `redb-limiter bench`: the load generator (see the crate `loadgen`) from the command line.

use loadgen::{BenchArgs, Mix, fair, handoff, run as run_load};

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let (Mix::Handoff, Some(calls)) = (args.mix, args.batch) {
        let report = handoff::run_batch(&args, calls).await?;
        println!("{report}");
        println!("{}", report.to_json());
        return Ok(());
    }
    if args.mix == Mix::Handoff {
        let report = handoff::run(&args).await?;
        println!("{report}");
        println!("{}", report.to_json());
        return Ok(());
    }
    if args.mix == Mix::Fair {
        let report = fair::run(&args).await?;
        println!("{report}");
        println!("{}", report.to_json());
        return Ok(());
    }
    let report = run_load(&args).await?;
    println!("{report}");
    println!("{}", report.to_json());
    Ok(())
}
