//! The file behind its journal, as the limiter opens it: commits that are only in the journal
//! (what `kill -9` leaves: the journal's appends are written, the file is not) are served after a
//! restart; a journal without its file, or holding commits of another file, is refused naming
//! it and changes nothing; a file of an older format is marked current on the file itself; a
//! journal deleted while open is noticed.
//!
//! A crash is taken by copying both files while the limiter still holds them open: every
//! `pwrite` it made is in the copy and nothing more, which is what a `kill -9` leaves on disk
//! (tests/crash.rs does the same with real kills of the binary).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTableMetadata, TableDefinition};
use redb_limiter::limiter::LimiterOptions;
use redb_limiter::store::journal::journal_path;
use redb_limiter::store::{FORMAT_VERSION, Store, StoreError, file_opener};
use redb_limiter::time::FakeClock;
use redb_limiter::{AcquireRequest, Decision, Limit, Limiter, Millis, ThrottleRequest};

const T0: Millis = Millis(1_800_000_000_000);
const GRANTS: TableDefinition<(u64, &str), u64> = TableDefinition::new("grants_by_time");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

fn options(clock: &Arc<FakeClock>) -> LimiterOptions {
    LimiterOptions { clock: Some(clock.clone()), id_seed: Some(7), ..LimiterOptions::default() }
}

fn window(bucket: &str, calls: u64) -> AcquireRequest {
    AcquireRequest::new("caller", vec![Limit::window(bucket, calls, 3_600_000)]).unwrap()
}

/// Both files as a `kill -9` of their holder would leave them, copied into `to`.
fn crash_copy(path: &Path, to: &Path) -> PathBuf {
    let copy = to.join(path.file_name().unwrap());
    std::fs::copy(path, &copy).unwrap();
    std::fs::copy(journal_path(path), journal_path(&copy)).unwrap();
    copy
}

/// What the file alone holds, read by redb without the journal: (format version, grant rows).
fn file_alone(path: &Path) -> (u64, u64) {
    if std::fs::metadata(path).unwrap().len() == 0 {
        return (0, 0);
    }
    let db = redb::Database::builder().open_read_only(path).unwrap();
    let txn = db.begin_read().unwrap();
    let version = match txn.open_table(META) {
        Ok(meta) => meta.get("format_version").unwrap().map_or(0, |v| v.value()),
        Err(_) => 0,
    };
    let grants = txn.open_table(GRANTS).map_or(0, |t| t.len().unwrap());
    (version, grants)
}

#[test]
fn commits_only_in_the_journal_are_served_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    for i in 0..40 {
        clock.advance(1);
        assert!(limiter.acquire_blocking(window(&format!("w{}", i % 4), 100)).unwrap().is_granted());
    }
    let until = T0.plus(600_000);
    limiter.throttle_blocking(ThrottleRequest::new("throttled", until, T0).unwrap()).unwrap();
    let copy = crash_copy(&path, crashed.path());
    let before = limiter.state_blocking("").unwrap();
    drop(limiter);

    // The commits are in the journal only: the file alone has none of the grants.
    assert_eq!(file_alone(&copy).1, 0, "the file alone should not hold the journal's commits yet");
    let limiter = Limiter::open_with(&copy, options(&clock)).unwrap();
    let after = limiter.state_blocking("").unwrap();
    assert_eq!(after.view, before.view, "every window, permit and throttle of the journal is back");
    assert_eq!(after.totals.buckets, 4);
    drop(limiter);
    // The open replayed them into the file: the file alone now holds all 40 grants.
    assert_eq!(file_alone(&copy), (FORMAT_VERSION, 40));
}

#[test]
fn a_journal_without_its_file_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    Limiter::open(&path).unwrap().close();
    assert!(journal_path(&path).exists());
    std::fs::remove_file(&path).unwrap();
    let journal = std::fs::read(journal_path(&path)).unwrap();

    let err = Store::open(&path, &file_opener()).unwrap_err();
    assert!(matches!(err, StoreError::JournalWithoutFile { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("limiter.redb-journal") && message.contains("limiter.redb,"), "{message}");
    assert!(!path.exists(), "the refusal created no file");
    assert_eq!(std::fs::read(journal_path(&path)).unwrap(), journal, "the journal is untouched");
}

#[test]
fn a_journal_holding_commits_of_another_file_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let clock = Arc::new(FakeClock::new(T0));
    // File A with commits in its journal only.
    let a = dir.path().join("a.redb");
    let limiter = Limiter::open_with(&a, options(&clock)).unwrap();
    assert!(limiter.acquire_blocking(window("w", 10)).unwrap().is_granted());
    let a_crashed = crash_copy(&a, crashed.path());
    drop(limiter);
    // File B, another limiter file, closed cleanly; then A's journal is put beside it.
    let b = dir.path().join("b.redb");
    let limiter = Limiter::open_with(&b, options(&clock)).unwrap();
    for _ in 0..3 {
        assert!(limiter.acquire_blocking(window("other", 10)).unwrap().is_granted());
    }
    limiter.close();
    std::fs::copy(journal_path(&a_crashed), journal_path(&b)).unwrap();
    let (file, journal) = (std::fs::read(&b).unwrap(), std::fs::read(journal_path(&b)).unwrap());

    let err = Store::open(&b, &file_opener()).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, StoreError::Journal { .. }), "{err:?}");
    assert!(message.contains("b.redb-journal") && message.contains("another database file"), "{message}");
    assert_eq!(std::fs::read(&b).unwrap(), file, "the file is untouched");
    assert_eq!(std::fs::read(journal_path(&b)).unwrap(), journal, "the journal is untouched");
    // The journal does belong to A: beside A's crashed file, it restores A's grant.
    assert_eq!(Store::open(&a_crashed, &file_opener()).unwrap().grant_rows().unwrap(), 1);
}

#[test]
fn an_older_file_is_marked_current_on_the_file_itself_before_any_journaled_commit() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v3-limiter.redb");
    std::fs::copy(fixture, &path).unwrap();
    assert_eq!(file_alone(&path).0, 3);
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    assert!(limiter.acquire_blocking(window("new", 10)).unwrap().is_granted());
    let copy = crash_copy(&path, crashed.path());
    drop(limiter);
    // An older build reading the crashed file alone would find a newer version and refuse it, never
    // serve it without the grant in the journal.
    assert_eq!(file_alone(&copy).0, FORMAT_VERSION);
    let store = Store::open(&copy, &file_opener()).unwrap();
    assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
}

#[test]
fn a_journal_deleted_while_open_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let store = Store::open(&path, &file_opener()).unwrap();
    store.check_file().unwrap();
    std::fs::remove_file(journal_path(&path)).unwrap();
    let err = store.check_file().unwrap_err();
    assert!(err.to_string().contains("journal was deleted"), "{err}");
}

#[test]
fn every_commit_is_one_journal_record_and_the_file_waits_for_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    let file_before = std::fs::read(&path).unwrap();
    let granted = (0..100)
        .filter(|i| {
            clock.advance(1);
            matches!(limiter.acquire_blocking(window(&format!("k{i}"), 1)).unwrap(), Decision::Granted { .. })
        })
        .count();
    assert_eq!(granted, 100);
    assert!(std::fs::read(&path).unwrap() == file_before, "no commit wrote the file itself");
    limiter.close();
    assert_eq!(file_alone(&path), (FORMAT_VERSION, 100), "the close checkpointed every commit into the file");
}

/// `tests/fixtures/v3-killed-limiter.redb`: written by the release before this one (format 3),
/// three grants in `fixture/rpd` (10 per day) at 20:18:06.255, .270 and .286 UTC, then SIGKILL,
/// so redb must repair it before it can be read. It is repaired, marked current on the file
/// itself before any journaled commit, and serves its three grants.
#[test]
fn an_older_file_left_by_a_crash_is_repaired_then_marked_on_the_file_itself() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v3-killed-limiter.redb");
    std::fs::copy(fixture, &path).unwrap();
    assert!(
        matches!(redb::Database::builder().open_read_only(&path), Err(redb::DatabaseError::RepairAborted)),
        "the fixture needs repair"
    );
    let clock = Arc::new(FakeClock::new(redb_limiter::time::parse_instant("2026-11-30T20:20:00.000Z").unwrap()));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    let used = limiter.state_blocking("fixture/rpd").unwrap().view.buckets[0].window_used;
    assert_eq!(used, 3);
    let rpd = AcquireRequest::new("caller", vec![Limit::window("fixture/rpd", 10, 86_400_000)]).unwrap();
    assert!(limiter.acquire_blocking(rpd).unwrap().is_granted());
    let copy = crash_copy(&path, crashed.path());
    drop(limiter);
    assert_eq!(file_alone(&copy).0, FORMAT_VERSION);
    let limiter = Limiter::open_with(&copy, options(&clock)).unwrap();
    assert_eq!(limiter.state_blocking("fixture/rpd").unwrap().view.buckets[0].window_used, 4);
}

/// Commits are kept as notes in the journal (one append each) before redb takes them: a crash
/// leaves them only there. The file alone is then refused by the plain opener (serving it would
/// lose them) and changes nothing; the open behind the journal redoes them, in order.
#[test]
fn commits_kept_as_notes_survive_a_crash_and_the_file_alone_is_refused() {
    use redb_limiter::engine::Effect;
    use redb_limiter::store::plain_file_opener;
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut store = Store::open(&path, &file_opener()).unwrap();
    let grant = |bucket: &str, at: u64| Effect::WindowGrant { bucket: Arc::from(bucket), at: T0.plus(at), cost: 1 };
    for at in 1..=3 {
        store.commit(&[grant("a", at)], T0.plus(at)).unwrap();
    }
    store.commit(&[grant("b", 4), Effect::ThrottleSet { key: Arc::from("c"), until: T0.plus(9) }], T0.plus(4)).unwrap();
    assert_eq!(store.journal_stats().unwrap().notes, 4);
    let copy = crash_copy(&path, crashed.path());
    drop(store);
    assert_eq!(file_alone(&copy).1, 0, "the grants are only in the journal");

    let Err(refused) = Store::open(&copy, &plain_file_opener()) else { panic!("the file alone is served") };
    let refused = refused.to_string();
    assert!(refused.contains("holds commits not yet in the file"), "{refused}");
    assert_eq!(file_alone(&copy).1, 0, "and left as it was");
    let mut store = Store::open(&copy, &file_opener()).unwrap();
    assert_eq!(store.grant_rows().unwrap(), 4);
    drop(store);
    let limiter = Limiter::open_with(&copy, options(&Arc::new(FakeClock::new(T0.plus(5))))).unwrap();
    let refused = limiter.acquire_blocking(AcquireRequest::new("c", vec![Limit::window("z", 1, 1000)]).unwrap());
    assert!(matches!(refused.unwrap(), Decision::Refused { .. }), "the throttle was redone too");
}
