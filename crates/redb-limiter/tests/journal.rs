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
    // A file left by a crash needs redb's repair first: done on a copy, the file stays as it is.
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join("look.redb");
    std::fs::copy(path, &copy).unwrap();
    let db = redb::Database::create(&copy).unwrap();
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

/// What the file alone says of its journal: (journal id, journal open), from its `meta` table.
fn claim_alone(path: &Path) -> (u64, u64) {
    let scratch = tempfile::tempdir().unwrap();
    let copy = scratch.path().join("look.redb");
    std::fs::copy(path, &copy).unwrap();
    let db = redb::Database::create(&copy).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    let get = |key: &str| meta.get(key).unwrap().map_or(0, |v| v.value());
    (get("journal_id"), get("journal_open"))
}

/// A limiter with `n` grants in `w` (window of 100), crashed: both files copied while open.
fn crashed_with_grants(dir: &Path, name: &str, n: usize) -> PathBuf {
    let crashed = dir.join(format!("{name}-crashed"));
    std::fs::create_dir_all(&crashed).unwrap();
    let path = dir.join(name);
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    for _ in 0..n {
        clock.advance(1);
        assert!(limiter.acquire_blocking(window("w", 100)).unwrap().is_granted());
    }
    let copy = crash_copy(&path, &crashed);
    drop(limiter);
    copy
}

/// Grants served from `path` in `w`, or the refusal.
fn grants_served(path: &Path) -> Result<u64, StoreError> {
    let clock = Arc::new(FakeClock::new(T0.plus(60_000)));
    let limiter = Limiter::open_with(path, options(&clock))?;
    let used = limiter.state_blocking("w").unwrap().view.buckets.first().map_or(0, |b| b.window_used);
    Ok(used)
}

fn read_pair(path: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    (std::fs::read(path).unwrap(), std::fs::read(journal_path(path)).ok())
}

#[test]
fn a_new_file_names_its_journal_and_needs_it_from_the_first_moment() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let store = Store::open(&path, &file_opener()).unwrap();
    // Before any commit of a request: the file itself already names its journal and says it is
    // open behind it.
    let copy = crash_copy(&path, crashed.path());
    drop(store);
    let (id, open) = claim_alone(&copy);
    assert_ne!(id, 0, "the file names its journal");
    assert_eq!(open, 1, "and knows it needs it");
    // A clean close says it no longer does.
    Limiter::open(&path).unwrap().close();
    let (id_after, open) = claim_alone(&path);
    assert_eq!((id_after, open), (id, 0));
}

#[test]
fn a_journal_missing_emptied_or_cut_after_a_crash_is_refused_naming_both_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let copy = crashed_with_grants(dir.path(), "limiter.redb", 5);
    let journal = std::fs::read(journal_path(&copy)).unwrap();
    let intact = dir.path().join("intact");
    std::fs::create_dir_all(&intact).unwrap();
    assert_eq!(grants_served(&crash_copy(&copy, &intact)).unwrap(), 5);
    let cases: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("deleted", None),
        ("emptied", Some(Vec::new())),
        ("cut to one slot", Some(journal[..8192].to_vec())),
        ("cut to the slots", Some(journal[..16384].to_vec())),
        ("cut inside the region", Some(journal[..16384 + 4096 + 100].to_vec())),
        ("cut short of its end", Some(journal[..journal.len() - 4096].to_vec())),
        ("zeroed", Some(vec![0; journal.len()])),
    ];
    for (what, bytes) in cases {
        let case = dir.path().join(what.replace(' ', "-"));
        std::fs::create_dir_all(&case).unwrap();
        let path = case.join("limiter.redb");
        std::fs::copy(&copy, &path).unwrap();
        if let Some(bytes) = &bytes {
            std::fs::write(journal_path(&path), bytes).unwrap();
        }
        let before = read_pair(&path);
        let err = grants_served(&path).unwrap_err();
        let message = err.to_string();
        let both = message.contains("limiter.redb-journal")
            && message.replace("limiter.redb-journal", "").contains("limiter.redb");
        assert!(both, "{what}: both named: {message}");
        assert!(!message.contains("full while notes wait"), "{what}: {message}");
        assert_eq!(read_pair(&path), before, "{what}: both files as they were");
    }
}

#[test]
fn a_journal_of_another_file_or_an_earlier_copy_of_its_own_is_refused_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    // Two new files, each crashed with grants; B's journal put beside A.
    let a = crashed_with_grants(dir.path(), "a.redb", 3);
    let b = crashed_with_grants(dir.path(), "b.redb", 4);
    std::fs::copy(journal_path(&b), journal_path(&a)).unwrap();
    let before = read_pair(&a);
    let message = grants_served(&a).unwrap_err().to_string();
    assert!(message.contains("a.redb-journal") && message.contains("a.redb)"), "{message}");
    assert!(message.contains("another database file"), "{message}");
    assert_eq!(read_pair(&a), before, "both files as they were");

    // An earlier copy of a file's own journal, taken before commits the file now holds.
    let path = dir.path().join("c.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    let earlier = std::fs::read(journal_path(&path)).unwrap();
    for _ in 0..6 {
        clock.advance(1);
        assert!(limiter.acquire_blocking(window("w", 100)).unwrap().is_granted());
    }
    limiter.close();
    std::fs::write(journal_path(&path), &earlier).unwrap();
    let before = read_pair(&path);
    let message = grants_served(&path).unwrap_err().to_string();
    assert!(message.contains("older than the file") && message.contains("c.redb-journal"), "{message}");
    assert_eq!(read_pair(&path), before);
}

/// The offsets and sizes of the journal's records of its newest generation, in order.
fn journal_records(journal: &[u8]) -> Vec<(usize, usize)> {
    let at = |i: usize| u64::from_le_bytes(journal[i..i + 8].try_into().unwrap());
    let mut found: Vec<(u64, u64, usize, usize)> = Vec::new();
    for pos in (16384..journal.len()).step_by(4096) {
        if &journal[pos..pos + 4] == b"JREC" {
            found.push((at(pos + 24), at(pos + 32), pos, at(pos + 40) as usize));
        }
    }
    let newest = found.iter().map(|r| r.0).max().unwrap();
    let mut records: Vec<(u64, usize, usize)> =
        found.into_iter().filter(|r| r.0 == newest).map(|(_, seq, pos, size)| (seq, pos, size)).collect();
    records.sort();
    // Only the run that follows on from the first, as a replay reads it.
    let mut run = Vec::new();
    for (i, (_, pos, size)) in records.iter().enumerate() {
        if i > 0 && records[i - 1].0 + 1 != records[i].0 {
            break;
        }
        run.push((*pos, *size));
    }
    run
}

/// The journal-damage matrix through the limiter: every acknowledged grant is served, or the
/// open is refused; only the newest commit's own bytes may roll back to the commit before.
#[test]
fn journal_damage_is_refused_or_serves_every_acknowledged_grant() {
    let dir = tempfile::tempdir().unwrap();
    let copy = crashed_with_grants(dir.path(), "limiter.redb", 12);
    let journal = std::fs::read(journal_path(&copy)).unwrap();
    let records = journal_records(&journal);
    assert!(records.len() >= 12, "one note a grant: {}", records.len());
    let last = records.len() - 1;
    let mut cases: Vec<(String, Vec<u8>, bool)> = Vec::new();
    for (i, (pos, size)) in [(0, records[0]), (records.len() / 2, records[records.len() / 2]), (last, records[last])] {
        for at in [0, 4, 8, 24, 32, 40, 48, 64, 72, 80, size / 2, size - 1] {
            let mut bytes = journal.clone();
            bytes[pos + at] ^= 0x08;
            cases.push((format!("record {i} byte {at}"), bytes, i == last));
        }
        for cut in [pos, pos + 1, pos + size / 2, pos + size] {
            cases.push((format!("cut at {cut}"), journal[..cut].to_vec(), false));
        }
    }
    for slot in [0, 8192] {
        for field in [0, 8, 16, 32, 40, 56, 64, 4088, 4096] {
            let mut bytes = journal.clone();
            bytes[slot + field] ^= 0x08;
            cases.push((format!("slot at {slot} byte {field}"), bytes, false));
        }
    }
    let (mut refused, mut served) = (0, 0);
    for (n, (what, bytes, newest)) in cases.into_iter().enumerate() {
        let case = dir.path().join(format!("case{n}"));
        std::fs::create_dir_all(&case).unwrap();
        let path = case.join("limiter.redb");
        std::fs::copy(&copy, &path).unwrap();
        std::fs::write(journal_path(&path), &bytes).unwrap();
        match grants_served(&path) {
            Ok(12) => served += 1,
            Ok(11) if newest => served += 1,
            Ok(n) => panic!("{what}: served {n} of 12 acknowledged grants"),
            Err(e) => {
                assert!(e.to_string().contains("limiter.redb-journal"), "{what}: {e}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0 && served > 0, "refused {refused}, served {served}");
}

#[test]
fn a_journal_truncated_or_overwritten_while_open_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let store = Store::open(&path, &file_opener()).unwrap();
    store.check_file().unwrap();
    let journal = std::fs::OpenOptions::new().write(true).open(journal_path(&path)).unwrap();
    let len = journal.metadata().unwrap().len();
    journal.set_len(len - 4096).unwrap();
    let err = store.check_file().unwrap_err();
    assert!(err.to_string().contains("journal was truncated"), "{err}");
    journal.set_len(len).unwrap();
    store.check_file().unwrap();
    std::os::unix::fs::FileExt::write_all_at(&journal, &[0u8; 16384], 0).unwrap();
    let err = store.check_file().unwrap_err();
    assert!(err.to_string().contains("journal was overwritten"), "{err}");
}

/// Serving, the journal cut in place: within a second the limiter answers unavailable and says
/// why, rather than granting into a journal that no restart would read whole.
#[test]
fn a_limiter_whose_journal_is_cut_while_serving_stops_granting_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let clock = Arc::new(FakeClock::new(T0));
    let limiter = Limiter::open_with(&path, options(&clock)).unwrap();
    assert!(limiter.acquire_blocking(window("w", 100)).unwrap().is_granted());
    std::fs::OpenOptions::new().write(true).open(journal_path(&path)).unwrap().set_len(0).unwrap();
    let started = std::time::Instant::now();
    while limiter.outage().is_none() {
        assert!(started.elapsed() < std::time::Duration::from_millis(1500), "not noticed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(limiter.outage().unwrap().contains("journal was truncated"), "{:?}", limiter.outage());
    assert!(limiter.acquire_blocking(window("w", 100)).is_err(), "nothing granted");
}

/// A small real filesystem (tmpfs), unmounted when dropped.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(bytes: u64) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status();
        status.is_ok_and(|s| s.success()).then_some(SmallDisk(dir))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).status();
    }
}

/// A disk with too little room for the journal: refused at start naming the journal and the room
/// it needs, and nothing half-made is left (no empty file, no partial journal).
#[test]
fn a_disk_with_too_little_room_for_the_journal_is_refused_and_left_as_it_was() {
    let Some(disk) = SmallDisk::mount(4 << 20) else {
        assert!(std::env::var_os("CI").is_none(), "CI: this test needs to mount a small tmpfs (run as root)");
        eprintln!("NOT RUN: a_disk_with_too_little_room_for_the_journal: cannot mount a small tmpfs here");
        return;
    };
    let path = disk.0.path().join("limiter.redb");
    let err = Limiter::open(&path).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("limiter.redb-journal") && message.contains("too little room"), "{message}");
    assert!(message.contains(&(16u64 * 1024 * 1024 + 16 * 1024).to_string()), "the room it needs: {message}");
    let left: Vec<_> = std::fs::read_dir(disk.0.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "nothing half-made: {left:?}");
}
