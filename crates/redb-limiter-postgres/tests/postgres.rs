//! PostgreSQL mode against a real PostgreSQL (no mocks): the URL comes from
//! `REDB_LIMITER_TEST_POSTGRES` (`.ci/run` starts a throwaway server and exports it). Under
//! `CI=true` a missing URL fails the tests; elsewhere they say loudly that they did not run.
//!
//! The Rust engine is the oracle: the differential test drives the engine and the database
//! with the same operations at the same instants (the database's clock replaced by an injected
//! one) and compares every answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use redb_limiter::engine::{Engine, EngineConfig};
use redb_limiter::request::{
    AcquireRequest, Adapt, Cost, Limit, ReleaseRequest, SettleRequest, Signal, ThrottleRequest,
};
use redb_limiter::time::{Clock, FakeClock};
use redb_limiter::{Decision, LimiterError, Millis, Reason};
use redb_limiter_postgres::{PgError, PgLimiter, PgOptions};

const T0: Millis = Millis(1_764_460_800_000);

fn database_url() -> Option<String> {
    redb_limiter_postgres::test_database_url()
}

/// The runtime each test runs on: two workers, as a server has on this machine.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A fresh schema for one test, on the injected clock, with the default batch turns.
async fn fresh(url: &str, name: &str, clock: Arc<FakeClock>) -> PgLimiter {
    fresh_with(url, name, clock, redb_limiter_postgres::batch::DEFAULT_BATCHERS).await
}

/// The same with `batchers` batch turns (one: requests sent at once queue behind the first).
async fn fresh_with(url: &str, name: &str, clock: Arc<FakeClock>, batchers: usize) -> PgLimiter {
    fresh_options(url, name, clock, |options| options.batchers = batchers).await
}

/// The same with the options `set` changes.
async fn fresh_options(url: &str, name: &str, clock: Arc<FakeClock>, set: impl FnOnce(&mut PgOptions)) -> PgLimiter {
    static N: AtomicU32 = AtomicU32::new(0);
    let schema = format!("t_{}_{}_{name}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
    let mut options = PgOptions::new(url);
    options.schema = schema;
    options.pool_size = 4;
    options.clock = Some(clock);
    set(&mut options);
    PgLimiter::connect(options).await.expect("connect and create the schema")
}

/// How many database sessions of `pg`'s pool are open (with `since`: how many changed state
/// after it, that is, ran a statement), read apart from the pool.
async fn sessions(client: &tokio_postgres::Client, pg: &PgLimiter, since: Option<std::time::SystemTime>) -> i64 {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
               AND ($2::timestamptz IS NULL OR state_change > $2)";
    let name = format!("redb-limiter/{}", pg.schema());
    client.query_one(sql, &[&name, &since]).await.unwrap().get(0)
}

/// `n` acquires of a roomy window sent at once, all granted (one: a request alone); at once,
/// they open the pool's sessions.
async fn burst(pg: &PgLimiter, n: usize) {
    let req = AcquireRequest::new("caller", vec![window("w", 1_000_000, 60_000)]).unwrap();
    let requests: Vec<_> = (0..n).map(|_| pg.acquire(req.clone())).collect();
    assert!(join_all(requests).await.iter().all(|r| r.as_ref().is_ok_and(|a| a.decision.is_granted())));
}

/// A plain connection of its own, outside the limiter's pool (to look at or hold rows).
async fn plain_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// The format version the `meta` row of `schema` (quoted) carries.
async fn schema_version(client: &tokio_postgres::Client, schema: &str) -> i32 {
    client.query_one(&format!("SELECT version FROM {schema}.meta"), &[]).await.unwrap().get(0)
}

/// Opens a schema that already exists with this release's code (which migrates it), on a small
/// pool and the test's clock.
async fn open_existing(url: &str, schema: &str, clock: &Arc<FakeClock>) -> Result<PgLimiter, PgError> {
    let mut options = PgOptions::new(url);
    options.schema = schema.to_owned();
    options.pool_size = 2;
    options.clock = Some(clock.clone());
    PgLimiter::connect(options).await
}

fn window(key: &str, calls: u64, per_ms: u64) -> Limit {
    Limit::window(key, calls, per_ms)
}

#[test]
fn every_rule_of_acquire_release_and_throttle() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "rules", clock.clone()).await;
        // Rolling window: 2 calls a second.
        let req = AcquireRequest::new("caller", vec![window("w", 2, 1000)]).unwrap();
        assert_eq!(pg.acquire(req.clone()).await.unwrap().decision, Decision::Granted { at: T0, permit: None });
        clock.advance(400);
        assert!(pg.acquire(req.clone()).await.unwrap().decision.is_granted());
        clock.advance(100);
        assert_eq!(
            pg.acquire(req.clone()).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(1000), reason: Reason::Rate, limit: "w".into() }
        );
        clock.set(T0.plus(1000));
        assert!(pg.acquire(req.clone()).await.unwrap().decision.is_granted(), "the first grant left the window");

        // Concurrency: one place; a release frees it, a second release is false.
        let conc = AcquireRequest::new("caller", vec![Limit::concurrent("c", 1).with_hold_ms(5_000)]).unwrap();
        let Decision::Granted { permit: Some(permit), .. } = pg.acquire(conc.clone()).await.unwrap().decision else {
            panic!("a place")
        };
        let refused = pg.acquire(conc.clone()).await.unwrap().decision;
        assert!(matches!(refused, Decision::Refused { reason: Reason::Concurrency, .. }), "{refused:?}");
        let release = ReleaseRequest::new(permit.to_string()).unwrap();
        assert!(pg.release(release.clone()).await.unwrap());
        assert!(!pg.release(release).await.unwrap());
        assert!(pg.acquire(conc.clone()).await.unwrap().decision.is_granted());
        // A place never released lapses holdMs after its grant.
        clock.advance(5_000);
        assert!(pg.acquire(conc).await.unwrap().decision.is_granted(), "the held place lapsed");

        // Throttle: only extends; every acquire as that caller is refused until then.
        let until = clock.now().plus(2_000);
        let t = ThrottleRequest::new("caller", until, clock.now()).unwrap();
        assert_eq!(pg.throttle(t).await.unwrap(), Some(until));
        let earlier = ThrottleRequest::new("caller", until.minus(1_000), clock.now()).unwrap();
        assert_eq!(pg.throttle(earlier).await.unwrap(), Some(until), "a throttle never shortens");
        let any = AcquireRequest::new("caller", vec![window("other", 100, 1000)]).unwrap();
        assert_eq!(
            pg.acquire(any.clone()).await.unwrap().decision,
            Decision::Refused { retry_at: until, reason: Reason::Throttle, limit: "caller".into() }
        );
        clock.set(until);
        assert!(pg.acquire(any).await.unwrap().decision.is_granted());

        // The state lists what is live.
        let snapshot = pg.state("", 1000).await.unwrap();
        assert_eq!(snapshot.now, clock.now());
        assert!(snapshot.view.buckets.iter().any(|b| b.key == "other" && b.window_used == 1));
    });
}

/// A rate refusal's retryAt is when the first row whose running total reaches
/// `total + cost - calls` leaves: found among the first 64 rows of the window in one statement,
/// past them by binary search. 150 grants one millisecond apart, then refusals whose answer is
/// row 1 to row 150, by the fast path (one limit) and the general one (two), as the engine says.
#[test]
fn a_rate_refusal_finds_its_retry_at_however_deep_in_the_window() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "retry", clock.clone()).await;
        let mut engine = Engine::new(EngineConfig::default());
        let mut effects = Vec::new();
        let one = |cost: u64| window("w", 200, 100_000).with_cost(cost);
        for _ in 0..150 {
            let req = AcquireRequest::new("caller", vec![one(1)]).unwrap();
            let want = engine.acquire(&req, clock.now(), &mut effects);
            assert!(want.is_granted());
            assert_eq!(pg.acquire(req).await.unwrap().decision, want);
            clock.advance(1);
        }
        clock.advance(10);
        for cost in [51, 52, 80, 113, 114, 115, 116, 130, 164, 199, 200] {
            for limits in [vec![one(cost)], vec![one(cost), window("roomy", 1_000, 1_000)]] {
                let req = AcquireRequest::new("caller", limits).unwrap();
                let want = engine.acquire(&req, clock.now(), &mut effects);
                assert!(matches!(want, Decision::Refused { reason: Reason::Rate, .. }), "{want:?}");
                assert_eq!(pg.acquire(req.clone()).await.unwrap().decision, want, "{req:?}");
            }
        }
    });
}

/// A refusal and a peek lock nothing and write nothing: the bucket row keeps its version
/// (xmin) and carries no lock (xmax 0), and no grant row is added.
#[test]
fn refusals_and_peeks_lock_and_write_nothing() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh_with(&url, "readonly", clock.clone(), 1).await;
        let full = AcquireRequest::new("caller", vec![window("w", 2, 60_000)]).unwrap();
        for _ in 0..2 {
            assert!(pg.acquire(full.clone()).await.unwrap().decision.is_granted());
        }
        let client = plain_client(&url).await;
        let schema = pg.schema().to_owned();
        let row = format!(
            "SELECT b.xmin::text, b.xmax::text, (SELECT count(*) FROM \"{schema}\".grants) \
             FROM \"{schema}\".buckets b WHERE b.key = 'w'"
        );
        let read = |row: tokio_postgres::Row| (row.get::<_, String>(0), row.get::<_, String>(1), row.get::<_, i64>(2));
        let before = read(client.query_one(&row, &[]).await.unwrap());
        assert_eq!(before.1, "0");
        clock.advance(5);
        for _ in 0..3 {
            let refused = pg.acquire(full.clone()).await.unwrap().decision;
            assert!(matches!(refused, Decision::Refused { reason: Reason::Rate, .. }), "{refused:?}");
            assert!(pg.peek(full.clone()).await.unwrap().refusal.is_some());
            let mut report = full.clone();
            report.report = true;
            assert!(!pg.acquire(report).await.unwrap().decision.is_granted());
        }
        // Refusals sent at once: the first goes alone, the others queue behind it and go in a
        // batch statement (usually one with all seven; a request that reaches the queue after
        // the batch was taken goes alone, as a lone waiter does).
        let batches = pg.batch_paths();
        let refused = join_all((0..8).map(|_| pg.acquire(full.clone())).collect()).await;
        for r in refused {
            assert!(matches!(r.unwrap().decision, Decision::Refused { reason: Reason::Rate, .. }));
        }
        let (sent, decided, _) = pg.batch_paths();
        let (sent, decided) = (sent - batches.0, decided - batches.1);
        assert!(sent >= 1 && (2..=7).contains(&decided), "batches decided refusals: {sent} sent, {decided} decided");
        assert_eq!(read(client.query_one(&row, &[]).await.unwrap()), before);
        // The same calls inside one explicit transaction: PostgreSQL assigns a transaction id
        // at a transaction's first row write or row lock, and only such a transaction writes
        // WAL for its rows. None is assigned: a refusal and a peek write no WAL.
        let at = clock.now().0 as i64;
        let body = full.to_json();
        client.batch_execute("BEGIN").await.unwrap();
        for mode in ["acquire", "peek"] {
            let call = format!("SELECT \"{schema}\".acquire($1::jsonb, $2, 0, 'p-wal-check', $3)::text");
            let reply: String = client.query_one(&call, &[&body, &mode, &at]).await.unwrap().get(0);
            assert!(reply.contains("\"fits\": false") || reply.contains("\"granted\": false"), "{mode}: {reply}");
        }
        // The one statement that decides a one-window acquire, as the limiter sends it.
        let verdict: String = client
            .query_one(
                pg.acquire_window_sql(),
                &[&"w", &2i64, &60_000i64, &1i64, &"caller", &at, &0i64, &600_000i64, &600_000i64],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(verdict, "r", "the statement refuses for rate");
        // The batch statement, as the limiter sends it, refusing a batch of them.
        let batch = client
            .query(
                pg.acquire_window_batch_sql(),
                &[
                    &vec!["w"; 4],
                    &vec![2i64; 4],
                    &vec![60_000i64; 4],
                    &vec![1i64; 4],
                    &vec!["caller"; 4],
                    &vec![Some(at); 4],
                ],
            )
            .await
            .unwrap();
        let verdicts: Vec<&str> = batch.iter().map(|r| r.get(1)).collect();
        assert_eq!(verdicts, ["r"; 4], "the batch refuses each for rate");
        let xid: Option<i64> = client.query_one("SELECT txid_current_if_assigned()", &[]).await.unwrap().get(0);
        assert_eq!(xid, None, "a refusal or a peek wrote or locked a row");
        // And the check can fail: a grant in the same kind of transaction is assigned one.
        let room = AcquireRequest::new("caller", vec![window("other", 2, 60_000)]).unwrap().to_json();
        let call = format!("SELECT \"{schema}\".acquire($1::jsonb, 'acquire', 0, 'p-wal-check', $2)::text");
        client.query_one(&call, &[&room, &at]).await.unwrap();
        let xid: Option<i64> = client.query_one("SELECT txid_current_if_assigned()", &[]).await.unwrap().get(0);
        assert!(xid.is_some(), "a grant writes its row");
        client.batch_execute("ROLLBACK").await.unwrap();
    });
}

/// The batch statement never waits for a lock: a bucket row another transaction holds is left
/// to go alone (so is a second grant of a bucket in the same batch, whose row the batch itself
/// writes), while the batch grants the rest at once. Sent on a connection that gives up after
/// two seconds: a wait would fail the statement.
#[test]
fn a_batch_never_waits_for_a_lock_and_leaves_a_second_grant_of_a_bucket_alone() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "nowait", clock.clone()).await;
        for key in ["x", "y", "z"] {
            let req = AcquireRequest::new("caller", vec![window(key, 5, 1000)]).unwrap();
            assert!(pg.acquire(req).await.unwrap().decision.is_granted());
        }
        let (holder, batcher) = (plain_client(&url).await, plain_client(&url).await);
        let schema = pg.schema().to_owned();
        holder.batch_execute("BEGIN").await.unwrap();
        let lock = format!("SELECT 1 FROM \"{schema}\".buckets WHERE key = 'x' FOR UPDATE");
        assert_eq!(holder.query(&lock, &[]).await.unwrap().len(), 1);
        batcher.batch_execute("SET statement_timeout = '2s'; SET lock_timeout = '2s'").await.unwrap();
        let at = Some(T0.plus(10).0 as i64);
        let keys = ["x", "y", "y", "z", "y"];
        let rows = batcher
            .query(
                pg.acquire_window_batch_sql(),
                &[&keys.to_vec(), &vec![5i64; 5], &vec![1000i64; 5], &vec![1i64; 5], &vec!["caller"; 5], &vec![at; 5]],
            )
            .await
            .expect("the batch does not wait for the locked row");
        let verdicts: Vec<(i64, &str)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(verdicts, [(1, "a"), (2, "g"), (3, "a"), (4, "g"), (5, "a")]);
        holder.batch_execute("COMMIT").await.unwrap();
        // What the batch granted is committed, once each.
        let used = |key: &str| {
            let req = AcquireRequest::new("caller", vec![window(key, 5, 1000)]).unwrap();
            let pg = &pg;
            async move { pg.peek(req).await.unwrap().report.limits[0].window.unwrap().0 }
        };
        assert_eq!((used("x").await, used("y").await, used("z").await), (1, 2, 2));
    });
}

/// A batch statement that fails for one request's sake (here a check constraint refuses grants
/// into bucket `x`) rolled back every request in it; the others are then decided again, each
/// alone: the one that failed it answers its own error, the others what they would have been
/// alone, and `/health` still says the database answers.
#[test]
fn a_batch_that_fails_for_one_request_answers_its_error_and_decides_the_others_again() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh_with(&url, "failed", clock.clone(), 1).await;
        let keys = ["d", "x", "y", "z"];
        let req = |key: &str| AcquireRequest::new("caller", vec![window(key, 10, 60_000)]).unwrap();
        for key in keys {
            assert!(pg.acquire(req(key)).await.unwrap().decision.is_granted());
        }
        let client = plain_client(&url).await;
        let schema = pg.schema().to_owned();
        let x: i64 = client
            .query_one(&format!("SELECT id FROM \"{schema}\".buckets WHERE key = 'x'"), &[])
            .await
            .unwrap()
            .get(0);
        client
            .batch_execute(&format!(
                "ALTER TABLE \"{schema}\".grants ADD CONSTRAINT no_x CHECK (bucket <> {x}) NOT VALID"
            ))
            .await
            .unwrap();
        clock.advance(10);
        // The first takes the free turn and goes alone; the other three queue behind it and are
        // one batch, which fails on x's grant.
        let answers = join_all(keys.iter().map(|k| pg.acquire(req(k))).collect()).await;
        for (key, answer) in keys.iter().zip(&answers) {
            if *key == "x" {
                assert!(matches!(answer, Err(LimiterError::Unavailable(_))), "{answers:?}");
            } else {
                assert!(answer.as_ref().unwrap().decision.is_granted(), "{key}: {answers:?}");
            }
        }
        assert_eq!(pg.batches_failed(), 1, "the batch failed once and its requests went alone");
        pg.health().await.expect("the database answered: /health is not the last request");
        assert_eq!(pg.health_probes(), 0, "answered from the latest call");
        client.batch_execute(&format!("ALTER TABLE \"{schema}\".grants DROP CONSTRAINT no_x")).await.unwrap();
        let used = |key: &'static str| {
            let pg = &pg;
            async move { pg.peek(req(key)).await.unwrap().report.limits[0].window.unwrap().0 }
        };
        assert_eq!((used("d").await, used("x").await, used("y").await, used("z").await), (2, 1, 2, 2));
    });
}

/// A poisoned batch: rounds of 40 one-window acquires sent at once, one of them for a bucket
/// whose grants the database refuses, 39 good ones on 13 buckets of 2 calls. Every good one is
/// answered as it would be alone (per bucket 2 granted and 1 refused for rate, at the round's
/// instant), the poisoned one alone errs, and `/health` stays up.
#[test]
fn one_hostile_request_among_concurrent_good_ones_fails_only_itself() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh_with(&url, "poisoned", clock.clone(), 1).await;
        let poison = AcquireRequest::new("bad", vec![window("poison", 10, 1000)]).unwrap();
        assert!(pg.acquire(poison.clone()).await.unwrap().decision.is_granted());
        let client = plain_client(&url).await;
        let schema = pg.schema().to_owned();
        let id: i64 = client
            .query_one(&format!("SELECT id FROM \"{schema}\".buckets WHERE key = 'poison'"), &[])
            .await
            .unwrap()
            .get(0);
        client
            .batch_execute(&format!(
                "ALTER TABLE \"{schema}\".grants ADD CONSTRAINT no_poison CHECK (bucket <> {id}) NOT VALID"
            ))
            .await
            .unwrap();
        for round in 0..5u64 {
            clock.set(T0.plus(10_000 * (round + 1)));
            let mut reqs: Vec<AcquireRequest> = (0..39)
                .map(|i| {
                    AcquireRequest::new(format!("good{i}"), vec![window(&format!("g{}", i % 13), 2, 1000)]).unwrap()
                })
                .collect();
            let at = usize::try_from(round * 7 % 40).unwrap();
            reqs.insert(at, poison.clone());
            let answers = join_all(reqs.iter().map(|r| pg.acquire(r.clone())).collect()).await;
            let mut granted = std::collections::BTreeMap::<String, (u32, u32)>::new();
            for (i, (req, answer)) in reqs.iter().zip(&answers).enumerate() {
                if i == at {
                    assert!(matches!(answer, Err(LimiterError::Unavailable(_))), "{answer:?}");
                    continue;
                }
                let entry = granted.entry(req.limits[0].key.clone()).or_default();
                match &answer.as_ref().expect("a good request never fails").decision {
                    Decision::Granted { at, .. } => {
                        assert_eq!(*at, clock.now());
                        entry.0 += 1;
                    }
                    Decision::Refused { reason: Reason::Rate, retry_at, .. } => {
                        assert_eq!(*retry_at, clock.now().plus(1000));
                        entry.1 += 1;
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(granted.len(), 13);
            assert!(granted.values().all(|&(g, r)| (g, r) == (2, 1)), "round {round}: {granted:?}");
            pg.health().await.expect("/health reflects the database, not the last request");
        }
        assert!(pg.batches_failed() > 0, "the poisoned request shared a batch");
    });
}

/// Two limiters on one schema (as two servers), batching overlapping hot buckets: 48 tasks on
/// each, one-window acquires of three hot buckets and now and then two windows of them in
/// either order (locked in key order by the other path). No call fails (a batch never waits, so
/// it never deadlocks with anything), and every window holds at most its calls: the granted
/// instants are checked offline against every window.
#[test]
fn two_limiters_batching_hot_buckets_never_fail_nor_over_grant() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        const CALLS: u64 = 5;
        const PER_MS: u64 = 300;
        let schema = format!("t_{}_hot_batches", std::process::id());
        let connect = || {
            let mut options = PgOptions::new(&url);
            options.schema = schema.clone();
            options.pool_size = 8;
            PgLimiter::connect(options)
        };
        let limiters = [Arc::new(connect().await.unwrap()), Arc::new(connect().await.unwrap())];
        let mut tasks = Vec::new();
        for task in 0..96u64 {
            let pg = Arc::clone(&limiters[(task % 2) as usize]);
            tasks.push(tokio::spawn(async move {
                let mut granted: Vec<(u64, Vec<String>)> = Vec::new();
                for i in 0..60u64 {
                    let (a, b) = (format!("h{}", (task + i) % 3), format!("h{}", (task + i + 1) % 3));
                    let keys = if i % 5 == 4 { vec![a, b] } else { vec![a] };
                    let limits = keys.iter().map(|k| window(k, CALLS, PER_MS)).collect();
                    let req = AcquireRequest::new(format!("t{task}"), limits).unwrap();
                    match pg.acquire(req).await.expect("no call fails").decision {
                        Decision::Granted { at, .. } => granted.push((at.0, keys)),
                        Decision::Refused { reason: Reason::Rate, .. } => {}
                        other => panic!("{other:?}"),
                    }
                }
                granted
            }));
        }
        let mut by_bucket: std::collections::BTreeMap<String, Vec<u64>> = std::collections::BTreeMap::new();
        for task in tasks {
            for (at, keys) in task.await.unwrap() {
                for key in keys {
                    by_bucket.entry(key).or_default().push(at);
                }
            }
        }
        let fullest = redb_limiter::engine::model::fullest_window_of(by_bucket, PER_MS);
        let (bucket, inside, start) = fullest.expect("grants were recorded");
        assert!(inside <= CALLS, "{bucket}: {inside} grants in the {PER_MS} ms from {start}");
        assert_eq!(inside, CALLS, "some window was filled to its calls, so the bound was tested");
        for pg in &limiters {
            let (batches, decided, alone) = pg.batch_paths();
            assert!(batches > 0 && decided > 0 && alone > 0, "{:?}", pg.batch_paths());
        }
    });
}

/// Which path decided a window acquire: (the one statement, `acquire()`).
const DECIDED: (u64, u64) = (1, 0);
const LEFT: (u64, u64) = (0, 1);

/// Decides `req` in the database and in `engine` at the clock's now: both must answer alike
/// (permit ids aside: each side issues its own), and `path` must have decided it.
async fn check_path(
    pg: &PgLimiter,
    engine: &mut Engine,
    clock: &FakeClock,
    req: AcquireRequest,
    path: (u64, u64),
    what: &str,
) -> Decision {
    let before = pg.window_paths();
    let want = engine.acquire(&req, clock.now(), &mut Vec::new());
    let got = pg.acquire(req.clone()).await.unwrap();
    let plain = |d: &Decision| match d {
        Decision::Granted { at, permit } => format!("granted at {at:?}, permit {}", permit.is_some()),
        refused => format!("{refused:?}"),
    };
    assert_eq!(plain(&got.decision), plain(&want), "{what}: {req:?}");
    let after = pg.window_paths();
    assert_eq!((after.0 - before.0, after.1 - before.1), path, "{what}: which path");
    want
}

/// A one-window acquire is one statement (`sql/acquire_window.sql`): it decides a grant, a
/// rate refusal and a throttle itself, and leaves every other case to `acquire()` in the same
/// call (a new bucket, a grant in the newest grant's millisecond, a retryAt past the window's
/// first row, a longer window than the retention, a shorter one, a settled bucket, a bucket
/// with places, a row changed since it was read). Both halves answer as the engine does.
#[test]
fn one_window_acquires_are_decided_by_one_statement_or_left_to_acquire() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "window", clock.clone()).await;
        let mut engine = Engine::new(EngineConfig::default());
        let mut effects = Vec::new();
        // Each step against the engine, and which path decided it.
        macro_rules! check {
            ($req:expr, $path:expr, $what:expr) => {
                check_path(&pg, &mut engine, &clock, $req, $path, $what).await
            };
        }
        const NEITHER: (u64, u64) = (0, 0);
        let w = |calls: u64, per_ms: u64, cost: u64| {
            AcquireRequest::new("caller", vec![window("w", calls, per_ms).with_cost(cost)]).unwrap()
        };

        assert!(check!(w(5, 1000, 1), LEFT, "a new bucket").is_granted());
        assert!(check!(w(5, 1000, 1), LEFT, "the same millisecond").is_granted());
        clock.advance(10);
        assert!(check!(w(5, 1000, 2), DECIDED, "a grant").is_granted());
        clock.advance(10);
        assert!(!check!(w(5, 1000, 2), DECIDED, "a rate refusal at the first row").is_granted());
        assert!(!check!(w(5, 1000, 4), LEFT, "a retryAt past the first row").is_granted());
        assert!(!check!(w(5, 1000, 9), LEFT, "a cost capped at calls, past the first row").is_granted());
        assert!(check!(w(5, 1000, 0), NEITHER, "cost 0 goes to acquire() directly").is_granted());

        // Throttles: alone, and against a rate refusal (the later one stands; a tie is the
        // throttle's).
        let roomy = AcquireRequest::new("caller", vec![window("v", 100, 1000)]).unwrap();
        assert!(check!(roomy.clone(), LEFT, "another new bucket").is_granted());
        let t = |until: Millis| ThrottleRequest::new("caller", until, clock.now()).unwrap();
        let rate_at = T0.plus(1000);
        for until in [rate_at.minus(1), rate_at, rate_at.plus(1)] {
            engine.throttle("caller", until, clock.now(), &mut effects);
            pg.throttle(t(until)).await.unwrap();
            assert!(!check!(w(5, 1000, 2), DECIDED, "throttled and full").is_granted());
        }
        let nowhere = AcquireRequest::new("caller", vec![window("x", 100, 1000)]).unwrap();
        check!(nowhere.clone(), LEFT, "a throttled caller, a new bucket");
        check!(nowhere, LEFT, "a throttled caller, a new bucket again (a refusal creates nothing)");
        clock.advance(1);
        check!(roomy.clone(), DECIDED, "a throttled caller");
        clock.set(T0.plus(2000));
        assert!(check!(roomy.clone(), DECIDED, "the throttle ended").is_granted());

        // Retention (rule 3): a longer window lengthens it, a shorter one may restart it.
        clock.advance(1);
        assert!(check!(w(5, 3000, 1), LEFT, "a longer window").is_granted());
        clock.advance(1);
        assert!(check!(w(5, 1000, 1), LEFT, "a shorter window than the retention").is_granted());
        clock.advance(1);
        assert!(check!(w(5, 3000, 1), DECIDED, "the retention's own window").is_granted());

        // A bucket with places (its figures kept) and a settled bucket.
        let place = AcquireRequest::new("caller", vec![window("p", 5, 1000).with_concurrent(2)]).unwrap();
        assert!(check!(place, NEITHER, "a place").is_granted());
        clock.advance(1);
        let p = AcquireRequest::new("caller", vec![window("p", 5, 1000)]).unwrap();
        assert!(check!(p, LEFT, "a bucket with places").is_granted());
        let settled = AcquireRequest::new("caller", vec![window("s", 5, 1000)]).unwrap();
        let permit = engine.acquire(&settled.clone().with_permit(), clock.now(), &mut effects);
        let Decision::Granted { permit: Some(engine_permit), .. } = permit else { panic!("{permit:?}") };
        let Decision::Granted { permit: Some(pg_permit), .. } =
            pg.acquire(settled.clone().with_permit()).await.unwrap().decision
        else {
            panic!("a permit")
        };
        let costs = vec![redb_limiter::request::Cost::new("s", 3)];
        engine.settle(&engine_permit.to_string(), &costs, clock.now(), &mut effects).unwrap();
        pg.settle(redb_limiter::request::SettleRequest::new(pg_permit.to_string(), costs).unwrap()).await.unwrap();
        clock.advance(1);
        assert!(check!(settled.clone(), LEFT, "a settled bucket").is_granted());
        clock.advance(1);
        let more = AcquireRequest::new("caller", vec![window("s", 5, 1000).with_cost(2)]).unwrap();
        assert!(!check!(more, LEFT, "a settled bucket, full").is_granted());

        // A row changed since the statement read it: the write half decides again through
        // acquire(), here with a version the row never had.
        clock.advance(1);
        let client = plain_client(&url).await;
        let schema = pg.schema().to_owned();
        let row = client
            .query_one(&format!("SELECT total, last_seq FROM \"{schema}\".buckets WHERE key = 'w'"), &[])
            .await
            .unwrap();
        let (total, seq): (i64, i64) = (row.get(0), row.get(1));
        let now = clock.now().0 as i64;
        let write = format!(
            "SELECT \"{schema}\"._acquire_window(true, 'w', 5, 3000, 1, 'caller', $1, 0, 600000, 600000, \
             '1'::xid, $1, $2, $3)"
        );
        let reply: serde_json::Value = client.query_one(&write, &[&now, &total, &seq]).await.unwrap().get(0);
        let want = engine.acquire(&w(5, 3000, 1), clock.now(), &mut effects);
        assert_eq!(want, Decision::Granted { at: clock.now(), permit: None });
        assert_eq!(reply["granted"], true, "{reply}");
        assert_eq!(reply["at"], now, "{reply}");
        clock.advance(1);
        check!(w(5, 3000, 1), DECIDED, "after the changed row");
    });
}

/// An acquire of two or more window limits is one statement too (`sql/acquire_windows.sql`):
/// it decides a grant and a refusal (the latest retryAt; on a tie the throttle, else the first
/// limit in request order) itself, and leaves the rest to `acquire()` in the same call (a new
/// bucket, a retryAt past a window's first row, a row changed since it was read).
#[test]
fn several_window_acquires_are_decided_by_one_statement_or_left_to_acquire() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "windows", clock.clone()).await;
        let mut engine = Engine::new(EngineConfig::default());
        let mut effects = Vec::new();
        // Each step against the engine, and which path decided it.
        macro_rules! check {
            ($req:expr, $path:expr, $what:expr) => {
                check_path(&pg, &mut engine, &clock, $req, $path, $what).await
            };
        }
        let pair = |a: (&str, u64), b: (&str, u64), cost: u64| {
            AcquireRequest::new(
                "caller",
                vec![window(a.0, a.1, 1000).with_cost(cost), window(b.0, b.1, 1000).with_cost(cost)],
            )
            .unwrap()
        };

        assert!(check!(pair(("a", 4), ("b", 4), 1), LEFT, "new buckets").is_granted());
        clock.advance(10);
        assert!(check!(pair(("a", 4), ("b", 4), 1), DECIDED, "a grant").is_granted());
        clock.advance(10);
        assert!(check!(pair(("b", 4), ("a", 4), 2), DECIDED, "a grant that fills both").is_granted());
        clock.advance(10);
        assert!(!check!(pair(("b", 4), ("a", 4), 1), DECIDED, "both full: the first in order").is_granted());
        assert!(!check!(pair(("b", 4), ("a", 4), 4), LEFT, "a retryAt past the first rows").is_granted());
        let c = AcquireRequest::new("caller", vec![window("c", 9, 1000)]).unwrap();
        assert!(check!(c, LEFT, "a new bucket").is_granted());
        clock.advance(10);
        assert!(!check!(pair(("c", 9), ("a", 4), 1), DECIDED, "one full").is_granted());
        // a's first grant leaves at T0 + 1000: the later one stands, a tie is the throttle's.
        for until in [T0.plus(999), T0.plus(1000), T0.plus(1001)] {
            engine.throttle("caller", until, clock.now(), &mut effects);
            pg.throttle(ThrottleRequest::new("caller", until, clock.now()).unwrap()).await.unwrap();
            assert!(!check!(pair(("c", 9), ("a", 4), 1), DECIDED, "throttled and full").is_granted());
        }
        clock.set(T0.plus(1010));
        assert!(check!(pair(("a", 4), ("b", 4), 1), DECIDED, "the first grants left").is_granted());

        // A row changed since the statement read it: the write half decides again through
        // acquire(), here with a version the rows never had.
        clock.advance(10);
        let client = plain_client(&url).await;
        let schema = pg.schema().to_owned();
        let now = clock.now().0 as i64;
        let write = format!(
            "SELECT \"{schema}\"._acquire_windows(true, ARRAY['a', 'b'], ARRAY[4, 4]::bigint[], \
             ARRAY[1000, 1000]::bigint[], ARRAY[1, 1]::bigint[], 'caller', $1, 0, 600000, \
             ARRAY[600000, 600000]::bigint[], ARRAY[1, 2]::bigint[], ARRAY['1', '1']::xid[], $1, \
             ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[])"
        );
        let reply: serde_json::Value = client.query_one(&write, &[&now]).await.unwrap().get(0);
        let want = engine.acquire(&pair(("a", 4), ("b", 4), 1), clock.now(), &mut effects);
        assert_eq!(want, Decision::Granted { at: clock.now(), permit: None });
        assert_eq!(reply["granted"], true, "{reply}");
        assert_eq!(reply["at"], now, "{reply}");
        clock.advance(1);
        check!(pair(("a", 4), ("b", 4), 1), DECIDED, "after the changed rows");
    });
}

/// The pool hands out the session used last: after a burst opened every session of the pool,
/// requests one at a time keep to one of them (first in, first out would cycle through all).
#[test]
fn requests_one_at_a_time_keep_to_the_session_used_last() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let pg = fresh_with(&url, "lifo", Arc::new(FakeClock::new(T0)), 0).await;
        let client = plain_client(&url).await;
        burst(&pg, 32).await;
        let since: std::time::SystemTime = client.query_one("SELECT clock_timestamp()", &[]).await.unwrap().get(0);
        let opened = sessions(&client, &pg, None).await;
        assert!(opened >= 2, "the burst opened {opened} sessions; the test needs two or more");
        for _ in 0..20 {
            burst(&pg, 1).await;
        }
        let used = sessions(&client, &pg, Some(since)).await;
        assert_eq!(used, 1, "20 requests one at a time used {used} of the pool's {opened} sessions");
    });
}

/// Sessions of the pool unused for longer than `idle_session` are closed (the sweeper's tick
/// does it), and the pool opens one again when a request needs it; sessions used within it stay.
#[test]
fn sessions_unused_past_idle_session_are_closed_and_reopened_when_needed() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let client = plain_client(&url).await;
        // The default: a minute. A session used a moment ago stays.
        let kept = fresh_with(&url, "idle_kept", Arc::new(FakeClock::new(T0)), 0).await;
        burst(&kept, 16).await;
        let opened = sessions(&client, &kept, None).await;
        assert!(opened >= 2, "the burst opened {opened} sessions; the test needs two or more");
        assert_eq!(kept.close_idle_sessions(), 0);
        assert_eq!(sessions(&client, &kept, None).await, opened);
        // Zero: every session not in use has been unused too long.
        let closing = fresh_options(&url, "idle_closed", Arc::new(FakeClock::new(T0)), |options| {
            options.batchers = 0;
            options.idle_session = std::time::Duration::ZERO;
        })
        .await;
        burst(&closing, 16).await;
        let opened = sessions(&client, &closing, None).await;
        assert!(opened >= 2, "the burst opened {opened} sessions; the test needs two or more");
        assert_eq!(i64::try_from(closing.close_idle_sessions()).unwrap(), opened);
        // A closed session's backend leaves pg_stat_activity once it has read the close.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while sessions(&client, &closing, None).await > 0 {
            assert!(std::time::Instant::now() < deadline, "the closed sessions' backends are still there");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        burst(&closing, 1).await;
        assert_eq!(sessions(&client, &closing, None).await, 1, "one session opened again");
    });
}

#[test]
fn an_unknown_schema_version_is_refused_naming_it() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "version", clock).await;
        let schema = pg.schema().to_owned();
        let client = plain_client(&url).await;
        client.batch_execute(&format!("UPDATE \"{schema}\".meta SET version = 99")).await.unwrap();
        let mut options = PgOptions::new(&url);
        options.schema = schema.clone();
        let err = PgLimiter::connect(options).await.expect_err("version 99 is not ours").to_string();
        assert!(err.contains("99") && err.contains(&schema), "{err}");
    });
}

#[test]
fn a_database_that_cannot_be_reached_is_unavailable_and_grants_nothing() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "down", clock).await;
        // Every connection of the pool is terminated from the server side.
        let client = plain_client(&url).await;
        let name = format!("redb-limiter/{}", pg.schema());
        let killed = client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .await
            .unwrap();
        assert!(killed.get::<_, i64>(0) >= 1, "the pool's connection was there to terminate");
        let req = AcquireRequest::new("caller", vec![window("w", 1, 60_000)]).unwrap();
        // The pool hands out a dead connection at most once; then it reconnects by itself.
        let mut answers = Vec::new();
        for _ in 0..3 {
            answers.push(pg.acquire(req.clone()).await);
        }
        assert!(answers.iter().all(|a| matches!(a, Ok(_) | Err(LimiterError::Unavailable(_)))), "{answers:?}");
        let granted = answers.iter().filter(|a| matches!(a, Ok(a) if a.decision.is_granted())).count();
        assert_eq!(granted, 1, "recovered, and exactly one grant in a window of one: {answers:?}");
    });
}

/// Rows in each table of a limiter's schema, read apart from the limiter.
async fn totals(url: &str, schema: &str) -> serde_json::Value {
    let client = plain_client(url).await;
    client.query_one(&format!("SELECT \"{schema}\".totals()"), &[]).await.unwrap().get(0)
}

/// A backlog of lapsed rows larger than one sweep batch goes in one sweeper tick: the tables
/// hold nothing once every bucket is idle, however many keys were ever seen.
#[test]
fn one_sweeper_tick_drains_a_backlog_larger_than_a_batch() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = Arc::new(fresh(&url, "backlog", clock.clone()).await);
        let schema = pg.schema().to_owned();
        // 40 requests of 64 one-second windows (the most a request names) and a place each:
        // 2,560 buckets and grants, 40 permits and places.
        let requests = 40;
        let per_request = redb_limiter::request::MAX_LIMITS - 1;
        for r in 0..requests {
            let mut limits: Vec<Limit> =
                (0..per_request).map(|i| window(&format!("k{r:02}.{i:02}"), 1, 1000)).collect();
            limits.push(Limit::concurrent(format!("place{r:02}"), 1).with_hold_ms(500));
            let req = AcquireRequest::new("caller", limits).unwrap();
            assert!(pg.acquire(req).await.unwrap().decision.is_granted());
        }
        let buckets = (requests * (per_request + 1)) as i64;
        let before = totals(&url, &schema).await;
        assert_eq!(before["buckets"], buckets, "{before}");
        assert_eq!(before["permits"], requests as i64, "{before}");
        assert!(buckets > i64::from(redb_limiter_postgres::SWEEP_BATCH) * 2, "the backlog is over two batches");

        // Past every retention and the sweep's margin: everything is idle.
        clock.advance(1000 + 60_000 + 1);
        let first = pg.sweep(redb_limiter_postgres::SWEEP_BATCH).await.unwrap();
        assert!(first > 0);
        let after_one = totals(&url, &schema).await;
        assert!(after_one["buckets"].as_i64().unwrap() > i64::from(redb_limiter_postgres::SWEEP_BATCH), "{after_one}");

        // The sweeper's first tick runs at once; the next is an hour away, so the rest must go
        // in that one tick.
        pg.spawn_sweeper(std::time::Duration::from_secs(3600));
        let empty =
            serde_json::json!({"buckets": 0, "grants": 0, "permits": 0, "places": 0, "throttles": 0, "requests": 0});
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let now = totals(&url, &schema).await;
            if now == empty {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "one tick left {now}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // The tables start afresh: a key seen before is a new bucket.
        let again = AcquireRequest::new("caller", vec![window("k00.00", 1, 1000)]).unwrap();
        assert!(pg.acquire(again).await.unwrap().decision.is_granted());
        assert_eq!(totals(&url, &schema).await["buckets"], 1);
    });
}

/// `/health` costs no round trip while calls succeed: it answers from the latest call's
/// outcome for a second, a failure included (until a later success), then probes once.
#[test]
fn health_answers_from_the_latest_call_and_probes_at_most_once_a_second() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let mut options = PgOptions::new(&url);
        options.schema = format!("t_{}_health", std::process::id());
        options.pool_size = 2;
        options.statement_timeout = std::time::Duration::from_millis(1000);
        options.clock = Some(clock.clone());
        let pg = Arc::new(PgLimiter::connect(options).await.unwrap());
        let fresh_ms = redb_limiter_postgres::HEALTH_FRESH_MS;

        // Nothing called yet: one probe, then a flood answered from it.
        for _ in 0..100 {
            pg.health().await.unwrap();
        }
        assert_eq!(pg.health_probes(), 1);
        clock.advance(fresh_ms - 1);
        pg.health().await.unwrap();
        assert_eq!(pg.health_probes(), 1, "still fresh");
        clock.advance(1);
        pg.health().await.unwrap();
        assert_eq!(pg.health_probes(), 2, "stale: probed again");

        // A request that succeeds keeps it fresh without a probe.
        let req = AcquireRequest::new("caller", vec![window("w", 100, 60_000)]).unwrap();
        clock.advance(fresh_ms * 5);
        assert!(pg.acquire(req.clone()).await.unwrap().decision.is_granted());
        pg.health().await.unwrap();
        assert_eq!(pg.health_probes(), 2);

        // A request that fails for its own sake (the bucket's row locked past the lock timeout)
        // leaves /health up: the database answered.
        let client = plain_client(&url).await;
        client.batch_execute("BEGIN").await.unwrap();
        let locked = format!("SELECT 1 FROM \"{}\".buckets WHERE key = 'w' FOR UPDATE", pg.schema());
        assert_eq!(client.query(&locked, &[]).await.unwrap().len(), 1);
        let err = pg.acquire(req.clone()).await.expect_err("the row is locked");
        assert!(matches!(err, LimiterError::Unavailable(_)), "{err:?}");
        pg.health().await.expect("a request's own failure is not the database's");
        assert_eq!(pg.health_probes(), 2);

        // A request whose session the database cuts (as when it shuts down) makes /health
        // unavailable at once, with the reason, and without a probe.
        let waiting = tokio::spawn({
            let (pg, req) = (Arc::clone(&pg), req.clone());
            async move { pg.acquire(req).await }
        });
        let app = format!("redb-limiter/{}", pg.schema());
        let cut = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                   WHERE application_name = $1 AND wait_event_type = 'Lock'";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while client.query(cut, &[&app]).await.unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "the acquire never waited for the lock");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let err = waiting.await.unwrap().expect_err("its session was cut");
        assert!(matches!(err, LimiterError::Unavailable(_)), "{err:?}");
        match pg.health().await {
            Err(LimiterError::Unavailable(why)) => assert!(why.contains("PostgreSQL"), "{why}"),
            other => panic!("a cut session makes health unavailable: {other:?}"),
        }
        client.batch_execute("COMMIT").await.unwrap();
        assert!(pg.health().await.is_err(), "the failure stands until a later success or a second");
        assert_eq!(pg.health_probes(), 2);
        // A second later the probe finds the database answering.
        clock.advance(fresh_ms);
        pg.health().await.unwrap();
        assert_eq!(pg.health_probes(), 3);
        // And a success ends it too.
        assert!(pg.acquire(req).await.unwrap().decision.is_granted());
        pg.health().await.unwrap();
        assert_eq!(pg.health_probes(), 3);
    });
}

/// One limit of a generated request: bucket (0..4), window (calls, perMs), cost, concurrent.
type LimitSpec = (u8, Option<(u64, u64)>, u64, Option<u64>);

/// One operation of the differential test.
#[derive(Debug, Clone)]
enum Op {
    /// Caller (0..3) and its limits.
    Acquire(u8, Vec<LimitSpec>),
    /// Release the n-th grant that got a permit (modulo their count).
    Release(usize),
    Throttle(u8, u64),
    Advance(u64),
    /// Acquires sent at once, each naming buckets no other one of them names (so they decide
    /// the same in any order, and the engine can decide them one after another): the one-window
    /// ones among them are decided in batches.
    Round(Vec<(u8, Vec<LimitSpec>)>),
    /// An acquire with `queue` (and `report` when the flag is set) and perhaps `maxWaitMs`: a
    /// refusal files a ticket when its own instant lies within the horizon.
    Queue(u8, Vec<LimitSpec>, bool, Option<u64>),
    /// Throttles the caller of the n-th ticket held for this long: its ticket yields meanwhile.
    ThrottleHeld(usize, u64),
    /// A mix prone to backfill: a queued request taking all of one bucket's window (caller,
    /// bucket, window), then small requests (caller, cost, queue) in the same window.
    Backfill(u8, u8, (u64, u64), Vec<(u8, u64, bool)>),
    /// Ask again with the n-th ticket held (modulo their count), its request as filed.
    Again(usize),
    /// `release {ticket}` of the n-th ticket held.
    Leave(usize),
    /// A peek with the n-th ticket held.
    PeekLine(usize),
    /// The n-th ticket held presented by another caller: a bad request naming `ticket` while it
    /// lives, on both sides.
    Misbound(usize),
    /// An acquire named by a new id (section 16), with `queue`, `permit` and `report` as
    /// flagged.
    Named(u8, Vec<LimitSpec>, (bool, bool, bool)),
    /// The n-th ticket held asked again under a new id: a grant is remembered, a renewal not.
    NamedAgain(usize),
    /// The n-th named acquire asked again with its id (with `report` as flagged): answered as
    /// the first time while its id is remembered.
    Retry(usize, bool),
    /// The n-th named id with other params (a cost one higher on its first limit): a bad request
    /// naming `id` while it is remembered.
    Reuse(usize),
    /// `release {id}` of the n-th named id, with costs (that cost on every window limit of its
    /// request) when given, and a key that is no window limit of it when flagged.
    Undo(usize, Option<u64>, bool),
    /// `release {id}` of an id never seen, then its acquire arriving: a bad request naming `id`.
    UndoUnseen(u8, Vec<LimitSpec>),
    /// A peek with the n-th named id: as it would be answered again while remembered.
    PeekNamed(usize),
    /// A wait's look at the n-th ticket held (section 15): ready, gone, or not yet and until
    /// when; one not yet is held as a wait of that many ms holds it.
    Ready(usize, u64),
    /// An outcome (section 14) on the n-th permit granted: `limited` when flagged, carried by a
    /// release (0), a settle of no cost change (1) or a throttle of its caller key (2).
    Outcome(usize, u8, bool),
}

/// A limit of a generated request: (window, cost, concurrent).
fn limit_spec() -> impl Strategy<Value = (Option<(u64, u64)>, u64, Option<u64>)> {
    (
        prop::option::weighted(0.8, (1u64..5, prop::sample::select(vec![100u64, 250, 1000, 3000]))),
        0u64..7,
        prop::option::weighted(0.3, 1u64..3),
    )
        .prop_filter("a limit needs a window or a concurrency", |(w, _, c)| w.is_some() || c.is_some())
}

/// The buckets of a generated request beside the token buckets (section 13): keys 0 and 1 (each
/// a window and/or concurrency) and [`TOKEN_BUCKETS`] (see [`request`]).
fn with_tokens() -> impl Strategy<Value = u8> {
    prop::sample::select(vec![0u8, 1, TOKEN_BUCKETS, TOKEN_BUCKETS + 1])
}

fn op() -> impl Strategy<Value = Op> {
    let limit = limit_spec();
    prop_oneof![
        6 => (0u8..3, prop::collection::btree_map(0u8..4, limit, 1..3))
            .prop_map(|(caller, m)| Op::Acquire(caller, m.into_iter().map(|(b, (w, cost, c))| (b, w, cost, c)).collect())),
        3 => (0u8..3, prop::collection::btree_map(with_tokens(), limit_spec(), 1..3))
            .prop_map(|(caller, m)| Op::Acquire(caller, m.into_iter().map(|(b, (w, cost, c))| (b, w, cost, c)).collect())),
        1 => any::<usize>().prop_map(Op::Release),
        1 => (0u8..3, 0u64..1500).prop_map(|(c, d)| Op::Throttle(c, d)),
        4 => prop::sample::select(vec![0u64, 1, 50, 99, 100, 101, 249, 250, 500, 999, 1000, 2500]).prop_map(Op::Advance),
    ]
}

/// The operations of the line (section 12) beside every other one.
fn line_op() -> impl Strategy<Value = Op> {
    let limit = limit_spec();
    prop_oneof![
        6 => op(),
        4 => (
            0u8..3,
            prop::collection::btree_map(0u8..4, limit, 1..3),
            any::<bool>(),
            prop::option::weighted(0.3, prop::sample::select(vec![1u64, 50, 100, 250, 1000, 2500, 5000])),
        )
            .prop_map(|(caller, m, report, max_wait)| {
                Op::Queue(caller, m.into_iter().map(|(b, (w, cost, c))| (b, w, cost, c)).collect(), report, max_wait)
            }),
        2 => (0u8..3, prop::collection::btree_map(with_tokens(), limit_spec(), 1..3), any::<bool>())
            .prop_map(|(caller, m, report)| {
                Op::Queue(caller, m.into_iter().map(|(b, (w, cost, c))| (b, w, cost, c)).collect(), report, None)
            }),
        1 => (any::<usize>(), prop::sample::select(vec![1u64, 100, 500, 1500])).prop_map(|(n, ms)| Op::ThrottleHeld(n, ms)),
        1 => (
            0u8..3,
            prop::sample::select(vec![0u8, 1, 2, 3, TOKEN_BUCKETS, TOKEN_BUCKETS + 1]),
            (2u64..6, prop::sample::select(vec![100u64, 250, 1000, 3000])),
            prop::collection::vec((0u8..3, 0u64..3, any::<bool>()), 1..5),
        )
            .prop_map(|(caller, bucket, w, small)| Op::Backfill(caller, bucket, w, small)),
        4 => any::<usize>().prop_map(Op::Again),
        1 => any::<usize>().prop_map(Op::Leave),
        1 => any::<usize>().prop_map(Op::PeekLine),
        1 => any::<usize>().prop_map(Op::Misbound),
        2 => (any::<usize>(), prop::sample::select(vec![1_000u64, 25_000])).prop_map(|(n, ms)| Op::Ready(n, ms)),
    ]
}

/// Outcomes (section 14) beside the line's operations and every other one.
fn ceiling_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => line_op(),
        3 => (any::<usize>(), 0u8..3, prop::bool::weighted(0.4)).prop_map(|(n, how, limited)| Op::Outcome(n, how, limited)),
    ]
}

/// The operations of request ids (section 16) beside those of the line, and steps of a minute
/// or so, so that ids are forgotten too.
fn id_op() -> impl Strategy<Value = Op> {
    let named = || {
        let buckets = prop::sample::select(vec![0u8, 1, 2, 3, TOKEN_BUCKETS, TOKEN_BUCKETS + 1]);
        (0u8..3, prop::collection::btree_map(buckets, limit_spec(), 1..3)).prop_map(|(caller, m)| {
            (caller, m.into_iter().map(|(b, (w, cost, c))| (b, w, cost, c)).collect::<Vec<LimitSpec>>())
        })
    };
    prop_oneof![
        8 => line_op(),
        5 => (named(), (any::<bool>(), any::<bool>(), any::<bool>()))
            .prop_map(|((caller, limits), flags)| Op::Named(caller, limits, flags)),
        2 => any::<usize>().prop_map(Op::NamedAgain),
        5 => (any::<usize>(), any::<bool>()).prop_map(|(n, report)| Op::Retry(n, report)),
        1 => any::<usize>().prop_map(Op::Reuse),
        3 => (any::<usize>(), prop::option::of(0u64..4), prop::bool::weighted(0.15))
            .prop_map(|(n, cost, bad)| Op::Undo(n, cost, bad)),
        1 => named().prop_map(|(caller, limits)| Op::UndoUnseen(caller, limits)),
        1 => any::<usize>().prop_map(Op::PeekNamed),
        1 => prop::sample::select(vec![30_000u64, 59_999, 60_000]).prop_map(Op::Advance),
    ]
}

/// The id of the `k`-th named acquire of a run: some hold U+0000 and U+0001, which the database
/// stores escaped.
fn id_name(k: usize) -> String {
    if k % 4 == 3 { format!("\0id\u{1}{k}") } else { format!("id{k}") }
}

/// The engine's and the database's answers to an acquire named by an id, compared: the same
/// bad request (the message too), or the same answer ([`compare_line`]).
fn compare_named(
    i: usize,
    req: &AcquireRequest,
    want: Result<redb_limiter::engine::LineAnswer, redb_limiter::BadRequest>,
    want_figures: Option<Vec<redb_limiter::engine::Figures>>,
    got: Result<redb_limiter::limiter::Acquired, LimiterError>,
    held: (&mut Vec<(AcquireRequest, String, String)>, Option<usize>),
    permits: &mut Vec<(String, String)>,
) -> Result<(), TestCaseError> {
    match (want, got) {
        (Err(w), Err(LimiterError::BadRequest(g))) => prop_assert_eq!(w.0, g.0, "op {}: {:?}", i, req),
        (Ok(w), Ok(g)) => compare_line(i, req, &w, want_figures, &g, held, permits)?,
        (w, g) => prop_assert!(false, "op {}: {:?}: engine {:?}, database {:?}", i, req, w, g),
    }
    Ok(())
}

/// The engine's and the database's answers to an acquire in the line, compared: the decision,
/// the ticket a refusal names (each side's own id; its lapse, the tickets ahead, now) and the
/// figures of a report (with `queued`). The tickets held are updated to those named (a new one
/// pushed, or the one at `slot` replaced).
fn compare_line(
    i: usize,
    req: &AcquireRequest,
    want: &redb_limiter::engine::LineAnswer,
    want_figures: Option<Vec<redb_limiter::engine::Figures>>,
    got: &redb_limiter::limiter::Acquired,
    (held, slot): (&mut Vec<(AcquireRequest, String, String)>, Option<usize>),
    permits: &mut Vec<(String, String)>,
) -> Result<(), TestCaseError> {
    compare(i, req, Millis(0), &want.decision, &got.decision, permits)?;
    let note = |t: &redb_limiter::engine::TicketNote| (t.lapse_at, t.ahead, t.now);
    prop_assert_eq!(want.ticket.as_ref().map(note), got.ticket.as_ref().map(note), "op {}: ticket of {:?}", i, req);
    prop_assert_eq!(want.no_ticket, got.no_ticket, "op {}: noTicket of {:?}", i, req);
    let figures = got.report.as_ref().map(|r| r.limits.clone());
    prop_assert_eq!(want_figures, figures, "op {}: figures of {:?}", i, req);
    if let (Some(w), Some(g)) = (&want.ticket, &got.ticket) {
        let mut base = req.clone();
        (base.ticket, base.report, base.queue, base.id) = (None, false, false, None);
        match slot {
            Some(n) => held[n] = (base, w.id.to_string(), g.id.to_string()),
            None => held.push((base, w.id.to_string(), g.id.to_string())),
        }
    }
    Ok(())
}

/// The keys a differential run names its buckets (by index) and callers with.
struct Names {
    buckets: Vec<String>,
    callers: Vec<String>,
    /// Section 14: the odd buckets and the token buckets adapt (every request then asks for a
    /// permit, so that outcomes have one to count on).
    adapt: bool,
}

impl Names {
    /// `b0`, `b1`, ... and `caller0`, `caller1`, ...
    fn plain() -> Names {
        Names {
            buckets: (0..18).map(|b| format!("b{b}")).collect(),
            callers: (0..3).map(|c| format!("caller{c}")).collect(),
            adapt: false,
        }
    }

    /// [`Names::plain`] with adaptive ceilings (section 14) on the odd buckets and the token
    /// buckets.
    fn adapting() -> Names {
        Names { adapt: true, ..Names::plain() }
    }

    /// Keys as hostile as the wire allows: U+0000 (alone, doubled, inside), U+0001 and U+0002
    /// (the escaping's own characters), quotes, backslashes, SQL and LIKE syntax, a key of the
    /// full 512 bytes, one character of every plane of Unicode, the last code point, a BOM, an
    /// emoji, a composed and a decomposed é.
    fn hostile() -> Names {
        let planes: String = (0..=16u32).map(|plane| char::from_u32((plane << 16) | 0x100).unwrap()).collect();
        let buckets = [
            "\0".to_owned(),
            "\0\0".to_owned(),
            "a\0b".to_owned(),
            "\u{1}".to_owned(),
            "\u{1}\u{2}".to_owned(),
            "'".to_owned(),
            "\"; DROP TABLE buckets; --".to_owned(),
            "\\".to_owned(),
            "\\0".to_owned(),
            "%_*".to_owned(),
            format!("{}\0", "z".repeat(511)),
            planes,
            "\u{10FFFF}".to_owned(),
            "\u{FEFF}x".to_owned(),
            "\u{1F600}".to_owned(),
            " ".to_owned(),
            "\u{e9}".to_owned(),
            "e\u{301}".to_owned(),
        ];
        assert_eq!(buckets[10].len(), 512);
        Names {
            buckets: buckets.to_vec(),
            callers: vec!["\0".to_owned(), "caller\u{1}".to_owned(), "'\\\"".to_owned()],
            adapt: false,
        }
    }
}

/// The first of the two buckets a differential run names as token buckets (section 13), each
/// always with the same figures (a window spec generated for it is not read): the first 3 per
/// second with a burst of 5, starting full; the second 1 per 250 ms with a burst of 2, starting
/// empty. No round names them (a round names buckets below 16).
const TOKEN_BUCKETS: u8 = 16;

fn request(names: &Names, caller: u8, limits: &[LimitSpec]) -> AcquireRequest {
    let limits = limits
        .iter()
        .map(|&(bucket, w, cost, conc)| {
            let key = &names.buckets[usize::from(bucket)];
            let mut limit = match w {
                _ if bucket == TOKEN_BUCKETS => Limit::bucket(key, 3, 1000).with_burst(5),
                _ if bucket == TOKEN_BUCKETS + 1 => Limit::bucket(key, 1, 250).with_burst(2).with_initial(0),
                Some((calls, per_ms)) => Limit::window(key, calls, per_ms),
                None => Limit::concurrent(key, conc.unwrap_or(1)),
            };
            if let (true, Some(c)) = (w.is_some() || bucket >= TOKEN_BUCKETS, conc) {
                limit = limit.with_concurrent(c);
            }
            if let (true, Some(start)) =
                (names.adapt && (bucket % 2 == 1 || bucket >= TOKEN_BUCKETS), limit.nominal_calls())
            {
                // A ceiling between 1 and two above the request's own figure, halved on a cut.
                limit = limit.with_adapt(Adapt { min: 1, max: start + 2, increase: 1, keep_pct: 50 });
            }
            limit.with_cost(cost).with_hold_ms(700)
        })
        .collect();
    let req = AcquireRequest::new(names.callers[usize::from(caller)].clone(), limits).unwrap();
    if names.adapt { req.with_permit() } else { req }
}

/// A round of acquires naming disjoint buckets: request `j` names buckets `2j` (and `2j + 1`
/// for a second limit), mostly one window each.
fn round() -> impl Strategy<Value = Op> {
    let one = (0u8..3, limit_spec(), prop::option::weighted(0.25, limit_spec()));
    prop::collection::vec(one, 1..9).prop_map(|reqs| {
        Op::Round(
            reqs.into_iter()
                .enumerate()
                .map(|(j, (caller, (w, cost, c), second))| {
                    let bucket = u8::try_from(2 * j).unwrap();
                    let mut limits = vec![(bucket, w, cost, c)];
                    if let Some((w, cost, c)) = second {
                        limits.push((bucket + 1, w, cost, c));
                    }
                    (caller, limits)
                })
                .collect(),
        )
    })
}

/// Awaits every future, polling them in order (so the first takes a free batch turn and the
/// others queue behind it), and answers their outputs in order.
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none()
                && let std::task::Poll::Ready(out) = future.as_mut().poll(cx)
            {
                *output = Some(out);
            }
        }
        if outputs.iter().all(Option::is_some) { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
    })
    .await;
    outputs.into_iter().map(|o| o.expect("ready")).collect()
}

/// What the differential tests saw: one-window acquires decided by the one statement and left
/// by it to acquire(); batch statements sent, requests they decided and left alone.
#[derive(Default, Debug)]
struct Seen {
    window: (u64, u64),
    batches: (u64, u64, u64),
    /// Outcomes after which a ceiling was kept, and those after which one had been cut and one
    /// had grown (section 14).
    ceilings: (u64, u64, u64),
}

/// The engine's and the database's answers to one acquire, compared.
fn compare(
    i: usize,
    req: &AcquireRequest,
    now: Millis,
    want: &Decision,
    got: &Decision,
    permits: &mut Vec<(String, String)>,
) -> Result<(), TestCaseError> {
    match (want, got) {
        (Decision::Granted { at: a, permit: pa }, Decision::Granted { at: b, permit: pb }) => {
            prop_assert_eq!(a, b, "op {}: {:?}", i, req);
            prop_assert_eq!(pa.is_some(), pb.is_some(), "op {}: {:?}", i, req);
            if let (Some(pa), Some(pb)) = (pa, pb) {
                permits.push((pa.to_string(), pb.to_string()));
            }
        }
        _ => prop_assert_eq!(want, got, "op {}: {:?} at +{}", i, req, now.since(T0)),
    }
    Ok(())
}

/// Runs `ops` on a fresh schema and on the engine at the same instants, comparing every answer
/// (a permit's id aside: each side issues its own); adds what it saw to `seen`.
async fn differential(
    url: &str,
    (names, horizon): (&Names, u64),
    ops: &[Op],
    seen: &std::sync::Mutex<Seen>,
) -> Result<(), TestCaseError> {
    let clock = Arc::new(FakeClock::new(T0));
    let pg = fresh_options(url, "diff", clock.clone(), |options| {
        options.batchers = 1;
        options.line_horizon_ms = horizon;
    })
    .await;
    let mut engine = Engine::new(EngineConfig { line_horizon_ms: horizon, ..EngineConfig::default() });
    let mut effects = Vec::new();
    // (engine permit, database permit) of each grant that got one.
    let mut permits: Vec<(String, String)> = Vec::new();
    // (request as filed, engine ticket, database ticket) of each ticket named so far.
    let mut held: Vec<(AcquireRequest, String, String)> = Vec::new();
    // Every (engine ticket, database ticket) pair named so far.
    let mut seen_ids: Vec<(String, String)> = Vec::new();
    // (engine request, database request) of each acquire named by an id so far (section 16).
    let mut named: Vec<(AcquireRequest, AcquireRequest)> = Vec::new();
    let fail = |e: LimiterError| TestCaseError::fail(e.to_string());
    for (i, op) in ops.iter().enumerate() {
        let now = clock.now();
        match op {
            Op::Acquire(caller, limits) => {
                let req = request(names, *caller, limits);
                let want = engine.acquire(&req, now, &mut effects);
                let got = pg.acquire(req.clone()).await.map_err(|e| TestCaseError::fail(e.to_string()))?.decision;
                compare(i, &req, now, &want, &got, &mut permits)?;
            }
            Op::Round(reqs) => {
                let reqs: Vec<AcquireRequest> = reqs.iter().map(|(c, limits)| request(names, *c, limits)).collect();
                let got = join_all(reqs.iter().map(|r| pg.acquire(r.clone())).collect()).await;
                for (req, got) in reqs.iter().zip(got) {
                    let want = engine.acquire(req, now, &mut effects);
                    let got = got.map_err(|e| TestCaseError::fail(e.to_string()))?.decision;
                    compare(i, req, now, &want, &got, &mut permits)?;
                }
            }
            Op::Release(n) if !permits.is_empty() => {
                let (e, p) = &permits[n % permits.len()];
                let want = engine.release(e, now, &mut effects);
                let got = pg
                    .release(ReleaseRequest::new(p.clone()).unwrap())
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(want, got, "op {}: release", i);
            }
            Op::Release(_) => {}
            Op::Outcome(n, how, limited) if !permits.is_empty() => {
                let (e, p) = &permits[n % permits.len()];
                let signal = if *limited { Signal::Limited } else { Signal::Clean };
                let fail = |e: LimiterError| TestCaseError::fail(e.to_string());
                match how {
                    0 => {
                        let want = engine.release_with_outcome(e, &[], Some(signal), now, &mut effects).unwrap();
                        let got = pg.release(ReleaseRequest::new(p.clone()).unwrap().with_outcome(signal)).await;
                        prop_assert_eq!(want, got.map_err(fail)?, "op {}: release with an outcome", i);
                    }
                    1 => {
                        // A cost of 1 on bucket 1 (adapting): a bad request on both sides, and
                        // nothing counted, when the grant has no window there.
                        let costs = vec![Cost { key: names.buckets[1].clone(), cost: 1 }];
                        let want = engine.settle_with_outcome(e, &costs, Some(signal), now, &mut effects);
                        let got = pg.settle(SettleRequest::new(p.clone(), costs).unwrap().with_outcome(signal)).await;
                        prop_assert_eq!(
                            want.as_ref().map(|s| s.is_settled()).map_err(|e| e.to_string()).is_ok(),
                            got.is_ok(),
                            "op {}: settle with an outcome: {:?} / {:?}",
                            i,
                            want,
                            got
                        );
                        if let (Ok(want), Ok(got)) = (want, got) {
                            prop_assert_eq!(want.is_settled(), got, "op {}: settle with an outcome", i);
                        }
                    }
                    _ => {
                        let key = names.callers[0].clone();
                        let until = now.plus(50);
                        engine.signal(e, Signal::Limited, now, &mut effects);
                        let want = engine.throttle(&key, until, now, &mut effects);
                        let got = pg
                            .throttle(ThrottleRequest::new(key, until, now).unwrap().with_permit(p.clone()).unwrap())
                            .await
                            .map_err(fail)?;
                        prop_assert_eq!(want, got, "op {}: throttle with a permit", i);
                    }
                }
                // The ceilings kept are the engine's.
                let kept = pg.state("", 100).await.map_err(fail)?.view.ceilings;
                prop_assert_eq!(&engine.ceilings(""), &kept, "op {}: the ceilings kept", i);
                let mut seen = seen.lock().unwrap();
                seen.ceilings.0 += u64::from(!kept.is_empty());
                seen.ceilings.1 += u64::from(kept.iter().any(|(_, c)| c.cuts > 0));
                seen.ceilings.2 += u64::from(kept.iter().any(|(_, c)| c.grown_at.is_some()));
            }
            Op::Outcome(..) => {}
            Op::Queue(caller, limits, report, max_wait) => {
                let mut req = request(names, *caller, limits).with_queue();
                if *report {
                    req = req.with_report();
                }
                if let Some(ms) = max_wait {
                    req = req.with_max_wait_ms(*ms).unwrap();
                }
                let want = engine.acquire_in_line(&req, now, &mut effects).expect("no ticket to bind");
                let figures = report.then(|| engine.figures(&req, now));
                let got = pg.acquire(req.clone()).await.map_err(fail)?;
                compare_line(i, &req, &want, figures, &got, (&mut held, None), &mut permits)?;
            }
            Op::Again(n) if !held.is_empty() => {
                let slot = n % held.len();
                let (base, e, p) = held[slot].clone();
                let want = engine.acquire_in_line(&base.clone().with_ticket(e).unwrap(), now, &mut effects);
                let want = want.map_err(|e| TestCaseError::fail(e.to_string()))?;
                let req = base.with_ticket(p).unwrap();
                let got = pg.acquire(req.clone()).await.map_err(fail)?;
                compare_line(i, &req, &want, None, &got, (&mut held, Some(slot)), &mut permits)?;
            }
            Op::Leave(n) if !held.is_empty() => {
                let (_, e, p) = &held[n % held.len()];
                let want = engine.leave(e, now, &mut effects);
                let got = pg.leave(redb_limiter::request::LeaveRequest { ticket: p.clone() }).await.map_err(fail)?;
                prop_assert_eq!(want, got, "op {}: leave", i);
            }
            Op::Ready(n, hold_ms) if !held.is_empty() => {
                let (_, e, p) = &held[n % held.len()];
                let want = engine.readiness(e, now);
                if matches!(want, redb_limiter::engine::Readiness::NotYet { .. }) {
                    engine.hold_ticket(e, now.plus(*hold_ms), now, &mut effects);
                }
                let got = pg.readiness(p, Some(*hold_ms)).await.map_err(fail)?;
                prop_assert_eq!(want, got, "op {}: readiness of ticket {}", i, e);
            }
            Op::PeekLine(n) if !held.is_empty() => {
                let (base, e, p) = &held[n % held.len()];
                let ereq = base.clone().with_ticket(e.clone()).unwrap();
                let want = engine.peek_in_line(&ereq, now).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let figures = engine.figures(&ereq, now);
                let got = pg.peek(base.clone().with_ticket(p.clone()).unwrap()).await.map_err(fail)?;
                prop_assert_eq!(want, got.refusal, "op {}: peek with a ticket", i);
                prop_assert_eq!(figures, got.report.limits, "op {}: peek's figures", i);
                prop_assert_eq!(now, got.report.now);
            }
            Op::Misbound(n) if !held.is_empty() => {
                let (base, e, p) = &held[n % held.len()];
                let mut other = base.clone();
                other.key = format!("{}-other", other.key);
                let want = engine.acquire_in_line(&other.clone().with_ticket(e.clone()).unwrap(), now, &mut effects);
                let got = pg.acquire(other.clone().with_ticket(p.clone()).unwrap()).await;
                match (want, got) {
                    (Err(w), Err(LimiterError::BadRequest(g))) => prop_assert_eq!(w.0, g.0, "op {}", i),
                    (Ok(w), Ok(g)) => compare_line(i, &other, &w, None, &g, (&mut held, None), &mut permits)?,
                    (w, g) => prop_assert!(false, "op {}: engine {:?}, database {:?}", i, w, g),
                }
            }
            Op::ThrottleHeld(n, ahead) if !held.is_empty() => {
                let key = held[n % held.len()].0.key.clone();
                let until = now.plus(*ahead);
                let want = engine.throttle(&key, until, now, &mut effects);
                let got = pg.throttle(ThrottleRequest::new(key, until, now).unwrap()).await.map_err(fail)?;
                prop_assert_eq!(want, got, "op {}: throttle of a ticket's caller", i);
            }
            Op::Backfill(caller, bucket, (calls, per_ms), small) => {
                let large = request(names, *caller, &[(*bucket, Some((*calls, *per_ms)), *calls, None)]).with_queue();
                let want = engine.acquire_in_line(&large, now, &mut effects).expect("no ticket to bind");
                let got = pg.acquire(large.clone()).await.map_err(fail)?;
                compare_line(i, &large, &want, None, &got, (&mut held, None), &mut permits)?;
                for (c, cost, queue) in small {
                    let mut req = request(names, *c, &[(*bucket, Some((*calls, *per_ms)), *cost, None)]);
                    if *queue {
                        req = req.with_queue();
                    }
                    let want = engine.acquire_in_line(&req, now, &mut effects).expect("no ticket to bind");
                    let got = pg.acquire(req.clone()).await.map_err(fail)?;
                    compare_line(i, &req, &want, None, &got, (&mut held, None), &mut permits)?;
                }
            }
            Op::Named(caller, limits, (queue, permit, report)) => {
                let mut req = request(names, *caller, limits).with_id(id_name(named.len())).unwrap();
                (req.queue, req.permit, req.report) = (*queue, *permit, *report);
                let want = engine.acquire_in_line(&req, now, &mut effects);
                let figures = want.is_ok().then(|| req.report.then(|| engine.figures(&req, now))).flatten();
                let got = pg.acquire(req.clone()).await;
                compare_named(i, &req, want, figures, got, (&mut held, None), &mut permits)?;
                named.push((req.clone(), req));
            }
            Op::NamedAgain(n) if !held.is_empty() => {
                let slot = n % held.len();
                let (base, e, p) = held[slot].clone();
                let id = id_name(named.len());
                let ereq = base.clone().with_ticket(e).unwrap().with_id(id.clone()).unwrap();
                let preq = base.with_ticket(p).unwrap().with_id(id).unwrap();
                let want = engine.acquire_in_line(&ereq, now, &mut effects);
                let got = pg.acquire(preq.clone()).await;
                compare_named(i, &preq, want, None, got, (&mut held, Some(slot)), &mut permits)?;
                named.push((ereq, preq));
            }
            Op::Retry(n, report) if !named.is_empty() => {
                let (mut ereq, mut preq) = named[n % named.len()].clone();
                (ereq.report, preq.report) = (*report, *report);
                let want = engine.acquire_in_line(&ereq, now, &mut effects);
                let figures = want.is_ok().then(|| ereq.report.then(|| engine.figures(&ereq, now))).flatten();
                let got = pg.acquire(preq.clone()).await;
                compare_named(i, &preq, want, figures, got, (&mut held, None), &mut permits)?;
            }
            Op::Reuse(n) if !named.is_empty() => {
                let (mut ereq, mut preq) = named[n % named.len()].clone();
                ereq.limits[0].cost += 1;
                preq.limits[0].cost += 1;
                let want = engine.acquire_in_line(&ereq, now, &mut effects);
                let figures = want.is_ok().then(|| ereq.report.then(|| engine.figures(&ereq, now))).flatten();
                let got = pg.acquire(preq.clone()).await;
                compare_named(i, &preq, want, figures, got, (&mut held, None), &mut permits)?;
            }
            Op::Undo(n, cost, bad) if !named.is_empty() => {
                let (ereq, _) = &named[n % named.len()];
                let id = ereq.id.clone().expect("named");
                let mut costs: Vec<redb_limiter::request::Cost> = match cost {
                    Some(c) => ereq
                        .limits
                        .iter()
                        .filter(|l| l.window.is_some() || l.bucket.is_some())
                        .map(|l| redb_limiter::request::Cost::new(&l.key, *c))
                        .collect(),
                    None => Vec::new(),
                };
                if *bad {
                    costs.push(redb_limiter::request::Cost::new("elsewhere", 0));
                }
                let want = engine.undo(&id, &costs, now, &mut effects);
                let undo = if costs.is_empty() {
                    redb_limiter::request::UndoRequest::new(id)
                } else {
                    redb_limiter::request::UndoRequest::with_costs(id, costs)
                };
                let got = pg.undo(undo.unwrap()).await;
                match (want, got) {
                    (Err(w), Err(LimiterError::BadRequest(g))) => prop_assert_eq!(w.0, g.0, "op {}: undo", i),
                    (Ok(w), Ok(g)) => prop_assert_eq!(w, g, "op {}: undo", i),
                    (w, g) => prop_assert!(false, "op {}: undo: engine {:?}, database {:?}", i, w, g),
                }
            }
            Op::UndoUnseen(caller, limits) => {
                let req = request(names, *caller, limits).with_id(id_name(named.len())).unwrap();
                let id = req.id.clone().expect("named");
                let want = engine.undo(&id, &[], now, &mut effects);
                let got = pg.undo(redb_limiter::request::UndoRequest::new(id).unwrap()).await;
                prop_assert_eq!(want, got.map_err(|e| redb_limiter::BadRequest(e.to_string())), "op {}: undo", i);
                let want = engine.acquire_in_line(&req, now, &mut effects);
                let figures = want.is_ok().then(|| req.report.then(|| engine.figures(&req, now))).flatten();
                let got = pg.acquire(req.clone()).await;
                compare_named(i, &req, want, figures, got, (&mut held, None), &mut permits)?;
                named.push((req.clone(), req));
            }
            Op::PeekNamed(n) if !named.is_empty() => {
                let (ereq, preq) = &named[n % named.len()];
                let want = engine.peek_in_line(ereq, now);
                let got = pg.peek(preq.clone()).await;
                match (want, got) {
                    (Err(w), Err(LimiterError::BadRequest(g))) => prop_assert_eq!(w.0, g.0, "op {}: peek", i),
                    (Ok(w), Ok(g)) => {
                        prop_assert_eq!(w, g.refusal, "op {}: peek with an id", i);
                        prop_assert_eq!(engine.figures(ereq, now), g.report.limits, "op {}: peek's figures", i);
                    }
                    (w, g) => prop_assert!(false, "op {}: peek: engine {:?}, database {:?}", i, w, g),
                }
            }
            Op::Again(_)
            | Op::Leave(_)
            | Op::PeekLine(_)
            | Op::Misbound(_)
            | Op::ThrottleHeld(..)
            | Op::NamedAgain(_)
            | Op::Retry(..)
            | Op::Reuse(_)
            | Op::Undo(..)
            | Op::PeekNamed(_)
            | Op::Ready(..) => {}
            Op::Throttle(caller, ahead) => {
                let key = names.callers[usize::from(*caller)].clone();
                let until = now.plus(*ahead);
                let want = engine.throttle(&key, until, now, &mut effects);
                let got = pg
                    .throttle(ThrottleRequest::new(key, until, now).unwrap())
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(want, got, "op {}: throttle", i);
            }
            Op::Advance(ms) => {
                clock.advance(*ms);
                engine.sweep(clock.now(), &mut effects);
            }
        }
        seen_ids.extend(held.iter().map(|(_, e, p)| (e.clone(), p.clone())));
        effects.clear();
    }
    // The state lists the same buckets (in key order), window use, places, token levels and throttles, for
    // every prefix a key of the run starts with (and none).
    let now = clock.now();
    let ids: std::collections::HashMap<String, String> = seen_ids.into_iter().collect();
    let mut prefixes = vec![String::new()];
    prefixes.extend(names.buckets.iter().chain(&names.callers).map(|k| k.chars().take(1).collect::<String>()));
    for prefix in &prefixes {
        let want = engine.view(now, prefix);
        let got = pg.state(prefix, 1000).await.map_err(|e| TestCaseError::fail(e.to_string()))?.view;
        let buckets = |v: &redb_limiter::engine::StateView, engine_side: bool| {
            v.buckets
                .iter()
                .map(|b| {
                    // The first ticket as the database named it (each side issues its own ids).
                    let first = b.first_ticket.map(|t| {
                        let t = t.to_string();
                        if engine_side { ids.get(&t).cloned().unwrap_or(t) } else { t }
                    });
                    (b.key.clone(), b.window_used, b.places_held, b.queued, b.first_ticket_at, first, b.level)
                })
                .collect::<Vec<_>>()
        };
        prop_assert_eq!(buckets(&want, true), buckets(&got, false), "state of prefix {:?}", prefix);
        let throttles = |v: &redb_limiter::engine::StateView| {
            v.throttles.iter().map(|t| (t.key.clone(), t.until)).collect::<Vec<_>>()
        };
        prop_assert_eq!(throttles(&want), throttles(&got), "throttles of prefix {:?}", prefix);
    }
    let mut seen = seen.lock().unwrap();
    let (decided, left) = pg.window_paths();
    seen.window.0 += decided;
    seen.window.1 += left;
    let (batches, in_batch, alone) = pg.batch_paths();
    seen.batches.0 += batches;
    seen.batches.1 += in_batch;
    seen.batches.2 += alone;
    Ok(())
}

/// Runs `cases` generated operation lists (`REDB_LIMITER_PG_CASES` overrides) through
/// [`differential`]; what they saw.
fn run_differential(url: &str, names: &Names, cases: u32, ops: impl Strategy<Value = Vec<Op>>) -> Seen {
    run_differential_with(url, (names, redb_limiter::engine::DEFAULT_LINE_HORIZON_MS), cases, ops)
}

/// [`run_differential`] with the line's horizon given (section 12.9), the same on both sides.
fn run_differential_with(
    url: &str,
    (names, horizon): (&Names, u64),
    cases: u32,
    ops: impl Strategy<Value = Vec<Op>>,
) -> Seen {
    let rt = runtime();
    let cases = std::env::var("REDB_LIMITER_PG_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases, ..ProptestConfig::default() });
    let seen = std::sync::Mutex::new(Seen::default());
    runner.run(&ops, |ops| rt.block_on(differential(url, (names, horizon), &ops, &seen))).unwrap();
    seen.into_inner().unwrap()
}

/// The same operations at the same instants on the engine and on the database: every answer
/// must be the same (a permit's id aside: each side issues its own).
#[test]
fn the_database_decides_as_the_engine_does() {
    let Some(url) = database_url() else { return };
    let seen = run_differential(&url, &Names::plain(), 200, prop::collection::vec(op(), 1..60));
    // One-window acquires decided by the one statement, and left by it to acquire(): both
    // halves are compared with the engine.
    let (decided, left) = seen.window;
    assert!(decided > 0 && left > 0, "decided by the statement {decided}, left to acquire() {left}");
}

/// Adaptive ceilings (section 14) on the database and on the engine at the same instants: odd
/// buckets and token buckets adapt, outcomes carried by releases, settles and throttles cut and
/// grow them, and every decision (judged with the ceiling, in the line too), figure (`ceiling`)
/// and ceiling kept must be the engine's.
#[test]
fn the_database_keeps_ceilings_as_the_engine_does() {
    let Some(url) = database_url() else { return };
    let seen = run_differential(&url, &Names::adapting(), 150, prop::collection::vec(ceiling_op(), 1..70));
    let (kept, cut, grown) = seen.ceilings;
    assert!(kept > 0 && cut > 0 && grown > 0, "ceilings kept {kept}, cut {cut}, grown {grown}");
}

/// A case the differential found: a ceiling grown to its max whose bucket's only ticket lapsed
/// (not yet swept from the database) is forgotten with the bucket, as the engine forgets it.
#[test]
fn a_ceiling_is_forgotten_with_a_bucket_whose_line_lapsed() {
    let Some(url) = database_url() else { return };
    let ops = [
        Op::Backfill(0, 1, (2, 100), vec![(0, 0, false), (0, 0, false), (0, 1, true)]),
        Op::Outcome(279_365_985_828_660_370, 0, false),
        Op::Advance(100),
        Op::Outcome(852_257_645_768_173_646, 0, false),
        Op::Advance(2500),
        Op::Outcome(0, 0, false),
    ];
    let seen = std::sync::Mutex::new(Seen::default());
    let names = Names::adapting();
    runtime()
        .block_on(differential(&url, (&names, redb_limiter::engine::DEFAULT_LINE_HORIZON_MS), &ops, &seen))
        .unwrap();
    assert_eq!(seen.into_inner().unwrap().ceilings.0, 3, "a ceiling kept after each outcome");
}

/// The line (section 12) on the database and on the engine at the same instants: tickets filed
/// by queueing refusals, asked again (granted when first in line and fitting, renewed when not),
/// left, lapsed, peeked with, presented by another caller, beside plain acquires that rule Q
/// holds back; every decision, ticket note (lapse, ahead, now), figure (`queued`) and the state
/// (`queued`, `firstTicketAt`, buckets with only a line) must be the engine's.
#[test]
fn the_database_keeps_the_line_as_the_engine_does() {
    let Some(url) = database_url() else { return };
    run_differential(&url, &Names::plain(), 150, prop::collection::vec(line_op(), 1..60));
}

/// Request ids (section 16) on the database and on the engine at the same instants, beside the
/// line: acquires named by ids (granted with or without a permit, filing tickets, refused),
/// retried (with and without a report), reused with other params, undone with and without costs
/// (some naming a key that was no window of the grant), released before they arrive, peeked,
/// and forgotten after their minute: every answer, bad request and figure must be the engine's.
#[test]
fn the_database_keeps_request_ids_as_the_engine_does() {
    let Some(url) = database_url() else { return };
    run_differential(&url, &Names::plain(), 150, prop::collection::vec(id_op(), 1..60));
}

/// The same under a short server horizon (section 12.9), so that requests beyond it file no
/// ticket (`noTicket: horizon`) and tickets lapse at their deadline, beside `maxWaitMs`,
/// throttled tickets that yield and large tickets that small requests backfill around.
#[test]
fn the_database_keeps_the_line_within_a_short_horizon_as_the_engine_does() {
    let Some(url) = database_url() else { return };
    run_differential_with(&url, (&Names::plain(), 1500), 150, prop::collection::vec(line_op(), 1..60));
}

/// The same with rounds of acquires sent at once, so that the one-window ones among them are
/// decided in batch statements (`sql/acquire_window_batch.sql`): every answer must still be the
/// engine's, for the requests a batch decided and for those it left to go alone.
#[test]
fn the_database_decides_as_the_engine_does_in_concurrent_batches() {
    let Some(url) = database_url() else { return };
    let ops = prop_oneof![3 => op(), 2 => round()];
    let seen = run_differential(&url, &Names::plain(), 120, prop::collection::vec(ops, 1..40));
    eprintln!("{seen:?}");
    let (batches, decided, alone) = seen.batches;
    assert!(batches > 0 && decided > 0 && alone > 0, "{seen:?}");
}

/// The same with hostile keys (see [`Names::hostile`]) for buckets and callers, alone and in
/// batches: every key the file serves is served alike, and the state lists them as the engine
/// does, in key order, under every prefix.
#[test]
fn hostile_keys_are_decided_as_the_engine_decides_them() {
    let Some(url) = database_url() else { return };
    let ops = prop_oneof![3 => op(), 2 => round()];
    let seen = run_differential(&url, &Names::hostile(), 80, prop::collection::vec(ops, 1..40));
    eprintln!("{seen:?}");
    let (decided, left) = seen.window;
    let (batches, in_batch, _) = seen.batches;
    assert!(decided > 0 && left > 0 && batches > 0 && in_batch > 0, "{seen:?}");
}

/// Permit strings `release` and `settle` accept in the file are accepted here, U+0000 among
/// them (an unknown permit: false, as the engine answers); a permit's window keys with U+0000
/// and U+0001 settle and release as any others; a settle naming a key that was not a window of
/// the grant is refused with the engine's message; throttle and lift take any caller key.
#[test]
fn hostile_permit_strings_and_keys_release_settle_throttle_and_lift_as_the_engine_does() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        use redb_limiter::request::{Cost, LiftRequest, SettleRequest};
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "permits", clock.clone()).await;
        let mut engine = Engine::new(EngineConfig::default());
        let mut effects = Vec::new();
        for permit in ["p-\0", "\0", "\u{1}", "p-\u{1}x", "'\\\"", &"\0".repeat(128)] {
            let release = ReleaseRequest::new(permit).unwrap();
            assert_eq!(pg.release(release).await.unwrap(), engine.release(permit, T0, &mut effects), "{permit:?}");
            let settle = SettleRequest::new(permit, vec![Cost::new("\0", 1)]).unwrap();
            assert!(!pg.settle(settle).await.unwrap(), "{permit:?}");
        }

        let (w, c) = ("w\0\u{1}", "c\0");
        let req = AcquireRequest::new("\0caller", vec![window(w, 10, 60_000).with_cost(5), Limit::concurrent(c, 1)])
            .unwrap()
            .with_permit();
        let Decision::Granted { permit: Some(permit), .. } = pg.acquire(req.clone()).await.unwrap().decision else {
            panic!("granted with a permit")
        };
        let refused = pg.acquire(req.clone()).await.unwrap().decision;
        assert!(
            matches!(&refused, Decision::Refused { reason: Reason::Concurrency, limit, .. } if limit == c),
            "{refused:?}"
        );
        let wrong = SettleRequest::new(permit.to_string(), vec![Cost::new(w, 1), Cost::new(c, 1)]).unwrap();
        match pg.settle(wrong).await {
            Err(LimiterError::BadRequest(e)) => {
                assert_eq!(e.0, "costs[1].key is not a window limit of the permit's grant");
            }
            other => panic!("{other:?}"),
        }
        let settle = SettleRequest::new(permit.to_string(), vec![Cost::new(w, 2)]).unwrap();
        assert!(pg.settle(settle).await.unwrap());
        let figures = pg.peek(req.clone()).await.unwrap().report.limits;
        assert_eq!((figures[0].key.as_str(), figures[0].window), (w, Some((2, 8))));
        assert_eq!((figures[1].key.as_str(), figures[1].places), (c, Some((1, 0))));
        let state = pg.state("c", 1000).await.unwrap();
        assert_eq!(state.view.buckets.iter().map(|b| b.key.as_str()).collect::<Vec<_>>(), [c]);
        assert_eq!(state.view.permits.len(), 1);
        assert_eq!(state.view.permits[0].places, vec![(c.to_owned(), T0.plus(600_000))]);
        assert!(pg.release(ReleaseRequest::new(permit.to_string()).unwrap()).await.unwrap());
        assert!(pg.acquire(req).await.unwrap().decision.is_granted(), "the place was freed");

        for caller in ["\0", "\u{1}", "a\0\u{1}\u{2}"] {
            let until = T0.plus(1000);
            assert_eq!(pg.throttle(ThrottleRequest::new(caller, until, T0).unwrap()).await.unwrap(), Some(until));
            let req = AcquireRequest::new(caller, vec![window("free", 100, 1000)]).unwrap();
            assert_eq!(
                pg.acquire(req).await.unwrap().decision,
                Decision::Refused { retry_at: until, reason: Reason::Throttle, limit: caller.into() }
            );
        }
        let throttled: Vec<String> =
            pg.state("", 1000).await.unwrap().view.throttles.into_iter().map(|t| t.key).collect();
        assert_eq!(throttled, ["\0", "\u{1}", "a\0\u{1}\u{2}"], "in byte order");
        assert!(pg.lift(LiftRequest::new("\0").unwrap()).await.unwrap());
        assert!(!pg.lift(LiftRequest::new("\0").unwrap()).await.unwrap());
        assert!(pg.lift(LiftRequest::new("\u{1}").unwrap()).await.unwrap());
    });
}

/// `/metrics` counts the line in PostgreSQL mode as the file does (12.7): tickets filed,
/// granted (with the wait from filing to grant), left, and lapsed, whether found lapsed when
/// asked with or swept.
#[test]
fn the_line_is_counted_in_the_metrics() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "linemetrics", clock.clone()).await;
        let req = |caller: &str| AcquireRequest::new(caller, vec![window("w", 1, 1000)]).unwrap();
        let ticket_of = |acquired: &redb_limiter::limiter::Acquired| acquired.ticket.expect("a ticket").id.to_string();
        assert!(pg.acquire(req("filler")).await.unwrap().decision.is_granted());
        let a = ticket_of(&pg.acquire(req("a").with_queue()).await.unwrap());
        let b = ticket_of(&pg.acquire(req("b").with_queue()).await.unwrap());
        assert!(pg.leave(redb_limiter::request::LeaveRequest::new(b).unwrap()).await.unwrap());
        clock.advance(1000);
        let again = pg.acquire(req("a").with_ticket(a.clone()).unwrap()).await.unwrap();
        assert!(again.decision.is_granted(), "{again:?}");
        // Renewed, not filed again: asked with its ticket while it waits.
        let c = ticket_of(&pg.acquire(req("c").with_queue()).await.unwrap());
        assert_eq!(ticket_of(&pg.acquire(req("c").with_ticket(c.clone()).unwrap()).await.unwrap()), c);
        // Lapsed by the time it is asked with (retryAt 2000 + grace 2000): ends, then decides anew.
        clock.advance(4000);
        assert!(pg.acquire(req("c").with_ticket(c).unwrap()).await.unwrap().decision.is_granted());
        let d = pg.acquire(req("d").with_queue()).await.unwrap();
        assert!(d.ticket.is_some(), "{d:?}");
        // Swept at its lapse instant (retryAt 6000 + grace 2000), and counted then: a lapse is
        // counted when the sweeper that ticks every second finds it, not a margin later.
        clock.advance(3000);
        assert!(pg.sweep(1000).await.unwrap() > 0);
        let text = pg.metrics().encode();
        for (event, n) in [("filed", 4), ("granted", 1), ("left", 1), ("lapsed", 2)] {
            let line = format!("redb_limiter_tickets_total{{event=\"{event}\"}} {n}\n");
            assert!(text.contains(&line), "{line:?} in\n{text}");
        }
        assert!(text.contains("redb_limiter_ticket_wait_seconds_sum 1.0\n"), "{text}");
        assert!(text.contains("redb_limiter_ticket_wait_seconds_count 1\n"), "{text}");
    });
}

/// A ticket held back by a bucket of its own (its own window full for ten of the shared one's)
/// holds no room in the shared line until a window before the instant it was told (12.9),
/// whichever server it was filed through: the other server grants the shared window in full
/// meanwhile, and the ticket is still granted at its instant.
#[test]
fn a_ticket_waiting_on_a_bucket_of_its_own_holds_no_shared_line_across_servers() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let (a, b) = two_servers(&url, "ownline", &clock).await;
        let refused = |at: u64, limit: &str| Decision::Refused {
            retry_at: T0.plus(at),
            reason: Reason::Rate,
            limit: limit.into(),
        };
        let shared = AcquireRequest::new("b", vec![window("shared", 2, 1000)]).unwrap();
        let large =
            AcquireRequest::new("l", vec![window("shared", 2, 1000).with_cost(2), window("own", 1, 10_000)]).unwrap();
        assert!(a.acquire(large.clone()).await.unwrap().decision.is_granted());
        clock.set(T0.plus(100));
        let filed = a.acquire(large.clone().with_queue()).await.unwrap();
        assert_eq!(filed.decision, refused(10_000, "own"));
        let again = large.with_ticket(filed.ticket.expect("filed").id.to_string()).unwrap();
        // Every shared window meanwhile serves the others in full through the other server.
        for s in 1..=9 {
            clock.set(T0.plus(s * 1000));
            for _ in 0..2 {
                assert!(b.acquire(shared.clone()).await.unwrap().decision.is_granted(), "at {s} s");
            }
        }
        assert_eq!(b.peek(shared.clone()).await.unwrap().report.limits[0].queued, Some(1));
        // A window before its instant it holds its room there: the others wait behind it.
        clock.set(T0.plus(9500));
        assert_eq!(b.acquire(shared.clone()).await.unwrap().decision, refused(11_000, "shared"));
        clock.set(T0.plus(10_000));
        assert!(b.acquire(again).await.unwrap().decision.is_granted());
        assert_eq!(a.acquire(shared).await.unwrap().decision, refused(11_000, "shared"));
    });
}

/// Two servers on one schema keep one line per bucket: a ticket filed through one is first in
/// line for the other, which holds back every request behind it that would delay it (one at a
/// time, and sent at once so that its one-window ones go through the batch statement) until
/// its own reserved instant behind it, is granted there at its retryAt, and a ticket filed
/// behind it through the second is granted through the first at its own.
#[test]
fn two_servers_on_one_schema_keep_one_line_per_bucket() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let a = fresh(&url, "line2", clock.clone()).await;
        let mut options = PgOptions::new(&url);
        options.schema = a.schema().to_owned();
        options.pool_size = 4;
        options.clock = Some(clock.clone());
        let b = PgLimiter::connect(options).await.unwrap();
        let w = |cost: u64| vec![window("w", 10, 1000).with_cost(cost)];
        assert!(a.acquire(AcquireRequest::new("filler", w(8)).unwrap()).await.unwrap().decision.is_granted());
        clock.advance(1);
        // The whole window, from when the filler leaves it.
        let large = AcquireRequest::new("large", w(10)).unwrap();
        let first = a.acquire(large.clone().with_queue()).await.unwrap();
        let refused = |at: u64| Decision::Refused { retry_at: T0.plus(at), reason: Reason::Rate, limit: "w".into() };
        assert_eq!(first.decision, refused(1000));
        let first = first.ticket.expect("filed through the first server");
        assert_eq!(first.ahead, 0);

        // Through the second server, a cost that fits now but would still count at the first
        // ticket's reserved instant waits behind it, alone and at once: until its own instant
        // behind that ticket.
        let small = AcquireRequest::new("small", w(1)).unwrap();
        let held_back = refused(2000);
        assert_eq!(b.acquire(small.clone()).await.unwrap().decision, held_back);
        let at_once = join_all((0..6).map(|_| b.acquire(small.clone())).collect()).await;
        assert!(at_once.iter().all(|r| r.as_ref().unwrap().decision == held_back), "{at_once:?}");
        let peeked = b.peek(small.clone()).await.unwrap();
        assert_eq!(peeked.refusal.map(|r| r.retry_at), Some(T0.plus(2000)));
        assert_eq!(peeked.report.limits[0].queued, Some(1));
        let second = b.acquire(small.clone().with_queue()).await.unwrap();
        assert_eq!(second.decision, held_back);
        let second = second.ticket.expect("filed through the second server");
        assert_eq!(second.ahead, 1, "behind the first server's ticket");
        let state = a.state("w", 10).await.unwrap();
        assert_eq!(state.view.buckets[0].first_ticket, Some(first.id), "/state names the first ticket");

        // At its retryAt the first ticket is granted through the second server; the second
        // ticket, asked first, waits for it, then for its own instant.
        clock.set(T0.plus(1000));
        let early = b.acquire(small.clone().with_ticket(second.id.to_string()).unwrap()).await.unwrap();
        assert_eq!(early.decision, held_back);
        let granted = b.acquire(large.with_ticket(first.id.to_string()).unwrap()).await.unwrap();
        assert_eq!(granted.decision, Decision::Granted { at: T0.plus(1000), permit: None });
        let again = a.acquire(small.clone().with_ticket(second.id.to_string()).unwrap()).await.unwrap();
        assert_eq!(again.decision, held_back);
        assert_eq!(again.ticket.map(|t| (t.id, t.ahead)), Some((second.id, 0)));
        clock.set(T0.plus(2000));
        let granted = a.acquire(small.clone().with_ticket(second.id.to_string()).unwrap()).await.unwrap();
        assert_eq!(granted.decision, Decision::Granted { at: T0.plus(2000), permit: None });
        // The line is empty on both: a plain request is decided as before.
        for pg in [&a, &b] {
            let peeked = pg.peek(small.clone()).await.unwrap();
            assert_eq!(peeked.report.limits[0].queued, None, "no line, no figure");
        }
        assert!(a.state("", 10).await.unwrap().view.buckets.iter().all(|b| b.queued == 0));

        // A ticket nobody asks again lapses at retryAt + graceMs: it holds nobody back from
        // then, and the sweep at that instant ends it (and its place in each line) and counts
        // its lapse.
        let filed = b.acquire(large_again(&small).with_queue()).await.unwrap().ticket.expect("filed");
        assert_eq!(b.peek(small.clone()).await.unwrap().report.limits[0].queued, Some(1));
        clock.set(filed.lapse_at);
        assert_eq!(b.peek(small.clone()).await.unwrap().report.limits[0].queued, None, "lapsed at lapseAt");
        let client = plain_client(&url).await;
        let rows = |table: &'static str| {
            let (client, schema) = (&client, a.schema().to_owned());
            async move {
                client
                    .query_one(&format!("SELECT count(*) FROM \"{schema}\".{table}"), &[])
                    .await
                    .unwrap()
                    .get::<_, i64>(0)
            }
        };
        assert_eq!((rows("tickets").await, rows("line").await), (1, 1));
        a.sweep(1000).await.unwrap();
        assert_eq!((rows("tickets").await, rows("line").await), (0, 0), "ended at its lapse");
        assert!(a.metrics().encode().contains("redb_limiter_tickets_total{event=\"lapsed\"} 1\n"));
    });
}

/// A request of cost 10 in the window `small` names: refused while anything counts there.
fn large_again(small: &AcquireRequest) -> AcquireRequest {
    AcquireRequest::new("large", vec![small.limits[0].clone().with_cost(10)]).unwrap()
}

/// The schema script of the previous release (format version 1), as it was released.
const SCHEMA_V1: &str = include_str!("fixtures/schema-v1.sql");

/// A schema an earlier release wrote (format version 1, its own script and functions, keys
/// with U+0001 in buckets, permits' windows and throttles) opens with this release: migrated
/// to this version once, step by step (a second server finds it done), every grant, place,
/// settle, throttle and key still served as before, U+0000 keys served beside them, and its
/// buckets keep a line.
#[test]
fn a_schema_written_by_the_previous_release_is_migrated_and_still_serves() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let schema = format!("t_{}_v1", std::process::id());
        let client = plain_client(&url).await;
        client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await.unwrap();
        client.batch_execute(&SCHEMA_V1.replace("__SCHEMA__", &format!("\"{schema}\""))).await.unwrap();
        let at = |ms: u64| i64::try_from(T0.plus(ms).0).unwrap();
        let call = |sql: String| {
            let client = &client;
            async move { client.query_one(&sql, &[]).await.unwrap().get::<_, serde_json::Value>(0) }
        };
        // The previous release's functions write the data: windows (one merged row, one settled
        // bucket), a place with its permit, a throttle.
        let s = format!("\"{schema}\"");
        let granted = |reply: &serde_json::Value| reply["granted"] == serde_json::json!(true);
        for ms in [0, 1, 1] {
            let reply = call(format!(
                "SELECT {s}.acquire('{{\"key\": \"c\\u0001\", \"limits\": [{{\"key\": \"w\\u0001a\", \"calls\": 5, \"perMs\": 60000, \"cost\": 1}}]}}', 'acquire', 250, '', {})",
                at(ms)
            ))
            .await;
            assert!(granted(&reply), "{reply}");
        }
        let reply = call(format!(
            "SELECT {s}.acquire('{{\"key\": \"c\", \"permit\": true, \"limits\": [{{\"key\": \"p\\u0001\", \"concurrent\": 1, \"holdMs\": 600000}}, {{\"key\": \"s\\u0001\", \"calls\": 10, \"perMs\": 60000, \"cost\": 9}}]}}', 'acquire', 250, 'p-00000000000000000000000000000001', {})",
            at(2)
        ))
        .await;
        assert!(granted(&reply) && reply["permit"] == "p-00000000000000000000000000000001", "{reply}");
        let settled = call(format!(
            "SELECT {s}.settle('p-00000000000000000000000000000001', '[{{\"key\": \"s\\u0001\", \"cost\": 4}}]', {})",
            at(3)
        ))
        .await;
        assert_eq!(settled, serde_json::json!({"settled": true}));
        let until: i64 = client
            .query_one(&format!("SELECT {s}.throttle(E'\\x01t', $1, $2)"), &[&at(100_000), &at(3)])
            .await
            .unwrap()
            .get(0);
        assert_eq!(until, at(100_000));
        assert_eq!(schema_version(&client, &s).await, 1);

        // This release opens it: migrated once, twice connected.
        let clock = Arc::new(FakeClock::new(T0.plus(10)));
        let pg = open_existing(&url, &schema, &clock).await.expect("the previous release's schema opens");
        assert_eq!(schema_version(&client, &s).await, redb_limiter_postgres::SCHEMA_VERSION);
        drop(open_existing(&url, &schema, &clock).await.expect("and opens again, already migrated"));

        // Everything it held is served as before.
        let used = |key: &str, calls: u64| {
            let pg = &pg;
            let req = AcquireRequest::new("x", vec![window(key, calls, 60_000)]).unwrap();
            async move { pg.peek(req).await.unwrap().report.limits[0].window.unwrap().0 }
        };
        assert_eq!(used("w\u{1}a", 5).await, 3, "three grants, two merged in one millisecond");
        assert_eq!(used("s\u{1}", 10).await, 4, "the settle stands");
        let req = AcquireRequest::new("c\u{1}", vec![window("w\u{1}a", 5, 60_000).with_cost(3)]).unwrap();
        assert_eq!(
            pg.acquire(req).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(60_000), reason: Reason::Rate, limit: "w\u{1}a".into() }
        );
        let conc = AcquireRequest::new("c", vec![Limit::concurrent("p\u{1}", 1)]).unwrap();
        assert!(matches!(
            pg.acquire(conc.clone()).await.unwrap().decision,
            Decision::Refused { reason: Reason::Concurrency, .. }
        ));
        let throttled = AcquireRequest::new("\u{1}t", vec![window("free", 1, 1000)]).unwrap();
        assert_eq!(
            pg.acquire(throttled).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(100_000), reason: Reason::Throttle, limit: "\u{1}t".into() }
        );
        let state = pg.state("", 1000).await.unwrap();
        let keys: Vec<&str> = state.view.buckets.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["p\u{1}", "s\u{1}", "w\u{1}a"]);
        assert_eq!(state.view.throttles.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), ["\u{1}t"]);
        // The permit settles again (its window's key was migrated) and releases.
        let permit = "p-00000000000000000000000000000001";
        let settle = redb_limiter::request::SettleRequest::new(permit, vec![redb_limiter::request::Cost::new("s\u{1}", 6)]);
        assert!(pg.settle(settle.unwrap()).await.unwrap());
        assert_eq!(used("s\u{1}", 10).await, 6);
        assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
        assert!(pg.acquire(conc).await.unwrap().decision.is_granted(), "the place was freed");
        // And keys the previous release could not hold are served beside them.
        let nul = AcquireRequest::new("\0", vec![window("w\0a", 1, 60_000)]).unwrap();
        assert!(pg.acquire(nul.clone()).await.unwrap().decision.is_granted());
        assert!(!pg.acquire(nul).await.unwrap().decision.is_granted());
        assert_eq!(used("w\u{1}a", 5).await, 3, "a key with U+0000 is not one with U+0001");
        // The migrated buckets keep a line.
        let big = AcquireRequest::new("c\u{1}", vec![window("w\u{1}a", 5, 60_000).with_cost(3)]).unwrap();
        let filed = pg.acquire(big.with_queue()).await.unwrap();
        assert!(filed.ticket.is_some(), "{filed:?}");
        let small = AcquireRequest::new("x", vec![window("w\u{1}a", 5, 60_000)]).unwrap();
        assert_eq!(
            pg.acquire(small).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(60_001), reason: Reason::Rate, limit: "w\u{1}a".into() },
            "it would fit, but the ticket waits first: told when the ticket's 3 and its 1 fit"
        );
    });
}

/// A fresh schema `t_<pid>_<name>` made by `script` (a fixture of an earlier release): its
/// quoted name.
async fn released_schema(client: &tokio_postgres::Client, script: &str, name: &str) -> String {
    let s = format!("\"t_{}_{name}\"", std::process::id());
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS {s} CASCADE")).await.unwrap();
    client.batch_execute(&script.replace("__SCHEMA__", &s)).await.unwrap();
    s
}

/// An acquire through the functions of schema `s` as an earlier release called them, at `ms`
/// after T0, with `permit` as the permit id it hands out.
async fn released_acquire(
    client: &tokio_postgres::Client,
    s: &str,
    body: &str,
    permit: &str,
    ms: u64,
) -> serde_json::Value {
    let at = i64::try_from(T0.plus(ms).0).unwrap();
    let sql = format!("SELECT {s}.acquire($1::text::jsonb, 'acquire', 250, $2, $3)");
    client.query_one(&sql, &[&body, &permit, &at]).await.unwrap().get(0)
}

/// The schema script of the release before this one (format version 2), as it was released.
const SCHEMA_V2: &str = include_str!("fixtures/schema-v2.sql");

/// A schema of format version 2 (its own script and functions wrote a window, a place and a
/// throttle) is migrated to this version once (a second server finds it done): what it held is
/// served as before, and its buckets keep a line that holds plain requests back.
#[test]
fn a_schema_of_version_2_is_migrated_and_keeps_a_line() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let schema = format!("t_{}_v2", std::process::id());
        let client = plain_client(&url).await;
        let s = released_schema(&client, SCHEMA_V2, "v2").await;
        for (ms, body) in [
            (0, r#"{"key": "c", "limits": [{"key": "w", "calls": 3, "perMs": 60000, "cost": 2}]}"#),
            (1, r#"{"key": "c", "limits": [{"key": "p", "concurrent": 1, "holdMs": 600000}]}"#),
        ] {
            let reply = released_acquire(&client, &s, body, "p-00000000000000000000000000000002", ms).await;
            assert_eq!(reply["granted"], serde_json::json!(true), "{reply}");
        }
        assert_eq!(schema_version(&client, &s).await, 2);

        let clock = Arc::new(FakeClock::new(T0.plus(10)));
        let pg = open_existing(&url, &schema, &clock).await.expect("a version 2 schema opens");
        assert_eq!(schema_version(&client, &s).await, redb_limiter_postgres::SCHEMA_VERSION);
        drop(open_existing(&url, &schema, &clock).await.expect("and opens again, already migrated"));

        // What it held is served as before.
        let conc = AcquireRequest::new("c", vec![Limit::concurrent("p", 1)]).unwrap();
        assert!(matches!(
            pg.acquire(conc).await.unwrap().decision,
            Decision::Refused { reason: Reason::Concurrency, .. }
        ));
        // The window holds 2 of 3: a cost of 2 queues; a cost of 1 that fits is granted ahead
        // of it (backfilled: its grant leaves the ticket room at its reserved instant), and a
        // second waits behind the ticket, until its own reserved instant there.
        let big = AcquireRequest::new("c", vec![window("w", 3, 60_000).with_cost(2)]).unwrap();
        let filed = pg.acquire(big.clone().with_queue()).await.unwrap();
        assert_eq!(
            filed.decision,
            Decision::Refused { retry_at: T0.plus(60_000), reason: Reason::Rate, limit: "w".into() }
        );
        let ticket = filed.ticket.expect("a ticket filed");
        assert_eq!((ticket.lapse_at, ticket.ahead, ticket.now), (T0.plus(62_000), 0, T0.plus(10)));
        let small = AcquireRequest::new("d", vec![window("w", 3, 60_000)]).unwrap();
        assert_eq!(
            pg.acquire(small.clone()).await.unwrap().decision,
            Decision::Granted { at: T0.plus(10), permit: None }
        );
        assert_eq!(
            pg.acquire(small.clone()).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(60_010), reason: Reason::Rate, limit: "w".into() }
        );
        let state = pg.state("", 100).await.unwrap();
        let line: Vec<_> = state.view.buckets.iter().map(|b| (b.key.as_str(), b.queued, b.first_ticket_at)).collect();
        assert_eq!(line, [("p", 0, None), ("w", 1, Some(T0.plus(10)))]);
        // At its retryAt the ticket is granted, and the line is empty again.
        clock.advance(59_990);
        let again = pg.acquire(big.with_ticket(ticket.id.to_string()).unwrap()).await.unwrap();
        assert_eq!(again.decision, Decision::Granted { at: T0.plus(60_000), permit: None });
        assert_eq!(pg.state("w", 100).await.unwrap().view.buckets[0].queued, 0);
        clock.advance(10);
        assert!(pg.acquire(small).await.unwrap().decision.is_granted(), "the line is empty: 2 + 1 fit in 3");
    });
}

/// `sql/schema.sql` as the previous release shipped it (format version 3: the line of section
/// 12, before 12.9 bounded it).
const SCHEMA_V3: &str = include_str!("fixtures/schema-v3.sql");

/// A schema of version 3 holding a line (two tickets, one of them in two buckets) is migrated
/// at open: each ticket keeps its place, its id and its bucket's count, and the line is served
/// under 12.9 from there.
#[test]
fn a_schema_of_version_3_with_a_line_is_migrated_and_keeps_it() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let schema = format!("t_{}_v3", std::process::id());
        let client = plain_client(&url).await;
        let s = released_schema(&client, SCHEMA_V3, "v3").await;
        // The bodies as a server of that release sent them (its ticket binds them as sent).
        let one = |caller: &str| AcquireRequest::new(caller, vec![window("w", 1, 60_000)]).unwrap();
        let two = |caller: &str| {
            AcquireRequest::new(caller, vec![window("w", 1, 60_000), Limit::concurrent("p", 2)]).unwrap()
        };
        let mut replies = Vec::new();
        for (ms, req) in [(0, one("c")), (1, one("a").with_queue()), (2, two("b").with_queue())] {
            let body = req.to_json().to_string();
            replies.push(released_acquire(&client, &s, &body, "p-00000000000000000000000000000003", ms).await);
        }
        assert_eq!(replies[0]["granted"], serde_json::json!(true), "{}", replies[0]);
        let ticket = |r: &serde_json::Value| r["ticket"].as_str().expect("a ticket filed").to_owned();
        let (a, b) = (ticket(&replies[1]), ticket(&replies[2]));
        assert_eq!(schema_version(&client, &s).await, 3);

        let clock = Arc::new(FakeClock::new(T0.plus(10)));
        let pg = open_existing(&url, &schema, &clock).await.expect("a version 3 schema opens");
        assert_eq!(schema_version(&client, &s).await, redb_limiter_postgres::SCHEMA_VERSION);
        drop(open_existing(&url, &schema, &clock).await.expect("and opens again, already migrated"));

        // Both tickets kept their places, counted in each bucket's line.
        let state = pg.state("", 100).await.unwrap();
        let line: Vec<_> = state
            .view
            .buckets
            .iter()
            .map(|b| (b.key.as_str(), b.queued, b.first_ticket_at, b.first_ticket.map(|t| t.to_string())))
            .collect();
        assert_eq!(line, [("p", 1, Some(T0.plus(2)), Some(b.clone())), ("w", 2, Some(T0.plus(1)), Some(a.clone()))]);
        // A newcomer waits behind both (their reservations at 60 000 and 120 000).
        let plain = AcquireRequest::new("d", vec![window("w", 1, 60_000)]).unwrap();
        assert_eq!(
            pg.acquire(plain).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(180_000), reason: Reason::Rate, limit: "w".into() }
        );
        // The first is granted at its retryAt; the second is then first, told its own instant.
        clock.set(T0.plus(60_000));
        let ask_a = one("a").with_ticket(a).unwrap();
        assert_eq!(pg.acquire(ask_a).await.unwrap().decision, Decision::Granted { at: T0.plus(60_000), permit: None });
        let ask_b = two("b").with_ticket(b.clone()).unwrap();
        let again = pg.acquire(ask_b).await.unwrap();
        assert_eq!(
            again.decision,
            Decision::Refused { retry_at: T0.plus(120_000), reason: Reason::Rate, limit: "w".into() }
        );
        let note = again.ticket.expect("still in line");
        assert_eq!((note.id.to_string(), note.ahead), (b, 0));
    });
}

/// `sql/schema.sql` as the previous release shipped it (format version 4: the line bounded by
/// 12.9, before request ids).
const SCHEMA_V4: &str = include_str!("fixtures/schema-v4.sql");

/// A schema of version 4 holding state (grants in a window, a permit holding a place, a ticket in
/// line) is migrated at open (once: a second server finds it done) and keeps serving it: the
/// window's count, the place until its permit is released, the ticket with its id and place,
/// granted at its retryAt. Then it keeps request ids: a named grant is answered again and undone.
#[test]
fn a_schema_of_version_4_holding_state_is_migrated_and_keeps_it_then_keeps_ids() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let schema = format!("t_{}_v4", std::process::id());
        let client = plain_client(&url).await;
        let s = released_schema(&client, SCHEMA_V4, "v4").await;
        let permit = "p-00000000000000000000000000000004";
        let (w, place) = (released_window, released_place());
        let ticket = released_window_place_ticket(&client, &s, permit).await;
        assert_eq!(schema_version(&client, &s).await, 4);

        let clock = Arc::new(FakeClock::new(T0.plus(10)));
        let pg = open_existing(&url, &schema, &clock).await.expect("a version 4 schema opens");
        assert_eq!(schema_version(&client, &s).await, redb_limiter_postgres::SCHEMA_VERSION);
        drop(open_existing(&url, &schema, &clock).await.expect("and opens again, already migrated"));

        // What it held is served as before.
        let state = pg.state("", 100).await.unwrap();
        let buckets = bucket_rows(&state.view);
        assert_eq!(buckets, [("p", 0, 1, 0, None), ("w", 2, 0, 1, Some(ticket.clone()))]);
        assert_eq!(state.view.permits.iter().map(|p| p.id.to_string()).collect::<Vec<_>>(), [permit]);
        assert!(matches!(
            pg.acquire(place.clone()).await.unwrap().decision,
            Decision::Refused { reason: Reason::Concurrency, .. }
        ));
        assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
        assert!(pg.acquire(place).await.unwrap().decision.is_granted(), "the place was freed");
        clock.set(T0.plus(60_000));
        let granted = pg.acquire(w("q").with_ticket(ticket).unwrap()).await.unwrap();
        assert_eq!(granted.decision, Decision::Granted { at: T0.plus(60_000), permit: None });

        // And it keeps request ids.
        let r = named("m-1", vec![window("w", 3, 60_000), Limit::concurrent("m", 1)]);
        let first = pg.acquire(r.clone()).await.unwrap().decision;
        assert!(matches!(first, Decision::Granted { permit: Some(_), .. }), "{first:?}");
        clock.advance(1);
        assert_eq!(pg.acquire(r.clone()).await.unwrap().decision, first);
        assert_eq!(figures(&pg, &r).await[0].window, Some((3, 0)), "the ticket's 2 and the named 1, once");
        let undo =
            redb_limiter::request::UndoRequest::with_costs("m-1", vec![redb_limiter::request::Cost::new("w", 0)]);
        assert!(pg.undo(undo.unwrap()).await.unwrap());
        assert_eq!(figures(&pg, &r).await[0].window, Some((2, 1)));
        assert!(bad_request(pg.acquire(r).await).starts_with("id was released"));
    });
}

/// A window limit of 3 a minute costing 2, asked by `caller`: what the released schemas of
/// the migration tests hold.
fn released_window(caller: &str) -> AcquireRequest {
    AcquireRequest::new(caller, vec![window("w", 3, 60_000).with_cost(2)]).unwrap()
}

/// A place of one in `p`.
fn released_place() -> AcquireRequest {
    AcquireRequest::new("c", vec![Limit::concurrent("p", 1)]).unwrap()
}

/// Through the released functions of schema `s`, at T0 and 1 and 2 ms on: a grant of
/// [`released_window`], a place of [`released_place`] under `permit`, and a ticket filed behind
/// them in `w`, whose string it answers.
async fn released_window_place_ticket(client: &tokio_postgres::Client, s: &str, permit: &str) -> String {
    let mut replies = Vec::new();
    for (ms, req) in [(0, released_window("c")), (1, released_place()), (2, released_window("q").with_queue())] {
        replies.push(released_acquire(client, s, &req.to_json().to_string(), permit, ms).await);
    }
    assert_eq!(replies[0]["granted"], serde_json::json!(true), "{}", replies[0]);
    assert_eq!(replies[1]["permit"], serde_json::json!(permit), "{}", replies[1]);
    replies[2]["ticket"].as_str().expect("a ticket filed").to_owned()
}

/// Each bucket of a state: key, window used, places held, tickets queued and the first ticket.
fn bucket_rows(view: &redb_limiter::engine::StateView) -> Vec<(&str, u64, usize, usize, Option<String>)> {
    view.buckets
        .iter()
        .map(|b| (b.key.as_str(), b.window_used, b.places_held, b.queued, b.first_ticket.map(|t| t.to_string())))
        .collect()
}

/// The schema script of the release before this one (format version 5), as it was released.
const SCHEMA_V5: &str = include_str!("fixtures/schema-v5.sql");

/// A schema of format version 5 whose own functions wrote a window grant, a place, a ticket, a
/// throttle and a request id is migrated once to this version: what it held is served as
/// before (the id answered again as the first time), and it then keeps token buckets.
#[test]
fn a_schema_of_version_5_holding_state_is_migrated_and_keeps_it_then_keeps_buckets() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let schema = format!("t_{}_v5", std::process::id());
        let client = plain_client(&url).await;
        let s = released_schema(&client, SCHEMA_V5, "v5").await;
        let permit = "p-00000000000000000000000000000005";
        let at = |ms: u64| i64::try_from(T0.plus(ms).0).unwrap();
        let (w, place) = (released_window, released_place());
        let ticket = released_window_place_ticket(&client, &s, permit).await;
        let until: Option<i64> = client
            .query_one(&format!("SELECT {s}.throttle('t', $1, $2)"), &[&at(120_000), &at(3)])
            .await
            .unwrap()
            .get(0);
        assert_eq!(until, Some(at(120_000)));
        let id = named("m-1", vec![window("m", 5, 60_000)]);
        let params = format!("{:032x}", redb_limiter::engine::params_digest(&id));
        let mut body = id.to_json();
        body.as_object_mut().unwrap().remove("id");
        let sql = format!("SELECT {s}.acquire_id($1::text::jsonb, 'acquire', 250, '', 'm-1', $2, $3)");
        let reply: serde_json::Value =
            client.query_one(&sql, &[&body.to_string(), &params, &at(4)]).await.unwrap().get(0);
        assert_eq!(reply["granted"], serde_json::json!(true), "{reply}");
        assert_eq!(schema_version(&client, &s).await, 5);

        let clock = Arc::new(FakeClock::new(T0.plus(10)));
        let pg = open_existing(&url, &schema, &clock).await.expect("a version 5 schema opens");
        assert_eq!(schema_version(&client, &s).await, redb_limiter_postgres::SCHEMA_VERSION);
        drop(open_existing(&url, &schema, &clock).await.expect("and opens again, already migrated"));

        // What it held is served as before.
        let state = pg.state("", 100).await.unwrap();
        let buckets = bucket_rows(&state.view);
        assert_eq!(buckets, [("m", 1, 0, 0, None), ("p", 0, 1, 0, None), ("w", 2, 0, 1, Some(ticket.clone()))]);
        assert_eq!(state.view.permits.iter().map(|p| p.id.to_string()).collect::<Vec<_>>(), [permit]);
        assert_eq!(state.view.throttles.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(), ["t"]);
        let throttled = AcquireRequest::new("t", vec![window("x", 1, 1000)]).unwrap();
        assert_eq!(
            pg.acquire(throttled).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(120_000), reason: Reason::Throttle, limit: "t".into() }
        );
        assert_eq!(
            pg.acquire(id.clone()).await.unwrap().decision,
            Decision::Granted { at: T0.plus(4), permit: None },
            "the id is answered as the first time"
        );
        assert_eq!(figures(&pg, &id).await[0].window, Some((1, 4)), "and counted once");
        assert!(matches!(
            pg.acquire(place.clone()).await.unwrap().decision,
            Decision::Refused { reason: Reason::Concurrency, .. }
        ));
        assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
        clock.set(T0.plus(60_000));
        let granted = pg.acquire(w("q").with_ticket(ticket).unwrap()).await.unwrap();
        assert_eq!(granted.decision, Decision::Granted { at: T0.plus(60_000), permit: None });

        // And it keeps token buckets: 2 per second, starting full.
        let b = AcquireRequest::new("c", vec![Limit::bucket("b", 2, 1000)]).unwrap();
        for _ in 0..2 {
            assert!(pg.acquire(b.clone()).await.unwrap().decision.is_granted());
        }
        assert_eq!(
            pg.acquire(b).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(60_500), reason: Reason::Rate, limit: "b".into() }
        );
    });
}

/// The schema script of the release before this one (format version 6), as it was released.
const SCHEMA_V6: &str = include_str!("fixtures/schema-v6.sql");

/// A request adapting window `a` (10 calls a second, section 14) with a permit.
fn adapting(caller: &str) -> AcquireRequest {
    let limit = window("a", 10, 1000).with_adapt(Adapt { min: 2, max: 20, increase: 1, keep_pct: 50 });
    AcquireRequest::new(caller, vec![limit]).unwrap().with_permit()
}

/// A schema of format version 6 whose own functions wrote a window grant, a place, a ticket and
/// a token level is migrated once to this version: what it held is served as before, and it
/// then keeps adaptive ceilings.
#[test]
fn a_schema_of_version_6_holding_state_is_migrated_and_keeps_it_then_keeps_ceilings() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let schema = format!("t_{}_v6", std::process::id());
        let client = plain_client(&url).await;
        let s = released_schema(&client, SCHEMA_V6, "v6").await;
        let permit = "p-00000000000000000000000000000006";
        let ticket = released_window_place_ticket(&client, &s, permit).await;
        let level = AcquireRequest::new("c", vec![Limit::bucket("tb", 2, 1000)]).unwrap();
        let reply = released_acquire(&client, &s, &level.to_json().to_string(), "", 3).await;
        assert_eq!(reply["granted"], serde_json::json!(true), "{reply}");
        assert_eq!(schema_version(&client, &s).await, 6);

        let clock = Arc::new(FakeClock::new(T0.plus(10)));
        let pg = open_existing(&url, &schema, &clock).await.expect("a version 6 schema opens");
        assert_eq!(schema_version(&client, &s).await, redb_limiter_postgres::SCHEMA_VERSION);
        drop(open_existing(&url, &schema, &clock).await.expect("and opens again, already migrated"));

        // What it held is served as before.
        let state = pg.state("", 100).await.unwrap();
        assert_eq!(
            bucket_rows(&state.view),
            [("p", 0, 1, 0, None), ("tb", 0, 0, 0, None), ("w", 2, 0, 1, Some(ticket.clone()))]
        );
        assert_eq!(state.view.buckets[1].level, Some((1, 2)), "the level written by version 6");
        assert!(matches!(
            pg.acquire(released_place()).await.unwrap().decision,
            Decision::Refused { reason: Reason::Concurrency, .. }
        ));
        assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
        clock.set(T0.plus(60_000));
        let granted = pg.acquire(released_window("q").with_ticket(ticket).unwrap()).await.unwrap();
        assert_eq!(granted.decision, Decision::Granted { at: T0.plus(60_000), permit: None });

        // And it keeps ceilings: a limited outcome cuts 10 to 5.
        let Decision::Granted { permit: Some(p), .. } = pg.acquire(adapting("c")).await.unwrap().decision else {
            panic!("granted with a permit")
        };
        assert!(pg.release(ReleaseRequest::new(p.to_string()).unwrap().with_outcome(Signal::Limited)).await.unwrap());
        assert_eq!(figures(&pg, &adapting("c")).await[0].ceiling, Some(5));
        let kept = pg.state("", 100).await.unwrap().view.ceilings;
        assert_eq!(
            kept.iter().map(|(k, c)| (k.as_str(), c.c, c.cut_at)).collect::<Vec<_>>(),
            [("a", 5, Some(T0.plus(60_000)))]
        );
    });
}

/// Two servers on one schema adapt one ceiling (section 14): a cut through one judges the
/// other's requests, a growth through the other is seen by the first, a burst of limited
/// outcomes of one overload cuts once, and every server started again keeps the ceiling.
#[test]
fn two_servers_adapt_one_ceiling_kept_through_a_restart() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let (a, b) = two_servers(&url, "ceil2", &clock).await;
        let grant = |pg: Arc<PgLimiter>| async move {
            match pg.acquire(adapting("c")).await.unwrap().decision {
                Decision::Granted { permit: Some(p), .. } => Some(p.to_string()),
                _ => None,
            }
        };
        // Three calls granted before the overload, through both servers: their 429s cut once.
        let early = [grant(a.clone()).await, grant(b.clone()).await, grant(a.clone()).await];
        clock.advance(1);
        for (i, p) in early.iter().enumerate() {
            let pg = if i % 2 == 0 { &b } else { &a };
            let release = ReleaseRequest::new(p.clone().unwrap()).unwrap().with_outcome(Signal::Limited);
            assert!(pg.release(release).await.unwrap());
        }
        assert_eq!(figures(&a, &adapting("c")).await[0].ceiling, Some(5), "cut once, to half");
        assert_eq!(figures(&b, &adapting("c")).await[0].ceiling, Some(5));
        // Server b's requests are judged with it: 3 granted already count, 2 more fit.
        let mut granted = Vec::new();
        for _ in 0..4 {
            granted.extend(grant(b.clone()).await);
        }
        assert_eq!(granted.len(), 2, "5 a second now, 3 of them used");
        // A clean outcome while the ceiling is in play grows it, seen through the other server.
        clock.advance(1000);
        let more: Vec<String> = [grant(a.clone()).await, grant(a.clone()).await].into_iter().flatten().collect();
        assert_eq!(more.len(), 2);
        // (the third of the window: the ceiling is in play at its grant, 3 of 5)
        let p = grant(a.clone()).await.unwrap();
        assert!(b.release(ReleaseRequest::new(p).unwrap().with_outcome(Signal::Clean)).await.unwrap());
        assert_eq!(figures(&a, &adapting("c")).await[0].ceiling, Some(6));
        // A throttle carrying a permit granted after the cut cuts again (6 to 3).
        assert_eq!(
            a.throttle(
                ThrottleRequest::new("c", clock.now().plus(100), clock.now())
                    .unwrap()
                    .with_permit(more[0].clone())
                    .unwrap()
            )
            .await
            .unwrap(),
            Some(clock.now().plus(100))
        );
        assert_eq!(figures(&b, &adapting("c")).await[0].ceiling, Some(3));
        let text = a.metrics().encode();
        assert!(text.contains("redb_limiter_ceiling_changes_total{change=\"cut\"} 1"), "{text}");
        assert!(text.contains("redb_limiter_ceiling_changes_total{change=\"growth\"} 0"), "{text}");
        // Every server started again keeps it.
        let schema = a.schema().to_owned();
        drop((a, b));
        let c = open_existing(&url, &schema, &clock).await.unwrap();
        let kept = c.state("", 100).await.unwrap().view.ceilings;
        assert_eq!(kept.iter().map(|(k, c)| (k.as_str(), c.c, c.cuts)).collect::<Vec<_>>(), [("a", 3, 2)]);
        assert_eq!(figures(&c, &adapting("c")).await[0].ceiling, Some(3));
    });
}

/// A ceiling grown to its max is forgotten with its bucket (section 14): once the window is
/// empty the request is judged with its own calls again, and stays so when the bucket lives
/// again; one below its max is kept.
#[test]
fn a_ceiling_at_its_max_is_forgotten_with_its_bucket() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ceilmax", clock.clone()).await;
        let req = |max: u64| {
            let limit = window("a", 10, 1000).with_adapt(Adapt { min: 2, max, increase: 1, keep_pct: 50 });
            AcquireRequest::new("c", vec![limit]).unwrap().with_permit()
        };
        let mut last = None;
        for _ in 0..5 {
            if let Decision::Granted { permit, .. } = pg.acquire(req(11)).await.unwrap().decision {
                last = permit;
            }
        }
        let release = ReleaseRequest::new(last.unwrap().to_string()).unwrap().with_outcome(Signal::Clean);
        assert!(pg.release(release).await.unwrap(), "in play at its grant (5 of 10): grown");
        assert_eq!(figures(&pg, &req(11)).await[0].ceiling, Some(11));
        clock.advance(999);
        assert_eq!(figures(&pg, &req(11)).await[0].ceiling, Some(11), "its bucket still counts its grants");
        clock.advance(1);
        assert_eq!(figures(&pg, &req(11)).await[0].ceiling, Some(10), "forgotten with its bucket");
        assert!(pg.state("", 10).await.unwrap().view.ceilings.is_empty());
        assert!(pg.acquire(req(11)).await.unwrap().decision.is_granted());
        assert_eq!(figures(&pg, &req(11)).await[0].ceiling, Some(10), "and stays forgotten");
        // One cut below its max is kept however idle its bucket.
        let Decision::Granted { permit: Some(p), .. } = pg.acquire(req(11)).await.unwrap().decision else { panic!() };
        assert!(pg.release(ReleaseRequest::new(p.to_string()).unwrap().with_outcome(Signal::Limited)).await.unwrap());
        clock.advance(60_000);
        assert_eq!(figures(&pg, &req(11)).await[0].ceiling, Some(5));
    });
}

/// A ceiling forgotten with its idle bucket stays forgotten when a request that does not adapt
/// brings the bucket back (section 14), through every way such a request is decided: the
/// one-statement acquires of one window, of two windows and of a batch, and the general path
/// (a permit). A mutation that keeps the row (no `ceilings` probe in the statements, or the
/// general path deleting only for adapted limits) judges the next adapted request with the
/// ceiling at its max (11) instead of its own calls (10).
#[test]
fn a_ceiling_forgotten_stays_forgotten_when_a_plain_request_brings_its_bucket_back() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ceilplain", clock.clone()).await;
        let adapted = |key: &str| {
            let limit = window(key, 10, 1000).with_adapt(Adapt { min: 2, max: 11, increase: 1, keep_pct: 50 });
            AcquireRequest::new("c", vec![limit]).unwrap().with_permit()
        };
        let plain = |key: &str| AcquireRequest::new("p", vec![window(key, 10, 1000)]).unwrap();
        // Grows `key`'s ceiling to its max (in play at a grant of 5 of 10), then lets its bucket
        // go idle: the ceiling is forgotten with it.
        let grown_then_idle = |key: String| {
            let (pg, clock) = (&pg, &clock);
            async move {
                let mut last = None;
                for _ in 0..5 {
                    if let Decision::Granted { permit, .. } = pg.acquire(adapted(&key)).await.unwrap().decision {
                        last = permit;
                    }
                }
                let release = ReleaseRequest::new(last.unwrap().to_string()).unwrap().with_outcome(Signal::Clean);
                assert!(pg.release(release).await.unwrap());
                assert_eq!(figures(pg, &adapted(&key)).await[0].ceiling, Some(11), "{key}: grown to its max");
                clock.advance(1000);
            }
        };
        // The other bucket of the two-window request exists, so that request is decided by its
        // one statement.
        let elsewhere = AcquireRequest::new("p", vec![window("elsewhere", 1000, 1000)]).unwrap();
        assert!(pg.acquire(elsewhere).await.unwrap().decision.is_granted());
        let two = |key: &str| AcquireRequest::new("p", vec![window(key, 10, 1000), window("elsewhere", 1000, 1000)]);
        let ways =
            [("one window", plain("k0")), ("two windows", two("k1").unwrap()), ("a permit", plain("k2").with_permit())];
        for (how, request) in ways {
            let key = request.limits[0].key.clone();
            grown_then_idle(key.clone()).await;
            assert!(pg.acquire(request).await.unwrap().decision.is_granted(), "{how}");
            assert_eq!(figures(&pg, &adapted(&key)).await[0].ceiling, Some(10), "{how}: stays forgotten");
        }
        // The batch: several one-window requests at once.
        grown_then_idle("kb".to_string()).await;
        let answers = join_all((0..8).map(|_| pg.acquire(plain("kb"))).collect()).await;
        assert!(answers.iter().all(|r| r.as_ref().unwrap().decision.is_granted()));
        assert_eq!(figures(&pg, &adapted("kb")).await[0].ceiling, Some(10), "batch: stays forgotten");
    });
}

/// Warming a session (`warm()`, run on every session the pool opens) leaves no trace: what the
/// schema holds, its lines and its tickets are as they were.
#[test]
fn warming_a_session_leaves_nothing_behind() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "warm", clock.clone()).await;
        let s = format!("\"{}\"", pg.schema());
        let held = AcquireRequest::new("c", vec![window("w", 1, 60_000)]).unwrap();
        assert!(pg.acquire(held.clone()).await.unwrap().decision.is_granted());
        let filed = pg.acquire(held.with_queue()).await.unwrap();
        assert!(filed.ticket.is_some(), "a line to keep");
        let before = (totals(&url, pg.schema()).await, pg.state("", 100).await.unwrap().view);
        let client = plain_client(&url).await;
        let ms: i64 = client.query_one(&format!("SELECT {s}.warm()"), &[]).await.unwrap().get(0);
        assert!(ms >= 0);
        let again: i64 = client.query_one(&format!("SELECT {s}.warm()"), &[]).await.unwrap().get(0);
        assert!(again >= 0);
        let after = (totals(&url, pg.schema()).await, pg.state("", 100).await.unwrap().view);
        assert_eq!(before.0, after.0, "no row written");
        assert_eq!(format!("{:?}", before.1), format!("{:?}", after.1), "the state as it was");
        let tickets: i64 = client.query_one(&format!("SELECT count(*) FROM {s}.tickets"), &[]).await.unwrap().get(0);
        let lines: i64 = client.query_one(&format!("SELECT count(*) FROM {s}.line"), &[]).await.unwrap().get(0);
        assert_eq!((tickets, lines), (1, 1), "the one ticket filed, in its one line");
    });
}

/// Wall-clock milliseconds since the Unix epoch, floored: the database's clock, on this machine.
fn wall_ms() -> u64 {
    u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// One grant seen by a host in the instants test.
#[derive(Debug, Clone)]
struct Seen1 {
    at: u64,
    sent: u64,
    answered: u64,
    /// (window bucket, estimated cost) and whether it holds a place in `c`.
    window: Option<u64>,
    place: bool,
    /// When the host sent the release (`u64::MAX`: never), and the settle (with its cost).
    released: u64,
    settled: Option<(u64, u64)>,
}

const INSTANT_CALLS: u64 = 40;
const INSTANT_PER_MS: u64 = 200;
const INSTANT_CONCURRENT: u64 = 3;
const INSTANT_HOLD_MS: u64 = 5_000;

/// The violations of section 10's last rule in what hosts saw, replayed offline by the
/// reported instants: a bucket over `concurrent` places (a place counts from its grant's
/// instant until its release was sent, or it lapsed), a window over `calls` (a grant counts its
/// settled cost from when its settle was sent, its estimate before), a grant whose instant is
/// outside its request's span (before it was sent or after it was answered).
fn instant_violations(grants: &[Seen1]) -> (Vec<String>, u64, u64) {
    let mut out = Vec::new();
    let (mut most_held, mut most_used) = (0, 0);
    for g in grants {
        if g.at < g.sent || g.at > g.answered {
            out.push(format!("granted at {} outside its request's span {}..={}", g.at, g.sent, g.answered));
        }
    }
    for g in grants.iter().filter(|g| g.place) {
        let a = g.at;
        let held: Vec<&Seen1> =
            grants.iter().filter(|h| h.place && h.at <= a && a < h.released && a < h.at + INSTANT_HOLD_MS).collect();
        most_held = most_held.max(held.len() as u64);
        if held.len() as u64 > INSTANT_CONCURRENT {
            let late = held.iter().filter(|h| h.released > a).map(|h| h.released - a).max().unwrap_or(0);
            out.push(format!(
                "{} places held at {a} (concurrent {INSTANT_CONCURRENT}); a release it needed was sent up to {late} ms later",
                held.len()
            ));
        }
    }
    for g in grants.iter().filter(|g| g.window.is_some()) {
        let a = g.at;
        let cost_at = |h: &Seen1| match h.settled {
            Some((sent, cost)) if sent <= a => cost,
            _ => h.window.unwrap_or(0),
        };
        let inside: u64 =
            grants.iter().filter(|h| h.window.is_some() && h.at <= a && h.at + INSTANT_PER_MS > a).map(cost_at).sum();
        most_used = most_used.max(inside);
        if inside > INSTANT_CALLS {
            out.push(format!("{inside} in the window ending at {a} (calls {INSTANT_CALLS})"));
        }
    }
    (out, most_held, most_used)
}

/// One run of the instants test: two limiters on one fresh schema (as two servers), hosts
/// acquiring a window `w` and places of `c` in every request shape that reaches a different
/// path (two limits with a permit, one place by acquire()'s own path, one place with a permit,
/// one window with a permit, one window alone), holding a moment, then settling and releasing.
async fn instants_run(url: &str, run: usize, for_ms: u64) -> (Vec<Seen1>, (Vec<String>, u64, u64)) {
    use redb_limiter::request::{Cost, SettleRequest};
    let schema = format!("t_{}_instants_{run}", std::process::id());
    let client = plain_client(url).await;
    client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")).await.unwrap();
    let connect = || {
        let mut options = PgOptions::new(url);
        options.schema = schema.clone();
        options.pool_size = 8;
        PgLimiter::connect(options)
    };
    let limiters = [Arc::new(connect().await.unwrap()), Arc::new(connect().await.unwrap())];
    let end = wall_ms() + for_ms;
    let mut tasks = Vec::new();
    for task in 0..16u64 {
        let pg = Arc::clone(&limiters[usize::try_from(task % 2).unwrap()]);
        tasks.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut i = task;
            while wall_ms() < end {
                i += 1;
                let w = || window("w", INSTANT_CALLS, INSTANT_PER_MS).with_cost(4).with_hold_ms(INSTANT_HOLD_MS);
                let c = || Limit::concurrent("c", INSTANT_CONCURRENT).with_hold_ms(INSTANT_HOLD_MS);
                let (req, window, place) = match i % 7 {
                    0 => (AcquireRequest::new("h", vec![w(), c()]).unwrap().with_permit(), Some(4), true),
                    1 => (AcquireRequest::new("h", vec![c()]).unwrap(), None, true),
                    2 => (AcquireRequest::new("h", vec![c()]).unwrap().with_permit(), None, true),
                    3 | 5 => (AcquireRequest::new("h", vec![w()]).unwrap().with_permit(), Some(4), false),
                    _ => (
                        AcquireRequest::new("h", vec![window("w", INSTANT_CALLS, INSTANT_PER_MS)]).unwrap(),
                        Some(1),
                        false,
                    ),
                };
                let sent = wall_ms();
                let decision = pg.acquire(req).await.expect("no call fails").decision;
                let answered = wall_ms();
                match decision {
                    Decision::Granted { at, permit } => {
                        let mut g =
                            Seen1 { at: at.0, sent, answered, window, place, released: u64::MAX, settled: None };
                        tokio::time::sleep(std::time::Duration::from_millis(i % 4)).await;
                        if let Some(permit) = permit {
                            let permit = permit.to_string();
                            if window.is_some() && i % 3 != 0 {
                                let cost = i % 3;
                                let settle = SettleRequest::new(&permit, vec![Cost::new("w", cost)]).unwrap();
                                let sent = wall_ms();
                                assert!(pg.settle(settle).await.expect("no call fails"));
                                g.settled = Some((sent, cost));
                            }
                            g.released = wall_ms();
                            assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.expect("no call fails"));
                        }
                        seen.push(g);
                    }
                    Decision::Refused { retry_at, .. } => {
                        let wait = retry_at.0.saturating_sub(wall_ms()).min(5);
                        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                    }
                }
            }
            seen
        }));
    }
    let mut grants = Vec::new();
    for task in tasks {
        grants.extend(task.await.unwrap());
    }
    let violations = instant_violations(&grants);
    client.batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE")).await.unwrap();
    (grants, violations)
}

/// Section 10: the instants reported are the instants judged. Two servers on one schema, hosts
/// acquiring windows and places under concurrency with settles and releases; every grant's
/// reported instant, replayed offline, keeps every window within `calls` and every bucket
/// within `concurrent` (a grant that needed a release reports an instant no earlier than the
/// release was sent), and lies within its request's span. `REDB_LIMITER_PG_INSTANT_RUNS` runs
/// (default 3) of two seconds each.
#[test]
fn reported_instants_replay_within_every_window_and_place() {
    let Some(url) = database_url() else { return };
    let runs = std::env::var("REDB_LIMITER_PG_INSTANT_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    runtime().block_on(async {
        let mut bad = Vec::new();
        for run in 0..runs {
            let (grants, (violations, most_held, most_used)) = instants_run(&url, run, 2_000).await;
            let places = grants.iter().filter(|g| g.place).count();
            let settled = grants.iter().filter(|g| g.settled.is_some()).count();
            eprintln!(
                "run {run}: {} grants ({places} places, {settled} settled), at most {most_held} places held and \
                 {most_used} in a window, {} violations",
                grants.len(),
                violations.len()
            );
            for v in violations.iter().take(8) {
                eprintln!("  {v}");
            }
            assert!(
                places >= 20 && settled >= 5,
                "the run exercised places and settles: {places} places, {settled} settled"
            );
            // The bounds were reached, so they were tested.
            assert!(most_held >= INSTANT_CONCURRENT && most_used + 4 > INSTANT_CALLS, "{most_held} {most_used}");
            bad.extend(violations.into_iter().take(5).map(|v| format!("run {run}: {v}")));
        }
        assert!(bad.is_empty(), "{bad:#?}");
    });
}

/// Percentile `p` (0-100) of `samples`, in milliseconds.
fn percentile_ms(samples: &mut [std::time::Duration], p: usize) -> f64 {
    samples.sort();
    let i = (samples.len() * p / 100).min(samples.len().saturating_sub(1));
    samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Acquires of one-window buckets `z0..z7` from four tasks until `stop`: each one's latency.
async fn acquires_until(pg: &Arc<PgLimiter>, stop: &Arc<std::sync::atomic::AtomicBool>) -> Vec<std::time::Duration> {
    let mut tasks = Vec::new();
    for task in 0..4u64 {
        let (pg, stop) = (Arc::clone(pg), Arc::clone(stop));
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            let mut i = task;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let req = AcquireRequest::new("c", vec![window(&format!("z{}", i % 8), 1_000_000, 60_000)]).unwrap();
                let start = std::time::Instant::now();
                assert!(pg.acquire(req).await.expect("no acquire fails").decision.is_granted());
                took.push(start.elapsed());
            }
            took
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

/// A `/state` prefix bounds the walk at the least key above every key under it
/// (`_prefix_end`), over the surrogates and past U+10FFFF, and lists exactly the keys under it:
/// buckets, lines and throttles alike.
#[test]
fn a_state_prefix_ends_where_its_keys_end() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "prefixend", clock.clone()).await;
        let client = plain_client(&url).await;
        let end = |p: &'static str| {
            let (client, sql) = (&client, format!("SELECT \"{}\"._prefix_end($1)", pg.schema()));
            async move { client.query_one(&sql, &[&p]).await.unwrap().get::<_, Option<String>>(0) }
        };
        assert_eq!(end("a").await.as_deref(), Some("b"));
        assert_eq!(end("a\u{D7FF}").await.as_deref(), Some("a\u{E000}"), "over the surrogates");
        assert_eq!(end("a\u{10FFFF}").await.as_deref(), Some("b"));
        assert_eq!(end("ab\u{10FFFF}\u{10FFFF}").await.as_deref(), Some("ac"));
        assert_eq!(end("\u{10FFFF}").await, None);
        assert_eq!(end("").await, None);

        let keys = ["a\u{D7FF}", "a\u{D7FF}x", "a\u{E000}", "a\u{10FFFF}", "a\u{10FFFF}\u{10FFFF}z", "b", "\u{10FFFF}"];
        let one = |key: &str| AcquireRequest::new(key, vec![window(key, 1, 60_000)]).unwrap();
        for key in keys {
            assert!(pg.acquire(one(key)).await.unwrap().decision.is_granted());
            let until = T0.plus(30_000);
            assert_eq!(pg.throttle(ThrottleRequest::new(key, until, T0).unwrap()).await.unwrap(), Some(until));
            let queued = pg.acquire(AcquireRequest::new("q", vec![window(key, 1, 60_000)]).unwrap().with_queue());
            assert!(queued.await.unwrap().ticket.is_some());
        }
        for prefix in ["a\u{D7FF}", "a\u{10FFFF}", "a", "\u{10FFFF}", "", "a\u{E000}"] {
            let under: Vec<&str> = keys.iter().copied().filter(|k| k.starts_with(prefix)).collect();
            let state = pg.state(prefix, 1000).await.unwrap().view;
            assert_eq!(
                state.buckets.iter().map(|b| b.key.as_str()).collect::<Vec<_>>(),
                under,
                "buckets of {prefix:?}"
            );
            assert!(state.buckets.iter().all(|b| b.queued == 1), "each bucket's line under {prefix:?}");
            assert_eq!(
                state.throttles.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
                under,
                "throttles of {prefix:?}"
            );
        }
    });
}

/// `/state` pages by key over an index, at a cost that grows with the page: pages of 100,000
/// over 200,000 live buckets come back whole, within the statement timeout, in key order, one
/// after another from the last key, while acquires run beside them (their p99 is reported
/// against the same acquires alone), and `/health` stays up.
#[test]
fn state_pages_of_100000_over_200000_keys_within_the_timeout_beside_acquires() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = Arc::new(fresh(&url, "large_state", clock.clone()).await);
        let schema = pg.schema().to_owned();
        let client = plain_client(&url).await;
        // 200,000 buckets holding one grant each, written as a grant writes them.
        client
            .batch_execute(&format!(
                "INSERT INTO \"{schema}\".buckets (key, retain_ms, total, last_seq, last_at, floor_ms, last_calls)
                 SELECT 'k' || lpad(i::text, 7, '0'), 60000, 1, 1, {t0}, {t0}, 10 FROM generate_series(1, 200000) i;
                 INSERT INTO \"{schema}\".grants (bucket, at, seq, cost, cum)
                 SELECT id, last_at, 1, 1, 1 FROM \"{schema}\".buckets;
                 ANALYZE \"{schema}\".buckets; ANALYZE \"{schema}\".grants;",
                t0 = T0.0
            ))
            .await
            .unwrap();
        clock.advance(10);
        let one = AcquireRequest::new("c", vec![window("k0000001", 10, 60_000)]).unwrap();
        assert_eq!(pg.peek(one).await.unwrap().report.limits[0].window, Some((1, 9)), "they count as grants");

        // The acquires alone, for a baseline.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acquiring = tokio::spawn({
            let (pg, stop) = (Arc::clone(&pg), Arc::clone(&stop));
            async move { acquires_until(&pg, &stop).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        stop.store(true, Ordering::Relaxed);
        let mut alone = acquiring.await.unwrap();

        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acquiring = tokio::spawn({
            let (pg, stop) = (Arc::clone(&pg), Arc::clone(&stop));
            async move { acquires_until(&pg, &stop).await }
        });
        let timeout = PgOptions::new("").statement_timeout;
        let small = std::time::Instant::now();
        let first = pg.state_page("", "", 1000).await.unwrap();
        let small = small.elapsed();
        assert_eq!(first.snapshot.view.buckets.len(), 1000);
        let mut after = String::new();
        let mut seen = 0usize;
        let mut took = Vec::new();
        for page in 0..3 {
            let start = std::time::Instant::now();
            let got = pg.state_page("", &after, 100_000).await.expect("a page of 100,000 within the timeout");
            took.push(start.elapsed());
            assert!(took[page] < timeout, "{:?}", took[page]);
            let keys: Vec<&str> = got.snapshot.view.buckets.iter().map(|b| b.key.as_str()).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "in key order");
            if page < 2 {
                assert_eq!(keys.len(), 100_000);
                assert_eq!(keys[0], format!("k{:07}", page * 100_000 + 1));
                assert!(got.truncated, "more remain");
            } else {
                assert!(keys.iter().all(|k| k.starts_with('z')) && !got.truncated, "{keys:?}");
            }
            seen += keys.len();
            after = keys.last().unwrap().to_string();
            pg.health().await.expect("a long read never flips /health");
        }
        stop.store(true, Ordering::Relaxed);
        let mut beside = acquiring.await.unwrap();
        assert!(seen > 200_000);
        let (p99_alone, p99_beside) = (percentile_ms(&mut alone, 99), percentile_ms(&mut beside, 99));
        eprintln!(
            "state: a page of 1,000 in {:.1} ms, of 100,000 in {:.0} / {:.0} ms; acquires' p99 {p99_alone:.1} ms alone, \
             {p99_beside:.1} ms beside the pages ({} and {} acquires)",
            small.as_secs_f64() * 1000.0,
            took[0].as_secs_f64() * 1000.0,
            took[1].as_secs_f64() * 1000.0,
            alone.len(),
            beside.len()
        );
    });
}

/// Two limiters on one fresh schema, as two servers: the first made by [`fresh`], the second
/// connected to its schema with the same clock.
async fn two_servers(url: &str, name: &str, clock: &Arc<FakeClock>) -> (Arc<PgLimiter>, Arc<PgLimiter>) {
    let a = fresh(url, name, clock.clone()).await;
    let mut options = PgOptions::new(url);
    options.schema = a.schema().to_owned();
    options.pool_size = 4;
    options.clock = Some(clock.clone());
    let b = PgLimiter::connect(options).await.unwrap();
    (Arc::new(a), Arc::new(b))
}

/// Section 12.9, once: a ticket first in line presented from four sessions at once, through
/// two servers on one schema, is granted once in every trial; the other three find it ended
/// (unknown), so they queue anew behind the ticket filed after it, which wants a place too.
#[test]
fn a_ticket_presented_at_once_through_two_servers_is_granted_once() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let (a, b) = two_servers(&url, "once", &clock).await;
        for trial in 0..24 {
            let key = format!("once{trial}");
            let places = |caller: &str| {
                AcquireRequest::new(caller, vec![Limit::concurrent(&key, 10).with_hold_ms(1000)]).unwrap()
            };
            for _ in 0..10 {
                assert!(a.acquire(places("filler")).await.unwrap().decision.is_granted());
            }
            let first = a.acquire(places("first").with_queue()).await.unwrap().ticket.expect("filed");
            let behind = b.acquire(places("behind").with_queue()).await.unwrap().ticket.expect("filed");
            assert_eq!((first.ahead, behind.ahead), (0, 1));
            // The fillers' places lapse: the first ticket fits, and so would each copy of it.
            clock.advance(1000);
            let req = places("first").with_ticket(first.id.to_string()).unwrap();
            let tasks: Vec<_> = (0..4)
                .map(|i| {
                    let pg = Arc::clone(if i % 2 == 0 { &a } else { &b });
                    let req = req.clone();
                    tokio::spawn(async move { pg.acquire(req).await.unwrap() })
                })
                .collect();
            let mut granted = 0;
            for task in tasks {
                let got = task.await.unwrap();
                if got.decision.is_granted() {
                    granted += 1;
                } else {
                    let again = got.ticket.expect("an ended ticket queues anew");
                    assert_ne!(again.id, first.id, "trial {trial}: {got:?}");
                    assert!(again.ahead >= 1, "behind the second ticket: {got:?}");
                }
            }
            assert_eq!(granted, 1, "trial {trial}: granted once");
        }
    });
}

/// Fills bucket `key`'s line with `n` tickets of caller `bulk` (a place of `concurrent`, never
/// asked again: retried at `retry_at`, lapsing at `lapse_at`), written straight into the
/// tables as filing writes them, so that a test reaches a long line in a moment.
async fn bulk_line(client: &tokio_postgres::Client, schema: &str, key: &str, n: i64, at: (Millis, Millis)) {
    let s = format!("\"{schema}\"");
    let (retry_at, lapse_at) = (i64::try_from(at.0.0).unwrap(), i64::try_from(at.1.0).unwrap());
    let bound = serde_json::json!([{"key": key, "concurrent": 1, "holdMs": 700}]).to_string();
    let sql = format!(
        "WITH n AS (SELECT nextval('{s}.ticket_numbers') AS num FROM generate_series(1, $2::bigint)),
              t AS (INSERT INTO {s}.tickets (num, ticket, caller, bound, keys, retry_at, lapse_at, grace_ms,
                                              filed_at, deadline)
                    SELECT num, 't-' || lpad(to_hex(num), 16, '0') || lpad(to_hex(num), 16, '0'), 'bulk',
                           $3::text::jsonb, ARRAY[$1::text], $4::bigint, $5::bigint, 2000, $4::bigint - 1000,
                           $5::bigint FROM n
                    RETURNING num)
         INSERT INTO {s}.line (bucket, num, lapse_at, caller, calls, per_ms, cost, conc)
         SELECT $1::text, num, $5::bigint, 'bulk', 0, 0, 0, 1 FROM t"
    );
    client.execute(&sql, &[&key, &n, &bound, &retry_at, &lapse_at]).await.unwrap();
    let count = format!(
        "INSERT INTO {s}.buckets AS bk (key, queued) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET queued = bk.queued + excluded.queued"
    );
    client.execute(&count, &[&key, &n]).await.unwrap();
}

/// Section 12.9: the 10,000 bound of a line is exact under concurrency. A line 10 short of
/// it, then 40 requests queueing at once through two servers: exactly 10 file a ticket, the
/// others are told `noTicket: full`, and the line holds 10,000.
#[test]
fn a_full_line_is_full_at_exactly_ten_thousand_under_concurrency() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let (a, b) = two_servers(&url, "full", &clock).await;
        let place = |caller: &str| AcquireRequest::new(caller, vec![Limit::concurrent("full", 1)]).unwrap();
        assert!(a.acquire(place("holder")).await.unwrap().decision.is_granted());
        let client = plain_client(&url).await;
        let max = i64::try_from(redb_limiter::engine::MAX_LINE).unwrap();
        bulk_line(&client, a.schema(), "full", max - 10, (T0.plus(100_000), T0.plus(1_000_000))).await;
        let tasks: Vec<_> = (0..40)
            .map(|i| {
                let pg = Arc::clone(if i % 2 == 0 { &a } else { &b });
                let req = place(&format!("host{i}")).with_queue();
                tokio::spawn(async move { pg.acquire(req).await.unwrap() })
            })
            .collect();
        let (mut filed, mut full) = (0, 0);
        for task in tasks {
            let got = task.await.unwrap();
            assert!(!got.decision.is_granted(), "{got:?}");
            match (got.ticket, got.no_ticket) {
                (Some(_), None) => filed += 1,
                (None, Some(redb_limiter::engine::NoTicket::Full)) => full += 1,
                other => panic!("neither filed nor full: {other:?}"),
            }
        }
        assert_eq!((filed, full), (10, 30));
        let state = a.state("full", 10).await.unwrap();
        assert_eq!(state.view.buckets[0].queued, redb_limiter::engine::MAX_LINE);
    });
}

/// Section 12.6 in PostgreSQL mode (12.9): a server's start is a restart. A ticket whose grace
/// passed while no server ran keeps its place and lapses no sooner than the start plus its
/// grace; one that had lapsed while a server still ran stays lapsed.
#[test]
fn tickets_are_kept_through_a_restart_of_every_server() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "restart", clock.clone()).await;
        let schema = pg.schema().to_owned();
        let req = |caller: &str| AcquireRequest::new(caller, vec![window("w", 1, 10_000)]).unwrap();
        assert!(pg.acquire(req("filler")).await.unwrap().decision.is_granted());
        let gone = pg.acquire(req("gone").with_queue().with_grace_ms(100).unwrap()).await.unwrap();
        let gone = gone.ticket.expect("filed");
        assert_eq!(gone.lapse_at, T0.plus(10_100));
        let kept = pg.acquire(req("kept").with_queue().with_grace_ms(5000).unwrap()).await.unwrap();
        let kept = kept.ticket.expect("filed");
        assert_eq!((kept.lapse_at, kept.ahead), (T0.plus(15_000), 1));
        // The first ticket lapses while the server runs (its sweeper ticks then); then every
        // server stops, and starts again long after the second ticket's lapse.
        clock.set(T0.plus(10_200));
        assert!(pg.sweep(1000).await.unwrap() > 0);
        drop(pg);
        clock.set(T0.plus(60_000));
        let pg = open_existing(&url, &schema, &clock).await.unwrap();
        let state = pg.state("w", 10).await.unwrap();
        let line: Vec<_> = state.view.buckets.iter().map(|b| (b.queued, b.first_ticket_at, b.first_ticket)).collect();
        assert_eq!(line, [(1, Some(T0), Some(kept.id))], "the second ticket kept its place");
        // It holds the line (a plain request waits behind it) until the start plus its grace.
        assert!(!pg.acquire(req("plain")).await.unwrap().decision.is_granted());
        clock.set(T0.plus(64_999));
        assert_eq!(pg.peek(req("plain")).await.unwrap().report.limits[0].queued, Some(1));
        let granted = pg.acquire(req("kept").with_ticket(kept.id.to_string()).unwrap()).await.unwrap();
        assert_eq!(granted.decision, Decision::Granted { at: T0.plus(64_999), permit: None });
        // The lapsed one is unknown: asked with, it queues anew.
        let anew = pg.acquire(req("gone").with_ticket(gone.id.to_string()).unwrap()).await.unwrap();
        assert_ne!(anew.ticket.map(|t| t.id), Some(gone.id));
    });
}

// Request ids (section 16).

/// An acquire of caller `caller` named by `id`.
fn named(id: &str, limits: Vec<Limit>) -> AcquireRequest {
    AcquireRequest::new("caller", limits).unwrap().with_id(id).unwrap()
}

/// The figures of `req`'s limits now, read by a peek without its id, ticket or queue.
async fn figures(pg: &PgLimiter, req: &AcquireRequest) -> Vec<redb_limiter::engine::Figures> {
    let mut plain = req.clone();
    (plain.id, plain.ticket, plain.queue) = (None, None, false);
    pg.peek(plain).await.unwrap().report.limits
}

/// How many ids the schema of `pg` keeps a record of (forgotten or not).
async fn records(client: &tokio_postgres::Client, pg: &PgLimiter) -> i64 {
    let sql = format!("SELECT count(*) FROM \"{}\".requests", pg.schema());
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// The message of a bad request, or a panic naming what came instead.
fn bad_request<T: std::fmt::Debug>(result: Result<T, LimiterError>) -> String {
    match result {
        Err(LimiterError::BadRequest(e)) => e.0,
        other => panic!("not a bad request: {other:?}"),
    }
}

/// A grant named by an id, asked again (with a report and another graceMs, neither bound), is
/// answered as the first time (its instant, its permit) and counts once; a peek with the id fits
/// as it would be answered again; the id with another cost, caller or permit flag is a bad request
/// naming `id`, for a peek too; a new id is a new ask. A grant without a permit is answered again
/// the same way.
#[test]
fn a_retried_acquire_named_by_id_is_answered_as_the_first_time_and_counts_once() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ids_again", clock.clone()).await;
        let r = named("a-1", vec![window("w", 2, 60_000), Limit::concurrent("c", 2)]);
        let first = pg.acquire(r.clone()).await.unwrap().decision;
        let Decision::Granted { at, permit: Some(_) } = first else { panic!("{first:?}") };
        assert_eq!(at, T0);
        clock.advance(5);
        let again = pg.acquire(r.clone().with_report().with_grace_ms(5_000).unwrap()).await.unwrap();
        assert_eq!(again.decision, first, "the same grant, instant and permit");
        let report = again.report.expect("a report");
        assert_eq!(report.now, T0.plus(5));
        let counted: Vec<_> = report.limits.iter().map(|f| (f.window, f.places)).collect();
        assert_eq!(counted, [(Some((1, 1)), None), (None, Some((1, 1)))], "counted once, as it stands now");
        let peeked = pg.peek(r.clone()).await.unwrap();
        assert_eq!((peeked.refusal, peeked.report.now), (None, T0.plus(5)), "peeked as it would be answered again");
        let mut cost = r.clone();
        cost.limits[0].cost = 2;
        let other_caller = AcquireRequest { key: "other".into(), ..r.clone() };
        for other in [cost, other_caller, r.clone().with_permit()] {
            let message = bad_request(pg.acquire(other.clone()).await);
            assert!(message.starts_with("id names another request"), "{message}");
            assert!(bad_request(pg.peek(other).await).starts_with("id "));
        }
        let counted: Vec<_> = figures(&pg, &r).await.iter().map(|f| (f.window, f.places)).collect();
        assert_eq!(counted, [(Some((1, 1)), None), (None, Some((1, 1)))], "a bad request counts nothing");
        // A new id is a new ask.
        let fresh_id = AcquireRequest { id: Some("a-2".into()), ..r.clone() };
        assert!(pg.acquire(fresh_id).await.unwrap().decision.is_granted());
        assert_eq!(figures(&pg, &r).await[0].window, Some((2, 0)));
        // A grant without a permit: the same instant, no permit, counted once.
        let w = named("w-1", vec![window("v", 5, 60_000).with_cost(2)]);
        let first = pg.acquire(w.clone()).await.unwrap().decision;
        assert_eq!(first, Decision::Granted { at: T0.plus(5), permit: None });
        clock.advance(10);
        assert_eq!(pg.acquire(w.clone()).await.unwrap().decision, first);
        assert_eq!(figures(&pg, &w).await[0].window, Some((2, 3)));
    });
}

/// A filing named by an id, asked again, names the same ticket (its lapse and the tickets ahead
/// as they stand) and files no second; so it does after the ticket ended. A renewal of a ticket
/// presented under a new id, and a refusal that filed nothing, are not remembered.
#[test]
fn a_retried_filing_names_the_same_ticket_and_files_no_second() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ids_filing", clock.clone()).await;
        let client = plain_client(&url).await;
        let plain = AcquireRequest::new("filler", vec![window("q", 1, 60_000)]).unwrap();
        assert!(pg.acquire(plain.clone()).await.unwrap().decision.is_granted());
        let r = named("q-1", vec![window("q", 1, 60_000)]).with_queue();
        let first = pg.acquire(r.clone()).await.unwrap();
        let refused = Decision::Refused { retry_at: T0.plus(60_000), reason: Reason::Rate, limit: "q".into() };
        assert_eq!(first.decision, refused);
        let ticket = first.ticket.expect("filed");
        clock.advance(10);
        let again = pg.acquire(r.clone()).await.unwrap();
        assert_eq!(again.decision, refused);
        let note = again.ticket.expect("the same ticket");
        assert_eq!((note.id, note.lapse_at, note.ahead, note.now), (ticket.id, ticket.lapse_at, 0, T0.plus(10)));
        assert_eq!(figures(&pg, &r).await[0].queued, Some(1), "one ticket");
        // A renewal under a new id files nothing and is not remembered; nor is a refusal that
        // filed nothing.
        let renewal = AcquireRequest { id: None, ..r.clone() }.with_ticket(ticket.id.to_string()).unwrap();
        let renewed = pg.acquire(renewal.with_id("q-2").unwrap()).await.unwrap();
        assert_eq!(renewed.ticket.map(|t| t.id), Some(ticket.id));
        let unqueued = named("u-1", vec![window("q", 1, 60_000)]);
        assert!(!pg.acquire(unqueued.clone()).await.unwrap().decision.is_granted());
        assert_eq!(records(&client, &pg).await, 1, "only the filing is remembered");
        // The ticket granted at its retryAt: the id still names its filing, as the first time.
        clock.set(T0.plus(60_000));
        let grant = AcquireRequest { id: None, ..r.clone() }.with_ticket(ticket.id.to_string()).unwrap();
        assert!(pg.acquire(grant).await.unwrap().decision.is_granted());
        let after = pg.acquire(r.clone()).await.unwrap();
        assert_eq!(after.decision, refused);
        let note = after.ticket.expect("the ticket it filed");
        assert_eq!((note.id, note.ahead), (ticket.id, 0));
        assert_eq!(figures(&pg, &r).await[0].queued, None, "no second ticket: the line is empty");
        // The refusal that filed nothing is decided afresh: granted now.
        clock.set(T0.plus(120_000));
        assert!(pg.acquire(unqueued).await.unwrap().decision.is_granted());
    });
}

/// `release {id}` of each kind. A grant holding a place: the place is freed, once, and the id
/// stays released (asked again: a bad request naming `id`, counting nothing). A grant with a
/// permit and costs: settled, then released; a key that was no window of it refuses the whole
/// release. A grant without a permit: its windows settled to the costs (0: it counts nowhere),
/// all or nothing; without costs it changes nothing. A filing: its ticket leaves the line (costs
/// are not read).
#[test]
fn release_id_undoes_what_the_acquire_got_of_each_kind() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        use redb_limiter::request::{Cost, LeaveRequest, UndoRequest};
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ids_undo", clock.clone()).await;
        let undo = |id: &str, costs: Vec<Cost>| {
            if costs.is_empty() { UndoRequest::new(id).unwrap() } else { UndoRequest::with_costs(id, costs).unwrap() }
        };
        // A place.
        let p = named("p-1", vec![Limit::concurrent("c", 1)]);
        assert!(pg.acquire(p.clone()).await.unwrap().decision.is_granted());
        assert_eq!(figures(&pg, &p).await[0].places, Some((1, 0)));
        clock.advance(1);
        assert!(pg.undo(undo("p-1", vec![])).await.unwrap(), "the place is freed");
        assert_eq!(figures(&pg, &p).await[0].places, Some((0, 1)));
        assert!(!pg.undo(undo("p-1", vec![])).await.unwrap(), "once");
        let message = bad_request(pg.acquire(p.clone()).await);
        assert_eq!(message, "id was released: a new ask needs a new id");
        assert!(bad_request(pg.peek(p.clone()).await).starts_with("id "));
        assert_eq!(figures(&pg, &p).await[0].places, Some((0, 1)), "nothing counted");
        // A permit with costs: a key that is none of its windows refuses it all; then settled
        // and released.
        let pw = named("p-2", vec![window("pw", 3, 60_000).with_cost(2), Limit::concurrent("pc", 1)]);
        assert!(pg.acquire(pw.clone()).await.unwrap().decision.is_granted());
        let message = bad_request(pg.undo(undo("p-2", vec![Cost::new("pw", 0), Cost::new("elsewhere", 0)])).await);
        assert_eq!(message, "costs[1].key is not a window limit of the permit's grant");
        let held: Vec<_> = figures(&pg, &pw).await.iter().map(|f| (f.window, f.places)).collect();
        assert_eq!(held, [(Some((2, 1)), None), (None, Some((1, 0)))], "nothing changed");
        assert!(pg.undo(undo("p-2", vec![Cost::new("pw", 0)])).await.unwrap());
        let held: Vec<_> = figures(&pg, &pw).await.iter().map(|f| (f.window, f.places)).collect();
        assert_eq!(held, [(Some((0, 3)), None), (None, Some((0, 1)))], "settled to 0 and released");
        // A grant without a permit.
        let w = named("w-1", vec![window("w", 3, 60_000).with_cost(2), window("v", 5, 60_000)]);
        assert!(pg.acquire(w.clone()).await.unwrap().decision.is_granted());
        let message = bad_request(pg.undo(undo("w-1", vec![Cost::new("w", 0), Cost::new("elsewhere", 0)])).await);
        assert_eq!(message, "costs[1].key is not a window limit of the id's grant");
        let used = |f: Vec<redb_limiter::engine::Figures>| f.iter().map(|f| f.window).collect::<Vec<_>>();
        assert_eq!(used(figures(&pg, &w).await), [Some((2, 1)), Some((1, 4))], "nothing changed");
        assert!(pg.undo(undo("w-1", vec![Cost::new("w", 0), Cost::new("v", 0)])).await.unwrap());
        assert_eq!(used(figures(&pg, &w).await), [Some((0, 3)), Some((0, 5))], "it counts nowhere");
        assert!(!pg.undo(undo("w-1", vec![Cost::new("w", 0)])).await.unwrap(), "released: once");
        let w2 = named("w-2", vec![window("w", 3, 60_000)]);
        assert!(pg.acquire(w2.clone()).await.unwrap().decision.is_granted());
        assert!(!pg.undo(undo("w-2", vec![])).await.unwrap(), "no place, no costs: unchanged");
        assert_eq!(used(figures(&pg, &w2).await), [Some((1, 2))]);
        // Settled up: it counts more.
        let w3 = named("w-3", vec![window("w", 3, 60_000)]);
        assert!(pg.acquire(w3.clone()).await.unwrap().decision.is_granted());
        assert!(pg.undo(undo("w-3", vec![Cost::new("w", 2)])).await.unwrap());
        assert_eq!(used(figures(&pg, &w3).await), [Some((3, 0))]);
        // A filing.
        assert!(
            pg.acquire(AcquireRequest::new("filler", vec![window("q", 1, 60_000)]).unwrap())
                .await
                .unwrap()
                .decision
                .is_granted()
        );
        let f = named("f-1", vec![window("q", 1, 60_000)]).with_queue();
        let ticket = pg.acquire(f.clone()).await.unwrap().ticket.expect("filed");
        assert!(pg.undo(undo("f-1", vec![Cost::new("nowhere", 0)])).await.unwrap(), "the ticket leaves");
        assert_eq!(figures(&pg, &f).await[0].queued, None, "the line is empty");
        assert!(!pg.leave(LeaveRequest::new(ticket.id.to_string()).unwrap()).await.unwrap(), "gone");
        assert!(!pg.undo(undo("f-1", vec![])).await.unwrap(), "once");
        assert!(bad_request(pg.acquire(f).await).starts_with("id was released"));
    });
}

/// `release {id}` of an id never seen is false and remembers it released: the acquire arriving
/// after it (the original, delayed on the way) is a bad request naming `id` and counts nothing,
/// for a minute at least.
#[test]
fn an_id_released_before_its_acquire_arrives_changes_nothing() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        use redb_limiter::request::{Cost, UndoRequest};
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ids_early", clock.clone()).await;
        let early = UndoRequest::with_costs("\0early\u{1}", vec![Cost::new("w", 0)]).unwrap();
        assert!(!pg.undo(early).await.unwrap(), "an id never seen");
        let late = named("\0early\u{1}", vec![window("w", 1, 60_000)]);
        clock.advance(59_999);
        assert!(bad_request(pg.acquire(late.clone()).await).starts_with("id was released"));
        assert_eq!(figures(&pg, &late).await[0].window, Some((0, 1)), "nothing counted");
        // Its minute passed, the id may be used afresh (a key differing only in its escape
        // characters is another id).
        let other = named("\u{1}early\0", vec![window("elsewhere", 1, 60_000)]);
        assert!(pg.acquire(other).await.unwrap().decision.is_granted());
        clock.advance(1);
        assert!(pg.acquire(late).await.unwrap().decision.is_granted());
    });
}

/// An id is remembered for a minute, and while the permit it got or the ticket it filed lives;
/// after that it is decided afresh, and the sweeper forgets it (a minute past its time, as it
/// deletes what a decision in flight might still read), keeping a record whose ticket still
/// lives until that ticket lapses.
#[test]
fn ids_are_remembered_their_time_then_swept() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ids_sweep", clock.clone()).await;
        let client = plain_client(&url).await;
        let g = named("g-1", vec![window("g", 10, 60_000)]);
        assert_eq!(pg.acquire(g.clone()).await.unwrap().decision, Decision::Granted { at: T0, permit: None });
        let h = named("h-1", vec![Limit::concurrent("h", 1).with_hold_ms(120_000)]);
        let held = pg.acquire(h.clone()).await.unwrap().decision;
        assert!(held.is_granted());
        // A ticket whose caller is throttled: renewed, it lives until the throttle ends, past its
        // id's minute.
        assert!(
            pg.acquire(AcquireRequest::new("filler", vec![window("t", 1, 1000)]).unwrap())
                .await
                .unwrap()
                .decision
                .is_granted()
        );
        let t = AcquireRequest::new("queuer", vec![window("t", 1, 1000)]).unwrap().with_queue().with_id("t-1").unwrap();
        let filed = pg.acquire(t.clone()).await.unwrap();
        let ticket = filed.ticket.expect("filed");
        pg.throttle(ThrottleRequest::new("queuer", T0.plus(150_000), T0).unwrap()).await.unwrap();
        clock.advance(1000);
        let renewal = AcquireRequest { id: None, ..t.clone() }.with_ticket(ticket.id.to_string()).unwrap();
        let renewed = pg.acquire(renewal).await.unwrap().ticket.expect("renewed");
        assert_eq!(renewed.lapse_at, T0.plus(152_000));

        clock.set(T0.plus(59_999));
        assert_eq!(pg.acquire(g.clone()).await.unwrap().decision, Decision::Granted { at: T0, permit: None });
        clock.set(T0.plus(60_000));
        assert_eq!(
            pg.acquire(g.clone()).await.unwrap().decision,
            Decision::Granted { at: T0.plus(60_000), permit: None },
            "forgotten after its minute: decided afresh"
        );
        assert_eq!(pg.acquire(h.clone()).await.unwrap().decision, held, "its permit lives");
        let again = pg.acquire(t.clone()).await.unwrap();
        assert_eq!(
            (again.decision, again.ticket.map(|n| (n.id, n.lapse_at))),
            (filed.decision.clone(), Some((ticket.id, T0.plus(152_000))))
        );
        pg.sweep(1000).await.unwrap();
        assert_eq!(records(&client, &pg).await, 3, "nothing is due a minute before now");
        // A minute past the ticket's record: kept while its ticket lives.
        clock.set(T0.plus(125_000));
        pg.sweep(1000).await.unwrap();
        assert_eq!(records(&client, &pg).await, 3);
        let again = pg.acquire(t.clone()).await.unwrap();
        assert_eq!(again.ticket.map(|n| n.id), Some(ticket.id), "the ticket lives: remembered");
        // Past every record's time and the ticket's lapse, by a minute: all forgotten.
        clock.set(T0.plus(215_000));
        assert!(pg.sweep(1000).await.unwrap() >= 3);
        assert_eq!(records(&client, &pg).await, 0);
        assert!(pg.acquire(h).await.unwrap().decision.is_granted(), "decided afresh");
        assert!(pg.acquire(t).await.unwrap().decision.is_granted(), "decided afresh");
    });
}

/// Section 16 across servers: in each of 20 trials one id is presented at once from eight
/// sessions through two servers on one schema. A grant counts once (every answer the same
/// instant and permit; the window and the places hold one); a filing files one ticket, which
/// every answer names; and an acquire racing its own `release {id}` either is granted and then
/// undone, or arrives after it and is refused: no place is left held.
#[test]
fn one_id_presented_at_once_through_two_servers_counts_once() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let (a, b) = two_servers(&url, "ids_once", &clock).await;
        let at_once = |req: AcquireRequest| {
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let pg = Arc::clone(if i % 2 == 0 { &a } else { &b });
                    let req = req.clone();
                    tokio::spawn(async move { pg.acquire(req).await.unwrap() })
                })
                .collect();
            async move {
                let mut answers = Vec::new();
                for task in tasks {
                    answers.push(task.await.unwrap());
                }
                answers
            }
        };
        for trial in 0..20 {
            clock.advance(1);
            let grant = named(
                &format!("g-{trial}"),
                vec![window(&format!("w{trial}"), 100, 60_000), Limit::concurrent(format!("c{trial}"), 100)],
            );
            let answers = at_once(grant.clone()).await;
            assert!(answers[0].decision.is_granted(), "{:?}", answers[0]);
            assert!(answers.iter().all(|x| x.decision == answers[0].decision), "trial {trial}: {answers:?}");
            let counted: Vec<_> = figures(&a, &grant).await.iter().map(|f| (f.window, f.places)).collect();
            assert_eq!(counted, [(Some((1, 99)), None), (None, Some((1, 99)))], "trial {trial}: counted once");

            let full = AcquireRequest::new("filler", vec![window(&format!("q{trial}"), 1, 60_000)]).unwrap();
            assert!(a.acquire(full).await.unwrap().decision.is_granted());
            let filing = named(&format!("f-{trial}"), vec![window(&format!("q{trial}"), 1, 60_000)]).with_queue();
            let answers = at_once(filing.clone()).await;
            let tickets: std::collections::BTreeSet<_> =
                answers.iter().map(|x| x.ticket.expect("a ticket named").id).collect();
            assert_eq!(tickets.len(), 1, "trial {trial}: {answers:?}");
            assert_eq!(figures(&b, &filing).await[0].queued, Some(1), "trial {trial}: one ticket");

            let place = named(&format!("o-{trial}"), vec![Limit::concurrent(format!("o{trial}"), 1)]);
            let undo = redb_limiter::request::UndoRequest::new(format!("o-{trial}")).unwrap();
            let (acquire, undo) = {
                let (a, b) = (Arc::clone(&a), Arc::clone(&b));
                let acquire = tokio::spawn(async move { a.acquire(place).await });
                let undo = tokio::spawn(async move { b.undo(undo).await.unwrap() });
                (acquire.await.unwrap(), undo.await.unwrap())
            };
            match (&acquire, undo) {
                (Ok(got), true) => assert!(got.decision.is_granted(), "{got:?}"),
                (Err(LimiterError::BadRequest(e)), false) => assert!(e.0.starts_with("id was released"), "{e}"),
                other => panic!("trial {trial}: {other:?}"),
            }
            let free = AcquireRequest::new("x", vec![Limit::concurrent(format!("o{trial}"), 1)]).unwrap();
            assert_eq!(a.peek(free).await.unwrap().report.limits[0].places, Some((0, 1)), "trial {trial}");
        }
    });
}

/// What a line of wide tickets costs requests on other buckets (section 12.9's cost rule;
/// `cargo test --release -p redb-limiter-postgres --test postgres -- --ignored --nocapture
/// wide_line`): `REDB_LIMITER_PG_WIDE_TICKETS` (default 200) live tickets of 64 limits each in
/// the same 64 buckets, every one reserved in each line. Grants on a bucket of their own, one at
/// a time (`REDB_LIMITER_PG_TIMING_N`, default 1000), are timed with no line, beside the line,
/// and beside the line while one more connection asks a refused request naming the 64 buckets
/// over and over (each walks every line); prints the medians, their ratios to the first, and
/// what filing the tickets and one such refusal cost.
#[test]
#[ignore = "a measurement: prints figures, asserts nothing"]
fn measure_a_wide_line_beside_another_bucket() {
    let Some(url) = database_url() else { return };
    let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (tickets, n) = (var("REDB_LIMITER_PG_WIDE_TICKETS", 200), var("REDB_LIMITER_PG_TIMING_N", 1000));
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = Arc::new(fresh(&url, "wide_line", clock.clone()).await);
        let wide = |cost: u64| {
            let limits = (0..64).map(|i| window(&format!("w{i:02}"), 1000, 200_000).with_cost(cost)).collect();
            AcquireRequest::new("wide", limits).unwrap()
        };
        let other = AcquireRequest::new("other", vec![window("other", 1_000_000_000, 60_000)]).unwrap();
        let median_us = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let grants = |pg: Arc<PgLimiter>| {
            let (clock, other) = (clock.clone(), other.clone());
            async move {
                let mut spent = Vec::with_capacity(n);
                for i in 0..n + n / 10 {
                    clock.advance(1);
                    let started = std::time::Instant::now();
                    assert!(pg.acquire(other.clone()).await.unwrap().decision.is_granted());
                    // The first ones warm the sessions and the caches up: not counted.
                    if i >= n / 10 {
                        spent.push(started.elapsed().as_secs_f64() * 1e6);
                    }
                }
                median_us(spent)
            }
        };
        let alone = grants(pg.clone()).await;
        // Every wide bucket full until +200 s; each ticket (cost 1) is reserved there, in each line.
        assert!(pg.acquire(wide(1000)).await.unwrap().decision.is_granted());
        clock.advance(1);
        let started = std::time::Instant::now();
        for _ in 0..tickets {
            assert!(pg.acquire(wide(1).with_queue()).await.unwrap().ticket.is_some(), "filed");
        }
        let filing_ms = started.elapsed().as_secs_f64() * 1e3 / tickets as f64;
        let started = std::time::Instant::now();
        assert!(!pg.acquire(wide(1)).await.unwrap().decision.is_granted());
        let walk_ms = started.elapsed().as_secs_f64() * 1e3;
        let beside = grants(pg.clone()).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let walker = {
            let (pg, stop, wide) = (pg.clone(), stop.clone(), wide(1));
            tokio::spawn(async move {
                let mut walks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    assert!(!pg.acquire(wide.clone()).await.unwrap().decision.is_granted());
                    walks += 1;
                }
                walks
            })
        };
        let loaded = grants(pg.clone()).await;
        stop.store(true, Ordering::Relaxed);
        let walks = walker.await.unwrap();
        eprintln!(
            "{tickets} tickets of 64 limits: filing one {filing_ms:.1} ms (mean), a refusal walking every line \
             {walk_ms:.1} ms; a grant on another bucket, median of {n}: alone {alone:.0} us, beside the line \
             {beside:.0} us = {:.2}x, beside the line and a connection walking it ({walks} walks) {loaded:.0} us \
             = {:.2}x",
            beside / alone,
            loaded / alone
        );
    });
}

/// What an acquire named by an id costs beside one without (`cargo test -p redb-limiter-postgres
/// --test postgres -- --ignored --nocapture acquire_costs`): `REDB_LIMITER_PG_TIMING_N` (default
/// 2000) acquires one at a time of each kind and mode, the modes taking turns acquire by acquire
/// (so that the machine's load weighs on each alike), on the injected clock moving a millisecond
/// per acquire; prints the median and mean per acquire and the ratios of the medians.
/// `REDB_LIMITER_PG_TIMING_MODES` (default `0,1,2`) picks the modes: 0 without id, 1 with a new
/// id each, 2 the same id again; `0` alone times what an acquire without id costs, on a database
/// doing nothing else, to compare builds.
#[test]
#[ignore = "a measurement: prints figures, asserts nothing"]
fn acquire_costs_with_and_without_id() {
    let Some(url) = database_url() else { return };
    let n: usize = std::env::var("REDB_LIMITER_PG_TIMING_N").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let modes: Vec<usize> = std::env::var("REDB_LIMITER_PG_TIMING_MODES")
        .unwrap_or_else(|_| "0,1,2".into())
        .split(',')
        .filter_map(|m| m.trim().parse().ok())
        .filter(|m| *m < 3)
        .collect();
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "ids_timing", clock.clone()).await;
        let kinds: [(&str, Vec<Limit>); 2] = [
            ("one window", vec![window("tw", 1_000_000_000, 60_000)]),
            ("window and place", vec![window("pw", 1_000_000_000, 60_000), Limit::concurrent("pc", 1_000)]),
        ];
        let retries: Vec<AcquireRequest> =
            kinds.iter().enumerate().map(|(k, (_, limits))| named(&format!("retry-{k}"), limits.clone())).collect();
        for retry in &retries {
            assert!(pg.acquire(retry.clone()).await.unwrap().decision.is_granted());
        }
        // [kind][mode: 0 no id, 1 a new id each, 2 the same id again (a retry)]: microseconds.
        let mut samples: [[Vec<f64>; 3]; 2] = Default::default();
        let warm = n / 10;
        for i in 0..warm + n {
            for (k, (_, limits)) in kinds.iter().enumerate() {
                for turn in 0..modes.len() {
                    let mode = modes[(i + turn) % modes.len()];
                    clock.advance(1);
                    let req = match mode {
                        0 => AcquireRequest::new("caller", limits.clone()).unwrap(),
                        1 => named(&format!("id-{k}-{i}"), limits.clone()),
                        _ => retries[k].clone(),
                    };
                    let started = std::time::Instant::now();
                    let got = pg.acquire(req).await.unwrap().decision;
                    let spent = started.elapsed();
                    // The first acquires warm the sessions and the caches up: not counted.
                    if i >= warm {
                        samples[k][mode].push(spent.as_secs_f64() * 1e6);
                    }
                    // Places are released (not timed), so that each acquire finds a few.
                    if let (Decision::Granted { permit: Some(p), .. }, true) = (got, mode != 2) {
                        assert!(pg.release(ReleaseRequest::new(p.to_string()).unwrap()).await.unwrap());
                    }
                }
            }
        }
        for (k, (kind, _)) in kinds.iter().enumerate() {
            let [plain, id, again] = samples[k].clone().map(|mut v| {
                v.sort_by(f64::total_cmp);
                if v.is_empty() {
                    (f64::NAN, f64::NAN)
                } else {
                    (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64)
                }
            });
            eprintln!(
                "{kind}: median (mean) without id {:.0} us ({:.0}), with a new id {:.0} us ({:.0}) = {:.2}x, \
                 a retry answered again {:.0} us ({:.0}) = {:.2}x",
                plain.0,
                plain.1,
                id.0,
                id.1,
                id.0 / plain.0,
                again.0,
                again.1,
                again.0 / plain.0
            );
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Wake-ups (wire section 15). The recheck is a minute and every wait's timeout half a minute, so
// a wait answered within a few seconds was woken by the change, never by a timer; the fake
// clock stands still unless a test moves it.

mod wakes {
    use super::*;
    use redb_limiter::limiter::WaitAnswer;
    use redb_limiter::request::{Cost, LeaveRequest, LiftRequest, SettleRequest, UndoRequest, WaitRequest};
    use std::time::Duration;

    /// A limiter whose recheck is a minute, on the test's clock.
    async fn limiter(
        url: &str,
        name: &str,
        clock: &Arc<FakeClock>,
        set: impl FnOnce(&mut PgOptions),
    ) -> Arc<PgLimiter> {
        Arc::new(
            fresh_options(url, name, clock.clone(), |o| {
                o.recheck_ms = 60_000;
                set(o);
            })
            .await,
        )
    }

    /// A wait on `ticket` (timeout 30 s), once it is registered: it answers only when woken.
    async fn waiting(pg: &Arc<PgLimiter>, ticket: &str) -> tokio::task::JoinHandle<WaitAnswer> {
        let before = pg.pending_waits();
        let (pg2, req) = (pg.clone(), WaitRequest::new(vec![ticket.to_owned()], 30_000).unwrap());
        let wait = tokio::spawn(async move { pg2.wait(req).await.unwrap() });
        let registered = tokio::time::Instant::now() + Duration::from_secs(10);
        while pg.pending_waits() == before {
            assert!(!wait.is_finished(), "the wait answered before the change");
            assert!(tokio::time::Instant::now() < registered, "the wait never registered");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!wait.is_finished(), "the wait answered before the change");
        wait
    }

    /// The wait's answer, which must come within 10 s (the timers say 30 s and a minute): `ready`
    /// holds `ticket`.
    async fn woken(wait: tokio::task::JoinHandle<WaitAnswer>, ticket: &str, by: &str) {
        let answer = tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("{by} woke no wait"))
            .unwrap();
        assert_eq!((answer.ready, answer.gone), (vec![ticket.to_owned()], vec![]), "{by}");
    }

    async fn ticket_of(pg: &PgLimiter, req: &AcquireRequest) -> String {
        let acquired = pg.acquire(req.clone().with_queue()).await.unwrap();
        assert!(!acquired.decision.is_granted(), "{acquired:?}");
        acquired.ticket.expect("a ticket").id.to_string()
    }

    async fn permit_of(pg: &PgLimiter, req: AcquireRequest) -> String {
        match pg.acquire(req).await.unwrap().decision {
            Decision::Granted { permit: Some(permit), .. } => permit.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_wait_is_woken_by_every_kind_of_change_that_can_make_its_ticket_ready() {
        let Some(url) = database_url() else { return };
        runtime().block_on(async {
            let clock = Arc::new(FakeClock::new(T0));
            let pg = limiter(&url, "wakes", &clock, |_| {}).await;

            // A release frees the place its ticket waits for; then a lift of its caller's throttle.
            let one = AcquireRequest::new("k", vec![Limit::concurrent("c1", 1)]).unwrap();
            let permit = permit_of(&pg, one.clone()).await;
            let ticket = ticket_of(&pg, &one).await;
            let wait = waiting(&pg, &ticket).await;
            assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
            woken(wait, &ticket, "a release").await;
            let until = clock.now().plus(600_000);
            pg.throttle(ThrottleRequest::new("k", until, clock.now()).unwrap()).await.unwrap();
            let wait = waiting(&pg, &ticket).await;
            assert!(pg.lift(LiftRequest::new("k").unwrap()).await.unwrap());
            woken(wait, &ticket, "a lift").await;
            let granted = pg.acquire(one.clone().with_ticket(ticket).unwrap()).await.unwrap();
            assert!(granted.decision.is_granted(), "ready, and granted when asked: {granted:?}");

            // A ticket ahead (naming x, whose place is held, and y) is granted, or leaves, or
            // lapses: the ticket behind it in y's line is ready.
            let ahead = AcquireRequest::new("k", vec![Limit::concurrent("x", 1), Limit::concurrent("y", 2)]).unwrap();
            let behind = AcquireRequest::new("j", vec![Limit::concurrent("y", 2)]).unwrap();
            let x = AcquireRequest::new("h", vec![Limit::concurrent("x", 1)]).unwrap();
            for how in ["granted", "left", "lapsed"] {
                let held = permit_of(&pg, x.clone()).await;
                let first = ticket_of(&pg, &ahead.clone().with_grace_ms(100).unwrap()).await;
                let second = ticket_of(&pg, &behind.clone().with_grace_ms(60_000).unwrap()).await;
                assert!(pg.release(ReleaseRequest::new(held).unwrap()).await.unwrap());
                let wait = waiting(&pg, &second).await;
                let mut release = None;
                match how {
                    "granted" => {
                        let req = ahead.clone().with_grace_ms(100).unwrap().with_ticket(first).unwrap();
                        release = Some(permit_of(&pg, req).await);
                    }
                    "left" => assert!(pg.leave(LeaveRequest::new(first).unwrap()).await.unwrap()),
                    _ => {
                        // Past the first ticket's lapse (its recheck and grace), and the sweep.
                        clock.advance(60_200);
                        assert!(pg.sweep(1_000).await.unwrap() > 0);
                    }
                }
                woken(wait, &second, &format!("a ticket ahead {how}")).await;
                let req = behind.clone().with_grace_ms(60_000).unwrap().with_ticket(second).unwrap();
                assert!(pg.release(ReleaseRequest::new(permit_of(&pg, req).await).unwrap()).await.unwrap());
                if let Some(permit) = release {
                    assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
                }
            }

            // A settle down makes room in a window; so does release {id} with costs of 0.
            let w = |cost| AcquireRequest::new("k", vec![window("w", 10, 60_000).with_cost(cost)]).unwrap();
            let permit = permit_of(&pg, w(10).with_permit()).await;
            let ticket = ticket_of(&pg, &w(5)).await;
            let wait = waiting(&pg, &ticket).await;
            assert!(pg.settle(SettleRequest::new(permit, vec![Cost::new("w", 2)]).unwrap()).await.unwrap());
            woken(wait, &ticket, "a settle down").await;
            assert!(pg.acquire(w(5).with_ticket(ticket).unwrap()).await.unwrap().decision.is_granted());
            let granted = pg.acquire(w(3).with_id("r-1").unwrap()).await.unwrap();
            assert!(granted.decision.is_granted(), "{granted:?}");
            let ticket = ticket_of(&pg, &w(3)).await;
            let wait = waiting(&pg, &ticket).await;
            assert!(pg.undo(UndoRequest::with_costs("r-1", vec![Cost::new("w", 0)]).unwrap()).await.unwrap());
            woken(wait, &ticket, "release {id}").await;
            assert_eq!(pg.pending_waits(), 0, "every wait unregistered");
        });
    }

    /// A change that frees nothing where a ticket waits notifies nobody: a settle up, a release
    /// in a bucket without a line, an unknown permit or ticket, a lift of no throttle.
    #[test]
    fn a_change_that_frees_nothing_sends_no_notification() {
        let Some(url) = database_url() else { return };
        runtime().block_on(async {
            let clock = Arc::new(FakeClock::new(T0));
            let pg = limiter(&url, "quiet", &clock, |_| {}).await;
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut connection = connection;
            tokio::spawn(async move {
                while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    if let tokio_postgres::AsyncMessage::Notification(n) = message {
                        let _ = tx.send(n.payload().to_owned());
                    }
                }
            });
            client.batch_execute(&format!("LISTEN \"{}\"", pg.schema())).await.unwrap();
            let conc = AcquireRequest::new("k", vec![Limit::concurrent("free", 1)]).unwrap();
            let permit = permit_of(&pg, conc).await;
            assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
            let w = AcquireRequest::new("k", vec![window("w", 10, 3_600_000).with_cost(2)]).unwrap().with_permit();
            let permit = permit_of(&pg, w).await;
            assert!(pg.settle(SettleRequest::new(permit.clone(), vec![Cost::new("w", 9)]).unwrap()).await.unwrap());
            assert!(!pg.release(ReleaseRequest::new("p-nobody").unwrap()).await.unwrap());
            assert!(!pg.leave(LeaveRequest::new("t-nobody").unwrap()).await.unwrap());
            assert!(!pg.lift(LiftRequest::new("k").unwrap()).await.unwrap());
            // Then one that does (a release where a ticket waits): the first notification seen.
            let one = AcquireRequest::new("k", vec![Limit::concurrent("lined", 1)]).unwrap();
            let held = permit_of(&pg, one.clone()).await;
            ticket_of(&pg, &one).await;
            assert!(pg.release(ReleaseRequest::new(held).unwrap()).await.unwrap());
            let first = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
            assert_eq!(first, "lined", "the changes before it notified nothing");
            assert!(rx.try_recv().is_err());
        });
    }

    /// While waited, a ticket does not lapse (up to its horizon, which the wait never extends);
    /// past the bound a wait answers at once; `end_waits` answers every pending wait at once,
    /// and every later one.
    #[test]
    fn a_waited_ticket_is_held_the_bound_answers_at_once_and_end_waits_answers_all() {
        let Some(url) = database_url() else { return };
        runtime().block_on(async {
            let clock = Arc::new(FakeClock::new(T0));
            let pg = limiter(&url, "held", &clock, |o| {
                o.recheck_ms = 1_000;
                o.max_waits = 2;
            })
            .await;
            let db = plain_client(&url).await;
            let lapse = |ticket: String| {
                let (db, schema) = (&db, pg.schema().to_owned());
                async move {
                    let sql = format!("SELECT lapse_at FROM \"{schema}\".tickets WHERE ticket = $1");
                    db.query_one(&sql, &[&ticket]).await.unwrap().get::<_, i64>(0) as u64
                }
            };
            let one = |key: &str| AcquireRequest::new("k", vec![Limit::concurrent(key, 1)]).unwrap();
            permit_of(&pg, one("a")).await;
            permit_of(&pg, one("b")).await;
            // Grace 100 ms: told the recheck (1 s), it would lapse 1.1 s after its filing.
            // Its horizon 20 s (maxWaitMs): it never lapses later.
            let a = ticket_of(&pg, &one("a").with_grace_ms(100).unwrap().with_max_wait_ms(20_000).unwrap()).await;
            assert_eq!(lapse(a.clone()).await, T0.plus(1_100).0);
            let wait_a = waiting(&pg, &a).await;
            assert_eq!(lapse(a.clone()).await, T0.plus(20_000).0, "held to its horizon, not past it");
            clock.advance(2_000);
            let b = ticket_of(&pg, &one("b").with_grace_ms(100).unwrap()).await;
            let wait_b = waiting(&pg, &b).await;
            assert_eq!(lapse(b.clone()).await, T0.plus(2_000 + 30_000 + 100).0, "held for the wait and its grace");
            // Past every lapse it was told: still in line, and the sweep leaves it.
            clock.advance(5_000);
            pg.sweep(1_000).await.unwrap();
            let again = pg.acquire(one("b").with_grace_ms(100).unwrap().with_ticket(b.clone()).unwrap()).await.unwrap();
            assert_eq!(again.ticket.map(|t| t.id.to_string()), Some(b.clone()), "the same ticket, still live");
            assert_eq!(pg.pending_waits(), 2);
            // The bound: a third wait answers at once, with empty lists, and holds nothing.
            let started = std::time::Instant::now();
            let third = pg.wait(WaitRequest::new(vec![b.clone()], 30_000).unwrap()).await.unwrap();
            assert!((third.ready.is_empty(), third.gone.is_empty()) == (true, true), "{third:?}");
            assert!(started.elapsed() < Duration::from_secs(5), "answered at once past the bound");
            pg.end_waits();
            for wait in [wait_a, wait_b] {
                let answer =
                    tokio::time::timeout(Duration::from_secs(5), wait).await.expect("answered at once").unwrap();
                assert!(answer.ready.is_empty() && answer.gone.is_empty(), "{answer:?}");
            }
            let started = std::time::Instant::now();
            let later = pg.wait(WaitRequest::new(vec![a, "t-nobody".into()], 30_000).unwrap()).await.unwrap();
            assert_eq!(later.gone, vec!["t-nobody".to_owned()]);
            assert!(started.elapsed() < Duration::from_secs(5), "a later wait answers at once");
            assert_eq!(pg.pending_waits(), 0);
        });
    }

    /// A listener whose connection is cut opens it again, and wakes every wait once (a
    /// notification sent meanwhile may have been missed); a wake then reaches the waits again.
    #[test]
    fn a_lost_listener_connection_is_opened_again_and_wakes_every_wait() {
        let Some(url) = database_url() else { return };
        runtime().block_on(async {
            let clock = Arc::new(FakeClock::new(T0));
            let pg = limiter(&url, "relisten", &clock, |_| {}).await;
            let db = plain_client(&url).await;
            let one = AcquireRequest::new("k", vec![Limit::concurrent("c", 1)]).unwrap();
            let permit = permit_of(&pg, one.clone()).await;
            let ticket = ticket_of(&pg, &one).await;
            let wait = waiting(&pg, &ticket).await;
            let name = format!("redb-limiter/{}/wakes", pg.schema());
            let cut = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1";
            let cut: i64 = db.query_one(cut, &[&name]).await.unwrap().get(0);
            assert_eq!(cut, 1, "one listener connection");
            // Woken once by the reconnection: not ready yet, it waits again.
            let listening = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while db.query_one(listening, &[&name]).await.unwrap().get::<_, i64>(0) == 0 {
                assert!(tokio::time::Instant::now() < deadline, "the listener never came back");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            assert!(!wait.is_finished());
            assert!(pg.release(ReleaseRequest::new(permit).unwrap()).await.unwrap());
            woken(wait, &ticket, "a release after the listener came back").await;
        });
    }
}

// Token buckets (section 13).

/// An acquire of `cost` from the token bucket `key`: `refill` per `per_ms`, a burst of `burst`.
fn tokens(caller: &str, key: &str, (refill, per_ms, burst): (u64, u64, u64), cost: u64) -> AcquireRequest {
    AcquireRequest::new(caller, vec![Limit::bucket(key, refill, per_ms).with_burst(burst).with_cost(cost)]).unwrap()
}

/// The level and burst of `req`'s first limit, read by a peek.
async fn level(pg: &PgLimiter, req: &AcquireRequest) -> Option<(i64, u64)> {
    figures(pg, req).await[0].bucket
}

/// Two servers on one schema, four sessions each, all asking one bucket (10 a second, a burst
/// of 10) at once every 50 ms for two seconds: the tokens granted by any instant never exceed
/// the burst plus the refill since the start, and every token that refilled is granted (the
/// demand always exceeds it).
#[test]
fn two_servers_sharing_one_bucket_never_grant_more_than_it_refills() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let (a, b) = two_servers(&url, "shared_bucket", &clock).await;
        let req = tokens("c", "shared", (10, 1000, 10), 1);
        let mut grants = Vec::new();
        for _ in 0..=40 {
            let asks: Vec<_> = (0..8)
                .map(|i| {
                    let pg = if i % 2 == 0 { a.clone() } else { b.clone() };
                    let req = req.clone();
                    tokio::spawn(async move { pg.acquire(req).await })
                })
                .collect();
            for ask in asks {
                if let Decision::Granted { at, .. } = ask.await.unwrap().unwrap().decision {
                    grants.push(at);
                }
            }
            clock.advance(50);
        }
        grants.sort();
        for (n, at) in grants.iter().enumerate() {
            let bound = 10 + 10 * at.since(T0) / 1000;
            assert!((n as u64) < bound, "grant {} at +{} ms: above the bound {bound}", n + 1, at.since(T0));
        }
        assert_eq!(grants.len(), 30, "10 at first, then 10 a second for 2 s: {grants:?}");
        assert_eq!(level(&a, &req).await, Some((0, 10)));
        assert_eq!(level(&b, &req).await, Some((0, 10)));
    });
}

/// A restart refills the level kept by the time that passed, never more: a bucket emptied, then
/// every server stopped and started again 3.5 s later (a token a second) holds 3 tokens.
#[test]
fn a_restart_keeps_a_bucket_level_and_refills_it_only_by_the_time_that_passed() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "bucket_restart", clock.clone()).await;
        let schema = pg.schema().to_owned();
        let figures = (1, 1000, 10);
        assert!(pg.acquire(tokens("c", "b", figures, 10)).await.unwrap().decision.is_granted());
        drop(pg);
        clock.set(T0.plus(3500));
        let pg = open_existing(&url, &schema, &clock).await.unwrap();
        assert_eq!(level(&pg, &tokens("c", "b", figures, 1)).await, Some((3, 10)));
        let state = pg.state("b", 10).await.unwrap();
        assert_eq!(
            state.view.buckets.iter().map(|b| (b.key.as_str(), b.level)).collect::<Vec<_>>(),
            [("b", Some((3, 10)))]
        );
        assert_eq!(
            pg.acquire(tokens("c", "b", figures, 4)).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(4000), reason: Reason::Rate, limit: "b".into() }
        );
        assert!(pg.acquire(tokens("c", "b", figures, 3)).await.unwrap().decision.is_granted());
        assert_eq!(level(&pg, &tokens("c", "b", figures, 1)).await, Some((0, 10)));
    });
}

/// Settle on a bucket (section 13): a cost settled down goes back into the level (never above
/// the burst), one settled up is taken from it, below 0 in debt, which later calls wait out;
/// `/state` shows the debt.
#[test]
fn settle_refunds_a_bucket_up_to_its_burst_and_takes_it_into_debt() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "bucket_settle", clock.clone()).await;
        let figures = (10, 1000, 10);
        let one = tokens("c", "b", figures, 1);
        let settle = |p: String, cost| {
            redb_limiter::request::SettleRequest::new(p, vec![redb_limiter::request::Cost::new("b", cost)]).unwrap()
        };
        let a = permit_of(&pg, tokens("c", "b", figures, 4)).await;
        assert_eq!(level(&pg, &one).await, Some((6, 10)));
        assert!(pg.settle(settle(a.clone(), 1)).await.unwrap());
        assert_eq!(level(&pg, &one).await, Some((9, 10)), "3 back");
        assert!(pg.settle(settle(a.clone(), 0)).await.unwrap());
        assert_eq!(level(&pg, &one).await, Some((10, 10)), "never above burst");
        let b = permit_of(&pg, tokens("c", "b", figures, 5)).await;
        let c = permit_of(&pg, tokens("c", "b", figures, 5)).await;
        assert_eq!(level(&pg, &one).await, Some((0, 10)));
        assert!(pg.settle(settle(b, 50)).await.unwrap());
        assert_eq!(level(&pg, &one).await, Some((-5, 10)), "a cost above burst settles at burst: 5 more, in debt");
        let state = pg.state("b", 10).await.unwrap();
        assert_eq!(state.view.buckets[0].level, Some((-5, 10)));
        assert_eq!(
            pg.acquire(one.clone()).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(600), reason: Reason::Rate, limit: "b".into() }
        );
        // release with costs settles first: 5 back from the debt.
        let release =
            ReleaseRequest { permit: c, costs: vec![redb_limiter::request::Cost::new("b", 0)], outcome: None };
        assert!(pg.release(release).await.unwrap());
        assert_eq!(level(&pg, &one).await, Some((0, 10)));
        clock.advance(100);
        assert!(pg.acquire(one).await.unwrap().decision.is_granted());
    });
}

/// The permit of a grant of `req` asked with a permit (to settle later).
async fn permit_of(pg: &PgLimiter, mut req: AcquireRequest) -> String {
    req.permit = true;
    match pg.acquire(req).await.unwrap().decision {
        Decision::Granted { permit: Some(p), .. } => p.to_string(),
        other => panic!("{other:?}"),
    }
}

/// The line on a bucket (sections 12 and 13): a large cost queued on an empty bucket is told
/// rule B's instant; a small request behind it that would leave it short at that instant is told
/// its own instant behind it (no backfill), one that leaves it enough is granted at once; the
/// large ticket is granted at its instant, then the small one at its own.
#[test]
fn the_line_on_a_bucket_keeps_a_large_cost_first() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "bucket_line", clock.clone()).await;
        // A token every 100 ms, a burst of 5, and a window beside it that never refuses.
        let figures = (1, 100, 5);
        assert!(pg.acquire(tokens("c", "b", figures, 5)).await.unwrap().decision.is_granted());
        let large = pg.acquire(tokens("large", "b", figures, 5).with_queue()).await.unwrap();
        assert_eq!(
            large.decision,
            Decision::Refused { retry_at: T0.plus(500), reason: Reason::Rate, limit: "b".into() }
        );
        let ticket = large.ticket.expect("filed").id.to_string();
        clock.set(T0.plus(100));
        let small = pg.acquire(tokens("small", "b", figures, 1)).await.unwrap();
        assert_eq!(
            small.decision,
            Decision::Refused { retry_at: T0.plus(600), reason: Reason::Rate, limit: "b".into() },
            "a token taken now leaves the large cost short at 500 ms: behind it"
        );
        assert_eq!(level(&pg, &tokens("small", "b", figures, 1)).await, Some((1, 5)));
        clock.set(T0.plus(500));
        let granted = pg.acquire(tokens("large", "b", figures, 5).with_ticket(ticket).unwrap()).await.unwrap();
        assert_eq!(granted.decision, Decision::Granted { at: T0.plus(500), permit: None });
        clock.set(T0.plus(600));
        assert!(pg.acquire(tokens("small", "b", figures, 1)).await.unwrap().decision.is_granted());
    });
}

/// Exactness over a long run (section 13): a host asking one bucket of 7 tokens a second at
/// every retryAt it is told, for 10^6 ms of the injected clock, is told each time the first
/// whole millisecond with a token, and gets exactly the burst plus every token that refilled:
/// no rounding accumulates.
#[test]
fn a_bucket_is_exact_over_a_million_milliseconds() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "bucket_exact", clock.clone()).await;
        let req = tokens("c", "b", (7, 1000, 7), 1);
        let mut granted = 0u64;
        let end = T0.plus(1_000_000);
        while clock.now() <= end {
            match pg.acquire(req.clone()).await.unwrap().decision {
                Decision::Granted { .. } => granted += 1,
                Decision::Refused { retry_at, .. } => {
                    // Refilled tokens after the first 7: token k is whole at ceil(k * 1000 / 7).
                    let k = granted - 7 + 1;
                    assert_eq!(retry_at, T0.plus((k * 1000).div_ceil(7)), "after {granted} tokens");
                    clock.set(retry_at);
                }
            }
        }
        assert_eq!(granted, 7 + 7 * 1_000_000 / 1000);
    });
}

/// One acquire of a token bucket beside one of a window, alternated in one run (granted each
/// time, one session): the medians of 2,000 each, printed side by side. A bucket is decided by
/// `acquire()` (plpgsql), a window by the one statement of `sql/acquire_window.sql`; with a
/// report, both by `acquire()`'s general path.
#[test]
fn a_bucket_acquire_beside_a_window_acquire() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "bucket_bench", clock.clone()).await;
        let window = AcquireRequest::new("c", vec![window("w", 1_000_000_000, 60_000)]).unwrap();
        let bucket = tokens("c", "t", (1_000_000_000, 60_000, 1_000_000_000), 1);
        let reqs = [window.clone(), bucket.clone(), window.with_report(), bucket.with_report()];
        let mut took: [Vec<std::time::Duration>; 4] = Default::default();
        for i in 0..2200 {
            for (req, took) in reqs.iter().zip(took.iter_mut()) {
                let start = std::time::Instant::now();
                assert!(pg.acquire(req.clone()).await.unwrap().decision.is_granted());
                if i >= 200 {
                    took.push(start.elapsed());
                }
            }
            clock.advance(1);
        }
        let [w, b, wr, br] = took.map(|mut t| (percentile_ms(&mut t, 50), percentile_ms(&mut t, 99)));
        eprintln!(
            "acquire, median (p99): window {:.3} ms ({:.3}), token bucket {:.3} ms ({:.3}): {:.2}x; \
             with a report: window {:.3} ms ({:.3}), token bucket {:.3} ms ({:.3}): {:.2}x",
            w.0,
            w.1,
            b.0,
            b.1,
            b.0 / w.0,
            wr.0,
            wr.1,
            br.0,
            br.1,
            br.0 / wr.0
        );
        assert!(b.0 < 20.0 * w.0, "a bucket's acquire stays within reach of a window's");
    });
}

/// A bucket created below its burst is kept while it refills and for its keeping time once full
/// (an hour), so it reads full, not at `initial` again; after that the sweeper forgets it, and
/// the next acquire finds it at `initial` (section 13, `token_bucket::KEPT_FULL_MS`).
#[test]
fn a_full_bucket_is_forgotten_after_its_keeping_time() {
    let Some(url) = database_url() else { return };
    runtime().block_on(async {
        let clock = Arc::new(FakeClock::new(T0));
        let pg = fresh(&url, "bucket_forget", clock.clone()).await;
        let req = |cost| {
            AcquireRequest::new("c", vec![Limit::bucket("b", 1, 1000).with_burst(2).with_initial(0).with_cost(cost)])
                .unwrap()
        };
        // Named by a refusal: created empty, full at +2 s.
        assert_eq!(
            pg.acquire(req(2)).await.unwrap().decision,
            Decision::Refused { retry_at: T0.plus(2000), reason: Reason::Rate, limit: "b".into() }
        );
        let kept = redb_limiter::engine::token_bucket::KEPT_FULL_MS;
        clock.set(T0.plus(2000 + kept - 1));
        pg.sweep(1000).await.unwrap();
        assert_eq!(level(&pg, &req(1)).await, Some((2, 2)), "kept full for its keeping time");
        assert_eq!(pg.state("b", 10).await.unwrap().view.buckets[0].level, Some((2, 2)));
        // Full again at +2 s after this grant; forgotten an hour later; swept past the margin.
        assert!(pg.acquire(req(2)).await.unwrap().decision.is_granted());
        let full_at = T0.plus(2000 + kept - 1 + 2000);
        clock.set(full_at.plus(kept));
        assert!(pg.state("b", 10).await.unwrap().view.buckets.is_empty(), "forgotten");
        clock.set(full_at.plus(kept + 60_000));
        assert!(pg.sweep(1000).await.unwrap() > 0);
        let client = plain_client(&url).await;
        let sql = format!("SELECT count(*) FROM \"{}\".levels", pg.schema());
        assert_eq!(client.query_one(&sql, &[]).await.unwrap().get::<_, i64>(0), 0, "swept");
        assert_eq!(level(&pg, &req(1)).await, Some((0, 2)), "at initial again");
    });
}

/// The figures a bucket is named with in [`figures_op`]: the same bucket with a larger and a
/// smaller burst, another perMs (levels read across units, rounded down) and a slower refill.
const BUCKET_FIGURES: [(u64, u64, u64, u64); 4] = [(100, 1000, 100, 100), (1, 3, 5, 5), (3, 7, 9, 0), (2, 1000, 20, 4)];

/// One step of [`the_database_judges_a_bucket_named_with_other_figures_as_the_engine_does`].
#[derive(Debug, Clone)]
enum BucketOp {
    /// An acquire (with a report; with a permit when flagged) of a cost with figures `i`.
    Acquire(usize, u64, bool),
    /// A settle of the n-th permit to a cost.
    Settle(usize, u64),
    Advance(u64),
}

fn figures_op() -> impl Strategy<Value = BucketOp> {
    prop_oneof![
        5 => (0..BUCKET_FIGURES.len(), 0u64..30, any::<bool>()).prop_map(|(i, c, p)| BucketOp::Acquire(i, c, p)),
        2 => (any::<usize>(), 0u64..40).prop_map(|(n, c)| BucketOp::Settle(n, c)),
        3 => prop::sample::select(vec![1u64, 2, 7, 50, 333, 1000, 4000]).prop_map(BucketOp::Advance),
    ]
}

/// Section 13's deterministic answer for hosts naming one bucket with different figures (each
/// request judged with its own; a level never above the largest burst named): acquires with
/// reports, settles up and down and the state, on the database and on the engine at the same
/// instants.
#[test]
fn the_database_judges_a_bucket_named_with_other_figures_as_the_engine_does() {
    let Some(url) = database_url() else { return };
    let rt = runtime();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: 40, ..ProptestConfig::default() });
    let ops = prop::collection::vec(figures_op(), 1..40);
    runner
        .run(&ops, |ops| {
            rt.block_on(async {
                let clock = Arc::new(FakeClock::new(T0));
                let pg = fresh(&url, "bucket_figures", clock.clone()).await;
                let mut engine = Engine::new(EngineConfig::default());
                let mut effects = Vec::new();
                let mut permits: Vec<(String, String)> = Vec::new();
                for (i, op) in ops.iter().enumerate() {
                    let now = clock.now();
                    match *op {
                        BucketOp::Acquire(f, cost, permit) => {
                            let (refill, per_ms, burst, initial) = BUCKET_FIGURES[f];
                            let limit = Limit::bucket("b", refill, per_ms).with_burst(burst).with_initial(initial);
                            let mut req = AcquireRequest::new("c", vec![limit.with_cost(cost)]).unwrap().with_report();
                            req.permit = permit;
                            let want = engine.acquire(&req, now, &mut effects);
                            let figures = engine.figures(&req, now);
                            let got = pg.acquire(req.clone()).await.unwrap();
                            compare(i, &req, now, &want, &got.decision, &mut permits)?;
                            prop_assert_eq!(Some(figures), got.report.map(|r| r.limits), "op {}: figures", i);
                        }
                        BucketOp::Settle(n, cost) if !permits.is_empty() => {
                            let (e, p) = permits[n % permits.len()].clone();
                            let costs = vec![redb_limiter::request::Cost::new("b", cost)];
                            let want = engine.settle(&e, &costs, now, &mut effects).unwrap().is_settled();
                            let got =
                                pg.settle(redb_limiter::request::SettleRequest::new(p, costs).unwrap()).await.unwrap();
                            prop_assert_eq!(want, got, "op {}: settle", i);
                        }
                        BucketOp::Settle(..) => {}
                        BucketOp::Advance(ms) => {
                            clock.advance(ms);
                            engine.sweep(clock.now(), &mut effects);
                        }
                    }
                    effects.clear();
                    let want = engine.view(clock.now(), "").buckets.iter().map(|b| b.level).collect::<Vec<_>>();
                    let got = pg.state("", 10).await.unwrap().view.buckets.iter().map(|b| b.level).collect::<Vec<_>>();
                    prop_assert_eq!(want, got, "op {}: the level in the state", i);
                }
                Ok(())
            })
        })
        .unwrap();
}
