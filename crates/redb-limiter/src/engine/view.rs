//! What the engine shows of itself, changing nothing it decides by: the read-only views of its
//! state (`/state` and `status`, whole or a page at a time), the counts and the hand-off figures
//! for `/metrics`, and the persisted facts that tests compare a rebuilt engine with.

use std::sync::Arc;

use super::{Bucket, BucketMeta, Ceiling, Engine, Map, PermitId, Ticket, TicketId, TicketState};
use crate::time::Millis;

/// A read-only view of one bucket, for `/state` and `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketView {
    pub key: String,
    pub meta: BucketMeta,
    /// Cost counted in the window of `meta.retain_ms` ending now.
    pub window_used: u64,
    pub oldest_grant: Option<Millis>,
    pub grant_entries: usize,
    pub places_held: usize,
    pub next_lapse: Option<Millis>,
    /// A token bucket's `(level, burst)` (section 13), the level in whole tokens rounded down,
    /// read with the figures that last wrote it.
    pub level: Option<(i64, u64)>,
    /// The live tickets in its line.
    pub queued: usize,
    /// When its first live ticket was filed.
    pub first_ticket_at: Option<Millis>,
    /// Its first live ticket (section 12.9), so an operator can release it.
    pub first_ticket: Option<TicketId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitView {
    pub id: PermitId,
    /// The permit lives until then.
    pub expires: Millis,
    /// The places still held, as (bucket, lapse).
    pub places: Vec<(String, Millis)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThrottleView {
    pub key: String,
    pub until: Millis,
}

/// Everything live at one instant, keys sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StateView {
    pub buckets: Vec<BucketView>,
    pub permits: Vec<PermitView>,
    pub throttles: Vec<ThrottleView>,
    /// The adaptive ceilings kept (section 14), keys sorted: a bucket's ceiling may outlive it.
    pub ceilings: Vec<(String, Ceiling)>,
}

/// The keys a page of the state may show (see [`Engine::page_keys`]).
#[derive(Debug, Clone, Default)]
pub struct PageKeys {
    /// The page starts after this key.
    pub after: String,
    /// How many of each kind were asked for: one more means more remain beyond.
    pub keep: usize,
    pub buckets: Vec<Arc<str>>,
    pub permits: Vec<PermitId>,
    pub throttles: Vec<Arc<str>>,
}

/// Counts for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub buckets: usize,
    pub permits: usize,
    pub throttles: usize,
}

/// See [`Engine::facts`].
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Facts {
    #[allow(clippy::type_complexity)]
    pub buckets: std::collections::BTreeMap<String, (Vec<(Millis, u64)>, Vec<(Millis, PermitId)>)>,
    pub throttles: std::collections::BTreeMap<String, Millis>,
    /// Live permits: grant instant, expiry, and what the grant counts per window bucket.
    #[allow(clippy::type_complexity)]
    pub permits: std::collections::BTreeMap<PermitId, (Millis, Millis, Vec<(String, u64)>)>,
    /// Live tickets.
    pub tickets: std::collections::BTreeMap<TicketId, TicketState>,
    /// Each bucket's line: the live tickets' numbers, oldest first, with their lapses.
    pub lines: std::collections::BTreeMap<String, Vec<(u64, Millis)>>,
    /// Each token bucket not full: its level in whole tokens (section 13; a full one reads as a
    /// bucket never named with its burst as `initial`).
    pub levels: std::collections::BTreeMap<String, i64>,
}

impl Bucket {
    /// How the bucket stands at `now`, for `/state`; `None` when nothing in it counts.
    pub(super) fn view(&self, key: &str, now: Millis, tickets: &Map<u64, Ticket>) -> Option<BucketView> {
        let first = self.head(now, u64::MAX).and_then(|(n, _)| tickets.get(&n));
        let live = self.places.live(now);
        let view = BucketView {
            key: key.to_string(),
            meta: self.meta,
            window_used: self.window.used(now, self.meta.retain_ms),
            oldest_grant: self.window.iter().find(|(at, _)| at.plus(self.meta.retain_ms) > now).map(|(at, _)| at),
            grant_entries: self.window.len(),
            places_held: live.clone().count(),
            next_lapse: live.clone().next(),
            level: self.live_level(now).map(|l| (l.tokens_at(now), l.burst)),
            queued: self.queued(now) as usize,
            first_ticket_at: first.map(|t| t.state.filed_at),
            first_ticket: first.map(|t| t.id),
        };
        (view.window_used > 0 || view.places_held > 0 || view.queued > 0 || view.level.is_some()).then_some(view)
    }
}

impl Engine {
    /// The hand-offs since the last call: for each place released while its bucket's line
    /// waited, the ms until the next grant of a place there (the `/metrics` histogram).
    pub fn take_handoffs(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.handoffs)
    }

    /// The place-time (ms) that stood idle while a line waited, since the last call: from each
    /// place released while its bucket's line waited until a grant took a place there again, or
    /// until the line emptied (the `/metrics` counter).
    pub fn take_idle_place_ms(&mut self) -> u64 {
        std::mem::take(&mut self.idle_place_ms)
    }

    /// Counts of live buckets, permits and throttles.
    #[must_use]
    pub fn totals(&self) -> Totals {
        debug_assert_eq!(self.bucket_keys.len(), self.buckets.len(), "the key index follows the buckets");
        Totals { buckets: self.buckets.len(), permits: self.permits.len(), throttles: self.throttles.len() }
    }

    /// Tickets not yet ended or swept (lapsed ones leave at their timers).
    #[must_use]
    pub fn tickets(&self) -> usize {
        self.tickets.len()
    }

    /// Places held at the last time each bucket was looked at (lapsed places leave lazily).
    #[must_use]
    pub fn held_places(&self) -> usize {
        self.held_places
    }

    /// A snapshot of everything live at `now` whose key starts with `prefix`, keys sorted.
    #[must_use]
    pub fn view(&self, now: Millis, prefix: &str) -> StateView {
        let mut buckets: Vec<BucketView> = self
            .buckets
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .filter_map(|(key, b)| b.view(key, now, &self.tickets))
            .collect();
        buckets.sort_by(|a, b| a.key.cmp(&b.key));
        let mut permits: Vec<PermitView> = self
            .permits
            .iter()
            .filter(|(_, p)| p.expires > now)
            .map(|(id, p)| PermitView {
                id: *id,
                expires: p.expires,
                places: p
                    .places
                    .iter()
                    .filter(|(k, lapse)| *lapse > now && k.starts_with(prefix))
                    .map(|(k, lapse)| (k.to_string(), *lapse))
                    .collect(),
            })
            .filter(|p| !p.places.is_empty() || (prefix.is_empty() && self.permits[&p.id].places.is_empty()))
            .collect();
        permits.sort_by_key(|p| p.id);
        let mut throttles: Vec<ThrottleView> = self
            .throttles
            .iter()
            .filter(|(k, u)| **u > now && k.starts_with(prefix))
            .map(|(k, u)| ThrottleView { key: k.to_string(), until: *u })
            .collect();
        throttles.sort_by(|a, b| a.key.cmp(&b.key));
        StateView { buckets, permits, throttles, ceilings: self.ceilings(prefix) }
    }

    /// The keys a page of the state may show: the `keep + 1` lowest keys of buckets, permits
    /// (by their id's string form) and throttles each, that start with `prefix` and sort after
    /// `after`, sorted (one more than `keep` stands for "more remain"). Buckets are read in
    /// order from their index (a page of a large state holds the engine for a moment); permits
    /// and throttles, fewer, in one pass that clones only those kept. [`Engine::view_page`]
    /// then builds the page's views alone.
    #[must_use]
    pub fn page_keys(&self, prefix: &str, after: &str, keep: usize) -> PageKeys {
        use std::ops::Bound;
        let wanted = |k: &&Arc<str>| k.starts_with(prefix) && &***k > after;
        let from = if prefix > after { Bound::Included(prefix) } else { Bound::Excluded(after) };
        let buckets = self
            .bucket_keys
            .range::<str, _>((from, Bound::Unbounded))
            .take_while(|k| k.starts_with(prefix))
            .take(keep.saturating_add(1))
            .cloned()
            .collect();
        let permit_after = after.parse::<PermitId>().ok();
        let permit_wanted = |id: &&PermitId| match permit_after {
            Some(cursor) => **id > cursor,
            None => after.is_empty() || id.to_string().as_str() > after,
        };
        PageKeys {
            after: after.to_owned(),
            keep,
            buckets,
            permits: lowest(self.permits.keys().filter(permit_wanted), keep).into_iter().copied().collect(),
            throttles: lowest(self.throttles.keys().filter(wanted), keep).into_iter().cloned().collect(),
        }
    }

    /// The views at `now` of `keys` (sorted, from [`Engine::page_keys`]), at most `limit` of each
    /// kind that are live, in order; and whether keys are left over (more may remain).
    #[must_use]
    pub fn view_page(&self, now: Millis, prefix: &str, keys: &PageKeys, limit: usize) -> (StateView, bool) {
        // Keys beyond those listed: more remain whatever the page shows.
        let mut truncated =
            [keys.buckets.len(), keys.permits.len(), keys.throttles.len()].iter().any(|n| *n > keys.keep);
        let mut buckets = Vec::new();
        for (i, key) in keys.buckets.iter().enumerate() {
            if buckets.len() == limit {
                truncated |= i < keys.buckets.len();
                break;
            }
            if let Some(view) = self.buckets.get(key).and_then(|b| b.view(key, now, &self.tickets)) {
                buckets.push(view);
            }
        }
        let mut permits = Vec::new();
        for (i, id) in keys.permits.iter().enumerate() {
            if permits.len() == limit {
                truncated |= i < keys.permits.len();
                break;
            }
            if let Some(p) = self.permits.get(id).filter(|p| p.expires > now) {
                let places: Vec<(String, Millis)> = p
                    .places
                    .iter()
                    .filter(|(k, lapse)| *lapse > now && k.starts_with(prefix))
                    .map(|(k, lapse)| (k.to_string(), *lapse))
                    .collect();
                // A permit without places (asked for with `permit`) is listed when no prefix is.
                if !places.is_empty() || (prefix.is_empty() && p.places.is_empty()) {
                    permits.push(PermitView { id: *id, expires: p.expires, places });
                }
            }
        }
        let mut throttles = Vec::new();
        for (i, key) in keys.throttles.iter().enumerate() {
            if throttles.len() == limit {
                truncated |= i < keys.throttles.len();
                break;
            }
            if let Some(until) = self.throttles.get(key).filter(|u| **u > now) {
                throttles.push(ThrottleView { key: key.to_string(), until: *until });
            }
        }
        let mut ceilings = self.ceilings(prefix);
        ceilings.retain(|(key, _)| key.as_str() > keys.after.as_str());
        ceilings.truncate(limit);
        (StateView { buckets, permits, throttles, ceilings }, truncated)
    }

    /// Every persisted fact of the engine, for tests that compare a rebuilt engine with a live
    /// one: per bucket its meta and window entries, the permits' places, the throttles.
    #[doc(hidden)]
    #[must_use]
    pub fn facts(&self, now: Millis) -> Facts {
        let mut facts = Facts::default();
        for (key, b) in &self.buckets {
            let grants: Vec<(Millis, u64)> =
                b.window.iter().filter(|(at, _)| at.plus(b.meta.retain_ms) > now).collect();
            let places: Vec<(Millis, PermitId)> = b.places.iter().filter(|(l, _)| *l > now).copied().collect();
            if !grants.is_empty() || !places.is_empty() {
                facts.buckets.insert(key.to_string(), (grants, places));
            }
            if let Some(level) = b.level.filter(|l| !l.is_full(now)) {
                facts.levels.insert(key.to_string(), level.tokens_at(now));
            }
        }
        for (key, until) in &self.throttles {
            if *until > now {
                facts.throttles.insert(key.to_string(), *until);
            }
        }
        for (id, p) in &self.permits {
            if p.expires > now {
                let shares = p.windows.iter().map(|w| (w.bucket.to_string(), w.cost)).collect();
                facts.permits.insert(*id, (p.at, p.expires, shares));
            }
        }
        for t in self.tickets.values().filter(|t| t.state.lapse_at > now) {
            facts.tickets.insert(t.id, t.state.clone());
        }
        for (key, b) in &self.buckets {
            let line: Vec<(u64, Millis)> =
                b.line.iter().filter(|(_, w)| w.lapse > now).map(|(n, w)| (*n, w.lapse)).collect();
            if !line.is_empty() {
                facts.lines.insert(key.to_string(), line);
            }
        }
        facts
    }
}

/// The `keep + 1` lowest of `items`, sorted.
fn lowest<T: Ord>(items: impl Iterator<Item = T>, keep: usize) -> Vec<T> {
    let mut heap = std::collections::BinaryHeap::with_capacity(keep.saturating_add(2).min(1 << 16));
    for item in items {
        if heap.len() <= keep {
            heap.push(item);
        } else if let Some(mut highest) = heap.peek_mut()
            && item < *highest
        {
            *highest = item;
        }
    }
    heap.into_sorted_vec()
}
