//! Rebuilding the engine from what the store persisted: the `restore_*` calls put back each
//! record (bucket settings, token levels, grants, permits, throttles, tickets), [`Engine::resume_line`]
//! gives the line's tickets back their grace after a restart, and [`Engine::finish_restore`]
//! prunes what lapsed while the file was closed and arms every timer.

use std::sync::Arc;

use super::line::Waiting;
use super::timers::Due;
use super::{
    BucketLevel, BucketMeta, Effect, Engine, PermitId, PermitState, Ticket, TicketId, TicketState, bucket_entry,
};
use crate::time::Millis;

impl Engine {
    /// Restores a bucket's settings from the file (before its grants).
    pub fn restore_bucket(&mut self, key: &str, meta: BucketMeta) {
        bucket_entry(&mut self.buckets, &mut self.bucket_keys, key).meta = meta;
    }

    /// Restores a token bucket's persisted level (section 13): it refills from there by the time
    /// that passed.
    pub fn restore_level(&mut self, key: &str, level: BucketLevel) {
        bucket_entry(&mut self.buckets, &mut self.bucket_keys, key).level = Some(level);
    }

    /// Restores one persisted grant. Grants of one bucket must come in time order.
    pub fn restore_grant(&mut self, key: &str, at: Millis, cost: u64) {
        bucket_entry(&mut self.buckets, &mut self.bucket_keys, key).window.restore(at, cost);
    }

    /// Restores a persisted permit with its places and window shares.
    pub fn restore_permit(&mut self, id: PermitId, mut permit: PermitState) {
        for (key, lapse) in &mut permit.places {
            let bucket = bucket_entry(&mut self.buckets, &mut self.bucket_keys, key);
            bucket.places.insert(*lapse, id);
            self.held_places += 1;
            *key = bucket.key.clone();
        }
        self.permits.insert(id, permit);
    }

    /// Restores a persisted throttle.
    pub fn restore_throttle(&mut self, key: &str, until: Millis) {
        self.throttles.insert(Arc::from(key), until);
    }

    /// Restores a persisted ticket into the table and the lines of the buckets it names. New
    /// tickets are numbered above it.
    pub fn restore_ticket(&mut self, id: TicketId, state: TicketState) {
        let number = id.number();
        for limit in &state.limits {
            bucket_entry(&mut self.buckets, &mut self.bucket_keys, &limit.key)
                .line
                .insert(number, Waiting::new(limit, state.lapse_at, state.retry_at));
        }
        self.next_ticket = self.next_ticket.max(number.saturating_add(1));
        let timer_at = state.lapse_at;
        // Its own horizon when the file kept it, else the server's (a file of format 6 or older).
        let horizon_end = state.deadline.unwrap_or_else(|| state.filed_at.plus(self.config.line_horizon_ms));
        let deadline = horizon_end.max(state.lapse_at);
        self.tickets.insert(number, Ticket { id, state, deadline, timer_at });
    }

    /// After the `restore_*` calls and before [`Engine::finish_restore`], when the engine starts
    /// again from a file whose latest instant is `floor` (section 12.6): a ticket that had
    /// lapsed by `floor` lapses; every other keeps its place and lapses no sooner than `now`
    /// plus its grace, so its host can reach the limiter again before it does. (Renewals after
    /// the file's latest commit may have been lost; a ticket live then was live at `floor`.)
    pub fn resume_line(&mut self, floor: Millis, now: Millis, effects: &mut Vec<Effect>) {
        let mut numbers: Vec<u64> = self.tickets.keys().copied().collect();
        numbers.sort_unstable();
        for number in numbers {
            let ticket = &self.tickets[&number];
            let (id, state) = (ticket.id, &ticket.state);
            if state.lapse_at <= floor {
                self.end_ticket(number, Effect::TicketLapsed { id }, now, effects);
                continue;
            }
            let earliest = now.plus(state.grace_ms);
            if state.lapse_at < earliest {
                let (retry_at, grace_ms) = (state.retry_at, state.grace_ms);
                let ticket = self.tickets.get_mut(&number).expect("listed");
                ticket.state.lapse_at = earliest;
                ticket.deadline = ticket.deadline.max(earliest);
                for limit in &ticket.state.limits {
                    if let Some(waiting) =
                        self.buckets.get_mut(limit.key.as_str()).and_then(|b| b.line.get_mut(&number))
                    {
                        waiting.lapse = earliest;
                    }
                }
                effects.push(Effect::TicketRenewed { id, retry_at, lapse_at: earliest, grace_ms });
            }
        }
    }

    /// After the `restore_*` calls: prunes what lapsed while the file was closed (pushing the
    /// effects that delete it from the file) and arms every timer.
    pub fn finish_restore(&mut self, now: Millis, effects: &mut Vec<Effect>) {
        self.timers.clear();
        self.restore_request_checks(now);
        let keys: Vec<Arc<str>> = self.buckets.keys().cloned().collect();
        for key in keys {
            let bucket = self.buckets.get_mut(&key).expect("listed");
            bucket.timer_at = Millis(u64::MAX);
            bucket.prune(now);
            if bucket.is_forgettable() {
                self.bucket_keys.remove(&key);
                if let Some(bucket) = self.buckets.remove(&key) {
                    bucket.forget(effects);
                }
            } else if bucket.is_idle() {
                // Only a line keeps it: forgotten when its last ticket leaves.
                bucket.take_pruned(effects);
            } else {
                bucket.take_pruned(effects);
                bucket.timer_at = bucket.idle_at();
                self.timers.push(bucket.timer_at, Due::Bucket(key));
            }
        }
        self.held_places = self.buckets.values().map(|b| b.places.len()).sum();
        self.finish_restore_ceilings(now, effects);
        let lapsed: Vec<PermitId> = self.permits.iter().filter(|(_, p)| p.expires <= now).map(|(id, _)| *id).collect();
        for id in lapsed {
            self.permits.remove(&id);
            effects.push(Effect::PermitEnded { id });
        }
        for (id, p) in &self.permits {
            self.timers.push(p.expires, Due::Permit(*id));
        }
        let passed: Vec<Arc<str>> = self.throttles.iter().filter(|(_, u)| **u <= now).map(|(k, _)| k.clone()).collect();
        for key in passed {
            self.throttles.remove(&key);
            effects.push(Effect::ThrottleEnded { key });
        }
        for (key, until) in &self.throttles {
            self.timers.push(*until, Due::Throttle(key.clone()));
        }
        let mut lapsed: Vec<(u64, TicketId)> =
            self.tickets.iter().filter(|(_, t)| t.state.lapse_at <= now).map(|(n, t)| (*n, t.id)).collect();
        lapsed.sort_unstable();
        for (number, id) in lapsed {
            self.end_ticket(number, Effect::TicketLapsed { id }, now, effects);
        }
        for (number, t) in &mut self.tickets {
            t.timer_at = t.state.lapse_at;
            self.timers.push(t.timer_at, Due::Ticket(*number));
        }
    }
}
