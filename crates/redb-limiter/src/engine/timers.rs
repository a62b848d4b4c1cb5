//! The engine's timers: one min-heap of (instant, what is due), ordered by instant and then by
//! insertion, so ties never compare keys. Entries may be stale (a bucket rescheduled, a permit
//! released); whoever pops one checks it against the live state.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use super::PermitId;
use crate::time::Millis;

/// What a timer is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Due {
    Bucket(Arc<str>),
    Permit(PermitId),
    Throttle(Arc<str>),
    /// A ticket's lapse, by its number.
    Ticket(u64),
    /// An hour after a ceiling's latest signal (section 14).
    Ceiling(Arc<str>),
}

#[derive(Debug)]
struct Timer {
    at: Millis,
    seq: u64,
    due: Due,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Timer {}

impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Timer {
    /// Reversed: the heap's top is the soonest, first pushed first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Timer>,
    seq: u64,
}

impl Timers {
    pub(crate) fn push(&mut self, at: Millis, due: Due) {
        self.seq += 1;
        self.heap.push(Timer { at, seq: self.seq, due });
    }

    /// The soonest instant any timer is due.
    pub(crate) fn next_at(&self) -> Option<Millis> {
        self.heap.peek().map(|t| t.at)
    }

    /// The soonest timer, if it is due at `now`.
    pub(crate) fn pop_due(&mut self, now: Millis) -> Option<(Millis, Due)> {
        if self.heap.peek()?.at > now {
            return None;
        }
        self.heap.pop().map(|t| (t.at, t.due))
    }

    pub(crate) fn clear(&mut self) {
        self.heap.clear();
    }
}
