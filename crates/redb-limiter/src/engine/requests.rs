//! Request ids (section 16): what the engine remembers of an acquire a host named with `id`, so
//! that a retry after a lost answer is answered as the first time (never counted twice, never a
//! second ticket), and `release {id}` undoes what it got: frees its places, takes its ticket out
//! of the line, and with `costs` settles the windows of its grant.
//!
//! The engine remembers an id once its acquire is granted or files a ticket (any other refusal
//! is decided afresh on a retry), and once `release {id}` names it (seen or not: a delayed
//! original then changes nothing). Each is kept for [`REMEMBER_MS`] at least, and for as long as
//! the permit or the ticket it names lives. What a record keeps of the request is a 128-bit
//! digest of the params a retry must repeat (the caller key and the limits as a ticket binds
//! them, with `permit`, `queue` and `ticket`); `report`, `graceMs` and `maxWaitMs` may differ.
//! Records are effects like any other change, committed with the grant or filing they name.

use std::hash::Hasher;
use std::sync::Arc;

use super::{Decision, Effect, Engine, LineAnswer, PermitId, Reason, Settled, TicketId, TicketNote, WindowShare};
use crate::request::{AcquireRequest, BadRequest, Cost};
use crate::time::Millis;

/// A record lives at least this long after the acquire (or release) that made it.
pub const REMEMBER_MS: u64 = 60_000;

/// When each record is next checked, soonest first: `(due, id)`. Every check is pushed at the
/// deciding `now` plus [`REMEMBER_MS`] and `now` never runs back, so a plain queue stays in
/// order (a heap of a minute's records would cost a sift per grant); a record that is kept
/// longer (its permit or ticket lives, or it was released since) is checked again a minute on,
/// so it is forgotten at most a minute after its time. A record checked twice is skipped.
#[derive(Debug, Default)]
pub(super) struct RequestChecks(std::collections::VecDeque<(Millis, Arc<str>)>);

impl RequestChecks {
    fn push_back(&mut self, check: (Millis, Arc<str>)) {
        self.0.push_back(check);
    }

    fn pop_due(&mut self, now: Millis) -> Option<(Millis, Arc<str>)> {
        if self.0.front()?.0 > now {
            return None;
        }
        self.0.pop_front()
    }

    /// The soonest check.
    pub(super) fn next_at(&self) -> Option<Millis> {
        self.0.front().map(|(at, _)| *at)
    }
}

/// What the acquire an id names got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Granted at `at`, with its permit if it has one. A grant without a permit keeps its window
    /// shares here (every window limit of the request, at the cost it counts), so that
    /// `release {id}` with `costs` can settle it; a permit keeps its own.
    Granted { at: Millis, permit: Option<PermitId>, windows: Arc<[WindowShare]> },
    /// Refused, filing `ticket`: the refusal as it was answered.
    Ticketed { ticket: TicketId, retry_at: Millis, reason: Reason, limit: Arc<str>, lapse_at: Millis },
    /// Undone by `release {id}`, or released before its acquire arrived.
    Released,
}

/// One remembered id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// The digest of the params a retry must repeat ([`params_digest`]); 0 for a released id
    /// that never arrived.
    pub params: u128,
    /// When the id was first remembered (the store keys its records by it, so that a minute's
    /// records sit together in the file, oldest first).
    pub since: Millis,
    /// Remembered at least until then (later while its ticket lives).
    pub until: Millis,
    pub outcome: Outcome,
}

/// The digest of what a retry with the same id must repeat (section 16's "same params"): the
/// caller key and the limits with their defaults resolved, in bucket order (as a ticket binds
/// them), and `permit`, `queue` and `ticket`. SipHash-1-3 (128 bits) under a fixed key, so it is
/// the same in every build and across a restart.
#[must_use]
pub fn params_digest(req: &AcquireRequest) -> u128 {
    use siphasher::sip128::{Hasher128, SipHasher13};
    fn text(h: &mut SipHasher13, s: &str) {
        h.write_u64(s.len() as u64);
        h.write(s.as_bytes());
    }
    let mut h = SipHasher13::new_with_keys(0x7265_7175_6573_7473, 0x6964_732d_7061_7273);
    text(&mut h, &req.key);
    h.write_u64(req.limits.len() as u64);
    // In bucket order, as a ticket binds them (keys are unique within a request).
    let mut limits: Vec<&crate::request::Limit> = req.limits.iter().collect();
    limits.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    for limit in limits {
        text(&mut h, &limit.key);
        let (calls, per_ms) = limit.window.map_or((0, 0), |w| (w.calls, w.per_ms));
        for n in [calls, per_ms, limit.concurrent.map_or(0, |c| c + 1), limit.cost, limit.hold_ms] {
            h.write_u64(n);
        }
        // A token bucket's figures (section 13), only where one is named: the digests of
        // requests without one stay those the previous release kept.
        if let Some(b) = limit.bucket {
            for n in [u64::MAX, b.refill, b.per_ms, b.burst, b.initial] {
                h.write_u64(n);
            }
        }
        // An adaptive ceiling (section 14), likewise only where one is named.
        if let Some(a) = limit.adapt {
            for n in [u64::MAX - 1, a.min, a.max, a.increase, a.keep_pct] {
                h.write_u64(n);
            }
        }
    }
    h.write_u8(u8::from(req.permit) | u8::from(req.queue) << 1);
    match &req.ticket {
        Some(ticket) => text(&mut h, ticket),
        None => h.write_u64(u64::MAX),
    }
    h.finish128().as_u128()
}

fn reused() -> BadRequest {
    BadRequest("id names another request: a retry must repeat its key, limits, permit, queue and ticket".into())
}

fn released() -> BadRequest {
    BadRequest("id was released: a new ask needs a new id".into())
}

impl Engine {
    /// The answer of a retry: `Ok(None)` when `id` is not remembered (decide afresh), the first
    /// answer when it is (its record is pushed again, so the retry's reply waits for the commit
    /// that holds the first), a `BadRequest` naming `id` when it was released or named other
    /// params.
    pub(super) fn answer_again(
        &self,
        id: &str,
        params: u128,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<Option<LineAnswer>, BadRequest> {
        let Some((key, record)) = self.requests.get_key_value(id) else { return Ok(None) };
        if record.outcome == Outcome::Released {
            return Err(released());
        }
        if record.params != params {
            return Err(reused());
        }
        let answer = match &record.outcome {
            Outcome::Granted { at, permit, .. } => {
                LineAnswer { decision: Decision::Granted { at: *at, permit: *permit }, ticket: None, no_ticket: None }
            }
            Outcome::Ticketed { ticket, retry_at, reason, limit, lapse_at } => {
                let number = ticket.number();
                let live = self.tickets.get(&number).filter(|t| t.id == *ticket && t.state.lapse_at > now);
                let note = match live {
                    Some(t) => {
                        TicketNote { id: *ticket, lapse_at: t.state.lapse_at, ahead: self.ahead(number, now), now }
                    }
                    None => TicketNote { id: *ticket, lapse_at: *lapse_at, ahead: 0, now },
                };
                LineAnswer {
                    decision: Decision::Refused { retry_at: *retry_at, reason: *reason, limit: limit.to_string() },
                    ticket: Some(note),
                    no_ticket: None,
                }
            }
            Outcome::Released => unreachable!("answered above"),
        };
        effects.push(Effect::RequestKept { id: key.clone(), record: record.clone() });
        Ok(Some(answer))
    }

    /// Remembers what the acquire `req`, named `id`, got: a grant, or a refusal that filed a
    /// ticket (a renewal of the ticket it presented files none). Other refusals leave no record.
    pub(super) fn remember(
        &mut self,
        id: &str,
        params: u128,
        req: &AcquireRequest,
        answer: &LineAnswer,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) {
        let (outcome, lives_until) = match (&answer.decision, &answer.ticket) {
            (Decision::Granted { at, permit }, _) => {
                let windows = match permit {
                    Some(_) => Arc::from([]),
                    None => self.window_shares(req),
                };
                let expires = permit.and_then(|p| self.permits.get(&p)).map_or(now, |p| p.expires);
                (Outcome::Granted { at: *at, permit: *permit, windows }, expires)
            }
            (Decision::Refused { retry_at, reason, limit }, Some(note))
                if req.ticket.as_deref().and_then(|t| t.parse::<TicketId>().ok()) != Some(note.id) =>
            {
                let outcome = Outcome::Ticketed {
                    ticket: note.id,
                    retry_at: *retry_at,
                    reason: *reason,
                    limit: Arc::from(limit.as_str()),
                    lapse_at: note.lapse_at,
                };
                (outcome, note.lapse_at)
            }
            _ => return,
        };
        let record = RequestRecord { params, since: now, until: now.plus(REMEMBER_MS).max(lives_until), outcome };
        self.keep_request(Arc::from(id), record, now, effects);
    }

    /// The window shares of a grant of `req` without a permit: every window and token bucket
    /// limit, at the cost it counts (capped at `calls` or `burst`), the bucket key shared with
    /// the bucket's own.
    fn window_shares(&self, req: &AcquireRequest) -> Arc<[WindowShare]> {
        req.limits
            .iter()
            .filter_map(|l| {
                let (cap, tokens) = match (l.window, l.bucket) {
                    (Some(w), _) => (w.calls, None),
                    (None, Some(b)) => (b.burst, Some((b.refill, b.per_ms))),
                    (None, None) => return None,
                };
                let bucket = self
                    .buckets
                    .get_key_value(l.key.as_str())
                    .map_or_else(|| Arc::from(l.key.as_str()), |(k, _)| k.clone());
                Some(WindowShare { bucket, cost: l.counted_cost(), cap, tokens })
            })
            .collect()
    }

    fn keep_request(&mut self, id: Arc<str>, record: RequestRecord, now: Millis, effects: &mut Vec<Effect>) {
        // Its first check a minute on: at `until` itself, for a record no permit or ticket keeps.
        self.request_checks.push_back((now.plus(REMEMBER_MS), id.clone()));
        effects.push(Effect::RequestKept { id: id.clone(), record: record.clone() });
        self.requests.insert(id, record);
    }

    /// `release {id}` (section 16): undoes what the acquire named `id` got, settling its windows
    /// to `costs` first when given, and remembers the id as released. True when it changed
    /// something: a permit that was live released, a ticket that was live out of its line, or a
    /// window of a grant without a permit counting differently. An id never seen is remembered
    /// as released (false). `costs` naming a bucket that was not a window limit of the grant is
    /// a `BadRequest` naming it, and nothing changes; with no grant (a ticket, or nothing) they
    /// are not read.
    pub fn undo(
        &mut self,
        id: &str,
        costs: &[Cost],
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, BadRequest> {
        let (key, record) = match self.requests.get_key_value(id) {
            Some((key, record)) => (key.clone(), Some(record.clone())),
            None => (Arc::from(id), None),
        };
        let changed = match record.as_ref().map(|r| &r.outcome) {
            Some(Outcome::Released) => return Ok(false),
            None => false,
            Some(Outcome::Granted { permit: Some(permit), .. }) => {
                self.release_with(&permit.to_string(), costs, now, effects)?
            }
            Some(Outcome::Granted { at, permit: None, windows }) => {
                let mut shares = windows.to_vec();
                self.settle_shares(*at, &mut shares, costs, "the id's grant", now, effects)? != Settled::Unchanged
            }
            Some(Outcome::Ticketed { ticket, .. }) => self.leave(&ticket.to_string(), now, effects),
        };
        let until = now.plus(REMEMBER_MS).max(record.as_ref().map_or(Millis::ZERO, |r| r.until));
        let (params, since) = record.map_or((0, now), |r| (r.params, r.since));
        self.keep_request(key, RequestRecord { params, since, until, outcome: Outcome::Released }, now, effects);
        Ok(changed)
    }

    /// Runs the checks of records due by `now` (see [`RequestChecks`]): forgets each id whose
    /// time has passed and whose permit or ticket no longer lives, and checks the others again
    /// a minute on.
    pub(super) fn check_requests(&mut self, now: Millis, effects: &mut Vec<Effect>) {
        while let Some((_, id)) = self.request_checks.pop_due(now) {
            let Some(record) = self.requests.get(&id) else { continue }; // checked twice: forgotten
            let lives_until = match &record.outcome {
                Outcome::Granted { permit: Some(p), .. } => self.permits.get(p).map_or(Millis::ZERO, |p| p.expires),
                Outcome::Ticketed { ticket, .. } => self
                    .tickets
                    .get(&ticket.number())
                    .filter(|t| t.id == *ticket)
                    .map_or(Millis::ZERO, |t| t.state.lapse_at),
                _ => Millis::ZERO,
            };
            if record.until > now || lives_until > now {
                self.request_checks.push_back((now.plus(REMEMBER_MS), id));
                continue;
            }
            let since = record.since;
            self.requests.remove(&id);
            effects.push(Effect::RequestForgotten { id, since });
        }
    }

    /// Restores a persisted id record (checked at the restore's `now`, [`Engine::finish_restore`]).
    pub fn restore_request(&mut self, id: &str, record: RequestRecord) {
        self.requests.insert(Arc::from(id), record);
    }

    /// After a restore: a check for every record, the soonest first, none later than a minute
    /// after `now` (so that the checks pushed from then on keep the queue in order).
    pub(super) fn restore_request_checks(&mut self, now: Millis) {
        let mut checks: Vec<(Millis, Arc<str>)> =
            self.requests.iter().map(|(id, r)| (r.until.min(now.plus(REMEMBER_MS)), id.clone())).collect();
        checks.sort_unstable();
        self.request_checks = RequestChecks(checks.into());
    }

    /// The ids remembered now (for metrics and tests).
    #[must_use]
    pub fn remembered_ids(&self) -> usize {
        self.requests.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, Figures};
    use crate::request::Limit;

    const T0: Millis = Millis(1_000_000);

    fn engine() -> Engine {
        Engine::new(EngineConfig::with(250, 1))
    }

    fn named(id: &str, limits: Vec<Limit>) -> AcquireRequest {
        AcquireRequest::new("caller", limits).unwrap().with_id(id).unwrap()
    }

    fn ask(e: &mut Engine, r: &AcquireRequest, now: Millis) -> Result<LineAnswer, BadRequest> {
        e.acquire_in_line(r, now, &mut Vec::new())
    }

    fn used(e: &Engine, r: &AcquireRequest, now: Millis) -> Vec<Figures> {
        e.figures(r, now)
    }

    #[test]
    fn a_retried_grant_is_answered_as_the_first_time_and_counts_once() {
        let mut e = engine();
        let r = named("a-1", vec![Limit::window("w", 2, 60_000), Limit::concurrent("c", 2)]);
        let first = ask(&mut e, &r, T0).unwrap().decision;
        let Decision::Granted { permit: Some(_), .. } = first else { panic!("{first:?}") };
        // The retry waits for the commit that holds the first answer: it pushes its record again.
        let mut effects = Vec::new();
        let again = e.acquire_in_line(&r, T0.plus(5), &mut effects).unwrap().decision;
        assert_eq!(again, first, "the same grant, instant and permit");
        assert!(matches!(effects.as_slice(), [Effect::RequestKept { .. }]), "{effects:?}");
        let figures = used(&e, &r, T0.plus(5));
        assert_eq!((figures[0].window, figures[1].places), (Some((1, 1)), Some((1, 1))), "counted once");
        // report and graceMs may differ; the cost may not.
        let reported = r.clone().with_report().with_grace_ms(5_000).unwrap();
        assert_eq!(ask(&mut e, &reported, T0.plus(6)).unwrap().decision, first);
        let mut other = r.clone();
        other.limits[0].cost = 2;
        let err = ask(&mut e, &other, T0.plus(7)).unwrap_err();
        assert!(err.0.starts_with("id "), "{err}");
        let another_caller = AcquireRequest { key: "other".into(), ..r.clone() };
        assert!(ask(&mut e, &another_caller, T0.plus(7)).is_err());
        // A new id is a new ask.
        let fresh = AcquireRequest { id: Some("a-2".into()), ..r };
        assert!(ask(&mut e, &fresh, T0.plus(8)).unwrap().decision.is_granted());
        assert_eq!(used(&e, &fresh, T0.plus(8))[0].window, Some((2, 0)));
    }

    #[test]
    fn a_retried_filing_names_the_same_ticket_and_files_no_second() {
        let mut e = engine();
        let plain = AcquireRequest::new("caller", vec![Limit::window("w", 1, 1_000)]).unwrap();
        assert!(e.acquire(&plain, T0, &mut Vec::new()).is_granted());
        let r = named("q-1", vec![Limit::window("w", 1, 1_000)]).with_queue();
        let first = ask(&mut e, &r, T0.plus(10)).unwrap();
        let ticket = first.ticket.expect("filed").id;
        let again = ask(&mut e, &r, T0.plus(20)).unwrap();
        assert_eq!(again.decision, first.decision);
        assert_eq!(again.ticket.map(|n| n.id), Some(ticket));
        assert_eq!(used(&e, &r, T0.plus(20))[0].queued, Some(1), "one ticket");
        // A refusal that filed nothing is not remembered: asked again, it is decided afresh.
        let unqueued = named("u-1", vec![Limit::window("x", 1, 1_000)]);
        let x = AcquireRequest::new("caller", vec![Limit::window("x", 1, 1_000)]).unwrap();
        assert!(e.acquire(&x, T0, &mut Vec::new()).is_granted());
        assert!(!ask(&mut e, &unqueued, T0.plus(10)).unwrap().decision.is_granted());
        assert!(ask(&mut e, &unqueued, T0.plus(1_000)).unwrap().decision.is_granted());
    }

    #[test]
    fn release_id_frees_the_places_and_a_released_id_stays_released() {
        let mut e = engine();
        let r = named("p-1", vec![Limit::concurrent("c", 1)]);
        assert!(ask(&mut e, &r, T0).unwrap().decision.is_granted());
        assert_eq!(used(&e, &r, T0)[0].places, Some((1, 0)));
        assert_eq!(e.undo("p-1", &[], T0.plus(1), &mut Vec::new()), Ok(true));
        assert_eq!(used(&e, &r, T0.plus(1))[0].places, Some((0, 1)), "the place is free");
        assert_eq!(e.undo("p-1", &[], T0.plus(2), &mut Vec::new()), Ok(false), "once");
        let late = ask(&mut e, &r, T0.plus(3)).unwrap_err();
        assert!(late.0.starts_with("id was released"), "{late}");
        assert_eq!(used(&e, &r, T0.plus(3))[0].places, Some((0, 1)), "nothing counted");
    }

    #[test]
    fn release_id_with_zero_costs_makes_a_grant_count_nowhere() {
        let mut e = engine();
        let r = named("w-1", vec![Limit::window("w", 3, 60_000).with_cost(2), Limit::window("v", 5, 60_000)]);
        assert!(ask(&mut e, &r, T0).unwrap().decision.is_granted());
        assert_eq!(used(&e, &r, T0)[0].window, Some((2, 1)));
        // A key that was no window of the grant: refused, and nothing changes.
        let bad = [Cost::new("w", 0), Cost::new("elsewhere", 0)];
        assert!(e.undo("w-1", &bad, T0.plus(1), &mut Vec::new()).unwrap_err().0.contains("costs[1].key"));
        assert_eq!(used(&e, &r, T0.plus(1))[0].window, Some((2, 1)));
        // Without costs a grant with no place changes nothing, and is released all the same.
        let zero = [Cost::new("w", 0), Cost::new("v", 0)];
        assert_eq!(e.undo("w-1", &zero, T0.plus(2), &mut Vec::new()), Ok(true));
        let figures = used(&e, &r, T0.plus(2));
        assert_eq!((figures[0].window, figures[1].window), (Some((0, 3)), Some((0, 5))));
        let r2 = named("w-2", vec![Limit::window("w", 3, 60_000)]);
        assert!(ask(&mut e, &r2, T0.plus(3)).unwrap().decision.is_granted());
        assert_eq!(e.undo("w-2", &[], T0.plus(4), &mut Vec::new()), Ok(false), "no place, no costs: unchanged");
        assert_eq!(used(&e, &r2, T0.plus(4))[0].window, Some((1, 2)));
    }

    #[test]
    fn an_id_released_before_its_acquire_arrives_changes_nothing() {
        let mut e = engine();
        let mut effects = Vec::new();
        assert_eq!(e.undo("never", &[Cost::new("w", 0)], T0, &mut effects), Ok(false));
        assert!(effects.iter().all(Effect::needs_commit) && !effects.is_empty(), "remembered durably");
        let r = named("never", vec![Limit::window("w", 1, 1_000)]);
        assert!(ask(&mut e, &r, T0.plus(1)).is_err());
        assert_eq!(used(&e, &r, T0.plus(1))[0].window, Some((0, 1)));
        // Remembered for a minute at least, then forgotten: the id may be used afresh.
        e.sweep(T0.plus(REMEMBER_MS - 1), &mut Vec::new());
        assert!(ask(&mut e, &r, T0.plus(REMEMBER_MS - 1)).is_err());
        let mut swept = Vec::new();
        e.sweep(T0.plus(REMEMBER_MS), &mut swept);
        assert!(swept.iter().any(|f| matches!(f, Effect::RequestForgotten { .. })));
        assert!(ask(&mut e, &r, T0.plus(REMEMBER_MS)).unwrap().decision.is_granted());
    }

    #[test]
    fn release_id_of_a_filing_takes_its_ticket_out_of_the_line() {
        let mut e = engine();
        let plain = AcquireRequest::new("caller", vec![Limit::window("w", 1, 1_000)]).unwrap();
        assert!(e.acquire(&plain, T0, &mut Vec::new()).is_granted());
        let r = named("q-1", vec![Limit::window("w", 1, 1_000)]).with_queue();
        assert!(ask(&mut e, &r, T0.plus(1)).unwrap().ticket.is_some());
        assert_eq!(e.undo("q-1", &[Cost::new("w", 0)], T0.plus(2), &mut Vec::new()), Ok(true));
        assert_eq!(used(&e, &r, T0.plus(2))[0].queued, Some(0));
        assert!(ask(&mut e, &r, T0.plus(3)).is_err(), "released");
    }

    #[test]
    fn a_record_lives_as_long_as_its_permit() {
        let mut e = engine();
        let r = named("h-1", vec![Limit::concurrent("c", 1).with_hold_ms(120_000)]);
        let first = ask(&mut e, &r, T0).unwrap().decision;
        e.sweep(T0.plus(REMEMBER_MS + 1), &mut Vec::new());
        assert_eq!(ask(&mut e, &r, T0.plus(REMEMBER_MS + 1)).unwrap().decision, first, "the permit lives");
        // Forgotten within a minute of the permit's end (checked again a minute on).
        e.sweep(T0.plus(120_000 + REMEMBER_MS), &mut Vec::new());
        assert_eq!(e.remembered_ids(), 0);
        assert!(ask(&mut e, &r, T0.plus(120_000 + REMEMBER_MS)).unwrap().decision.is_granted());
    }

    #[test]
    fn the_digest_is_the_params_a_retry_must_repeat() {
        let base = named("d", vec![Limit::window("a", 1, 1_000), Limit::concurrent("b", 2)]);
        let reordered = named("d", vec![Limit::concurrent("b", 2), Limit::window("a", 1, 1_000)]);
        assert_eq!(params_digest(&base), params_digest(&reordered), "limits in any order");
        let mut max_wait = base.clone().with_grace_ms(9_000).unwrap().with_report();
        max_wait.max_wait_ms = Some(5);
        assert_eq!(params_digest(&base), params_digest(&max_wait));
        for other in [base.clone().with_permit(), base.clone().with_queue(), base.clone().with_ticket("t").unwrap()] {
            assert_ne!(params_digest(&base), params_digest(&other));
        }
        let mut hold = base.clone();
        hold.limits[1].hold_ms = 5;
        assert_ne!(params_digest(&base), params_digest(&hold));
        // Fixed across builds and restarts: a record in the file is compared with it.
        let fixed = AcquireRequest::new("k", vec![Limit::window("w", 1, 1_000)]).unwrap();
        assert_eq!(params_digest(&fixed), params_digest(&fixed.clone()));
    }
}
