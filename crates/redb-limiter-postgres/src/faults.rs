//! What database errors say about the database, for `/health` and the log.
//!
//! A database error is one of two kinds:
//!
//! - the database is **out**: it cannot be reached, the connection broke, it ran out of a
//!   resource, it is shutting down or failed internally. `/health` reports it (until a later
//!   call succeeds) and every request meanwhile is answered `unavailable`;
//! - a statement failed **for its request's sake** (a data error, a constraint, a statement
//!   or lock timeout): the database answered, so `/health` reports it reachable. The request is
//!   answered `unavailable` (its transaction rolled back: nothing was granted); a batch it was
//!   part of decides its other requests again (see [`crate::batch`]).
//!
//! Every database error is logged: the first at once, then at most one line a second, which
//! says how many more there were meanwhile (wire spec, sections 6 and 10).

use std::sync::Arc;
use std::sync::Mutex;

use redb_limiter::time::Clock;
use redb_limiter::{LimiterError, Millis};

/// How long `/health` answers from the latest outcome, and the least time between two log
/// lines of database errors.
pub const LOG_EVERY_MS: u64 = 1000;

/// What the latest database call said, and when.
pub(crate) struct Outcome {
    pub at: Millis,
    /// `None`: the database answered; otherwise why it is out (as `Unavailable` carries it).
    pub failure: Option<String>,
}

#[derive(Default)]
struct LogState {
    /// When the latest line was logged.
    last: Option<Millis>,
    /// Errors not logged since.
    quiet: u64,
}

/// The latest outcome of a database call and the error log's pace, shared by the limiter and
/// its batcher.
pub(crate) struct Faults {
    clock: Option<Arc<dyn Clock>>,
    started: std::time::Instant,
    last: Mutex<Option<Outcome>>,
    log: Mutex<LogState>,
}

/// Whether a database error means the database is out (see the module docs).
#[must_use]
pub fn database_out(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        // No answer from the database: the connection closed, broke or timed out.
        return true;
    };
    let code = db.code().code();
    // 08 connection, 53 resources, 57 operator intervention (but 57014, a statement timeout
    // or cancel, is the request's own), 58 system, XX internal.
    code != "57014" && ["08", "53", "57", "58", "XX"].iter().any(|class| code.starts_with(class))
}

impl Faults {
    pub(crate) fn new(clock: Option<Arc<dyn Clock>>) -> Faults {
        Faults {
            clock,
            started: std::time::Instant::now(),
            last: Mutex::new(None),
            log: Mutex::new(LogState::default()),
        }
    }

    /// The clock outcomes and the log's pace are measured on: the injected clock, or monotonic
    /// time since start (never the wall clock, which may step).
    pub(crate) fn now(&self) -> Millis {
        match &self.clock {
            Some(clock) => clock.now(),
            None => Millis(u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)),
        }
    }

    fn set(&self, failure: Option<String>) {
        let outcome = Outcome { at: self.now(), failure };
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(outcome);
    }

    /// The database answered.
    pub(crate) fn answered(&self) {
        self.set(None);
    }

    /// The latest outcome, while younger than `fresh_ms`: `Ok` when the database answered.
    pub(crate) fn fresh(&self, fresh_ms: u64) -> Option<Result<(), LimiterError>> {
        let last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = last.as_ref()?;
        (self.now().since(last.at) < fresh_ms).then(|| match &last.failure {
            None => Ok(()),
            Some(why) => Err(LimiterError::Unavailable(why.clone())),
        })
    }

    /// A database error: recorded (out, or answered), logged at the log's pace, and mapped to
    /// the wire's `unavailable`.
    pub(crate) fn database(&self, e: &tokio_postgres::Error) -> LimiterError {
        let why = format!("PostgreSQL: {e}");
        let out = database_out(e);
        self.set(out.then(|| why.clone()));
        self.log(&why, out);
        LimiterError::Unavailable(why)
    }

    /// The pool could not hand out a session: the database is out (it cannot be reached), or
    /// every session stayed busy past the wait (it answers, slowly).
    pub(crate) fn pool(&self, e: &deadpool_postgres::PoolError) -> LimiterError {
        let why = format!("PostgreSQL: {e}");
        let out = !matches!(e, deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait));
        if out {
            self.set(Some(why.clone()));
        }
        self.log(&why, out);
        LimiterError::Unavailable(why)
    }

    /// Whether an error now is logged, and how many went unlogged before it: the first at
    /// once, then at most one every [`LOG_EVERY_MS`].
    pub(crate) fn pace(&self) -> Option<u64> {
        let now = self.now();
        let mut log = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match log.last {
            Some(last) if now.since(last) < LOG_EVERY_MS => {
                log.quiet += 1;
                None
            }
            _ => {
                log.last = Some(now);
                Some(std::mem::take(&mut log.quiet))
            }
        }
    }

    fn log(&self, why: &str, out: bool) {
        let Some(quiet) = self.pace() else { return };
        if out {
            tracing::error!(error = why, unlogged_before = quiet, "the database is out: requests are answered 503");
        } else {
            tracing::warn!(error = why, unlogged_before = quiet, "a database statement failed for its request");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb_limiter::time::FakeClock;

    #[test]
    fn errors_are_logged_once_then_at_most_once_a_second() {
        let clock = Arc::new(FakeClock::new(Millis(1_000_000)));
        let faults = Faults::new(Some(clock.clone()));
        assert_eq!(faults.pace(), Some(0), "the first at once");
        assert_eq!(faults.pace(), None);
        clock.advance(999);
        assert_eq!(faults.pace(), None);
        clock.advance(1);
        assert_eq!(faults.pace(), Some(2), "a second later, naming the two unlogged");
        clock.advance(5000);
        assert_eq!(faults.pace(), Some(0));
    }

    #[test]
    fn health_follows_what_the_database_said() {
        let clock = Arc::new(FakeClock::new(Millis(1_000_000)));
        let faults = Faults::new(Some(clock.clone()));
        assert!(faults.fresh(1000).is_none());
        faults.set(Some("PostgreSQL: down".into()));
        assert!(matches!(faults.fresh(1000), Some(Err(LimiterError::Unavailable(_)))));
        faults.answered();
        assert!(matches!(faults.fresh(1000), Some(Ok(()))));
        clock.advance(1000);
        assert!(faults.fresh(1000).is_none(), "stale");
    }
}
