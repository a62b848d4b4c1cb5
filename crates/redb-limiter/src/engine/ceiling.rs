//! Adaptive ceilings (section 14): the ceiling `C` a bucket named with `adapt` keeps, shared by
//! every host that names it so; how a request is judged with it; and how an outcome reported on
//! a permit cuts it or grows it.
//!
//! - **Judged with `C`.** A limit with `adapt` is judged as if its window's `calls` (a token
//!   bucket's `refill`) were `C`, clamped to the request's own `[min, max]`; a bucket's `burst`
//!   scales with it (`floor(burst × C / refill)`, at least 1). A bucket never signalled has no
//!   ceiling kept: `C` is the request's own `calls`. [`Engine::judged`] is the one place that
//!   says so; the decision path (`refusal`, `grant`, `figures`) and the line read the request it
//!   returns.
//! - **Signals** come on a permit: each adapted bucket of its grant keeps (in the permit) whether
//!   the ceiling was in play at the grant and whether an outcome was counted there. An outcome
//!   counts once per permit per bucket.
//! - **Cut**: `limited` sets `C` to `max(min, floor(C × keepPct / 100))`, only for a grant made
//!   after the latest cut (a burst of 429s of one overload cuts once).
//! - **Growth**: `clean` raises `C` by `increase` up to `max`, only when the ceiling was in play
//!   at the grant, the grant was made after the latest cut, and `C` has not grown within the
//!   last `perMs`.
//! - **After the latest cut** is decided by the order of events, not by the millisecond: a
//!   ceiling counts its cuts, and a share keeps the count it saw at the grant. A grant is after
//!   the latest cut when none is kept, when it was made in a later millisecond, or when, in the
//!   cut's own millisecond, it saw that cut counted (a grant made in the same millisecond just
//!   before the cut belongs to the overload it cut for). A ceiling forgotten and kept anew counts
//!   from the most cuts any live grant of that millisecond saw of the one before it (else from
//!   zero): a grant of an earlier millisecond is before its cuts by its instant, and one of the
//!   same millisecond, made before it was kept, never saw its count.
//! - **Kept**: every change is an [`Effect::CeilingSet`] the store commits before the reply; a
//!   ceiling below `max` is kept at least [`KEPT_MS`] after its latest signal, one at `max` is
//!   forgotten with its bucket.
//!
//! This module never reads a clock and knows nothing of the file.

use std::borrow::Cow;
use std::sync::Arc;

use super::timers::Due;
use super::{Effect, Engine, Settled, token_bucket};
use crate::request::{AcquireRequest, Adapt, BadRequest, BucketLimit, Cost, Limit, Signal};
use crate::time::Millis;

/// A ceiling below its `max` is kept at least this long after its latest signal, even while its
/// bucket is forgotten.
pub const KEPT_MS: u64 = 3_600_000;

/// A bucket's adaptive ceiling as kept (and persisted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ceiling {
    /// `C`: what the window's `calls` (a token bucket's `refill`) is judged as.
    pub c: u64,
    /// The `max` of the latest request that signalled it: at it, the ceiling is forgotten with
    /// its bucket.
    pub max: u64,
    /// The latest cut.
    pub cut_at: Option<Millis>,
    /// How many cuts it has counted since it was kept: a share keeps the count it saw at its
    /// grant, which orders the grant and a cut within one millisecond.
    pub cuts: u64,
    /// The latest growth.
    pub grown_at: Option<Millis>,
    /// The latest signal (an outcome that counted).
    pub signal_at: Millis,
}

impl Ceiling {
    /// Whether it may be forgotten at `now` once its bucket is: at `max`, or an hour after its
    /// latest signal.
    fn may_go(&self, now: Millis) -> bool {
        self.c >= self.max || self.signal_at.plus(KEPT_MS) <= now
    }
}

/// What an outcome did to a ceiling, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CeilingChange {
    Cut,
    Growth,
}

impl CeilingChange {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            CeilingChange::Cut => "cut",
            CeilingChange::Growth => "growth",
        }
    }
}

/// One adapted bucket of a permit's grant: what an outcome on the permit needs there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdaptedShare {
    pub bucket: Arc<str>,
    pub adapt: Adapt,
    /// The request's own `calls` (a bucket's `refill`): where a ceiling never kept starts.
    pub start: u64,
    /// The request's `perMs`: growth is at most one step in it.
    pub per_ms: u64,
    /// The ceiling was in play at the grant (the window held at least half of `C`, its own
    /// cost counted; a bucket's level after the take was at most half its burst).
    pub in_play: bool,
    /// An outcome was counted here already.
    pub signalled: bool,
    /// The ceiling's count of cuts at the grant (0 when none was kept).
    pub cuts_seen: u64,
}

impl AdaptedShare {
    /// The share a permit keeps of `limit` (as judged) when it adapts; `own` is the limit as the
    /// request named it (its `calls` or `refill` is where a ceiling never kept starts). Whether
    /// the ceiling is in play is set once the grant is counted; `kept` is the bucket's ceiling
    /// at the grant.
    pub(super) fn at_grant(limit: &Limit, own: &Limit, kept: Option<&Ceiling>) -> Option<AdaptedShare> {
        let per_ms = limit.window.map(|w| w.per_ms).or(limit.bucket.map(|b| b.per_ms))?;
        Some(AdaptedShare {
            bucket: Arc::from(limit.key.as_str()),
            adapt: limit.adapt?,
            start: own.nominal_calls()?,
            per_ms,
            in_play: false,
            signalled: false,
            cuts_seen: kept.map_or(0, |k| k.cuts),
        })
    }

    /// Whether its grant was made after the latest cut of `kept` (see the module docs).
    fn after_cut(&self, granted_at: Millis, kept: Option<&Ceiling>) -> bool {
        match kept.and_then(|k| Some((k.cut_at?, k.cuts))) {
            None => true,
            Some((cut_at, cuts)) => granted_at > cut_at || (granted_at == cut_at && self.cuts_seen == cuts),
        }
    }
}

/// `C` as `adapt` judges it: the ceiling kept, or `start` when none is, clamped.
#[must_use]
pub fn judged_c(adapt: &Adapt, start: u64, kept: Option<&Ceiling>) -> u64 {
    adapt.clamp(kept.map_or(start, |k| k.c))
}

/// A token bucket judged with `c` for its `refill`: its `burst` scaled to
/// `floor(burst × c / refill)`, at least 1, and its `initial` at most that.
#[must_use]
pub fn scaled_bucket(b: &BucketLimit, c: u64) -> BucketLimit {
    let burst = (u128::from(b.burst) * u128::from(c) / u128::from(b.refill)).max(1);
    let burst = u64::try_from(burst).unwrap_or(u64::MAX);
    BucketLimit { refill: c, per_ms: b.per_ms, burst, initial: b.initial.min(burst) }
}

/// `limit` judged with the ceiling `kept` (section 14), when it adapts; else `None`.
fn judge_limit(limit: &Limit, kept: Option<&Ceiling>) -> Option<Limit> {
    let adapt = limit.adapt?;
    let start = limit.nominal_calls()?;
    let c = judged_c(&adapt, start, kept);
    if c == start {
        return None;
    }
    let mut judged = limit.clone();
    if let Some(w) = &mut judged.window {
        w.calls = c;
    }
    if let Some(b) = &mut judged.bucket {
        *b = scaled_bucket(b, c);
    }
    Some(judged)
}

/// What `signal` on a grant made at `granted_at` with `share` does to the ceiling `kept` at
/// `now`: the ceiling afterwards and its change, or `None` when nothing is to be kept (no
/// ceiling yet and nothing changed).
fn apply(
    kept: Option<&Ceiling>,
    share: &AdaptedShare,
    granted_at: Millis,
    signal: Signal,
    now: Millis,
) -> Option<(Ceiling, Option<CeilingChange>)> {
    let adapt = &share.adapt;
    let c = judged_c(adapt, share.start, kept);
    let cut_at = kept.and_then(|k| k.cut_at);
    let grown_at = kept.and_then(|k| k.grown_at);
    let after_cut = share.after_cut(granted_at, kept);
    let mut next = Ceiling {
        c: kept.map_or(share.start, |k| k.c),
        max: adapt.max,
        cut_at,
        cuts: kept.map_or(0, |k| k.cuts),
        grown_at,
        signal_at: now,
    };
    let change = match signal {
        Signal::Limited if after_cut => {
            let kept_part = u128::from(c) * u128::from(adapt.keep_pct) / 100;
            next.c = u64::try_from(kept_part).unwrap_or(u64::MAX).max(adapt.min);
            next.cut_at = Some(now);
            next.cuts = next.cuts.saturating_add(1);
            Some(CeilingChange::Cut)
        }
        Signal::Clean
            if after_cut
                && share.in_play
                && c < adapt.max
                && adapt.increase > 0
                && grown_at.is_none_or(|g| now.since(g) >= share.per_ms) =>
        {
            next.c = c.saturating_add(adapt.increase).min(adapt.max);
            next.grown_at = Some(now);
            Some(CeilingChange::Growth)
        }
        _ => None,
    };
    (kept.is_some() || change.is_some()).then_some((next, change))
}

/// The most cuts `shares` of a grant made at `granted_at` saw of `bucket`'s ceiling, when that
/// grant was made at `now` (else 0).
fn shares_seen(shares: &[AdaptedShare], bucket: &str, granted_at: Millis, now: Millis) -> u64 {
    if granted_at != now {
        return 0;
    }
    shares.iter().filter(|s| &*s.bucket == bucket).map(|s| s.cuts_seen).max().unwrap_or(0)
}

impl Engine {
    /// `req` as it is judged (section 14): each limit with `adapt` with its window's `calls` (a
    /// bucket's `refill` and `burst`) as the ceiling kept says. Borrowed when nothing changes.
    pub(super) fn judged<'a>(&self, req: &'a AcquireRequest) -> Cow<'a, AcquireRequest> {
        if !req.limits.iter().any(|l| l.adapt.is_some()) {
            return Cow::Borrowed(req);
        }
        let mut out: Option<AcquireRequest> = None;
        for (i, limit) in req.limits.iter().enumerate() {
            if let Some(judged) = judge_limit(limit, self.ceilings.get(limit.key.as_str())) {
                out.get_or_insert_with(|| req.clone()).limits[i] = judged;
            }
        }
        out.map_or(Cow::Borrowed(req), Cow::Owned)
    }

    /// The ceiling `limit` is judged with (clamped to its own `[min, max]`), when it adapts:
    /// what peek and report show.
    pub(super) fn ceiling_of(&self, limit: &Limit) -> Option<u64> {
        let adapt = limit.adapt?;
        Some(judged_c(&adapt, limit.nominal_calls()?, self.ceilings.get(limit.key.as_str())))
    }

    /// The ceiling `C` a line's ticket with `adapt` and its own `start` is judged with in
    /// `bucket`.
    pub(super) fn line_c(&self, bucket: &str, adapt: &Adapt, start: u64) -> u64 {
        judged_c(adapt, start, self.ceilings.get(bucket))
    }

    /// Counts `signal` on the live permit `permit` (section 14) in every adapted bucket of its
    /// grant where no outcome counted yet: true when the permit was live. An unknown, released
    /// or lapsed permit changes nothing.
    pub fn signal(&mut self, permit: &str, signal: Signal, now: Millis, effects: &mut Vec<Effect>) -> bool {
        let Some(id) = self.live_permit(permit, now) else { return false };
        let state = self.permits.get_mut(&id).expect("live");
        if state.adapted.iter().all(|a| a.signalled) {
            return true;
        }
        let at = state.at;
        let mut shares = std::mem::take(&mut state.adapted);
        for share in shares.iter_mut().filter(|a| !a.signalled) {
            share.signalled = true;
            let kept = self.ceilings.get(&*share.bucket).copied();
            let Some((mut ceiling, change)) = apply(kept.as_ref(), share, at, signal, now) else { continue };
            if kept.is_none() {
                // Kept anew: its count starts above what any grant of this millisecond saw of
                // the ceiling forgotten before it, so those grants stay before its cuts.
                let own = if at == now { share.cuts_seen } else { 0 };
                let seen = self.cuts_seen_at(&share.bucket, now).max(own);
                ceiling.cuts = ceiling.cuts.saturating_add(seen);
            }
            self.set_ceiling(share.bucket.clone(), ceiling, change, now, effects);
        }
        let state = self.permits.get_mut(&id).expect("live");
        state.adapted = shares;
        effects.push(Effect::PermitSet { id, permit: state.clone() });
        true
    }

    /// The most cuts a live permit granted at `now` saw of `bucket`'s ceiling at its grant.
    fn cuts_seen_at(&self, bucket: &str, now: Millis) -> u64 {
        self.permits
            .values()
            .filter(|p| p.at == now)
            .map(|p| shares_seen(&p.adapted, bucket, p.at, now))
            .max()
            .unwrap_or(0)
    }

    /// [`Engine::release_with`], counting `outcome` (section 14) on the permit's adapted
    /// buckets before it goes.
    pub fn release_with_outcome(
        &mut self,
        permit: &str,
        costs: &[Cost],
        outcome: Option<Signal>,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, BadRequest> {
        if !costs.is_empty() {
            let before = effects.len();
            if !self.settle(permit, costs, now, effects)?.is_settled() {
                effects.truncate(before);
            }
        }
        if let Some(outcome) = outcome {
            self.signal(permit, outcome, now, effects);
        }
        Ok(self.release(permit, now, effects))
    }

    /// [`Engine::settle`], then counting `outcome` (section 14) on the permit's adapted buckets
    /// when it was live. A bad key is a `BadRequest` and nothing changes.
    pub fn settle_with_outcome(
        &mut self,
        permit: &str,
        costs: &[Cost],
        outcome: Option<Signal>,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<Settled, BadRequest> {
        let settled = self.settle(permit, costs, now, effects)?;
        if let Some(outcome) = outcome.filter(|_| settled.is_settled()) {
            self.signal(permit, outcome, now, effects);
        }
        Ok(settled)
    }

    /// Whether the ceiling of `share`'s bucket is in play just after a grant of `req` (judged) at
    /// `now` (section 14): its window holds at least half of `C`, the grant's own cost counted;
    /// a token bucket's level is at most half its burst.
    pub(super) fn in_play(&self, req: &AcquireRequest, share: &AdaptedShare, now: Millis) -> bool {
        let Some(limit) = req.limits.iter().find(|l| *l.key == *share.bucket) else { return false };
        let bucket = self.buckets.get(limit.key.as_str());
        if let Some(w) = limit.window {
            let used = bucket.map_or(0, |b| b.window.used(now, b.count_ms(w.per_ms)));
            return used.saturating_mul(2) >= w.calls;
        }
        if let Some(b) = limit.bucket {
            let units = token_bucket::level_units(bucket.and_then(|k| k.live_level(now)), &b, now);
            return units * 2 <= i128::from(b.burst) * i128::from(b.per_ms);
        }
        false
    }

    /// Keeps `ceiling` for `bucket`, pushing its effect; forgotten at once when it may be and its
    /// bucket is.
    fn set_ceiling(
        &mut self,
        bucket: Arc<str>,
        ceiling: Ceiling,
        change: Option<CeilingChange>,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) {
        let key = match self.buckets.get_key_value(&*bucket) {
            Some((key, _)) => key.clone(),
            None => bucket,
        };
        let fresh = self.ceilings.insert(key.clone(), ceiling).is_none_or(|old| old.signal_at != ceiling.signal_at);
        effects.push(Effect::CeilingSet { bucket: key.clone(), ceiling, change });
        if fresh {
            self.timers.push(ceiling.signal_at.plus(KEPT_MS), Due::Ceiling(key.clone()));
        }
        self.forget_ceiling(&key, now, effects);
    }

    /// Forgets the ceiling of `key` when its bucket is forgotten and it may go (at its `max`, or
    /// an hour after its latest signal).
    pub(super) fn forget_ceiling(&mut self, key: &str, now: Millis, effects: &mut Vec<Effect>) {
        if self.buckets.contains_key(key) || !self.ceilings.get(key).is_some_and(|c| c.may_go(now)) {
            return;
        }
        if let Some((bucket, _)) = self.ceilings.remove_entry(key) {
            effects.push(Effect::CeilingForgotten { bucket });
        }
    }

    /// A ceiling's timer (an hour after a signal): forgotten if its bucket is, else re-armed
    /// when a later signal moved it (a bucket forgotten later takes it along).
    pub(super) fn ceiling_due(&mut self, key: &Arc<str>, now: Millis, effects: &mut Vec<Effect>) {
        let Some(ceiling) = self.ceilings.get(key) else { return };
        let due = ceiling.signal_at.plus(KEPT_MS);
        if due > now {
            self.timers.push(due, Due::Ceiling(key.clone()));
            return;
        }
        self.forget_ceiling(key, now, effects);
    }

    /// Restores a persisted ceiling.
    pub fn restore_ceiling(&mut self, key: &str, ceiling: Ceiling) {
        self.ceilings.insert(Arc::from(key), ceiling);
    }

    /// After a restore: forgets the ceilings that may go whose buckets are gone, and arms the
    /// timers of the others.
    pub(super) fn finish_restore_ceilings(&mut self, now: Millis, effects: &mut Vec<Effect>) {
        let keys: Vec<Arc<str>> = self.ceilings.keys().cloned().collect();
        for key in keys {
            self.forget_ceiling(&key, now, effects);
            if let Some(ceiling) = self.ceilings.get(&key) {
                self.timers.push(ceiling.signal_at.plus(KEPT_MS), Due::Ceiling(key));
            }
        }
    }

    /// Every ceiling kept whose key starts with `prefix`, sorted: `/state`'s list.
    #[must_use]
    pub fn ceilings(&self, prefix: &str) -> Vec<(String, Ceiling)> {
        let mut out: Vec<(String, Ceiling)> =
            self.ceilings.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, c)| (k.to_string(), *c)).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The ceiling kept for `key`, if any.
    #[must_use]
    pub fn ceiling(&self, key: &str) -> Option<Ceiling> {
        self.ceilings.get(key).copied()
    }

    /// The adapted bucket of `id`'s grant named `key`, for tests.
    #[cfg(test)]
    pub(super) fn adapted_share(&self, id: super::PermitId, key: &str) -> Option<AdaptedShare> {
        self.permits.get(&id)?.adapted.iter().find(|a| &*a.bucket == key).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(in_play: bool) -> AdaptedShare {
        AdaptedShare {
            bucket: Arc::from("b"),
            adapt: Adapt { min: 2, max: 20, increase: 3, keep_pct: 50 },
            start: 10,
            per_ms: 1000,
            in_play,
            signalled: false,
            cuts_seen: 0,
        }
    }

    #[test]
    fn a_cut_keeps_its_part_down_to_min_and_only_for_grants_after_the_latest_cut() {
        let (c, change) = apply(None, &share(false), Millis(0), Signal::Limited, Millis(5)).unwrap();
        assert_eq!((c.c, c.cut_at, change), (5, Some(Millis(5)), Some(CeilingChange::Cut)));
        // A grant before that cut: the same overload.
        let (same, change) = apply(Some(&c), &share(false), Millis(4), Signal::Limited, Millis(6)).unwrap();
        assert_eq!((same.c, same.cut_at, change), (5, Some(Millis(5)), None));
        assert_eq!(same.signal_at, Millis(6), "a signal is still a signal");
        // A grant in the cut's own millisecond: before the cut when it saw none counted, after it
        // when it saw it.
        let (same_ms, change) = apply(Some(&c), &share(false), Millis(5), Signal::Limited, Millis(7)).unwrap();
        assert_eq!((same_ms.c, change), (5, None));
        let seen = AdaptedShare { cuts_seen: 1, ..share(false) };
        let (again, _) = apply(Some(&c), &seen, Millis(5), Signal::Limited, Millis(7)).unwrap();
        assert_eq!((again.c, again.cuts), (2, 2));
        let (floor, _) = apply(Some(&again), &share(false), Millis(7), Signal::Limited, Millis(8)).unwrap();
        assert_eq!(floor.c, 2, "never below min");
    }

    #[test]
    fn growth_needs_the_ceiling_in_play_and_one_window_since_the_last() {
        assert_eq!(apply(None, &share(false), Millis(0), Signal::Clean, Millis(1)), None, "nothing to keep");
        let (c, change) = apply(None, &share(true), Millis(0), Signal::Clean, Millis(1)).unwrap();
        assert_eq!((c.c, c.grown_at, change), (13, Some(Millis(1)), Some(CeilingChange::Growth)));
        let (c2, change) = apply(Some(&c), &share(true), Millis(1), Signal::Clean, Millis(1000)).unwrap();
        assert_eq!((c2.c, change), (13, None), "within perMs of the last growth");
        let (c3, _) = apply(Some(&c), &share(true), Millis(1), Signal::Clean, Millis(1001)).unwrap();
        assert_eq!(c3.c, 16);
        let top = Ceiling { c: 19, ..c3 };
        let (c4, _) = apply(Some(&top), &share(true), Millis(1), Signal::Clean, Millis(9000)).unwrap();
        assert_eq!(c4.c, 20, "never above max");
        let cut = Ceiling { cut_at: Some(Millis(50)), ..c };
        let (c5, change) = apply(Some(&cut), &share(true), Millis(49), Signal::Clean, Millis(9000)).unwrap();
        assert_eq!((c5.c, change), (13, None), "a grant before the latest cut does not grow it");
    }

    #[test]
    fn a_bucket_judged_with_c_scales_its_burst() {
        let b = BucketLimit { refill: 10, per_ms: 1000, burst: 40, initial: 40 };
        assert_eq!(scaled_bucket(&b, 5), BucketLimit { refill: 5, per_ms: 1000, burst: 20, initial: 20 });
        let small = BucketLimit { refill: 10, per_ms: 1000, burst: 3, initial: 0 };
        assert_eq!(scaled_bucket(&small, 1).burst, 1, "at least 1");
        let limit = Limit::bucket("b", 10, 1000).with_burst(40).with_adapt(Adapt::defaults(10));
        let kept = Ceiling { c: 4, max: 10, cut_at: None, cuts: 0, grown_at: None, signal_at: Millis(0) };
        let judged = judge_limit(&limit, Some(&kept)).unwrap();
        assert_eq!(judged.bucket.map(|b| (b.refill, b.burst)), Some((4, 16)));
        let window = Limit::window("w", 10, 1000).with_adapt(Adapt { min: 5, ..Adapt::defaults(10) });
        assert_eq!(judge_limit(&window, Some(&kept)).unwrap().window.map(|w| w.calls), Some(5), "clamped to min");
        assert_eq!(judge_limit(&window, None), None, "starts at calls");
    }
}
