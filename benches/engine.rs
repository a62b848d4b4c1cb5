//! Engine decision costs, with governor's keyed `check_key` in the same run as the anchor.
//!
//! Every case keeps 10,000 live buckets and walks them round-robin, one millisecond per
//! decision, so each bucket's window holds a steady few grants as in production; the sweep that
//! forgets lapsed permits and idle buckets runs after every decision and is counted.

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
            let d = engine.acquire(black_box(&reqs[i]), now, &mut effects);
            // The sweeper's share of the work: forgetting what lapsed.
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
}

criterion_group!(benches, decisions);
criterion_main!(benches);
