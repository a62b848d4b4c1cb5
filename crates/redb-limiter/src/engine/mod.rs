//! The engine: a pure, deterministic state machine that decides `acquire`, `release`,
//! `throttle`, `peek`, `settle` and `lift` exactly as the wire spec's sections 3 to 5 and 9 say,
//! and the line of section 12 (tickets, rule Q as section 12.9 bounds it, `release {ticket}`;
//! the line's own rules are in `line.rs`).
//!
//! There is one copy of the rules: [`Engine::peek`] and [`Engine::acquire`] (and their `_in_line`
//! forms, which read the request's `queue` and `ticket`) all ask the same read-only decision
//! (`refusal`), which judges a window only by the grants its bucket still keeps, whether or not
//! they were pruned from memory yet, and a line only by its tickets not lapsed; `acquire` prunes
//! first (to keep memory small) and then changes the state, `peek` changes nothing. Where no
//! ticket lives, rule Q costs one test.
//!
//! Each limit kind is a file that answers the same few questions (does this cost fit at `now`,
//! when will it, what does a grant or a settle change, what do the figures say, when is it
//! forgotten): a rolling window (`window.rs`, rules 2 and 3), a concurrency place (`place.rs`,
//! rule 4) and a token bucket (`token_bucket.rs`, section 13's rule B). One decision path
//! (`refusal`, `grant` and `figures` here, `settle_shares` in `settle.rs`) asks every kind a
//! request names, and the line (`line.rs`) reserves instants in windows and token buckets through
//! the same questions. A limit with `adapt` (section 14) is judged with its bucket's ceiling in
//! place of its `calls` (`ceiling.rs` says how, in one place: `Engine::judged`). What this file
//! keeps is the engine itself, with what all kinds share (the buckets, permits, throttles,
//! tickets and request ids), and that decision path; the rest is a file per concern: a key's
//! bucket (`bucket.rs`), the tickets (`ticket.rs`), throttles (`throttle.rs`), settling and
//! releasing (`settle.rs`), the timers' sweep (`sweep.rs`), the effects (`effect.rs`), the
//! rebuild from the file (`restore.rs`) and the read-only views (`view.rs`).
//!
//! It owns the in-memory state (buckets with their windows, places, token levels and lines,
//! permits, throttles, tickets) and the timers that forget what has lapsed. It never reads a clock (every
//! call takes `now`), never does I/O and never draws randomness of its own: permit and ticket
//! ids come from a seed.
//!
//! Every change is also reported as an [`Effect`] value, so the store can persist exactly those
//! changes without the engine knowing about redb, and the engine can be rebuilt from what was
//! persisted (`restore_*` then [`Engine::finish_restore`]).
//!
//! ```
//! use redb_limiter::engine::{Decision, Engine, EngineConfig, Reason};
//! use redb_limiter::{AcquireRequest, Limit, Millis};
//!
//! let mut engine = Engine::new(EngineConfig::default());
//! let mut effects = Vec::new();
//! let req = AcquireRequest::new("caller", vec![Limit::window("bucket", 1, 1000)]).unwrap();
//! assert!(engine.acquire(&req, Millis(5_000), &mut effects).is_granted());
//! assert!(!effects.is_empty()); // what the store must persist before answering
//! effects.clear();
//! let refused = engine.acquire(&req, Millis(5_999), &mut effects);
//! assert_eq!(refused, Decision::Refused { retry_at: Millis(6_000), reason: Reason::Rate, limit: "bucket".into() });
//! assert!(effects.is_empty()); // a refusal changes nothing
//! assert!(engine.acquire(&req, Millis(6_000), &mut effects).is_granted());
//! ```

mod bucket;
mod ceiling;
mod effect;
mod line;
#[cfg(any(test, feature = "model"))]
pub mod model;
mod permit;
mod place;
mod requests;
mod restore;
mod settle;
mod sweep;
mod throttle;
mod ticket;
mod timers;
pub mod token_bucket;
mod view;
mod wait;
mod window;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

pub use bucket::BucketMeta;
use bucket::{Bucket, bucket_entry};
pub use ceiling::{AdaptedShare, Ceiling, CeilingChange, KEPT_MS as CEILING_KEPT_MS};
pub use effect::Effect;
pub use line::{LATE_AFTER_MS, LineAnswer, MAX_LINE, NoTicket, TicketEnd, TicketId, TicketNote, TicketState};
use line::{random_ticket_key, ticket_key};
pub use permit::PermitId;
use permit::PermitIds;
use requests::RequestChecks;
pub use requests::{Outcome, REMEMBER_MS, RequestRecord, params_digest};
pub use settle::Settled;
use ticket::{Ticket, unbound_ticket};
use timers::{Due, Timers};
pub use token_bucket::BucketLevel;
pub use view::{BucketView, Facts, PageKeys, PermitView, StateView, ThrottleView, Totals};
pub use wait::Readiness;

use crate::policy::PRUNE_BATCH;
use crate::request::{AcquireRequest, BadRequest, BucketLimit, Limit};
use crate::time::Millis;

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// Default interval after which a call refused for concurrency may ask again.
pub const DEFAULT_RECHECK_MS: u64 = 250;

/// Default line horizon (section 12.9, `--line-horizon-ms`): a ticket is filed only for a request
/// whose own instant lies within it, and lapses this long after its filing at the latest.
pub const DEFAULT_LINE_HORIZON_MS: u64 = 300_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// A call refused for concurrency is told to retry at most this long after `now`.
    pub recheck_ms: u64,
    /// Seeds the permit ids; give each engine start a fresh one so ids are never reused.
    pub id_seed: u64,
    /// The line's horizon (section 12.9).
    pub line_horizon_ms: u64,
}

impl EngineConfig {
    /// The defaults with `recheck_ms` and `id_seed` given (what most tests build).
    #[must_use]
    pub fn with(recheck_ms: u64, id_seed: u64) -> Self {
        EngineConfig { recheck_ms, id_seed, ..EngineConfig::default() }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig { recheck_ms: DEFAULT_RECHECK_MS, id_seed: 0, line_horizon_ms: DEFAULT_LINE_HORIZON_MS }
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Rate,
    Concurrency,
    Throttle,
}

impl Reason {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Rate => "rate",
            Reason::Concurrency => "concurrency",
            Reason::Throttle => "throttle",
        }
    }

    /// The reason a wire string names, the inverse of [`Reason::as_str`].
    #[must_use]
    pub fn parse(s: &str) -> Option<Reason> {
        [Reason::Rate, Reason::Concurrency, Reason::Throttle].into_iter().find(|r| r.as_str() == s)
    }
}

/// The answer to an `acquire`. A refusal is an outcome, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Counted in every bucket at `at`; `permit` holds the concurrency places, if any.
    Granted { at: Millis, permit: Option<PermitId> },
    /// Counted nowhere. `limit` is the bucket key (for a throttle, the caller key) whose
    /// `retry_at` stands.
    Refused { retry_at: Millis, reason: Reason, limit: String },
}

impl Decision {
    #[must_use]
    pub fn is_granted(&self) -> bool {
        matches!(self, Decision::Granted { .. })
    }
}

/// Why a call would not be granted now: what a refused `acquire` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub retry_at: Millis,
    pub reason: Reason,
    /// The bucket key (for a throttle, the caller key) whose `retry_at` stands.
    pub limit: String,
}

impl From<Refusal> for Decision {
    fn from(r: Refusal) -> Self {
        Decision::Refused { retry_at: r.retry_at, reason: r.reason, limit: r.limit }
    }
}

/// How full one limit of a request is at an instant (section 9.1): for a window, the cost
/// counting under the request's `perMs` and what is left of `calls`; for concurrency, the
/// unlapsed places and what is left of `concurrent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figures {
    pub key: String,
    /// `(used, remaining)` when the limit has a window.
    pub window: Option<(u64, u64)>,
    /// `(held, free)` when the limit has `concurrent`.
    pub places: Option<(u64, u64)>,
    /// `(level, burst)` when the limit is a token bucket (section 13): the level in whole
    /// tokens, rounded down (negative while in debt).
    pub bucket: Option<(i64, u64)>,
    /// The live tickets in the bucket's line (section 12.7): given when the request takes part
    /// in the line or the line is not empty, so a limiter where nobody queues answers as before.
    pub queued: Option<u64>,
    /// The ceiling the limit is judged with (section 14), when it has `adapt`: clamped to its
    /// own `[min, max]`.
    pub ceiling: Option<u64>,
}

/// One window or token bucket a permit's grant counts in: what it counts there now (capped at
/// `cap`), and the bucket's `calls` (for a token bucket, its `burst`) at the grant (the cap of a
/// settle).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowShare {
    pub bucket: Arc<str>,
    pub cost: u64,
    pub cap: u64,
    /// For a token bucket's share (section 13): the grant's `(refill, perMs)`, with which a
    /// settle refunds or takes; `None` for a window's.
    pub tokens: Option<(u64, u64)>,
}

impl WindowShare {
    /// The token bucket figures of the grant, for a token bucket's share.
    fn bucket_limit(&self) -> Option<BucketLimit> {
        self.tokens.map(|(refill, per_ms)| BucketLimit { refill, per_ms, burst: self.cap, initial: self.cap })
    }
}

/// A live permit: its grant's instant, until when it lives, its places (bucket, lapse) and its
/// window shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermitState {
    pub at: Millis,
    /// The permit lives while `now < expires`: its last place's lapse, or its request's
    /// `holdMs` after the grant when asked for with `permit` and that is later.
    pub expires: Millis,
    pub places: Vec<(Arc<str>, Millis)>,
    pub windows: Vec<WindowShare>,
    /// The adapted buckets of its grant (section 14), where an outcome on it counts.
    pub adapted: Vec<AdaptedShare>,
}

/// The limiter's state and rules. See the module docs.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    buckets: Map<Arc<str>, Bucket>,
    /// The keys of `buckets`, in order: a page of the state is read from it without a scan.
    bucket_keys: BTreeSet<Arc<str>>,
    permits: Map<PermitId, PermitState>,
    throttles: Map<Arc<str>, Millis>,
    timers: Timers,
    ids: PermitIds,
    held_places: usize,
    /// Every ticket not yet ended or swept, by number (lapsed ones until their timer).
    tickets: Map<u64, Ticket>,
    /// The key of this start's ticket ids. random parts (`line::ticket_id`).
    ticket_key: (u64, u64),
    /// The next ticket's number: above every ticket restored or filed.
    next_ticket: u64,
    /// The request ids remembered (section 16, `requests.rs`), and when each is next checked.
    requests: Map<Arc<str>, RequestRecord>,
    request_checks: RequestChecks,
    /// Where room may have come back since the limiter last looked (`wait.rs`), when `watching`.
    freed: Vec<Arc<str>>,
    watching: bool,
    /// Hand-offs since the limiter last looked (ms from a release to the next grant of a place
    /// in a bucket whose line waited), at most [`MAX_HANDOFFS`].
    handoffs: Vec<u64>,
    /// Place-time (ms) that stood idle while a line waited, since the limiter last looked: each
    /// place released while its bucket's line waited, until a grant took it again or the line
    /// emptied.
    idle_place_ms: u64,
    /// The adaptive ceilings kept (section 14), by bucket key.
    ceilings: Map<Arc<str>, Ceiling>,
}

/// The most hand-offs kept for the limiter to read ([`Engine::take_handoffs`]).
const MAX_HANDOFFS: usize = 1024;

impl Engine {
    #[must_use]
    pub fn new(config: EngineConfig) -> Self {
        Engine {
            config,
            buckets: Map::default(),
            bucket_keys: BTreeSet::new(),
            permits: Map::default(),
            throttles: Map::default(),
            timers: Timers::default(),
            ids: PermitIds::new(config.id_seed),
            held_places: 0,
            tickets: Map::default(),
            ticket_key: ticket_key(config.id_seed),
            next_ticket: 1,
            requests: Map::default(),
            request_checks: RequestChecks::default(),
            freed: Vec::new(),
            watching: false,
            handoffs: Vec::new(),
            idle_place_ms: 0,
            ceilings: Map::default(),
        }
    }

    /// Draws the keys of the permit and ticket ids from the operating system's random source
    /// (128 bits each) instead of the 64-bit `id_seed`: what a production open does; tests keep
    /// the seed to get the same ids each run.
    pub fn draw_permit_key(&mut self) -> std::io::Result<()> {
        self.ids.rekey_from_os()?;
        self.ticket_key = random_ticket_key()?;
        Ok(())
    }

    #[must_use]
    pub fn config(&self) -> EngineConfig {
        self.config
    }

    /// Decides an `acquire` at `now`: all or nothing over every limit and the caller's throttle.
    /// A grant pushes its effects; a refusal changes nothing but the retention of the buckets
    /// it names with a longer `perMs` (rule 3), which it pushes as effects too.
    ///
    /// The request takes no part in the line: its `queue`, `ticket` and `id` are not read, and rule Q
    /// holds for it as for any request without a ticket (it is granted only where every line
    /// of its buckets is empty). [`Engine::acquire_in_line`] decides with them.
    pub fn acquire(&mut self, req: &AcquireRequest, now: Millis, effects: &mut Vec<Effect>) -> Decision {
        for limit in &req.limits {
            self.prune_bucket(&limit.key, now);
        }
        match self.refusal(req, now, None, true) {
            Some(refusal) => {
                self.refused(req, now, effects);
                refusal.into()
            }
            None => self.grant(req, now, effects),
        }
    }

    /// Decides an `acquire` at `now` with the line (section 12): a live ticket the request
    /// presents must be bound to it (else a `BadRequest` naming `ticket`, and nothing changes);
    /// it is granted only when first in each of its lines (rule Q), which ends it, and refused it
    /// is renewed. A request with `queue`, or with a ticket unknown, ended or lapsed, refused
    /// for `rate` or `concurrency` files a new ticket at the back of every line it names (unless
    /// one is full).
    ///
    /// A request with an `id` (section 16) that was granted or filed a ticket before is answered
    /// as then, counting nothing again; one whose id was released, or named other params, is a
    /// `BadRequest` naming `id`.
    pub fn acquire_in_line(
        &mut self,
        req: &AcquireRequest,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<LineAnswer, BadRequest> {
        let Some(id) = req.id.as_deref() else { return self.decide_in_line(req, now, effects) };
        let params = params_digest(req);
        if let Some(again) = self.answer_again(id, params, now, effects)? {
            return Ok(again);
        }
        let answer = self.decide_in_line(req, now, effects)?;
        self.remember(id, params, req, &answer, now, effects);
        Ok(answer)
    }

    /// [`Engine::acquire_in_line`] without the request's id.
    fn decide_in_line(
        &mut self,
        req: &AcquireRequest,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<LineAnswer, BadRequest> {
        if !req.in_line() {
            // A host that never queues: the decision of before (rule Q included).
            return Ok(LineAnswer { decision: self.acquire(req, now, effects), ticket: None, no_ticket: None });
        }
        // The binding check first: a request that errs changes nothing.
        let mine = self.presented(req, now, effects)?;
        for limit in &req.limits {
            self.prune_bucket(&limit.key, now);
        }
        match self.refusal(req, now, mine, true) {
            None => {
                let decision = self.grant(req, now, effects);
                if let Some(number) = mine {
                    let ticket = &self.tickets[&number];
                    let end = TicketEnd::Granted { waited_ms: now.since(ticket.state.filed_at) };
                    self.end_ticket(number, Effect::TicketEnded { id: ticket.id, end }, now, effects);
                }
                Ok(LineAnswer { decision, ticket: None, no_ticket: None })
            }
            Some(refusal) => {
                self.refused(req, now, effects);
                let (ticket, no_ticket) = match mine {
                    Some(number) => (Some(self.renew(number, refusal.retry_at, req.grace_ms, now, effects)), None),
                    None if refusal.reason != Reason::Throttle => {
                        // The horizon (12.9): only a request whose own instant lies within it
                        // may hold a place in a line.
                        let horizon = self.horizon_of(req);
                        let own = self.refusal(req, now, None, false).map_or(now, |r| r.retry_at);
                        if own > now.plus(horizon) {
                            (None, Some(NoTicket::Horizon))
                        } else {
                            match self.file(req, refusal.retry_at, now.plus(horizon), now, effects) {
                                Some(note) => (Some(note), None),
                                None => (None, Some(NoTicket::Full)),
                            }
                        }
                    }
                    None => (None, None),
                };
                Ok(LineAnswer { decision: refusal.into(), ticket, no_ticket })
            }
        }
    }

    /// A refusal of `req`: rule 3 lengthens the retention of the windows it names, and a token
    /// bucket named for the first time is created at its `initial` (section 13).
    fn refused(&mut self, req: &AcquireRequest, now: Millis, effects: &mut Vec<Effect>) {
        for limit in &req.limits {
            if let Some(w) = limit.window {
                self.lengthen(&limit.key, w.per_ms, effects);
            }
            self.name_bucket(limit, now, effects);
        }
    }

    /// A token bucket named by an acquire (granted or refused) that has no level starts at
    /// `initial` (section 13): a level below its burst is kept (a full one is what a bucket
    /// never named reads anyway, and is forgotten).
    fn name_bucket(&mut self, limit: &Limit, now: Millis, effects: &mut Vec<Effect>) {
        let Some(b) = limit.bucket else { return };
        if b.initial >= b.burst || self.buckets.get(limit.key.as_str()).is_some_and(|k| k.level.is_some()) {
            return;
        }
        let bucket = bucket_entry(&mut self.buckets, &mut self.bucket_keys, &limit.key);
        bucket.set_level(BucketLevel::initial(&b, now), effects);
        Self::arm(&mut self.timers, bucket);
    }

    /// Grants `req` at `now` (every rule was checked): counts it in every window, holds its
    /// places, and issues its permit.
    fn grant(&mut self, asked: &AcquireRequest, now: Millis, effects: &mut Vec<Effect>) -> Decision {
        let judged = self.judged(asked);
        let req = judged.as_ref();
        let permit = req.wants_permit().then(|| {
            let mut id = self.ids.next_id();
            while self.permits.contains_key(&id) {
                id = self.ids.next_id();
            }
            id
        });
        let mut places = Vec::new();
        let mut windows = Vec::new();
        let mut adapted = Vec::new();
        for (limit, own) in req.limits.iter().zip(&asked.limits) {
            if permit.is_some() {
                adapted.extend(AdaptedShare::at_grant(limit, own, self.ceilings.get(limit.key.as_str())));
            }
            if let Some(b) = limit.bucket {
                // Rule B: the grant takes min(cost, burst) from the level at its instant.
                let cost = limit.counted_cost();
                if cost > 0 {
                    let bucket = bucket_entry(&mut self.buckets, &mut self.bucket_keys, &limit.key);
                    let level = token_bucket::take(bucket.level.as_ref(), &b, cost, now);
                    bucket.set_level(level, effects);
                    Self::arm(&mut self.timers, bucket);
                } else {
                    self.name_bucket(limit, now, effects);
                }
                if permit.is_some() {
                    let key = match self.buckets.get_key_value(limit.key.as_str()) {
                        Some((key, _)) => key.clone(),
                        None => Arc::from(limit.key.as_str()),
                    };
                    let tokens = Some((b.refill, b.per_ms));
                    windows.push(WindowShare { bucket: key, cost, cap: b.burst, tokens });
                }
            }
            let cost = limit.window.map_or(0, |w| limit.cost.min(w.calls));
            // A permit's grant counts in every window it names, at 0 too, so it can be settled.
            let records = limit.window.is_some() && (cost > 0 || permit.is_some());
            if !records && limit.concurrent.is_none() {
                // A cost of 0 fills nothing; it may still lengthen the bucket's retention.
                if let Some(w) = limit.window {
                    self.lengthen(&limit.key, w.per_ms, effects);
                }
                continue;
            }
            let bucket = bucket_entry(&mut self.buckets, &mut self.bucket_keys, &limit.key);
            let key = bucket.key.clone();
            let old = bucket.meta;
            // An idle bucket keeps nothing: it starts again as if new (as if it was forgotten).
            let mut meta = if bucket.is_idle() { BucketMeta::default() } else { old };
            if let (Some(w), true) = (limit.window, records) {
                meta.retain_ms = meta.retain_ms.max(w.per_ms);
                meta.last_calls = w.calls;
            }
            if let Some(c) = limit.concurrent {
                meta.last_concurrent = c;
            }
            // A window that grows must not let what it pruned under the old length count again
            // from the file: report those grants first, so the store deletes them with the record.
            if meta.retain_ms > old.retain_ms || bucket.unpersisted_prune.len() >= PRUNE_BATCH {
                bucket.take_pruned(effects);
            }
            if meta != old {
                bucket.meta = meta;
                effects.push(Effect::BucketMeta { bucket: key.clone(), meta });
            }
            if let (Some(w), true) = (limit.window, records) {
                let total = bucket.window.record(now, cost);
                effects.push(Effect::WindowGrant { bucket: key.clone(), at: now, cost: total });
                if permit.is_some() {
                    windows.push(WindowShare { bucket: key.clone(), cost, cap: w.calls, tokens: None });
                }
            }
            if let (Some(_), Some(id)) = (limit.concurrent, permit) {
                if let Some(from) = bucket.handoff_from.pop_front() {
                    self.idle_place_ms = self.idle_place_ms.saturating_add(now.since(from));
                    if self.handoffs.len() < MAX_HANDOFFS {
                        self.handoffs.push(now.since(from));
                    }
                }
                let lapse = now.plus(limit.hold_ms);
                bucket.places.insert(lapse, id);
                self.held_places += 1;
                places.push((key.clone(), lapse));
            }
            Self::arm(&mut self.timers, bucket);
        }
        if let Some(id) = permit {
            let last_lapse = places.iter().map(|&(_, lapse)| lapse).max().unwrap_or(Millis::ZERO);
            let expires = if req.permit { last_lapse.max(now.plus(req.hold_ms)) } else { last_lapse };
            for share in &mut adapted {
                share.in_play = self.in_play(req, share, now);
            }
            let permit = PermitState { at: now, expires, places, windows, adapted };
            self.timers.push(expires, Due::Permit(id));
            effects.push(Effect::PermitSet { id, permit: permit.clone() });
            self.permits.insert(id, permit);
        }
        Decision::Granted { at: now, permit }
    }

    /// Decides `req` at `now` as [`Engine::acquire`] would, changing nothing: `None` when it
    /// would be granted.
    #[must_use]
    pub fn peek(&self, req: &AcquireRequest, now: Millis) -> Option<Refusal> {
        self.refusal(req, now, None, true)
    }

    /// Decides `req` at `now` as [`Engine::acquire_in_line`] would, changing nothing: with the
    /// live ticket it presents, if any, checked against what it binds (section 12.7).
    pub fn peek_in_line(&self, req: &AcquireRequest, now: Millis) -> Result<Option<Refusal>, BadRequest> {
        // An id answered before is peeked as it would be answered again.
        if let Some(id) = req.id.as_deref()
            && let Some(again) = self.answer_again(id, params_digest(req), now, &mut Vec::new())?
        {
            return Ok(match again.decision {
                Decision::Granted { .. } => None,
                Decision::Refused { retry_at, reason, limit } => Some(Refusal { retry_at, reason, limit }),
            });
        }
        let mine = match self.known_ticket(req) {
            Some(number) if self.tickets[&number].state.lapse_at > now => {
                if !self.tickets[&number].state.binds(&req.key, &req.limits) {
                    return Err(unbound_ticket());
                }
                Some(number)
            }
            _ => None,
        };
        Ok(self.refusal(req, now, mine, true))
    }

    /// The figures of each limit of `req` at `now` (section 9.1), in the request's order.
    #[must_use]
    pub fn figures(&self, asked: &AcquireRequest, now: Millis) -> Vec<Figures> {
        let judged = self.judged(asked);
        let req = judged.as_ref();
        req.limits
            .iter()
            .zip(&asked.limits)
            .map(|(limit, own)| {
                let bucket = self.buckets.get(limit.key.as_str());
                let window = limit.window.map(|w| {
                    let used = bucket.map_or(0, |b| b.window.used(now, b.count_ms(w.per_ms)));
                    (used, w.calls.saturating_sub(used))
                });
                let places = limit.concurrent.map(|c| {
                    let held = bucket.map_or(0, |b| b.held(now));
                    (held, c.saturating_sub(held))
                });
                let level = bucket.and_then(|b| b.live_level(now));
                let tokens = limit.bucket.map(|b| {
                    let units = token_bucket::level_units(level, &b, now);
                    (units.div_euclid(i128::from(b.per_ms)) as i64, b.burst)
                });
                let queued = bucket.map_or(0, |b| b.queued(now));
                let queued = (req.in_line() || queued > 0).then_some(queued);
                let ceiling = self.ceiling_of(own);
                Figures { key: limit.key.clone(), window, places, bucket: tokens, queued, ceiling }
            })
            .collect()
    }

    /// Rule 3: an acquire naming `per_ms` for a bucket that keeps its grants less long makes it
    /// keep them that long. An idle bucket (pruned at `now`) keeps nothing to lengthen.
    fn lengthen(&mut self, key: &str, per_ms: u64, effects: &mut Vec<Effect>) {
        let Some(bucket) = self.buckets.get_mut(key) else { return };
        if per_ms <= bucket.meta.retain_ms || bucket.is_idle() {
            return;
        }
        bucket.take_pruned(effects);
        bucket.meta.retain_ms = per_ms;
        effects.push(Effect::BucketMeta { bucket: bucket.key.clone(), meta: bucket.meta });
        // Its idle instant moves later: its timer, when it fires, reschedules itself.
    }

    /// The refusal that stands for `req` at `now`, if any (rule 6): the latest `retryAt`; on a
    /// tie the throttle, else the first tied limit in request order, and within one limit its
    /// window, then its line, then its concurrency. `mine` is the number of the live ticket the
    /// request presents (`None`: it has none, so every live ticket is older); `line`: rule Q
    /// (with section 12.9) holds, else the request is judged alone (its own instant, the
    /// horizon's measure). Read-only, and the same whether or not the named buckets were pruned
    /// at `now`.
    fn refusal(&self, asked: &AcquireRequest, now: Millis, mine: Option<u64>, line: bool) -> Option<Refusal> {
        let judged = self.judged(asked);
        let req = judged.as_ref();
        // Where nobody queues, rule Q costs this one test.
        let lines = line && !self.tickets.is_empty();
        let mut worst: Option<(Millis, Reason, Option<usize>)> = None;
        let mut consider = |retry_at: Millis, reason: Reason, limit: Option<usize>| {
            if worst.is_none_or(|(at, _, _)| retry_at > at) {
                worst = Some((retry_at, reason, limit));
            }
        };
        if let Some(&until) = self.throttles.get(req.key.as_str())
            && until > now
        {
            consider(until, Reason::Throttle, None);
        }
        for (i, limit) in req.limits.iter().enumerate() {
            let bucket = self.buckets.get(limit.key.as_str());
            // Rule B: a token bucket never named reads its `initial`.
            if let Some(b) = limit.bucket
                && let Some(at) =
                    token_bucket::refused_until(bucket.and_then(|k| k.live_level(now)), &b, limit.cost, now)
            {
                consider(at, Reason::Rate, Some(i));
            }
            let Some(bucket) = bucket else {
                continue; // a new window or place always has room: cost is capped at calls, concurrent >= 1
            };
            if let Some(w) = limit.window
                && let Some(at) = bucket.window.refused_until(
                    now,
                    w.calls,
                    bucket.count_ms(w.per_ms),
                    w.per_ms,
                    limit.cost.min(w.calls),
                )
            {
                consider(at, Reason::Rate, Some(i));
            }
            if lines && let Some(at) = self.line_refusal(bucket, limit, now, mine) {
                let counts = limit.window.is_some() || limit.bucket.is_some();
                consider(at, if counts { Reason::Rate } else { Reason::Concurrency }, Some(i));
            }
            if let Some(c) = limit.concurrent
                && let Some(at) = bucket.places.refused_until(c, now, now.plus(self.config.recheck_ms))
            {
                consider(at, Reason::Concurrency, Some(i));
            }
        }
        worst.map(|(retry_at, reason, limit)| Refusal {
            retry_at,
            reason,
            limit: match limit {
                Some(i) => req.limits[i].key.clone(),
                None => req.key.clone(),
            },
        })
    }
}

#[cfg(test)]
mod bucket_tests;
#[cfg(test)]
mod ceiling_tests;
#[cfg(test)]
mod tests;
