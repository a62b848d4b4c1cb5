//! Settling and releasing a grant (sections 9.2 and 9.3): what a settle of a permit (or a
//! `release {id}` of a grant without one) changes in the windows and token buckets its grant
//! counts in ([`Settled`]), and what a release frees (its places, handed to a waiting line).

use super::{Effect, Engine, MAX_HANDOFFS, PermitId, WindowShare, bucket_entry, token_bucket};
use crate::request::{BadRequest, Cost};
use crate::time::Millis;

/// What a settle did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Not a live permit: nothing changed (`settled: false`).
    Unknown,
    /// Settled; no window counts differently (the same figures, or grants that left).
    Unchanged,
    /// Settled; at least one window counts less, none more.
    Down,
    /// Settled; at least one window counts more.
    Up,
}

impl Settled {
    /// `Up` over `Down` over `Unchanged`.
    fn max_with(self, other: Settled) -> Settled {
        match (self, other) {
            (Settled::Up, _) | (_, Settled::Up) => Settled::Up,
            (Settled::Down, _) | (_, Settled::Down) => Settled::Down,
            _ => self,
        }
    }

    /// Whether the permit was live (`settled: true` on the wire).
    #[must_use]
    pub fn is_settled(self) -> bool {
        self != Settled::Unknown
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Settled::Unknown => "unknown",
            Settled::Unchanged => "unchanged",
            Settled::Down => "down",
            Settled::Up => "up",
        }
    }
}

impl Engine {
    /// Settles a permit's grant (section 9.3): in each named window bucket its cost becomes the
    /// given one (capped at the bucket's `calls` at the grant), at the grant's own instant.
    /// [`Settled::Unknown`] for a string that is not a live permit (nothing changes); a key
    /// that was not a window of the grant is a `BadRequest` and nothing changes. A grant that
    /// already left a bucket's window changes nothing there.
    pub fn settle(
        &mut self,
        permit: &str,
        costs: &[Cost],
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<Settled, BadRequest> {
        let Some(id) = self.live_permit(permit, now) else { return Ok(Settled::Unknown) };
        let state = self.permits.get_mut(&id).expect("live");
        let (at, mut shares) = (state.at, std::mem::take(&mut state.windows));
        let outcome = self.settle_shares(at, &mut shares, costs, "the permit's grant", now, effects);
        self.permits.get_mut(&id).expect("live").windows = shares;
        if outcome.as_ref().is_ok_and(|o| *o != Settled::Unchanged) {
            effects.push(Effect::PermitSet { id, permit: self.permits[&id].clone() });
        }
        outcome
    }

    /// Settles the window `shares` of a grant made at `at` to `costs` (each capped at its
    /// share's `calls`), at the grant's own instant, updating each share's cost: what a settle
    /// of a permit and a `release {id}` of a grant without one both do. All or nothing: a key
    /// not among the shares is a `BadRequest` naming it (`of` names the grant). A share whose
    /// grant already left its window changes nothing there; a window settled down notes its
    /// bucket for the waits.
    pub(super) fn settle_shares(
        &mut self,
        at: Millis,
        shares: &mut [WindowShare],
        costs: &[Cost],
        of: &str,
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<Settled, BadRequest> {
        for (i, c) in costs.iter().enumerate() {
            if !shares.iter().any(|w| *w.bucket == *c.key) {
                return Err(BadRequest(format!("costs[{i}].key is not a window limit of {of}")));
            }
        }
        let mut outcome = Settled::Unchanged;
        for c in costs {
            self.prune_bucket(&c.key, now);
            let share = shares.iter_mut().find(|w| *w.bucket == *c.key).expect("checked above");
            let new = c.cost.min(share.cap);
            if new == share.cost {
                continue;
            }
            if let Some(b) = share.bucket_limit() {
                // Section 13: the difference goes back into the bucket or is taken from it.
                let bucket = bucket_entry(&mut self.buckets, &mut self.bucket_keys, &share.bucket);
                let level = token_bucket::settle(bucket.level.as_ref(), &b, share.cost, new, now);
                bucket.set_level(level, effects);
                Self::arm(&mut self.timers, bucket);
                let down = new < share.cost;
                outcome = outcome.max_with(if down { Settled::Down } else { Settled::Up });
                share.cost = new;
                let key = bucket.key.clone();
                if down && self.watching {
                    self.freed(&key);
                }
                self.settle_bucket(&key, now, effects);
                continue;
            }
            let Some(bucket) = self.buckets.get_mut(&*share.bucket) else { continue };
            let Some(total) = bucket.window.settle(at, share.cost, new) else { continue };
            outcome = outcome.max_with(if new > share.cost { Settled::Up } else { Settled::Down });
            let down = new < share.cost;
            share.cost = new;
            effects.push(Effect::WindowGrant { bucket: bucket.key.clone(), at, cost: total });
            if down && self.watching {
                let key = bucket.key.clone();
                self.freed(&key);
            }
        }
        Ok(outcome)
    }

    /// The id of `permit` when it is a permit that lives at `now`.
    pub(super) fn live_permit(&self, permit: &str, now: Millis) -> Option<PermitId> {
        let id = permit.parse::<PermitId>().ok()?;
        self.permits.get(&id).is_some_and(|p| p.expires > now).then_some(id)
    }

    /// Settles `costs` (when any) and releases the permit, in one step: true when the permit
    /// was live. A bad key is a `BadRequest` and nothing changes.
    pub fn release_with(
        &mut self,
        permit: &str,
        costs: &[Cost],
        now: Millis,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, BadRequest> {
        self.release_with_outcome(permit, costs, None, now, effects)
    }

    /// Releases a permit. True when it was live (its places, if any, are freed); false for a
    /// string that is not a permit we hold, or one already released or lapsed.
    pub fn release(&mut self, permit: &str, now: Millis, effects: &mut Vec<Effect>) -> bool {
        let Ok(id) = permit.parse::<PermitId>() else {
            return false;
        };
        let Some(permit) = self.permits.remove(&id) else {
            return false;
        };
        let live = permit.expires > now;
        for (key, lapse) in &permit.places {
            let Some(bucket) = self.buckets.get_mut(key) else { continue };
            if bucket.places.remove(*lapse, id) {
                self.held_places -= 1;
                if !bucket.line.is_empty() && bucket.handoff_from.len() < MAX_HANDOFFS {
                    bucket.handoff_from.push_back(now);
                }
                self.freed(key);
            }
            self.settle_bucket(key, now, effects);
        }
        effects.push(Effect::PermitEnded { id });
        live
    }
}
