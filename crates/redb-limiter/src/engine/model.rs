//! Test oracles shared by the property tests and the fuzz targets (the `model` feature):
//!
//! - [`Reference`]: a brute-force limiter that keeps every grant as its own entry and recomputes
//!   each decision from scratch, straight from the spec's rules (sections 3 and 9), with time
//!   stepping forward only between operations ([`Reference::advance`] before each).
//! - [`EffectLog`]: what the store would hold, as plain maps the effects are applied to (as
//!   redb's fuzzer keeps a `BTreeMap` beside the real table), and an engine rebuilt from it.
//!
//! The line in the reference (section 12): every live ticket with the request it binds; a
//! bucket's line is recomputed from them at each decision, oldest number first. Section 12.9's
//! reserved instants are found by trying every instant at which something leaves a window, one
//! after the other, from scratch for each ticket (the engine walks once).
//!
//! Token buckets in the reference (section 13): a level is kept as written (in units of `1/perMs`
//! of a token, at its instant, under the figures that wrote it) and each request reads it with
//! its own figures as judged, refilling it one millisecond at a time since it was written;
//! `retryAt` is found by stepping a millisecond at a time until it fits, and a line's
//! reservations the same way; a backfill is checked by reserving again with the take counted and
//! comparing every instant. A bucket's figures change when its ceiling moves (section 14); the
//! property test names each key with one set of figures at any one instant (section 13 leaves
//! figures that differ at once to a documented answer, which the reference does not model), and
//! a level above the burst read (written before a cut) is taken from as read, not refilled, and
//! kept under the figures that wrote it, as `token_bucket.rs` documents.
//!
//! Rule 3 in the reference: a bucket keeps its grants for the longest `perMs` any acquire
//! (granted or refused, whatever its cost; never a peek) named for it while it was not idle; a
//! bucket with no kept grant and no unlapsed place is idle and keeps nothing, not even that
//! length. It is slow on purpose and never used in serving.
//!
//! Adaptive ceilings in the reference (section 14), written from the spec rather than from
//! `ceiling.rs`, on windows and token buckets alike: each adapted limit is judged with its
//! bucket's `C` (clamped to the limit's own `[min, max]`) in place of a window's `calls` or a
//! token bucket's `refill`, its burst scaled with it, and a permit keeps, per adapted limit of
//! its grant, whether the ceiling was in play just after it (a window holding at least half of
//! `C`; a token bucket's level, after the take, at most half its scaled burst). "Granted at or
//! after the latest cut" is the order of events itself: every grant and every cut takes the next
//! number of one counter ([`Reference::seq`]), so a grant and a cut in one millisecond are
//! ordered as they were made (the engine orders them by counting cuts). A ceiling that may go (its bucket keeps nothing,
//! and it is at `max` or an hour past its latest signal) goes when the engine forgets it, which
//! must be by the next sweep ([`Reference::sync_ceilings`]).

use std::collections::BTreeMap;

use super::token_bucket::kept_full_ms;
use super::{
    BucketLevel, BucketMeta, Ceiling, Effect, Engine, EngineConfig, Facts, Figures, LATE_AFTER_MS, PermitId,
    PermitState, Reason, RequestRecord, TicketId, TicketState,
};
use crate::request::{AcquireRequest, Adapt, BucketLimit, Cost, Limit, Signal};
use crate::time::Millis;

/// A live ticket in the reference: what it binds, and its instants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefTicket {
    pub id: TicketId,
    pub state: TicketState,
    /// It never lapses after this (section 12.9), but for a restart's grace.
    pub deadline: Millis,
}

/// A permit in the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefPermit {
    pub at: Millis,
    pub expires: Millis,
    pub places: Vec<(String, Millis)>,
    /// (bucket, what the grant counts there now, the bucket's calls at the grant)
    pub windows: Vec<(String, u64, u64)>,
    /// The figures each token bucket of its grant was judged with (a settle reads them).
    pub tokens: Vec<(String, BucketLimit)>,
    /// Where an outcome on it counts (section 14): one entry per adapted limit of its grant.
    pub adapted: Vec<RefShare>,
    /// Its grant's place in the order of events (see [`Reference::seq`]).
    pub seq: u64,
}

/// An adapted limit of a permit's grant in the reference (section 14).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefShare {
    pub bucket: String,
    pub adapt: Adapt,
    /// The limit's own `calls` (a bucket's `refill`).
    pub start: u64,
    pub per_ms: u64,
    /// The ceiling was in play at the grant.
    pub in_play: bool,
    /// An outcome counted here already.
    pub signalled: bool,
}

/// A bucket's adaptive ceiling in the reference (section 14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefCeiling {
    pub c: u64,
    /// The `max` of the latest outcome that counted.
    pub max: u64,
    pub cut_at: Option<Millis>,
    /// The latest cut's place in the order of events.
    pub cut_seq: u64,
    pub grown_at: Option<Millis>,
    pub signal_at: Millis,
}

/// A token bucket's level in the reference (section 13): `units` (in `1/perMs` of a token)
/// written at `at` under the figures `b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefLevel {
    pub units: i128,
    pub at: Millis,
    pub b: BucketLimit,
}

impl RefLevel {
    /// The level at `now` read with the figures `r` (a request's own, as judged): refilled a
    /// millisecond at a time since it was written at `r`'s refill, up to `r`'s burst (a level
    /// already above it is kept as it is). Figures other than the ones that wrote it arise when
    /// hosts name a bucket differently (section 13) and when its ceiling moved since (section 14):
    /// each request reads the level kept with its own.
    #[must_use]
    pub fn read(&self, r: &BucketLimit, now: Millis) -> i128 {
        let (mut units, mut t) = (self.units, self.at);
        while t < now && units < i128::from(r.burst) * i128::from(r.per_ms) {
            units = refill_ms(units, r);
            t = t.plus(1);
        }
        units
    }

    /// Whether the figures `r` read it above their burst (written under a larger one, or before
    /// a cut): then it is neither refilled nor cut by the reading.
    #[must_use]
    pub fn above(&self, r: &BucketLimit) -> bool {
        self.units > i128::from(r.burst) * i128::from(r.per_ms)
    }

    /// The first instant at which it stands full under the figures that wrote it.
    #[must_use]
    pub fn full_at(&self) -> Millis {
        let (mut units, mut t) = (self.units, self.at);
        while units < i128::from(self.b.burst) * i128::from(self.b.per_ms) {
            units = refill_ms(units, &self.b);
            t = t.plus(1);
        }
        t
    }
}

/// Section 14: a ceiling below its `max` is kept at least an hour after its latest signal.
const CEILING_KEPT_MS: u64 = 3_600_000;

/// The brute-force reference limiter.
#[derive(Debug, Default, Clone)]
pub struct Reference {
    /// The grants each bucket keeps, one entry per grant: (instant, cost, the permit that may
    /// settle it).
    pub grants: BTreeMap<String, Vec<(Millis, u64, Option<PermitId>)>>,
    /// How long each non-idle bucket keeps its grants.
    pub retain: BTreeMap<String, u64>,
    /// Live permits; removed on release.
    pub permits: BTreeMap<PermitId, RefPermit>,
    pub throttles: BTreeMap<String, Millis>,
    /// Every grant ever (instant, cost capped at calls and as settled while kept, permit), per
    /// bucket.
    pub history: BTreeMap<String, Vec<(Millis, u64, Option<PermitId>)>>,
    /// Buckets whose window may hold more than granted (a settle up) or was named with more than
    /// one `perMs`: [`Reference::max_window_use`] does not bound them.
    pub unbounded: std::collections::BTreeSet<String>,
    /// The `perMs` each bucket was first named with.
    pub first_per_ms: BTreeMap<String, u64>,
    /// Live tickets by number (lapsed ones leave at [`Reference::advance`]).
    pub tickets: BTreeMap<u64, RefTicket>,
    /// Token buckets not forgotten: each level as last written. One full under the figures
    /// that wrote it for `kept_full_ms` with no place held is forgotten.
    pub levels: BTreeMap<String, RefLevel>,
    /// The reference's last instant (levels stand at it).
    pub at: Millis,
    /// Adaptive ceilings kept (section 14), by bucket.
    pub ceilings: BTreeMap<String, RefCeiling>,
    /// The order of events: every grant and every cut takes the next number, so "granted at or
    /// after the latest cut" is read as the order they were made in, whatever their
    /// milliseconds.
    pub seq: u64,
}

/// One millisecond of refill: `refill` units, up to `burst` tokens (a level above is kept).
fn refill_ms(units: i128, b: &BucketLimit) -> i128 {
    let cap = i128::from(b.burst) * i128::from(b.per_ms);
    if units >= cap { units } else { (units + i128::from(b.refill)).min(cap) }
}

/// A token bucket's level `level` (`None`: not kept, so at `initial`) read with `b` at `now`.
fn read_level(level: Option<&RefLevel>, b: &BucketLimit, now: Millis) -> i128 {
    level.map_or(i128::from(b.initial) * i128::from(b.per_ms), |l| l.read(b, now))
}

/// The units a cost takes: `min(cost, burst)` tokens.
fn need_units(b: &BucketLimit, cost: u64) -> i128 {
    i128::from(cost.min(b.burst)) * i128::from(b.per_ms)
}

impl Reference {
    /// Moves time to `now`: buckets forget the grants they no longer keep, and idle buckets
    /// forget their retention.
    pub fn advance(&mut self, now: Millis) {
        // A level that has stood full for its keeping time with no place held is forgotten
        // (places only lapse meanwhile, so looking at `now` is looking at the first instant it
        // could be).
        let keys: Vec<String> = self.levels.keys().cloned().collect();
        for key in keys {
            let l = self.levels[&key];
            if now >= l.full_at().plus(kept_full_ms(l.b.per_ms)) && self.live_places(&key, now).next().is_none() {
                self.levels.remove(&key);
            }
        }
        self.at = self.at.max(now);
        self.tickets.retain(|_, t| t.state.lapse_at > now);
        let keys: Vec<String> = self.grants.keys().chain(self.retain.keys()).cloned().collect();
        for key in keys {
            let retain = self.retain.get(&key).copied().unwrap_or(0);
            if let Some(g) = self.grants.get_mut(&key) {
                g.retain(|(t, _, _)| t.plus(retain) > now);
                if g.is_empty() {
                    self.grants.remove(&key);
                }
            }
            if self.is_idle(&key, now) {
                self.retain.remove(&key);
            }
        }
    }

    fn is_idle(&self, key: &str, now: Millis) -> bool {
        !self.grants.contains_key(key) && self.live_places(key, now).next().is_none()
    }

    fn live_places<'a>(&'a self, key: &'a str, now: Millis) -> impl Iterator<Item = Millis> + 'a {
        self.permits.values().flat_map(|p| &p.places).filter(move |(b, l)| b == key && *l > now).map(|(_, l)| *l)
    }

    /// The cost counting in `key` under a window of `per_ms` at `now`, oldest first.
    fn live(&self, key: &str, per_ms: u64, now: Millis) -> Vec<(Millis, u64)> {
        self.grants
            .get(key)
            .map(|g| g.iter().filter(|(t, _, _)| t.plus(per_ms) > now).map(|(t, c, _)| (*t, *c)).collect())
            .unwrap_or_default()
    }

    /// When the window `calls`/`per_ms` of `key` has room for `cost` (capped at `calls`), or
    /// `None` when it has room at `now`: the first grant whose leaving makes room.
    fn room_at(&self, key: &str, calls: u64, per_ms: u64, cost: u64, now: Millis) -> Option<Millis> {
        let live = self.live(key, per_ms, now);
        let used: u64 = live.iter().map(|(_, c)| c).sum();
        if cost == 0 || used + cost <= calls {
            return None;
        }
        let mut left = used;
        let at = live
            .iter()
            .find_map(|(t, c)| {
                left -= c;
                (left + cost <= calls).then_some(t.plus(per_ms))
            })
            .expect("a cost capped at calls fits in an empty window");
        Some(at)
    }

    /// The level of token bucket `key` read with `b` at the reference's instant: its `initial`
    /// when not kept.
    fn level(&self, key: &str, b: &BucketLimit) -> i128 {
        read_level(self.levels.get(key), b, self.at)
    }

    /// The level of token bucket `key` after a grant at the reference's instant that takes
    /// `min(cost, burst)` with the figures `b` (rule B). A level above `b`'s burst (written under
    /// a larger one, or before a cut) is taken from as read, not refilled (so a bucket after a
    /// cut grants at most its level plus `C` a `perMs`), and kept under the figures that wrote it.
    fn taken(&self, key: &str, b: &BucketLimit, cost: u64) -> RefLevel {
        let now = self.at;
        match self.levels.get(key) {
            Some(l) if l.above(b) => {
                let units = l.units - i128::from(cost.min(b.burst)) * i128::from(l.b.per_ms);
                RefLevel { units, at: now, b: l.b }
            }
            _ => RefLevel { units: self.level(key, b) - need_units(b, cost), at: now, b: *b },
        }
    }

    /// The first instant from `at` on at which a level of `units` at `at`, refilling, reaches
    /// `cost` (capped at burst), stepped a millisecond at a time; and the level then.
    fn tokens_room(mut units: i128, b: &BucketLimit, cost: u64, mut at: Millis) -> (Millis, i128) {
        while units < need_units(b, cost) {
            units = refill_ms(units, b);
            at = at.plus(1);
        }
        (at, units)
    }

    /// The reserved instants of the tickets that hold in token bucket `key`'s line, by number,
    /// from the level `level` at `now` (`None`: not kept), each read with the ticket's own
    /// figures and taken at its instant (section 12.9 with 13); and the level and instant after
    /// the last of them.
    fn token_reservations(
        &self,
        key: &str,
        now: Millis,
        mine: Option<u64>,
        level: Option<RefLevel>,
    ) -> (Vec<(u64, Millis)>, Option<RefLevel>, Millis) {
        let (mut at, mut level) = (now, level);
        let mut out = Vec::new();
        for t in self.holding(key, now, mine) {
            let bound = self.bound(t, key);
            let Some(b) = bound.bucket else { continue };
            if bound.cost.min(b.burst) == 0 {
                continue;
            }
            let units;
            (at, units) = Self::tokens_room(read_level(level.as_ref(), &b, at), &b, bound.cost, at);
            level = Some(RefLevel { units: units - need_units(&b, bound.cost), at, b });
            out.push((t.id.number(), at));
        }
        (out, level, at)
    }

    /// The refusal that stands for `r` at `now` as (retryAt, reason, key), or `None` to grant,
    /// for a request without a live ticket.
    #[must_use]
    pub fn decide(&self, r: &AcquireRequest, now: Millis, recheck_ms: u64) -> Option<(Millis, Reason, String)> {
        self.decide_as(r, now, recheck_ms, Some(None))
    }

    /// The live tickets waiting in `bucket`, oldest first (number, ticket).
    pub fn line<'a>(&'a self, bucket: &'a str) -> impl Iterator<Item = (u64, &'a RefTicket)> + 'a {
        self.tickets.iter().filter(move |(_, t)| t.state.limits.iter().any(|l| l.key == bucket)).map(|(n, t)| (*n, t))
    }

    /// The live ticket numbered `number` is the oldest live ticket.
    #[must_use]
    pub fn is_oldest(&self, number: u64) -> bool {
        self.tickets.keys().next() == Some(&number)
    }

    /// [`Reference::decide`] for a request presenting the live ticket `mine` (`Some(None)`:
    /// none), or with rule Q left out (`None`: the request alone, rules 1 to 6).
    #[must_use]
    pub fn decide_as(
        &self,
        r: &AcquireRequest,
        now: Millis,
        recheck_ms: u64,
        mine: Option<Option<u64>>,
    ) -> Option<(Millis, Reason, String)> {
        let judged = self.judge(r);
        let r = &judged;
        let mut worst: Option<(Millis, Reason, String)> = None;
        let mut consider = |at: Millis, reason: Reason, key: &str| {
            if worst.as_ref().is_none_or(|(w, _, _)| at > *w) {
                worst = Some((at, reason, key.to_owned()));
            }
        };
        if let Some(&until) = self.throttles.get(&r.key)
            && until > now
        {
            consider(until, Reason::Throttle, &r.key);
        }
        for l in &r.limits {
            if let Some(b) = l.bucket
                && l.cost > 0
            {
                let (at, _) = Self::tokens_room(self.level(&l.key, &b), &b, l.cost, now);
                if at > now {
                    consider(at, Reason::Rate, &l.key);
                }
            }
            if let Some(w) = l.window
                && let Some(at) = self.room_at(&l.key, w.calls, w.per_ms, l.cost.min(w.calls), now)
            {
                consider(at, Reason::Rate, &l.key);
            }
            // Rule Q as section 12.9 bounds it.
            if let Some(mine) = mine
                && let Some(at) = self.line_says(l, now, recheck_ms, mine)
            {
                let counts = l.window.is_some() || l.bucket.is_some();
                consider(at, if counts { Reason::Rate } else { Reason::Concurrency }, &l.key);
            }
            if let Some(c) = l.concurrent {
                let mut lapses: Vec<Millis> = self.live_places(&l.key, now).collect();
                lapses.sort();
                let held = lapses.len() as u64;
                if held >= c {
                    consider(lapses[(held - c) as usize].min(now.plus(recheck_ms)), Reason::Concurrency, &l.key);
                }
            }
        }
        worst
    }

    /// The tickets of `bucket`'s line that hold at `now` (live, their caller not throttled, and
    /// not one that takes only a window there while its `retryAt` lies a window or more ahead),
    /// older than `mine` (`None`: every one), oldest first.
    pub fn holding<'a>(
        &'a self,
        bucket: &'a str,
        now: Millis,
        mine: Option<u64>,
    ) -> impl Iterator<Item = &'a RefTicket> + 'a {
        let far = move |t: &RefTicket| {
            t.state.limits.iter().any(|l| {
                l.key == bucket
                    && l.bucket.is_none()
                    && l.concurrent.is_none()
                    && l.window.is_some_and(|w| now.plus(w.per_ms) <= t.state.retry_at)
            })
        };
        self.line(bucket)
            .filter(move |(n, _)| mine.is_none_or(|m| *n < m))
            .map(|(_, t)| t)
            .filter(move |t| self.throttles.get(&*t.state.key).is_none_or(|u| *u <= now))
            .filter(move |t| !far(t))
    }

    /// The cost counting at `t` in a window of `per_ms` of `bucket`: the grants that count at
    /// `now` and still do at `t`, and the `reserved` costs at their instants.
    fn use_at(&self, bucket: &str, per_ms: u64, now: Millis, t: Millis, reserved: &[(Millis, u64)]) -> u64 {
        let kept: u64 =
            self.live(bucket, per_ms, now).iter().filter(|(at, _)| at.plus(per_ms) > t).map(|(_, c)| c).sum();
        kept + reserved.iter().filter(|(at, _)| *at <= t && at.plus(per_ms) > t).map(|(_, c)| c).sum::<u64>()
    }

    /// The first instant from `from` on at which a window `calls`/`per_ms` of `bucket` has room
    /// for `cost` beside the `reserved` costs, tried at `from` and every later instant something
    /// leaves; with the cost counting there then.
    fn first_room(
        &self,
        bucket: &str,
        (calls, per_ms, cost): (u64, u64, u64),
        now: Millis,
        from: Millis,
        reserved: &[(Millis, u64)],
    ) -> (Millis, u64) {
        let mut tries: Vec<Millis> = self
            .live(bucket, per_ms, now)
            .iter()
            .map(|(at, _)| at.plus(per_ms))
            .chain(reserved.iter().map(|(at, _)| at.plus(per_ms)))
            .filter(|t| *t > from)
            .collect();
        tries.push(from);
        tries.sort();
        tries
            .into_iter()
            .map(|t| (t, self.use_at(bucket, per_ms, now, t, reserved)))
            .find(|(_, used)| used + cost <= calls)
            .expect("a cost capped at calls fits once everything has left")
    }

    /// The reserved instants of the tickets that hold in `bucket`'s line (section 12.9), by
    /// number, each with the cost counting there before it: those with a window of a cost there.
    #[must_use]
    pub fn reservations(&self, bucket: &str, now: Millis, mine: Option<u64>) -> Vec<(u64, Millis, u64)> {
        let mut reserved: Vec<(Millis, u64)> = Vec::new();
        let mut out = Vec::new();
        for t in self.holding(bucket, now, mine) {
            let bound = self.bound(t, bucket);
            let Some(w) = bound.window else { continue };
            let c = bound.cost.min(w.calls);
            if c == 0 {
                continue;
            }
            let from = reserved.last().map_or(now, |(at, _)| *at);
            let (at, used) = self.first_room(bucket, (w.calls, w.per_ms, c), now, from, &reserved);
            reserved.push((at, c));
            out.push((t.id.number(), at, used));
        }
        out
    }

    /// Rule Q in the bucket of limit `l` for a request presenting ticket `mine`: `None` when
    /// the line lets it through (nobody older holds, or it backfills), else its instant.
    fn line_says(&self, l: &crate::request::Limit, now: Millis, recheck_ms: u64, mine: Option<u64>) -> Option<Millis> {
        let first = self.holding(&l.key, now, mine).next()?;
        let cost = l.window.map_or(0, |w| l.cost.min(w.calls));
        let reservations = self.reservations(&l.key, now, mine);
        // A token bucket: reserved again with this request's take counted, no instant moves.
        let kept = self.levels.get(&l.key).copied();
        let token_reserved = l.bucket.map(|_| self.token_reservations(&l.key, now, mine, kept));
        let token_backfills = match (l.bucket, &token_reserved) {
            (Some(b), Some((reserved, _, _))) if l.cost.min(b.burst) > 0 => {
                let taken = self.taken(&l.key, &b, l.cost);
                self.token_reservations(&l.key, now, mine, Some(taken)).0 == *reserved
            }
            _ => true,
        };
        let backfills = l.concurrent.is_none()
            && token_backfills
            && reservations.iter().all(|(n, at, used)| {
                let bound = self.bound(&self.tickets[n], &l.key);
                let w = bound.window.expect("reserved");
                now.plus(w.per_ms) <= *at || used + bound.cost.min(w.calls) + cost <= w.calls
            });
        if backfills {
            return None;
        }
        let mut at = now.plus(1);
        if let Some(w) = l.window
            && cost > 0
        {
            let reserved: Vec<(Millis, u64)> = reservations
                .iter()
                .map(|(n, at, _)| {
                    let bound = self.bound(&self.tickets[n], &l.key);
                    (*at, bound.cost.min(bound.window.expect("reserved").calls))
                })
                .collect();
            let from = reserved.last().map_or(now, |(at, _)| *at);
            at = at.max(self.first_room(&l.key, (w.calls, w.per_ms, cost), now, from, &reserved).0);
        }
        if let Some(b) = l.bucket
            && l.cost.min(b.burst) > 0
            && let Some((_, left, from)) = token_reserved
        {
            // Behind every reservation: the level after their takes, from the last instant.
            at = at.max(Self::tokens_room(read_level(left.as_ref(), &b, from), &b, l.cost, from).0);
        }
        if let Some(c) = l.concurrent {
            let mut lapses: Vec<Millis> = self.live_places(&l.key, now).collect();
            lapses.sort();
            let held = lapses.len() as u64;
            let wanting = self
                .holding(&l.key, now, mine)
                .filter(|t| t.state.limits.iter().any(|b| b.key == l.key && b.concurrent.is_some()))
                .count() as u64;
            let need = held + wanting + 1;
            let place = if need > c && need - c <= held {
                lapses[(need - c - 1) as usize]
            } else if first.state.retry_at > now {
                first.state.retry_at
            } else if now.0 - first.state.retry_at.0 <= LATE_AFTER_MS {
                now.plus(1)
            } else {
                now.plus(recheck_ms)
            };
            at = at.max(place.min(now.plus(recheck_ms)));
        }
        Some(at)
    }

    /// The figures of section 9.1 for `r` at `now`.
    #[must_use]
    pub fn figures(&self, own: &AcquireRequest, now: Millis) -> Vec<Figures> {
        let r = self.judge(own);
        r.limits
            .iter()
            .zip(&own.limits)
            .map(|(l, own)| Figures {
                key: l.key.clone(),
                window: l.window.map(|w| {
                    let used: u64 = self.live(&l.key, w.per_ms, now).iter().map(|(_, c)| c).sum();
                    (used, w.calls.saturating_sub(used))
                }),
                places: l.concurrent.map(|c| {
                    let held = self.live_places(&l.key, now).count() as u64;
                    (held, c.saturating_sub(held))
                }),
                bucket: l.bucket.map(|b| (self.level(&l.key, &b).div_euclid(i128::from(b.per_ms)) as i64, b.burst)),
                queued: {
                    let queued = self.line(&l.key).count() as u64;
                    (r.in_line() || queued > 0).then_some(queued)
                },
                ceiling: own.adapt.map(|a| self.c_of(&own.key, &a, own.nominal_calls().expect("adapts"))),
            })
            .collect()
    }

    /// The live ticket `r` presents, by number: `Ok(None)` when it presents none or one not
    /// live (unknown, ended, lapsed), `Err(())` when it is bound to another request.
    #[allow(clippy::result_unit_err)]
    pub fn presented(&self, r: &AcquireRequest) -> Result<Option<u64>, ()> {
        let Some(id) = r.ticket.as_deref().and_then(|t| t.parse::<TicketId>().ok()) else { return Ok(None) };
        match self.tickets.get(&id.number()) {
            Some(t) if t.id == id => {
                let mut limits = r.limits.clone();
                limits.sort_by(|a, b| a.key.cmp(&b.key));
                if *t.state.key == *r.key && t.state.limits == limits { Ok(Some(id.number())) } else { Err(()) }
            }
            _ => Ok(None),
        }
    }

    /// Files ticket `id` for `r`, refused at `now` until `retry_at`, under a horizon of
    /// `horizon_ms` (section 12.9).
    pub fn file(&mut self, id: TicketId, r: &AcquireRequest, retry_at: Millis, now: Millis, horizon_ms: u64) {
        let deadline = now.plus(horizon_ms);
        let mut limits = r.limits.clone();
        limits.sort_by(|a, b| a.key.cmp(&b.key));
        let state = TicketState {
            filed_at: now,
            retry_at,
            lapse_at: retry_at.plus(r.grace_ms).min(deadline),
            grace_ms: r.grace_ms,
            key: r.key.as_str().into(),
            limits,
            deadline: Some(deadline),
        };
        self.tickets.insert(id.number(), RefTicket { id, state, deadline });
    }

    /// Ticket `number` asked again and refused until `retry_at`.
    pub fn renew(&mut self, number: u64, retry_at: Millis, grace_ms: u64) {
        let t = self.tickets.get_mut(&number).expect("live");
        t.state.retry_at = retry_at;
        t.state.lapse_at = retry_at.plus(grace_ms).min(t.deadline);
        t.state.grace_ms = grace_ms;
    }

    /// The most live tickets ahead of ticket `number` in any one of its lines.
    #[must_use]
    pub fn ahead(&self, number: u64) -> u64 {
        let t = &self.tickets[&number];
        t.state.limits.iter().map(|l| self.line(&l.key).filter(|(n, _)| *n < number).count() as u64).max().unwrap_or(0)
    }

    /// A restart at `now` of a file whose latest instant is `floor` (section 12.6): every
    /// ticket live at `floor` lapses no sooner than `now` plus its grace; the file keeps each
    /// ticket's own horizon (a ticket of an older file is bounded by the server's, `horizon_ms`,
    /// from its filing).
    pub fn restart(&mut self, floor: Millis, now: Millis, horizon_ms: u64) {
        self.tickets.retain(|_, t| t.state.lapse_at > floor);
        for t in self.tickets.values_mut() {
            t.state.lapse_at = t.state.lapse_at.max(now.plus(t.state.grace_ms));
            let horizon_end = t.state.deadline.unwrap_or_else(|| t.state.filed_at.plus(horizon_ms));
            t.deadline = horizon_end.max(t.state.lapse_at);
        }
    }

    fn note_per_ms(&mut self, key: &str, per_ms: u64) {
        if *self.first_per_ms.entry(key.to_owned()).or_insert(per_ms) != per_ms {
            self.unbounded.insert(key.to_owned());
        }
    }

    /// Rule 3: naming `per_ms` makes a non-idle bucket keep its grants at least that long.
    fn lengthen(&mut self, key: &str, per_ms: u64, now: Millis) {
        if !self.is_idle(key, now) {
            let retain = self.retain.entry(key.to_owned()).or_insert(0);
            *retain = (*retain).max(per_ms);
        }
    }

    /// A refused acquire of `r` at `now`: it lengthens the retention of the buckets it names,
    /// and a token bucket named for the first time starts at `initial`.
    pub fn refuse(&mut self, r: &AcquireRequest, now: Millis) {
        let r = &self.judge(r);
        for l in &r.limits {
            if let Some(w) = l.window {
                self.note_per_ms(&l.key, w.per_ms);
                self.lengthen(&l.key, w.per_ms, now);
            }
            self.name_bucket(l);
        }
    }

    /// A token bucket named by an acquire starts at `initial` when not kept (a full one is
    /// forgotten at once).
    fn name_bucket(&mut self, l: &Limit) {
        if let Some(b) = l.bucket
            && b.initial < b.burst
        {
            let at = self.at;
            self.levels.entry(l.key.clone()).or_insert(RefLevel {
                units: i128::from(b.initial) * i128::from(b.per_ms),
                at,
                b,
            });
        }
    }

    /// Records a grant of `r` at `now` holding `permit`.
    pub fn grant(&mut self, own: &AcquireRequest, now: Millis, permit: Option<PermitId>) {
        let r = &self.judge(own);
        self.seq += 1;
        let mut places = Vec::new();
        let mut windows = Vec::new();
        let mut tokens = Vec::new();
        for (l, own) in r.limits.iter().zip(&own.limits) {
            if let (Some(w), Some(calls)) = (l.window, own.window.map(|w| w.calls))
                && w.calls > calls
            {
                // Judged above its own `calls`: its window may hold more.
                self.unbounded.insert(l.key.clone());
            }
            if let Some(b) = l.bucket {
                let cost = l.cost.min(b.burst);
                if cost > 0 {
                    let level = self.taken(&l.key, &b, cost);
                    self.levels.insert(l.key.clone(), level);
                } else {
                    self.name_bucket(l);
                }
                if permit.is_some() {
                    windows.push((l.key.clone(), cost, b.burst));
                    tokens.push((l.key.clone(), b));
                }
            }
            if let Some(w) = l.window {
                self.note_per_ms(&l.key, w.per_ms);
                let cost = l.cost.min(w.calls);
                if cost > 0 || permit.is_some() {
                    self.grants.entry(l.key.clone()).or_default().push((now, cost, permit));
                    self.history.entry(l.key.clone()).or_default().push((now, cost, permit));
                    let retain = self.retain.entry(l.key.clone()).or_insert(0);
                    *retain = (*retain).max(w.per_ms);
                    windows.push((l.key.clone(), cost, w.calls));
                } else {
                    self.lengthen(&l.key, w.per_ms, now);
                }
            }
            if l.concurrent.is_some() {
                places.push((l.key.clone(), now.plus(l.hold_ms)));
            }
        }
        if let Some(id) = permit {
            let last = places.iter().map(|(_, l)| *l).max().unwrap_or(Millis::ZERO);
            let expires = if r.permit { last.max(now.plus(r.hold_ms)) } else { last };
            let adapted = r.limits.iter().zip(&own.limits).filter_map(|(l, own)| self.share(l, own, now)).collect();
            self.permits.insert(id, RefPermit { at: now, expires, places, windows, tokens, adapted, seq: self.seq });
        }
    }

    /// A settle: `Ok(false)` for a permit not live, `Err(())` for a key not a window of its grant.
    #[allow(clippy::result_unit_err)]
    pub fn settle(&mut self, id: Option<PermitId>, costs: &[Cost], now: Millis) -> Result<bool, ()> {
        let Some(id) = id.filter(|id| self.permits.get(id).is_some_and(|p| p.expires > now)) else {
            return Ok(false);
        };
        let permit = self.permits.get_mut(&id).expect("live");
        if costs.iter().any(|c| !permit.windows.iter().any(|(b, _, _)| *b == c.key)) {
            return Err(());
        }
        for c in costs {
            let share = permit.windows.iter_mut().find(|(b, _, _)| *b == c.key).expect("checked");
            let new = c.cost.min(share.2);
            if let Some((_, b)) = permit.tokens.iter().find(|(k, _)| *k == c.key) {
                if new == share.1 {
                    continue;
                }
                // Section 13: the difference goes back (never above burst) or is taken, read
                // with the figures of the grant (a bucket forgotten meanwhile was full).
                let per = i128::from(b.per_ms);
                let cap = i128::from(b.burst) * per;
                let (old, new) = (i128::from(share.1), i128::from(new));
                share.1 = new as u64;
                let level = match self.levels.get(&c.key) {
                    Some(l) if l.above(b) => {
                        // Above the grant's burst: nothing goes back, and a debt is taken from
                        // the level as read (not refilled), under the figures that wrote it.
                        RefLevel { units: l.units - (new - old).max(0) * per, at: now, b: l.b }
                    }
                    kept => {
                        let units = kept.map_or(cap, |l| l.read(b, now));
                        let after = if new < old {
                            units.max((units + (old - new) * per).min(cap))
                        } else {
                            units - (new - old) * per
                        };
                        RefLevel { units: after, at: now, b: *b }
                    }
                };
                self.levels.insert(c.key.clone(), level);
                continue;
            }
            let kept = self.grants.get_mut(&c.key).and_then(|g| g.iter_mut().find(|(_, _, p)| *p == Some(id)));
            if let Some(grant) = kept {
                if new > grant.1 {
                    self.unbounded.insert(c.key.clone());
                }
                grant.1 = new;
                share.1 = new;
                let past = self.history.get_mut(&c.key).and_then(|g| g.iter_mut().rfind(|(_, _, p)| *p == Some(id)));
                past.expect("a kept grant is in the history").1 = new;
            }
        }
        Ok(true)
    }

    /// A release: true when the permit was live.
    pub fn release(&mut self, id: Option<PermitId>, now: Millis) -> bool {
        id.and_then(|id| self.permits.remove(&id)).is_some_and(|p| p.expires > now)
    }

    /// A throttle: the one in force afterwards.
    pub fn throttle(&mut self, key: &str, until: Millis, now: Millis) -> Option<Millis> {
        let current = self.throttles.get(key).copied().filter(|u| *u > now);
        if until > now && current.is_none_or(|c| until > c) {
            self.throttles.insert(key.to_owned(), until);
            return Some(until);
        }
        current
    }

    /// A lift: true when a throttle was in force.
    pub fn lift(&mut self, key: &str, now: Millis) -> bool {
        self.throttles.remove(key).is_some_and(|u| u > now)
    }

    /// The facts the engine must hold at `now`.
    #[must_use]
    pub fn facts(&self, now: Millis) -> Facts {
        let mut facts = Facts::default();
        let keys = self.grants.keys().chain(self.permits.values().flat_map(|p| &p.places).map(|(b, _)| b));
        for key in keys {
            if facts.buckets.contains_key(key) {
                continue;
            }
            let mut grants: Vec<(Millis, u64)> = Vec::new();
            for &(t, c, _) in self.grants.get(key).into_iter().flatten() {
                match grants.last_mut() {
                    Some(last) if last.0 == t => last.1 += c,
                    _ => grants.push((t, c)),
                }
            }
            let mut places: Vec<(Millis, PermitId)> = self
                .permits
                .iter()
                .flat_map(|(id, p)| p.places.iter().filter(|(b, l)| b == key && *l > now).map(|(_, l)| (*l, *id)))
                .collect();
            places.sort();
            if !grants.is_empty() || !places.is_empty() {
                facts.buckets.insert(key.clone(), (grants, places));
            }
        }
        for (k, u) in &self.throttles {
            if *u > now {
                facts.throttles.insert(k.clone(), *u);
            }
        }
        for (id, p) in &self.permits {
            if p.expires > now {
                let shares = p.windows.iter().map(|(b, c, _)| (b.clone(), *c)).collect();
                facts.permits.insert(*id, (p.at, p.expires, shares));
            }
        }
        for (key, l) in &self.levels {
            let units = l.read(&l.b, now);
            if units < i128::from(l.b.burst) * i128::from(l.b.per_ms) {
                facts.levels.insert(key.clone(), units.div_euclid(i128::from(l.b.per_ms)) as i64);
            }
        }
        for (number, t) in &self.tickets {
            if t.state.lapse_at > now {
                facts.tickets.insert(t.id, t.state.clone());
                for l in &t.state.limits {
                    facts.lines.entry(l.key.clone()).or_default().push((*number, t.state.lapse_at));
                }
            }
        }
        facts
    }

    /// The instants after `now` at which something leaves: window edges, lapses, permit ends,
    /// throttle ends.
    #[must_use]
    pub fn edges(&self, now: Millis) -> Vec<Millis> {
        let mut edges: Vec<Millis> = self
            .grants
            .iter()
            .flat_map(|(k, g)| {
                let per = self.retain.get(k).copied().unwrap_or(0);
                g.iter().map(move |(t, _, _)| t.plus(per))
            })
            .chain(
                self.first_per_ms
                    .iter()
                    .flat_map(|(k, per)| self.grants.get(k).into_iter().flatten().map(move |(t, _, _)| t.plus(*per))),
            )
            .chain(self.permits.values().flat_map(|p| p.places.iter().map(|(_, l)| *l).chain([p.expires])))
            .chain(self.throttles.values().copied())
            .chain(self.tickets.values().flat_map(|t| [t.state.retry_at, t.state.lapse_at]))
            .filter(|&t| t > now)
            .collect();
        edges.sort();
        edges.dedup();
        edges
    }

    /// The most any window of `per_ms` of `bucket` ever held (as settled): checked against
    /// `calls` for the buckets not in [`Reference::unbounded`].
    #[must_use]
    pub fn max_window_use(&self, bucket: &str, per_ms: u64) -> u64 {
        let grants = self.history.get(bucket).map(Vec::as_slice).unwrap_or_default();
        grants
            .iter()
            .map(|(start, _, _)| {
                grants.iter().filter(|(t, _, _)| t >= start && *t < start.plus(per_ms)).map(|(_, c, _)| c).sum()
            })
            .max()
            .unwrap_or(0)
    }
}

/// Adaptive ceilings (section 14), written from the spec alone.
impl Reference {
    /// `C` as a limit with `adapt` and its own `start` (`calls` or `refill`) is judged in `key`:
    /// the ceiling kept there, or `start` when none is, within the limit's `[min, max]`.
    fn c_of(&self, key: &str, adapt: &Adapt, start: u64) -> u64 {
        let kept = self.ceilings.get(key).map_or(start, |k| k.c);
        kept.max(adapt.min).min(adapt.max)
    }

    /// `l` as it is judged: with `adapt`, its window's `calls` is `C`; a token bucket's `refill`
    /// is `C` and its `burst` scales with it (`floor(burst × C / refill)`, at least 1; its
    /// `initial` never above that).
    #[must_use]
    pub fn judge_limit(&self, l: &Limit) -> Limit {
        let mut judged = l.clone();
        let Some(adapt) = l.adapt else { return judged };
        if let Some(w) = &mut judged.window {
            w.calls = self.c_of(&l.key, &adapt, w.calls);
        }
        if let Some(b) = &mut judged.bucket {
            let c = self.c_of(&l.key, &adapt, b.refill);
            let burst = ((u128::from(b.burst) * u128::from(c)) / u128::from(b.refill)).max(1);
            let burst = u64::try_from(burst).expect("at most 10^9 x 10^9 / 1");
            *b = BucketLimit { refill: c, per_ms: b.per_ms, burst, initial: b.initial.min(burst) };
        }
        judged
    }

    /// `r` with every limit judged (see [`Reference::judge_limit`]).
    #[must_use]
    pub fn judge(&self, r: &AcquireRequest) -> AcquireRequest {
        let mut judged = r.clone();
        judged.limits = r.limits.iter().map(|l| self.judge_limit(l)).collect();
        judged
    }

    /// What ticket `t` binds in `key`, judged as it is now.
    fn bound(&self, t: &RefTicket, key: &str) -> Limit {
        self.judge_limit(t.state.limits.iter().find(|b| b.key == key).expect("in its line"))
    }

    /// The share a permit granted at `now` keeps of the limit `l` (judged; `own` as named), just
    /// after the grant was counted: whether the ceiling was in play then (the window holds at
    /// least half of `C`, the grant's own cost counted; a bucket's level is at most half of its
    /// burst).
    fn share(&self, l: &Limit, own: &Limit, now: Millis) -> Option<RefShare> {
        let adapt = own.adapt?;
        let (per_ms, in_play) = if let Some(w) = l.window {
            let used: u64 = self.live(&l.key, w.per_ms, now).iter().map(|(_, c)| c).sum();
            (w.per_ms, 2 * used >= w.calls)
        } else {
            let b = l.bucket?;
            (b.per_ms, 2 * self.level(&l.key, &b) <= i128::from(b.burst) * i128::from(b.per_ms))
        };
        let start = own.window.map_or_else(|| own.bucket.map(|b| b.refill), |w| Some(w.calls))?;
        Some(RefShare { bucket: l.key.clone(), adapt, start, per_ms, in_play, signalled: false })
    }

    /// An outcome on permit `id` at `now` (a `release` or `settle` with `outcome`, or a
    /// `throttle` with `permit` as `limited`): counted once per adapted bucket of its grant.
    /// False when the permit is not live, and then nothing changes.
    pub fn signal(&mut self, id: Option<PermitId>, signal: Signal, now: Millis) -> bool {
        let Some(id) = id.filter(|id| self.permits.get(id).is_some_and(|p| p.expires > now)) else {
            return false;
        };
        let granted = self.permits[&id].seq;
        for i in 0..self.permits[&id].adapted.len() {
            let share = self.permits[&id].adapted[i].clone();
            if share.signalled {
                continue;
            }
            self.permits.get_mut(&id).expect("live").adapted[i].signalled = true;
            let kept = self.ceilings.get(&share.bucket).copied();
            let adapt = share.adapt;
            let c = self.c_of(&share.bucket, &adapt, share.start);
            // Granted at or after the latest cut, in the order things happened.
            let after_cut = kept.is_none_or(|k| k.cut_at.is_none() || granted > k.cut_seq);
            let mut next = kept.unwrap_or(RefCeiling {
                c: share.start,
                max: adapt.max,
                cut_at: None,
                cut_seq: 0,
                grown_at: None,
                signal_at: now,
            });
            let mut changed = false;
            match signal {
                Signal::Limited if after_cut => {
                    next.c = (c * adapt.keep_pct / 100).max(adapt.min);
                    self.seq += 1;
                    (next.cut_at, next.cut_seq) = (Some(now), self.seq);
                    changed = true;
                }
                Signal::Clean => {
                    let window_since = next.grown_at.is_none_or(|g| now.0 - g.0 >= share.per_ms);
                    if after_cut && share.in_play && adapt.increase > 0 && c < adapt.max && window_since {
                        next.c = (c + adapt.increase).min(adapt.max);
                        next.grown_at = Some(now);
                        changed = true;
                    }
                }
                Signal::Limited => {}
            }
            if kept.is_some() || changed {
                next.max = adapt.max;
                next.signal_at = now;
                self.ceilings.insert(share.bucket.clone(), next);
            }
        }
        true
    }

    /// Whether the ceiling of `key` may be forgotten at `now`: its bucket keeps nothing (no
    /// grant, place, level or live ticket), and it is at its `max` or an hour has passed since
    /// its latest signal. The engine forgets it then or later (at a sweep, a release, a
    /// restart), never sooner.
    #[must_use]
    pub fn ceiling_may_go(&self, key: &str, now: Millis) -> bool {
        let Some(k) = self.ceilings.get(key) else { return false };
        let idle = self.is_idle(key, now) && !self.levels.contains_key(key) && self.line(key).next().is_none();
        idle && (k.c >= k.max || k.signal_at.plus(CEILING_KEPT_MS) <= now)
    }

    /// Forgets the ceilings of `keys` that the engine no longer keeps (`kept` says) when they
    /// were free to go.
    pub fn follow_forgotten<'a>(
        &mut self,
        keys: impl IntoIterator<Item = &'a str>,
        kept: impl Fn(&str) -> bool,
        now: Millis,
    ) {
        for key in keys {
            if self.ceiling_may_go(key, now) && !kept(key) {
                self.ceilings.remove(key);
            }
        }
    }

    /// Compares the ceilings the engine keeps at `now` with the reference's, and forgets in the
    /// reference those the engine forgot (each must have been free to go). After a sweep
    /// (`swept`), none that may go is still kept.
    pub fn sync_ceilings(&mut self, engine: &[(String, Ceiling)], now: Millis, swept: bool) -> Result<(), String> {
        let engine: BTreeMap<&str, &Ceiling> = engine.iter().map(|(k, c)| (k.as_str(), c)).collect();
        if let Some(extra) = engine.keys().find(|k| !self.ceilings.contains_key(**k)) {
            return Err(format!("the engine keeps a ceiling for {extra} that the reference has not"));
        }
        let keys: Vec<String> = self.ceilings.keys().cloned().collect();
        for key in keys {
            let may_go = self.ceiling_may_go(&key, now);
            let k = self.ceilings[&key];
            match engine.get(key.as_str()) {
                None if may_go => {
                    self.ceilings.remove(&key);
                }
                None => return Err(format!("the ceiling of {key} was forgotten too soon: {k:?}")),
                Some(_) if swept && may_go => return Err(format!("a sweep kept the ceiling of {key}: {k:?}")),
                Some(got) => {
                    // (Its count of cuts is how the engine orders a grant and a cut; the
                    // reference orders them by `seq`, so that count is not compared.)
                    let want = Ceiling {
                        c: k.c,
                        max: k.max,
                        cut_at: k.cut_at,
                        cuts: got.cuts,
                        grown_at: k.grown_at,
                        signal_at: k.signal_at,
                    };
                    if **got != want {
                        return Err(format!("ceiling of {key}: engine {got:?}, reference {want:?}"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Whether a refusal may push `effect`: the line's changes, rule 3's retention (and what a
/// prune or a forget reports on the way, a ceiling forgotten with its bucket too), and a token
/// bucket created at its `initial` by the refusal that first names it (section 13). Anything
/// else is a change a refusal must not make.
#[must_use]
pub fn refusal_may_push(effect: &Effect) -> bool {
    effect.is_line()
        || matches!(
            effect,
            Effect::BucketMeta { .. }
                | Effect::WindowPruned { .. }
                | Effect::BucketForgotten { .. }
                | Effect::LevelSet { .. }
                | Effect::LevelForgotten { .. }
                | Effect::CeilingForgotten { .. }
        )
}

/// What the store would hold, as plain maps.
#[derive(Default, Debug, Clone)]
pub struct EffectLog {
    pub meta: BTreeMap<String, BucketMeta>,
    pub grants: BTreeMap<(String, Millis), u64>,
    pub permits: BTreeMap<PermitId, PermitState>,
    pub throttles: BTreeMap<String, Millis>,
    pub tickets: BTreeMap<TicketId, TicketState>,
    pub requests: BTreeMap<String, RequestRecord>,
    pub levels: BTreeMap<String, BucketLevel>,
    pub ceilings: BTreeMap<String, Ceiling>,
}

impl EffectLog {
    pub fn apply(&mut self, effects: &[Effect]) {
        for effect in effects {
            match effect {
                Effect::BucketMeta { bucket, meta } => {
                    self.meta.insert(bucket.to_string(), *meta);
                }
                Effect::WindowGrant { bucket, at, cost } => {
                    self.grants.insert((bucket.to_string(), *at), *cost);
                }
                Effect::WindowPruned { bucket, grants } => {
                    for at in grants {
                        self.grants.remove(&(bucket.to_string(), *at));
                    }
                }
                Effect::BucketForgotten { bucket, grants } => {
                    self.meta.remove(&**bucket);
                    for at in grants {
                        self.grants.remove(&(bucket.to_string(), *at));
                    }
                    // Whatever is left of the bucket was never reported: a leak in the file.
                    assert!(
                        !self.grants.keys().any(|(b, _)| b == &**bucket),
                        "forgetting {bucket} left grants in the file"
                    );
                }
                Effect::PermitSet { id, permit } => {
                    self.permits.insert(*id, permit.clone());
                }
                Effect::PermitEnded { id } => {
                    self.permits.remove(id);
                }
                Effect::ThrottleSet { key, until } => {
                    self.throttles.insert(key.to_string(), *until);
                }
                Effect::ThrottleEnded { key } => {
                    self.throttles.remove(&**key);
                }
                Effect::TicketFiled { id, ticket } => {
                    self.tickets.insert(*id, ticket.clone());
                }
                Effect::TicketRenewed { id, retry_at, lapse_at, grace_ms } => {
                    let t = self.tickets.get_mut(id).expect("a renewed ticket was filed");
                    (t.retry_at, t.lapse_at, t.grace_ms) = (*retry_at, *lapse_at, *grace_ms);
                }
                Effect::TicketEnded { id, .. } | Effect::TicketLapsed { id } => {
                    assert!(self.tickets.remove(id).is_some(), "an ended ticket was filed");
                }
                Effect::RequestKept { id, record } => {
                    self.requests.insert(id.to_string(), record.clone());
                }
                Effect::RequestForgotten { id, .. } => {
                    assert!(self.requests.remove(&**id).is_some(), "a forgotten id was kept");
                }
                Effect::LevelSet { bucket, level } => {
                    self.levels.insert(bucket.to_string(), *level);
                }
                Effect::LevelForgotten { bucket } => {
                    self.levels.remove(&**bucket);
                }
                Effect::CeilingSet { bucket, ceiling, .. } => {
                    self.ceilings.insert(bucket.to_string(), *ceiling);
                }
                Effect::CeilingForgotten { bucket } => {
                    self.ceilings.remove(&**bucket);
                }
            }
        }
    }

    /// An engine rebuilt from the log at `now`; the restore's own effects are applied too.
    pub fn rebuild(&mut self, config: EngineConfig, now: Millis) -> Engine {
        self.restart(config, now, now)
    }

    /// An engine rebuilt from the log at `now`, after a restart of a file whose latest instant
    /// is `floor` (tickets resumed, see [`Engine::resume_line`]).
    pub fn restart(&mut self, config: EngineConfig, floor: Millis, now: Millis) -> Engine {
        let mut e = Engine::new(config);
        for (k, m) in &self.meta {
            e.restore_bucket(k, *m);
        }
        for ((k, at), cost) in &self.grants {
            e.restore_grant(k, *at, *cost);
        }
        for (id, places) in &self.permits {
            e.restore_permit(*id, places.clone());
        }
        for (k, u) in &self.throttles {
            e.restore_throttle(k, *u);
        }
        for (id, t) in &self.tickets {
            e.restore_ticket(*id, t.clone());
        }
        for (id, r) in &self.requests {
            e.restore_request(id, r.clone());
        }
        for (k, level) in &self.levels {
            e.restore_level(k, *level);
        }
        for (k, ceiling) in &self.ceilings {
            e.restore_ceiling(k, *ceiling);
        }
        let mut effects = Vec::new();
        e.resume_line(floor, now, &mut effects);
        e.finish_restore(now, &mut effects);
        self.apply(&effects);
        e
    }
}

/// The offline check of rule 1 over the instants a load was granted at (cost 1 each): the most
/// grants any stretch of `per_ms` holds, and the instant that stretch starts. Sorts `instants`.
pub fn fullest_window(instants: &mut [u64], per_ms: u64) -> (u64, u64) {
    instants.sort_unstable();
    let mut fullest = (0, 0);
    for (i, &start) in instants.iter().enumerate() {
        let inside = instants[i..].iter().take_while(|&&t| t < start.saturating_add(per_ms)).count() as u64;
        if inside > fullest.0 {
            fullest = (inside, start);
        }
    }
    fullest
}

/// [`fullest_window`] over several buckets' instants: the bucket whose window is fullest, with
/// its count and start (the first such bucket on a tie); `None` without buckets. Every bucket
/// holds at most `calls` in any window exactly when this one does.
pub fn fullest_window_of<K>(buckets: impl IntoIterator<Item = (K, Vec<u64>)>, per_ms: u64) -> Option<(K, u64, u64)> {
    let mut fullest: Option<(K, u64, u64)> = None;
    for (bucket, mut instants) in buckets {
        let (inside, start) = fullest_window(&mut instants, per_ms);
        if fullest.as_ref().is_none_or(|f| inside > f.1) {
            fullest = Some((bucket, inside, start));
        }
    }
    fullest
}

#[cfg(test)]
mod tests {
    use super::{fullest_window, fullest_window_of};

    #[test]
    fn the_fullest_window_is_found_wherever_it_starts_and_excludes_its_end() {
        // From 10: 10, 20, 1000 and 1005 (1010 is the end, outside); from 0 only three.
        assert_eq!(fullest_window(&mut [1005, 0, 1000, 20, 10], 1000), (4, 10));
        assert_eq!(fullest_window(&mut [0, 1000, 2000], 1000), (1, 0));
        assert_eq!(fullest_window(&mut [], 1000), (0, 0));
    }

    #[test]
    fn the_fullest_window_of_several_buckets_names_its_bucket() {
        let buckets = [("a", vec![0, 2000]), ("b", vec![5, 7, 3000]), ("c", vec![0, 1, 5000])];
        assert_eq!(fullest_window_of(buckets, 1000), Some(("b", 2, 5)), "the first of two as full");
        assert_eq!(fullest_window_of(Vec::<(&str, Vec<u64>)>::new(), 1000), None);
    }
}
