//! The redb-limiter server: the HTTP wire over an embedded [`redb_limiter::Limiter`], and the
//! command line of the binary `redb-limiter`.
//!
//! # Layout
//!
//! - [`server`]: the HTTP wire: routing, auth, errors, health, state and metrics
//!   (`serve(listener, limiter, config, shutdown)`, as tests and the binary call it), and the
//!   live page (`GET /`, the file `src/page.html` embedded).
//! - `connections`: the accept loop under the wire: connection limits, request and idle
//!   timeouts, hyper's own errors given the JSON body, and the drain deadline.
//! - [`recent`]: the bounded feed of latest refusals and decisions per second (`GET /recent`).
//! - [`cli`]: each subcommand's body (`serve`, `status`, `check`, `contract`, `bench`, and the
//!   hidden `grind` the crash test kills); the binary only parses and dispatches.
pub mod cli;
mod connections;
pub mod recent;
pub mod server;
