//! The recent-decisions feed behind `GET /recent`: the latest refusals (caller, bucket, reason,
//! the wait it was told) and acquire decisions per second, granted and refused by reason, over
//! the last few minutes.
//!
//! It owns a small bounded memory the server fills after each acquire is answered: a ring of
//! [`REFUSALS_KEPT`] refusals and one counter row per second for [`SECONDS_KEPT`] seconds, behind
//! one mutex held for a few increments. A grant costs one lock and one increment; nothing here
//! is durable (a restart starts it empty), and nothing in it decides anything.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use redb_limiter::Millis;
use redb_limiter::engine::{Decision, Reason};
use redb_limiter::wire::Instant;

/// How many refusals the feed keeps (the newest).
pub const REFUSALS_KEPT: usize = 50;
/// How many seconds of per-second counts the feed keeps.
pub const SECONDS_KEPT: usize = 300;

/// One refused acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecentRefusal {
    /// When it was refused.
    pub at: Instant,
    /// The caller key of the request.
    pub caller: String,
    /// The bucket (for a throttle, the caller key) whose `retryAt` stood.
    pub limit: String,
    /// `rate`, `concurrency` or `throttle`.
    pub reason: String,
    pub retry_at: Instant,
    /// `retryAt` less `at`: how long the caller was told to wait.
    pub wait_ms: u64,
}

/// Acquire decisions per second: element `i` of each series counts the second that starts at
/// `from` plus `i` seconds; the last element is the second that holds `now`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PerSecond {
    pub from: Instant,
    pub granted: Vec<u64>,
    pub rate: Vec<u64>,
    pub concurrency: Vec<u64>,
    pub throttle: Vec<u64>,
}

/// The reply to `GET /recent`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecentReply {
    pub now: Instant,
    /// Newest first.
    pub refusals: Vec<RecentRefusal>,
    pub per_second: PerSecond,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Second {
    /// Seconds since the epoch.
    sec: u64,
    granted: u64,
    rate: u64,
    concurrency: u64,
    throttle: u64,
}

#[derive(Debug, Default)]
struct Inner {
    refusals: VecDeque<RecentRefusal>,
    /// Ascending `sec`, none older than `SECONDS_KEPT` before the newest.
    seconds: VecDeque<Second>,
}

/// The feed's memory; see the module docs.
#[derive(Debug, Default)]
pub struct Recent {
    inner: Mutex<Inner>,
}

impl Recent {
    /// Notes one answered acquire of `caller`, decided at `now`.
    pub fn record(&self, now: Millis, caller: &str, decision: &Decision) {
        let sec = now.0 / 1000;
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let row = inner.second(sec);
        match decision {
            Decision::Granted { .. } => {
                if let Some(row) = row {
                    row.granted += 1;
                }
            }
            Decision::Refused { retry_at, reason, limit } => {
                if let Some(row) = row {
                    match reason {
                        Reason::Rate => row.rate += 1,
                        Reason::Concurrency => row.concurrency += 1,
                        Reason::Throttle => row.throttle += 1,
                    }
                }
                if inner.refusals.len() == REFUSALS_KEPT {
                    inner.refusals.pop_front();
                }
                inner.refusals.push_back(RecentRefusal {
                    at: Instant(now),
                    caller: caller.to_owned(),
                    limit: limit.clone(),
                    reason: reason.as_str().to_owned(),
                    retry_at: Instant(*retry_at),
                    wait_ms: retry_at.since(now),
                });
            }
        }
    }

    /// What `GET /recent` answers at `now`.
    #[must_use]
    pub fn reply(&self, now: Millis) -> RecentReply {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let last = now.0 / 1000;
        let first = (last + 1).saturating_sub(SECONDS_KEPT as u64);
        let len = (last + 1 - first) as usize;
        let mut per_second = PerSecond {
            from: Instant(Millis(first * 1000)),
            granted: vec![0; len],
            rate: vec![0; len],
            concurrency: vec![0; len],
            throttle: vec![0; len],
        };
        for s in inner.seconds.iter().filter(|s| (first..=last).contains(&s.sec)) {
            let i = (s.sec - first) as usize;
            per_second.granted[i] = s.granted;
            per_second.rate[i] = s.rate;
            per_second.concurrency[i] = s.concurrency;
            per_second.throttle[i] = s.throttle;
        }
        RecentReply { now: Instant(now), refusals: inner.refusals.iter().rev().cloned().collect(), per_second }
    }
}

impl Inner {
    /// The counter row of second `sec`, made when missing; `None` when it is older than the
    /// rows kept (a decision whose instant lags the newest by minutes).
    fn second(&mut self, sec: u64) -> Option<&mut Second> {
        let newest = self.seconds.back().map(|s| s.sec);
        match newest {
            Some(newest) if sec <= newest => {
                if newest - sec >= SECONDS_KEPT as u64 {
                    return None;
                }
                let at = self.seconds.partition_point(|s| s.sec < sec);
                if self.seconds.get(at).is_none_or(|s| s.sec != sec) {
                    self.seconds.insert(at, Second { sec, ..Second::default() });
                }
                self.seconds.get_mut(at)
            }
            _ => {
                while self.seconds.front().is_some_and(|s| s.sec + SECONDS_KEPT as u64 <= sec) {
                    self.seconds.pop_front();
                }
                self.seconds.push_back(Second { sec, ..Second::default() });
                self.seconds.back_mut()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(retry_at: u64, reason: Reason, limit: &str) -> Decision {
        Decision::Refused { retry_at: Millis(retry_at), reason, limit: limit.to_owned() }
    }

    const GRANTED: Decision = Decision::Granted { at: Millis(0), permit: None };

    #[test]
    fn counts_each_second_and_keeps_the_newest_refusals_first() {
        let recent = Recent::default();
        let t = 1_800_000_000_000;
        recent.record(Millis(t), "a", &GRANTED);
        recent.record(Millis(t + 10), "a", &GRANTED);
        recent.record(Millis(t + 20), "a", &refused(t + 270, Reason::Rate, "w"));
        recent.record(Millis(t + 1500), "b", &refused(t + 4000, Reason::Throttle, "b"));
        recent.record(Millis(t + 1600), "c", &refused(t + 1700, Reason::Concurrency, "c1"));
        let reply = recent.reply(Millis(t + 1999));
        let n = reply.per_second.granted.len();
        assert_eq!(n, SECONDS_KEPT);
        assert_eq!(reply.per_second.from.0, Millis(t + 2000 - SECONDS_KEPT as u64 * 1000));
        assert_eq!(&reply.per_second.granted[n - 2..], &[2, 0]);
        assert_eq!(&reply.per_second.rate[n - 2..], &[1, 0]);
        assert_eq!(&reply.per_second.throttle[n - 2..], &[0, 1]);
        assert_eq!(&reply.per_second.concurrency[n - 2..], &[0, 1]);
        let who: Vec<_> = reply.refusals.iter().map(|r| (r.caller.as_str(), r.limit.as_str(), r.wait_ms)).collect();
        assert_eq!(who, [("c", "c1", 100), ("b", "b", 2500), ("a", "w", 250)]);
        assert_eq!(reply.refusals[2].reason, "rate");
    }

    #[test]
    fn stays_bounded_and_forgets_old_seconds() {
        let recent = Recent::default();
        let t = 1_800_000_000_000;
        for i in 0..(REFUSALS_KEPT as u64 + 7) {
            recent.record(Millis(t + i * 1000), &format!("c{i}"), &refused(t + i * 1000 + 5, Reason::Rate, "w"));
        }
        let inner = recent.inner.lock().unwrap();
        assert_eq!(inner.refusals.len(), REFUSALS_KEPT);
        assert_eq!(inner.refusals.back().unwrap().caller, format!("c{}", REFUSALS_KEPT + 6));
        drop(inner);
        // Minutes later, the old rows are gone and a late decision from before them is dropped.
        let later = t + 1000 * (SECONDS_KEPT as u64 + 100);
        recent.record(Millis(later), "x", &GRANTED);
        recent.record(Millis(t), "late", &GRANTED);
        assert_eq!(recent.inner.lock().unwrap().seconds.len(), 1);
        let reply = recent.reply(Millis(later));
        assert_eq!(reply.per_second.granted.iter().sum::<u64>(), 1);
        // A decision a little out of order lands in its own second.
        recent.record(Millis(later - 3000), "y", &GRANTED);
        let reply = recent.reply(Millis(later));
        assert_eq!(&reply.per_second.granted[SECONDS_KEPT - 4..], &[1, 0, 0, 1]);
    }
}
