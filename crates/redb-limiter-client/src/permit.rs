//! The grant as a guard: it holds its concurrency places until it is released explicitly or
//! dropped (then it is released in the background), including across a streamed response
//! wrapped in [`PermitStream`], which lets go only when the stream is drained or dropped.
//! A permit asked for with `permit: true` can be settled to its real costs after the call
//! ([`Permit::settle`], any number of times) and still releases when dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::{ClientError, LimiterApi, LocalWake};
use redb_limiter::request::Cost;
use redb_limiter::time::Millis;

/// A granted call. Dropping it releases its places.
pub struct Permit<L: LimiterApi> {
    limiter: Arc<L>,
    at: Millis,
    permit: Option<String>,
    /// Wakes this process's waiters on the permit's buckets once it lets them go.
    wake: Option<LocalWake>,
}

impl<L: LimiterApi> std::fmt::Debug for Permit<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("at", &self.at).field("permit", &self.permit).finish()
    }
}

impl<L: LimiterApi> Permit<L> {
    pub(crate) fn new(limiter: Arc<L>, at: Millis, permit: Option<String>, wake: Option<LocalWake>) -> Self {
        Permit { limiter, at, permit, wake }
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

    /// Releases the places now; `true` when the permit was live (`false` once it lapsed).
    pub async fn release(mut self) -> Result<bool, ClientError> {
        match self.permit.take() {
            Some(permit) => {
                let released = self.limiter.release(permit).await;
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
                let settled = self.limiter.settle(permit.clone(), costs).await;
                self.woke(settled)
            }
            None => Ok(false),
        }
    }

    /// Settles `costs` and releases, in one durable step; `true` when the permit was live.
    pub async fn release_with_costs(mut self, costs: Vec<Cost>) -> Result<bool, ClientError> {
        match self.permit.take() {
            Some(permit) => {
                let released = self.limiter.release_with_costs(permit, costs).await;
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
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    match limiter.release(permit).await {
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
