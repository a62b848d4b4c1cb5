//! A token bucket's level (section 13), and its rules: does a cost fit at `now` (rule B), when
//! will it (`retryAt`), what a grant and a settle change, what the figures say, and when the
//! bucket is full (then forgotten, as an idle window is).
//!
//! The level is exact: it is kept as an integer count of `1/unit_ms` of a token at the instant
//! `at`, so a refill of `refill` tokens per `unit_ms` adds exactly `refill` units a millisecond,
//! and no rounding ever accumulates while hosts name the bucket with the same figures. Products
//! are taken in `i128` (a level of 10^9 tokens in units of a 31-day `perMs` is below 2^62).
//!
//! A bucket is judged with each request's own `refill`, `perMs` and `burst`, the answer being
//! deterministic when hosts name one bucket with different figures:
//!
//! - the level kept is read in the request's units, rounded down when its `perMs` differs from
//!   the one that wrote it (never fuller than it was), then refilled at the request's `refill`
//!   since `at`, up to the request's `burst`;
//! - a level already above the request's `burst` (written under a larger one, or before a cut of
//!   its ceiling shrank the burst, section 14) is neither refilled nor cut by the reading, so the
//!   level is never above the largest `burst` named;
//! - a grant or a settle writes the level in the units of its own figures, at its instant; but
//!   one that finds the level above its `burst` takes from it as it reads it (not refilled), and
//!   gives back nothing, keeping it under the figures that wrote it: a request with a smaller
//!   `burst` never makes a larger bucket look full, and so forgotten, and never draws on a refill
//!   at a larger `refill` than its own (after a cut, the bucket grants at most its level plus
//!   `C` per `perMs`, as section 13's exactness asks of `refill`).
//!
//! This module never reads a clock, and knows nothing of lines, places or the file.

use crate::request::BucketLimit;
use crate::time::Millis;

/// A bucket's level as kept (and persisted): `units / unit_ms` tokens at `at`, written under the
/// figures `refill` per `unit_ms` up to `burst` (which say when it is full again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLevel {
    /// The level at `at` in units of `1/unit_ms` of a token; below 0 while in debt (a settle up).
    pub units: i64,
    /// The `perMs` of the figures that wrote it.
    pub unit_ms: u64,
    /// The `refill` of the figures that wrote it.
    pub refill: u64,
    /// The `burst` of the figures that wrote it.
    pub burst: u64,
    pub at: Millis,
}

/// `a / b` rounded towards minus infinity (`b > 0`).
fn floor_div(a: i128, b: i128) -> i128 {
    a.div_euclid(b)
}

/// `a / b` rounded up (`a >= 0`, `b > 0`).
fn ceil_div(a: i128, b: i128) -> i128 {
    (a + b - 1) / b
}

impl BucketLevel {
    /// A bucket first named with `b` at `now`: at `b.initial`.
    #[must_use]
    pub fn initial(b: &BucketLimit, now: Millis) -> Self {
        BucketLevel::of(b, i128::from(b.initial) * i128::from(b.per_ms), now)
    }

    /// The level of `units` (in `b`'s units) at `now`, written under `b`.
    fn of(b: &BucketLimit, units: i128, now: Millis) -> Self {
        // Bounded by burst x perMs <= 10^9 x 2.7 x 10^9 either side of 0 (a debt is at most a burst).
        let units = i64::try_from(units).unwrap_or(if units < 0 { i64::MIN } else { i64::MAX });
        BucketLevel { units, unit_ms: b.per_ms, refill: b.refill, burst: b.burst, at: now }
    }

    /// The level at `now` read with `b`'s figures, in units of `1/b.per_ms` token (see the
    /// module docs).
    #[must_use]
    pub fn units_at(&self, b: &BucketLimit, now: Millis) -> i128 {
        let base = self.base(b);
        let cap = i128::from(b.burst) * i128::from(b.per_ms);
        if base >= cap {
            return base;
        }
        (base + i128::from(b.refill) * i128::from(now.since(self.at))).min(cap)
    }

    /// The level kept, in `b`'s units (rounded down), before any refill.
    fn base(&self, b: &BucketLimit) -> i128 {
        let kept = i128::from(self.units);
        if self.unit_ms == b.per_ms { kept } else { floor_div(kept * i128::from(b.per_ms), i128::from(self.unit_ms)) }
    }

    /// Whether `b` reads it above its own burst (written under a larger one).
    fn above(&self, b: &BucketLimit) -> bool {
        self.base(b) > i128::from(b.burst) * i128::from(b.per_ms)
    }

    /// The level at `now` in whole tokens (rounded down; negative in debt) as its own figures
    /// read it: what `/state` shows.
    #[must_use]
    pub fn tokens_at(&self, now: Millis) -> i64 {
        let units = self.units_at(&self.figures(), now);
        floor_div(units, i128::from(self.unit_ms)) as i64
    }

    /// The figures that wrote it (its `initial` unread).
    fn figures(&self) -> BucketLimit {
        BucketLimit { refill: self.refill, per_ms: self.unit_ms, burst: self.burst, initial: self.burst }
    }

    /// When it is full under the figures that wrote it, if nothing else happens.
    #[must_use]
    pub fn full_at(&self) -> Millis {
        let cap = i128::from(self.burst) * i128::from(self.unit_ms);
        let missing = cap - i128::from(self.units);
        if missing <= 0 {
            return self.at;
        }
        let ms = ceil_div(missing, i128::from(self.refill));
        self.at.plus(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// Whether it is full at `now` under the figures that wrote it.
    #[must_use]
    pub fn is_full(&self, now: Millis) -> bool {
        self.full_at() <= now
    }

    /// When it is forgotten (with no place held and an empty window), if nothing else happens:
    /// once it has stood full for [`KEPT_FULL_MS`] or its `perMs`, whichever is longer.
    #[must_use]
    pub fn forget_at(&self) -> Millis {
        self.full_at().plus(kept_full_ms(self.unit_ms))
    }

    /// Whether it is forgotten at `now` (see [`BucketLevel::forget_at`]).
    #[must_use]
    pub fn is_forgotten(&self, now: Millis) -> bool {
        self.forget_at() <= now
    }
}

/// How long a full bucket is kept before it is forgotten, at least (its `perMs` when longer).
///
/// A bucket named with `initial` below its `burst` starts there only the first time: forgotten
/// the moment it is full, it would start at `initial` again for the host that asks at the
/// `retryAt` it was told (when it is full), and a cost that needs the whole burst would never be
/// granted. Kept an hour, it reads as the full bucket it is for any host that comes back within
/// the hour; one that comes back later finds it at `initial` again (section 13).
pub const KEPT_FULL_MS: u64 = 3_600_000;

/// How long a full bucket whose figures have `per_ms` is kept: [`KEPT_FULL_MS`] or `per_ms`.
#[must_use]
pub fn kept_full_ms(per_ms: u64) -> u64 {
    per_ms.max(KEPT_FULL_MS)
}

/// What a request's bucket limit reads of a bucket: its level, or none (a bucket never named or
/// forgotten, which an acquire finds at `initial`).
pub(crate) fn level_units(level: Option<&BucketLevel>, b: &BucketLimit, now: Millis) -> i128 {
    match level {
        Some(level) => level.units_at(b, now),
        None => i128::from(b.initial) * i128::from(b.per_ms),
    }
}

/// The units a cost takes (rule B): `min(cost, burst)` tokens.
fn need(b: &BucketLimit, cost: u64) -> i128 {
    i128::from(cost.min(b.burst)) * i128::from(b.per_ms)
}

/// Rule B at `now` for a cost of `cost` with figures `b`: `None` when it fits, else the earliest
/// whole millisecond at which the level, refilling, reaches `min(cost, burst)` (`retryAt`).
pub(crate) fn refused_until(level: Option<&BucketLevel>, b: &BucketLimit, cost: u64, now: Millis) -> Option<Millis> {
    if cost == 0 {
        return None;
    }
    let units = level_units(level, b, now);
    let need = need(b, cost);
    if units >= need {
        return None;
    }
    let ms = ceil_div(need - units, i128::from(b.refill));
    Some(now.plus(u64::try_from(ms).unwrap_or(u64::MAX)))
}

/// The level after a grant of `cost` with figures `b` at `now` (rule B checked): `min(cost,
/// burst)` taken at the grant's instant.
pub(crate) fn take(level: Option<&BucketLevel>, b: &BucketLimit, cost: u64, now: Millis) -> BucketLevel {
    match level {
        Some(l) if l.above(b) => {
            // Above this request's burst: taken as read (not refilled), under the figures that
            // wrote it.
            let taken = i128::from(cost.min(b.burst)) * i128::from(l.unit_ms);
            BucketLevel::of(&l.figures(), i128::from(l.units) - taken, now)
        }
        _ => BucketLevel::of(b, level_units(level, b, now) - need(b, cost), now),
    }
}

/// The level after a settle at `now` of a grant made with figures `b` (its `initial` unread: a
/// bucket forgotten meanwhile was full) whose cost goes from `old` to `new` (each capped at
/// `burst`): the difference goes back (never above `burst`, nor a level already above it cut) or
/// is taken (the level may fall below 0).
pub(crate) fn settle(level: Option<&BucketLevel>, b: &BucketLimit, old: u64, new: u64, now: Millis) -> BucketLevel {
    let (old, new) = (i128::from(old.min(b.burst)), i128::from(new.min(b.burst)));
    if let Some(l) = level.filter(|l| l.above(b)) {
        // Above the grant's burst: nothing goes back, and a debt is taken from the level as
        // read (not refilled), under the figures that wrote it.
        let units = i128::from(l.units) - (new - old).max(0) * i128::from(l.unit_ms);
        return BucketLevel::of(&l.figures(), units, now);
    }
    let per = i128::from(b.per_ms);
    let cap = i128::from(b.burst) * per;
    let units = level.map_or(cap, |l| l.units_at(b, now));
    let after = if new < old { units.max((units + (old - new) * per).min(cap)) } else { units - (new - old) * per };
    BucketLevel::of(b, after, now)
}

/// A walk of reservations in one bucket (section 12.9, `line.rs`): each ticket, in line order,
/// is reserved the earliest instant, no sooner than the one before it, at which the level (with
/// the costs reserved before it taken at their instants) reaches its own `min(cost, burst)`.
pub(crate) struct Reservations {
    /// The level after the last reservation (`None`: never named, read at each `initial`).
    level: Option<BucketLevel>,
    /// The last reservation's instant (at first, `now`).
    at: Millis,
}

impl Reservations {
    /// From the bucket's level at `now`.
    pub(crate) fn new(level: Option<&BucketLevel>, now: Millis) -> Self {
        Reservations { level: level.copied(), at: now }
    }

    /// The earliest instant, no sooner than the last reservation, at which `cost` with figures
    /// `b` fits; and the level then (before taking it), in `b`'s units.
    pub(crate) fn earliest(&self, b: &BucketLimit, cost: u64) -> (Millis, i128) {
        let units = level_units(self.level.as_ref(), b, self.at);
        let need = need(b, cost);
        if units >= need {
            return (self.at, units);
        }
        let ms = ceil_div(need - units, i128::from(b.refill));
        let at = self.at.plus(u64::try_from(ms).unwrap_or(u64::MAX));
        (at, BucketLevel::of(b, units, self.at).units_at(b, at))
    }

    /// Reserves `cost` with figures `b` at its earliest instant: returns that instant and the
    /// slack it leaves there, in whole tokens (what a grant now may take without moving it).
    pub(crate) fn reserve(&mut self, b: &BucketLimit, cost: u64) -> (Millis, i128) {
        let (at, units) = self.earliest(b, cost);
        let left = units - need(b, cost);
        *self = Reservations { level: Some(BucketLevel::of(b, left, at)), at };
        (at, floor_div(left, i128::from(b.per_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(refill: u64, per_ms: u64, burst: u64, initial: u64) -> BucketLimit {
        BucketLimit { refill, per_ms, burst, initial }
    }

    #[test]
    fn a_new_bucket_starts_at_initial_and_refills_continuously() {
        let f = b(10, 1000, 10, 10);
        assert_eq!(refused_until(None, &f, 10, Millis(0)), None, "starts full");
        let l = take(None, &f, 10, Millis(0));
        assert_eq!(l.tokens_at(Millis(0)), 0);
        // One token every 100 ms, continuously: 0.5 token at 50 ms.
        assert_eq!(l.units_at(&f, Millis(50)), 500);
        assert_eq!(refused_until(Some(&l), &f, 1, Millis(50)), Some(Millis(100)));
        assert_eq!(refused_until(Some(&l), &f, 3, Millis(50)), Some(Millis(300)));
        assert_eq!(refused_until(Some(&l), &f, 1, Millis(100)), None);
        assert_eq!(l.full_at(), Millis(1000));
        assert!(l.is_full(Millis(1000)) && !l.is_full(Millis(999)));
        let low = b(10, 1000, 10, 2);
        assert_eq!(refused_until(None, &low, 3, Millis(0)), Some(Millis(100)));
    }

    #[test]
    fn a_cost_above_burst_waits_for_a_full_bucket_and_takes_burst() {
        let f = b(1, 1000, 5, 5);
        let l = take(None, &f, 3, Millis(0));
        assert_eq!(refused_until(Some(&l), &f, 50, Millis(0)), Some(Millis(3000)));
        let l = take(Some(&l), &f, 50, Millis(3000));
        assert_eq!(l.tokens_at(Millis(3000)), 0);
        assert_eq!(refused_until(Some(&l), &f, 0, Millis(3000)), None, "a cost of 0 always fits");
    }

    #[test]
    fn a_retry_at_is_the_first_whole_millisecond_with_enough() {
        // 3 tokens per 1000 ms: a token every 333.33 ms.
        let f = b(3, 1000, 3, 0);
        assert_eq!(refused_until(None, &f, 1, Millis(0)), Some(Millis(334)));
        assert_eq!(refused_until(None, &f, 2, Millis(0)), Some(Millis(667)));
        assert_eq!(refused_until(None, &f, 3, Millis(0)), Some(Millis(1000)));
    }

    #[test]
    fn settle_refunds_up_to_burst_and_takes_into_debt() {
        let f = b(10, 1000, 10, 10);
        let l = take(None, &f, 4, Millis(0));
        let down = settle(Some(&l), &f, 4, 1, Millis(0));
        assert_eq!(down.tokens_at(Millis(0)), 9);
        let refund_all = settle(Some(&down), &f, 4, 0, Millis(0));
        assert_eq!(refund_all.tokens_at(Millis(0)), 10, "never above burst");
        let up = settle(Some(&l), &f, 4, 10, Millis(0));
        assert_eq!(up.tokens_at(Millis(0)), 0);
        let debt = settle(Some(&take(None, &f, 10, Millis(0))), &f, 10, 10, Millis(0));
        assert_eq!(debt.tokens_at(Millis(0)), 0);
        let deeper = settle(Some(&take(None, &f, 5, Millis(0))), &f, 1, 10, Millis(0));
        assert_eq!(deeper.tokens_at(Millis(0)), -4);
        assert_eq!(deeper.tokens_at(Millis(1)), -4, "-3.99 rounds down");
        assert_eq!(refused_until(Some(&deeper), &f, 1, Millis(0)), Some(Millis(500)));
        // A forgotten bucket was full.
        assert_eq!(settle(None, &f, 2, 5, Millis(0)).tokens_at(Millis(0)), 7);
    }

    #[test]
    fn other_figures_read_the_level_rounded_down_and_never_above_the_largest_burst() {
        let big = b(100, 1000, 100, 100);
        let small = b(1, 3, 5, 5);
        let l = take(None, &big, 10, Millis(0));
        // 90 tokens kept, above the small burst: not cut, not refilled.
        assert_eq!(l.units_at(&small, Millis(10)), 270);
        let l2 = take(Some(&l), &small, 5, Millis(10));
        // Taken as read (the big figures' refill meanwhile not counted), kept under the figures
        // that wrote it.
        assert_eq!((l2.tokens_at(Millis(10)), l2.burst), (85, 100));
        assert!(!l2.is_full(Millis(10)), "a smaller burst never makes it look full");
        // Read back with the big figures: 85 tokens, refilling to 100 at most.
        assert_eq!(l2.units_at(&big, Millis(10)), 85_000);
        assert_eq!(l2.units_at(&big, Millis(10_000)), 100_000);
        // 1/3 of a token read in units of 1/2: rounded down.
        let third = BucketLevel { units: 1, unit_ms: 3, refill: 1, burst: 5, at: Millis(0) };
        assert_eq!(third.units_at(&b(1, 2, 5, 5), Millis(0)), 0);
    }

    #[test]
    fn a_level_left_above_a_cut_burst_grants_no_more_than_it_holds_plus_the_new_refill() {
        // 3 a second up to 5, holding 2 tokens when a cut of its ceiling (section 14) judges it
        // at 1 a second up to 1: a host asking every 334 ms from 129 ms on, over 10 s, gets at
        // most the 2 tokens held plus 10 refilled (it got 30 when a take above the burst counted
        // the refill at 3 a second).
        let before = b(3, 1000, 5, 5);
        let cut = b(1, 1000, 1, 1);
        let mut level = take(None, &before, 3, Millis(0));
        assert_eq!(level.tokens_at(Millis(0)), 2);
        let mut granted = 0;
        let mut t = 129;
        while t <= 10_000 {
            if refused_until(Some(&level), &cut, 1, Millis(t)).is_none() {
                level = take(Some(&level), &cut, 1, Millis(t));
                granted += 1;
            }
            t += 334;
        }
        assert!((10..=12).contains(&granted), "granted {granted}");
        // A settle up above the cut burst takes its debt from the level as read, too.
        let held = take(None, &before, 2, Millis(0));
        let settled = settle(Some(&held), &b(1, 1000, 2, 2), 1, 2, Millis(500));
        assert_eq!(settled.units, 2_000);
    }

    #[test]
    fn reservations_walk_in_order_from_the_level() {
        let f = b(10, 1000, 10, 10);
        let l = take(None, &f, 10, Millis(0));
        let mut r = Reservations::new(Some(&l), Millis(0));
        assert_eq!(r.reserve(&f, 2), (Millis(200), 0));
        assert_eq!(r.reserve(&f, 5), (Millis(700), 0));
        assert_eq!(r.earliest(&f, 1).0, Millis(800));
        let mut fresh = Reservations::new(None, Millis(5));
        assert_eq!(fresh.reserve(&b(10, 1000, 10, 4), 3), (Millis(5), 1));
        assert_eq!(fresh.reserve(&f, 3), (Millis(205), 0));
    }
}
