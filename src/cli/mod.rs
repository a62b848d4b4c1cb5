//! The command line: argument types and each subcommand's body. The binary only parses and
//! dispatches; everything a subcommand does lives here, testable like the rest of the library.

pub mod bench;
pub mod check;
pub mod contract;
pub mod grind;
pub mod serve;
pub mod status;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "redb-limiter", version, about = "A durable rate limiter in one redb file")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve the limiter over HTTP (the listen-fire limiter slot).
    Serve(serve::ServeArgs),
    /// Show buckets, places and throttles, from a server or straight from the file.
    Status(status::StatusArgs),
    /// Open (creating when missing) and validate the file; fail with the reason if unusable.
    Check(check::CheckArgs),
    /// Run the contract suite (every rule of the wire) against a limiter.
    Contract(contract::ContractArgs),
    /// Load a server with acquires and report requests/s and latency percentiles.
    Bench(loadgen::BenchArgs),
    /// Grants under load and prints each answered grant (for the crash test).
    #[command(hide = true)]
    Grind(grind::GrindArgs),
}
