//! Durability: restarts keep every window, place and throttle; bad files are refused untouched;
//! a failed commit grants nothing and loses nothing committed; the file follows the live keys;
//! group commit answers many requesters with few commits.

use std::collections::BTreeMap;
use std::sync::Arc;

use redb_limiter::engine::{Engine, EngineConfig, Facts};
use redb_limiter::limiter::{LimiterOptions, Snapshot};
use redb_limiter::store::faulty::{FaultPlan, faulty_journal_opener, faulty_opener};
use redb_limiter::store::{Store, StoreError, file_opener};
use redb_limiter::time::{Clock, FakeClock};
use redb_limiter::{
    AcquireRequest, Decision, Limit, Limiter, LimiterError, Millis, Reason, ReleaseRequest, ThrottleRequest,
};

const T0: Millis = Millis(1_800_000_000_000);

fn options(clock: &Arc<FakeClock>) -> LimiterOptions {
    LimiterOptions { clock: Some(clock.clone()), id_seed: Some(7), ..LimiterOptions::default() }
}

fn window(bucket: &str, calls: u64, per_ms: u64) -> AcquireRequest {
    AcquireRequest::new("caller", vec![Limit::window(bucket, calls, per_ms)]).unwrap()
}

/// The durable facts of a file, read through a fresh engine.
fn file_facts(path: &std::path::Path, now: Millis) -> Facts {
    let store = Store::open(path, &file_opener()).unwrap();
    let mut engine = Engine::new(EngineConfig::default());
    store.load(&mut engine).unwrap();
    engine.facts(now)
}

#[test]
fn a_restart_keeps_windows_places_and_throttles_with_their_instants() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    assert!(limiter.acquire_blocking(window("w", 1, 60_000)).unwrap().is_granted());
    let conc = AcquireRequest::new("caller", vec![Limit::concurrent("c", 1).with_hold_ms(5000)]).unwrap();
    let Decision::Granted { permit: Some(permit), .. } = limiter.acquire_blocking(conc.clone()).unwrap() else {
        panic!("granted with a permit")
    };
    let until = T0.plus(30_000);
    assert_eq!(limiter.throttle_blocking(ThrottleRequest::new("throttled", until, T0).unwrap()).unwrap(), Some(until));
    drop(limiter);

    clock.advance(1000);
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    let retry = |d: Decision| match d {
        Decision::Refused { retry_at, reason, .. } => (retry_at, reason),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert_eq!(retry(limiter.acquire_blocking(window("w", 1, 60_000)).unwrap()), (T0.plus(60_000), Reason::Rate));
    assert_eq!(retry(limiter.acquire_blocking(conc.clone()).unwrap()), (T0.plus(1250), Reason::Concurrency));
    let as_throttled = AcquireRequest::new("throttled", vec![]).unwrap();
    assert_eq!(retry(limiter.acquire_blocking(as_throttled).unwrap()), (until, Reason::Throttle));
    // The permit survives too, and releasing it frees the place.
    assert!(limiter.release_blocking(ReleaseRequest::new(permit.to_string()).unwrap()).unwrap());
    assert!(limiter.acquire_blocking(conc).unwrap().is_granted());
}

#[test]
fn lapsed_state_is_pruned_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    for i in 0..10 {
        assert!(limiter.acquire_blocking(window(&format!("w{i}"), 5, 1000)).unwrap().is_granted());
    }
    drop(limiter);
    clock.advance(1000);
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    assert_eq!(limiter.state_blocking("").unwrap().totals.buckets, 0);
    drop(limiter);
    assert_eq!(Store::open(&path, &file_opener()).unwrap().grant_rows().unwrap(), 0);
}

/// A digest of the file's bytes (comparing digests keeps failure output short).
fn bytes_of(path: &std::path::Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(path).unwrap().hash(&mut h);
    h.finish()
}

#[test]
fn bad_files_are_refused_unmodified() {
    let dir = tempfile::tempdir().unwrap();
    // Not a redb file.
    let junk = dir.path().join("junk.redb");
    std::fs::write(&junk, vec![0x5a; 10_000]).unwrap();
    let before = bytes_of(&junk);
    let err = Limiter::open(&junk).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("junk.redb"), "{err}");
    assert_eq!(bytes_of(&junk), before);

    // A redb file of some other program.
    let foreign = dir.path().join("foreign.redb");
    {
        let db = redb::Database::create(&foreign).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, u64>::new("theirs")).unwrap().insert("a", 1).unwrap();
        txn.commit().unwrap();
    }
    let before = bytes_of(&foreign);
    let err = Limiter::open(&foreign).unwrap_err();
    assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    assert_eq!(bytes_of(&foreign), before);

    // A later format version.
    let future = dir.path().join("future.redb");
    {
        let db = redb::Database::create(&future).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap().insert("format_version", 99).unwrap();
        txn.commit().unwrap();
    }
    let before = bytes_of(&future);
    let err = Limiter::open(&future).unwrap_err();
    assert!(matches!(err, StoreError::UnknownVersion { found: 99, .. }), "{err}");
    assert!(err.to_string().contains("future.redb") && err.to_string().contains("99"), "{err}");
    assert_eq!(bytes_of(&future), before);

    // A file some other holder has open.
    let busy = dir.path().join("busy.redb");
    let holder = Limiter::open(&busy).unwrap();
    let err = Limiter::open(&busy).unwrap_err();
    assert!(matches!(err, StoreError::HeldElsewhere { .. }), "{err}");
    assert!(err.to_string().contains("held open by another process"), "{err}");
    drop(holder);
    Limiter::open(&busy).unwrap();
}

/// The state once the limiter has reopened its file after a fault (it retries in the
/// background while the fault lasts).
fn until_available(limiter: &Limiter, prefix: &str) -> Snapshot {
    for _ in 0..500 {
        match limiter.state_blocking(prefix) {
            Ok(snapshot) => return snapshot,
            Err(LimiterError::Unavailable(_)) => std::thread::sleep(std::time::Duration::from_millis(10)),
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the limiter did not recover from the fault");
}

#[test]
fn a_failed_commit_grants_nothing_and_loses_nothing_committed() {
    failed_commits_against_the_model(false);
}

/// The same when each request commits in its own thread.
#[test]
fn a_failed_commit_in_the_callers_thread_grants_nothing_and_loses_nothing_committed() {
    failed_commits_against_the_model(true);
}

fn failed_commits_against_the_model(caller_commits: bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let plan = FaultPlan::new();
    let opts = LimiterOptions { opener: faulty_opener(plan.clone()), caller_commits, ..options(&clock) };
    let limiter = Limiter::open_with(&path, opts).unwrap();
    // The model of what is durable: bucket → grant instants acknowledged.
    let mut durable: BTreeMap<String, Vec<Millis>> = BTreeMap::new();
    let mut failures = 0;
    let mut in_doubt = 0;
    for n in 0..40u64 {
        clock.advance(1);
        let bucket = format!("b{}", n % 5);
        plan.fail_after(n % 8);
        let result = limiter.acquire_blocking(window(&bucket, 1_000, 3_600_000));
        let fired = plan.fired();
        plan.disarm();
        match result {
            Ok(Decision::Granted { at, .. }) => {
                assert!(!fired, "a grant was reported although its commit hit a fault");
                durable.entry(bucket).or_default().push(at);
            }
            Err(LimiterError::Unavailable(why)) => {
                assert!(fired);
                assert!(why.contains("limiter.redb"), "{why}");
                failures += 1;
                // A fault in the last sync of a commit leaves its outcome unknown: the batch may
                // be in the file after all. Then it counts (conservative: the caller was told
                // `unavailable` and will not call), but it must be whole, and the engine must
                // have been rebuilt from the file, not from memory.
                let used = until_available(&limiter, &bucket).view.buckets.first().map_or(0, |b| b.window_used);
                let known = durable.get(&bucket).map_or(0, Vec::len) as u64;
                assert!(used == known || used == known + 1, "{bucket}: {used} used, {known} known");
                if used == known + 1 {
                    durable.entry(bucket).or_default().push(clock.now());
                    in_doubt += 1;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
        // The limiter reopens the file by itself; what it now holds is exactly the model.
        let snapshot: Snapshot = until_available(&limiter, "");
        let live: BTreeMap<String, u64> =
            snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used)).collect();
        let model: BTreeMap<String, u64> = durable.iter().map(|(k, v)| (k.clone(), v.len() as u64)).collect();
        assert_eq!(live, model, "after request {n}");
    }
    assert!(failures >= 10, "only {failures} injected faults fired");
    assert!(in_doubt < failures, "every failed commit reached the file: {in_doubt} of {failures}");
    drop(limiter);
    let facts = file_facts(&path, clock.now());
    for (bucket, ats) in &durable {
        let grants: Vec<Millis> = facts.buckets[bucket].0.iter().map(|(at, _)| *at).collect();
        assert_eq!(&grants, ats, "{bucket}");
    }
}

#[test]
fn the_file_follows_the_live_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Arc::new(Limiter::open_with(&path, options(&clock)).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 100,000 distinct bucket keys through 50 ms windows, 500 at a time (group commit).
    for round in 0..200u64 {
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..500u64 {
                let limiter = limiter.clone();
                let key = format!("space/{round}/{i}/{}", "x".repeat(64));
                set.spawn(async move { limiter.acquire(window(&key, 10, 50)).await });
            }
            while let Some(result) = set.join_next().await {
                assert!(result.unwrap().unwrap().is_granted());
            }
        });
        clock.advance(60);
    }
    // Let the sweeper see the last window pass.
    clock.advance(60);
    let snapshot = limiter.state_blocking("").unwrap();
    assert_eq!(snapshot.totals.buckets, 0);
    drop(limiter);
    let size = std::fs::metadata(&path).unwrap().len();
    eprintln!("after 100,000 keys the file holds {size} bytes");
    // 500 live keys at a time take a few hundred KiB (356 KiB seen); 100,000 kept keys would
    // take ~20 MB.
    assert!(size < 1024 * 1024, "the file grew to {size} bytes");
    assert_eq!(Store::open(&path, &file_opener()).unwrap().grant_rows().unwrap(), 0);
}

/// A sample of the limiter's metrics, by name.
fn metric(limiter: &Limiter, name: &str) -> f64 {
    let text = limiter.metrics().encode();
    let line = text.lines().find(|l| l.starts_with(name)).unwrap();
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn commits(limiter: &Limiter) -> u64 {
    metric(limiter, "redb_limiter_commit_seconds_count") as u64
}

#[test]
fn forgetting_waits_for_a_commit_a_request_needs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    assert!(limiter.acquire_blocking(window("old", 5, 50)).unwrap().is_granted());
    assert_eq!(commits(&limiter), 1);
    clock.advance(100);
    // The sweep forgets `old`, but a refusal-free read needs no commit: none is made for it.
    assert_eq!(limiter.state_blocking("").unwrap().totals.buckets, 0);
    assert_eq!(commits(&limiter), 1);
    // The next grant's commit carries the forgetting along.
    assert!(limiter.acquire_blocking(window("new", 5, 60_000)).unwrap().is_granted());
    assert_eq!(commits(&limiter), 2);
    drop(limiter);
    let facts = file_facts(&path, clock.now());
    assert_eq!(facts.buckets.keys().collect::<Vec<_>>(), vec!["new"]);
    let mut store = Store::open(&path, &file_opener()).unwrap();
    assert_eq!(store.grant_rows().unwrap(), 1);
}

/// Many async grants at once: the answers of a commit go back through the replier task on the
/// runtime of the first async call. Once that runtime is gone, the writer answers by itself; and
/// blocking callers are answered by the writer all along, even while that runtime is busy.
#[test]
fn async_answers_survive_the_runtime_that_carried_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Arc::new(Limiter::open_with(&path, options(&clock)).unwrap());
    let burst = |rt: &tokio::runtime::Runtime, round: u64| {
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..64u64 {
                let limiter = limiter.clone();
                set.spawn(async move { limiter.acquire(window(&format!("r{round}/{i}"), 1, 60_000)).await });
            }
            let mut granted = 0;
            while let Some(result) = set.join_next().await {
                assert!(result.unwrap().unwrap().is_granted());
                granted += 1;
            }
            granted
        })
    };
    let first = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    assert_eq!(burst(&first, 0), 64);
    // A blocking caller on another thread, while an async burst runs on the first runtime.
    let blocking = {
        let limiter = limiter.clone();
        std::thread::spawn(move || {
            (0..32)
                .filter(|i| limiter.acquire_blocking(window(&format!("b/{i}"), 1, 60_000)).unwrap().is_granted())
                .count()
        })
    };
    assert_eq!(burst(&first, 1), 64);
    assert_eq!(blocking.join().unwrap(), 32);
    drop(first);
    // The replier went with its runtime: a new runtime's callers are still answered.
    let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    assert_eq!(burst(&second, 2), 64);
    assert!(!second.block_on(limiter.acquire(window("r0/0", 1, 60_000))).unwrap().is_granted());
    drop(second);
    drop(limiter);
    assert_eq!(file_facts(&path, clock.now()).buckets.len(), 3 * 64 + 32);
}

/// With `caller_commits`, a lone request commits in its own thread and concurrent ones queue
/// for the writer; either way every answer is durable and a window never holds more than its
/// calls.
#[test]
fn callers_and_the_writer_take_turns_committing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter =
        Arc::new(Limiter::open_with(&path, LimiterOptions { caller_commits: true, ..options(&clock) }).unwrap());
    // One at a time: each commits its own.
    for i in 0..20 {
        assert!(limiter.acquire_blocking(window("alone", 100, 3_600_000)).unwrap().is_granted(), "{i}");
    }
    let before = commits(&limiter);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let limiter = limiter.clone();
            std::thread::spawn(move || {
                let mut shared = 0;
                for _ in 0..50 {
                    assert!(
                        limiter.acquire_blocking(window(&format!("own/{t}"), 1_000, 3_600_000)).unwrap().is_granted()
                    );
                    shared +=
                        u64::from(limiter.acquire_blocking(window("shared", 150, 3_600_000)).unwrap().is_granted());
                }
                shared
            })
        })
        .collect();
    let shared: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(shared, 150);
    assert!(commits(&limiter) > before);
    drop(limiter);
    // The clock stands still, so each bucket's grants share one instant: count their cost.
    let facts = file_facts(&path, clock.now());
    let used = |key: &str| facts.buckets[key].0.iter().map(|(_, cost)| *cost).sum::<u64>();
    assert_eq!(used("alone"), 20);
    assert_eq!(used("shared"), 150);
    for t in 0..8 {
        assert_eq!(used(&format!("own/{t}")), 50);
    }
}

fn live_buckets(limiter: &Limiter) -> i64 {
    metric(limiter, "redb_limiter_live_buckets") as i64
}

/// After a request commits in its own thread, the writer still learns of the deadline it made:
/// the sweep forgets the bucket when its window passes, with no request to prompt it.
#[test]
fn the_writer_sweeps_after_callers_commit_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, LimiterOptions { caller_commits: true, ..options(&clock) }).unwrap();
    // Let the writer park with nothing to wait for.
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(limiter.acquire_blocking(window("brief", 5, 50)).unwrap().is_granted());
    assert_eq!(live_buckets(&limiter), 1, "the gauges follow a caller's commit");
    clock.advance(100);
    // The writer wakes at the bucket's deadline (50 ms of real time at most), forgets it and,
    // with no request to carry that, commits it within MAX_DEFERRED_MS.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while live_buckets(&limiter) != 0 {
        assert!(std::time::Instant::now() < deadline, "the writer never swept");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A panic in the middle of a caller's own commit (a bug below the store) must not leave the
/// commit in flight forever: the limiter turns unavailable, the writer reopens the file, and
/// requests are served again; closing does not hang.
#[test]
fn a_panic_in_a_callers_commit_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let plan = FaultPlan::new();
    let opts = LimiterOptions { opener: faulty_opener(plan.clone()), caller_commits: true, ..options(&clock) };
    let limiter = Limiter::open_with(&path, opts).unwrap();
    assert!(limiter.acquire_blocking(window("w", 10, 60_000)).unwrap().is_granted());
    plan.panic_at_next_sync();
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| limiter.acquire_blocking(window("w", 10, 60_000))));
    assert!(outcome.is_err(), "the injected panic did not reach the caller");
    // The panicking commit's outcome is unknown (its pages may have reached the file), so the
    // window holds one or two grants; then a third is granted.
    let used = until_available(&limiter, "w").view.buckets[0].window_used;
    assert!(used == 1 || used == 2, "{used}");
    assert!(limiter.acquire_blocking(window("w", 10, 60_000)).unwrap().is_granted());
    assert_eq!(limiter.state_blocking("w").unwrap().view.buckets[0].window_used, used + 1);
    drop(limiter);
}

/// On a runtime with one thread, a caller blocked in its own commit would leave every request
/// that arrives meanwhile to commit alone after it: there, async callers leave commits to the
/// writer, and concurrent requests share them.
#[test]
fn one_runtime_thread_leaves_commits_to_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter =
        Arc::new(Limiter::open_with(&path, LimiterOptions { caller_commits: true, ..options(&clock) }).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..64 {
            let limiter = limiter.clone();
            set.spawn(async move { limiter.acquire(window(&format!("k{i}"), 1, 60_000)).await });
        }
        while let Some(result) = set.join_next().await {
            assert!(result.unwrap().unwrap().is_granted());
        }
    });
    assert!(commits(&limiter) < 32, "{} commits for 64 concurrent grants", commits(&limiter));
}

/// Section 9 across a restart: a settled cost is what counts after it, a refusal that lengthened
/// a bucket's retention keeps its grants that long, a lift stays lifted, and a peek writes
/// nothing (the file's bytes do not change).
#[test]
fn settles_lifts_and_lengthening_refusals_are_durable_and_peeks_write_nothing() {
    use redb_limiter::{Cost, LiftRequest, SettleRequest};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    let tpm = |cost| {
        AcquireRequest::new("caller", vec![Limit::window("tpm", 100, 60_000).with_cost(cost)]).unwrap().with_permit()
    };
    let Decision::Granted { permit: Some(permit), .. } = limiter.acquire_blocking(tpm(90)).unwrap() else {
        panic!("granted with a permit")
    };
    assert!(
        limiter.settle_blocking(SettleRequest::new(permit.to_string(), vec![Cost::new("tpm", 20)]).unwrap()).unwrap()
    );
    // Five grants in a short window, then a refusal naming a minute.
    for _ in 0..5 {
        assert!(limiter.acquire_blocking(window("short", 5, 500)).unwrap().is_granted());
    }
    assert!(!limiter.acquire_blocking(window("short", 5, 60_000)).unwrap().is_granted());
    limiter.throttle_blocking(ThrottleRequest::new("closed", T0.plus(50_000), T0).unwrap()).unwrap();
    assert!(limiter.lift_blocking(LiftRequest::new("closed").unwrap()).unwrap());
    // Peeks leave the file's bytes as they are.
    let before = std::fs::read(&path).unwrap();
    for cost in [1, 80, 81] {
        limiter.peek_blocking(tpm(cost)).unwrap();
    }
    assert_eq!(std::fs::read(&path).unwrap(), before, "a peek wrote to the file");
    drop(limiter);

    clock.advance(1000);
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    // 20 counts, not 90: 80 fit, 81 do not.
    assert!(limiter.peek_blocking(tpm(80)).unwrap().fits());
    assert!(!limiter.peek_blocking(tpm(81)).unwrap().fits());
    // The short grants are kept for the minute the refusal named.
    assert_eq!(
        limiter.acquire_blocking(window("short", 5, 60_000)).unwrap(),
        Decision::Refused { retry_at: T0.plus(60_000), reason: Reason::Rate, limit: "short".into() }
    );
    assert!(limiter.acquire_blocking(AcquireRequest::new("closed", vec![]).unwrap()).unwrap().is_granted());
    // The settled permit still releases.
    assert!(limiter.release_blocking(ReleaseRequest::new(permit.to_string()).unwrap()).unwrap());
}

/// A request that queues in `w` (one call per 10 s) with a grace of 500 ms.
fn queued(ticket: Option<&str>) -> AcquireRequest {
    let req = window("w", 1, 10_000).with_queue().with_grace_ms(500).unwrap();
    match ticket {
        Some(t) => req.with_ticket(t).unwrap(),
        None => req,
    }
}

/// The ticket a refusal names, and how many wait ahead of it.
fn ticket_of(acquired: &redb_limiter::limiter::Acquired) -> (String, u64, Millis) {
    assert!(!acquired.decision.is_granted(), "{acquired:?}");
    let note = acquired.ticket.expect("a refusal in line names its ticket");
    (note.id.to_string(), note.ahead, note.lapse_at)
}

/// Tickets are in the file: after a stop, each keeps its place and order, and one whose lapse
/// would come before the restart plus its grace lapses then instead (section 12.6).
#[test]
fn a_ticket_keeps_its_place_and_order_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    assert!(limiter.acquire_blocking(window("w", 1, 10_000)).unwrap().is_granted());
    clock.advance(100);
    let (first, ahead, lapse) = ticket_of(&limiter.acquire_reported_blocking(queued(None)).unwrap());
    assert_eq!((ahead, lapse), (0, T0.plus(10_500)));
    let (second, ahead, _) = ticket_of(&limiter.acquire_reported_blocking(queued(None)).unwrap());
    assert_eq!(ahead, 1);
    limiter.close();

    // Back 100 ms before the first ticket's lapse: it lapses no sooner than now + 500.
    clock.set(T0.plus(10_400));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    limiter.close();
    let tickets = file_facts(&path, clock.now()).tickets;
    let lapses: Vec<(String, Millis)> = tickets.iter().map(|(id, t)| (id.to_string(), t.lapse_at)).collect();
    // The second was told its own instant behind the first (20 000, section 12.9): its lapse
    // stands.
    assert_eq!(lapses, vec![(first.clone(), T0.plus(10_900)), (second.clone(), T0.plus(20_500))]);

    // Past the lapse it had before the restart, before the one it was given: still first.
    clock.set(T0.plus(10_700));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    let (again, ahead, _) = ticket_of(&limiter.acquire_reported_blocking(queued(Some(&second))).unwrap());
    assert_eq!((again.as_str(), ahead), (second.as_str(), 1), "the second waits behind the first");
    let granted = limiter.acquire_reported_blocking(queued(Some(&first))).unwrap();
    assert!(granted.decision.is_granted(), "{granted:?}");
    let (again, ahead, _) = ticket_of(&limiter.acquire_reported_blocking(queued(Some(&second))).unwrap());
    assert_eq!((again.as_str(), ahead), (second.as_str(), 0));
    // However long the stop, a ticket live at the file's latest instant keeps its place.
    limiter.close();
    clock.set(T0.plus(40_000));
    Limiter::open_with(&path, options(&clock)).unwrap().close();
    let tickets = file_facts(&path, T0).tickets;
    let lapses: Vec<(String, Millis)> = tickets.iter().map(|(id, t)| (id.to_string(), t.lapse_at)).collect();
    assert_eq!(lapses, vec![(second.clone(), T0.plus(40_500))]);
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    assert!(limiter.acquire_blocking(queued(Some(&second))).unwrap().is_granted());
    limiter.close();
    assert!(file_facts(&path, T0).tickets.is_empty(), "a grant ends the ticket in the file");
}

/// A filing whose commit fails is never named in a reply, and the engine is rebuilt from the
/// file: the next request that queues finds no ticket ahead of it but one the file may hold (a
/// fault in the last sync leaves the commit's outcome unknown).
#[test]
fn a_filing_whose_commit_failed_names_no_ticket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let plan = FaultPlan::new();
    let opts = LimiterOptions { opener: faulty_opener(plan.clone()), ..options(&clock) };
    let limiter = Limiter::open_with(&path, opts).unwrap();
    let in_line = |bucket: &str| window(bucket, 1, 10_000).with_queue();
    let (mut failed, mut in_doubt) = (0, 0);
    for n in 0..12u64 {
        let bucket = format!("w{n}");
        assert!(limiter.acquire_blocking(window(&bucket, 1, 10_000)).unwrap().is_granted());
        clock.advance(1);
        plan.fail_after(n % 6);
        let result = limiter.acquire_reported_blocking(in_line(&bucket));
        let fired = plan.fired();
        plan.disarm();
        match result {
            Ok(acquired) => {
                assert!(!fired, "a ticket was named although its filing's commit hit a fault");
                assert_eq!(ticket_of(&acquired).1, 0);
                let (_, ahead, _) = ticket_of(&limiter.acquire_reported_blocking(in_line(&bucket)).unwrap());
                assert_eq!(ahead, 1, "the named ticket is in line");
            }
            Err(LimiterError::Unavailable(why)) => {
                assert!(fired);
                assert!(why.contains("limiter.redb"), "{why}");
                failed += 1;
                until_available(&limiter, "");
                let (_, ahead, _) = ticket_of(&limiter.acquire_reported_blocking(in_line(&bucket)).unwrap());
                assert!(ahead <= 1, "{ahead}");
                in_doubt += ahead;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(failed >= 4, "only {failed} faults fired");
    assert!(in_doubt < failed, "every failed filing reached the file: {in_doubt} of {failed}");
}

/// While the store cannot commit, the writer tries again by itself: once the cause is gone,
/// `/health` (the limiter's outage) clears within 2 seconds with no request arriving, behind the
/// journal and on the file alone.
#[test]
fn the_store_recovers_by_itself_once_the_cause_goes_away_with_no_request() {
    for journal in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let clock = Arc::new(FakeClock::new(T0));
        let plan = FaultPlan::new();
        let opener = if journal { faulty_journal_opener(plan.clone()) } else { faulty_opener(plan.clone()) };
        let limiter = Limiter::open_with(&path, LimiterOptions { opener, ..options(&clock) }).unwrap();
        assert!(limiter.acquire_blocking(window("w", 10, 3_600_000)).unwrap().is_granted());
        plan.fail_after(0);
        clock.advance(1);
        let failed = limiter.acquire_blocking(window("w", 10, 3_600_000));
        assert!(matches!(failed, Err(LimiterError::Unavailable(_))), "{failed:?}");
        assert!(limiter.outage().is_some(), "the outage is reported");
        plan.disarm();
        let started = std::time::Instant::now();
        while let Some(why) = limiter.outage() {
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "journal {journal}: still out: {why}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        clock.advance(1);
        assert!(limiter.acquire_blocking(window("w", 10, 3_600_000)).unwrap().is_granted());
        let used = limiter.state_blocking("w").unwrap().view.buckets[0].window_used;
        assert!(used == 2 || used == 3, "the first grant kept, the failed one at most once: {used}");
    }
}
