//! File formats across releases: files written by earlier releases (format version 2,
//! committed as `tests/fixtures/v2-limiter.redb`, and version 3, `tests/fixtures/v3-limiter.redb`)
//! open with this build and serve every window, place, settled cost and throttle exactly as
//! before; the open marks them this build's version.
//!
//! The version-2 fixture was written by the `serve` binary of the previous release over HTTP: three grants
//! of cost 2 in `fixture/tpd` (10 per 31 days) at 15:52:35.476, .505 and .541; one grant at
//! 15:52:35.573 holding a place in `fixture/conc` (2 at once, held 24 h) and counting in
//! `fixture/rpd` (5 per day), its permit `p-c89bf14a218248e70000000000000000`; and a throttle of
//! `fixture/cred:2` until 2026-12-01T11:52:35.000Z; then SIGTERM.
//!
//! The journal's format changed too (version 2 added notes). `v4-journal1-killed-limiter.redb`
//! and its `-journal` were left by a `kill -9` of the previous release's `serve` binary (journal
//! version 1): three grants of cost 2 in `fixture/tpd` (10 per 31 days) at 00:05:56.759, .773 and
//! .784 on 2026-12-01, and a throttle of `fixture/cred:2` until 12:00:00.000Z that day. The file
//! itself is empty: every commit is only in the journal.
//!
//! Format version 5 keeps tickets, and its journal notes have schema 2.
//! `v4-journal2-killed-limiter.redb` and its `-journal` were left by a `kill -9` of the previous
//! release's `serve` binary (format version 4, journal version 2, notes of schema 1): three
//! grants of cost 2 in `fixture/tpd` at 14:06:11.193, .203 and .214 on 2026-12-01, and a throttle
//! of `fixture/cred:2` until 23:00:00.000Z that day, every one still a note in the journal.
//!
//! Format version 6 keeps request ids (section 16), and its journal notes have schema 3. The
//! previous release's (format version 5, notes of schema 2) `serve` binary wrote, over HTTP,
//! `v5-limiter.redb` (then SIGTERM) and `v5-killed-limiter.redb` with its `-journal` (then
//! `kill -9`, every commit a note in the journal); see [`V5`] for what each holds.
//!
//! Format version 7 keeps token buckets' levels (section 13) and each ticket's own horizon, and
//! its journal notes have schema 4. The previous release's (format version 6, notes of schema 3)
//! `serve` binary wrote, over HTTP, `v6-limiter.redb` (then SIGTERM) and `v6-killed-limiter.redb`
//! with its `-journal` (then `kill -9`): what a format-5 fixture holds, plus a grant named by a
//! request id and an id released before its acquire (see [`V6_CLEAN`]).
//!
//! The previous release's (format version 7, notes of schema 4) `serve` binary wrote, over HTTP,
//! `v7-limiter.redb` (then SIGTERM) and `v7-killed-limiter.redb` with its `-journal` (then
//! `kill -9`): what a format-6 fixture holds, plus a token bucket's level (see [`V7_CLEAN`]).
//! Format version 8 keeps adaptive ceilings (section 14), and its journal notes have schema 5.
//! The previous release's (format version 8, notes of schema 5) `serve` binary wrote, over HTTP,
//! `v8-limiter.redb` (then SIGTERM) and `v8-killed-limiter.redb` with its `-journal` (then
//! `kill -9`) by `tests/fixtures/write-v8.sh`: what a format-7 fixture holds, plus a ceiling cut
//! once and two live permits of its bucket, granted before and after the cut (see [`V8_CLEAN`]).
//! Format version 9 orders a grant and a cut within one millisecond: a ceiling counts its cuts
//! and a permit keeps the count its grant saw (version 8's read as none).

use redb_limiter::UndoRequest;

use std::sync::Arc;

use redb_limiter::limiter::LimiterOptions;
use redb_limiter::store::{FORMAT_VERSION, Store, file_opener};
use redb_limiter::time::{FakeClock, parse_instant};
use redb_limiter::{
    AcquireRequest, Adapt, Cost, Decision, Limit, Limiter, Millis, Reason, ReleaseRequest, SettleRequest, Signal,
};

const PERMIT: &str = "p-c89bf14a218248e70000000000000000";

fn at(s: &str) -> Millis {
    parse_instant(s).unwrap()
}

fn fixture_copy(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    std::fs::copy(fixture, &path).unwrap();
    (dir, path)
}

/// An acquire as the fixtures' throttled caller is refused until `until`.
fn assert_throttled_until(limiter: &Limiter, until: Millis) {
    let throttled = AcquireRequest::new("fixture/cred:2", vec![]).unwrap();
    assert_eq!(
        limiter.acquire_blocking(throttled).unwrap(),
        Decision::Refused { retry_at: until, reason: Reason::Throttle, limit: "fixture/cred:2".into() }
    );
}

/// An acquire of `cost` in the fixtures' 31-day window of 10 (`fixture/tpd`).
fn tpd(cost: u64) -> AcquireRequest {
    AcquireRequest::new("fixture/cred:1", vec![Limit::window("fixture/tpd", 10, 2_678_400_000).with_cost(cost)])
        .unwrap()
}

/// `cost` in `fixture/tpd` is refused for rate until the grant made at `first` leaves the window.
fn assert_tpd_waits_for(limiter: &Limiter, cost: u64, first: Millis) {
    assert_eq!(
        limiter.acquire_blocking(tpd(cost)).unwrap(),
        Decision::Refused { retry_at: first.plus(2_678_400_000), reason: Reason::Rate, limit: "fixture/tpd".into() }
    );
}

#[test]
fn a_file_of_the_previous_release_serves_as_before() {
    let (_dir, path) = fixture_copy("v2-limiter.redb");
    let now = at("2026-11-30T15:53:35.000Z");
    let clock = Arc::new(FakeClock::new(now));
    let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();

    let snapshot = limiter.state_blocking("fixture/").unwrap();
    let buckets: Vec<(String, u64, u64, usize)> =
        snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used, b.meta.retain_ms, b.places_held)).collect();
    assert_eq!(
        buckets,
        vec![
            ("fixture/conc".to_owned(), 0, 0, 1),
            ("fixture/rpd".to_owned(), 1, 86_400_000, 0),
            ("fixture/tpd".to_owned(), 6, 2_678_400_000, 0),
        ]
    );
    assert_eq!(snapshot.view.permits.len(), 1);
    assert_eq!(snapshot.view.permits[0].id.to_string(), PERMIT);
    assert_eq!(snapshot.view.permits[0].places, vec![("fixture/conc".to_owned(), at("2026-12-01T15:52:35.573Z"))]);
    assert_eq!(snapshot.view.throttles.len(), 1);
    assert_eq!(snapshot.view.throttles[0].until, at("2026-12-01T11:52:35.000Z"));

    // The windows decide as before: 6 of 10 used, so cost 5 waits for the first grant to leave.
    let leaves = at("2026-11-30T15:52:35.476Z").plus(2_678_400_000);
    assert_eq!(
        limiter.acquire_blocking(tpd(5)).unwrap(),
        Decision::Refused { retry_at: leaves, reason: Reason::Rate, limit: "fixture/tpd".into() }
    );
    // The held place counts: one of two is free, then none.
    let conc = AcquireRequest::new("fixture/cred:1", vec![Limit::concurrent("fixture/conc", 1)]).unwrap();
    assert_eq!(
        limiter.acquire_blocking(conc).unwrap(),
        Decision::Refused { retry_at: now.plus(250), reason: Reason::Concurrency, limit: "fixture/conc".into() }
    );
    // The throttle holds.
    assert_throttled_until(&limiter, at("2026-12-01T11:52:35.000Z"));
    // The old permit names no window a settle could change; it still releases its place.
    let settle = SettleRequest::new(PERMIT, vec![Cost::new("fixture/rpd", 3)]).unwrap();
    assert!(limiter.settle_blocking(settle).is_err());
    assert!(limiter.release_blocking(ReleaseRequest::new(PERMIT).unwrap()).unwrap());
    assert!(limiter.acquire_blocking(tpd(4)).unwrap().is_granted());
    drop(limiter);

    // Marked as this build's format, and reopens with what was granted since.
    let store = Store::open(&path, &file_opener()).unwrap();
    assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
    drop(store);
    let options = LimiterOptions { clock: Some(clock), id_seed: Some(4), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    let tpd_used = limiter.state_blocking("fixture/tpd").unwrap().view.buckets[0].window_used;
    assert_eq!(tpd_used, 10);
}

/// The version-3 fixture was written by the `serve` binary of the release before this one
/// (wire version 2) over HTTP: grants of cost 2 and 3 in `fixture/tpd` (10 per 31 days) at
/// 18:48:51.213 and .228; one at .236 holding a place in `fixture/conc` (2 at once, held 24 h)
/// and counting in `fixture/rpd` (5 per day), permit `…0000`; one with `permit: true` and
/// `holdMs` 24 h at .255 of cost 5000 in `fixture/tpm` (100,000 per hour), permit `…0001`,
/// settled to 1874; a throttle of `fixture/cred:2` until 2026-12-01T12:00:00.000Z; then SIGTERM.
#[test]
fn a_file_of_the_release_before_serves_as_before_and_its_permits_still_settle() {
    const PLACE: &str = "p-12976a58828f8fe60000000000000000";
    const SETTLED: &str = "p-12976a58828f8fe60000000000000001";
    let (_dir, path) = fixture_copy("v3-limiter.redb");
    let now = at("2026-11-30T18:50:00.000Z");
    let clock = Arc::new(FakeClock::new(now));
    let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();

    let snapshot = limiter.state_blocking("fixture/").unwrap();
    let buckets: Vec<(String, u64, usize)> =
        snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used, b.places_held)).collect();
    assert_eq!(
        buckets,
        vec![
            ("fixture/conc".to_owned(), 0, 1),
            ("fixture/rpd".to_owned(), 1, 0),
            ("fixture/tpd".to_owned(), 5, 0),
            ("fixture/tpm".to_owned(), 1874, 0),
        ]
    );
    // Both permits are live; the view lists the one holding places.
    assert_eq!(snapshot.totals.permits, 2);
    let permits: Vec<String> = snapshot.view.permits.iter().map(|p| p.id.to_string()).collect();
    assert_eq!(permits, vec![PLACE.to_owned()]);
    assert_eq!(snapshot.view.throttles.len(), 1);
    assert_eq!(snapshot.view.throttles[0].until, at("2026-12-01T12:00:00.000Z"));

    // 5 of 10 used in tpd: cost 6 waits for the first grant to leave.
    assert_tpd_waits_for(&limiter, 6, at("2026-11-30T18:48:51.213Z"));
    assert_throttled_until(&limiter, at("2026-12-01T12:00:00.000Z"));
    // A version-3 permit recorded its windows: it settles again (the latest figure stands).
    let settle = SettleRequest::new(SETTLED, vec![Cost::new("fixture/tpm", 99_000)]).unwrap();
    assert!(limiter.settle_blocking(settle).unwrap());
    let tpm =
        AcquireRequest::new("fixture/cred:1", vec![Limit::window("fixture/tpm", 100_000, 3_600_000).with_cost(1001)])
            .unwrap();
    assert!(!limiter.acquire_blocking(tpm).unwrap().is_granted(), "99,000 of 100,000 used after the settle");
    assert!(limiter.release_blocking(ReleaseRequest::new(PLACE).unwrap()).unwrap());
    drop(limiter);

    let store = Store::open(&path, &file_opener()).unwrap();
    assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
    drop(store);
    let options = LimiterOptions { clock: Some(clock), id_seed: Some(4), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    let snapshot = limiter.state_blocking("fixture/").unwrap();
    let used: Vec<(String, u64, usize)> =
        snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used, b.places_held)).collect();
    // The released place's bucket had nothing left to count, and was forgotten.
    assert_eq!(
        used,
        vec![("fixture/rpd".to_owned(), 1, 0), ("fixture/tpd".to_owned(), 5, 0), ("fixture/tpm".to_owned(), 99_000, 0),]
    );
}

#[test]
fn a_file_and_version_1_journal_left_by_a_kill_of_the_previous_release_serve_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::copy(fixtures.join("v4-journal1-killed-limiter.redb"), &path).unwrap();
    let journal = redb_limiter::store::journal::journal_path(&path);
    std::fs::copy(fixtures.join("v4-journal1-killed-limiter.redb-journal"), &journal).unwrap();
    let version = |slot: usize| {
        let bytes = std::fs::read(&journal).unwrap();
        u32::from_le_bytes(bytes[slot * 8192 + 8..slot * 8192 + 12].try_into().unwrap())
    };
    assert_eq!(version(0), 1, "written at journal version 1");

    let clock = Arc::new(FakeClock::new(at("2026-12-01T01:00:00.000Z")));
    let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    let snapshot = limiter.state_blocking("fixture/").unwrap();
    let buckets: Vec<(String, u64)> = snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used)).collect();
    assert_eq!(buckets, vec![("fixture/tpd".to_owned(), 6)]);
    assert_throttled_until(&limiter, at("2026-12-01T12:00:00.000Z"));
    // 6 of 10 used: cost 5 waits for the first grant to leave the window.
    assert_tpd_waits_for(&limiter, 5, at("2026-12-01T00:05:56.759Z"));
    drop(limiter);
    assert_eq!(version(0).max(version(1)), 2, "the header is rewritten at this version");
    let store = Store::open(&path, &file_opener()).unwrap();
    assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
}

/// The previous release's notes are redone as they were, and the file is marked version 5
/// before the journal takes a commit of this build (whose notes that release would refuse).
#[test]
fn notes_left_by_a_kill_of_the_previous_release_are_redone_and_the_file_is_marked() {
    let (dir, path) = fixture_copy("v4-journal2-killed-limiter.redb");
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let journal = redb_limiter::store::journal::journal_path(&path);
    std::fs::copy(fixtures.join("v4-journal2-killed-limiter.redb-journal"), &journal).unwrap();
    {
        // On a copy: what the journal holds, as left.
        let copy = dir.path().join("copy.redb");
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(&journal, redb_limiter::store::journal::journal_path(&copy)).unwrap();
        let recovery = redb_limiter::store::journal::JournalBackend::recover_path(&copy, None).unwrap();
        assert_eq!(recovery.pending_notes, 4, "every request is a note");
    }
    let clock = Arc::new(FakeClock::new(at("2026-12-01T15:00:00.000Z")));
    let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    let snapshot = limiter.state_blocking("fixture/").unwrap();
    let buckets: Vec<(String, u64)> = snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used)).collect();
    assert_eq!(buckets, vec![("fixture/tpd".to_owned(), 6)]);
    assert_throttled_until(&limiter, at("2026-12-01T23:00:00.000Z"));
    assert_tpd_waits_for(&limiter, 5, at("2026-12-01T14:06:11.193Z"));
    // A request that queues files a ticket, kept in the file from now on. (Not in `tpd`: its
    // 31-day window lies beyond the line's horizon, section 12.9.)
    let rpm = AcquireRequest::new("fixture/cred:1", vec![Limit::window("fixture/rpm", 1, 60_000)]).unwrap();
    assert!(limiter.acquire_blocking(rpm.clone()).unwrap().is_granted());
    let queued = rpm.with_queue();
    let ticket = limiter.acquire_reported_blocking(queued.clone()).unwrap().ticket.expect("a ticket").id;
    drop(limiter);
    let store = Store::open(&path, &file_opener()).unwrap();
    assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
    drop(store);
    let options = LimiterOptions { clock: Some(clock), id_seed: Some(4), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    let again = limiter.acquire_reported_blocking(queued.with_ticket(ticket.to_string()).unwrap()).unwrap();
    assert_eq!(again.ticket.map(|t| (t.id, t.ahead)), Some((ticket, 0)), "the ticket survived");
}

/// What the previous releases wrote into each format-5 fixture, all on 2026-12-02: three grants
/// of cost 2 in `fixture/tpd` (10 per 31 days); one holding a place in `fixture/conc` (2 at once,
/// held 24 h) and counting in `fixture/rpd` (5 per day), with its permit; a throttle of
/// `fixture/cred:2` until 2026-12-03T01:00:00.000Z; a grant in `fixture/rpm` (1 a minute), then a
/// ticket filed behind it (`queue`, `graceMs` 60,000), told its `retryAt`. The format-6 fixtures
/// hold the same on 2026-12-03 (the throttle until 2026-12-04T01:00:00.000Z), and then a grant of
/// cost 2 in `fixture/ids` (5 a day) with `permit` and the id `v6-grant`, and a `release {id}` of
/// `v6-released`, an id never seen.
struct V5 {
    file: &'static str,
    tpd_first: &'static str,
    permit: &'static str,
    ticket: &'static str,
    retry_at: &'static str,
    /// Format 6: the grant named `v6-grant` (its instant and permit).
    id_grant: Option<(&'static str, &'static str)>,
}

const V5_CLEAN: V5 = V5 {
    file: "v5-limiter.redb",
    tpd_first: "2026-12-02T01:24:09.333Z",
    permit: "p-1318841f7eaa97100000000000000000",
    ticket: "t-a88dace7c4fa76150000000000000001",
    retry_at: "2026-12-02T01:25:09.544Z",
    id_grant: None,
};

const V5_KILLED: V5 = V5 {
    file: "v5-killed-limiter.redb",
    tpd_first: "2026-12-02T01:24:09.889Z",
    permit: "p-d5fa25c1fc96340d0000000000000000",
    ticket: "t-cdaf76f49871c8180000000000000001",
    retry_at: "2026-12-02T01:25:10.030Z",
    id_grant: None,
};

const V6_CLEAN: V5 = V5 {
    file: "v6-limiter.redb",
    tpd_first: "2026-12-03T18:09:02.311Z",
    permit: "p-2a3705d5ddc832fe0000000000000000",
    ticket: "t-590633d0a4ac2c600000000000000001",
    retry_at: "2026-12-03T18:10:02.477Z",
    id_grant: Some(("2026-12-03T18:09:02.546Z", "p-4c6cc2b5b156e10b0000000000000001")),
};

const V6_KILLED: V5 = V5 {
    file: "v6-killed-limiter.redb",
    tpd_first: "2026-12-03T18:09:03.557Z",
    permit: "p-f32e7127299befe10000000000000000",
    ticket: "t-b316fa7b8f4dde8d0000000000000001",
    retry_at: "2026-12-03T18:10:03.756Z",
    id_grant: Some(("2026-12-03T18:09:03.828Z", "p-e4b9da22c6d007dc0000000000000001")),
};

/// The request `v6-grant` named in a format-6 fixture.
fn v6_grant() -> AcquireRequest {
    AcquireRequest::new("fixture/cred:1", vec![Limit::window("fixture/ids", 5, 86_400_000).with_cost(2)])
        .unwrap()
        .with_permit()
        .with_id("v6-grant")
        .unwrap()
}

/// The fixture's ticket kept its place: asked again before its retryAt it is refused, first in
/// line; at its retryAt (the clock set there) it is granted.
fn assert_ticket_kept_its_place(limiter: &Limiter, clock: &FakeClock, ticket: &str, retry_at: &str) {
    let again = rpm().with_ticket(ticket).unwrap();
    let refused = limiter.acquire_reported_blocking(again.clone()).unwrap();
    assert_eq!(refused.ticket.map(|t| (t.id.to_string(), t.ahead)), Some((ticket.to_owned(), 0)));
    assert_eq!(
        refused.decision,
        Decision::Refused { retry_at: at(retry_at), reason: Reason::Rate, limit: "fixture/rpm".into() }
    );
    clock.set(at(retry_at));
    assert!(limiter.acquire_blocking(again).unwrap().is_granted());
}

fn rpm() -> AcquireRequest {
    AcquireRequest::new("fixture/cred:1", vec![Limit::window("fixture/rpm", 1, 60_000)]).unwrap()
}

/// A format-5 or format-6 fixture serves as it was left (windows, place, throttle, the ticket in
/// its line, format 6's request ids), is marked format 7, and from then on keeps request ids and
/// token buckets across a restart.
fn a_format_5_file_serves_as_before(fixture: &V5) {
    let (dir, path) = fixture_copy(fixture.file);
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{}-journal", fixture.file));
    if source.exists() {
        std::fs::copy(&source, redb_limiter::store::journal::journal_path(&path)).unwrap();
    }
    let _keep = dir;
    let day = if fixture.id_grant.is_some() { "2026-12-03T18:09:30.000Z" } else { "2026-12-02T01:24:30.000Z" };
    let clock = Arc::new(FakeClock::new(at(day)));
    let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    let snapshot = limiter.state_blocking("fixture/").unwrap();
    let buckets: Vec<(String, u64, usize, usize)> =
        snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used, b.places_held, b.queued)).collect();
    let mut expected = vec![
        ("fixture/conc".to_owned(), 0, 1, 0),
        ("fixture/rpd".to_owned(), 1, 0, 0),
        ("fixture/rpm".to_owned(), 1, 0, 1),
        ("fixture/tpd".to_owned(), 6, 0, 0),
    ];
    if fixture.id_grant.is_some() {
        expected.insert(1, ("fixture/ids".to_owned(), 2, 0, 0));
    }
    assert_eq!(buckets, expected);
    assert!(snapshot.view.permits.iter().any(|p| p.id.to_string() == fixture.permit));
    let throttle_end = if fixture.id_grant.is_some() { "2026-12-04T01:00:00.000Z" } else { "2026-12-03T01:00:00.000Z" };
    assert_throttled_until(&limiter, at(throttle_end));
    if let Some((granted_at, permit)) = fixture.id_grant {
        // Format 6's request ids: the retry gets its first answer, counted once; the id released
        // before its acquire stays released.
        let again = limiter.acquire_blocking(v6_grant()).unwrap();
        assert_eq!(again, Decision::Granted { at: at(granted_at), permit: Some(permit.parse().unwrap()) });
        let released = AcquireRequest::new("fixture/cred:1", vec![]).unwrap().with_id("v6-released").unwrap();
        assert!(limiter.acquire_blocking(released).is_err());
    }
    assert_tpd_waits_for(&limiter, 5, at(fixture.tpd_first));
    assert_ticket_kept_its_place(&limiter, &clock, fixture.ticket, fixture.retry_at);
    assert!(limiter.release_blocking(ReleaseRequest::new(fixture.permit).unwrap()).unwrap());
    // A request id, from this build on.
    let named = AcquireRequest::new("fixture/cred:1", vec![Limit::concurrent("fixture/conc", 1)])
        .unwrap()
        .with_id("ask-1")
        .unwrap();
    let granted = limiter.acquire_blocking(named.clone()).unwrap();
    assert!(granted.is_granted());
    assert!(!limiter.undo_blocking(UndoRequest::new("ask-2").unwrap()).unwrap(), "never seen: released");
    // A token bucket, from this build on.
    let bucket =
        AcquireRequest::new("fixture/cred:1", vec![Limit::bucket("fixture/tokens", 10, 60_000).with_cost(8)]).unwrap();
    assert!(limiter.acquire_blocking(bucket.clone()).unwrap().is_granted());
    drop(limiter);

    let store = Store::open(&path, &file_opener()).unwrap();
    assert_eq!((store.format_version().unwrap(), FORMAT_VERSION), (9, 9));
    drop(store);
    let options = LimiterOptions { clock: Some(clock), id_seed: Some(4), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    assert_eq!(limiter.acquire_blocking(named).unwrap(), granted, "the retry after a restart gets its first answer");
    let late = AcquireRequest::new("fixture/cred:1", vec![Limit::concurrent("fixture/conc", 1)])
        .unwrap()
        .with_id("ask-2")
        .unwrap();
    assert!(limiter.acquire_blocking(late).is_err(), "released before it arrived, across a restart");
    assert!(limiter.undo_blocking(UndoRequest::new("ask-1").unwrap()).unwrap(), "its place is freed");
    // The bucket kept its level: 2 tokens, refilling one every 6 s (the clock stood still).
    assert_eq!(
        limiter.acquire_blocking(bucket).unwrap(),
        Decision::Refused {
            retry_at: at(fixture.retry_at).plus(36_000),
            reason: Reason::Rate,
            limit: "fixture/tokens".into()
        }
    );
}

#[test]
fn a_format_5_file_of_the_previous_release_serves_with_its_line_and_keeps_request_ids_from_then_on() {
    a_format_5_file_serves_as_before(&V5_CLEAN);
}

/// The previous release's notes (schema 2, a ticket's among them) are redone as they were, and
/// the file is marked version 6 before the journal takes a note of this build.
#[test]
fn notes_of_schema_2_left_by_a_kill_of_the_previous_release_are_redone_with_their_ticket() {
    a_format_5_file_serves_as_before(&V5_KILLED);
}

#[test]
fn a_format_6_file_of_the_previous_release_serves_with_its_request_ids_and_keeps_buckets_from_then_on() {
    a_format_5_file_serves_as_before(&V6_CLEAN);
}

/// The previous release's notes (schema 3, request ids among them) are redone as they were, and
/// the file is marked version 7 before the journal takes a note of this build.
#[test]
fn notes_of_schema_3_left_by_a_kill_of_the_previous_release_are_redone_with_their_request_ids() {
    a_format_5_file_serves_as_before(&V6_KILLED);
}

/// What the previous release wrote into each format-7 fixture, all on 2026-12-04, in this order:
/// three grants of cost 2 in `fixture/tpd` (10 per 31 days); one holding a place in
/// `fixture/conc` (2 at once, held 24 h) and counting in `fixture/rpd` (5 per day), with its
/// permit; a throttle of `fixture/cred:2` until 2026-12-05T11:00:00.000Z; a grant in
/// `fixture/rpm` (1 a minute), then a ticket filed behind it (`queue`, `graceMs` 60,000); a grant
/// of cost 2 in `fixture/ids` (5 a day) with `permit` and the id `v7-grant`; a `release {id}` of
/// `v7-released`, an id never seen; and a grant of cost 8 with `permit` from the token bucket
/// `fixture/tokens` (10 a minute, burst 10).
struct V7 {
    file: &'static str,
    /// The fixture's release: `v7-grant` and `v7-released` are its request ids.
    tag: &'static str,
    /// An instant after the fixture was written, before its ticket's `retryAt`: where the clock
    /// of the test starts.
    now: &'static str,
    tpd_first: &'static str,
    permit: &'static str,
    ticket: &'static str,
    retry_at: &'static str,
    /// The grant named `v7-grant`: its instant and permit.
    id_grant: (&'static str, &'static str),
    /// A format-8 fixture's live permits of `fixture/adapted`: granted before its cut, after it.
    adapted: Option<(&'static str, &'static str)>,
}

const V7_CLEAN: V7 = V7 {
    file: "v7-limiter.redb",
    tag: "v7",
    now: "2026-12-04T15:18:00.000Z",
    tpd_first: "2026-12-04T15:17:32.122Z",
    permit: "p-0d4cd275bc5a63aa0000000000000000",
    ticket: "t-acdf5853d14c35620000000000000001",
    retry_at: "2026-12-04T15:18:32.282Z",
    id_grant: ("2026-12-04T15:17:32.326Z", "p-1c6d95d79110808d0000000000000001"),
    adapted: None,
};

const V7_KILLED: V7 = V7 {
    file: "v7-killed-limiter.redb",
    tag: "v7",
    now: "2026-12-04T15:18:00.000Z",
    tpd_first: "2026-12-04T15:17:32.962Z",
    permit: "p-027d7f954080e0920000000000000000",
    ticket: "t-246ba5c484e6bbfe0000000000000001",
    retry_at: "2026-12-04T15:18:33.056Z",
    id_grant: ("2026-12-04T15:17:33.109Z", "p-28cb0a88136dd8970000000000000001"),
    adapted: None,
};

/// What the previous release (format 8, notes of schema 5) wrote into each format-8 fixture
/// (`write-v8.sh`), all on 2026-12-04: what a format-7 fixture holds (its request ids
/// `v8-grant` and `v8-released`), then three grants with `permit` in `fixture/adapted` (10 a
/// minute, `adapt` min 1, max 10, increase 1, keepPct 50): the first released `limited` (the
/// ceiling cut to 5) after the second was granted and before the third.
const V8_CLEAN: V7 = V7 {
    file: "v8-limiter.redb",
    tag: "v8",
    now: "2026-12-04T18:53:52.000Z",
    tpd_first: "2026-12-04T18:53:24.799Z",
    permit: "p-8f94abdcda4e0fb00000000000000000",
    ticket: "t-b042e2dcce7063b80000000000000001",
    retry_at: "2026-12-04T18:54:24.852Z",
    id_grant: ("2026-12-04T18:53:24.871Z", "p-f6f3d45327aeb3ca0000000000000001"),
    adapted: Some(("p-3806c4d7ec92f1ae0000000000000004", "p-c2218bcd42cfb85a0000000000000005")),
};

const V8_KILLED: V7 = V7 {
    file: "v8-killed-limiter.redb",
    tag: "v8",
    now: "2026-12-04T18:53:52.000Z",
    tpd_first: "2026-12-04T18:53:25.120Z",
    permit: "p-667cb5e2265475590000000000000000",
    ticket: "t-e4e941dc295b7a8f0000000000000001",
    retry_at: "2026-12-04T18:54:25.170Z",
    id_grant: ("2026-12-04T18:53:25.189Z", "p-64c0c1503ffc1f810000000000000001"),
    adapted: Some(("p-f3261ec7025025b30000000000000004", "p-7d04ef9e399eafd90000000000000005")),
};

/// The adapted request of the format-8 fixtures.
fn adapted() -> AcquireRequest {
    let adapt = Adapt { min: 1, max: 10, increase: 1, keep_pct: 50 };
    AcquireRequest::new("fixture/cred:1", vec![Limit::window("fixture/adapted", 10, 60_000).with_adapt(adapt)])
        .unwrap()
        .with_permit()
}

/// The token bucket of the format-7 fixtures.
fn tokens(cost: u64) -> AcquireRequest {
    AcquireRequest::new("fixture/cred:1", vec![Limit::bucket("fixture/tokens", 10, 60_000).with_cost(cost)]).unwrap()
}

/// A format-7 or format-8 fixture serves as it was left: windows, place, throttle, the ticket in
/// its line, the request ids and the token bucket's level (refilled by the time that passed,
/// never fuller), format 8's ceiling and its live permits' shares; it is marked this build's
/// format.
fn a_format_7_file_serves_as_before(fixture: &V7) -> (tempfile::TempDir, std::path::PathBuf, Arc<FakeClock>) {
    let (dir, path) = fixture_copy(fixture.file);
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{}-journal", fixture.file));
    if source.exists() {
        std::fs::copy(&source, redb_limiter::store::journal::journal_path(&path)).unwrap();
    }
    let clock = Arc::new(FakeClock::new(at(fixture.now)));
    let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(&path, options).unwrap();
    let snapshot = limiter.state_blocking("fixture/").unwrap();
    let mut buckets: Vec<(String, u64, usize, usize)> =
        snapshot.view.buckets.iter().map(|b| (b.key.clone(), b.window_used, b.places_held, b.queued)).collect();
    if fixture.adapted.is_some() {
        assert_eq!(buckets.remove(0), ("fixture/adapted".to_owned(), 3, 0, 0));
    }
    assert_eq!(
        buckets,
        vec![
            ("fixture/conc".to_owned(), 0, 1, 0),
            ("fixture/ids".to_owned(), 2, 0, 0),
            ("fixture/rpd".to_owned(), 1, 0, 0),
            ("fixture/rpm".to_owned(), 1, 0, 1),
            ("fixture/tokens".to_owned(), 0, 0, 0),
            ("fixture/tpd".to_owned(), 6, 0, 0),
        ]
    );
    assert!(snapshot.view.permits.iter().any(|p| p.id.to_string() == fixture.permit));
    assert_throttled_until(&limiter, at("2026-12-05T11:00:00.000Z"));
    // The request ids: the retry gets its first answer, counted once; the id released before its
    // acquire stays released.
    let grant = AcquireRequest::new("fixture/cred:1", vec![Limit::window("fixture/ids", 5, 86_400_000).with_cost(2)])
        .unwrap()
        .with_permit()
        .with_id(format!("{}-grant", fixture.tag))
        .unwrap();
    let (granted_at, permit) = fixture.id_grant;
    assert_eq!(
        limiter.acquire_blocking(grant).unwrap(),
        Decision::Granted { at: at(granted_at), permit: Some(permit.parse().unwrap()) }
    );
    let released =
        AcquireRequest::new("fixture/cred:1", vec![]).unwrap().with_id(format!("{}-released", fixture.tag)).unwrap();
    assert!(limiter.acquire_blocking(released).is_err());
    assert_tpd_waits_for(&limiter, 5, at(fixture.tpd_first));
    // The bucket kept its level: 2 tokens after the grant of 8, refilled one every 6 s since
    // (about 27 s: 6 whole tokens), so 7 waits.
    let peeked = limiter.peek_blocking(tokens(7)).unwrap();
    assert_eq!(peeked.report.limits[0].bucket, Some((6, 10)));
    assert!(!peeked.fits());
    if let Some((before, after)) = fixture.adapted {
        assert_cut_once_per_overload(&limiter, before, after);
    }
    assert_ticket_kept_its_place(&limiter, &clock, fixture.ticket, fixture.retry_at);
    assert!(limiter.release_blocking(ReleaseRequest::new(fixture.permit).unwrap()).unwrap());
    drop(limiter);

    let store = Store::open(&path, &file_opener()).unwrap();
    assert_eq!(store.format_version().unwrap(), FORMAT_VERSION);
    drop(store);
    (dir, path, clock)
}

/// A format-8 fixture's ceiling (5) and live permits: a `limited` outcome of the grant made before
/// the cut changes nothing; one of the grant made after it cuts again (to 2).
fn assert_cut_once_per_overload(limiter: &Limiter, before: &str, after: &str) {
    let ceiling = || limiter.peek_blocking(adapted()).unwrap().report.limits[0].ceiling;
    assert_eq!(ceiling(), Some(5));
    let limited = |permit: &str| ReleaseRequest::new(permit).unwrap().with_outcome(Signal::Limited);
    assert!(limiter.release_blocking(limited(before)).unwrap());
    assert_eq!(ceiling(), Some(5), "the grant before the cut belongs to the overload it cut for");
    assert!(limiter.release_blocking(limited(after)).unwrap());
    assert_eq!(ceiling(), Some(2));
}

/// From this build on the file keeps adaptive ceilings (section 14) across a restart: a cut, and
/// what the permit counted.
fn keeps_ceilings_from_then_on(path: &std::path::Path, clock: Arc<FakeClock>) {
    let adapted = || {
        AcquireRequest::new(
            "fixture/cred:1",
            vec![Limit::window("fixture/adapted", 10, 60_000).with_adapt(Adapt::defaults(10))],
        )
        .unwrap()
        .with_permit()
    };
    let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(5), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(path, options).unwrap();
    let Decision::Granted { permit: Some(permit), .. } = limiter.acquire_blocking(adapted()).unwrap() else {
        panic!("granted with a permit")
    };
    let settle = SettleRequest::new(permit.to_string(), vec![Cost::new("fixture/adapted", 1)]).unwrap();
    assert!(limiter.settle_blocking(settle.with_outcome(Signal::Limited)).unwrap());
    drop(limiter);
    let options = LimiterOptions { clock: Some(clock), id_seed: Some(6), ..LimiterOptions::default() };
    let limiter = Limiter::open_with(path, options).unwrap();
    assert_eq!(limiter.peek_blocking(adapted()).unwrap().report.limits[0].ceiling, Some(5));
    let ceilings = limiter.state_blocking("fixture/").unwrap().view.ceilings;
    assert_eq!(ceilings.iter().map(|(k, c)| (k.as_str(), c.c)).collect::<Vec<_>>(), vec![("fixture/adapted", 5)]);
}

#[test]
fn a_format_7_file_of_the_previous_release_serves_as_before() {
    let (_dir, path, clock) = a_format_7_file_serves_as_before(&V7_CLEAN);
    keeps_ceilings_from_then_on(&path, clock);
}

/// The previous release's notes (schema 4, a token bucket's level among them) are redone as they
/// were, and the file is marked this build's version before the journal takes a note of it.
#[test]
fn notes_of_schema_4_left_by_a_kill_of_the_previous_release_are_redone_with_their_levels() {
    let (_dir, path, clock) = a_format_7_file_serves_as_before(&V7_KILLED);
    keeps_ceilings_from_then_on(&path, clock);
}

#[test]
fn a_format_8_file_of_the_previous_release_serves_with_its_ceiling_and_adapted_permits() {
    a_format_7_file_serves_as_before(&V8_CLEAN);
}

/// The previous release's notes (schema 5, a ceiling and adapted permits among them) are redone
/// as they were.
#[test]
fn notes_of_schema_5_left_by_a_kill_of_the_previous_release_are_redone_with_their_ceiling() {
    a_format_7_file_serves_as_before(&V8_KILLED);
}
