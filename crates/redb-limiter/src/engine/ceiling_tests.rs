//! The engine's adaptive ceilings (section 14), rule by rule: judged with `C` (starting at
//! `calls`), a cut once per overload, growth only in play and at most once per `perMs`, bounds,
//! an outcome counted once, an unknown permit, a bucket's burst scaled, the line judged with
//! `C`, kept and forgotten, and a restart from what the store keeps.

use super::model::EffectLog;
use super::tests::{T0, engine, req};
use super::*;
use crate::request::{Adapt, Limit, Signal};

fn refused(retry_at: Millis, limit: &str) -> Decision {
    Decision::Refused { retry_at, reason: Reason::Rate, limit: limit.to_owned() }
}

/// 10 a second, adapting within [2, 20] by 1, a cut keeping half.
fn adapted(calls: u64) -> AcquireRequest {
    let adapt = Adapt { min: 2, max: 20, increase: 1, keep_pct: 50 };
    req(vec![Limit::window("w", calls, 1000).with_adapt(adapt)]).with_permit()
}

/// A grant's permit, as a string.
fn grant(e: &mut Engine, r: &AcquireRequest, now: Millis, effects: &mut Vec<Effect>) -> String {
    match e.acquire(r, now, effects) {
        Decision::Granted { permit: Some(p), .. } => p.to_string(),
        other => panic!("not granted with a permit: {other:?}"),
    }
}

fn ceiling(e: &Engine, r: &AcquireRequest, now: Millis) -> Option<u64> {
    e.figures(r, now)[0].ceiling
}

#[test]
fn a_limited_outcome_cuts_once_per_overload_and_the_request_is_judged_with_the_cut() {
    let mut e = engine();
    let r = adapted(10);
    let mut effects = Vec::new();
    assert_eq!(ceiling(&e, &r, T0), Some(10), "starts at calls");
    let a = grant(&mut e, &r, T0, &mut effects);
    let b = grant(&mut e, &r, T0.plus(1), &mut effects);
    effects.clear();
    // Two 429s of grants made before one cut: one cut.
    assert!(e.signal(&a, Signal::Limited, T0.plus(10), &mut effects));
    assert!(matches!(
        &effects[..],
        [
            Effect::CeilingSet { ceiling: Ceiling { c: 5, .. }, change: Some(CeilingChange::Cut), .. },
            Effect::PermitSet { .. }
        ]
    ));
    assert!(e.signal(&b, Signal::Limited, T0.plus(11), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(11)), Some(5));
    // Judged with 5: two granted already, three more fit, the sixth waits.
    for i in 0..3 {
        assert!(e.acquire(&r, T0.plus(20 + i), &mut effects).is_granted());
    }
    assert_eq!(e.acquire(&r, T0.plus(30), &mut effects), refused(T0.plus(1000), "w"));
    // A grant after the cut is a new overload: it cuts again, never below min.
    let c = grant(&mut e, &r, T0.plus(1000), &mut effects);
    assert!(e.signal(&c, Signal::Limited, T0.plus(1001), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(1001)), Some(2));
    let d = grant(&mut e, &r, T0.plus(2001), &mut effects);
    assert!(e.signal(&d, Signal::Limited, T0.plus(2002), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(2002)), Some(2), "min");
}

/// "After the latest cut" is the order of events, not the millisecond: within the cut's own
/// millisecond, a grant made before it belongs to its overload and one made after it is new.
#[test]
fn a_grant_in_the_cuts_own_millisecond_is_ordered_by_when_it_was_made() {
    let mut e = engine();
    let r = adapted(20);
    let mut effects = Vec::new();
    let a = grant(&mut e, &r, T0, &mut effects);
    let at = T0.plus(5);
    let before = grant(&mut e, &r, at, &mut effects);
    assert!(e.signal(&a, Signal::Limited, at, &mut effects));
    let after = grant(&mut e, &r, at, &mut effects);
    assert_eq!(ceiling(&e, &r, at), Some(10));
    assert!(e.signal(&before, Signal::Limited, at, &mut effects));
    assert_eq!(ceiling(&e, &r, at), Some(10), "granted before the cut, in its millisecond: one overload");
    assert!(e.signal(&after, Signal::Limited, at, &mut effects));
    assert_eq!(ceiling(&e, &r, at), Some(5), "granted after the cut, in its millisecond: a new overload");
    assert_eq!(e.ceiling("w").map(|c| (c.cut_at, c.cuts)), Some((Some(at), 2)));
}

#[test]
fn a_clean_outcome_grows_only_in_play_and_at_most_once_per_per_ms() {
    let mut e = engine();
    let r = adapted(10);
    let mut effects = Vec::new();
    // Alone in the window: 1 of 10 is not half, the ceiling binds nothing.
    let quiet = grant(&mut e, &r, T0, &mut effects);
    effects.clear();
    assert!(e.signal(&quiet, Signal::Clean, T0.plus(1), &mut effects));
    assert!(!effects.iter().any(|e| matches!(e, Effect::CeilingSet { .. })), "{effects:?}");
    assert_eq!(ceiling(&e, &r, T0.plus(1)), Some(10));
    // The fifth in the window holds half: in play.
    let permits: Vec<String> = (0..4).map(|i| grant(&mut e, &r, T0.plus(2 + i), &mut effects)).collect();
    assert!(!e.adapted_share(permits[2].parse().unwrap(), "w").unwrap().in_play);
    assert!(e.adapted_share(permits[3].parse().unwrap(), "w").unwrap().in_play);
    assert!(e.signal(&permits[3], Signal::Clean, T0.plus(10), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(10)), Some(11));
    // Within the same perMs: no second step.
    let more = grant(&mut e, &r, T0.plus(11), &mut effects);
    assert!(e.signal(&more, Signal::Clean, T0.plus(12), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(12)), Some(11));
    // Counted once per permit: the same outcome again changes nothing.
    let again = grant(&mut e, &r, T0.plus(13), &mut effects);
    assert!(e.signal(&again, Signal::Limited, T0.plus(14), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(14)), Some(5));
    assert!(e.signal(&again, Signal::Limited, T0.plus(1500), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(1500)), Some(5), "a second outcome of one permit counts nothing");
}

#[test]
fn growth_stops_at_max_and_a_request_sees_the_ceiling_clamped_to_its_own_bounds() {
    let mut e = engine();
    let adapt = Adapt { min: 2, max: 3, increase: 5, keep_pct: 50 };
    let r = req(vec![Limit::window("w", 2, 1000).with_adapt(adapt)]).with_permit();
    let mut effects = Vec::new();
    let _ = grant(&mut e, &r, T0, &mut effects);
    let p = grant(&mut e, &r, T0.plus(1), &mut effects);
    assert!(e.signal(&p, Signal::Clean, T0.plus(2), &mut effects));
    assert_eq!(ceiling(&e, &r, T0.plus(2)), Some(3), "2 + 5, bounded by max");
    // Another host names it with a narrower range: it sees the ceiling clamped to its own.
    let narrow = req(vec![Limit::window("w", 2, 1000).with_adapt(Adapt { max: 2, ..adapt })]);
    assert_eq!(ceiling(&e, &narrow, T0.plus(2)), Some(2));
    assert_eq!(e.acquire(&narrow, T0.plus(3), &mut effects), refused(T0.plus(1000), "w"));
    assert!(e.acquire(&r, T0.plus(3), &mut effects).is_granted(), "3 for the wider one");
}

#[test]
fn an_unknown_released_or_lapsed_permit_changes_nothing() {
    let mut e = engine();
    let r = adapted(10);
    let mut effects = Vec::new();
    assert!(!e.signal("p-nope", Signal::Limited, T0, &mut effects));
    let p = grant(&mut e, &r, T0, &mut effects);
    assert!(e.release(&p, T0.plus(1), &mut effects));
    effects.clear();
    assert!(!e.signal(&p, Signal::Limited, T0.plus(2), &mut effects));
    let lapsing = grant(&mut e, &r.clone().with_hold_ms(5).unwrap(), T0.plus(3), &mut effects);
    effects.clear();
    assert!(!e.signal(&lapsing, Signal::Limited, T0.plus(8), &mut effects));
    assert!(effects.is_empty());
    assert_eq!(ceiling(&e, &r, T0.plus(9)), Some(10));
    // A release with its outcome counts it before the permit goes.
    let q = grant(&mut e, &r, T0.plus(10), &mut effects);
    assert_eq!(e.release_with_outcome(&q, &[], Some(Signal::Limited), T0.plus(11), &mut effects), Ok(true));
    assert_eq!(ceiling(&e, &r, T0.plus(11)), Some(5));
}

#[test]
fn a_bucket_ceiling_stands_for_refill_and_scales_burst() {
    let mut e = engine();
    let adapt = Adapt { min: 1, max: 10, increase: 1, keep_pct: 50 };
    let r = req(vec![Limit::bucket("b", 10, 1000).with_burst(20).with_adapt(adapt)]).with_permit();
    let mut effects = Vec::new();
    let p = grant(&mut e, &r, T0, &mut effects);
    assert!(e.signal(&p, Signal::Limited, T0, &mut effects));
    // C = 5: refill 5 a second, burst 10; 19 tokens left are read as at most 10.
    assert_eq!(ceiling(&e, &r, T0), Some(5));
    assert_eq!(e.figures(&r, T0)[0].bucket, Some((19, 10)));
    let big = req(vec![Limit::bucket("b", 10, 1000).with_burst(20).with_adapt(adapt).with_cost(15)]);
    assert!(e.acquire(&big, T0, &mut effects).is_granted(), "a cost above the scaled burst takes 10");
    assert_eq!(e.figures(&r, T0)[0].bucket, Some((9, 10)));
    let ten = req(vec![Limit::bucket("b", 10, 1000).with_burst(20).with_adapt(adapt).with_cost(10)]);
    assert_eq!(e.acquire(&ten, T0, &mut effects), refused(T0.plus(200), "b"), "refilling at 5 a second");
}

#[test]
fn the_line_judges_with_the_ceiling() {
    let mut e = engine();
    let r = adapted(10);
    let mut effects = Vec::new();
    let p = grant(&mut e, &r, T0, &mut effects);
    assert!(e.signal(&p, Signal::Limited, T0, &mut effects));
    for i in 1..5 {
        assert!(e.acquire(&r, T0.plus(i), &mut effects).is_granted());
    }
    // Five in the window of a ceiling of 5: a queued request files a ticket told the first leave.
    let queued = r.clone().with_queue();
    let answer = e.acquire_in_line(&queued, T0.plus(10), &mut effects).unwrap();
    assert_eq!(answer.decision, refused(T0.plus(1000), "w"));
    // Behind it, a request without a ticket is told the instant after its reservation.
    assert_eq!(e.peek(&r, T0.plus(10)).map(|r| r.retry_at), Some(T0.plus(1001)));
}

#[test]
fn a_ceiling_below_max_outlives_its_bucket_an_hour_and_one_at_max_goes_with_it() {
    let mut e = engine();
    let r = adapted(10);
    let mut effects = Vec::new();
    let p = grant(&mut e, &r, T0, &mut effects);
    assert!(e.signal(&p, Signal::Limited, T0.plus(1), &mut effects));
    assert!(e.release(&p, T0.plus(2), &mut effects));
    // The window empties after a second; the bucket goes, the ceiling stays.
    e.sweep(T0.plus(5_000), &mut effects);
    assert_eq!(e.totals().buckets, 0);
    assert_eq!(e.ceiling("w").map(|c| c.c), Some(5));
    assert_eq!(ceiling(&e, &r, T0.plus(5_000)), Some(5));
    // An hour after its latest signal, it goes.
    effects.clear();
    e.sweep(T0.plus(1 + CEILING_KEPT_MS), &mut effects);
    assert_eq!(e.ceiling("w"), None);
    assert!(matches!(&effects[..], [Effect::CeilingForgotten { .. }]), "{effects:?}");
    // One grown back to max goes with its bucket.
    let max = Adapt { min: 2, max: 11, increase: 1, keep_pct: 50 };
    let r = req(vec![Limit::window("m", 10, 1000).with_adapt(max)]).with_permit();
    let t = T0.plus(2 * CEILING_KEPT_MS);
    let permits: Vec<String> = (0..5).map(|i| grant(&mut e, &r, t.plus(i), &mut effects)).collect();
    assert!(e.signal(&permits[4], Signal::Clean, t.plus(10), &mut effects));
    assert_eq!(e.ceiling("m").map(|c| c.c), Some(11));
    for p in &permits {
        e.release(p, t.plus(11), &mut effects);
    }
    e.sweep(t.plus(2_000), &mut effects);
    assert_eq!((e.totals().buckets, e.ceiling("m")), (0, None));
}

#[test]
fn a_restart_keeps_the_ceiling_and_what_each_permit_counted() {
    let config = EngineConfig::with(250, 1);
    let mut e = Engine::new(config);
    let mut log = EffectLog::default();
    let r = adapted(10);
    let mut effects = Vec::new();
    let a = grant(&mut e, &r, T0, &mut effects);
    let b = grant(&mut e, &r, T0.plus(1), &mut effects);
    assert!(e.signal(&a, Signal::Limited, T0.plus(2), &mut effects));
    log.apply(&effects);
    let mut again = log.rebuild(config, T0.plus(3));
    assert_eq!(again.ceiling("w"), e.ceiling("w"));
    assert_eq!(ceiling(&again, &r, T0.plus(3)), Some(5));
    let mut more = Vec::new();
    assert!(again.signal(&a, Signal::Limited, T0.plus(1100), &mut more));
    assert!(again.signal(&b, Signal::Limited, T0.plus(1100), &mut more));
    assert_eq!(ceiling(&again, &r, T0.plus(1100)), Some(5), "counted once, and the other before the cut");
}

/// A ceiling forgotten with its bucket and kept anew by a cut in the same millisecond: a permit
/// granted in that millisecond before the new cut (it saw the old ceiling and its cuts) belongs
/// to the overload that cut, however many cuts the old ceiling had counted.
#[test]
fn a_ceiling_kept_anew_orders_the_grants_of_its_first_cuts_millisecond() {
    let mut e = engine();
    let adapt = Adapt { min: 1, max: 10, increase: 1, keep_pct: 50 };
    let tokens = || Limit::bucket("t", 10, 1000).with_adapt(adapt).with_cost(0);
    let r = req(vec![tokens()]).with_permit().with_hold_ms(10_000).unwrap();
    let held = req(vec![tokens().with_concurrent(1)]).with_hold_ms(10).unwrap();
    let mut effects = Vec::new();
    let a = grant(&mut e, &r, T0, &mut effects);
    assert!(e.signal(&a, Signal::Limited, T0, &mut effects));
    assert_eq!(e.ceiling("t").map(|c| (c.c, c.cuts)), Some((5, 1)));
    // Two hours on, unswept: a place keeps the bucket, and with it the ceiling.
    let t1 = T0.plus(2 * CEILING_KEPT_MS);
    let x = grant(&mut e, &held, t1, &mut effects);
    let q = grant(&mut e, &r, t1, &mut effects);
    let t2 = t1.plus(5);
    let p = grant(&mut e, &r, t2, &mut effects);
    // The place goes: so do the bucket and the ceiling an hour past its signal.
    assert!(e.release(&x, t2, &mut effects));
    assert_eq!(e.ceiling("t"), None);
    // Q's 429 cuts the ceiling kept anew; P was granted before that cut: the same overload.
    assert!(e.signal(&q, Signal::Limited, t2, &mut effects));
    // (Its count starts above the one cut P saw of the ceiling forgotten.)
    assert_eq!(e.ceiling("t").map(|c| (c.c, c.cut_at, c.cuts)), Some((5, Some(t2), 2)));
    assert!(e.signal(&p, Signal::Limited, t2, &mut effects));
    assert_eq!(e.ceiling("t").map(|c| c.c), Some(5), "granted before the cut, in its millisecond");
}
