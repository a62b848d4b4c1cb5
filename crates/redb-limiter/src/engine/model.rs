//! Test oracles shared by the property tests and the fuzz targets (the `model` feature):
//!
//! - [`Reference`]: a brute-force limiter that keeps every grant and permit forever and
//!   recomputes each decision from scratch, straight from the spec's rules.
//! - [`EffectLog`]: what the store would hold, as plain maps the effects are applied to (as
//!   redb's fuzzer keeps a `BTreeMap` beside the real table), and an engine rebuilt from it.
//!
//! The reference assumes each bucket key is always named with the same `perMs` (rule 3 with
//! changing windows has its own named test); it is slow on purpose and never used in serving.

use std::collections::BTreeMap;

use super::{BucketMeta, Effect, Engine, EngineConfig, Facts, PermitId, Reason};
use crate::request::AcquireRequest;
use crate::time::Millis;

/// The brute-force reference limiter.
#[derive(Debug, Default, Clone)]
pub struct Reference {
    /// Every grant ever, per bucket: (instant, cost capped at calls).
    pub grants: BTreeMap<String, Vec<(Millis, u64)>>,
    /// The `perMs` each bucket is named with.
    pub per_ms: BTreeMap<String, u64>,
    /// Live permits → places (bucket, lapse); removed on release.
    pub permits: BTreeMap<PermitId, Vec<(String, Millis)>>,
    pub throttles: BTreeMap<String, Millis>,
}

impl Reference {
    /// The refusal that stands for `r` at `now` as (retryAt, reason, key), or `None` to grant.
    #[must_use]
    pub fn decide(&self, r: &AcquireRequest, now: Millis, recheck_ms: u64) -> Option<(Millis, Reason, String)> {
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
            if let Some(w) = l.window {
                let cost = l.cost.min(w.calls);
                let live: Vec<(Millis, u64)> = self
                    .grants
                    .get(&l.key)
                    .map(|g| g.iter().copied().filter(|(t, _)| t.plus(w.per_ms) > now).collect())
                    .unwrap_or_default();
                let used: u64 = live.iter().map(|(_, c)| c).sum();
                if cost > 0 && used + cost > w.calls {
                    // The first grant whose leaving makes room.
                    let mut left = used;
                    let at = live
                        .iter()
                        .find_map(|(t, c)| {
                            left -= c;
                            (left + cost <= w.calls).then_some(t.plus(w.per_ms))
                        })
                        .expect("a cost capped at calls fits in an empty window");
                    consider(at, Reason::Rate, &l.key);
                }
            }
            if let Some(c) = l.concurrent {
                let mut lapses: Vec<Millis> = self
                    .permits
                    .values()
                    .flatten()
                    .filter(|(b, lapse)| *b == l.key && *lapse > now)
                    .map(|(_, lapse)| *lapse)
                    .collect();
                lapses.sort();
                let held = lapses.len() as u64;
                if held >= c {
                    consider(lapses[(held - c) as usize].min(now.plus(recheck_ms)), Reason::Concurrency, &l.key);
                }
            }
        }
        worst
    }

    /// Records a grant of `r` at `now` holding `permit`.
    pub fn grant(&mut self, r: &AcquireRequest, now: Millis, permit: Option<PermitId>) {
        let mut places = Vec::new();
        for l in &r.limits {
            if let Some(w) = l.window {
                let cost = l.cost.min(w.calls);
                if cost > 0 {
                    self.grants.entry(l.key.clone()).or_default().push((now, cost));
                    self.per_ms.insert(l.key.clone(), w.per_ms);
                }
            }
            if l.concurrent.is_some() {
                places.push((l.key.clone(), now.plus(l.hold_ms)));
            }
        }
        if let Some(id) = permit {
            self.permits.insert(id, places);
        }
    }

    /// A release: true when it freed a place.
    pub fn release(&mut self, id: Option<PermitId>, now: Millis) -> bool {
        id.and_then(|id| self.permits.remove(&id)).is_some_and(|places| places.iter().any(|(_, l)| *l > now))
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

    /// The facts the engine must hold at `now`.
    #[must_use]
    pub fn facts(&self, now: Millis) -> Facts {
        let mut facts = Facts::default();
        let keys = self.grants.keys().chain(self.permits.values().flatten().map(|(b, _)| b));
        for key in keys {
            if facts.buckets.contains_key(key) {
                continue;
            }
            let per_ms = self.per_ms.get(key).copied().unwrap_or(0);
            let mut grants: Vec<(Millis, u64)> = Vec::new();
            for &(t, c) in self.grants.get(key).into_iter().flatten() {
                if t.plus(per_ms) > now {
                    match grants.last_mut() {
                        Some(last) if last.0 == t => last.1 += c,
                        _ => grants.push((t, c)),
                    }
                }
            }
            let mut places: Vec<(Millis, PermitId)> = self
                .permits
                .iter()
                .flat_map(|(id, ps)| ps.iter().filter(|(b, l)| b == key && *l > now).map(|(_, l)| (*l, *id)))
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
        facts
    }

    /// The instants after `now` at which something leaves: window edges, lapses, throttle ends.
    #[must_use]
    pub fn edges(&self, now: Millis) -> Vec<Millis> {
        let mut edges: Vec<Millis> = self
            .grants
            .iter()
            .flat_map(|(k, g)| {
                let per = self.per_ms.get(k).copied().unwrap_or(0);
                g.iter().map(move |(t, _)| t.plus(per))
            })
            .chain(self.permits.values().flatten().map(|(_, l)| *l))
            .chain(self.throttles.values().copied())
            .filter(|&t| t > now)
            .collect();
        edges.sort();
        edges.dedup();
        edges
    }

    /// The most any window of `per_ms` of `bucket` ever held: checked against `calls`.
    #[must_use]
    pub fn max_window_use(&self, bucket: &str, per_ms: u64) -> u64 {
        let grants = self.grants.get(bucket).map(Vec::as_slice).unwrap_or_default();
        grants
            .iter()
            .map(|(start, _)| {
                grants.iter().filter(|(t, _)| t >= start && *t < start.plus(per_ms)).map(|(_, c)| c).sum()
            })
            .max()
            .unwrap_or(0)
    }
}

/// What the store would hold, as plain maps.
#[derive(Default, Debug, Clone)]
pub struct EffectLog {
    pub meta: BTreeMap<String, BucketMeta>,
    pub grants: BTreeMap<(String, Millis), u64>,
    pub permits: BTreeMap<PermitId, Vec<(String, Millis)>>,
    pub throttles: BTreeMap<String, Millis>,
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
                Effect::PermitGranted { id, places } => {
                    self.permits.insert(*id, places.iter().map(|(b, l)| (b.to_string(), *l)).collect());
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
            }
        }
    }

    /// An engine rebuilt from the log at `now`; the restore's own effects are applied too.
    pub fn rebuild(&mut self, config: EngineConfig, now: Millis) -> Engine {
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
        let mut effects = Vec::new();
        e.finish_restore(now, &mut effects);
        self.apply(&effects);
        e
    }
}
