//! The store: the engine's state in one redb file.
//!
//! It owns the file's layout (the tables below), the encoding of its records, opening (create,
//! refuse, repair), loading the engine back from the file, and committing the engine's
//! [`Effect`]s with `Durability::Immediate`. It never decides anything: every change it writes
//! is an effect the engine reported, and a failed commit leaves the file at the last commit.
//!
//! # Layout (format version 2)
//!
//! | table | key | value |
//! | --- | --- | --- |
//! | `meta` | `"format_version"`, `"clock_floor"` | `u64` |
//! | `buckets` | bucket key | record: [`BucketMeta`] |
//! | `window_log` | (instant ms, bucket key) | total cost granted in that bucket at that millisecond |
//! | `permits` | permit id (`u128`) | record: the places, as (bucket key, lapse ms) |
//! | `throttles` | caller key | `until` ms |
//!
//! A record is one schema-version byte followed by postcard bytes, decoded in our code, so a bad
//! record is an error, never a panic.
//!
//! The window entries are keyed time first, so the grants of one commit, whatever their
//! buckets, land together at the end of `window_log`: a commit of many grants rewrites a page or
//! two of it rather than one page per bucket. Deleting the entries a prune or a forgotten bucket
//! left behind needs their instants, which the store keeps in memory (`WindowIndex`, loaded with
//! the file). A commit that grants deletes them oldest first, a few per grant and only those
//! older than a couple of seconds, so that its deletions too sit together near the start of the
//! log; any other commit (and finishing the store) deletes them all. Until deleted, such entries
//! are like the pruned entries the engine has not yet reported: they only cost file space, and
//! loading prunes them again.
//!
//! The clock floor is the `now` of the last commit: `clock_floor`, or the instant of the last
//! entry of `window_log` when that is later. A commit that grants writes its `now` as that entry,
//! so it leaves `clock_floor` alone (one page less to write); any other commit sets it.
//!
//! Version 1 keyed the window entries bucket first, in a table `grants`; such a file is upgraded
//! to version 2 in one commit when it is opened.

pub mod faulty;

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::backends::FileBackend;
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageBackend,
    TableDefinition, TableHandle,
};
use serde::{Deserialize, Serialize};

use crate::engine::{BucketMeta, Effect, Engine, PermitId};
use crate::time::Millis;

/// The file's layout version; a file of any other version is refused.
pub const FORMAT_VERSION: u64 = 2;
/// The previous layout version, upgraded when opened.
const FORMAT_VERSION_1: u64 = 1;
/// The first byte of every postcard record.
const RECORD_SCHEMA: u8 = 1;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const BUCKETS: TableDefinition<&str, &[u8]> = TableDefinition::new("buckets");
const WINDOW_LOG: TableDefinition<(u64, &str), u64> = TableDefinition::new("window_log");
/// Version 1's window entries, bucket first; moved into `window_log` by the upgrade.
const GRANTS_V1: TableDefinition<(&str, u64), u64> = TableDefinition::new("grants");
const PERMITS: TableDefinition<u128, &[u8]> = TableDefinition::new("permits");
const THROTTLES: TableDefinition<&str, u64> = TableDefinition::new("throttles");

const KEY_FORMAT: &str = "format_version";
const KEY_FLOOR: &str = "clock_floor";

/// Why the store cannot open or commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{path}: the file is held open by another process")]
    HeldElsewhere { path: PathBuf },
    #[error("{path}: the file is corrupt or not a redb file: {cause}")]
    Corrupt { path: PathBuf, cause: String },
    #[error("{path}: not a redb-limiter file (it holds other tables and no `meta` table)")]
    Foreign { path: PathBuf },
    #[error("{path}: unknown format version {found} (this build reads version {FORMAT_VERSION})")]
    UnknownVersion { path: PathBuf, found: u64 },
    #[error("{path}: bad record in table `{table}`: {cause}")]
    BadRecord { path: PathBuf, table: &'static str, cause: String },
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: String },
    #[error("{path}: commit failed: {cause}")]
    Commit { path: PathBuf, cause: String },
}

/// Opens the database: the file backend in production, a fault-injecting one in tests.
pub type Opener = Box<dyn Fn(&Path) -> Result<Database, DatabaseError> + Send + Sync>;

/// The production opener: the file itself, created when missing.
#[must_use]
pub fn file_opener() -> Opener {
    Box::new(|path| {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        open_backend(FileBackend::new(file)?)
    })
}

/// Opens a database on any backend with the store's settings.
pub fn open_backend(backend: impl StorageBackend) -> Result<Database, DatabaseError> {
    Database::builder().create_with_backend(backend)
}

#[derive(Serialize, Deserialize)]
struct PermitRecord {
    places: Vec<(String, u64)>,
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![RECORD_SCHEMA];
    out.extend(postcard::to_allocvec(value).expect("records always serialize"));
    out
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&RECORD_SCHEMA, rest)) => {
            let (value, tail) = postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
            if tail.is_empty() { Ok(value) } else { Err(format!("{} trailing bytes", tail.len())) }
        }
        Some((other, _)) => Err(format!("unknown record schema {other}")),
        None => Err("empty record".to_owned()),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Format {
    Current,
    /// Ours, at version 1: upgraded on open.
    Version1,
    Empty,
}

/// Whether the database is ours at the current (or the previous) version, or empty (new).
fn check_format(db: &impl ReadableDatabase, path: &Path) -> Result<Format, StoreError> {
    let corrupt = |e: &dyn std::fmt::Display| StoreError::Corrupt { path: path.to_path_buf(), cause: e.to_string() };
    let txn = db.begin_read().map_err(|e| corrupt(&e))?;
    let tables: Vec<String> = txn.list_tables().map_err(|e| corrupt(&e))?.map(|t| t.name().to_owned()).collect();
    if tables.iter().any(|t| t == "meta") {
        let meta = txn.open_table(META).map_err(|e| corrupt(&e))?;
        let found = meta.get(KEY_FORMAT).map_err(|e| corrupt(&e))?.map_or(0, |v| v.value());
        return match found {
            FORMAT_VERSION => Ok(Format::Current),
            FORMAT_VERSION_1 => Ok(Format::Version1),
            _ => Err(StoreError::UnknownVersion { path: path.to_path_buf(), found }),
        };
    }
    if tables.is_empty() { Ok(Format::Empty) } else { Err(StoreError::Foreign { path: path.to_path_buf() }) }
}

/// Most `window_log` entries a commit that grants deletes: this many per entry it writes, and
/// at least [`DELETES_PER_COMMIT`] (see the module docs).
const DELETES_PER_GRANT: usize = 2;
const DELETES_PER_COMMIT: usize = 512;
/// A commit that grants deletes only entries at least this old: by then the entries around them
/// are doomed too, so the deletions of one commit sit side by side in the log.
const DELETE_AFTER_MS: u64 = 2_000;

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// What the store knows of `window_log` besides the file: every entry's instant, by bucket.
#[derive(Default)]
struct WindowIndex {
    /// The instants of each bucket's entries not yet doomed, oldest first.
    live: Map<Arc<str>, VecDeque<u64>>,
    /// Entries that nothing counts any more (pruned, or of a forgotten bucket), oldest first,
    /// waiting for their deletion.
    doomed: BTreeSet<(u64, Arc<str>)>,
}

impl WindowIndex {
    fn granted(&mut self, bucket: &Arc<str>, at: u64) {
        let instants = match self.live.get_mut(&**bucket) {
            Some(instants) => instants,
            None => self.live.entry(bucket.clone()).or_default(),
        };
        if instants.back() != Some(&at) {
            instants.push_back(at);
        }
        // Never happens with a clock that moves forward (a doomed entry lies before any `now`),
        // but a rewritten entry must not then be deleted.
        if self.doomed.last().is_some_and(|(last, _)| *last >= at) {
            self.doomed.remove(&(at, bucket.clone()));
        }
    }

    fn pruned(&mut self, bucket: &Arc<str>, through: u64) {
        let Some(instants) = self.live.get_mut(&**bucket) else { return };
        while let Some(&at) = instants.front() {
            if at > through {
                break;
            }
            instants.pop_front();
            self.doomed.insert((at, bucket.clone()));
        }
    }

    fn forgotten(&mut self, bucket: &str) {
        if let Some((bucket, instants)) = self.live.remove_entry(bucket) {
            for at in instants {
                self.doomed.insert((at, bucket.clone()));
            }
        }
    }
}

/// The store: one open redb file.
pub struct Store {
    db: Database,
    path: PathBuf,
    /// Filled by [`Store::load`]; kept in step by every commit.
    index: RefCell<WindowIndex>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (creating when missing) and checks the file. A corrupt file, an unknown format
    /// version, a foreign redb file or one held by another process is refused unmodified.
    pub fn open(path: &Path, opener: &Opener) -> Result<Store, StoreError> {
        let path = path.to_path_buf();
        let map_err = |e: DatabaseError| match e {
            DatabaseError::DatabaseAlreadyOpen => StoreError::HeldElsewhere { path: path.clone() },
            DatabaseError::Storage(redb::StorageError::Io(io)) if io.kind() != std::io::ErrorKind::InvalidData => {
                StoreError::Io { path: path.clone(), cause: io.to_string() }
            }
            other => StoreError::Corrupt { path: path.clone(), cause: other.to_string() },
        };
        // Look before writing: a file that is not ours, of another version or busy is refused
        // through a read-only open, which never modifies it. A file that needs recovery after a
        // crash cannot be opened read-only; the read-write open below repairs it.
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
            match Database::builder().open_read_only(&path) {
                Ok(db) => {
                    check_format(&db, &path)?;
                }
                Err(DatabaseError::RepairAborted) => {}
                Err(e) => return Err(map_err(e)),
            }
        }
        let db = opener(&path).map_err(map_err)?;
        let store = Store { db, path, index: RefCell::default() };
        match check_format(&store.db, &store.path)? {
            Format::Current => {}
            Format::Version1 => store.upgrade_from_version_1()?,
            Format::Empty => store.initialize()?,
        }
        Ok(store)
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn corrupt(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt { path: self.path.clone(), cause: e.to_string() }
    }

    fn commit_error(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Commit { path: self.path.clone(), cause: e.to_string() }
    }

    /// Creates the tables and the meta records of a new file.
    fn initialize(&self) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.commit_error(e))?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.commit_error(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.commit_error(e))?;
            meta.insert(KEY_FORMAT, FORMAT_VERSION).map_err(|e| self.commit_error(e))?;
            meta.insert(KEY_FLOOR, 0).map_err(|e| self.commit_error(e))?;
            txn.open_table(BUCKETS).map_err(|e| self.commit_error(e))?;
            txn.open_table(WINDOW_LOG).map_err(|e| self.commit_error(e))?;
            txn.open_table(PERMITS).map_err(|e| self.commit_error(e))?;
            txn.open_table(THROTTLES).map_err(|e| self.commit_error(e))?;
        }
        txn.commit().map_err(|e| self.commit_error(e))
    }

    /// Moves version 1's `grants` into `window_log` and marks the file version 2, in one
    /// durable commit (a crash before it leaves the file at version 1, upgraded at the next open).
    fn upgrade_from_version_1(&self) -> Result<(), StoreError> {
        let upgrade = || -> Result<(), redb::Error> {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            {
                let old = txn.open_table(GRANTS_V1)?;
                let mut log = txn.open_table(WINDOW_LOG)?;
                for row in old.iter()? {
                    let (k, v) = row?;
                    let (bucket, at) = k.value();
                    log.insert((at, bucket), v.value())?;
                }
            }
            txn.delete_table(GRANTS_V1)?;
            txn.open_table(META)?.insert(KEY_FORMAT, FORMAT_VERSION)?;
            txn.commit()?;
            Ok(())
        };
        upgrade().map_err(|e| self.commit_error(format!("upgrading from format version 1: {e}")))
    }

    /// Loads every persisted fact into `engine` (fresh) and returns the clock floor. The caller
    /// then runs [`Engine::finish_restore`] and commits its effects to prune the file. Commits
    /// come after a load: it also reads the instants of the window entries the commits delete.
    pub fn load(&self, engine: &mut Engine) -> Result<Millis, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.corrupt(e))?;
        let bad = |table: &'static str, cause: String| StoreError::BadRecord { path: self.path.clone(), table, cause };
        let meta = txn.open_table(META).map_err(|e| self.corrupt(e))?;
        let floor = Millis(meta.get(KEY_FLOOR).map_err(|e| self.corrupt(e))?.map_or(0, |v| v.value()));
        for row in txn.open_table(BUCKETS).map_err(|e| self.corrupt(e))?.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let meta: BucketMeta = decode(v.value()).map_err(|e| bad("buckets", e))?;
            engine.restore_bucket(k.value(), meta);
        }
        let mut index = WindowIndex::default();
        let mut floor = floor;
        for row in txn.open_table(WINDOW_LOG).map_err(|e| self.corrupt(e))?.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let (at, bucket) = k.value();
            // Time order overall is time order within each bucket, as `restore_grant` needs.
            engine.restore_grant(bucket, Millis(at), v.value());
            floor = floor.max(Millis(at));
            match index.live.get_mut(bucket) {
                Some(instants) => instants.push_back(at),
                None => {
                    index.live.insert(Arc::from(bucket), VecDeque::from([at]));
                }
            }
        }
        *self.index.borrow_mut() = index;
        for row in txn.open_table(PERMITS).map_err(|e| self.corrupt(e))?.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let record: PermitRecord = decode(v.value()).map_err(|e| bad("permits", e))?;
            engine.restore_permit(
                PermitId(k.value()),
                record.places.into_iter().map(|(b, lapse)| (b, Millis(lapse))).collect(),
            );
        }
        for row in txn.open_table(THROTTLES).map_err(|e| self.corrupt(e))?.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            engine.restore_throttle(k.value(), Millis(v.value()));
        }
        Ok(floor)
    }

    /// Writes `effects` and the clock floor (the caller's `now`, which never runs backwards, and
    /// the instant of any grant among `effects`) in one durable commit. On error nothing of it is in
    /// the file, and the database must be reopened (and loaded) before the next commit.
    pub fn commit(&mut self, effects: &[Effect], floor: Millis) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.commit_error(e))?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.commit_error(e))?;
        self.write_effects(&txn, effects, floor).map_err(|e| self.commit_error(e))?;
        txn.commit().map_err(|e| self.commit_error(e))
    }

    /// Deletes every window entry still waiting for its deletion, in one durable commit (none
    /// when there is nothing to delete). For closing: the file is then as small as it gets.
    pub fn finish(&mut self, floor: Millis) -> Result<(), StoreError> {
        if self.index.get_mut().doomed.is_empty() {
            return Ok(());
        }
        self.commit(&[], floor)
    }

    fn write_effects(
        &mut self,
        txn: &redb::WriteTransaction,
        effects: &[Effect],
        floor: Millis,
    ) -> Result<(), redb::Error> {
        let mut buckets = txn.open_table(BUCKETS)?;
        let mut log = txn.open_table(WINDOW_LOG)?;
        let mut permits = txn.open_table(PERMITS)?;
        let mut throttles = txn.open_table(THROTTLES)?;
        let index = self.index.get_mut();
        let mut written = 0;
        let mut newest = 0;
        for effect in effects {
            match effect {
                Effect::BucketMeta { bucket, meta } => {
                    buckets.insert(&**bucket, encode(meta).as_slice())?;
                }
                Effect::WindowGrant { bucket, at, cost } => {
                    log.insert((at.0, &**bucket), cost)?;
                    index.granted(bucket, at.0);
                    written += 1;
                    newest = newest.max(at.0);
                }
                Effect::WindowPruned { bucket, through } => {
                    index.pruned(bucket, through.0);
                }
                Effect::BucketForgotten { bucket } => {
                    index.forgotten(bucket);
                    buckets.remove(&**bucket)?;
                }
                Effect::PermitGranted { id, places } => {
                    let record =
                        PermitRecord { places: places.iter().map(|(b, lapse)| (b.to_string(), lapse.0)).collect() };
                    permits.insert(id.0, encode(&record).as_slice())?;
                }
                Effect::PermitEnded { id } => {
                    permits.remove(id.0)?;
                }
                Effect::ThrottleSet { key, until } => {
                    throttles.insert(&**key, until.0)?;
                }
                Effect::ThrottleEnded { key } => {
                    throttles.remove(&**key)?;
                }
            }
        }
        let (budget, before) = if written == 0 {
            (usize::MAX, u64::MAX)
        } else {
            (DELETES_PER_COMMIT.max(written * DELETES_PER_GRANT), floor.0.saturating_sub(DELETE_AFTER_MS))
        };
        for _ in 0..budget {
            if index.doomed.first().is_none_or(|(at, _)| *at > before) {
                break;
            }
            let (at, bucket) = index.doomed.pop_first().expect("checked");
            log.remove((at, &*bucket))?;
        }
        if newest < floor.0 {
            txn.open_table(META)?.insert(KEY_FLOOR, floor.0)?;
        }
        Ok(())
    }

    /// The number of window entries in the file (for tests of file size and pruning).
    pub fn grant_rows(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.corrupt(e))?;
        let table = txn.open_table(WINDOW_LOG).map_err(|e| self.corrupt(e))?;
        table.len().map_err(|e| self.corrupt(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_bad_records_are_errors() {
        let meta = BucketMeta { retain_ms: 60_000, last_calls: 50, last_concurrent: 4 };
        let bytes = encode(&meta);
        assert_eq!(bytes[0], RECORD_SCHEMA);
        assert_eq!(decode::<BucketMeta>(&bytes), Ok(meta));
        assert!(decode::<BucketMeta>(&[]).is_err());
        assert!(decode::<BucketMeta>(&[9, 1, 2, 3]).unwrap_err().contains("schema 9"));
        assert!(decode::<BucketMeta>(&bytes[..2]).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode::<BucketMeta>(&long).unwrap_err().contains("trailing"));
    }

    use crate::engine::EngineConfig;

    fn bucket(key: &str) -> Arc<str> {
        Arc::from(key)
    }

    fn grant(key: &str, at: u64, cost: u64) -> Effect {
        Effect::WindowGrant { bucket: bucket(key), at: Millis(at), cost }
    }

    /// The window entries of the file, in key order.
    fn log_rows(store: &Store) -> Vec<(u64, String, u64)> {
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(WINDOW_LOG).unwrap();
        table
            .iter()
            .unwrap()
            .map(|row| {
                let (k, v) = row.unwrap();
                let (at, bucket) = k.value();
                (at, bucket.to_owned(), v.value())
            })
            .collect()
    }

    fn open_loaded(path: &Path) -> (Store, Engine, Millis) {
        let store = Store::open(path, &file_opener()).unwrap();
        let mut engine = Engine::new(EngineConfig::default());
        let floor = store.load(&mut engine).unwrap();
        (store, engine, floor)
    }

    #[test]
    fn doomed_entries_are_deleted_oldest_first_once_old_and_all_at_finish() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let (mut store, _, _) = open_loaded(&path);
        store.commit(&[grant("a", 1_000, 1), grant("b", 1_500, 2), grant("a", 2_000, 1)], Millis(2_000)).unwrap();
        store.commit(&[grant("a", 2_000, 3)], Millis(2_000)).unwrap(); // a second grant in the same ms
        assert_eq!(log_rows(&store), vec![(1_000, "a".into(), 1), (1_500, "b".into(), 2), (2_000, "a".into(), 3)]);
        // Pruned and forgotten entries go once they are old enough, in a commit that grants...
        let effects = [
            Effect::WindowPruned { bucket: bucket("a"), through: Millis(1_000) },
            Effect::BucketForgotten { bucket: bucket("b") },
            grant("c", 3_200, 1),
        ];
        store.commit(&effects, Millis(3_200)).unwrap();
        assert_eq!(log_rows(&store), vec![(1_500, "b".into(), 2), (2_000, "a".into(), 3), (3_200, "c".into(), 1)]);
        store.commit(&[grant("c", 3_700, 1)], Millis(3_700)).unwrap();
        assert_eq!(log_rows(&store), vec![(2_000, "a".into(), 3), (3_200, "c".into(), 1), (3_700, "c".into(), 1)]);
        // ... and all at once in a commit that grants nothing.
        store.commit(&[Effect::WindowPruned { bucket: bucket("c"), through: Millis(3_200) }], Millis(3_800)).unwrap();
        assert_eq!(log_rows(&store), vec![(2_000, "a".into(), 3), (3_700, "c".into(), 1)]);
        let effects = [Effect::WindowPruned { bucket: bucket("c"), through: Millis(3_700) }, grant("d", 3_900, 1)];
        store.commit(&effects, Millis(3_900)).unwrap();
        assert_eq!(log_rows(&store), vec![(2_000, "a".into(), 3), (3_700, "c".into(), 1), (3_900, "d".into(), 1)]);
        drop(store);

        // The floor is the last grant's instant, which the commits that grant leave out of `meta`
        // (it holds 3800, from the commit that granted nothing). A doomed entry the store forgot
        // is loaded again (and pruned by the engine).
        let (mut store, _, floor) = open_loaded(&path);
        assert_eq!(floor, Millis(3_900));
        let effects = [
            Effect::WindowPruned { bucket: bucket("c"), through: Millis(3_700) },
            Effect::BucketForgotten { bucket: bucket("a") },
            grant("e", 4_000, 1),
        ];
        store.commit(&effects, Millis(4_000)).unwrap();
        assert_eq!(log_rows(&store), vec![(3_700, "c".into(), 1), (3_900, "d".into(), 1), (4_000, "e".into(), 1)]);
        // Finishing deletes every doomed entry, however young.
        store.finish(Millis(4_000)).unwrap();
        assert_eq!(log_rows(&store), vec![(3_900, "d".into(), 1), (4_000, "e".into(), 1)]);
        store.finish(Millis(4_000)).unwrap();
        assert_eq!(store.grant_rows().unwrap(), 2);
    }

    #[test]
    fn a_version_1_file_is_upgraded_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let meta = BucketMeta { retain_ms: 60_000, last_calls: 5, last_concurrent: 0 };
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut m = txn.open_table(META).unwrap();
                m.insert(KEY_FORMAT, FORMAT_VERSION_1).unwrap();
                m.insert(KEY_FLOOR, 10_000).unwrap();
                txn.open_table(BUCKETS).unwrap().insert("w", encode(&meta).as_slice()).unwrap();
                let mut grants = txn.open_table(GRANTS_V1).unwrap();
                grants.insert(("w", 9_000), 2).unwrap();
                grants.insert(("w", 9_500), 1).unwrap();
                grants.insert(("v", 9_200), 4).unwrap();
                txn.open_table(PERMITS).unwrap();
                txn.open_table(THROTTLES).unwrap();
            }
            txn.commit().unwrap();
        }
        let (store, engine, floor) = open_loaded(&path);
        assert_eq!(floor, Millis(10_000));
        assert_eq!(log_rows(&store), vec![(9_000, "w".into(), 2), (9_200, "v".into(), 4), (9_500, "w".into(), 1)]);
        let facts = engine.facts(Millis(10_000));
        assert_eq!(facts.buckets["w"].0, vec![(Millis(9_000), 2), (Millis(9_500), 1)]);
        let txn = store.db.begin_read().unwrap();
        assert_eq!(txn.open_table(META).unwrap().get(KEY_FORMAT).unwrap().unwrap().value(), FORMAT_VERSION);
        assert!(txn.list_tables().unwrap().all(|t| t.name() != "grants"));
    }
}
