//! Tickets in the engine (section 12): the table of tickets by number, and what the engine does
//! with one: file it at the back of every line its request names, check one a request presents
//! against what it binds, renew it, move its lapse, count the tickets ahead of it, and end it
//! (granted, left or lapsed). What a bucket's line says of a request (rule Q) is `line.rs`'s.

use std::sync::Arc;

use super::line::{Waiting, bound_limits, ticket_id};
use super::timers::Due;
use super::{Bucket, Effect, Engine, MAX_LINE, TicketEnd, TicketId, TicketNote, TicketState, bucket_entry};
use crate::request::{AcquireRequest, BadRequest};
use crate::time::Millis;

/// A ticket in the engine: its id and state.
#[derive(Debug, Clone)]
pub(super) struct Ticket {
    pub(super) id: TicketId,
    pub(super) state: TicketState,
    /// It never lapses later than this (section 12.9): its filing plus the horizon it was filed
    /// under (kept in its state); after a restart, or its resumed lapse if later.
    pub(super) deadline: Millis,
    /// The instant of its one live timer (never after its lapse): a renewal that moves the lapse
    /// later arms no timer; the one armed re-arms itself when it fires early.
    pub(super) timer_at: Millis,
}

impl Engine {
    /// The id `req.ticket` names, when it is a ticket this engine holds (live or lapsed).
    pub(super) fn known_ticket(&self, req: &AcquireRequest) -> Option<u64> {
        let id: TicketId = req.ticket.as_deref()?.parse().ok()?;
        self.tickets.get(&id.number()).is_some_and(|t| t.id == id).then_some(id.number())
    }

    /// The number of the live ticket `req` presents, checked against what it binds (section
    /// 12.3). A lapsed ticket still held leaves its lines now: it is then unknown, like an
    /// ended one.
    pub(super) fn presented(
        &mut self,
        req: &AcquireRequest,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<Option<u64>, BadRequest> {
        let Some(number) = self.known_ticket(req) else { return Ok(None) };
        let ticket = &self.tickets[&number];
        if ticket.state.lapse_at <= now {
            self.end_ticket(number, Effect::TicketLapsed { id: ticket.id }, now, effects);
            return Ok(None);
        }
        if !ticket.state.binds(&req.key, &req.limits) {
            return Err(unbound_ticket());
        }
        Ok(Some(number))
    }

    /// The horizon a ticket of `req` is filed under (section 12.9): the server's, or the host's
    /// `maxWaitMs` when shorter.
    pub(super) fn horizon_of(&self, req: &AcquireRequest) -> u64 {
        req.max_wait_ms.map_or(self.config.line_horizon_ms, |m| m.min(self.config.line_horizon_ms))
    }

    /// Files a ticket for `req`, refused until `retry_at`, at the back of every line it names,
    /// never to lapse after `deadline`; `None` when one of them holds [`MAX_LINE`] live tickets
    /// already (section 12.1).
    pub(super) fn file(
        &mut self,
        req: &AcquireRequest,
        retry_at: Millis,
        deadline: Millis,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Option<TicketNote> {
        let full = |b: &Bucket| b.line.len() >= MAX_LINE && b.queued(now) >= MAX_LINE as u64;
        if req.limits.iter().any(|l| self.buckets.get(l.key.as_str()).is_some_and(full)) {
            return None;
        }
        let number = self.next_ticket;
        self.next_ticket += 1;
        let id = ticket_id(self.ticket_key, number);
        let lapse_at = retry_at.plus(req.grace_ms).min(deadline);
        let state = TicketState {
            filed_at: now,
            retry_at,
            lapse_at,
            grace_ms: req.grace_ms,
            key: Arc::from(req.key.as_str()),
            limits: bound_limits(&req.limits),
            deadline: Some(deadline),
        };
        for limit in &req.limits {
            bucket_entry(&mut self.buckets, &mut self.bucket_keys, &limit.key)
                .line
                .insert(number, Waiting::new(limit, lapse_at, retry_at));
        }
        self.timers.push(lapse_at, Due::Ticket(number));
        effects.push(Effect::TicketFiled { id, ticket: state.clone() });
        self.tickets.insert(number, Ticket { id, state, deadline, timer_at: lapse_at });
        Some(TicketNote { id, lapse_at, ahead: self.ahead(number, now), now })
    }

    /// A live ticket asked again and refused until `retry_at`: it keeps its place and lapses
    /// `grace_ms` after that.
    pub(super) fn renew(
        &mut self,
        number: u64,
        retry_at: Millis,
        grace_ms: u64,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> TicketNote {
        let ticket = self.tickets.get_mut(&number).expect("a live ticket");
        // Never past its horizon (12.9), and never before now: it was live when presented.
        let lapse_at = retry_at.plus(grace_ms).min(ticket.deadline).max(now.plus(1));
        ticket.state.retry_at = retry_at;
        ticket.state.grace_ms = grace_ms;
        let id = ticket.id;
        self.each_waiting(number, |waiting| waiting.retry_at = retry_at);
        self.set_lapse(number, lapse_at);
        effects.push(Effect::TicketRenewed { id, retry_at, lapse_at, grace_ms });
        TicketNote { id, lapse_at, ahead: self.ahead(number, now), now }
    }

    /// Moves ticket `number`'s lapse to `lapse_at`, in the table and in each of its lines; a
    /// sooner lapse arms a timer (a later one is found when the armed one fires).
    pub(super) fn set_lapse(&mut self, number: u64, lapse_at: Millis) {
        self.each_waiting(number, |waiting| waiting.lapse = lapse_at);
        let ticket = self.tickets.get_mut(&number).expect("a live ticket");
        ticket.state.lapse_at = lapse_at;
        if lapse_at < ticket.timer_at {
            ticket.timer_at = lapse_at;
            self.timers.push(lapse_at, Due::Ticket(number));
        }
    }

    /// Applies `change` to ticket `number`'s place in each of its lines.
    fn each_waiting(&mut self, number: u64, mut change: impl FnMut(&mut Waiting)) {
        let Some(ticket) = self.tickets.get(&number) else { return };
        for limit in &ticket.state.limits {
            if let Some(waiting) = self.buckets.get_mut(limit.key.as_str()).and_then(|b| b.line.get_mut(&number)) {
                change(waiting);
            }
        }
    }

    /// The most live tickets ahead of ticket `number` in any one of its lines.
    pub(super) fn ahead(&self, number: u64, now: Millis) -> u64 {
        let ticket = &self.tickets[&number];
        ticket
            .state
            .limits
            .iter()
            .filter_map(|l| self.buckets.get(l.key.as_str()))
            .map(|b| b.line.range(..number).filter(|(_, w)| w.lapse > now).count() as u64)
            .max()
            .unwrap_or(0)
    }

    /// Removes ticket `number` from the table and its lines, pushing `why` (its end or lapse);
    /// a bucket left with nothing is forgotten.
    pub(super) fn end_ticket(&mut self, number: u64, why: Effect, now: Millis, effects: &mut Vec<Effect>) {
        let Some(ticket) = self.tickets.remove(&number) else { return };
        effects.push(why);
        for limit in &ticket.state.limits {
            if let Some(bucket) = self.buckets.get_mut(limit.key.as_str()) {
                bucket.line.remove(&number);
                if bucket.line.is_empty() {
                    // No one waits any more: the places freed for the line stop counting as idle.
                    for from in bucket.handoff_from.drain(..) {
                        self.idle_place_ms = self.idle_place_ms.saturating_add(now.since(from));
                    }
                }
                if self.watching {
                    let key = bucket.key.clone();
                    self.freed(&key);
                }
            }
            self.settle_bucket(&limit.key, now, effects);
        }
    }

    /// Leaves the line (`release {ticket}`, section 12.4): true when a live ticket left its
    /// lines; false for a string that is not one of our tickets, or one ended or lapsed.
    pub fn leave(&mut self, ticket: &str, now: Millis, effects: &mut Vec<Effect>) -> bool {
        let Ok(id) = ticket.parse::<TicketId>() else { return false };
        let number = id.number();
        match self.tickets.get(&number) {
            Some(t) if t.id == id && t.state.lapse_at > now => {
                self.end_ticket(number, Effect::TicketEnded { id, end: TicketEnd::Left }, now, effects);
                true
            }
            Some(t) if t.id == id => {
                self.end_ticket(number, Effect::TicketLapsed { id }, now, effects);
                false
            }
            _ => false,
        }
    }
}

pub(super) fn unbound_ticket() -> BadRequest {
    BadRequest("ticket was filed for another request: the caller key and the limits (key, calls, refill, perMs, burst, initial, cost, concurrent, holdMs) must be the ones it was filed with".into())
}
