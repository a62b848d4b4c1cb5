//! The engine's token buckets (section 13), rule by rule: starts full, refills continuously, a
//! cost above `burst`, `initial`, exactness over a long run, settle refund and debt, figures,
//! a bucket with `concurrent`, the line on a bucket, and a restart from what the store keeps.

use super::model::EffectLog;
use super::tests::{T0, acquire, engine, req};
use super::*;
use crate::request::{AcquireRequest, Cost, Limit};

fn refused(retry_at: Millis, limit: &str) -> Decision {
    Decision::Refused { retry_at, reason: Reason::Rate, limit: limit.to_owned() }
}

fn level(e: &Engine, r: &AcquireRequest, now: Millis) -> Option<(i64, u64)> {
    e.figures(r, now)[0].bucket
}

#[test]
fn a_bucket_starts_full_and_refills_continuously() {
    let mut e = engine();
    // 10 a second, burst 10: ten at once, then one every 100 ms.
    let r = req(vec![Limit::bucket("b", 10, 1000)]);
    for _ in 0..10 {
        assert!(acquire(&mut e, &r, T0).is_granted());
    }
    assert_eq!(acquire(&mut e, &r, T0), refused(T0.plus(100), "b"));
    assert_eq!(acquire(&mut e, &r, T0.plus(99)), refused(T0.plus(100), "b"));
    assert!(acquire(&mut e, &r, T0.plus(100)).is_granted());
    // Continuous, not in steps: 0.5 token at 150 ms is not enough, 1 at 200 ms is.
    assert_eq!(acquire(&mut e, &r, T0.plus(150)), refused(T0.plus(200), "b"));
    assert!(acquire(&mut e, &r, T0.plus(200)).is_granted());
    assert_eq!(level(&e, &r, T0.plus(200)), Some((0, 10)));
    assert_eq!(level(&e, &r, T0.plus(750)), Some((5, 10)), "5.5 tokens, rounded down");
}

#[test]
fn a_cost_above_burst_waits_for_a_full_bucket_and_a_cost_of_zero_always_fits() {
    let mut e = engine();
    let one = req(vec![Limit::bucket("b", 2, 1000).with_burst(4)]);
    let big = req(vec![Limit::bucket("b", 2, 1000).with_burst(4).with_cost(100)]);
    let zero = req(vec![Limit::bucket("b", 2, 1000).with_burst(4).with_cost(0)]);
    assert!(acquire(&mut e, &one, T0).is_granted());
    // 3 left: the big call waits for 4 (half a second at 2 a second), then takes 4.
    assert_eq!(acquire(&mut e, &big, T0), refused(T0.plus(500), "b"));
    assert!(acquire(&mut e, &zero, T0).is_granted());
    assert!(acquire(&mut e, &big, T0.plus(500)).is_granted());
    assert_eq!(level(&e, &one, T0.plus(500)), Some((0, 4)));
}

#[test]
fn initial_is_the_level_when_first_named_and_a_refusal_that_creates_it_is_kept() {
    let mut e = engine();
    let r = req(vec![Limit::bucket("b", 10, 1000).with_initial(0)]);
    // A peek reads `initial` and creates nothing.
    assert_eq!(e.peek(&r, T0).map(|r| r.retry_at), Some(T0.plus(100)));
    assert_eq!(e.totals().buckets, 0);
    let mut effects = Vec::new();
    assert_eq!(e.acquire(&r, T0, &mut effects), refused(T0.plus(100), "b"));
    assert!(matches!(&effects[..], [Effect::LevelSet { level, .. }] if level.units == 0 && level.at == T0));
    assert!(effects.iter().all(Effect::needs_commit), "committed before the reply");
    // Refilling from then, not from the next ask.
    assert!(acquire(&mut e, &r, T0.plus(100)).is_granted());
    // Full again, it is forgotten; named again, it starts at `initial` again.
    let mut effects = Vec::new();
    e.sweep(T0.plus(1100), &mut effects);
    assert!(effects.iter().any(|e| matches!(e, Effect::LevelForgotten { .. })));
    assert_eq!(e.totals().buckets, 0);
    assert_eq!(acquire(&mut e, &r, T0.plus(1100)), refused(T0.plus(1200), "b"));
    // A bucket named full (the default) keeps nothing when refused.
    let full = req(vec![Limit::bucket("f", 1, 1000)]);
    let mut effects = Vec::new();
    assert!(e.acquire(&full, T0, &mut effects).is_granted());
    effects.clear();
    assert!(!e.acquire(&full, T0, &mut effects).is_granted());
    assert!(effects.is_empty());
}

#[test]
fn a_host_asking_at_every_retry_at_for_an_hour_gets_within_one_token_of_the_bound() {
    // Rates that do not divide a millisecond: 7 per 3 s, 1000 per minute, 3 per second.
    for (refill, per_ms, burst, cost) in [(7, 3000, 7, 1), (1000, 60_000, 50, 3), (3, 1000, 3, 2), (5, 7, 5, 1)] {
        let mut e = engine();
        let r = req(vec![Limit::bucket("b", refill, per_ms).with_burst(burst).with_cost(cost)]);
        let hour = 3_600_000u64;
        let (mut now, mut granted) = (T0, 0u64);
        while now < T0.plus(hour) {
            match acquire(&mut e, &r, now) {
                Decision::Granted { .. } => granted += cost,
                Decision::Refused { retry_at, .. } => {
                    assert!(retry_at > now);
                    now = retry_at;
                }
            }
        }
        // The bound over the hour: the level at the start plus the refill.
        let bound = burst as f64 + refill as f64 * hour as f64 / per_ms as f64;
        assert!(granted as f64 <= bound, "{granted} above {bound}");
        assert!(granted as f64 + cost as f64 + 1.0 >= bound, "{refill}/{per_ms}: {granted} of {bound}");
    }
}

#[test]
fn settle_refunds_up_to_burst_and_takes_into_debt() {
    let mut e = engine();
    let r = req(vec![Limit::bucket("b", 10, 1000).with_cost(6)]).with_permit();
    let Decision::Granted { permit: Some(p), .. } = acquire(&mut e, &r, T0) else { panic!("granted") };
    let p = p.to_string();
    assert_eq!(level(&e, &r, T0), Some((4, 10)));
    // Down: 5 of the 6 go back.
    let s = e.settle(&p, &[Cost::new("b", 1)], T0, &mut Vec::new()).unwrap();
    assert_eq!((s, level(&e, &r, T0)), (Settled::Down, Some((9, 10))));
    // Down to 0 again: never above burst.
    assert_eq!(e.settle(&p, &[Cost::new("b", 0)], T0, &mut Vec::new()).unwrap(), Settled::Down);
    assert_eq!(level(&e, &r, T0), Some((10, 10)));
    // Up past burst: counted as burst, and the level goes below 0.
    let small = req(vec![Limit::bucket("b", 10, 1000).with_cost(9)]);
    assert!(acquire(&mut e, &small, T0).is_granted());
    let mut effects = Vec::new();
    assert_eq!(e.settle(&p, &[Cost::new("b", 50)], T0, &mut effects).unwrap(), Settled::Up);
    assert!(effects.iter().any(|e| matches!(e, Effect::LevelSet { level, .. } if level.units == -9000)));
    assert_eq!(level(&e, &r, T0), Some((-9, 10)));
    // Later calls wait until it has refilled: 10 tokens for 1 at a token per 100 ms.
    assert_eq!(acquire(&mut e, &req(vec![Limit::bucket("b", 10, 1000)]), T0), refused(T0.plus(1000), "b"));
    // A key that is no limit of the grant changes nothing.
    assert!(e.settle(&p, &[Cost::new("other", 1)], T0, &mut Vec::new()).is_err());
}

#[test]
fn a_bucket_with_concurrent_holds_places_and_is_kept_while_they_are_held() {
    let mut e = engine();
    let r = req(vec![Limit::bucket("b", 10, 1000).with_concurrent(1).with_hold_ms(5000)]);
    let Decision::Granted { permit: Some(p), .. } = acquire(&mut e, &r, T0) else { panic!("a permit") };
    assert_eq!(
        acquire(&mut e, &r, T0.plus(10)),
        Decision::Refused { retry_at: T0.plus(260), reason: Reason::Concurrency, limit: "b".into() }
    );
    let figures = &e.figures(&r, T0.plus(10))[0];
    assert_eq!((figures.bucket, figures.places), (Some((9, 10)), Some((1, 0))));
    // Full after 100 ms, but it holds a place: kept (and shown) until it is released.
    let mut effects = Vec::new();
    e.sweep(T0.plus(2000), &mut effects);
    assert_eq!(e.view(T0.plus(2000), "").buckets[0].level, Some((10, 10)));
    assert!(e.release(&p.to_string(), T0.plus(2000), &mut effects));
    assert_eq!(e.totals().buckets, 0, "full and holding no place: forgotten");
}

#[test]
fn each_request_is_judged_with_its_own_figures_and_never_above_the_largest_burst() {
    let mut e = engine();
    let big = req(vec![Limit::bucket("b", 100, 1000)]);
    let small = req(vec![Limit::bucket("b", 1, 1000).with_burst(2)]);
    assert!(acquire(&mut e, &big, T0).is_granted());
    // 99 kept: above the small burst, neither cut nor refilled by the small request's reading.
    assert_eq!(level(&e, &small, T0.plus(5)), Some((99, 2)));
    assert!(acquire(&mut e, &small, T0.plus(5)).is_granted());
    assert_eq!(level(&e, &big, T0.plus(5)), Some((98, 100)));
    assert_eq!(level(&e, &big, T0.plus(100_000)), Some((100, 100)));
}

#[test]
fn a_bucket_line_keeps_a_large_call_first_and_small_ones_backfill_without_delaying_it() {
    let mut e = engine();
    let small = req(vec![Limit::bucket("b", 10, 1000)]);
    let large = AcquireRequest::new("big", vec![Limit::bucket("b", 10, 1000).with_cost(10)]).unwrap().with_queue();
    for _ in 0..10 {
        assert!(acquire(&mut e, &small, T0).is_granted());
    }
    let first = e.acquire_in_line(&large, T0, &mut Vec::new()).unwrap();
    assert_eq!(first.decision, refused(T0.plus(1000), "b"), "rule B's instant");
    let ticket = first.ticket.expect("filed");
    // A small call after it would delay it: refused until after the large one's reservation.
    assert_eq!(acquire(&mut e, &small, T0.plus(500)), refused(T0.plus(1100), "b"));
    // The large one is granted at its instant, and the small ones follow.
    let again = large.clone().with_ticket(ticket.id.to_string()).unwrap();
    assert!(e.acquire_in_line(&again, T0.plus(1000), &mut Vec::new()).unwrap().decision.is_granted());
    assert!(acquire(&mut e, &small, T0.plus(1100)).is_granted());
    // Backfill: with a ticket for 5 reserved at 500 ms, a call of 1 now still leaves it room
    // there only if the level allows; here it does not (5 at 1600 ms, 6 tokens at 1700 ms).
    let five = AcquireRequest::new("five", vec![Limit::bucket("b", 10, 1000).with_cost(5)]).unwrap().with_queue();
    let filed = e.acquire_in_line(&five, T0.plus(1100), &mut Vec::new()).unwrap();
    assert_eq!(filed.decision, refused(T0.plus(1600), "b"));
    assert_eq!(acquire(&mut e, &small, T0.plus(1150)), refused(T0.plus(1700), "b"));
}

#[test]
fn a_small_call_backfills_when_the_ticket_ahead_keeps_its_instant() {
    let mut e = engine();
    // A ticket held back by a full window of its own is reserved its room in the bucket now.
    let w = Limit::window("w", 1, 60_000);
    assert!(acquire(&mut e, &req(vec![w.clone()]), T0).is_granted());
    let held = AcquireRequest::new("held", vec![Limit::bucket("b", 10, 1000), w]).unwrap().with_queue();
    let filed = e.acquire_in_line(&held, T0, &mut Vec::new()).unwrap();
    assert_eq!(filed.decision, refused(T0.plus(60_000), "w"));
    assert!(filed.ticket.is_some());
    // 10 tokens: the ticket's 1 is reserved now, with 9 to spare: a call of 1 backfills.
    let one = req(vec![Limit::bucket("b", 10, 1000)]);
    assert!(acquire(&mut e, &one, T0.plus(1)).is_granted());
    // A call of 10 would take the ticket's token: refused until it has its own room behind it
    // (9 now, 8 after the ticket's take, two more by 200 ms).
    let ten = req(vec![Limit::bucket("b", 10, 1000).with_cost(10)]);
    assert_eq!(acquire(&mut e, &ten, T0.plus(1)), refused(T0.plus(201), "b"));
    // A cost of 0 takes nothing, but rule Q holds for every request: it backfills.
    let zero = req(vec![Limit::bucket("b", 10, 1000).with_cost(0)]);
    assert!(acquire(&mut e, &zero, T0.plus(1)).is_granted());
}

#[test]
fn a_restart_from_the_store_refills_from_the_last_committed_level() {
    let config = EngineConfig::with(250, 1);
    let mut e = Engine::new(config);
    let mut log = EffectLog::default();
    let r = req(vec![Limit::bucket("b", 10, 1000)]);
    let mut effects = Vec::new();
    for _ in 0..10 {
        assert!(e.acquire(&r, T0, &mut effects).is_granted());
    }
    log.apply(&effects);
    // Rebuilt 300 ms later: 3 tokens, never fuller.
    let mut again = log.rebuild(config, T0.plus(300));
    assert_eq!(again.facts(T0.plus(300)).levels.get("b"), Some(&3));
    assert_eq!(e.facts(T0.plus(300)), again.facts(T0.plus(300)));
    for _ in 0..3 {
        assert!(again.acquire(&r, T0.plus(300), &mut Vec::new()).is_granted());
    }
    assert_eq!(again.acquire(&r, T0.plus(300), &mut Vec::new()), refused(T0.plus(400), "b"));
    // Rebuilt after it filled: forgotten, and the file told so.
    let mut later = log.clone();
    let full = later.rebuild(config, T0.plus(5000));
    assert_eq!(full.totals().buckets, 0);
    assert!(later.levels.is_empty());
}

#[test]
fn a_request_id_undo_with_costs_settles_a_bucket_of_a_grant_without_permit() {
    let mut e = engine();
    let r = req(vec![Limit::bucket("b", 10, 1000).with_cost(8)]).with_id("ask").unwrap();
    assert!(e.acquire_in_line(&r, T0, &mut Vec::new()).unwrap().decision.is_granted());
    assert_eq!(level(&e, &r, T0), Some((2, 10)));
    assert!(e.undo("ask", &[Cost::new("b", 0)], T0, &mut Vec::new()).unwrap());
    assert_eq!(level(&e, &r, T0), Some((10, 10)), "never made: it counts nowhere");
}

#[test]
fn a_peek_reads_a_full_bucket_not_yet_swept_as_forgotten_as_the_acquire_does() {
    let mut e = engine();
    let r = req(vec![Limit::bucket("b", 10, 1000).with_initial(0)]);
    assert_eq!(acquire(&mut e, &r, T0), refused(T0.plus(100), "b"), "created at 0");
    // Full at T0 + 1000 and not swept since: forgotten all the same, so a peek and the acquire
    // after it both find `initial` again.
    assert_eq!(e.peek(&r, T0.plus(1500)).map(Decision::from), Some(refused(T0.plus(1600), "b")));
    assert_eq!(e.figures(&r, T0.plus(1500))[0].bucket, Some((0, 10)));
    assert_eq!(acquire(&mut e, &r, T0.plus(1500)), refused(T0.plus(1600), "b"));
}
