//! The grant as a guard: it holds its concurrency places until it is released explicitly or
//! dropped (then it is released in the background), including across a streamed response
//! wrapped in [`PermitStream`], which lets go only when the stream is drained or dropped.
//! A permit asked for with `permit: true` can be settled to its real costs after the call
//! ([`Permit::settle`], any number of times) and still releases when dropped.
//! A grant of a request that adapts a ceiling (section 14) reports what its call met when it is
//! released: the outcome [`Permit::observe`] read from the provider's answer, said outright
//! ([`Permit::release_with_outcome`]), or `clean` for an explicit release; a dropped one reports
//! only a `limited` it saw.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::vendor::vendor_outcome;
use crate::{ClientError, LimiterApi, LocalWake};
use redb_limiter::request::{Cost, Signal};
use redb_limiter::time::Millis;

/// A granted call. Dropping it releases its places.
pub struct Permit<L: LimiterApi> {
    limiter: Arc<L>,
    at: Millis,
    permit: Option<String>,
    /// Wakes this process's waiters on the permit's buckets once it lets them go.
    wake: Option<LocalWake>,
    /// A limit of the grant adapts a ceiling (section 14): its release reports an outcome.
    adapted: bool,
    /// What the call met, as [`Permit::observe`] read it.
    outcome: Option<Signal>,
}

impl<L: LimiterApi> std::fmt::Debug for Permit<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("at", &self.at).field("permit", &self.permit).finish()
    }
}

impl<L: LimiterApi> Permit<L> {
    pub(crate) fn new(limiter: Arc<L>, at: Millis, permit: Option<String>, wake: Option<LocalWake>) -> Self {
        Permit { limiter, at, permit, wake, adapted: false, outcome: None }
    }

    /// Marks the grant as one of a request that adapts a ceiling (section 14).
    pub(crate) fn adapting(mut self, adapted: bool) -> Self {
        self.adapted = adapted;
        self
    }

    /// Whether a limit of the grant adapts a ceiling (section 14).
    #[must_use]
    pub fn adapted(&self) -> bool {
        self.adapted
    }

    /// The outcome [`Permit::observe`] has read so far.
    #[must_use]
    pub fn outcome(&self) -> Option<Signal> {
        self.outcome
    }

    /// Reads the provider's answer to this call for the adaptive ceilings (section 14): a 429,
    /// or a success whose remaining requests are at or below `floor`, makes the outcome
    /// `limited` (which stays); any other success `clean`; another failure says nothing. The
    /// outcome goes with the release (or settle). Returns what this answer said.
    pub fn observe(&mut self, status: u16, headers: &http::HeaderMap, floor: Option<u64>) -> Option<Signal> {
        let seen = vendor_outcome(status, headers, floor);
        if seen == Some(Signal::Limited) || self.outcome.is_none() {
            self.outcome = seen.or(self.outcome);
        }
        seen
    }

    /// The outcome an explicit release reports: the observed one, else `clean` for an adapted
    /// grant; `None` for a grant that adapts nothing and saw nothing.
    fn release_outcome(&self) -> Option<Signal> {
        self.outcome.or(self.adapted.then_some(Signal::Clean))
    }

    /// Releases the places now, telling the grant's adaptive ceilings what its call met
    /// (section 14); `true` when the permit was live.
    pub async fn release_with_outcome(mut self, outcome: Signal) -> Result<bool, ClientError> {
        match self.permit.take() {
            Some(permit) => {
                let released = self.limiter.release_outcome(permit, Vec::new(), outcome).await;
                self.woke(released)
            }
            None => Ok(false),
        }
    }

    /// Settles the grant to `costs` and tells its adaptive ceilings what its call met (section
    /// 14); the permit keeps its places. `Ok(false)` when it is no longer live.
    pub async fn settle_with_outcome(&self, costs: Vec<Cost>, outcome: Signal) -> Result<bool, ClientError> {
        match &self.permit {
            Some(permit) => {
                let settled = self.limiter.settle_outcome(permit.clone(), costs, outcome).await;
                self.woke(settled)
            }
            None => Ok(false),
        }
    }

    /// Wakes the waiters of this process on the permit's buckets (after a release or settle).
    fn woke<T>(&self, result: Result<T, ClientError>) -> Result<T, ClientError> {
        if result.is_ok()
            && let Some(wake) = &self.wake
        {
            wake.wake();
        }
        result
    }

    /// When the call was granted.
    #[must_use]
    pub fn at(&self) -> Millis {
        self.at
    }

    /// The permit id, when the grant holds concurrency places.
    #[must_use]
    pub fn id(&self) -> Option<&str> {
        self.permit.as_deref()
    }

    /// Releases the places now; `true` when the permit was live (`false` once it lapsed). An
    /// adapted grant reports the observed outcome, else `clean` (section 14).
    pub async fn release(mut self) -> Result<bool, ClientError> {
        let outcome = self.release_outcome();
        match self.permit.take() {
            Some(permit) => {
                let released = match outcome {
                    Some(outcome) => self.limiter.release_outcome(permit, Vec::new(), outcome).await,
                    None => self.limiter.release(permit).await,
                };
                self.woke(released)
            }
            None => Ok(false),
        }
    }

    /// Sets the grant's real cost in each named window bucket (the latest settle stands); the
    /// permit keeps its places and still releases when dropped. `Ok(false)` when the permit is
    /// no longer live (or the grant got none: ask with `permit: true`).
    pub async fn settle(&self, costs: Vec<Cost>) -> Result<bool, ClientError> {
        match &self.permit {
            Some(permit) => {
                // An outcome already observed goes with it (section 14).
                let settled = match self.outcome {
                    Some(outcome) => self.limiter.settle_outcome(permit.clone(), costs, outcome).await,
                    None => self.limiter.settle(permit.clone(), costs).await,
                };
                self.woke(settled)
            }
            None => Ok(false),
        }
    }

    /// Settles `costs` and releases, in one durable step; `true` when the permit was live. An
    /// adapted grant reports the observed outcome, else `clean` (section 14).
    pub async fn release_with_costs(mut self, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let outcome = self.release_outcome();
        match self.permit.take() {
            Some(permit) => {
                let released = match outcome {
                    Some(outcome) => self.limiter.release_outcome(permit, costs, outcome).await,
                    None => self.limiter.release_with_costs(permit, costs).await,
                };
                self.woke(released)
            }
            None => Ok(false),
        }
    }

    /// Keeps this permit until `stream` is drained or dropped.
    pub fn hold_while<S>(self, stream: S) -> PermitStream<S, L> {
        PermitStream { inner: stream, permit: Some(self) }
    }
}

impl<L: LimiterApi> Drop for Permit<L> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else { return };
        let limiter = self.limiter.clone();
        let wake = self.wake.take();
        // Dropped, perhaps on an error path: only a `limited` outcome it saw is reported.
        let limited = self.outcome.filter(|o| *o == Signal::Limited);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let released = match limited {
                        Some(outcome) => limiter.release_outcome(permit, Vec::new(), outcome).await,
                        None => limiter.release(permit).await,
                    };
                    match released {
                        Ok(_) => wake.iter().for_each(LocalWake::wake),
                        Err(e) => {
                            tracing::warn!(error = %e, "releasing a dropped permit failed; its places lapse at holdMs");
                        }
                    }
                });
            }
            Err(_) => tracing::warn!("a permit dropped outside a runtime is not released; its places lapse at holdMs"),
        }
    }
}

/// A stream that holds a [`Permit`] until it ends.
pub struct PermitStream<S, L: LimiterApi> {
    inner: S,
    permit: Option<Permit<L>>,
}

impl<S: futures_core::Stream + Unpin, L: LimiterApi> futures_core::Stream for PermitStream<S, L> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let next = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(None) = next {
            self.permit.take(); // drained: let the places go
        }
        next
    }
}

impl<S, L: LimiterApi> Unpin for PermitStream<S, L> where S: Unpin {}
