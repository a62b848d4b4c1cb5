//! The sweep: forgetting what has lapsed when its timer comes due (an idle bucket, a permit whose
//! places all lapsed, a passed throttle, a ceiling kept long enough, a lapsed ticket, a request
//! id that lived its time), and the instant the next one does ([`Engine::next_deadline`]).

use super::timers::Due;
use super::{Effect, Engine};
use crate::time::Millis;

impl Engine {
    /// The soonest instant at which [`Engine::sweep`] has work (it may find none then).
    #[must_use]
    pub fn next_deadline(&self) -> Option<Millis> {
        match (self.timers.next_at(), self.request_checks.next_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Forgets what has lapsed by `now`: idle buckets, permits whose places all lapsed, passed
    /// throttles. Returns the next deadline.
    pub fn sweep(&mut self, now: Millis, effects: &mut Vec<Effect>) -> Option<Millis> {
        while let Some((at, due)) = self.timers.pop_due(now) {
            match due {
                Due::Bucket(key) => {
                    let Some(bucket) = self.buckets.get_mut(&key) else { continue };
                    if bucket.timer_at != at {
                        continue; // a stale timer: the bucket was rescheduled
                    }
                    bucket.timer_at = Millis(u64::MAX);
                    if !bucket.is_idle() {
                        bucket.take_pruned(effects);
                    }
                    self.settle_bucket(&key, now, effects);
                    if let Some(bucket) = self.buckets.get_mut(&key)
                        && bucket.timer_at == Millis(u64::MAX)
                        && !bucket.is_idle()
                    {
                        // Not idle yet and no earlier timer: wake when it will be.
                        bucket.timer_at = bucket.idle_at();
                        self.timers.push(bucket.timer_at, Due::Bucket(key));
                    }
                }
                Due::Permit(id) => {
                    if self.permits.get(&id).is_some_and(|p| p.expires <= now) {
                        self.permits.remove(&id);
                        effects.push(Effect::PermitEnded { id });
                    }
                }
                Due::Throttle(key) => {
                    if self.throttles.get(&key).is_some_and(|&u| u <= now) {
                        self.throttles.remove(&key);
                        effects.push(Effect::ThrottleEnded { key });
                    }
                }
                Due::Ceiling(key) => self.ceiling_due(&key, now, effects),
                Due::Ticket(number) => {
                    let Some(t) = self.tickets.get_mut(&number).filter(|t| t.timer_at == at) else { continue };
                    if t.state.lapse_at <= now {
                        let id = t.id;
                        self.end_ticket(number, Effect::TicketLapsed { id }, now, effects);
                    } else {
                        // Renewed since it was armed: wake at its lapse instead.
                        t.timer_at = t.state.lapse_at;
                        self.timers.push(t.timer_at, Due::Ticket(number));
                    }
                }
            }
        }
        self.check_requests(now, effects);
        self.next_deadline()
    }
}
