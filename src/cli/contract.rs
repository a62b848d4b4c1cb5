//! `redb-limiter contract --url URL`: runs the contract suite against any limiter of the wire,
//! one line per case, then `N passed, N failed`; exits non-zero on any failure.

use redb_limiter_client::contract;

#[derive(clap::Args, Debug)]
pub struct ContractArgs {
    #[arg(long, env = "REDB_LIMITER_URL")]
    pub url: String,
    #[arg(long, env = "REDB_LIMITER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

pub async fn run(args: ContractArgs) -> anyhow::Result<()> {
    let results = contract::run(&args.url, args.token, true).await;
    println!("{}", contract::summary(&results));
    anyhow::ensure!(results.iter().all(|r| r.outcome.is_ok()), "the limiter at {} breaks the contract", args.url);
    Ok(())
}
