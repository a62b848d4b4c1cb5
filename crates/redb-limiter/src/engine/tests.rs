//! The engine's named edge cases and its model-based property test against a brute-force
//! reference that keeps every grant forever and recomputes each decision from scratch.

use proptest::prelude::*;

use super::model::{EffectLog, Reference};
use super::*;
use crate::request::{AcquireRequest, Cost, Limit};

const T0: Millis = Millis(1_000_000);

fn engine() -> Engine {
    Engine::new(EngineConfig { recheck_ms: 250, id_seed: 1 })
}

fn req(limits: Vec<Limit>) -> AcquireRequest {
    AcquireRequest::new("caller", limits).unwrap()
}

fn acquire(e: &mut Engine, r: &AcquireRequest, now: Millis) -> Decision {
    e.acquire(r, now, &mut Vec::new())
}

fn refused(retry_at: Millis, reason: Reason, limit: &str) -> Decision {
    Decision::Refused { retry_at, reason, limit: limit.to_owned() }
}

#[test]
fn a_grant_leaves_the_window_exactly_at_t_plus_per_ms() {
    let mut e = engine();
    let r = req(vec![Limit::window("b", 1, 1000)]);
    assert!(acquire(&mut e, &r, T0).is_granted());
    assert_eq!(acquire(&mut e, &r, T0.plus(999)), refused(T0.plus(1000), Reason::Rate, "b"));
    assert!(acquire(&mut e, &r, T0.plus(1000)).is_granted());
}

#[test]
fn burst_then_steady_never_overruns_a_window() {
    // A token bucket of 10/s would let a burst of 10 and then one call every 100 ms through,
    // putting 19 calls in the first second. A rolling window must not.
    let mut e = engine();
    let r = req(vec![Limit::window("b", 10, 1000)]);
    let mut granted = Vec::new();
    for ms in (0..3000).step_by(50) {
        let now = T0.plus(ms);
        if acquire(&mut e, &r, now).is_granted() {
            granted.push(now);
        }
    }
    assert_eq!(granted.len(), 30);
    for &start in &granted {
        let in_window = granted.iter().filter(|&&t| t >= start && t < start.plus(1000)).count();
        assert!(in_window <= 10, "{in_window} grants in the window from {start:?}");
    }
    assert_eq!(granted[10], T0.plus(1000));
}

#[test]
fn cost_over_calls_waits_for_an_empty_window() {
    let mut e = engine();
    let small = req(vec![Limit::window("b", 5, 1000)]);
    let big = req(vec![Limit::window("b", 5, 1000).with_cost(50)]);
    assert!(acquire(&mut e, &small, T0).is_granted());
    assert!(acquire(&mut e, &small, T0.plus(400)).is_granted());
    assert_eq!(acquire(&mut e, &big, T0.plus(500)), refused(T0.plus(1400), Reason::Rate, "b"));
    assert!(acquire(&mut e, &big, T0.plus(1400)).is_granted());
    // It counted as 5 = calls: the window is full until it leaves.
    assert_eq!(acquire(&mut e, &small, T0.plus(2399)), refused(T0.plus(2400), Reason::Rate, "b"));
}

#[test]
fn cost_zero_always_fits_but_concurrency_still_applies() {
    let mut e = engine();
    let full = req(vec![Limit::window("b", 1, 1000)]);
    assert!(acquire(&mut e, &full, T0).is_granted());
    let free = req(vec![Limit::window("b", 1, 1000).with_cost(0)]);
    assert!(acquire(&mut e, &free, T0.plus(1)).is_granted());
    let conc = req(vec![Limit::window("b", 1, 1000).with_cost(0).with_concurrent(1)]);
    assert!(acquire(&mut e, &conc, T0.plus(2)).is_granted());
    assert_eq!(acquire(&mut e, &conc, T0.plus(3)), refused(T0.plus(253), Reason::Concurrency, "b"));
}

#[test]
fn all_or_nothing_across_buckets() {
    let mut e = engine();
    assert!(acquire(&mut e, &req(vec![Limit::window("b", 1, 1000)]), T0).is_granted());
    let both = req(vec![Limit::window("a", 1, 1000), Limit::window("b", 1, 1000), Limit::concurrent("c", 1)]);
    let mut effects = Vec::new();
    assert_eq!(e.acquire(&both, T0.plus(10), &mut effects), refused(T0.plus(1000), Reason::Rate, "b"));
    assert!(effects.is_empty(), "a refusal changes nothing: {effects:?}");
    // `a` and `c` were not touched: a request naming only them is granted.
    assert!(
        acquire(&mut e, &req(vec![Limit::window("a", 1, 1000), Limit::concurrent("c", 1)]), T0.plus(20)).is_granted()
    );
    assert_eq!(e.totals().buckets, 3);
}

#[test]
fn throttle_outranks_rate_when_later_and_on_a_tie() {
    let mut e = engine();
    let r = req(vec![Limit::window("b", 1, 1000)]);
    assert!(acquire(&mut e, &r, T0).is_granted());
    e.throttle("caller", T0.plus(5000), T0, &mut Vec::new());
    assert_eq!(acquire(&mut e, &r, T0.plus(1)), refused(T0.plus(5000), Reason::Throttle, "caller"));
    // A later rate refusal stands over an earlier throttle.
    let long = req(vec![Limit::window("long", 1, 60_000)]);
    let mut e = engine();
    assert!(acquire(&mut e, &long, T0).is_granted());
    e.throttle("caller", T0.plus(5000), T0, &mut Vec::new());
    assert_eq!(acquire(&mut e, &long, T0.plus(1)), refused(T0.plus(60_000), Reason::Rate, "long"));
    // On a tie, the throttle is reported.
    e.throttle("caller", T0.plus(60_000), T0.plus(2), &mut Vec::new());
    assert_eq!(acquire(&mut e, &long, T0.plus(3)), refused(T0.plus(60_000), Reason::Throttle, "caller"));
}

#[test]
fn tie_between_limits_reports_the_first_in_request_order() {
    let mut e = engine();
    let r = req(vec![Limit::window("x", 1, 1000), Limit::window("y", 1, 1000)]);
    assert!(acquire(&mut e, &r, T0).is_granted());
    assert_eq!(acquire(&mut e, &r, T0.plus(1)), refused(T0.plus(1000), Reason::Rate, "x"));
    let flipped = req(vec![Limit::window("y", 1, 1000), Limit::window("x", 1, 1000)]);
    assert_eq!(acquire(&mut e, &flipped, T0.plus(1)), refused(T0.plus(1000), Reason::Rate, "y"));
}

#[test]
fn a_place_lapses_at_the_exact_instant() {
    let mut e = engine();
    let r = req(vec![Limit::concurrent("c", 1).with_hold_ms(1000)]);
    assert!(acquire(&mut e, &r, T0).is_granted());
    assert_eq!(acquire(&mut e, &r, T0.plus(900)), refused(T0.plus(1000), Reason::Concurrency, "c"));
    assert_eq!(acquire(&mut e, &r, T0.plus(100)), refused(T0.plus(350), Reason::Concurrency, "c"));
    assert!(acquire(&mut e, &r, T0.plus(1000)).is_granted());
}

#[test]
fn release_frees_the_place_once() {
    let mut e = engine();
    let r = req(vec![Limit::concurrent("c", 1), Limit::concurrent("d", 2)]);
    let Decision::Granted { permit: Some(p), .. } = acquire(&mut e, &r, T0) else { panic!("granted") };
    assert!(!acquire(&mut e, &r, T0.plus(1)).is_granted());
    let mut effects = Vec::new();
    assert!(e.release(&p.to_string(), T0.plus(2), &mut effects));
    assert!(effects.contains(&Effect::PermitEnded { id: p }));
    assert!(effects.contains(&Effect::BucketForgotten { bucket: Arc::from("c"), grants: vec![] }));
    assert!(!e.release(&p.to_string(), T0.plus(3), &mut Vec::new()));
    assert!(!e.release("p-nonsense", T0.plus(3), &mut Vec::new()));
    assert!(acquire(&mut e, &r, T0.plus(4)).is_granted());
    assert_eq!(e.totals().permits, 1);
}

#[test]
fn a_lapsed_permit_releases_nothing() {
    let mut e = engine();
    let r = req(vec![Limit::concurrent("c", 1).with_hold_ms(100)]);
    let Decision::Granted { permit: Some(p), .. } = acquire(&mut e, &r, T0) else { panic!("granted") };
    assert!(!e.release(&p.to_string(), T0.plus(100), &mut Vec::new()));
}

#[test]
fn throttles_only_extend_and_past_untils_change_nothing() {
    let mut e = engine();
    let mut effects = Vec::new();
    assert_eq!(e.throttle("k", T0.plus(100), T0, &mut effects), Some(T0.plus(100)));
    assert_eq!(e.throttle("k", T0.plus(50), T0, &mut effects), Some(T0.plus(100)));
    assert_eq!(e.throttle("k", T0.minus(50), T0, &mut effects), Some(T0.plus(100)));
    assert_eq!(e.throttle("other", T0, T0, &mut effects), None);
    assert_eq!(effects.len(), 1);
    assert_eq!(e.throttle("k", T0.plus(200), T0, &mut effects), Some(T0.plus(200)));
    assert_eq!(e.throttled_until("k", T0.plus(199)), Some(T0.plus(200)));
    assert_eq!(e.throttled_until("k", T0.plus(200)), None);
}

#[test]
fn the_window_is_judged_with_the_request_at_hand() {
    let mut e = engine();
    let long = req(vec![Limit::window("b", 2, 10_000)]);
    let short = req(vec![Limit::window("b", 2, 1000)]);
    assert!(acquire(&mut e, &long, T0).is_granted());
    assert!(acquire(&mut e, &long, T0.plus(500)).is_granted());
    // The short window no longer sees the first grant after 1 s; the long one does.
    assert!(acquire(&mut e, &short, T0.plus(1000)).is_granted());
    assert_eq!(acquire(&mut e, &long, T0.plus(1001)), refused(T0.plus(10_500), Reason::Rate, "b"));
    // A larger `calls` on the same bucket has room.
    assert!(acquire(&mut e, &req(vec![Limit::window("b", 4, 10_000)]), T0.plus(1002)).is_granted());
}

#[test]
fn sweep_forgets_idle_buckets_permits_and_throttles() {
    let mut e = engine();
    let r = req(vec![Limit::window("w", 1, 1000), Limit::concurrent("c", 1).with_hold_ms(3000)]);
    assert!(acquire(&mut e, &r, T0).is_granted());
    e.throttle("caller", T0.plus(500), T0, &mut Vec::new());
    assert_eq!(e.next_deadline(), Some(T0.plus(500)));
    let mut effects = Vec::new();
    assert_eq!(e.sweep(T0.plus(500), &mut effects), Some(T0.plus(1000)));
    assert_eq!(effects, vec![Effect::ThrottleEnded { key: Arc::from("caller") }]);
    effects.clear();
    e.sweep(T0.plus(1000), &mut effects);
    assert!(effects.contains(&Effect::BucketForgotten { bucket: Arc::from("w"), grants: vec![T0] }));
    assert_eq!(e.totals(), Totals { buckets: 1, permits: 1, throttles: 0 });
    effects.clear();
    assert_eq!(e.sweep(T0.plus(2999), &mut effects), Some(T0.plus(3000)));
    e.sweep(T0.plus(3000), &mut effects);
    assert_eq!(e.totals(), Totals::default());
    assert_eq!(e.next_deadline(), None);
}

/// A window that grows reports what it pruned under its old length before its new record, so
/// the store deletes those grants with the record and a reload cannot count them again.
#[test]
fn a_growing_window_reports_its_pruned_grants_before_its_record() {
    let mut e = engine();
    assert!(acquire(&mut e, &req(vec![Limit::window("b", 5, 1000)]), T0).is_granted());
    assert!(acquire(&mut e, &req(vec![Limit::window("b", 5, 1000)]), T0.plus(900)).is_granted());
    let mut effects = Vec::new();
    let wider = req(vec![Limit::window("b", 5, 60_000)]);
    assert!(e.acquire(&wider, T0.plus(1100), &mut effects).is_granted());
    let pruned = effects.iter().position(|f| *f == Effect::WindowPruned { bucket: Arc::from("b"), grants: vec![T0] });
    let record = effects.iter().position(|f| matches!(f, Effect::BucketMeta { meta, .. } if meta.retain_ms == 60_000));
    assert!(pruned.is_some() && pruned < record, "{effects:?}");
}

#[test]
fn a_release_brings_the_forget_forward() {
    let mut e = engine();
    let r = req(vec![Limit::window("b", 5, 1000).with_concurrent(1)]);
    let Decision::Granted { permit: Some(p), .. } = acquire(&mut e, &r, T0) else { panic!("granted") };
    e.release(&p.to_string(), T0.plus(10), &mut Vec::new());
    let mut effects = Vec::new();
    e.sweep(T0.plus(1000), &mut effects);
    assert!(effects.contains(&Effect::BucketForgotten { bucket: Arc::from("b"), grants: vec![T0] }), "{effects:?}");
}

// ---------------------------------------------------------------------------------------------
// Section 9 and rule 3, named.

fn granted_permit(d: &Decision) -> PermitId {
    match d {
        Decision::Granted { permit: Some(p), .. } => *p,
        other => panic!("no permit: {other:?}"),
    }
}

#[test]
fn a_refusal_naming_a_longer_window_keeps_the_grants_that_long() {
    // The over-grant of issue 12: five grants in a 500 ms window, then a 60 s window of the same
    // calls is refused with retryAt a minute ahead; it must not be granted before.
    let mut e = engine();
    let short = req(vec![Limit::window("b", 5, 500)]);
    for i in 0..5 {
        assert!(acquire(&mut e, &short, T0.plus(i)).is_granted());
    }
    let long = req(vec![Limit::window("b", 5, 60_000)]);
    let mut effects = Vec::new();
    assert_eq!(e.acquire(&long, T0.plus(10), &mut effects), refused(T0.plus(60_000), Reason::Rate, "b"));
    assert!(
        effects.iter().any(|f| matches!(f, Effect::BucketMeta { meta, .. } if meta.retain_ms == 60_000)),
        "the refusal writes the longer retention: {effects:?}"
    );
    assert_eq!(acquire(&mut e, &long, T0.plus(600)), refused(T0.plus(60_000), Reason::Rate, "b"));
    assert!(acquire(&mut e, &long, T0.plus(60_000)).is_granted());
    // A cost-0 acquire lengthens too.
    let mut e = engine();
    assert!(acquire(&mut e, &short, T0).is_granted());
    let free_long = req(vec![Limit::window("b", 1, 60_000).with_cost(0)]);
    assert!(acquire(&mut e, &free_long, T0.plus(1)).is_granted());
    assert_eq!(
        acquire(&mut e, &req(vec![Limit::window("b", 1, 60_000)]), T0.plus(700)),
        refused(T0.plus(60_000), Reason::Rate, "b")
    );
}

#[test]
fn a_peek_decides_as_the_acquire_and_changes_nothing() {
    let mut e = engine();
    let r = req(vec![Limit::window("w", 2, 1000), Limit::concurrent("c", 1)]);
    let before = format!("{e:?}");
    assert_eq!(e.peek(&r, T0), None);
    assert_eq!(format!("{e:?}"), before);
    assert!(acquire(&mut e, &r, T0).is_granted());
    let before = format!("{e:?}");
    let peeked = e.peek(&r, T0.plus(5)).expect("refused");
    assert_eq!(format!("{e:?}"), before, "a peek changes nothing");
    assert_eq!(Decision::from(peeked), acquire(&mut e, &r, T0.plus(5)));
    let figures = e.figures(&r, T0.plus(5));
    assert_eq!(figures[0].window, Some((1, 1)));
    assert_eq!(figures[1].places, Some((1, 0)));
    // A peek naming a longer window does not lengthen anything.
    let long = req(vec![Limit::window("w", 2, 60_000)]);
    let before = format!("{e:?}");
    assert!(e.peek(&long, T0.plus(6)).is_none());
    assert_eq!(format!("{e:?}"), before);
}

#[test]
fn settle_down_frees_room_at_once_and_up_delays_the_next_grant() {
    let mut e = engine();
    let tpm = |cost| req(vec![Limit::window("tpm", 100, 1000).with_cost(cost)]).with_permit();
    let p = granted_permit(&acquire(&mut e, &tpm(90), T0));
    assert!(!acquire(&mut e, &tpm(20), T0.plus(10)).is_granted());
    let mut effects = Vec::new();
    let settled = e.settle(&p.to_string(), &[Cost::new("tpm", 10)], T0.plus(20), &mut effects);
    assert_eq!(settled, Ok(Settled::Down));
    assert!(effects.contains(&Effect::WindowGrant { bucket: Arc::from("tpm"), at: T0, cost: 10 }), "{effects:?}");
    let q = granted_permit(&acquire(&mut e, &tpm(20), T0.plus(30)));
    // Up: above calls counts as calls; the window holds more than calls until the grant leaves.
    assert_eq!(e.settle(&q.to_string(), &[Cost::new("tpm", 5000)], T0.plus(40), &mut Vec::new()), Ok(Settled::Up));
    assert_eq!(e.figures(&tpm(1), T0.plus(40))[0].window, Some((110, 0)));
    assert_eq!(acquire(&mut e, &tpm(1), T0.plus(50)), refused(T0.plus(1030), Reason::Rate, "tpm"));
    // Again: the latest stands.
    assert_eq!(e.settle(&q.to_string(), &[Cost::new("tpm", 0)], T0.plus(60), &mut Vec::new()), Ok(Settled::Down));
    assert!(acquire(&mut e, &tpm(90), T0.plus(70)).is_granted());
    // A key that was not a window of the grant: an error, nothing changes.
    let before = format!("{e:?}");
    let bad = e.settle(&p.to_string(), &[Cost::new("tpm", 1), Cost::new("other", 1)], T0.plus(80), &mut Vec::new());
    assert_eq!(bad.unwrap_err().0, "costs[1].key is not a window limit of the permit's grant");
    assert_eq!(format!("{e:?}"), before);
    // Unknown, whatever the keys.
    assert_eq!(e.settle("p-x", &[Cost::new("nope", 1)], T0.plus(80), &mut Vec::new()), Ok(Settled::Unknown));
    // After the grant left the window: accepted, changes nothing.
    assert_eq!(
        e.settle(&p.to_string(), &[Cost::new("tpm", 1)], T0.plus(1000), &mut Vec::new()),
        Ok(Settled::Unchanged)
    );
    // After the permit's life (holdMs): unknown.
    assert_eq!(
        e.settle(&p.to_string(), &[Cost::new("tpm", 1)], T0.plus(DEFAULT_HOLD_MS_FOR_TESTS), &mut Vec::new()),
        Ok(Settled::Unknown)
    );
}

const DEFAULT_HOLD_MS_FOR_TESTS: u64 = crate::request::DEFAULT_HOLD_MS;

#[test]
fn release_with_costs_settles_then_releases_and_lift_ends_a_throttle() {
    let mut e = engine();
    let r = req(vec![Limit::window("w", 10, 1000).with_cost(8), Limit::concurrent("c", 1)]);
    let p = granted_permit(&acquire(&mut e, &r, T0));
    assert_eq!(e.release_with(&p.to_string(), &[Cost::new("w", 1)], T0.plus(1), &mut Vec::new()), Ok(true));
    assert_eq!(e.figures(&r, T0.plus(2))[0].window, Some((1, 9)));
    assert_eq!(e.figures(&r, T0.plus(2))[1].places, Some((0, 1)));
    assert_eq!(e.settle(&p.to_string(), &[Cost::new("w", 5)], T0.plus(3), &mut Vec::new()), Ok(Settled::Unknown));
    assert_eq!(e.release_with(&p.to_string(), &[Cost::new("w", 5)], T0.plus(3), &mut Vec::new()), Ok(false));
    e.throttle("caller", T0.plus(5000), T0, &mut Vec::new());
    let mut effects = Vec::new();
    assert!(e.lift("caller", T0.plus(4), &mut effects));
    assert_eq!(effects, vec![Effect::ThrottleEnded { key: Arc::from("caller") }]);
    assert!(!e.lift("caller", T0.plus(5), &mut Vec::new()));
    assert!(acquire(&mut e, &req(vec![]), T0.plus(6)).is_granted());
}

// ---------------------------------------------------------------------------------------------
// The model-based property test.

/// Each bucket key has a `calls` and two windows it is named with (mixed across keys), so rule 3
/// (retention of the longest window named) is exercised; requests vary cost, concurrency, hold,
/// `permit` and `report`; permits are settled up, down, again and after their grant left.
const SHAPES: [(u64, [u64; 2]); 4] = [(3, [100, 100]), (5, [250, 900]), (2, [40, 400]), (8, [1000, 1000])];
const CALLERS: [&str; 2] = ["c0", "c1"];

#[derive(Debug, Clone)]
struct LimitSpec {
    bucket: usize,
    long: bool,
    window: bool,
    concurrent: Option<u64>,
    cost: u64,
    hold_ms: u64,
}

#[derive(Debug, Clone)]
enum Op {
    Acquire { caller: usize, limits: Vec<LimitSpec>, permit: bool, report: bool, hold_ms: u64 },
    Peek { caller: usize, limits: Vec<LimitSpec> },
    Release { nth: usize, bogus: bool, costs: Vec<(usize, u64)> },
    Settle { nth: usize, bogus: bool, costs: Vec<(usize, u64)> },
    Throttle { caller: usize, offset: i64 },
    Lift { caller: usize },
    Advance(Step),
    Sweep,
    Rebuild,
}

#[derive(Debug, Clone)]
enum Step {
    Zero,
    /// To the instant the nth live grant or place leaves (an exact edge).
    Edge(usize),
    By(u64),
}

fn limit_spec() -> impl Strategy<Value = LimitSpec> {
    (
        0..SHAPES.len(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1u64..=3),
        prop_oneof![Just(0u64), 1u64..=3, 5u64..=20],
        1u64..=600,
    )
        .prop_map(|(bucket, long, window, concurrent, cost, hold_ms)| {
            let window = window || concurrent.is_none();
            LimitSpec { bucket, long, window, concurrent, cost, hold_ms }
        })
}

fn limits() -> impl Strategy<Value = Vec<LimitSpec>> {
    prop::collection::vec(limit_spec(), 1..=3).prop_map(|mut limits| {
        limits.sort_by_key(|l| l.bucket);
        limits.dedup_by_key(|l| l.bucket);
        limits
    })
}

fn costs() -> impl Strategy<Value = Vec<(usize, u64)>> {
    prop::collection::vec((0..SHAPES.len(), prop_oneof![Just(0u64), 1u64..=4, 6u64..=30]), 0..=2).prop_map(
        |mut costs| {
            costs.sort_by_key(|c| c.0);
            costs.dedup_by_key(|c| c.0);
            costs
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..CALLERS.len(), limits(), any::<bool>(), any::<bool>(), 1u64..=900).prop_map(
            |(caller, limits, permit, report, hold_ms)| Op::Acquire { caller, limits, permit, report, hold_ms }
        ),
        2 => (0..CALLERS.len(), limits()).prop_map(|(caller, limits)| Op::Peek { caller, limits }),
        2 => (any::<usize>(), prop::bool::weighted(0.2), costs())
            .prop_map(|(nth, bogus, costs)| Op::Release { nth, bogus, costs }),
        3 => (any::<usize>(), prop::bool::weighted(0.1), costs())
            .prop_map(|(nth, bogus, costs)| Op::Settle { nth, bogus, costs }),
        1 => (0..CALLERS.len(), -100i64..400).prop_map(|(caller, offset)| Op::Throttle { caller, offset }),
        1 => (0..CALLERS.len()).prop_map(|caller| Op::Lift { caller }),
        4 => any::<Step>().prop_map(Op::Advance),
        1 => Just(Op::Sweep),
        1 => Just(Op::Rebuild),
    ]
}

impl Arbitrary for Step {
    type Parameters = ();
    type Strategy = BoxedStrategy<Step>;
    fn arbitrary_with((): ()) -> Self::Strategy {
        prop_oneof![Just(Step::Zero), any::<usize>().prop_map(Step::Edge), (0u64..=3000).prop_map(Step::By)].boxed()
    }
}

fn to_request(caller: usize, limits: &[LimitSpec]) -> AcquireRequest {
    let limits = limits
        .iter()
        .map(|l| {
            let (calls, pers) = SHAPES[l.bucket];
            Limit {
                key: format!("b{}", l.bucket),
                window: l.window.then_some(crate::request::WindowLimit { calls, per_ms: pers[usize::from(l.long)] }),
                concurrent: l.concurrent,
                cost: l.cost,
                hold_ms: l.hold_ms,
            }
        })
        .collect();
    AcquireRequest::new(CALLERS[caller], limits).unwrap()
}

fn to_costs(costs: &[(usize, u64)]) -> Vec<Cost> {
    costs.iter().map(|&(b, cost)| Cost::new(format!("b{b}"), cost)).collect()
}

fn run_model(ops: &[Op]) -> Result<(), TestCaseError> {
    let recheck_ms = 250;
    let mut seed = 1;
    let mut e = Engine::new(EngineConfig { recheck_ms, id_seed: seed });
    let mut reference = Reference::default();
    let mut log = EffectLog::default();
    let mut now = T0;
    let mut issued: Vec<PermitId> = Vec::new();
    let mut effects = Vec::new();
    let pick = |issued: &[PermitId], nth: usize, bogus: bool| {
        if bogus || issued.is_empty() {
            ("p-ffffffffffffffffffffffffffffffff".to_owned(), None)
        } else {
            let id = issued[nth % issued.len()];
            (id.to_string(), Some(id))
        }
    };
    for op in ops {
        effects.clear();
        reference.advance(now);
        match op {
            Op::Acquire { caller, limits, permit, report, hold_ms } => {
                let mut r = to_request(*caller, limits).with_hold_ms(*hold_ms).unwrap();
                r.permit = *permit;
                r.report = *report;
                let expected = reference.decide(&r, now, recheck_ms);
                // A peek first: it equals the acquire that follows at the same instant, and
                // leaves the engine exactly as it was.
                let before = format!("{e:?}");
                let peeked = e.peek(&r, now);
                prop_assert_eq!(format!("{e:?}"), before, "a peek changed the engine");
                prop_assert_eq!(e.figures(&r, now), reference.figures(&r, now));
                let got = e.acquire(&r, now, &mut effects);
                prop_assert_eq!(peeked.map(Decision::from), (!got.is_granted()).then(|| got.clone()));
                match (&got, expected) {
                    (Decision::Granted { at, permit }, None) => {
                        prop_assert_eq!(*at, now);
                        prop_assert_eq!(permit.is_some(), r.wants_permit());
                        if let Some(p) = permit {
                            prop_assert!(!issued.contains(p), "permit id reused");
                            issued.push(*p);
                        }
                        reference.grant(&r, now, *permit);
                    }
                    (Decision::Refused { retry_at, reason, limit }, Some((at, why, key))) => {
                        prop_assert_eq!((*retry_at, *reason, limit.as_str()), (at, why, key.as_str()));
                        prop_assert!(
                            effects
                                .iter()
                                .all(|f| matches!(f, Effect::BucketMeta { .. } | Effect::WindowPruned { .. })),
                            "a refusal changes nothing but retention: {:?}",
                            effects
                        );
                        prop_assert!(*retry_at > now);
                        reference.refuse(&r, now);
                    }
                    (got, expected) => prop_assert!(false, "engine {got:?}, reference {expected:?}"),
                }
                // The report: the figures as they stand after the decision.
                prop_assert_eq!(e.figures(&r, now), reference.figures(&r, now));
            }
            Op::Peek { caller, limits } => {
                let r = to_request(*caller, limits);
                let before = format!("{e:?}");
                let peeked = e.peek(&r, now).map(|p| (p.retry_at, p.reason, p.limit));
                prop_assert_eq!(format!("{e:?}"), before, "a peek changed the engine");
                prop_assert_eq!(peeked, reference.decide(&r, now, recheck_ms));
                prop_assert_eq!(e.figures(&r, now), reference.figures(&r, now));
            }
            Op::Release { nth, bogus, costs } => {
                let (permit, id) = pick(&issued, *nth, *bogus);
                let costs = to_costs(costs);
                let expected = if costs.is_empty() {
                    Ok(reference.release(id, now))
                } else {
                    match reference.settle(id, &costs, now) {
                        Err(()) => Err(()),
                        Ok(_) => Ok(reference.release(id, now)),
                    }
                };
                let before = format!("{e:?}");
                let got = e.release_with(&permit, &costs, now, &mut effects);
                let failed = got.is_err();
                prop_assert_eq!(got.map_err(|_| ()), expected);
                if failed {
                    prop_assert_eq!(format!("{e:?}"), before, "a bad release changed the engine");
                }
            }
            Op::Settle { nth, bogus, costs } => {
                let (permit, id) = pick(&issued, *nth, *bogus);
                let costs = to_costs(costs);
                if costs.is_empty() {
                    continue;
                }
                let expected = reference.settle(id, &costs, now);
                let before = format!("{e:?}");
                let got = e.settle(&permit, &costs, now, &mut effects);
                prop_assert_eq!(got.as_ref().map(|s| s.is_settled()).map_err(|_| ()), expected);
                if got.is_err() || got == Ok(Settled::Unknown) {
                    prop_assert_eq!(format!("{e:?}"), before, "a settle that changed nothing changed the engine");
                    prop_assert!(effects.is_empty());
                }
            }
            Op::Throttle { caller, offset } => {
                let until = Millis(now.0.saturating_add_signed(*offset));
                let key = CALLERS[*caller];
                let expected = reference.throttle(key, until, now);
                prop_assert_eq!(e.throttle(key, until, now, &mut effects), expected);
            }
            Op::Lift { caller } => {
                let key = CALLERS[*caller];
                prop_assert_eq!(e.lift(key, now, &mut effects), reference.lift(key, now));
            }
            Op::Advance(step) => {
                now = match step {
                    Step::Zero => now,
                    Step::By(ms) => now.plus(*ms),
                    Step::Edge(n) => {
                        let edges = reference.edges(now);
                        if edges.is_empty() { now } else { edges[n % edges.len()] }
                    }
                };
                reference.advance(now);
            }
            Op::Sweep => {
                let next = e.sweep(now, &mut effects);
                prop_assert!(next.is_none_or(|t| t > now));
            }
            Op::Rebuild => {
                seed += 1;
                let before = e.facts(now);
                e = log.rebuild(EngineConfig { recheck_ms, id_seed: seed }, now);
                prop_assert_eq!(e.facts(now), before, "rebuilt from the effects");
            }
        }
        log.apply(&effects);
        prop_assert_eq!(e.facts(now), reference.facts(now));
        // No window of a bucket named with one perMs and never settled up holds more than calls.
        for (i, (calls, _)) in SHAPES.iter().enumerate() {
            let key = format!("b{i}");
            if let Some(per_ms) = reference.first_per_ms.get(&key)
                && !reference.unbounded.contains(&key)
            {
                let most = reference.max_window_use(&key, *per_ms);
                prop_assert!(most <= *calls, "b{} held {} > {}", i, most, calls);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 10_000,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::SourceParallel("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_the_brute_force_reference(ops in prop::collection::vec(op(), 1..60)) {
        run_model(&ops)?;
    }
}
