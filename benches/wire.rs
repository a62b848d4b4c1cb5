//! What the server spends on the wire per acquire, apart from HTTP and the decision: parsing and
//! validating the request body, and encoding the reply.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use redb_limiter::engine::Decision;
use redb_limiter::request::{Method, Request};
use redb_limiter::time::Millis;
use redb_limiter::wire::AcquireReply;

const NOW: Millis = Millis(1_764_460_800_000);

fn wire(c: &mut Criterion) {
    let one = br#"{"key":"bench/caller","cost":1,"limits":[{"key":"bench/b:123","calls":1000000,"perMs":1000}]}"#;
    let three = br#"{"key":"anthropic/cred:42","cost":1,"holdMs":600000,"limits":[
        {"key":"anthropic/team:7/rpm","calls":50,"perMs":60000},
        {"key":"anthropic/team:7/tpm","calls":40000,"perMs":60000,"cost":1200},
        {"key":"anthropic/team:7/conc","concurrent":4}]}"#;
    c.bench_function("parse acquire, 1 limit", |b| {
        b.iter(|| Request::from_body(Method::Acquire, black_box(one), NOW).unwrap())
    });
    c.bench_function("parse acquire, 3 limits", |b| {
        b.iter(|| Request::from_body(Method::Acquire, black_box(three), NOW).unwrap())
    });
    let granted = Decision::Granted { at: NOW, permit: None };
    c.bench_function("encode a grant", |b| {
        b.iter(|| serde_json::to_vec(&AcquireReply::from(black_box(&granted))).unwrap())
    });
}

criterion_group!(benches, wire);
criterion_main!(benches);
