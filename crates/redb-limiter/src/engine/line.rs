//! The line (section 12): tickets, their ids, what each bucket's line holds, and rule Q as
//! section 12.9 bounds it.
//!
//! Every ticket takes a number from one counter shared by all buckets; a bucket's line is its
//! live tickets in that order. The engine keeps one table of tickets keyed by number (what the
//! store persists) and, per bucket, the numbers waiting there with their lapse instants (derived
//! from the table, so a restore rebuilds it). Filing, renewal and lapse are the engine's, in
//! `ticket.rs`; what one bucket's line says of a request is here ([`Engine::line_refusal`]):
//!
//! - A ticket *holds* in a bucket while it is live and its caller is not throttled (a throttled
//!   ticket yields: it keeps its number and holds back no one), except where it takes only a
//!   window (no place, no token bucket) and the `retryAt` it was last told lies a whole window
//!   or more ahead: a grant made now has left that window by then, so it holds there from a
//!   window before its `retryAt` on ([`Waiting::reserves`]). A ticket held back by another of
//!   its buckets (its own full window, say) thus idles no room in a shared one.
//! - Each ticket that holds is *reserved* an instant in the bucket's window, in line order: the
//!   earliest instant, no sooner than the one reserved before it, at which the window (its own
//!   `calls` and `perMs` there) has room for its cost, counting the grants the bucket keeps and
//!   the costs reserved ahead of it at their instants. A ticket with no window there (or a cost
//!   of 0) reserves nothing in it. A token bucket (section 13) is asked the same question of its
//!   level: each ticket naming it as one is reserved the earliest instant, no sooner than the
//!   one before, at which the level, refilling with its own figures and with the costs reserved
//!   ahead taken at their instants, reaches its `min(cost, burst)`.
//! - A request *backfills* past the tickets ahead of it when it takes no place in the bucket and
//!   its cost, counted at `now`, leaves every reserved ticket room at its reserved instant (so
//!   it delays none of them): in a window, the window there still holds it; in a token bucket,
//!   the level there still reaches the ticket's cost with this one taken now (a take now lowers
//!   the level later by at most its cost). Otherwise the line refuses it until its own reserved instant
//!   behind them (not the first ticket's `retryAt`), and for a place until the places the
//!   tickets ahead want have come back, at most a recheck on.
//!
//! A reservation is judged in its bucket alone: a ticket that holds here is reserved the first
//! instant this bucket has room for it, and keeps that room until it is granted, lapses or
//! leaves (at the latest at its horizon). A ticket told an instant that comes to be too late (a
//! throttle lifted, a place freed early, a ticket ahead gone) may find the room it would have
//! had meanwhile taken, and then waits up to that instant; the tickets behind it may be told
//! sooner instants than it (never later ones), at the cost of one more ask.
//!
//! The walk is one pass over the tickets ahead, and over the bucket's grants once: reservations
//! come in time order, so neither pointer ever moves back.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::ceiling::scaled_bucket;
use super::token_bucket::Reservations;
use super::{Bucket, Engine, Ticket};
use crate::request::{Adapt, BucketLimit, Limit};
use crate::time::Millis;

/// At most this many live tickets wait in one bucket's line (section 12.1).
pub const MAX_LINE: usize = 10_000;

/// The first ticket of a line counts as late (section 12.2) only this long after its
/// `retryAt`: a host that asks again at its `retryAt` reaches the limiter a round trip later,
/// and the tickets behind it, told the same instant or one close to it, must not be sent to
/// sleep for a recheck meanwhile. While it is due they are told to ask again a millisecond on.
pub const LATE_AFTER_MS: u64 = 50;

/// A ticket's id: its number in the one counter (the low 64 bits: its place in every line) and
/// a random part of its own (the high 64 bits: SipHash-2-4 of the number under a key drawn when
/// the engine starts, `ticket_id`), so that the tickets a host was given tell nothing of
/// another's (a ticket cannot be guessed and taken out of the line by someone who did not get
/// it), and a restart, whose counter starts again above the live tickets only, issues a string
/// it issued before only by a 64-bit chance. Written `t-` and 32 lowercase hex digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct TicketId(pub u128);

impl TicketId {
    /// The ticket's place in the one counter: an older ticket has a smaller number.
    #[must_use]
    pub fn number(self) -> u64 {
        self.0 as u64
    }
}

impl fmt::Display for TicketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t-{:032x}", self.0)
    }
}

impl FromStr for TicketId {
    type Err = ();

    /// Reads an id this limiter wrote; any other string is not one of ours.
    fn from_str(s: &str) -> Result<Self, ()> {
        let hex = s.strip_prefix("t-").ok_or(())?;
        if hex.len() != 32 {
            return Err(());
        }
        // One pass, lowercase only: every ask with a ticket reads one.
        let mut id = 0u128;
        for b in hex.bytes() {
            let digit = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                _ => return Err(()),
            };
            id = id << 4 | u128::from(digit);
        }
        Ok(TicketId(id))
    }
}

/// The key of a start's ticket ids from the engine's seed (splitmix64 of values apart from the
/// permits' own), for tests; a served engine draws it from the OS (`random_ticket_key`).
pub(crate) fn ticket_key(seed: u64) -> (u64, u64) {
    let mix = |v: u64| {
        let mut z = v.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    (mix(seed ^ 0x7469_636b_6574_7321), mix(seed ^ 0x6c69_6e65_2d6b_6579))
}

/// A ticket key of 128 bits from the operating system's random source.
pub(crate) fn random_ticket_key() -> std::io::Result<(u64, u64)> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| std::io::Error::other(format!("ticket ids: no random key from the OS: {e}")))?;
    let half = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    Ok((half(&bytes[..8]), half(&bytes[8..])))
}

/// The id of ticket `number` under `key`: `SipHash-2-4(key, number) << 64 | number`.
pub(crate) fn ticket_id(key: (u64, u64), number: u64) -> TicketId {
    use std::hash::Hasher;
    let mut hasher = siphasher::sip::SipHasher24::new_with_keys(key.0, key.1);
    hasher.write_u64(number);
    TicketId(u128::from(hasher.finish()) << 64 | u128::from(number))
}

/// A live ticket: what the store keeps of it (one record per ticket, keyed by its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketState {
    /// When it was filed (the wait a grant ends is counted from here).
    pub filed_at: Millis,
    /// The `retryAt` last given to it.
    pub retry_at: Millis,
    /// It lapses at this instant unless asked again before: `retry_at + grace_ms`, or later
    /// after a restart (section 12.6).
    pub lapse_at: Millis,
    /// The `graceMs` it was last given.
    pub grace_ms: u64,
    /// What it binds (section 12.3): the caller key...
    pub key: Arc<str>,
    /// ...and the limits with their defaults resolved, sorted by bucket key. Its lines are the
    /// buckets these name.
    pub limits: Vec<Limit>,
    /// It never lapses later than this (section 12.9): its filing plus the horizon it was filed
    /// under (`None` for a ticket kept by a file that did not record it: its filing plus the
    /// server's horizon then).
    pub deadline: Option<Millis>,
}

impl TicketState {
    /// Whether `key` and `limits` (in any order) are the ones this ticket binds.
    pub(crate) fn binds(&self, key: &str, limits: &[Limit]) -> bool {
        if *self.key != *key || self.limits.len() != limits.len() {
            return false;
        }
        limits.iter().all(|l| {
            self.limits.binary_search_by(|bound| bound.key.as_str().cmp(&l.key)).is_ok_and(|i| self.limits[i] == *l)
        })
    }
}

/// What a ticket asks of one bucket: `(calls, perMs, cost)` of its window and its token bucket
/// with its cost, each if it names one.
type Asked = (Option<(u64, u64, u64)>, Option<(BucketLimit, u64)>);

/// A ticket's place in one bucket's line: its lapse, and what it asks of that bucket, so that a
/// walk of the line reads no ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waiting {
    pub(crate) lapse: Millis,
    /// The `retryAt` its ticket was last told.
    pub(crate) retry_at: Millis,
    /// `(calls, perMs, cost)` of its window here (cost capped at calls), if it names one.
    window: Option<(u64, u64, u64)>,
    /// Its token bucket here with its cost (capped at burst), if it names one (section 13).
    bucket: Option<(BucketLimit, u64)>,
    /// It asks for a place here.
    wants_place: bool,
    /// Its adaptive ceiling here (section 14) with its cost uncapped: its window or bucket is
    /// judged with the bucket's ceiling at each walk.
    adapt: Option<(Adapt, u64)>,
}

impl Waiting {
    pub(crate) fn new(limit: &Limit, lapse: Millis, retry_at: Millis) -> Self {
        Waiting {
            lapse,
            retry_at,
            window: limit.window.map(|w| (w.calls, w.per_ms, limit.cost.min(w.calls))),
            bucket: limit.bucket.map(|b| (b, limit.cost.min(b.burst))),
            wants_place: limit.concurrent.is_some(),
            adapt: limit.adapt.map(|a| (a, limit.cost)),
        }
    }

    /// Whether it reserves anything in this bucket's line at `now`. One that takes only a
    /// window here (no place, no token bucket) reserves nothing while its `retryAt` lies a
    /// whole window or more ahead: a grant made now has left the window by then, and the line
    /// holds no room for it that no one could use meanwhile (a ticket held back by another of
    /// its buckets, or a host told to come back later, keeps no one else waiting here). Its
    /// room is reserved again from a window before its `retryAt` on.
    pub(crate) fn reserves(&self, now: Millis) -> bool {
        let window_only = self.bucket.is_none() && !self.wants_place;
        !(window_only && self.window.is_some_and(|(_, per_ms, _)| now.plus(per_ms) <= self.retry_at))
    }

    /// Its window and token bucket here as judged with the ceiling `c` of its bucket, when it
    /// adapts (`c` then stands for its `calls` or `refill`).
    fn judged(&self, c: &impl Fn(&Adapt, u64) -> u64) -> Asked {
        let Some((adapt, cost)) = self.adapt else { return (self.window, self.bucket) };
        let window = self.window.map(|(calls, per_ms, _)| {
            let calls = c(&adapt, calls);
            (calls, per_ms, cost.min(calls))
        });
        let bucket = self.bucket.map(|(b, _)| {
            let b = scaled_bucket(&b, c(&adapt, b.refill));
            (b, cost.min(b.burst))
        });
        (window, bucket)
    }
}

/// The limits of a request as a ticket binds them: sorted by bucket key.
pub(crate) fn bound_limits(limits: &[Limit]) -> Vec<Limit> {
    let mut limits = limits.to_vec();
    limits.sort_by(|a, b| a.key.cmp(&b.key));
    limits
}

/// What a refusal names of the line (section 12.1): the ticket filed or renewed, when it lapses,
/// and the most live tickets ahead of it in any one of its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketNote {
    pub id: TicketId,
    pub lapse_at: Millis,
    pub ahead: u64,
    /// The limiter's clock at the decision, so a host sizes its sleep on it.
    pub now: Millis,
}

/// Why a refusal in the line filed no ticket (section 12.9, `noTicket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoTicket {
    /// The request's own instant lies beyond its horizon.
    Horizon,
    /// A line it names holds [`MAX_LINE`] live tickets.
    Full,
}

impl NoTicket {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            NoTicket::Horizon => "horizon",
            NoTicket::Full => "full",
        }
    }

    /// The reason a wire string names, the inverse of [`NoTicket::as_str`].
    #[must_use]
    pub fn parse(s: &str) -> Option<NoTicket> {
        [NoTicket::Horizon, NoTicket::Full].into_iter().find(|r| r.as_str() == s)
    }
}

/// An acquire's answer in the line: the decision, and on a refusal the ticket it names, if any,
/// or why it filed none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineAnswer {
    pub decision: super::Decision,
    pub ticket: Option<TicketNote>,
    pub no_ticket: Option<NoTicket>,
}

/// How a ticket ended, for the store (its record goes) and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketEnd {
    /// Its request was granted, this long after the ticket was filed.
    Granted { waited_ms: u64 },
    /// Its host left the line (`release {ticket}`).
    Left,
}

impl Engine {
    /// Whether ticket `t` yields at `now`: its caller is throttled (section 12.9).
    fn yields(&self, t: &Ticket, now: Millis) -> bool {
        self.throttles.get(&*t.state.key).is_some_and(|until| *until > now)
    }

    /// Rule Q in one bucket, as section 12.9 bounds it (see the module docs): `None` when the
    /// line lets `limit` through at `now` (no ticket older than `mine` holds here, or the
    /// request backfills), else the instant the request is told for this line.
    pub(super) fn line_refusal(
        &self,
        bucket: &Bucket,
        limit: &Limit,
        now: Millis,
        mine: Option<u64>,
    ) -> Option<Millis> {
        if bucket.line.is_empty() {
            return None;
        }
        // Only a throttled caller's ticket yields: where none is, no ticket is read.
        let throttles = !self.throttles.is_empty();
        let mut holding = bucket
            .line
            .range(..mine.unwrap_or(u64::MAX))
            .filter(|(n, w)| {
                w.lapse > now
                    && w.reserves(now)
                    && !(throttles && self.tickets.get(n).is_some_and(|t| self.yields(t, now)))
            })
            .peekable();
        let first = *holding.peek()?.0;
        let cost = limit.window.map_or(0, |w| limit.cost.min(w.calls));
        let tokens = limit.bucket.map_or(0, |b| limit.cost.min(b.burst));
        let mut schedule = Schedule::new(bucket, now);
        let mut levels = Reservations::new(bucket.live_level(now), now);
        // A place may be held until it lapses: a request that takes one never backfills.
        let mut backfills = limit.concurrent.is_none();
        let mut wanting_places = 0u64;
        let ceiling = |adapt: &Adapt, start: u64| self.line_c(&bucket.key, adapt, start);
        for (_, waiting) in holding {
            wanting_places += u64::from(waiting.wants_place);
            let (window, tokens_asked) = waiting.judged(&ceiling);
            if let Some((b, c)) = tokens_asked.filter(|w| w.1 > 0) {
                let (_, slack) = levels.reserve(&b, c);
                // This request's take now lowers the level there by at most its cost.
                if backfills && tokens > 0 && slack < i128::from(tokens) {
                    backfills = false;
                }
            }
            let Some((calls, per_ms, c)) = window.filter(|w| w.2 > 0) else { continue };
            let (at, used) = schedule.reserve(calls, per_ms, c);
            // This request's cost, granted now, still counts there at `at`: it must leave room.
            if backfills && cost > 0 && now.plus(per_ms) > at && used + c + cost > calls {
                backfills = false;
            }
        }
        if backfills {
            return None;
        }
        let mut at = now.plus(1);
        if let Some(w) = limit.window
            && cost > 0
        {
            at = at.max(schedule.earliest(w.calls, w.per_ms, cost).0);
        }
        if let Some(b) = limit.bucket
            && tokens > 0
        {
            at = at.max(levels.earliest(&b, tokens).0);
        }
        if let Some(c) = limit.concurrent {
            let first = &self.tickets[&first];
            at = at.max(self.place_instant(bucket, c, wanting_places, first, now));
        }
        Some(at)
    }

    /// When a request for one of `concurrent` places may find one behind `wanting` tickets that
    /// want a place here too: once enough held places have lapsed for all of them, or else as
    /// the first ticket that holds is told (a millisecond on while it is due, a recheck once it
    /// is late); never more than a recheck on.
    fn place_instant(&self, bucket: &Bucket, concurrent: u64, wanting: u64, first: &Ticket, now: Millis) -> Millis {
        let recheck = now.plus(self.config.recheck_ms);
        let held = bucket.held(now);
        let need = held + wanting + 1;
        let at = if need > concurrent && need - concurrent <= held {
            let nth = (need - concurrent - 1) as usize;
            bucket.places.live(now).nth(nth).expect("nth < held")
        } else {
            let retry_at = first.state.retry_at;
            if retry_at > now {
                retry_at
            } else if now.since(retry_at) <= LATE_AFTER_MS {
                now.plus(1)
            } else {
                recheck
            }
        };
        at.min(recheck)
    }
}

/// The reservations of one bucket's line at `now` (see the module docs): the costs reserved so
/// far at their instants (in time order), over the grants the bucket keeps.
struct Schedule<'a> {
    bucket: &'a Bucket,
    now: Millis,
    reserved: Vec<(Millis, u64)>,
    /// `sums[i]`: the costs of `reserved[..i]`.
    sums: Vec<u64>,
    /// Where the last walk for a window of this `perMs` stopped: the first grant and the first
    /// reservation that still count at the last reserved instant. Reservations only move later,
    /// so the next walk of the same length starts there.
    cursor: Option<(u64, usize, usize)>,
}

impl<'a> Schedule<'a> {
    fn new(bucket: &'a Bucket, now: Millis) -> Self {
        Schedule { bucket, now, reserved: Vec::new(), sums: vec![0], cursor: None }
    }

    /// The earliest instant no sooner than the last reservation (or `now`) at which a window of
    /// `calls` per `per_ms` has room for `cost`, and the cost that counts there then (the
    /// bucket's grants and the reservations).
    fn earliest(&mut self, calls: u64, per_ms: u64, cost: u64) -> (Millis, u64) {
        let window = &self.bucket.window;
        let from = self.reserved.last().map_or(self.now, |(at, _)| *at);
        // The grants that count at `now` (the bucket may keep them less long than `per_ms`,
        // rule 3) and still count at `from`; each leaves `per_ms` after its instant.
        let (mut g, mut r) = match self.cursor {
            Some((per, g, r)) if per == per_ms => (g, r),
            _ => (
                window.first_counting(self.now, self.bucket.count_ms(per_ms)).max(window.first_counting(from, per_ms)),
                self.reserved.partition_point(|(at, _)| at.plus(per_ms) <= from),
            ),
        };
        while g < window.len() && window.at(g).0.plus(per_ms) <= from {
            g += 1;
        }
        while r < self.reserved.len() && self.reserved[r].0.plus(per_ms) <= from {
            r += 1;
        }
        let total = self.sums[self.reserved.len()];
        let mut used = window.sum_from(g) + (total - self.sums[r]);
        let mut t = from;
        // Leave in order until it fits, then let every other that leaves at that instant go too.
        loop {
            let grant = (g < window.len()).then(|| window.at(g));
            let reserved = self.reserved.get(r).copied();
            let (next, is_grant) = match (grant, reserved) {
                (Some(a), Some(b)) if a.0 <= b.0 => (a, true),
                (_, Some(b)) => (b, false),
                (Some(a), None) => (a, true),
                (None, None) => break,
            };
            let leave = next.0.plus(per_ms);
            if used + cost <= calls && leave > t {
                break;
            }
            t = t.max(leave);
            used -= next.1;
            if is_grant {
                g += 1;
            } else {
                r += 1;
            }
        }
        debug_assert!(used + cost <= calls, "a cost capped at calls fits once all has left");
        self.cursor = Some((per_ms, g, r));
        (t, used)
    }

    /// Reserves `cost` at its earliest instant (see [`Schedule::earliest`]): returns that instant
    /// and the cost that counts there before this one.
    fn reserve(&mut self, calls: u64, per_ms: u64, cost: u64) -> (Millis, u64) {
        let (at, used) = self.earliest(calls, per_ms, cost);
        self.reserved.push((at, cost));
        self.sums.push(self.sums[self.reserved.len() - 1] + cost);
        (at, used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each ticket id has a random part of its own: consecutive numbers give unrelated high
    /// halves, and a key from the OS is not the seeded one.
    #[test]
    fn every_ticket_id_has_a_random_part_of_its_own() {
        let key = random_ticket_key().unwrap();
        assert_ne!(key, random_ticket_key().unwrap());
        let high = |id: TicketId| (id.0 >> 64) as u64;
        let ids: Vec<TicketId> = (0..1000).map(|n| ticket_id(key, n)).collect();
        let parts: std::collections::BTreeSet<u64> = ids.iter().map(|id| high(*id)).collect();
        assert_eq!(parts.len(), ids.len(), "no two ids share their random part");
        for pair in ids.windows(2) {
            assert!((high(pair[0]) ^ high(pair[1])).count_ones() > 10, "{} then {}", pair[0], pair[1]);
            assert_eq!(pair[1].number(), pair[0].number() + 1);
        }
    }

    #[test]
    fn ids_round_trip_order_by_number_and_foreign_strings_are_not_ids() {
        let a = ticket_id(ticket_key(1), 7);
        assert_eq!(a.to_string().parse::<TicketId>(), Ok(a));
        assert_eq!(a.number(), 7);
        assert_eq!(a.to_string().len(), 34);
        assert_ne!(ticket_key(1), ticket_key(2));
        assert_ne!(ticket_id(ticket_key(1), 7), ticket_id(ticket_key(2), 7));
        assert_eq!("t-0123456789abcdef0123456789ABCDEF".parse::<TicketId>(), Err(()), "lowercase only");
        assert_eq!(
            "t-0123456789abcdef00000000000000ff".parse::<TicketId>(),
            Ok(TicketId(0x0123_4567_89ab_cdef_0000_0000_0000_00ff))
        );
        for bad in [
            "",
            "t-",
            "p-00000000000000000000000000000000",
            "t-0000000000000000000000000000000G",
            "t-+000000000000000000000000000000",
        ] {
            assert!(bad.parse::<TicketId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_ticket_binds_its_limits_in_any_order_with_defaults_resolved() {
        let limits = vec![Limit::window("b", 5, 1000), Limit::concurrent("a", 2)];
        let state = TicketState {
            filed_at: Millis(0),
            retry_at: Millis(1),
            lapse_at: Millis(2),
            grace_ms: 1,
            key: Arc::from("caller"),
            limits: bound_limits(&limits),
            deadline: None,
        };
        assert!(state.binds("caller", &limits));
        assert!(state.binds("caller", &[limits[1].clone(), limits[0].clone()]));
        assert!(!state.binds("other", &limits));
        assert!(!state.binds("caller", &limits[..1]));
        assert!(!state.binds("caller", &[limits[0].clone().with_cost(2), limits[1].clone()]));
        assert!(!state.binds("caller", &[limits[0].clone(), limits[1].clone().with_hold_ms(5)]));
    }
}
