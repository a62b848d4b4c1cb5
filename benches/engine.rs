//! Engine decision costs, with governor's keyed `check_key` in the same run as the anchor.
//!
//! Every case keeps 10,000 live buckets and walks them round-robin, one millisecond per
//! decision, so each bucket's window holds a steady few grants as in production; the sweep that
//! forgets lapsed permits and idle buckets runs after every decision and is counted.
//!
//! The line (section 12): the same decisions through `acquire_in_line` (what the limiter calls)
//! for a host that never queues, and a queued refusal: a host asking again with its ticket,
//! refused and renewed, next to a plain refusal and a grant.
//!
//! Request ids (section 16): the grant in line again, each ask named by a fresh id, as the
//! clients send them.
//!
//! Token buckets (section 13): a grant and a refusal from one bucket limit, beside the same of
//! one window limit (the target: a bucket decision within 1.2 times a window decision).
//!
//! Wide lines (section 12.9's cost): 600 live tickets of 64 limits each stand in the same 64
//! buckets; a request naming all of them (refused, the walk of every line), and, beside it, a
//! grant on a bucket of its own, which the line must not slow down.

use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use redb_limiter::engine::{Engine, EngineConfig};
use redb_limiter::request::{AcquireRequest, Limit};
use redb_limiter::time::Millis;

const BUCKETS: usize = 10_000;

fn requests(limits: impl Fn(usize) -> Vec<Limit>) -> Vec<AcquireRequest> {
    (0..BUCKETS).map(|i| AcquireRequest::new(format!("caller/{i}"), limits(i)).unwrap()).collect()
}

fn run_engine(c: &mut Criterion, name: &str, reqs: &[AcquireRequest]) {
    run(c, name, reqs, false);
}

fn run(c: &mut Criterion, name: &str, reqs: &[AcquireRequest], in_line: bool) {
    let mut engine = Engine::new(EngineConfig::default());
    let mut effects = Vec::with_capacity(16);
    let mut now = Millis(1_000_000);
    // Warm every bucket so the map holds 10,000 live buckets before measuring.
    for r in reqs {
        engine.acquire(r, now, &mut effects);
        effects.clear();
    }
    let mut i = 0;
    c.bench_function(name, |b| {
        b.iter(|| {
            now = now.plus(1);
            i = (i + 1) % reqs.len();
            let d = if in_line {
                engine.acquire_in_line(black_box(&reqs[i]), now, &mut effects).expect("well formed").decision
            } else {
                engine.acquire(black_box(&reqs[i]), now, &mut effects)
            };
            // The sweeper's share of the work: forgetting what lapsed.
            engine.sweep(now, &mut effects);
            effects.clear();
            black_box(d)
        })
    });
}

/// [`run`] through the line's entry with a fresh request id on every ask (section 16): each
/// grant is remembered for a minute, so about 60,000 records stand at once, as with a host that
/// names every ask.
fn run_with_ids(c: &mut Criterion, name: &str, reqs: &[AcquireRequest]) {
    use std::fmt::Write;
    let mut reqs = reqs.to_vec();
    let mut engine = Engine::new(EngineConfig::default());
    let mut effects = Vec::with_capacity(16);
    let mut now = Millis(1_000_000);
    for r in &reqs {
        engine.acquire(r, now, &mut effects);
        effects.clear();
    }
    let (mut i, mut n) = (0, 0u64);
    c.bench_function(name, |b| {
        b.iter(|| {
            now = now.plus(1);
            i = (i + 1) % reqs.len();
            n += 1;
            let id = reqs[i].id.get_or_insert_with(String::new);
            id.clear();
            let _ = write!(id, "r-5f0c2a7e91d34b6880a1c3e5f7092b4d-{n:x}");
            let d = engine.acquire_in_line(black_box(&reqs[i]), now, &mut effects).expect("well formed").decision;
            engine.sweep(now, &mut effects);
            effects.clear();
            black_box(d)
        })
    });
}

fn decisions(c: &mut Criterion) {
    let keys: Vec<String> = (0..BUCKETS).map(|i| format!("bench/b:{i}")).collect();
    let governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()));
    for k in &keys {
        let _ = governor.check_key(k);
    }
    let mut i = 0;
    c.bench_function("governor keyed check_key, 10k keys", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(governor.check_key(black_box(&keys[i])).is_ok())
        })
    });

    let single = requests(|i| vec![Limit::window(format!("bench/b:{i}"), 1_000_000_000, 60_000)]);
    run_engine(c, "engine granted, 1 limit, 10k buckets", &single);

    let three = requests(|i| {
        vec![
            Limit::window(format!("bench/rpm:{i}"), 1_000_000_000, 60_000),
            Limit::window(format!("bench/tpm:{i}"), 1_000_000_000, 60_000).with_cost(1234),
            Limit::concurrent(format!("bench/conc:{i}"), 1_000_000).with_hold_ms(1000),
        ]
    });
    run_engine(c, "engine granted, 3 limits (rpm, tpm, conc), 10k buckets", &three);

    // Each bucket takes one call a minute, so after the warm-up every decision is a refusal.
    let refused = requests(|i| vec![Limit::window(format!("bench/b:{i}"), 1, 60_000)]);
    run_engine(c, "engine refused, 1 limit, 10k buckets", &refused);

    // The same decisions from token buckets (section 13): one that always has tokens (a burst of
    // 10^9 refilled a token a minute, so that it never fills up and is forgotten, as the window
    // above never empties), and one of 1 token a minute, so that after the warm-up every
    // decision is a refusal.
    let tokens = requests(|i| vec![Limit::bucket(format!("bench/b:{i}"), 1, 60_000).with_burst(1_000_000_000)]);
    run_engine(c, "engine granted, 1 token bucket limit, 10k buckets", &tokens);
    let empty = requests(|i| vec![Limit::bucket(format!("bench/b:{i}"), 1, 60_000)]);
    run_engine(c, "engine refused, 1 token bucket limit, 10k buckets", &empty);

    // The same, through the line's entry, for a host that never queues.
    run(c, "engine granted in line (no queue), 1 limit, 10k buckets", &single, true);
    run_with_ids(c, "engine granted in line with a request id, 1 limit, 10k buckets", &single);
    run(c, "engine refused in line (no queue), 1 limit, 10k buckets", &refused, true);

    // A queued refusal: every bucket's window is full for the whole run (31 days) and one host
    // waits in its line; it asks again with its ticket and is refused and renewed. Next to it,
    // the plain refusal of the same limits.
    let full = requests(|i| vec![Limit::window(format!("bench/b:{i}"), 1, 2_678_400_000)]);
    run(c, "engine refused in line (no queue, full window), 1 limit, 10k buckets", &full, true);
    // A horizon past the run's 31 days, so that the tickets are filed and never lapse.
    let mut engine = Engine::new(EngineConfig { line_horizon_ms: 1 << 40, ..EngineConfig::default() });
    let mut effects = Vec::with_capacity(16);
    let mut now = Millis(1_000_000);
    let mut asks = Vec::with_capacity(full.len());
    for r in &full {
        engine.acquire(r, now, &mut effects);
        let answer = engine.acquire_in_line(&r.clone().with_queue(), now, &mut effects).expect("well formed");
        let ticket = answer.ticket.expect("filed").id.to_string();
        asks.push(r.clone().with_ticket(ticket).expect("a ticket of ours"));
        effects.clear();
    }
    let mut i = 0;
    c.bench_function("engine queued refusal (renewed), 1 limit, 10k buckets", |b| {
        b.iter(|| {
            now = now.plus(1);
            i = (i + 1) % asks.len();
            let answer = engine.acquire_in_line(black_box(&asks[i]), now, &mut effects).expect("bound");
            engine.sweep(now, &mut effects);
            effects.clear();
            black_box(answer)
        })
    });
}

fn wide_lines(c: &mut Criterion) {
    const WIDTH: usize = 64;
    const TICKETS: usize = 600;
    let mut engine = Engine::new(EngineConfig::default());
    let mut effects = Vec::with_capacity(1024);
    let mut now = Millis(1_000_000);
    let wide = |caller: String| {
        let limits = (0..WIDTH).map(|b| Limit::window(format!("wide/{b}"), 100, 60_000)).collect();
        AcquireRequest::new(caller, limits).unwrap()
    };
    // Fill every window, then file the tickets.
    for i in 0..100 {
        assert!(engine.acquire(&wide(format!("filler/{i}")), now, &mut effects).is_granted());
    }
    for i in 0..TICKETS {
        let answer = engine.acquire_in_line(&wide(format!("host/{i}")).with_queue(), now, &mut effects).unwrap();
        assert!(answer.ticket.is_some(), "filed");
    }
    effects.clear();
    let refused = wide("late".into());
    c.bench_function("engine refused behind 600 tickets of 64 limits (every line walked)", |b| {
        b.iter(|| {
            now = now.plus(1);
            let d = engine.acquire(black_box(&refused), now, &mut effects);
            effects.clear();
            black_box(d)
        })
    });
    let others = requests(|i| vec![Limit::window(format!("other/{i}"), 1_000_000_000, 60_000)]);
    let mut i = 0;
    c.bench_function("engine granted, 1 limit, beside 600 wide tickets", |b| {
        b.iter(|| {
            now = now.plus(1);
            i = (i + 1) % others.len();
            let d = engine.acquire_in_line(black_box(&others[i]), now, &mut effects).expect("well formed").decision;
            effects.clear();
            black_box(d)
        })
    });
}

criterion_group!(benches, decisions, wide_lines);
criterion_main!(benches);
