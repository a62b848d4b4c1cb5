//! A bucket's concurrency places (rule 4): the places held, soonest lapse first, and their rules:
//! does one more fit at `now`, when will it (`retryAt`: the soonest lapse that makes room, or the
//! next recheck), what a grant and a release change, what the figures say (`held`/`free`), and
//! when the last one lapses.
//!
//! This module never reads a clock, and knows nothing of windows, token buckets or lines.

use std::collections::BTreeSet;

use super::PermitId;
use crate::time::Millis;

/// The places held in one bucket as (lapse, permit). A place is held while `now < lapse`;
/// lapsed ones stay until [`Places::prune`] and are skipped meanwhile.
#[derive(Debug, Default)]
pub(crate) struct Places {
    held: BTreeSet<(Millis, PermitId)>,
}

impl Places {
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// A grant's place, lapsing at `lapse`.
    pub(crate) fn insert(&mut self, lapse: Millis, id: PermitId) {
        self.held.insert((lapse, id));
    }

    /// A release: true when the place was still held here.
    pub(crate) fn remove(&mut self, lapse: Millis, id: PermitId) -> bool {
        self.held.remove(&(lapse, id))
    }

    /// Drops the places lapsed at `now`; returns how many.
    pub(crate) fn prune(&mut self, now: Millis) -> usize {
        let mut dropped = 0;
        while let Some(&(lapse, _)) = self.held.first() {
            if lapse > now {
                break;
            }
            self.held.pop_first();
            dropped += 1;
        }
        dropped
    }

    /// Places unlapsed at `now`, soonest lapse first.
    pub(crate) fn live(&self, now: Millis) -> impl Iterator<Item = Millis> + Clone + '_ {
        self.held.range((now.plus(1), PermitId(0))..).map(|&(lapse, _)| lapse)
    }

    /// The number of places unlapsed at `now`.
    pub(crate) fn held(&self, now: Millis) -> u64 {
        (self.held.len() - self.held.range(..(now.plus(1), PermitId(0))).count()) as u64
    }

    /// The latest lapse, if any place is kept.
    pub(crate) fn last_lapse(&self) -> Option<Millis> {
        self.held.last().map(|&(lapse, _)| lapse)
    }

    /// Every place kept, as (lapse, permit), soonest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &(Millis, PermitId)> + '_ {
        self.held.iter()
    }

    /// Rule 4 at `now` for one of `concurrent` places: `None` when one is free, else the soonest
    /// lapse that frees one, at most `recheck` (rule 6).
    pub(crate) fn refused_until(&self, concurrent: u64, now: Millis, recheck: Millis) -> Option<Millis> {
        let held = self.held(now);
        if held < concurrent {
            return None;
        }
        // Room comes back when held - concurrent + 1 places have lapsed.
        let lapse = self.live(now).nth((held - concurrent) as usize).expect("held > held - concurrent");
        Some(lapse.min(recheck))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_held_until_its_lapse_and_room_comes_back_at_the_right_one() {
        let mut p = Places::default();
        p.insert(Millis(100), PermitId(1));
        p.insert(Millis(50), PermitId(2));
        assert_eq!(p.held(Millis(49)), 2);
        assert_eq!(p.held(Millis(50)), 1);
        assert_eq!(p.refused_until(2, Millis(0), Millis(1000)), Some(Millis(50)));
        assert_eq!(p.refused_until(1, Millis(0), Millis(1000)), Some(Millis(100)));
        assert_eq!(p.refused_until(1, Millis(0), Millis(70)), Some(Millis(70)), "at most a recheck on");
        assert_eq!(p.refused_until(3, Millis(0), Millis(1000)), None);
        assert_eq!(p.prune(Millis(50)), 1);
        assert!(p.remove(Millis(100), PermitId(1)));
        assert!(p.is_empty());
    }
}
