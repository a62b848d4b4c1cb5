//! A bucket's rolling window: its grants in time order with running sums.
//!
//! Grants made in the same millisecond are merged. Each entry carries the running total of all
//! costs up to and including it (wrapping arithmetic: only differences are ever read), so the
//! use of any window length is one binary search, and the `retryAt` of a refusal another.

use std::collections::VecDeque;

use crate::time::Millis;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    at: Millis,
    cost: u64,
    /// Running total of every cost recorded up to and including this entry (wrapping).
    cum: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Window {
    entries: VecDeque<Entry>,
    /// Running total of every cost pruned so far (wrapping).
    pruned_cum: u64,
}

impl Window {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    fn last_cum(&self) -> u64 {
        self.entries.back().map_or(self.pruned_cum, |e| e.cum)
    }

    /// Drops the grants that no request can count any more (granted at or before
    /// `now - retain_ms`), appending their instants to `dropped`.
    pub(crate) fn prune(&mut self, now: Millis, retain_ms: u64, dropped: &mut Vec<Millis>) {
        while let Some(front) = self.entries.front() {
            if front.at.plus(retain_ms) > now {
                break;
            }
            self.pruned_cum = front.cum;
            dropped.push(front.at);
            self.entries.pop_front();
        }
    }

    /// Index of the first grant that still counts in a window of `per_ms` at `now`.
    pub(crate) fn first_counting(&self, now: Millis, per_ms: u64) -> usize {
        // A grant at `t` counts while `now < t + per_ms`.
        self.entries.partition_point(|e| e.at.plus(per_ms) <= now)
    }

    /// The grant at index `i` (oldest first): its instant and the cost recorded then.
    pub(crate) fn at(&self, i: usize) -> (Millis, u64) {
        let e = &self.entries[i];
        (e.at, e.cost)
    }

    /// The cost recorded from the grant at index `i` on.
    pub(crate) fn sum_from(&self, i: usize) -> u64 {
        let before = if i == 0 { self.pruned_cum } else { self.entries[i - 1].cum };
        self.last_cum().wrapping_sub(before)
    }

    /// The cost counted in a window of `per_ms` ending at `now`.
    pub(crate) fn used(&self, now: Millis, per_ms: u64) -> u64 {
        let i = self.first_counting(now, per_ms);
        let before = if i == 0 { self.pruned_cum } else { self.entries[i - 1].cum };
        self.last_cum().wrapping_sub(before)
    }

    /// When a window of `per_ms`/`calls` will have room for `cost` (already capped at `calls`),
    /// or `None` when it has room at `now`. Only grants made less than `count_ms` (at most
    /// `per_ms`) ago count: the bucket may not keep them as long as `per_ms` (rule 3).
    pub(crate) fn refused_until(
        &self,
        now: Millis,
        calls: u64,
        count_ms: u64,
        per_ms: u64,
        cost: u64,
    ) -> Option<Millis> {
        if cost == 0 {
            return None;
        }
        let last = self.last_cum();
        let i = self.first_counting(now, count_ms);
        let before = if i == 0 { self.pruned_cum } else { self.entries[i - 1].cum };
        let used = last.wrapping_sub(before);
        if used + cost <= calls {
            return None;
        }
        // The earliest entry k (k >= i) such that what remains after it leaves fits:
        // (last - cum[k]) + cost <= calls, i.e. cum[k] - pruned >= (last - pruned) + cost - calls.
        let base = self.pruned_cum;
        let need = last.wrapping_sub(base) + cost - calls;
        // Entries before `i` are below `need` too (their running totals are smaller still).
        let k = self.entries.partition_point(|e| e.cum.wrapping_sub(base) < need);
        let entry = self.entries.get(k).expect("a cost capped at calls fits once every grant has left");
        Some(entry.at.plus(per_ms))
    }

    /// Records `cost` at `now` (which is never before the last grant) and returns the total
    /// recorded at that millisecond.
    pub(crate) fn record(&mut self, now: Millis, cost: u64) -> u64 {
        let cum = self.last_cum().wrapping_add(cost);
        match self.entries.back_mut() {
            Some(back) if back.at == now => {
                back.cost += cost;
                back.cum = cum;
                back.cost
            }
            _ => {
                self.entries.push_back(Entry { at: now, cost, cum });
                cost
            }
        }
    }

    /// Replaces `old`, part of the cost recorded at `at`, with `new`: the grant keeps its
    /// instant. Returns the total now recorded at `at`, or `None` when no grant at `at` is kept
    /// (it left the window; nothing changes).
    pub(crate) fn settle(&mut self, at: Millis, old: u64, new: u64) -> Option<u64> {
        let i = self.entries.binary_search_by_key(&at, |e| e.at).ok()?;
        let entry = &mut self.entries[i];
        entry.cost = entry.cost - old + new;
        let total = entry.cost;
        let delta = new.wrapping_sub(old);
        for e in self.entries.range_mut(i..) {
            e.cum = e.cum.wrapping_add(delta);
        }
        Some(total)
    }

    /// Restores one persisted grant; entries must arrive in time order.
    pub(crate) fn restore(&mut self, at: Millis, cost: u64) {
        let cum = self.last_cum().wrapping_add(cost);
        match self.entries.back_mut() {
            Some(back) if back.at >= at => {
                back.cost += cost;
                back.cum = cum;
            }
            _ => self.entries.push_back(Entry { at, cost, cum }),
        }
    }

    pub(crate) fn newest(&self) -> Option<Millis> {
        self.entries.back().map(|e| e.at)
    }

    /// Every entry as `(at, cost)`, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Millis, u64)> + '_ {
        self.entries.iter().map(|e| (e.at, e.cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(grants: &[(u64, u64)]) -> Window {
        let mut w = Window::default();
        for &(at, cost) in grants {
            w.record(Millis(at), cost);
        }
        w
    }

    #[test]
    fn used_counts_until_the_exclusive_edge() {
        let w = window(&[(100, 2), (150, 3)]);
        assert_eq!(w.used(Millis(150), 100), 5);
        assert_eq!(w.used(Millis(199), 100), 5);
        assert_eq!(w.used(Millis(200), 100), 3);
        assert_eq!(w.used(Millis(250), 100), 0);
    }

    #[test]
    fn refused_until_walks_to_the_grant_that_makes_room() {
        let w = window(&[(100, 2), (150, 3), (160, 1)]);
        // calls 6, used 6: cost 1 needs the first grant gone; cost 4 needs the second gone too.
        assert_eq!(w.refused_until(Millis(170), 6, 100, 100, 1), Some(Millis(200)));
        assert_eq!(w.refused_until(Millis(170), 6, 100, 100, 4), Some(Millis(250)));
        assert_eq!(w.refused_until(Millis(170), 6, 100, 100, 6), Some(Millis(260)));
        assert_eq!(w.refused_until(Millis(170), 7, 100, 100, 1), None);
        assert_eq!(w.refused_until(Millis(170), 6, 100, 100, 0), None);
    }

    #[test]
    fn same_millisecond_merges_and_prune_keeps_sums() {
        let mut w = window(&[(100, 2), (100, 3), (200, 1)]);
        assert_eq!(w.len(), 2);
        let mut dropped = Vec::new();
        w.prune(Millis(200), 100, &mut dropped);
        assert_eq!(dropped, vec![Millis(100)]);
        assert_eq!(w.used(Millis(200), 100), 1);
        assert_eq!(w.refused_until(Millis(200), 1, 100, 100, 1), Some(Millis(300)));
    }

    #[test]
    fn settle_changes_a_grant_in_place_and_keeps_the_sums() {
        let mut w = window(&[(100, 2), (150, 3), (160, 1)]);
        assert_eq!(w.settle(Millis(150), 3, 10), Some(10));
        assert_eq!(w.used(Millis(170), 100), 13);
        // calls 6: overfull until the settled grant leaves.
        assert_eq!(w.refused_until(Millis(170), 6, 100, 100, 1), Some(Millis(250)));
        assert_eq!(w.settle(Millis(150), 10, 0), Some(0));
        assert_eq!(w.used(Millis(170), 100), 3);
        assert_eq!(w.used(Millis(200), 100), 1);
        assert_eq!(w.settle(Millis(155), 1, 2), None);
        // Only grants younger than count_ms count, whatever per_ms says.
        assert_eq!(w.refused_until(Millis(170), 3, 50, 100, 3), Some(Millis(260)));
        assert_eq!(w.refused_until(Millis(170), 3, 9, 100, 3), None);
    }
}
