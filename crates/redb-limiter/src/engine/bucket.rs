//! A bucket: what the engine keeps under one key (its window, its places, its token level and
//! its line, with the settings it keeps them by), how it is pruned and forgotten, and the timer
//! that forgets it once idle ([`Engine::settle_bucket`]). What each kind inside it decides is the
//! kind's own file (`window.rs`, `place.rs`, `token_bucket.rs`, `line.rs`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::line::Waiting;
use super::place::Places;
use super::timers::{Due, Timers};
use super::window::Window;
use super::{BucketLevel, Effect, Engine, Map};
use crate::time::Millis;

/// What a bucket keeps besides its grants and places.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct BucketMeta {
    /// Grants are kept this long: the longest `perMs` any acquire named while the bucket was
    /// not idle (rule 3).
    pub retain_ms: u64,
    /// The `calls` of the latest granted request with a window (for display only).
    pub last_calls: u64,
    /// The `concurrent` of the latest granted request with one (for display only).
    pub last_concurrent: u64,
}

#[derive(Debug)]
pub(super) struct Bucket {
    pub(super) key: Arc<str>,
    pub(super) window: Window,
    /// Held places (rule 4).
    pub(super) places: Places,
    /// The token bucket's level (section 13), until it has stood full for its keeping time
    /// (`token_bucket::KEPT_FULL_MS`) with no place held.
    pub(super) level: Option<BucketLevel>,
    /// The level was forgotten (full) since the file last heard of this bucket.
    pub(super) level_dropped: bool,
    pub(super) meta: BucketMeta,
    /// The instant of this bucket's one live timer.
    pub(super) timer_at: Millis,
    /// Grants pruned from memory but not yet reported to the file, oldest first.
    pub(super) unpersisted_prune: Vec<Millis>,
    /// The line (section 12): the numbers of the tickets waiting here, oldest first, each with
    /// its lapse instant. Lapsed tickets leave it at their timers; until then they are skipped.
    pub(super) line: BTreeMap<u64, Waiting>,
    /// The instants of places released while its line waited and not yet taken again, oldest
    /// first: each is idle until the next grant of a place here (the hand-off, measured by
    /// [`Engine::take_handoffs`]) or until the line empties ([`Engine::take_idle_place_ms`]).
    pub(super) handoff_from: VecDeque<Millis>,
}

impl Bucket {
    /// The live tickets in the line at `now`.
    pub(super) fn queued(&self, now: Millis) -> u64 {
        if self.line.is_empty() {
            return 0;
        }
        self.line.values().filter(|w| w.lapse > now).count() as u64
    }

    /// The first live ticket of the line at `now` (its number and lapse), when it is older than
    /// the ticket numbered `before`.
    pub(super) fn head(&self, now: Millis, before: u64) -> Option<(u64, Millis)> {
        self.line.range(..before).find(|(_, w)| w.lapse > now).map(|(n, w)| (*n, w.lapse))
    }

    fn new(key: Arc<str>) -> Self {
        Bucket {
            key,
            window: Window::default(),
            places: Places::default(),
            level: None,
            level_dropped: false,
            meta: BucketMeta::default(),
            timer_at: Millis(u64::MAX),
            unpersisted_prune: Vec::new(),
            line: BTreeMap::new(),
            handoff_from: VecDeque::new(),
        }
    }

    /// Drops lapsed places, grants no request can count any more, and a token level that is
    /// that stood full long enough with nothing else kept (section 13); returns how many places lapsed.
    pub(super) fn prune(&mut self, now: Millis) -> usize {
        self.window.prune(now, self.meta.retain_ms, &mut self.unpersisted_prune);
        let lapsed = self.places.prune(now);
        if self.window.is_empty() && self.places.is_empty() && self.level.is_some_and(|l| l.is_forgotten(now)) {
            self.level = None;
            self.level_dropped = true;
        }
        lapsed
    }

    /// The token level as a request reads it at `now`, whether or not the bucket was pruned:
    /// none once it stood full long enough with nothing else kept (forgotten, so an acquire finds
    /// `initial`).
    pub(super) fn live_level(&self, now: Millis) -> Option<&BucketLevel> {
        let level = self.level.as_ref()?;
        let window_empty = self.window.newest().is_none_or(|t| t.plus(self.meta.retain_ms) <= now);
        let forgotten = level.is_forgotten(now) && window_empty && self.places.held(now) == 0;
        (!forgotten).then_some(level)
    }

    /// Nothing counts in it: an empty window, no places and no token level (rule 3's idle; a
    /// line may wait).
    pub(super) fn is_idle(&self) -> bool {
        self.window.is_empty() && self.places.is_empty() && self.level.is_none()
    }

    /// Sets the token level (a grant, a settle, a creation), pushing its effect.
    pub(super) fn set_level(&mut self, level: BucketLevel, effects: &mut Vec<Effect>) {
        self.level = Some(level);
        self.level_dropped = false;
        effects.push(Effect::LevelSet { bucket: self.key.clone(), level });
    }

    /// Idle with no line either: it can be forgotten.
    pub(super) fn is_forgettable(&self) -> bool {
        self.is_idle() && self.line.is_empty()
    }

    /// The effects that delete the grants pruned so far, and a level forgotten, from the file.
    pub(super) fn take_pruned(&mut self, effects: &mut Vec<Effect>) {
        if !self.unpersisted_prune.is_empty() {
            let grants = std::mem::take(&mut self.unpersisted_prune);
            effects.push(Effect::WindowPruned { bucket: self.key.clone(), grants });
        }
        if std::mem::take(&mut self.level_dropped) {
            effects.push(Effect::LevelForgotten { bucket: self.key.clone() });
        }
    }

    /// The effects that forget this (idle) bucket and whatever of it is left in the file.
    pub(super) fn forget(self, effects: &mut Vec<Effect>) {
        if self.level_dropped {
            effects.push(Effect::LevelForgotten { bucket: self.key.clone() });
        }
        effects.push(Effect::BucketForgotten { bucket: self.key, grants: self.unpersisted_prune });
    }

    /// The number of places unlapsed at `now`.
    pub(super) fn held(&self, now: Millis) -> u64 {
        self.places.held(now)
    }

    /// The grants of a window of `per_ms` that count at `now`: only those the bucket still keeps.
    pub(super) fn count_ms(&self, per_ms: u64) -> u64 {
        per_ms.min(self.meta.retain_ms)
    }

    /// When the bucket becomes idle if nothing else happens.
    pub(super) fn idle_at(&self) -> Millis {
        let window_end = self.window.newest().map_or(Millis::ZERO, |t| t.plus(self.meta.retain_ms));
        let last_lapse = self.places.last_lapse().unwrap_or(Millis::ZERO);
        let forget_at = self.level.map_or(Millis::ZERO, |l| l.forget_at());
        window_end.max(last_lapse).max(forget_at)
    }
}

impl Engine {
    /// Brings the bucket's timer forward to when it becomes idle, if that is sooner.
    pub(super) fn arm(timers: &mut Timers, bucket: &mut Bucket) {
        let idle_at = bucket.idle_at();
        if idle_at < bucket.timer_at {
            bucket.timer_at = idle_at;
            timers.push(idle_at, Due::Bucket(bucket.key.clone()));
        }
    }

    /// Prunes the bucket `key` at `now`, if it exists.
    pub(super) fn prune_bucket(&mut self, key: &str, now: Millis) {
        if let Some(bucket) = self.buckets.get_mut(key) {
            self.held_places -= bucket.prune(now);
        }
    }

    /// After a bucket lost places or tickets early: forget it if idle with no line, or bring
    /// its timer forward. A bucket that is idle but for its line is forgotten when its last
    /// ticket leaves (each ticket's end or lapse settles its buckets).
    pub(super) fn settle_bucket(&mut self, key: &str, now: Millis, effects: &mut Vec<Effect>) {
        let Some(bucket) = self.buckets.get_mut(key) else { return };
        self.held_places -= bucket.prune(now);
        if bucket.is_idle() {
            if bucket.line.is_empty() {
                self.bucket_keys.remove(key);
                if let Some(bucket) = self.buckets.remove(key) {
                    bucket.forget(effects);
                }
                self.forget_ceiling(key, now, effects);
            } else {
                bucket.take_pruned(effects);
            }
            return;
        }
        Self::arm(&mut self.timers, bucket);
    }
}

/// The bucket named `key`, created empty when missing.
pub(super) fn bucket_entry<'a>(
    buckets: &'a mut Map<Arc<str>, Bucket>,
    keys: &mut BTreeSet<Arc<str>>,
    key: &str,
) -> &'a mut Bucket {
    if !buckets.contains_key(key) {
        let key: Arc<str> = Arc::from(key);
        keys.insert(key.clone());
        buckets.insert(key.clone(), Bucket::new(key));
    }
    buckets.get_mut(key).expect("inserted above")
}
