//! Throttles (section 9.4): a caller key refused every call until an instant, set by
//! `throttle` (which only ever extends one), ended early by `lift`, and forgotten at its end by
//! its timer. `refusal` reads them as one more limit of every request.

use std::sync::Arc;

use super::timers::Due;
use super::{Effect, Engine};
use crate::time::Millis;

impl Engine {
    /// Ends the throttle of `key` now (section 9.4): true when one was in force.
    pub fn lift(&mut self, key: &str, now: Millis, effects: &mut Vec<Effect>) -> bool {
        if self.throttled_until(key, now).is_none() {
            return false;
        }
        let (key, _) = self.throttles.remove_entry(key).expect("in force");
        self.freed(&key);
        effects.push(Effect::ThrottleEnded { key });
        true
    }

    /// Throttles `key` until `until` (only ever extends; a past `until` changes nothing).
    /// Returns the throttle in force afterwards.
    pub fn throttle(&mut self, key: &str, until: Millis, now: Millis, effects: &mut Vec<Effect>) -> Option<Millis> {
        let current = self.throttles.get(key).copied().filter(|&u| u > now);
        if until <= now || current.is_some_and(|u| u >= until) {
            return current;
        }
        let key: Arc<str> = match self.throttles.get_key_value(key) {
            Some((k, _)) => k.clone(),
            None => Arc::from(key),
        };
        self.throttles.insert(key.clone(), until);
        self.timers.push(until, Due::Throttle(key.clone()));
        effects.push(Effect::ThrottleSet { key, until });
        Some(until)
    }

    /// The throttle in force for `key` at `now`, if any.
    #[must_use]
    pub fn throttled_until(&self, key: &str, now: Millis) -> Option<Millis> {
        self.throttles.get(key).copied().filter(|&u| u > now)
    }
}
