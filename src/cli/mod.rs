//! The command line: argument types and each subcommand's body. The binary only parses and
//! dispatches; everything a subcommand does lives here, testable like the rest of the library.

pub mod grind;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "redb-limiter", version, about = "A durable rate limiter in one redb file")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Grants under load and prints each answered grant (for the crash test).
    #[command(hide = true)]
    Grind(grind::GrindArgs),
}
