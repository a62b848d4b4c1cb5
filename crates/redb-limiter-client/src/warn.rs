//! Warnings of a crowded line: observers that a [`Client`](crate::Client) calls when the callers
//! waiting for one request shape in this process reach a fraction of an acquire's
//! `max_waiters`, with the figures of that line. An observer that errs turns that acquire away
//! ([`ClientError::TurnedAway`](crate::ClientError::TurnedAway)): it gives back its place in
//! the line before it returns, and it has asked the limiter nothing, so it holds no place and no
//! ticket there. This module owns the observers and that decision; the line is the client's.

use std::sync::Arc;

use crate::Refusal;

/// The line of one request shape in this process, as a warning observer sees it when an acquire
/// joins it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineUsage {
    /// The caller key of the shape.
    pub key: String,
    /// The buckets the shape names, in the request's order.
    pub limits: Vec<String>,
    /// The callers of this shape waiting in this process, the one joining included.
    pub waiting: usize,
    /// The joining acquire's `max_waiters`: more are refused with `QueueFull`.
    pub max_waiters: usize,
    /// The refusal the line's head was last told while it waits (what the line waits for);
    /// none before its first refusal, or once it is granted.
    pub last: Option<Refusal>,
}

impl LineUsage {
    /// `waiting` as a fraction of `max_waiters` (1.0: the line is full).
    #[must_use]
    pub fn fraction(&self) -> f64 {
        self.waiting as f64 / self.max_waiters as f64
    }
}

/// Why an observer turned an acquire away.
pub type WarnError = Box<dyn std::error::Error + Send + Sync>;

/// A `warn_fraction` outside (0, 1].
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("warn_fraction must be a number above 0 and at most 1, got {0}")]
pub struct InvalidWarnFraction(pub f64);

type Observer = Arc<dyn Fn(&LineUsage) -> Result<(), WarnError> + Send + Sync>;

/// One observer and the fraction of `max_waiters` from which it is called.
#[derive(Clone)]
pub(crate) struct Warning {
    fraction: f64,
    observer: Observer,
}

impl Warning {
    pub(crate) fn new(
        fraction: f64,
        observer: impl Fn(&LineUsage) -> Result<(), WarnError> + Send + Sync + 'static,
    ) -> Result<Self, InvalidWarnFraction> {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(InvalidWarnFraction(fraction));
        }
        Ok(Warning { fraction, observer: Arc::new(observer) })
    }
}

/// Calls, in the order they were added, each observer whose fraction `usage` has reached; the
/// first that errs ends it with its error's text.
pub(crate) fn warn(warnings: &[Warning], usage: &LineUsage) -> Result<(), String> {
    for w in warnings.iter().filter(|w| usage.waiting as f64 >= w.fraction * usage.max_waiters as f64) {
        (w.observer)(usage).map_err(|e| e.to_string())?;
    }
    Ok(())
}
