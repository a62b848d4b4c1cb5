//! redb-limiter: a durable rate limiter in one redb file.
//!
//! A host asks before every call to a rate-limited provider; the limiter answers at once,
//! granted or refused with the instant to ask again, and never forgets a grant across a crash.
//! This crate is the limiter itself, embeddable in a host's process: it compiles no HTTP server,
//! HTTP client, command-line parser or log subscriber. The host side (a waiting client, permit
//! guards, provider signals) is the crate `redb-limiter-client`; the server is the package
//! `redb-limiter-server` (the binary `redb-limiter`).
//!
//! # Example
//!
//! The limiter in-process, with no HTTP: a grant is durable in the file when it is answered.
//!
//! ```
//! use redb_limiter::{AcquireRequest, Decision, Limit, Limiter, Reason};
//!
//! let dir = tempfile::tempdir()?;
//! let limiter = Limiter::open(dir.path().join("limiter.redb"))?;
//! let rpm = AcquireRequest::new("cred:42", vec![Limit::window("team:7/rpm", 1, 60_000)])?;
//! assert!(limiter.acquire_blocking(rpm.clone())?.is_granted());
//! match limiter.acquire_blocking(rpm)? {
//!     Decision::Refused { reason, limit, .. } => assert_eq!((reason, limit.as_str()), (Reason::Rate, "team:7/rpm")),
//!     granted => panic!("a second call in the same minute: {granted:?}"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Layout
//!
//! - [`backend`]: the seam the server talks to: the embedded limiter, or PostgreSQL mode.
//! - [`time`]: `Millis`, the wire form of instants, the clock seam.
//! - [`request`]: the requests, validated against every bound of the wire spec.
//! - [`engine`]: the pure state machine (rolling windows, concurrency places, throttles, and
//!   the line of section 12: tickets and rule Q); time comes in as `now`, changes go out as
//!   effects.
//! - [`store`]: the effects in one redb file, and the engine rebuilt from it.
//! - [`limiter`]: engine + store + clock behind one writer thread with group commit; the
//!   in-process API.
//! - [`metrics`]: the Prometheus registry the limiter updates.
//! - [`policy`]: when lapsed state leaves memory and the file (prune, delete, defer).
//! - [`wire`]: the JSON reply bodies of the wire, shared by the server and the HTTP client.
pub mod backend;
pub mod engine;
pub mod limiter;
pub mod metrics;
pub mod policy;
pub mod request;
pub mod store;
pub mod time;
pub mod wire;

pub use engine::{Decision, Figures, PermitId, Reason, Refusal, TicketId, TicketNote};
pub use limiter::{Acquired, Limiter, LimiterError, LimiterOptions, Peeked, Report, WaitAnswer};
pub use request::{
    AcquireRequest, Adapt, BadRequest, Cost, LeaveRequest, LiftRequest, Limit, ReleaseRequest, SettleRequest, Signal,
    ThrottleRequest, UndoRequest, WaitRequest,
};
pub use time::Millis;

/// The file the limiter serves when none is named: `limiter.redb` in the working folder.
pub const DEFAULT_PATH: &str = "limiter.redb";
