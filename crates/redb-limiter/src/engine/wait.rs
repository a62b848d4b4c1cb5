//! Wake-ups (section 15): what the engine tells a `/wait` about its tickets — whether each is
//! ready (its request, with its ticket, would be granted now), gone, or not yet and until when —
//! and holding a waited ticket from lapsing.
//!
//! The engine never waits. It notes where room may have come back (a place released, a ticket
//! ended or left, a window settled down, a throttle lifted: the bucket keys, or the caller key
//! for a lift) while someone watches ([`Engine::watch_freed`]), and the limiter wakes the waits
//! that name those keys; room that comes back with time alone (a grant leaving its window, a
//! place lapsing) is the `retry_at` a not-ready ticket is told, which the limiter sleeps to.

use std::sync::Arc;

use super::{Effect, Engine, Ticket, TicketId};
use crate::request::AcquireRequest;
use crate::time::Millis;

/// How one ticket stands for a `/wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// Its request, asked with it now, would be granted.
    Ready,
    /// Unknown, ended or lapsed.
    Gone,
    /// Refused now; nothing but time changes that before `retry_at`.
    NotYet { retry_at: Millis },
}

impl Ticket {
    /// The request this ticket binds, asking with it.
    fn request(&self) -> AcquireRequest {
        // What a ticket binds was a valid request when it was filed (or checked at load).
        let mut req = AcquireRequest::new(self.state.key.to_string(), self.state.limits.clone())
            .expect("a ticket binds a well-formed request");
        req.ticket = Some(self.id.to_string());
        req
    }
}

impl Engine {
    /// The live ticket `ticket` names at `now`, by number.
    fn live_ticket(&self, ticket: &str, now: Millis) -> Option<u64> {
        let id = ticket.parse::<TicketId>().ok()?;
        let t = self.tickets.get(&id.number())?;
        (t.id == id && t.state.lapse_at > now).then_some(id.number())
    }

    /// How `ticket` stands at `now` (see [`Readiness`]); changes nothing.
    #[must_use]
    pub fn readiness(&self, ticket: &str, now: Millis) -> Readiness {
        let Some(number) = self.live_ticket(ticket, now) else { return Readiness::Gone };
        let req = self.tickets[&number].request();
        match self.refusal(&req, now, Some(number), true) {
            None => Readiness::Ready,
            Some(refusal) => Readiness::NotYet { retry_at: refusal.retry_at },
        }
    }

    /// The keys a wait on `ticket` is woken by: its buckets and its caller key (for a lift).
    #[must_use]
    pub fn wake_keys(&self, ticket: &str, now: Millis) -> Vec<Arc<str>> {
        let Some(number) = self.live_ticket(ticket, now) else { return Vec::new() };
        let state = &self.tickets[&number].state;
        let mut keys: Vec<Arc<str>> = state.limits.iter().map(|l| Arc::from(l.key.as_str())).collect();
        keys.push(state.key.clone());
        keys
    }

    /// Holds a ticket waited on until `until` from lapsing before its grace after that (section
    /// 15), never past its horizon: its lapse moves later, as a renewal's does (and is persisted
    /// as one). False for a ticket not live at `now`.
    pub fn hold_ticket(&mut self, ticket: &str, until: Millis, now: Millis, effects: &mut Vec<Effect>) -> bool {
        let Some(number) = self.live_ticket(ticket, now) else { return false };
        let t = &self.tickets[&number];
        let lapse_at = until.plus(t.state.grace_ms).min(t.deadline);
        if lapse_at > t.state.lapse_at {
            let (retry_at, grace_ms) = (t.state.retry_at, t.state.grace_ms);
            self.set_lapse(number, lapse_at);
            effects.push(Effect::TicketRenewed { id: self.tickets[&number].id, retry_at, lapse_at, grace_ms });
        }
        true
    }

    /// Notes, from now on, the keys where room may come back (see the module docs); off, it
    /// forgets what it noted. Off by default: nobody drains it.
    pub fn watch_freed(&mut self, on: bool) {
        self.watching = on;
        if !on {
            self.freed.clear();
        }
    }

    /// The keys noted since the last call (each possibly more than once).
    pub fn take_freed(&mut self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.freed)
    }

    /// Notes that room may have come back in `key`, when watching.
    pub(super) fn freed(&mut self, key: &Arc<str>) {
        if self.watching {
            self.freed.push(key.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::EngineConfig;
    use crate::request::Limit;

    const T0: Millis = Millis(1_000_000);

    fn queued(e: &mut Engine, r: &AcquireRequest, now: Millis) -> String {
        let answer = e.acquire_in_line(&r.clone().with_queue(), now, &mut Vec::new()).unwrap();
        answer.ticket.expect("a ticket").id.to_string()
    }

    #[test]
    fn a_ticket_is_ready_exactly_when_its_request_would_be_granted() {
        let mut e = Engine::new(EngineConfig::with(250, 1));
        let r = AcquireRequest::new("caller", vec![Limit::window("w", 1, 1_000)]).unwrap();
        assert!(e.acquire(&r, T0, &mut Vec::new()).is_granted());
        let ticket = queued(&mut e, &r, T0.plus(10));
        assert_eq!(e.readiness(&ticket, T0.plus(999)), Readiness::NotYet { retry_at: T0.plus(1_000) });
        assert_eq!(e.readiness(&ticket, T0.plus(1_000)), Readiness::Ready);
        assert_eq!(e.readiness("t-nope", T0), Readiness::Gone);
        // A second ticket behind the first is not ready while the first holds the room.
        let behind = queued(&mut e, &r, T0.plus(20));
        assert!(matches!(e.readiness(&behind, T0.plus(1_000)), Readiness::NotYet { .. }));
        assert!(e.leave(&ticket, T0.plus(1_000), &mut Vec::new()));
        assert_eq!(e.readiness(&ticket, T0.plus(1_000)), Readiness::Gone);
        assert_eq!(e.readiness(&behind, T0.plus(1_000)), Readiness::Ready);
    }

    #[test]
    fn a_release_notes_its_buckets_while_watched_and_a_hold_keeps_a_ticket_live() {
        let mut e = Engine::new(EngineConfig::with(250, 1));
        let r = AcquireRequest::new("caller", vec![Limit::concurrent("c", 1)]).unwrap();
        let crate::engine::Decision::Granted { permit: Some(permit), .. } = e.acquire(&r, T0, &mut Vec::new()) else {
            panic!()
        };
        let ticket = queued(&mut e, &r, T0.plus(1));
        assert_eq!(e.readiness(&ticket, T0.plus(2)), Readiness::NotYet { retry_at: T0.plus(252) });
        let keys: Vec<String> = e.wake_keys(&ticket, T0.plus(2)).iter().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["c", "caller"]);
        e.watch_freed(true);
        assert!(e.release(&permit.to_string(), T0.plus(3), &mut Vec::new()));
        assert_eq!(e.take_freed().iter().map(|k| k.to_string()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(e.readiness(&ticket, T0.plus(3)), Readiness::Ready);
        // Held for a wait, the ticket outlives its grace (and no more than its horizon).
        let lapse = |e: &Engine| e.tickets.values().next().unwrap().state.lapse_at;
        let mut effects = Vec::new();
        assert!(e.hold_ticket(&ticket, T0.plus(30_000), T0.plus(3), &mut effects));
        assert_eq!(lapse(&e), T0.plus(30_000 + crate::request::DEFAULT_GRACE_MS));
        assert!(matches!(effects.as_slice(), [Effect::TicketRenewed { .. }]));
        assert!(e.hold_ticket(&ticket, T0.plus(1 << 40), T0.plus(4), &mut Vec::new()));
        assert_eq!(lapse(&e), T0.plus(1).plus(crate::engine::DEFAULT_LINE_HORIZON_MS), "its horizon");
        e.watch_freed(false);
        assert!(e.take_freed().is_empty());
    }
}
