//! The store: the engine's state in one redb file.
//!
//! It owns the file's layout (the tables below), the encoding of its records, opening (create,
//! refuse, repair), loading the engine back from the file, and committing the engine's
//! [`Effect`]s with `Durability::Immediate`. It never decides anything: every change it writes
//! is an effect the engine reported, and a failed commit leaves the file at the last commit.
//!
//! # Files
//!
//! One database path, `limiter.redb` by default, and its page journal beside it,
//! `limiter.redb-journal` ([`journal`]): a durable redb commit is one sequential append to the
//! journal and one sync, and the file itself is written at checkpoints. The file alone is always
//! a whole redb database as of its last checkpoint; the journal holds the commits after it.
//! [`Store::open`] replays them into the file before anything else looks at it, so a file is
//! checked (and refused) exactly as if it had no journal. A journal whose file is missing, or
//! that holds commits of another file, is refused naming it, and changes nothing.
//!
//! # Notes: one append per commit
//!
//! Behind its journal, [`Store::commit`] does not make a redb commit: it appends the commit's
//! floor and effects to the journal as a note (postcard after schema byte 1; one append and one
//! sync) and keeps them in memory. One redb commit of the notes alone takes them into the file once
//! [`NOTES_BEFORE_COMMIT`] wait (or their effects pass
//! [`NOTE_EFFECTS_BEFORE_COMMIT`]), before any other
//! redb commit (a tidying one, a commit too large for a note), at quiet moments
//! ([`Store::apply_notes`]) and at [`Store::finish`]. A redb commit costs tens of microseconds of
//! CPU whatever it holds; a note costs a few. An open redoes the notes a crash left, in order, in
//! one commit, before the file is loaded. Redoing a note whose commit already reached redb is
//! harmless: every effect sets or removes a record, and the commit holding notes holds nothing
//! else, so doing them again leaves the same records. Without a journal (the file alone) every
//! commit is a redb commit.
//!
//! # Layout (format version 8)
//!
//! | table | key | value |
//! | --- | --- | --- |
//! | `meta` | `"format_version"`, `"clock_floor"`; behind a journal `"journal_id"`, `"journal_seq"`, `"journal_open"` ([`FileClaim`]) | `u64` |
//! | `buckets` | bucket key | record: [`BucketMeta`] |
//! | `grants_by_time` | (instant ms, bucket key) | total cost counted (as granted, then settled) in that bucket at that millisecond |
//! | `permits` | permit id (`u128`) | record: the grant's instant, the expiry, the places as (bucket key, lapse ms), the shares as (bucket key, cost, calls or burst at the grant, a token bucket's (refill, perMs)), and the adapted buckets (bucket key, its `adapt`, the request's own `calls` or `refill`, `perMs`, whether the ceiling was in play at the grant, whether an outcome counted, the count of cuts the ceiling had at the grant) |
//! | `throttles` | caller key | `until` ms |
//! | `tickets` | ticket id (`u128`) | record: filed at, the `retryAt` last given, the lapse, the grace, the caller key, the limits it binds (defaults resolved, sorted by bucket key), and the instant its horizon ends |
//! | `requests` | (first kept at ms, request id) (section 16) | record: the digest of its params, until when it is kept, and what its acquire got (a grant's instant, permit and, without a permit, its shares; a filing's ticket and refusal; or released) |
//! | `levels` | bucket key (section 13) | record: a token bucket's level (units of `1/perMs` token), at an instant, with the `refill`, `perMs` and `burst` that wrote it |
//! | `ceilings` | bucket key (section 14) | record: the adaptive ceiling `C`, the `max` last named, the instants of its latest cut, growth and signal, and its count of cuts |
//!
//! Version 3 (wire version 2: settle, place-less permits) changed only the permit record: its
//! schema byte is 2. A version-2 file opens unchanged: its permit records (schema byte 1, the
//! places only) are read as permits that live until their last place lapses and count in no
//! window a settle could name. Version 4 changed no record: it says that the file may have a
//! journal beside it holding its newest commits. Files of versions 2 and 3 open unchanged and
//! are marked version 4 on the file itself before the journal takes any commit, so an older
//! build, which would read neither a newer record nor a journal, refuses the file instead.
//!
//! Behind a journal, the file names it from its first open on: every open writes the journal's
//! id, how far its records reach, and `journal_open` = 1 into `meta` and checkpoints that into
//! the file itself; a clean close ([`Store::finish`]) sets `journal_open` to 0; each redb commit
//! updates `journal_seq`. So a file that was not closed cleanly knows it needs its journal, and
//! [`Store::open`] refuses a journal that is missing then, another file's, or an earlier copy of
//! its own, before either file is touched (a file a crash left for redb to repair is read for
//! this in memory, unchanged). These keys came
//! in format version 4's time and change no record.
//!
//! Version 5 (the line, section 12) added the `tickets` table, and journal notes of schema 2,
//! which may carry a ticket's effects: filed inserts its record, renewed rewrites its `retryAt`,
//! lapse and grace, ended or lapsed deletes it. Files of versions 2, 3 and 4 open unchanged
//! (an older file has no `tickets` table: the marking creates it empty) and are marked version
//! 5 before the journal takes any commit of this build; a journal of a version-4 file may still
//! hold notes of schema 1 (a crash of the previous release), which are redone as they were,
//! then the file is marked. An older build refuses a version-5 file, and a note of schema 2,
//! rather than misread a ticket. On load each ticket is restored into its lines, then
//! [`Engine::resume_line`] lapses those lapsed at the file's floor and gives every other one a
//! lapse no sooner than the restart plus its grace (section 12.6). A filing, a grant that ends
//! a ticket and a leave are committed (as a note or a redb commit) before their replies; a
//! renewal or a lapse rides with the next commit, and may be lost in a crash: the ticket then
//! keeps its older lapse, which the restart moves anyway.
//!
//! Version 6 (request ids, section 16) added the `requests` table, and journal notes of schema
//! 3, which may carry a request id's effects: kept inserts or rewrites its record (committed
//! with the grant, filing or release it names), forgotten deletes it (riding with the next
//! commit: a record a crash keeps is forgotten again after the restart). Files of versions 2 to
//! 5 open unchanged and are marked version 6 (the marking creates the table empty) before the
//! journal takes any commit of this build; notes of schemas 1 and 2 left by a crash of an older
//! release are redone as they were. An older build refuses a version-6 file, and a note of
//! schema 3, rather than forget a request id.
//!
//! Version 7 (token buckets, section 13) added the `levels` table, and journal notes of schema
//! 4: a level set (after every grant and settle that changes it, committed before the reply)
//! rewrites its record, a level forgotten (full, no place held) deletes it and may be lost in a
//! crash (the level kept refills to full by the restart, and is forgotten again then). Its
//! permit records (schema byte 3) and request ids' (schema byte 2) may hold a token bucket's
//! share; its tickets (schema byte 2) may bind token buckets and keep the instant their horizon
//! ends (section 12.9), so a restart keeps a ticket's own `maxWaitMs`. Files of versions 2 to 6
//! open unchanged: their records (permits of schema 1 and 2, tickets and request ids of schema 1)
//! are read as they were written, a ticket without its horizon bounded by the server's from its
//! filing; the marking creates the `levels` table empty. Notes of schemas 1 to 3 left by a crash
//! of an older release are redone as they were. An older build refuses a version-7 file, and a
//! note of schema 4, rather than forget a bucket's level. On load a level refills from its
//! instant by the time that passed, so a bucket is never fuller after a restart than its refill
//! allows.
//!
//! Version 8 (adaptive ceilings, section 14) added the `ceilings` table, and journal notes of
//! schema 5: a ceiling set (an outcome that counted, committed before its reply) rewrites its
//! record, a ceiling forgotten deletes it and may be lost in a crash (a restart forgets it
//! again). Its permit records (schema byte 4) keep the adapted buckets of their grant, and its
//! tickets (schema byte 3) each limit's `adapt`. Files of versions 2 to 7 open unchanged: their
//! permits adapt nothing and their tickets' limits have no `adapt`; the marking creates the
//! `ceilings` table empty. Notes of schemas 1 to 4 left by a crash of an older release are redone
//! as they were. An older build refuses a version-8 file, and a note of schema 5, rather than
//! forget a ceiling.
//!
//! Version 9 orders a grant and a cut within one millisecond (section 14's "after the latest
//! cut"): a ceiling's record (schema byte 2) counts its cuts, a permit's (schema byte 5) keeps,
//! for each adapted bucket, the count it saw at the grant, and journal notes have schema 6.
//! Version 8's records read as counting no cut and seeing none, which is how version 8 judged
//! them (by the millisecond); the marking changes no table. Notes of schemas 1 to 5 are redone
//! as they were. An older build refuses a version-9 file, and a note of schema 6.
//!
//! Grants are keyed by time first, so the grants of one commit (all at one `now`) sit together
//! in one leaf of the tree, whatever buckets they belong to: a commit writes a few pages, not one
//! per bucket touched.
//!
//! The clock floor is the `now` of the latest commit: no `now` after a reopen runs behind it, so
//! nothing a commit judged lapsed (a pruned grant, a forgotten bucket, an ended throttle or
//! permit) can count again, and windows only grow at their end. It is the larger of
//! `clock_floor` and the newest grant's instant. A commit whose newest grant is at its own `now`
//! (every one-at-a-time grant) holds its floor in that grant and skips the `meta` write, one page
//! of seven; any other commit records `clock_floor`.
//!
//! When doomed grants and records are deleted is [`crate::policy`]'s to say; in short:
//! the grants a prune or a forgotten bucket reports are spread over time (a bucket's pruned
//! grants span its window), so deleting them at once would dirty one leaf each. Instead the store
//! dooms them and deletes doomed grants together, about oldest first. A commit that carries a
//! request's change deletes only once [`DELETE_BATCH`] are due (about a leaf's worth, so one
//! commit in many pays for it), at most a few per grant it writes, and only those
//! [`DELETE_AFTER_MS`] old, or twice as old as when they were doomed if that is sooner (by then
//! the grants around them in the log are doomed too). [`Store::commit_and_tidy`] (a sweep's
//! forgetting, a reopen's prune) and [`Store::finish`] delete them all. A commit that writes a
//! bucket's record (its window grew, or it was created again) first deletes that bucket's doomed
//! grants; the engine reports what a bucket pruned before its window grows. So until deleted, a
//! doomed grant only costs space: its bucket's window never grew since it was pruned, and
//! loading the file prunes it again.
//!
//! A forgotten bucket's record is kept the same way, until [`RECORD_DELETE_BATCH`] wait (or a
//! tidying commit): a bucket that comes back with the same record, as a key with sparse
//! traffic does every time its window empties, then writes nothing. Until deleted, the record
//! only costs space: loading the file restores an empty bucket and forgets it again.
//!
//! A record is one schema-version byte followed by postcard bytes, decoded in our code, so a bad
//! record is an error, never a panic.
//!
//! The file's size follows the live state: once free space dominates it (a burst of keys that
//! went idle and were deleted), [`Store::compact_if_sparse`] gives the space back while serving;
//! the writer calls it at quiet moments.
//!
//! # Fault model
//!
//! Crashes, power loss and torn writes at any instant lose nothing acknowledged: every commit is
//! a note or a `Durability::Immediate` redb commit, its journal record is synced before it
//! returns (a torn or unsynced tail record is a commit never acknowledged, dropped at replay),
//! and redb recovers to the last whole commit. With notes waiting, the file alone is an older
//! state: [`Store::open`] then skips its read-only look (the journal open checks every page) and
//! [`plain_file_opener`] refuses it. Damage to the bytes of the
//! file is refused at open with the file named, never served: every open verifies the checksum
//! of every page of the committed trees (redb's integrity check), a panic of redb on a damaged
//! file is caught and reported as corruption, and every record loaded is checked against what
//! the engine can have written (keys of 1 to 512 bytes, a bucket's `perMs`, `calls` and
//! `concurrent` within the request bounds, a grant row's cost, a permit id's sequence, a lapse or
//! a throttle's end at most 24 hours after the file's floor, a ticket's limits sorted and its
//! grace, `retryAt` and lapse within the request bounds). One case cannot be told from a
//! crash, as in every database: damage to the newest commit's own header is indistinguishable
//! from that commit torn by a crash, and the file is rolled back to the commit before it. Damage
//! to free space changes nothing. A 503 after a commit failed at its final sync may still count
//! after a restart (the sync may have reached the disk), never more than once.

#[cfg(any(test, feature = "test-util"))]
pub mod faulty;
pub mod journal;

use journal::{FileClaim, JournalBackend, JournalError, JournalMonitor, JournalOptions, journal_path};

use crate::policy::{
    DELETE_AFTER_MS, DELETE_BATCH, DELETES_PER_COMMIT, DELETES_PER_GRANT, NOTE_EFFECTS_BEFORE_COMMIT,
    NOTES_BEFORE_COMMIT, RECORD_DELETE_BATCH,
};
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::backends::FileBackend;
use redb::{
    Database, DatabaseError, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, StorageBackend,
    TableDefinition, TableHandle,
};
use serde::{Deserialize, Serialize};

use crate::engine::{
    AdaptedShare, BucketLevel, BucketMeta, Ceiling, Effect, Engine, Outcome, PermitId, PermitState, REMEMBER_MS,
    Reason, RequestRecord, TicketId, TicketState, WindowShare,
};
use crate::request::{
    Adapt, BucketLimit, Limit, MAX_CALLS, MAX_CONCURRENT, MAX_GRACE_MS, MAX_HOLD_MS, MAX_ID_BYTES, MAX_KEY_BYTES,
    MAX_LIMITS, MAX_PER_MS, MAX_THROTTLE_AHEAD_MS, MIN_GRACE_MS, WindowLimit,
};
use crate::time::Millis;

/// The table `slot` holds, opened in `txn` on first use.
fn opened<'s, 'txn, K: redb::Key + 'static, V: redb::Value + 'static>(
    slot: &'s mut Option<redb::Table<'txn, K, V>>,
    txn: &'txn redb::WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<&'s mut redb::Table<'txn, K, V>, redb::TableError> {
    if slot.is_none() {
        *slot = Some(txn.open_table(table)?);
    }
    Ok(slot.as_mut().expect("just opened"))
}

/// The most one grant row (a bucket's grants in one millisecond) can hold: far more than any
/// window is granted, far less than a flipped high byte makes of it.
const MAX_GRANT_ROW_COST: u64 = 1 << 50;
/// The highest permit sequence one run of the limiter can reach (see `PermitIds`).
const MAX_PERMIT_SEQUENCE: u64 = 1 << 48;

/// A file no larger than this is never compacted while serving (see [`Store::compact_if_sparse`]).
pub const COMPACT_ABOVE_BYTES: u64 = 1 << 20;

/// The file's layout version; a file of a version outside [`OLDEST_FORMAT_VERSION`] to this one
/// is refused.
pub const FORMAT_VERSION: u64 = 9;
/// The oldest version read: files of the versions before [`FORMAT_VERSION`] open unchanged and
/// are marked current (see the module docs).
pub const OLDEST_FORMAT_VERSION: u64 = 2;
/// The first byte of every postcard record but a permit's.
const RECORD_SCHEMA: u8 = 1;
/// The first byte of a permit record of format versions 3 to 6 (window shares only).
const PERMIT_SCHEMA_V3: u8 = 2;
/// The first byte of a permit record of format version 7 (shares may be token buckets').
const PERMIT_SCHEMA_V7: u8 = 3;
/// The first byte of a permit record of format version 8 (with its adapted buckets).
const PERMIT_SCHEMA_V8: u8 = 4;
/// The first byte of a permit record since format version 9 (each adapted bucket with the
/// count of cuts its grant saw).
const PERMIT_SCHEMA: u8 = 5;
/// The first byte of a ceiling's record since format version 9 (with its count of cuts);
/// version 8's has [`RECORD_SCHEMA`].
const CEILING_SCHEMA: u8 = 2;
/// The first byte of a ticket's and a request id's record since format version 7 (a ticket's
/// limits may be token buckets, and it keeps its horizon; an id's shares may be token buckets').
const RECORD_SCHEMA_V7: u8 = 2;
/// The first byte of a ticket's record since format version 8 (its limits may adapt).
const TICKET_SCHEMA: u8 = 3;
/// Schema byte of a journal note ([`Note`]) as format version 4 wrote it: no ticket effects.
/// Still read (a crash of the previous release can leave such notes).
const NOTE_SCHEMA_V4: u8 = 1;
/// Schema byte of a journal note as format version 5 wrote it: its effects may be a ticket's,
/// never a request id's. Still read (a crash of the previous release can leave such notes).
const NOTE_SCHEMA_V5: u8 = 2;
/// Schema byte of a journal note as format version 6 wrote it: its effects may be a request
/// id's, never a token bucket's. Still read (a crash of the previous release can leave such notes).
const NOTE_SCHEMA_V6: u8 = 3;
/// Schema byte of a journal note as format version 7 wrote it: its effects may be a token
/// bucket's, never a ceiling's. Still read (a crash of the previous release can leave such notes).
const NOTE_SCHEMA_V7: u8 = 4;
/// Schema byte of a journal note as format version 8 wrote it: its effects may be an adaptive
/// ceiling's, and its permits and tickets are written in their version-8 records. Still read (a
/// crash of the previous release can leave such notes).
const NOTE_SCHEMA_V8: u8 = 5;
/// Schema byte of a journal note since format version 9: its ceilings and permits are written in
/// their version-9 records (counting cuts), which an older build, reading schemas 1 to 5 only,
/// refuses rather than misreads.
const NOTE_SCHEMA: u8 = 6;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const BUCKETS: TableDefinition<&str, &[u8]> = TableDefinition::new("buckets");
const GRANTS: TableDefinition<(u64, &str), u64> = TableDefinition::new("grants_by_time");
const PERMITS: TableDefinition<u128, &[u8]> = TableDefinition::new("permits");
const THROTTLES: TableDefinition<&str, u64> = TableDefinition::new("throttles");
const TICKETS: TableDefinition<u128, &[u8]> = TableDefinition::new("tickets");
const REQUESTS: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("requests");
const LEVELS: TableDefinition<&str, &[u8]> = TableDefinition::new("levels");
const CEILINGS: TableDefinition<&str, &[u8]> = TableDefinition::new("ceilings");

const KEY_FORMAT: &str = "format_version";
const KEY_FLOOR: &str = "clock_floor";
/// The journal the file is open behind ([`JournalMonitor::journal_id`]); see [`FileClaim`].
const KEY_JOURNAL_ID: &str = "journal_id";
/// The journal's next sequence number when the newest commit began ([`FileClaim::next_seq`]).
const KEY_JOURNAL_SEQ: &str = "journal_seq";
/// 1 from the open behind a journal until a clean close, which sets 0 ([`FileClaim::open`]).
const KEY_JOURNAL_OPEN: &str = "journal_open";

/// Why the store cannot open or commit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{path}: the file is held open by another process")]
    HeldElsewhere { path: PathBuf },
    #[error("{path}: the file is corrupt or not a redb file: {cause}")]
    Corrupt {
        path: PathBuf,
        #[source]
        cause: redb::Error,
    },
    #[error("{path}: not a redb-limiter file (it holds other tables and no `meta` table)")]
    Foreign { path: PathBuf },
    #[error(
        "{path}: unknown format version {found} (this build reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
    )]
    UnknownVersion { path: PathBuf, found: u64 },
    #[error("{path}: bad record in table `{table}`: {cause}")]
    BadRecord { path: PathBuf, table: &'static str, cause: String },
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        #[source]
        cause: std::io::Error,
    },
    #[error("{path}: commit failed: {cause}")]
    Commit {
        path: PathBuf,
        #[source]
        cause: redb::Error,
    },
    /// The journal beside the file cannot be replayed onto it.
    #[error("{journal} (the journal of {path}): {cause}")]
    Journal {
        path: PathBuf,
        journal: PathBuf,
        #[source]
        cause: JournalError,
    },
    /// The file was not closed cleanly, and the journal holding its newest commits is gone.
    #[error(
        "{path} was not closed cleanly and its journal {journal} is missing: the newest commits were only in the journal; restore it beside the file"
    )]
    JournalMissing { path: PathBuf, journal: PathBuf },
    /// A journal is there but not its database file.
    #[error(
        "{journal} is a journal of {path}, which does not exist: restore the file (its newest commits are in the journal), or delete the journal too to start empty"
    )]
    JournalWithoutFile { path: PathBuf, journal: PathBuf },
    /// The file open is no longer the one at its path (deleted, or replaced by another).
    #[error("{path}: {cause}; nothing more is committed until the server is restarted")]
    Lost { path: PathBuf, cause: &'static str },
}

/// Opens the database: the file behind its journal in production, a fault-injecting backend in
/// tests.
pub type Opener = Box<dyn Fn(&Path) -> Result<Opened, DatabaseError> + Send + Sync>;

/// A database an [`Opener`] opened, with a handle on its journal when it has one.
pub struct Opened {
    pub db: Database,
    pub journal: Option<JournalMonitor>,
}

impl From<Database> for Opened {
    fn from(db: Database) -> Self {
        Opened { db, journal: None }
    }
}

/// The production opener: the file behind its page journal ([`journal::journal_path`]: the
/// file's name with `-journal` added), both created when missing. Every durable commit is one
/// append to the journal and one sync (see [`journal`]).
#[must_use]
pub fn file_opener() -> Opener {
    Box::new(|path| open_journaled(JournalBackend::open_path(path, &JournalOptions::default())))
}

/// A database on a journal just opened (or the journal's error, as redb's).
fn open_journaled(journal: Result<JournalBackend, JournalError>) -> Result<Opened, DatabaseError> {
    let journal = journal.map_err(|e| match e {
        JournalError::Held => DatabaseError::DatabaseAlreadyOpen,
        other => DatabaseError::Storage(redb::StorageError::Io(other.into())),
    })?;
    let monitor = journal.monitor();
    Ok(Opened { db: open_backend(journal)?, journal: Some(monitor) })
}

/// The file alone, without a journal: every durable commit is redb's own (its pages written in
/// place, then one sync). For comparisons; [`Store::open`] replays a journal left beside the file
/// before any opener sees it, so either opener may follow the other, except that this one
/// refuses a file whose journal still holds commits as notes (a crash left them).
#[must_use]
pub fn plain_file_opener() -> Opener {
    Box::new(|path| {
        // Commits kept as notes are not in the file: without the journal they would be lost.
        if journal_path(path).exists() {
            let recovery = JournalBackend::recover_path(path, read_claim(path).as_ref()).map_err(|e| match e {
                JournalError::Held => DatabaseError::DatabaseAlreadyOpen,
                other => DatabaseError::Storage(redb::StorageError::Io(other.into())),
            })?;
            if recovery.pending_notes > 0 {
                let why = "its journal holds commits not yet in the file: open it behind its journal";
                return Err(DatabaseError::Storage(redb::StorageError::Io(std::io::Error::other(why))));
            }
        }
        open_plain(path).map(Opened::from)
    })
}

fn open_plain(path: &Path) -> Result<Database, DatabaseError> {
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
    open_backend(FileBackend::new(file)?)
}

/// Opens a database on any backend with the store's settings: every page's checksum is
/// verified at open (redb's integrity check), before anything is read from it, so a flipped
/// byte anywhere in the trees is refused, never loaded (see the module docs' fault model).
pub fn open_backend(backend: impl StorageBackend) -> Result<Database, DatabaseError> {
    Database::builder().set_check_integrity_on_open(true).create_with_backend(backend)
}

/// A permit as format version 2 wrote it (schema byte 1): its places only.
#[derive(Serialize, Deserialize)]
struct PermitRecordV2 {
    places: Vec<(String, u64)>,
}

/// A permit as format versions 3 to 6 wrote it (schema byte 2): window shares only.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct PermitRecordV3 {
    at: u64,
    expires: u64,
    places: Vec<(String, u64)>,
    windows: Vec<(String, u64, u64)>,
}

/// A share of a grant as a record holds it: (bucket key, cost, cap, a token bucket's
/// `(refill, perMs)`).
type ShareRecord = (String, u64, u64, Option<(u64, u64)>);

fn share_record(w: &WindowShare) -> ShareRecord {
    (w.bucket.to_string(), w.cost, w.cap, w.tokens)
}

fn share_state((bucket, cost, cap, tokens): ShareRecord) -> WindowShare {
    WindowShare { bucket: Arc::from(bucket), cost, cap, tokens }
}

/// A window's share as format versions 3 to 6 wrote it.
fn window_share((bucket, cost, cap): (String, u64, u64)) -> ShareRecord {
    (bucket, cost, cap, None)
}

/// A permit (schema byte 3, format version 7).
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct PermitRecord {
    at: u64,
    expires: u64,
    places: Vec<(String, u64)>,
    windows: Vec<ShareRecord>,
}

impl From<PermitRecordV3> for PermitRecord {
    fn from(old: PermitRecordV3) -> Self {
        let windows = old.windows.into_iter().map(window_share).collect();
        PermitRecord { at: old.at, expires: old.expires, places: old.places, windows }
    }
}

impl PermitRecord {
    fn from_state(p: &PermitState) -> Self {
        PermitRecord {
            at: p.at.0,
            expires: p.expires.0,
            places: p.places.iter().map(|(b, lapse)| (b.to_string(), lapse.0)).collect(),
            windows: p.windows.iter().map(share_record).collect(),
        }
    }

    fn into_state(self) -> PermitState {
        PermitState {
            at: Millis(self.at),
            expires: Millis(self.expires),
            places: self.places.into_iter().map(|(b, lapse)| (Arc::from(b), Millis(lapse))).collect(),
            windows: self.windows.into_iter().map(share_state).collect(),
            adapted: Vec::new(),
        }
    }
}

/// One adapted bucket of a permit's grant (format version 8): the bucket, its `adapt` as
/// (min, max, increase, keepPct), the request's own `calls` or `refill`, its `perMs`, and
/// whether the ceiling was in play at the grant and an outcome counted there.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct AdaptedRecord {
    bucket: String,
    adapt: (u64, u64, u64, u64),
    start: u64,
    per_ms: u64,
    in_play: bool,
    signalled: bool,
}

fn adapt_record(a: &Adapt) -> (u64, u64, u64, u64) {
    (a.min, a.max, a.increase, a.keep_pct)
}

fn adapt_state((min, max, increase, keep_pct): (u64, u64, u64, u64)) -> Adapt {
    Adapt { min, max, increase, keep_pct }
}

impl AdaptedRecord {
    fn from_state(a: &AdaptedShare) -> Self {
        AdaptedRecord {
            bucket: a.bucket.to_string(),
            adapt: adapt_record(&a.adapt),
            start: a.start,
            per_ms: a.per_ms,
            in_play: a.in_play,
            signalled: a.signalled,
        }
    }

    /// The share, its grant having seen `cuts_seen` cuts (version 8's saw none).
    fn into_state(self, cuts_seen: u64) -> AdaptedShare {
        AdaptedShare {
            bucket: Arc::from(self.bucket),
            adapt: adapt_state(self.adapt),
            start: self.start,
            per_ms: self.per_ms,
            in_play: self.in_play,
            signalled: self.signalled,
            cuts_seen,
        }
    }
}

/// A permit (schema byte 4, format version 8): version 7's, and its adapted buckets.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct PermitRecordV8 {
    permit: PermitRecord,
    adapted: Vec<AdaptedRecord>,
}

impl PermitRecordV8 {
    fn into_state(self) -> PermitState {
        let adapted = self.adapted.into_iter().map(|a| a.into_state(0)).collect();
        PermitState { adapted, ..self.permit.into_state() }
    }
}

/// A permit (schema byte 5, format version 9): version 8's, each adapted bucket with the count
/// of cuts its grant saw.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct PermitRecordV9 {
    permit: PermitRecord,
    adapted: Vec<(AdaptedRecord, u64)>,
}

impl PermitRecordV9 {
    fn from_state(p: &PermitState) -> Self {
        let adapted = p.adapted.iter().map(|a| (AdaptedRecord::from_state(a), a.cuts_seen)).collect();
        PermitRecordV9 { permit: PermitRecord::from_state(p), adapted }
    }

    fn into_state(self) -> PermitState {
        let adapted = self.adapted.into_iter().map(|(a, cuts_seen)| a.into_state(cuts_seen)).collect();
        PermitState { adapted, ..self.permit.into_state() }
    }
}

/// An adaptive ceiling (schema byte 1, format version 8), keyed by the bucket.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct CeilingRecord {
    c: u64,
    max: u64,
    cut_at: Option<u64>,
    grown_at: Option<u64>,
    signal_at: u64,
}

/// An adaptive ceiling (schema byte [`CEILING_SCHEMA`], format version 9): version 8's, and its
/// count of cuts.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct CeilingRecordV9 {
    ceiling: CeilingRecord,
    cuts: u64,
}

impl CeilingRecordV9 {
    fn from_state(c: &Ceiling) -> Self {
        let ceiling = CeilingRecord {
            c: c.c,
            max: c.max,
            cut_at: c.cut_at.map(|m| m.0),
            grown_at: c.grown_at.map(|m| m.0),
            signal_at: c.signal_at.0,
        };
        CeilingRecordV9 { ceiling, cuts: c.cuts }
    }

    fn into_state(self) -> Ceiling {
        let CeilingRecordV9 { ceiling, cuts } = self;
        Ceiling {
            c: ceiling.c,
            max: ceiling.max,
            cut_at: ceiling.cut_at.map(Millis),
            cuts,
            grown_at: ceiling.grown_at.map(Millis),
            signal_at: Millis(ceiling.signal_at),
        }
    }
}

impl From<CeilingRecord> for CeilingRecordV9 {
    /// Version 8's ceiling counted no cut.
    fn from(ceiling: CeilingRecord) -> Self {
        CeilingRecordV9 { ceiling, cuts: 0 }
    }
}

/// Reads a ceiling's record of either schema.
fn decode_ceiling(bytes: &[u8]) -> Result<Ceiling, String> {
    match bytes.first() {
        Some(&RECORD_SCHEMA) => decode::<CeilingRecord>(bytes).map(|r| CeilingRecordV9::from(r).into_state()),
        _ => decode_schema::<CeilingRecordV9>(CEILING_SCHEMA, bytes).map(CeilingRecordV9::into_state),
    }
}

/// A token bucket's level (schema byte 1, format version 7), keyed by the bucket.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct LevelRecord {
    units: i64,
    unit_ms: u64,
    refill: u64,
    burst: u64,
    at: u64,
}

impl LevelRecord {
    fn from_state(l: &BucketLevel) -> Self {
        LevelRecord { units: l.units, unit_ms: l.unit_ms, refill: l.refill, burst: l.burst, at: l.at.0 }
    }

    fn into_state(self) -> BucketLevel {
        BucketLevel {
            units: self.units,
            unit_ms: self.unit_ms,
            refill: self.refill,
            burst: self.burst,
            at: Millis(self.at),
        }
    }
}

/// One limit a ticket of format versions 5 and 6 binds, its defaults resolved: (calls, perMs) of
/// its window, its `concurrent`, cost and `holdMs`.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct LimitRecordV5 {
    key: String,
    window: Option<(u64, u64)>,
    concurrent: Option<u64>,
    cost: u64,
    hold_ms: u64,
}

/// A live ticket as format versions 5 and 6 wrote it (schema byte 1): no token bucket, no
/// horizon of its own.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct TicketRecordV5 {
    filed_at: u64,
    retry_at: u64,
    lapse_at: u64,
    grace_ms: u64,
    key: String,
    limits: Vec<LimitRecordV5>,
}

/// One limit a ticket binds (format version 7): as version 5's, with a token bucket's
/// `(refill, perMs, burst, initial)`.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct LimitRecord {
    key: String,
    window: Option<(u64, u64)>,
    bucket: Option<(u64, u64, u64, u64)>,
    concurrent: Option<u64>,
    cost: u64,
    hold_ms: u64,
}

/// A live ticket (schema byte 2, format version 7), keyed by its id (see the module docs): as
/// version 5's, with token buckets among its limits and the instant its horizon ends.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct TicketRecord {
    filed_at: u64,
    retry_at: u64,
    lapse_at: u64,
    grace_ms: u64,
    key: String,
    limits: Vec<LimitRecord>,
    deadline: Option<u64>,
}

impl From<TicketRecordV5> for TicketRecord {
    fn from(old: TicketRecordV5) -> Self {
        let limits = old
            .limits
            .into_iter()
            .map(|l| LimitRecord {
                key: l.key,
                window: l.window,
                bucket: None,
                concurrent: l.concurrent,
                cost: l.cost,
                hold_ms: l.hold_ms,
            })
            .collect();
        TicketRecord {
            filed_at: old.filed_at,
            retry_at: old.retry_at,
            lapse_at: old.lapse_at,
            grace_ms: old.grace_ms,
            key: old.key,
            limits,
            deadline: None,
        }
    }
}

impl TicketRecord {
    fn from_state(t: &TicketState) -> Self {
        TicketRecord {
            filed_at: t.filed_at.0,
            retry_at: t.retry_at.0,
            lapse_at: t.lapse_at.0,
            grace_ms: t.grace_ms,
            key: t.key.to_string(),
            limits: t
                .limits
                .iter()
                .map(|l| LimitRecord {
                    key: l.key.clone(),
                    window: l.window.map(|w| (w.calls, w.per_ms)),
                    bucket: l.bucket.map(|b| (b.refill, b.per_ms, b.burst, b.initial)),
                    concurrent: l.concurrent,
                    cost: l.cost,
                    hold_ms: l.hold_ms,
                })
                .collect(),
            deadline: t.deadline.map(|d| d.0),
        }
    }

    fn into_state(self) -> TicketState {
        TicketState {
            filed_at: Millis(self.filed_at),
            retry_at: Millis(self.retry_at),
            lapse_at: Millis(self.lapse_at),
            grace_ms: self.grace_ms,
            key: Arc::from(self.key),
            limits: self
                .limits
                .into_iter()
                .map(|l| Limit {
                    key: l.key,
                    window: l.window.map(|(calls, per_ms)| WindowLimit { calls, per_ms }),
                    bucket: l.bucket.map(|(refill, per_ms, burst, initial)| BucketLimit {
                        refill,
                        per_ms,
                        burst,
                        initial,
                    }),
                    concurrent: l.concurrent,
                    cost: l.cost,
                    hold_ms: l.hold_ms,
                    adapt: None,
                })
                .collect(),
            deadline: self.deadline.map(Millis),
        }
    }
}

/// A live ticket (schema byte 3, format version 8): version 7's, and each limit's `adapt` as
/// (min, max, increase, keepPct), in the order of its limits.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct TicketRecordV8 {
    ticket: TicketRecord,
    adapts: Vec<Option<(u64, u64, u64, u64)>>,
}

impl TicketRecordV8 {
    fn from_state(t: &TicketState) -> Self {
        let adapts = t.limits.iter().map(|l| l.adapt.as_ref().map(adapt_record)).collect();
        TicketRecordV8 { ticket: TicketRecord::from_state(t), adapts }
    }

    fn into_state(self) -> Result<TicketState, String> {
        if !self.adapts.is_empty() && self.adapts.len() != self.ticket.limits.len() {
            return Err("a ticket's adapts do not match its limits".to_owned());
        }
        let mut state = self.ticket.into_state();
        for (limit, adapt) in state.limits.iter_mut().zip(self.adapts) {
            limit.adapt = adapt.map(adapt_state);
        }
        Ok(state)
    }
}

impl From<TicketRecord> for TicketRecordV8 {
    fn from(ticket: TicketRecord) -> Self {
        TicketRecordV8 { ticket, adapts: Vec::new() }
    }
}

/// Reads a ticket record of any schema.
fn decode_ticket(bytes: &[u8]) -> Result<TicketRecordV8, String> {
    match bytes.first() {
        Some(&RECORD_SCHEMA) => decode::<TicketRecordV5>(bytes).map(|t| TicketRecord::from(t).into()),
        Some(&RECORD_SCHEMA_V7) => decode_schema::<TicketRecord>(RECORD_SCHEMA_V7, bytes).map(Into::into),
        _ => decode_schema(TICKET_SCHEMA, bytes),
    }
}

/// What the acquire a request id names got, as format version 6 kept it: window shares only.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
enum OutcomeRecordV6 {
    Granted { at: u64, permit: Option<u128>, windows: Vec<(String, u64, u64)> },
    Ticketed { ticket: u128, retry_at: u64, reason: u8, limit: String, lapse_at: u64 },
    Released,
}

/// A request id's record as format version 6 wrote it (schema byte 1).
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct IdRecordV6 {
    params: u128,
    until: u64,
    outcome: OutcomeRecordV6,
}

impl From<IdRecordV6> for IdRecord {
    fn from(old: IdRecordV6) -> Self {
        let outcome = match old.outcome {
            OutcomeRecordV6::Granted { at, permit, windows } => {
                OutcomeRecord::Granted { at, permit, windows: windows.into_iter().map(window_share).collect() }
            }
            OutcomeRecordV6::Ticketed { ticket, retry_at, reason, limit, lapse_at } => {
                OutcomeRecord::Ticketed { ticket, retry_at, reason, limit, lapse_at }
            }
            OutcomeRecordV6::Released => OutcomeRecord::Released,
        };
        IdRecord { params: old.params, until: old.until, outcome }
    }
}

/// Reads a request id's record of either schema.
fn decode_id(bytes: &[u8]) -> Result<RequestRecord, String> {
    let record = match bytes.first() {
        Some(&RECORD_SCHEMA) => decode::<IdRecordV6>(bytes).map(IdRecord::from)?,
        _ => decode_schema::<IdRecord>(RECORD_SCHEMA_V7, bytes)?,
    };
    record.into_state()
}

/// What the acquire a request id names got, as its record holds it (format version 7).
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
enum OutcomeRecord {
    Granted {
        at: u64,
        permit: Option<u128>,
        windows: Vec<ShareRecord>,
    },
    /// `reason`: 0 rate, 1 concurrency, 2 throttle.
    Ticketed {
        ticket: u128,
        retry_at: u64,
        reason: u8,
        limit: String,
        lapse_at: u64,
    },
    Released,
}

/// A request id's record (schema byte 2, format version 7), keyed by the id.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct IdRecord {
    params: u128,
    until: u64,
    outcome: OutcomeRecord,
}

const REASONS: [Reason; 3] = [Reason::Rate, Reason::Concurrency, Reason::Throttle];

impl IdRecord {
    fn from_state(r: &RequestRecord) -> Self {
        let outcome = match &r.outcome {
            Outcome::Granted { at, permit, windows } => OutcomeRecord::Granted {
                at: at.0,
                permit: permit.map(|p| p.0),
                windows: windows.iter().map(share_record).collect(),
            },
            Outcome::Ticketed { ticket, retry_at, reason, limit, lapse_at } => OutcomeRecord::Ticketed {
                ticket: ticket.0,
                retry_at: retry_at.0,
                reason: REASONS.iter().position(|r| r == reason).unwrap_or(0) as u8,
                limit: limit.to_string(),
                lapse_at: lapse_at.0,
            },
            Outcome::Released => OutcomeRecord::Released,
        };
        IdRecord { params: r.params, until: r.until.0, outcome }
    }

    fn into_state(self) -> Result<RequestRecord, String> {
        let outcome = match self.outcome {
            OutcomeRecord::Granted { at, permit, windows } => Outcome::Granted {
                at: Millis(at),
                permit: permit.map(PermitId),
                windows: windows.into_iter().map(share_state).collect(),
            },
            OutcomeRecord::Ticketed { ticket, retry_at, reason, limit, lapse_at } => Outcome::Ticketed {
                ticket: TicketId(ticket),
                retry_at: Millis(retry_at),
                reason: *REASONS.get(usize::from(reason)).ok_or_else(|| format!("unknown reason {reason}"))?,
                limit: Arc::from(limit),
                lapse_at: Millis(lapse_at),
            },
            OutcomeRecord::Released => Outcome::Released,
        };
        // `since` is the record's key: the caller sets it.
        Ok(RequestRecord { params: self.params, since: Millis(0), until: Millis(self.until), outcome })
    }
}

/// A commit kept as a note in the journal (schema byte [`NOTE_SCHEMA`]): its floor and its
/// effects, in the engine's order.
#[derive(Serialize, Deserialize)]
struct Note<'a> {
    floor: u64,
    #[serde(borrow)]
    effects: Vec<NoteEffect<'a>>,
}

/// An [`Effect`] as a note holds it.
#[derive(Serialize, Deserialize)]
enum NoteEffect<'a> {
    BucketMeta {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
        meta: BucketMeta,
    },
    WindowGrant {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
        at: u64,
        cost: u64,
    },
    WindowPruned {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
        grants: Vec<u64>,
    },
    BucketForgotten {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
        grants: Vec<u64>,
    },
    /// A permit as notes of schemas 1 to 3 hold it (window shares only).
    PermitSet {
        id: u128,
        permit: PermitRecordV3,
    },
    PermitEnded {
        id: u128,
    },
    ThrottleSet {
        #[serde(borrow)]
        key: Cow<'a, str>,
        until: u64,
    },
    ThrottleEnded {
        #[serde(borrow)]
        key: Cow<'a, str>,
    },
    // The line's effects (schema 2 only; appended, so a schema-1 note reads as it was written).
    TicketFiled {
        id: u128,
        ticket: TicketRecordV5,
    },
    TicketRenewed {
        id: u128,
        retry_at: u64,
        lapse_at: u64,
        grace_ms: u64,
    },
    /// Ended (granted or left) or lapsed: its record goes either way.
    TicketGone {
        id: u128,
    },
    // Request ids' effects (schema 3 only; appended, so older notes read as they were written).
    RequestKept {
        #[serde(borrow)]
        id: Cow<'a, str>,
        since: u64,
        record: IdRecordV6,
    },
    RequestForgotten {
        #[serde(borrow)]
        id: Cow<'a, str>,
        since: u64,
    },
    // Format version 7's (schema 4 only; appended, so older notes read as they were written):
    // token buckets' levels, and the records that may name token buckets.
    LevelSet {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
        level: LevelRecord,
    },
    LevelForgotten {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
    },
    PermitSetV7 {
        id: u128,
        permit: PermitRecord,
    },
    TicketFiledV7 {
        id: u128,
        ticket: TicketRecord,
    },
    RequestKeptV7 {
        #[serde(borrow)]
        id: Cow<'a, str>,
        since: u64,
        record: IdRecord,
    },
    // Format version 8's (schema 5 only; appended, so older notes read as they were written):
    // adaptive ceilings, and the records that may name them.
    CeilingSet {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
        ceiling: CeilingRecord,
    },
    CeilingForgotten {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
    },
    PermitSetV8 {
        id: u128,
        permit: PermitRecordV8,
    },
    TicketFiledV8 {
        id: u128,
        ticket: TicketRecordV8,
    },
    // Format version 9's (schema 6 only; appended, so older notes read as they were written):
    // ceilings and permits that count cuts.
    CeilingSetV9 {
        #[serde(borrow)]
        bucket: Cow<'a, str>,
        ceiling: CeilingRecordV9,
    },
    PermitSetV9 {
        id: u128,
        permit: PermitRecordV9,
    },
}

impl NoteEffect<'_> {
    fn is_request(&self) -> bool {
        matches!(
            self,
            NoteEffect::RequestKept { .. } | NoteEffect::RequestKeptV7 { .. } | NoteEffect::RequestForgotten { .. }
        )
    }

    /// Whether only a note of schema 4 (format version 7) may hold it.
    fn is_v7(&self) -> bool {
        matches!(
            self,
            NoteEffect::LevelSet { .. }
                | NoteEffect::LevelForgotten { .. }
                | NoteEffect::PermitSetV7 { .. }
                | NoteEffect::TicketFiledV7 { .. }
                | NoteEffect::RequestKeptV7 { .. }
        ) || self.is_v8()
    }

    /// Whether only a note of schema 5 (format version 8) may hold it.
    fn is_v8(&self) -> bool {
        matches!(
            self,
            NoteEffect::CeilingSet { .. }
                | NoteEffect::CeilingForgotten { .. }
                | NoteEffect::PermitSetV8 { .. }
                | NoteEffect::TicketFiledV8 { .. }
        ) || self.is_v9()
    }

    /// Whether only a note of schema 6 (format version 9) may hold it.
    fn is_v9(&self) -> bool {
        matches!(self, NoteEffect::CeilingSetV9 { .. } | NoteEffect::PermitSetV9 { .. })
    }
}

fn millis(ats: &[Millis]) -> Vec<u64> {
    ats.iter().map(|at| at.0).collect()
}

fn encode_note(floor: Millis, effects: &[Effect]) -> Vec<u8> {
    let effects = effects
        .iter()
        .map(|effect| match effect {
            Effect::BucketMeta { bucket, meta } => {
                NoteEffect::BucketMeta { bucket: Cow::Borrowed(bucket), meta: *meta }
            }
            Effect::WindowGrant { bucket, at, cost } => {
                NoteEffect::WindowGrant { bucket: Cow::Borrowed(bucket), at: at.0, cost: *cost }
            }
            Effect::WindowPruned { bucket, grants } => {
                NoteEffect::WindowPruned { bucket: Cow::Borrowed(bucket), grants: millis(grants) }
            }
            Effect::BucketForgotten { bucket, grants } => {
                NoteEffect::BucketForgotten { bucket: Cow::Borrowed(bucket), grants: millis(grants) }
            }
            Effect::PermitSet { id, permit } => {
                NoteEffect::PermitSetV9 { id: id.0, permit: PermitRecordV9::from_state(permit) }
            }
            Effect::PermitEnded { id } => NoteEffect::PermitEnded { id: id.0 },
            Effect::ThrottleSet { key, until } => NoteEffect::ThrottleSet { key: Cow::Borrowed(key), until: until.0 },
            Effect::ThrottleEnded { key } => NoteEffect::ThrottleEnded { key: Cow::Borrowed(key) },
            Effect::TicketFiled { id, ticket } => {
                NoteEffect::TicketFiledV8 { id: id.0, ticket: TicketRecordV8::from_state(ticket) }
            }
            Effect::TicketRenewed { id, retry_at, lapse_at, grace_ms } => {
                NoteEffect::TicketRenewed { id: id.0, retry_at: retry_at.0, lapse_at: lapse_at.0, grace_ms: *grace_ms }
            }
            Effect::TicketEnded { id, .. } | Effect::TicketLapsed { id } => NoteEffect::TicketGone { id: id.0 },
            Effect::RequestKept { id, record } => NoteEffect::RequestKeptV7 {
                id: Cow::Borrowed(id),
                since: record.since.0,
                record: IdRecord::from_state(record),
            },
            Effect::LevelSet { bucket, level } => {
                NoteEffect::LevelSet { bucket: Cow::Borrowed(bucket), level: LevelRecord::from_state(level) }
            }
            Effect::LevelForgotten { bucket } => NoteEffect::LevelForgotten { bucket: Cow::Borrowed(bucket) },
            Effect::RequestForgotten { id, since } => {
                NoteEffect::RequestForgotten { id: Cow::Borrowed(id), since: since.0 }
            }
            Effect::CeilingSet { bucket, ceiling, .. } => NoteEffect::CeilingSetV9 {
                bucket: Cow::Borrowed(bucket),
                ceiling: CeilingRecordV9::from_state(ceiling),
            },
            Effect::CeilingForgotten { bucket } => NoteEffect::CeilingForgotten { bucket: Cow::Borrowed(bucket) },
        })
        .collect();
    encode_schema(NOTE_SCHEMA, &Note { floor: floor.0, effects })
}

fn decode_note(bytes: &[u8]) -> Result<(Millis, Vec<Effect>), String> {
    let note: Note<'_> = match bytes.first() {
        Some(&NOTE_SCHEMA_V4) => {
            let note: Note<'_> = decode_schema(NOTE_SCHEMA_V4, bytes)?;
            let is_line = |e: &NoteEffect<'_>| {
                matches!(
                    e,
                    NoteEffect::TicketFiled { .. }
                        | NoteEffect::TicketFiledV7 { .. }
                        | NoteEffect::TicketRenewed { .. }
                        | NoteEffect::TicketGone { .. }
                )
            };
            if note.effects.iter().any(is_line) {
                return Err("a note of schema 1 names a ticket".to_owned());
            }
            if note.effects.iter().any(NoteEffect::is_request) {
                return Err("a note of schema 1 names a request id".to_owned());
            }
            note
        }
        Some(&NOTE_SCHEMA_V5) => {
            let note: Note<'_> = decode_schema(NOTE_SCHEMA_V5, bytes)?;
            if note.effects.iter().any(NoteEffect::is_request) {
                return Err("a note of schema 2 names a request id".to_owned());
            }
            note
        }
        Some(&NOTE_SCHEMA_V6) => decode_schema(NOTE_SCHEMA_V6, bytes)?,
        Some(&NOTE_SCHEMA_V7) => decode_schema(NOTE_SCHEMA_V7, bytes)?,
        Some(&NOTE_SCHEMA_V8) => decode_schema(NOTE_SCHEMA_V8, bytes)?,
        _ => decode_schema(NOTE_SCHEMA, bytes)?,
    };
    let schema = bytes.first().copied().unwrap_or(NOTE_SCHEMA);
    // The newest format a record needs is named.
    if schema < NOTE_SCHEMA && note.effects.iter().any(NoteEffect::is_v9) {
        return Err(format!("a note of schema {schema} names a record of format version 9"));
    }
    if schema < NOTE_SCHEMA_V8 && note.effects.iter().any(NoteEffect::is_v8) {
        return Err(format!("a note of schema {schema} names a record of format version 8"));
    }
    if schema < NOTE_SCHEMA_V7 && note.effects.iter().any(NoteEffect::is_v7) {
        return Err(format!("a note of schema {schema} names a record of format version 7"));
    }
    let arc = |s: Cow<'_, str>| Arc::<str>::from(s.as_ref());
    let ats = |v: Vec<u64>| v.into_iter().map(Millis).collect();
    let effects = note
        .effects
        .into_iter()
        .map(|effect| -> Result<Effect, String> {
            Ok(match effect {
                NoteEffect::BucketMeta { bucket, meta } => Effect::BucketMeta { bucket: arc(bucket), meta },
                NoteEffect::WindowGrant { bucket, at, cost } => {
                    Effect::WindowGrant { bucket: arc(bucket), at: Millis(at), cost }
                }
                NoteEffect::WindowPruned { bucket, grants } => {
                    Effect::WindowPruned { bucket: arc(bucket), grants: ats(grants) }
                }
                NoteEffect::BucketForgotten { bucket, grants } => {
                    Effect::BucketForgotten { bucket: arc(bucket), grants: ats(grants) }
                }
                NoteEffect::PermitSet { id, permit } => {
                    Effect::PermitSet { id: PermitId(id), permit: PermitRecord::from(permit).into_state() }
                }
                NoteEffect::PermitSetV7 { id, permit } => {
                    Effect::PermitSet { id: PermitId(id), permit: permit.into_state() }
                }
                NoteEffect::PermitEnded { id } => Effect::PermitEnded { id: PermitId(id) },
                NoteEffect::ThrottleSet { key, until } => Effect::ThrottleSet { key: arc(key), until: Millis(until) },
                NoteEffect::ThrottleEnded { key } => Effect::ThrottleEnded { key: arc(key) },
                NoteEffect::TicketFiled { id, ticket } => {
                    Effect::TicketFiled { id: TicketId(id), ticket: TicketRecord::from(ticket).into_state() }
                }
                NoteEffect::TicketFiledV7 { id, ticket } => {
                    Effect::TicketFiled { id: TicketId(id), ticket: ticket.into_state() }
                }
                NoteEffect::TicketRenewed { id, retry_at, lapse_at, grace_ms } => Effect::TicketRenewed {
                    id: TicketId(id),
                    retry_at: Millis(retry_at),
                    lapse_at: Millis(lapse_at),
                    grace_ms,
                },
                NoteEffect::TicketGone { id } => Effect::TicketLapsed { id: TicketId(id) },
                NoteEffect::RequestKept { id, since, record } => Effect::RequestKept {
                    id: arc(id),
                    record: RequestRecord { since: Millis(since), ..IdRecord::from(record).into_state()? },
                },
                NoteEffect::RequestKeptV7 { id, since, record } => Effect::RequestKept {
                    id: arc(id),
                    record: RequestRecord { since: Millis(since), ..record.into_state()? },
                },
                NoteEffect::LevelSet { bucket, level } => {
                    Effect::LevelSet { bucket: arc(bucket), level: level.into_state() }
                }
                NoteEffect::LevelForgotten { bucket } => Effect::LevelForgotten { bucket: arc(bucket) },
                NoteEffect::RequestForgotten { id, since } => {
                    Effect::RequestForgotten { id: arc(id), since: Millis(since) }
                }
                NoteEffect::CeilingSet { bucket, ceiling } => Effect::CeilingSet {
                    bucket: arc(bucket),
                    ceiling: CeilingRecordV9::from(ceiling).into_state(),
                    change: None,
                },
                NoteEffect::CeilingSetV9 { bucket, ceiling } => {
                    Effect::CeilingSet { bucket: arc(bucket), ceiling: ceiling.into_state(), change: None }
                }
                NoteEffect::PermitSetV9 { id, permit } => {
                    Effect::PermitSet { id: PermitId(id), permit: permit.into_state() }
                }
                NoteEffect::CeilingForgotten { bucket } => Effect::CeilingForgotten { bucket: arc(bucket) },
                NoteEffect::PermitSetV8 { id, permit } => {
                    Effect::PermitSet { id: PermitId(id), permit: permit.into_state() }
                }
                NoteEffect::TicketFiledV8 { id, ticket } => {
                    Effect::TicketFiled { id: TicketId(id), ticket: ticket.into_state()? }
                }
            })
        })
        .collect::<Result<_, String>>()?;
    Ok((Millis(note.floor), effects))
}

/// Reads a permit record of either schema.
fn decode_permit(bytes: &[u8]) -> Result<PermitState, String> {
    match bytes.first() {
        Some(&RECORD_SCHEMA) => {
            let old: PermitRecordV2 = decode_schema(RECORD_SCHEMA, bytes)?;
            let expires = old.places.iter().map(|(_, lapse)| *lapse).max().unwrap_or(0);
            // The grant's instant was not kept; it lived `holdMs` before its places' lapses,
            // and it names no window, so nothing reads it.
            Ok(PermitRecord { at: 0, expires, places: old.places, windows: Vec::new() }.into_state())
        }
        Some(&PERMIT_SCHEMA_V3) => {
            decode_schema::<PermitRecordV3>(PERMIT_SCHEMA_V3, bytes).map(|r| PermitRecord::from(r).into_state())
        }
        Some(&PERMIT_SCHEMA_V7) => decode_schema::<PermitRecord>(PERMIT_SCHEMA_V7, bytes).map(PermitRecord::into_state),
        Some(&PERMIT_SCHEMA_V8) => {
            decode_schema::<PermitRecordV8>(PERMIT_SCHEMA_V8, bytes).map(PermitRecordV8::into_state)
        }
        _ => decode_schema::<PermitRecordV9>(PERMIT_SCHEMA, bytes).map(PermitRecordV9::into_state),
    }
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    encode_schema(RECORD_SCHEMA, value)
}

fn encode_schema<T: Serialize>(schema: u8, value: &T) -> Vec<u8> {
    let mut out = vec![schema];
    out.extend(postcard::to_allocvec(value).expect("records always serialize"));
    out
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    decode_schema(RECORD_SCHEMA, bytes)
}

fn decode_schema<'a, T: Deserialize<'a>>(schema: u8, bytes: &'a [u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&first, rest)) if first == schema => {
            let (value, tail) = postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
            if tail.is_empty() { Ok(value) } else { Err(format!("{} trailing bytes", tail.len())) }
        }
        Some((other, _)) => Err(format!("unknown record schema {other}")),
        None => Err("empty record".to_owned()),
    }
}

/// What the file says of its journal (see [`FileClaim`]), read through a read-only open of the
/// file alone. `None` when it says nothing (a new file, one of an earlier release) or cannot be
/// read that way (a crash left it for redb to repair; the open after the journal checks it).
fn read_claim(path: &Path) -> Option<FileClaim> {
    if !std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        return None;
    }
    let read = std::panic::catch_unwind(|| match Database::builder().open_read_only(path) {
        Ok(db) => claim_of(&db).ok().flatten(),
        // Left by a crash: redb repairs it in memory, the file stays as it is.
        Err(DatabaseError::RepairAborted) => {
            let file = std::fs::File::open(path).ok()?;
            let scratch = journal::ScratchBackend::new(Box::new(FileBackend::new(file).ok()?)).ok()?;
            let db = Database::builder().create_with_backend(scratch).ok()?;
            claim_of(&db).ok().flatten()
        }
        Err(_) => None,
    });
    read.ok().flatten()
}

/// The [`FileClaim`] in a database's `meta` table, if it holds one.
fn claim_of(db: &impl ReadableDatabase) -> Result<Option<FileClaim>, redb::Error> {
    let txn = db.begin_read()?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let get = |key: &str| meta.get(key).map(|v| v.map(|v| v.value()));
    let Some(journal_id) = get(KEY_JOURNAL_ID)? else { return Ok(None) };
    let next_seq = get(KEY_JOURNAL_SEQ)?.unwrap_or(0);
    let open = get(KEY_JOURNAL_OPEN)?.unwrap_or(0) != 0;
    Ok(Some(FileClaim { journal_id, next_seq, open }))
}

/// Reads the file once, sequentially, so that loading it afterwards finds its pages in memory
/// instead of seeking for each (a cold reopen of a million grants: about 0.8 s without, 0.25 s
/// with). Best effort: a file that cannot be read is left for the open to report.
fn prefetch(path: &Path) {
    use std::io::Read;
    if let Ok(mut file) = std::fs::File::open(path) {
        let mut buf = vec![0u8; 1 << 20];
        while matches!(file.read(&mut buf), Ok(n) if n > 0) {}
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Format {
    Current,
    /// A version from [`OLDEST_FORMAT_VERSION`] up to the current one: read as is, marked
    /// current before it is served.
    Previous,
    Empty,
}

/// Whether the database is ours at the current version, or empty (new).
fn check_format(db: &impl ReadableDatabase, path: &Path) -> Result<Format, StoreError> {
    let corrupt = |e: redb::Error| StoreError::Corrupt { path: path.to_path_buf(), cause: e };
    let txn = db.begin_read().map_err(|e| corrupt(e.into()))?;
    let tables: Vec<String> = txn.list_tables().map_err(|e| corrupt(e.into()))?.map(|t| t.name().to_owned()).collect();
    if tables.iter().any(|t| t == "meta") {
        let meta = txn.open_table(META).map_err(|e| corrupt(e.into()))?;
        let found = meta.get(KEY_FORMAT).map_err(|e| corrupt(e.into()))?.map_or(0, |v| v.value());
        return match found {
            FORMAT_VERSION => Ok(Format::Current),
            OLDEST_FORMAT_VERSION..FORMAT_VERSION => Ok(Format::Previous),
            _ => Err(StoreError::UnknownVersion { path: path.to_path_buf(), found }),
        };
    }
    if tables.is_empty() { Ok(Format::Empty) } else { Err(StoreError::Foreign { path: path.to_path_buf() }) }
}

/// The store: one open redb file.
pub struct Store {
    db: Database,
    path: PathBuf,
    /// Grants reported gone but still in the file (see the module docs).
    doomed: Doomed,
    /// [`DELETE_BATCH`]; smaller in tests.
    delete_batch: usize,
    /// The file's identity (device, inode) when opened; `None` where there is none to read.
    identity: Option<(u64, u64)>,
    /// The journal, when the file is open behind one.
    journal: Option<OpenJournal>,
    /// Commits kept as notes in the journal and not yet in redb, oldest first (see the module
    /// docs): each one's floor and effects.
    notes: Vec<(Millis, Vec<Effect>)>,
}

/// The journal a store's file is open behind.
struct OpenJournal {
    monitor: JournalMonitor,
    path: PathBuf,
    /// Its identity when opened, as the file's.
    identity: Option<(u64, u64)>,
}

/// A file's identity: (device, inode) on Unix.
fn identity(meta: &std::fs::Metadata) -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some((meta.dev(), meta.ino()))
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// Doomed grants, by when they are due for deletion (then oldest first), and by bucket; and the
/// records of forgotten buckets still in the file, as stored.
#[derive(Default)]
struct Doomed {
    /// (due, instant, bucket)
    by_due: BTreeSet<(u64, u64, Arc<str>)>,
    /// bucket -> (due, instant)
    by_bucket: HashMap<Arc<str>, Vec<(u64, u64)>, foldhash::fast::RandomState>,
    /// bucket -> its record's bytes
    records: HashMap<Arc<str>, Vec<u8>, foldhash::fast::RandomState>,
}

impl Doomed {
    fn is_empty(&self) -> bool {
        self.by_due.is_empty() && self.records.is_empty()
    }

    /// Dooms `ats` of `bucket`, reported gone by a commit at `now`.
    fn add(&mut self, bucket: &Arc<str>, ats: &[Millis], now: Millis) {
        if ats.is_empty() {
            return;
        }
        let list = match self.by_bucket.get_mut(&**bucket) {
            Some(list) => list,
            None => self.by_bucket.entry(bucket.clone()).or_default(),
        };
        for at in ats {
            let age = now.0.saturating_sub(at.0);
            let due = at.0.saturating_add(DELETE_AFTER_MS.min(age.saturating_mul(2)));
            if self.by_due.insert((due, at.0, bucket.clone())) {
                list.push((due, at.0));
            }
        }
    }

    /// Whether at least `n` doomed grants are due by `now`.
    fn due_count_reaches(&self, now: u64, n: usize) -> bool {
        n == 0 || self.by_due.iter().nth(n - 1).is_some_and(|(due, _, _)| *due <= now)
    }

    /// Takes the doomed grant due first when it is due by `now`.
    fn pop_due(&mut self, now: u64) -> Option<(u64, Arc<str>)> {
        if self.by_due.first().is_none_or(|(due, _, _)| *due > now) {
            return None;
        }
        let (due, at, bucket) = self.by_due.pop_first()?;
        self.unlist(&bucket, |entry| entry == (due, at));
        Some((at, bucket))
    }

    /// Removes the first (due, instant) of `bucket`'s list that `matches`, and the list once
    /// empty; returns that entry's due instant.
    fn unlist(&mut self, bucket: &Arc<str>, matches: impl Fn((u64, u64)) -> bool) -> Option<u64> {
        let list = self.by_bucket.get_mut(&**bucket)?;
        let due = list.iter().position(|e| matches(*e)).map(|i| list.swap_remove(i).0);
        if list.is_empty() {
            self.by_bucket.remove(&**bucket);
        }
        due
    }

    /// Takes every doomed grant of `bucket` (their instants).
    fn take_bucket(&mut self, bucket: &Arc<str>) -> Vec<u64> {
        let list = self.by_bucket.remove(&**bucket).unwrap_or_default();
        list.into_iter()
            .map(|(due, at)| {
                self.by_due.remove(&(due, at, bucket.clone()));
                at
            })
            .collect()
    }

    /// Forgets that `(at, bucket)` is doomed: it is being written again.
    fn revive(&mut self, bucket: &Arc<str>, at: u64) {
        if let Some(due) = self.unlist(bucket, |(_, a)| a == at) {
            self.by_due.remove(&(due, at, bucket.clone()));
        }
    }
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
                StoreError::Io { path: path.clone(), cause: io }
            }
            other => StoreError::Corrupt { path: path.clone(), cause: other.into() },
        };
        // Look before writing: a file that is not ours, of another version or busy is refused
        // through a read-only open, which never modifies it. A file that needs recovery after a
        // crash cannot be opened read-only; the read-write open below repairs it.
        // redb may panic on a damaged file where it does not check it (a read-only open, or any
        // open of pages it has not verified): that is a corrupt file too, refused, never a crash.
        let unreadable = |what: &str| StoreError::Corrupt {
            path: path.clone(),
            cause: redb::Error::Corrupted(format!("redb could not {what} it (its structure is damaged)")),
        };
        // First the commits still in the journal, if any, go into the file, so that the file
        // looked at below is the whole acknowledged state whichever opener follows.
        let journal = journal_path(&path);
        let journal_existed = journal.exists();
        let mut notes_wait = false;
        // What the file says of its journal, checked before the journal is touched.
        let claim = read_claim(&path);
        if !journal_existed && claim.is_some_and(|c| c.open) {
            return Err(StoreError::JournalMissing { path, journal });
        }
        if journal_existed {
            if !path.exists() {
                return Err(StoreError::JournalWithoutFile { path, journal });
            }
            let recovery = JournalBackend::recover_path(&path, claim.as_ref()).map_err(|e| match e {
                JournalError::Held => StoreError::HeldElsewhere { path: path.clone() },
                JournalError::Missing => StoreError::JournalMissing { path: path.clone(), journal: journal.clone() },
                cause => StoreError::Journal { path: path.clone(), journal: journal.clone(), cause },
            })?;
            // With notes waiting, the journal keeps its records (the file is as of its last
            // checkpoint) and is bound to this file: nothing may write the file but the journal,
            // so the look below is skipped. The open behind the journal checks every page.
            notes_wait = recovery.pending_notes > 0;
        }
        let (mut format, mut needs_repair) = (Format::Empty, false);
        if !notes_wait && std::fs::metadata(&path).is_ok_and(|m| m.len() > 0) {
            let looked = std::panic::catch_unwind(|| Database::builder().open_read_only(&path))
                .map_err(|_| unreadable("read"))?;
            match looked {
                Ok(db) => {
                    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_format(&db, &path)));
                    format = checked.map_err(|_| unreadable("read"))??;
                }
                Err(DatabaseError::RepairAborted) => needs_repair = true,
                Err(e) => return Err(map_err(e)),
            }
        }
        if format == Format::Previous || needs_repair {
            // An older file is marked current on the file itself, before any commit can sit in
            // a journal: an older build, which knows no journal, then refuses the file rather
            // than serve it without the commits still in its journal. A file left to repair (a
            // crash of an older build) is repaired here first, to learn its version.
            let plain = std::panic::catch_unwind(|| open_plain(&path)).map_err(|_| unreadable("open"))?;
            let store = Store::new(plain.map_err(map_err)?, path.clone(), None);
            if !journal_existed && claim_of(&store.db).map_err(|e| store.corrupt(e))?.is_some_and(|c| c.open) {
                // Left by a crash, which redb repaired: its journal is missing all the same.
                return Err(StoreError::JournalMissing { path, journal });
            }
            if check_format(&store.db, &path)? == Format::Previous {
                store.mark_current()?;
            }
        }
        prefetch(&path);
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| opener(&path)));
        let opened = opened.map_err(|_| unreadable("open"))?.map_err(|e| {
            // A journal that could not be made (too little room) says so with its name.
            if let DatabaseError::Storage(redb::StorageError::Io(io)) = &e
                && let Some(JournalError::NoRoom { .. }) = io.get_ref().and_then(|e| e.downcast_ref::<JournalError>())
            {
                let cause = std::io::Error::other(io.to_string());
                return StoreError::Io { path: journal.clone(), cause };
            }
            map_err(e)
        })?;
        let journal = opened.journal.map(|monitor| {
            let identity = std::fs::metadata(&journal).ok().as_ref().and_then(identity);
            OpenJournal { monitor, path: journal, identity }
        });
        let mut store = Store::new(opened.db, path, journal);
        let format = check_format(&store.db, &store.path)?;
        let notes = store.journal.as_ref().map(|journal| journal.monitor.take_recovered_notes()).unwrap_or_default();
        if !notes.is_empty() {
            // Commits acknowledged as notes after the file's last commit: redone, in order, in
            // one commit, before anything reads the file.
            let bad = |cause: String| StoreError::BadRecord { path: store.path.clone(), table: "journal notes", cause };
            // A file of the previous version (4, the first with a journal) may hold notes of its
            // release after a crash: they are redone as they were, then the file is marked.
            if format == Format::Empty {
                return Err(bad(format!("{} notes wait for a file without tables", notes.len())));
            }
            store.notes = notes.iter().map(|note| decode_note(note)).collect::<Result<_, _>>().map_err(bad)?;
            store.apply_notes()?;
        }
        match format {
            Format::Empty => store.initialize()?,
            Format::Previous => store.mark_current()?,
            Format::Current => {}
        }
        if let Some(open) = &store.journal {
            // The file and the journal now hold every acknowledged commit: a claim that still
            // contradicts the journal (a crash the read-only look could not see past) is refused.
            let (id, next_seq) = (open.monitor.journal_id(), open.monitor.next_seq());
            match claim_of(&store.db).map_err(|e| store.corrupt(e))? {
                Some(c) if c.journal_id != id && c.open => {
                    let (path, journal) = (store.path.clone(), open.path.clone());
                    drop(store);
                    if !journal_existed {
                        let _ = std::fs::remove_file(&journal);
                    }
                    return Err(StoreError::JournalMissing { path, journal });
                }
                Some(c) if c.journal_id == id && c.next_seq >= next_seq => {
                    let cause = JournalError::Older { file_reaches: c.next_seq, journal_ends: next_seq };
                    return Err(StoreError::Journal { path: store.path.clone(), journal: open.path.clone(), cause });
                }
                _ => {}
            }
            store.mark_open(true)?;
        }
        Ok(store)
    }

    fn new(db: Database, path: PathBuf, journal: Option<OpenJournal>) -> Store {
        let identity = std::fs::metadata(&path).ok().as_ref().and_then(identity);
        Store { db, path, doomed: Doomed::default(), delete_batch: DELETE_BATCH, identity, journal, notes: Vec::new() }
    }

    /// The database's length in bytes as redb sees it: with a journal, the commits not yet
    /// checkpointed into the file count.
    #[must_use]
    pub fn file_len(&self) -> u64 {
        match &self.journal {
            Some(journal) => journal.monitor.database_len(),
            None => std::fs::metadata(&self.path).map_or(0, |m| m.len()),
        }
    }

    /// The journal's counters, when the file is open behind one.
    #[must_use]
    pub fn journal_stats(&self) -> Option<journal::JournalStats> {
        self.journal.as_ref().map(|journal| journal.monitor.stats())
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits the notes waiting in the journal ([`Store::apply_notes`]: none may wait through a
    /// compaction's checkpoint, and a quiet moment is the time for them), then compacts the
    /// file when free space dominates it: larger than [`COMPACT_ABOVE_BYTES`] with
    /// less than a quarter of it allocated to live pages. Returns the file's size before and
    /// after when it compacted. For quiet moments: it holds the file until done (a file of a few
    /// tens of MB with little live data compacts in well under a second).
    pub fn compact_if_sparse(&mut self) -> Result<Option<(u64, u64)>, StoreError> {
        self.apply_notes()?;
        let before = self.file_len();
        if before <= COMPACT_ABOVE_BYTES {
            return Ok(None);
        }
        let txn = self.db.begin_write().map_err(|e| self.commit_error(e))?;
        let stats = txn.stats().map_err(|e| self.commit_error(e))?;
        txn.abort().map_err(|e| self.commit_error(e))?;
        let allocated = stats.allocated_pages().saturating_mul(stats.page_size() as u64);
        if allocated.saturating_mul(4) > before {
            return Ok(None);
        }
        self.db.compact().map_err(|e| self.commit_error(e))?;
        if let Some(journal) = &self.journal {
            // The compacted pages sit in the journal until a checkpoint: take one now, on an
            // empty durable commit, so that the file on disk shrinks now.
            journal.monitor.request_checkpoint();
            let mut txn = self.db.begin_write().map_err(|e| self.commit_error(e))?;
            txn.set_durability(Durability::Immediate).map_err(|e| self.commit_error(e))?;
            txn.commit().map_err(|e| self.commit_error(e))?;
        }
        Ok(Some((before, self.file_len())))
    }

    /// Whether the file at the path is still the one open: an error when it was deleted or
    /// replaced (renamed over, or deleted and created again), since commits then go to a file
    /// no restart will read. A file that cannot be looked at for another reason passes.
    pub fn check_file(&self) -> Result<(), StoreError> {
        let lost = |cause| StoreError::Lost { path: self.path.clone(), cause };
        match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(lost("the file was deleted while open")),
            Ok(meta) if self.identity.is_some() && identity(&meta) != self.identity => {
                Err(lost("the file was replaced by another while open"))
            }
            _ => match &self.journal {
                Some(journal) => match std::fs::metadata(&journal.path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        Err(lost("its journal was deleted while open"))
                    }
                    Ok(meta) if journal.identity.is_some() && identity(&meta) != journal.identity => {
                        Err(lost("its journal was replaced by another while open"))
                    }
                    _ => journal.monitor.verify_on_disk().map_err(lost),
                },
                None => Ok(()),
            },
        }
    }

    fn corrupt(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Corrupt { path: self.path.clone(), cause: e.into() }
    }

    fn commit_error(&self, e: impl Into<redb::Error>) -> StoreError {
        StoreError::Commit { path: self.path.clone(), cause: e.into() }
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
            txn.open_table(GRANTS).map_err(|e| self.commit_error(e))?;
            txn.open_table(PERMITS).map_err(|e| self.commit_error(e))?;
            txn.open_table(THROTTLES).map_err(|e| self.commit_error(e))?;
            txn.open_table(TICKETS).map_err(|e| self.commit_error(e))?;
            txn.open_table(REQUESTS).map_err(|e| self.commit_error(e))?;
            txn.open_table(LEVELS).map_err(|e| self.commit_error(e))?;
            txn.open_table(CEILINGS).map_err(|e| self.commit_error(e))?;
        }
        txn.commit().map_err(|e| self.commit_error(e))
    }

    /// Writes what the file says of its journal ([`FileClaim`]): the journal's id, how far it
    /// reaches, and `open` (1 until a clean close), then has the journal checkpoint it into the
    /// file itself, so that the file alone names its journal and knows whether it needs it.
    fn mark_open(&self, open: bool) -> Result<(), StoreError> {
        let Some(journal) = &self.journal else { return Ok(()) };
        let (id, next_seq) = (journal.monitor.journal_id(), journal.monitor.next_seq());
        journal.monitor.request_checkpoint();
        let mut txn = self.db.begin_write().map_err(|e| self.commit_error(e))?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.commit_error(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.commit_error(e))?;
            meta.insert(KEY_JOURNAL_ID, id).map_err(|e| self.commit_error(e))?;
            meta.insert(KEY_JOURNAL_SEQ, next_seq).map_err(|e| self.commit_error(e))?;
            meta.insert(KEY_JOURNAL_OPEN, u64::from(open)).map_err(|e| self.commit_error(e))?;
        }
        txn.commit().map_err(|e| self.commit_error(e))
    }

    /// Marks a file of the previous format version as the current one (its records are read
    /// as they are; see the module docs).
    fn mark_current(&self) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.commit_error(e))?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.commit_error(e))?;
        txn.open_table(META)
            .and_then(|mut meta| meta.insert(KEY_FORMAT, FORMAT_VERSION).map(drop).map_err(Into::into))
            .map_err(|e| self.commit_error(e))?;
        // Version 5's table, empty: every ticket of an older release was forgotten at its stop.
        txn.open_table(TICKETS).map_err(|e| self.commit_error(e))?;
        // Version 6's table, empty: no older release knew request ids.
        txn.open_table(REQUESTS).map_err(|e| self.commit_error(e))?;
        // Version 7's table, empty: no older release knew token buckets.
        txn.open_table(LEVELS).map_err(|e| self.commit_error(e))?;
        // Version 8's table, empty: no older release knew adaptive ceilings.
        txn.open_table(CEILINGS).map_err(|e| self.commit_error(e))?;
        txn.commit().map_err(|e| self.commit_error(e))
    }

    /// Loads every persisted fact into `engine` (fresh) and returns the clock floor. The caller
    /// then runs [`Engine::finish_restore`] and commits its effects to prune the file.
    pub fn load(&self, engine: &mut Engine) -> Result<Millis, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.corrupt(e))?;
        let bad = |table: &'static str, cause: String| StoreError::BadRecord { path: self.path.clone(), table, cause };
        let meta = txn.open_table(META).map_err(|e| self.corrupt(e))?;
        let recorded = meta.get(KEY_FLOOR).map_err(|e| self.corrupt(e))?.map_or(0, |v| v.value());
        let grants = txn.open_table(GRANTS).map_err(|e| self.corrupt(e))?;
        let newest = grants.last().map_err(|e| self.corrupt(e))?.map_or(0, |(k, _)| k.value().0);
        let floor = Millis(recorded.max(newest));
        // Every record is checked against what the engine can have written (see the module
        // docs' fault model): a record out of those bounds is damage, refused with the file named.
        let key_ok = |key: &str| !key.is_empty() && key.len() <= MAX_KEY_BYTES;
        let ahead_ok = |at: u64| at <= floor.0.saturating_add(MAX_HOLD_MS.max(MAX_THROTTLE_AHEAD_MS));
        for row in txn.open_table(BUCKETS).map_err(|e| self.corrupt(e))?.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let meta: BucketMeta = decode(v.value()).map_err(|e| bad("buckets", e))?;
            if !key_ok(k.value())
                || meta.retain_ms > MAX_PER_MS
                || meta.last_calls > MAX_CALLS
                || meta.last_concurrent > MAX_CONCURRENT
            {
                return Err(bad("buckets", format!("a record out of bounds: {:?} {meta:?}", k.value())));
            }
            engine.restore_bucket(k.value(), meta);
        }
        for row in grants.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let (at, bucket) = k.value();
            if !key_ok(bucket) || v.value() > MAX_GRANT_ROW_COST {
                return Err(bad("grants_by_time", format!("a grant out of bounds: {bucket:?} at {at}: {}", v.value())));
            }
            engine.restore_grant(bucket, Millis(at), v.value());
        }
        // A token bucket's share carries the grant's figures, which a settle divides by.
        let tokens_ok = |w: &WindowShare| {
            w.tokens.is_none_or(|(refill, per_ms)| {
                (1..=MAX_CALLS).contains(&refill) && (1..=MAX_PER_MS).contains(&per_ms) && w.cap >= 1
            })
        };
        for row in txn.open_table(PERMITS).map_err(|e| self.corrupt(e))?.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let permit = decode_permit(v.value()).map_err(|e| bad("permits", e))?;
            // Ids are `random << 64 | sequence`, the sequence counting one run's permits from 0.
            if k.value() as u64 > MAX_PERMIT_SEQUENCE
                || permit.places.len() > MAX_LIMITS
                || permit.windows.len() > MAX_LIMITS
                || !ahead_ok(permit.expires.0)
                || permit.places.iter().any(|(b, lapse)| !key_ok(b) || !ahead_ok(lapse.0))
                || permit
                    .windows
                    .iter()
                    .any(|w| !key_ok(&w.bucket) || w.cap > MAX_CALLS || w.cost > MAX_CALLS || !tokens_ok(w))
            {
                return Err(bad("permits", format!("a permit out of bounds: {}", PermitId(k.value()))));
            }
            engine.restore_permit(PermitId(k.value()), permit);
        }
        for row in txn.open_table(THROTTLES).map_err(|e| self.corrupt(e))?.iter().map_err(|e| self.corrupt(e))? {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            if !key_ok(k.value()) || !ahead_ok(v.value()) {
                return Err(bad("throttles", format!("a throttle out of bounds: {:?} until {}", k.value(), v.value())));
            }
            engine.restore_throttle(k.value(), Millis(v.value()));
        }
        // A file marked current by this build has the table; one only read (`check`) may not.
        let tickets = match txn.open_table(TICKETS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(self.corrupt(e)),
        };
        // A ticket's retryAt is at most a window's length ahead, its lapse a grace after that
        // (or after a restart's `now`, which a floor recorded since holds).
        let line_ok = |at: u64| at <= floor.0.saturating_add(MAX_PER_MS.max(MAX_THROTTLE_AHEAD_MS) + MAX_GRACE_MS);
        let rows = match &tickets {
            Some(table) => Some(table.iter().map_err(|e| self.corrupt(e))?),
            None => None,
        };
        for row in rows.into_iter().flatten() {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let id = TicketId(k.value());
            let ticket =
                decode_ticket(v.value()).and_then(TicketRecordV8::into_state).map_err(|e| bad("tickets", e))?;
            if id.number() > MAX_PERMIT_SEQUENCE
                || !key_ok(&ticket.key)
                || ticket.limits.is_empty()
                || ticket.limits.len() > MAX_LIMITS
                || ticket.limits.iter().any(|l| !key_ok(&l.key) || l.validate(0).is_err())
                || !ticket.limits.windows(2).all(|w| w[0].key < w[1].key)
                || !(MIN_GRACE_MS..=MAX_GRACE_MS).contains(&ticket.grace_ms)
                || ticket.filed_at > floor
                || !line_ok(ticket.retry_at.0)
                || !line_ok(ticket.lapse_at.0)
            {
                return Err(bad("tickets", format!("a ticket out of bounds: {id}")));
            }
            engine.restore_ticket(id, ticket);
        }
        let requests = match txn.open_table(REQUESTS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(self.corrupt(e)),
        };
        let rows = match &requests {
            Some(table) => Some(table.iter().map_err(|e| self.corrupt(e))?),
            None => None,
        };
        // A record lives a minute, or as long as its permit or ticket lives.
        let id_ok = |at: u64| at <= floor.0.saturating_add(MAX_HOLD_MS.max(MAX_PER_MS) + MAX_GRACE_MS + REMEMBER_MS);
        for row in rows.into_iter().flatten() {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let (since, id) = k.value();
            let record = decode_id(v.value()).map_err(|e| bad("requests", e))?;
            let record = RequestRecord { since: Millis(since), ..record };
            let windows_ok = match &record.outcome {
                Outcome::Granted { windows, .. } => {
                    windows.len() <= MAX_LIMITS
                        && windows
                            .iter()
                            .all(|w| key_ok(&w.bucket) && w.cap <= MAX_CALLS && w.cost <= w.cap && tokens_ok(w))
                }
                Outcome::Ticketed { limit, .. } => key_ok(limit),
                Outcome::Released => true,
            };
            if id.is_empty() || id.len() > MAX_ID_BYTES || since > floor.0 || !id_ok(record.until.0) || !windows_ok {
                return Err(bad("requests", format!("a request id's record out of bounds: {id:?}")));
            }
            engine.restore_request(id, record);
        }
        let levels = match txn.open_table(LEVELS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(self.corrupt(e)),
        };
        let rows = match &levels {
            Some(table) => Some(table.iter().map_err(|e| self.corrupt(e))?),
            None => None,
        };
        for row in rows.into_iter().flatten() {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let level = decode::<LevelRecord>(v.value()).map_err(|e| bad("levels", e))?.into_state();
            // Never above the largest burst a request may name, in the units it was written in.
            let most = i128::from(MAX_CALLS) * i128::from(level.unit_ms);
            if !key_ok(k.value())
                || !(1..=MAX_PER_MS).contains(&level.unit_ms)
                || !(1..=MAX_CALLS).contains(&level.refill)
                || !(1..=MAX_CALLS).contains(&level.burst)
                || i128::from(level.units) > most
                || level.at > floor
            {
                return Err(bad("levels", format!("a level out of bounds: {:?} {level:?}", k.value())));
            }
            engine.restore_level(k.value(), level);
        }
        let ceilings = match txn.open_table(CEILINGS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(self.corrupt(e)),
        };
        let rows = match &ceilings {
            Some(table) => Some(table.iter().map_err(|e| self.corrupt(e))?),
            None => None,
        };
        for row in rows.into_iter().flatten() {
            let (k, v) = row.map_err(|e| self.corrupt(e))?;
            let ceiling = decode_ceiling(v.value()).map_err(|e| bad("ceilings", e))?;
            let at_most_floor = |at: Option<Millis>| at.is_none_or(|at| at <= floor);
            if !key_ok(k.value())
                || !(1..=MAX_CALLS).contains(&ceiling.c)
                || !(1..=MAX_CALLS).contains(&ceiling.max)
                || ceiling.signal_at > floor
                || !at_most_floor(ceiling.cut_at)
                || !at_most_floor(ceiling.grown_at)
            {
                return Err(bad("ceilings", format!("a ceiling out of bounds: {:?} {ceiling:?}", k.value())));
            }
            engine.restore_ceiling(k.value(), ceiling);
        }
        Ok(floor)
    }

    /// Writes `effects` (a batch of requests' changes) and the clock floor (the caller's `now`,
    /// which never runs backwards; held by the newest grant when it is at `now`, see the module
    /// docs) in one durable commit. Doomed grants and records are deleted in batches. On error
    /// nothing of it is in the file, and the database must be reopened before the next commit.
    pub fn commit(&mut self, effects: &[Effect], floor: Millis) -> Result<(), StoreError> {
        self.commit_with(effects, floor, false)
    }

    /// [`Store::commit`] for what no request waits for (a sweep's forgetting, a reopen's prune):
    /// also deletes everything doomed, so the file holds exactly what still counts.
    pub fn commit_and_tidy(&mut self, effects: &[Effect], floor: Millis) -> Result<(), StoreError> {
        self.commit_with(effects, floor, true)
    }

    fn commit_with(&mut self, effects: &[Effect], floor: Millis, tidy: bool) -> Result<(), StoreError> {
        if !tidy && self.journal.is_some() && effects.len() <= NOTE_EFFECTS_BEFORE_COMMIT {
            let effects_waiting: usize = self.notes.iter().map(|(_, effects)| effects.len()).sum();
            if self.notes.len() >= NOTES_BEFORE_COMMIT || effects_waiting + effects.len() > NOTE_EFFECTS_BEFORE_COMMIT {
                self.apply_notes()?;
            }
            // One append and one sync; a later redb commit takes it with the notes around it.
            let note = encode_note(floor, effects);
            let monitor = &self.journal.as_ref().expect("checked above").monitor;
            match monitor.append_note(&note) {
                Ok(true) => {
                    self.notes.push((floor, effects.to_vec()));
                    return Ok(());
                }
                Ok(false) => {}
                Err(e) => return Err(self.commit_error(redb::StorageError::Io(e))),
            }
        }
        self.apply_notes()?;
        self.commit_redb([(floor, effects)].into_iter(), tidy)
    }

    /// One durable redb commit of `commits`. On error nothing of it is in redb, and the
    /// database must be reopened.
    fn commit_redb<'e>(
        &mut self,
        commits: impl Iterator<Item = (Millis, &'e [Effect])>,
        tidy: bool,
    ) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(|e| self.commit_error(e))?;
        txn.set_durability(Durability::Immediate).map_err(|e| self.commit_error(e))?;
        self.write_effects(&txn, commits, tidy).map_err(|e| self.commit_error(e))?;
        if let Some(journal) = &self.journal {
            // How far the journal reaches once this commit is in the file (see `FileClaim`).
            let next_seq = journal.monitor.next_seq();
            txn.open_table(META)
                .and_then(|mut meta| meta.insert(KEY_JOURNAL_SEQ, next_seq).map(drop).map_err(Into::into))
                .map_err(|e| self.commit_error(e))?;
        }
        txn.commit().map_err(|e| self.commit_error(e))
    }

    /// Commits the notes waiting in the journal into redb, if any, in one commit of the notes
    /// alone (then redoing them after a crash changes nothing; see the module docs). Also for
    /// quiet moments, so that the file itself keeps up and a restart has little to redo.
    pub fn apply_notes(&mut self) -> Result<(), StoreError> {
        if self.notes.is_empty() {
            return Ok(());
        }
        let notes = std::mem::take(&mut self.notes);
        self.commit_redb(notes.iter().map(|(floor, effects)| (*floor, effects.as_slice())), false)?;
        if let Some(journal) = &self.journal {
            journal.monitor.notes_held();
        }
        Ok(())
    }

    /// Commits the waiting notes, then deletes everything doomed (see the module docs) in one
    /// durable commit, if anything is. For closing: the file then holds exactly what still
    /// counts.
    pub fn finish(&mut self, floor: Millis) -> Result<(), StoreError> {
        self.apply_notes()?;
        if !self.doomed.is_empty() {
            self.commit_and_tidy(&[], floor)?;
        }
        // Closed cleanly: the file no longer needs its journal (the close checkpoints it).
        self.mark_open(false)
    }

    /// Writes commits (each one's floor and effects, in order) into `txn`.
    fn write_effects<'e>(
        &mut self,
        txn: &redb::WriteTransaction,
        commits: impl Iterator<Item = (Millis, &'e [Effect])>,
        tidy: bool,
    ) -> Result<(), redb::Error> {
        // Each table is opened when first written: opening costs a lookup even when unused.
        let (mut buckets, mut grants, mut permits, mut throttles, mut tickets) = (None, None, None, None, None);
        let (mut requests, mut levels, mut ceilings) = (None, None, None);
        let (doomed, delete_batch) = (&mut self.doomed, self.delete_batch);
        let mut written = 0;
        let mut newest_written = 0;
        // Floors never run backwards: the last commit's is the batch's.
        let mut floor = Millis(0);
        for (commit_floor, effects) in commits {
            floor = floor.max(commit_floor);
            for effect in effects {
                match effect {
                    Effect::BucketMeta { bucket, meta } => {
                        let record = encode(meta);
                        if doomed.records.remove(&**bucket).is_some_and(|kept| kept == record) {
                            // Forgotten and back as it was, its record still in the file: nothing to
                            // write, and its window did not grow, so what it pruned stays pruned.
                            continue;
                        }
                        // Its window may have grown: no grant it pruned may linger and count again.
                        let ats = doomed.take_bucket(bucket);
                        if !ats.is_empty() {
                            let grants = opened(&mut grants, txn, GRANTS)?;
                            for at in ats {
                                grants.remove((at, &**bucket))?;
                            }
                        }
                        opened(&mut buckets, txn, BUCKETS)?.insert(&**bucket, record.as_slice())?;
                    }
                    Effect::WindowGrant { bucket, at, cost } => {
                        doomed.revive(bucket, at.0);
                        opened(&mut grants, txn, GRANTS)?.insert((at.0, &**bucket), cost)?;
                        written += 1;
                        newest_written = newest_written.max(at.0);
                    }
                    Effect::WindowPruned { bucket, grants: ats } => doomed.add(bucket, ats, floor),
                    Effect::BucketForgotten { bucket, grants: ats } => {
                        doomed.add(bucket, ats, floor);
                        // Its record stays until a batch of them is deleted: a bucket that comes back
                        // as it was (the common case) then costs no write at all.
                        let kept = opened(&mut buckets, txn, BUCKETS)?.get(&**bucket)?.map(|v| v.value().to_vec());
                        if let Some(kept) = kept {
                            doomed.records.insert(bucket.clone(), kept);
                        }
                    }
                    Effect::PermitSet { id, permit } => {
                        let record = encode_schema(PERMIT_SCHEMA, &PermitRecordV9::from_state(permit));
                        opened(&mut permits, txn, PERMITS)?.insert(id.0, record.as_slice())?;
                    }
                    Effect::PermitEnded { id } => {
                        opened(&mut permits, txn, PERMITS)?.remove(id.0)?;
                    }
                    Effect::ThrottleSet { key, until } => {
                        opened(&mut throttles, txn, THROTTLES)?.insert(&**key, until.0)?;
                    }
                    Effect::ThrottleEnded { key } => {
                        opened(&mut throttles, txn, THROTTLES)?.remove(&**key)?;
                    }
                    Effect::TicketFiled { id, ticket } => {
                        let record = encode_schema(TICKET_SCHEMA, &TicketRecordV8::from_state(ticket));
                        opened(&mut tickets, txn, TICKETS)?.insert(id.0, record.as_slice())?;
                    }
                    Effect::TicketRenewed { id, retry_at, lapse_at, grace_ms } => {
                        // A renewal of a ticket already gone (ended in the same batch, or a note
                        // redone after its end reached the file) writes nothing.
                        let table = opened(&mut tickets, txn, TICKETS)?;
                        let kept = table.get(id.0)?.map(|v| decode_ticket(v.value()));
                        if let Some(Ok(mut record)) = kept {
                            let t = &mut record.ticket;
                            (t.retry_at, t.lapse_at, t.grace_ms) = (retry_at.0, lapse_at.0, *grace_ms);
                            table.insert(id.0, encode_schema(TICKET_SCHEMA, &record).as_slice())?;
                        }
                    }
                    Effect::TicketEnded { id, .. } | Effect::TicketLapsed { id } => {
                        opened(&mut tickets, txn, TICKETS)?.remove(id.0)?;
                    }
                    Effect::RequestKept { id, record: kept } => {
                        let record = encode_schema(RECORD_SCHEMA_V7, &IdRecord::from_state(kept));
                        opened(&mut requests, txn, REQUESTS)?.insert((kept.since.0, &**id), record.as_slice())?;
                    }
                    Effect::RequestForgotten { id, since } => {
                        opened(&mut requests, txn, REQUESTS)?.remove((since.0, &**id))?;
                    }
                    Effect::LevelSet { bucket, level } => {
                        let record = encode(&LevelRecord::from_state(level));
                        opened(&mut levels, txn, LEVELS)?.insert(&**bucket, record.as_slice())?;
                    }
                    Effect::LevelForgotten { bucket } => {
                        opened(&mut levels, txn, LEVELS)?.remove(&**bucket)?;
                    }
                    Effect::CeilingSet { bucket, ceiling, .. } => {
                        let record = encode_schema(CEILING_SCHEMA, &CeilingRecordV9::from_state(ceiling));
                        opened(&mut ceilings, txn, CEILINGS)?.insert(&**bucket, record.as_slice())?;
                    }
                    Effect::CeilingForgotten { bucket } => {
                        opened(&mut ceilings, txn, CEILINGS)?.remove(&**bucket)?;
                    }
                }
            }
        }
        let (budget, due_by) = if tidy {
            (usize::MAX, u64::MAX)
        } else if doomed.due_count_reaches(floor.0, delete_batch) {
            (DELETES_PER_COMMIT.max(written * DELETES_PER_GRANT), floor.0)
        } else {
            (0, 0)
        };
        for _ in 0..budget {
            let Some((at, bucket)) = doomed.pop_due(due_by) else { break };
            opened(&mut grants, txn, GRANTS)?.remove((at, &*bucket))?;
        }
        if !doomed.records.is_empty() && (tidy || doomed.records.len() >= RECORD_DELETE_BATCH) {
            let buckets = opened(&mut buckets, txn, BUCKETS)?;
            for (bucket, _) in doomed.records.drain() {
                buckets.remove(&*bucket)?;
            }
        }
        // A commit that grants at its own `now` holds its floor in that grant (see the module
        // docs): one page less.
        if newest_written < floor.0 {
            txn.open_table(META)?.insert(KEY_FLOOR, floor.0)?;
        }
        Ok(())
    }

    /// The format version the file records.
    pub fn format_version(&self) -> Result<u64, StoreError> {
        let txn = self.db.begin_read().map_err(|e| self.corrupt(e))?;
        let meta = txn.open_table(META).map_err(|e| self.corrupt(e))?;
        Ok(meta.get(KEY_FORMAT).map_err(|e| self.corrupt(e))?.map_or(0, |v| v.value()))
    }

    /// The number of window entries in the file (for tests of file size and pruning).
    pub fn grant_rows(&mut self) -> Result<u64, StoreError> {
        self.apply_notes()?;
        let txn = self.db.begin_read().map_err(|e| self.corrupt(e))?;
        let table = txn.open_table(GRANTS).map_err(|e| self.corrupt(e))?;
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
        // Permits: both schemas read; the old one as a permit with places only.
        let state = PermitState {
            at: Millis(5),
            expires: Millis(900),
            places: vec![(Arc::from("c"), Millis(900))],
            windows: vec![WindowShare { bucket: Arc::from("w"), cost: 3, cap: 10, tokens: None }],
            adapted: Vec::new(),
        };
        let bytes = encode_schema(PERMIT_SCHEMA_V7, &PermitRecord::from_state(&state));
        assert_eq!(decode_permit(&bytes), Ok(state.clone()));
        let old = encode(&PermitRecordV2 { places: vec![("c".into(), 700), ("d".into(), 800)] });
        let read = decode_permit(&old).unwrap();
        assert_eq!((read.expires, read.places.len(), read.windows.len()), (Millis(800), 2, 0));
        let v3 =
            PermitRecordV3 { at: 5, expires: 900, places: vec![("c".into(), 900)], windows: vec![("w".into(), 3, 10)] };
        let v3 = decode_permit(&encode_schema(PERMIT_SCHEMA_V3, &v3)).unwrap();
        assert_eq!(
            v3,
            PermitState { windows: vec![WindowShare { tokens: None, ..state.windows[0].clone() }], ..state.clone() }
        );
        let buckets = PermitState {
            windows: vec![WindowShare { bucket: Arc::from("t"), cost: 4, cap: 9, tokens: Some((3, 1000)) }],
            ..state
        };
        assert_eq!(
            decode_permit(&encode_schema(PERMIT_SCHEMA_V7, &PermitRecord::from_state(&buckets))),
            Ok(buckets.clone())
        );
        // Format 9's: with the adapted buckets of its grant (section 14) and the cuts each saw.
        let adapted = PermitState {
            adapted: vec![AdaptedShare {
                bucket: Arc::from("w"),
                adapt: Adapt { min: 1, max: 20, increase: 2, keep_pct: 40 },
                start: 10,
                per_ms: 1000,
                in_play: true,
                signalled: false,
                cuts_seen: 3,
            }],
            ..buckets
        };
        assert_eq!(
            decode_permit(&encode_schema(PERMIT_SCHEMA, &PermitRecordV9::from_state(&adapted))),
            Ok(adapted.clone())
        );
        // Format 8's: the same, its grants having seen no cut.
        let v8 = PermitRecordV8 {
            permit: PermitRecord::from_state(&adapted),
            adapted: adapted.adapted.iter().map(AdaptedRecord::from_state).collect(),
        };
        let read = decode_permit(&encode_schema(PERMIT_SCHEMA_V8, &v8)).unwrap();
        assert_eq!(read.adapted[0], AdaptedShare { cuts_seen: 0, ..adapted.adapted[0].clone() });
        assert!(decode_permit(&[6, 0]).unwrap_err().contains("schema 6"));
        let ceiling = Ceiling { c: 7, max: 20, cut_at: Some(Millis(3)), cuts: 4, grown_at: None, signal_at: Millis(4) };
        let bytes = encode_schema(CEILING_SCHEMA, &CeilingRecordV9::from_state(&ceiling));
        assert_eq!(decode_ceiling(&bytes), Ok(ceiling));
        let v8 = encode(&CeilingRecordV9::from_state(&ceiling).ceiling);
        assert_eq!(decode_ceiling(&v8), Ok(Ceiling { cuts: 0, ..ceiling }), "format 8's counted no cut");
        assert!(decode_ceiling(&[3, 0]).unwrap_err().contains("schema 3"));
        let level = BucketLevel { units: -7, unit_ms: 1000, refill: 3, burst: 9, at: Millis(12) };
        let bytes = encode(&LevelRecord::from_state(&level));
        assert_eq!(decode::<LevelRecord>(&bytes).map(LevelRecord::into_state), Ok(level));
    }

    fn grant(key: &str, at: u64, cost: u64) -> Effect {
        Effect::WindowGrant { bucket: Arc::from(key), at: Millis(at), cost }
    }

    fn pruned(key: &str, ats: &[u64]) -> Effect {
        Effect::WindowPruned { bucket: Arc::from(key), grants: ats.iter().map(|a| Millis(*a)).collect() }
    }

    /// The grants in the file, in key order.
    fn rows(store: &Store) -> Vec<(u64, String)> {
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(GRANTS).unwrap();
        table
            .iter()
            .unwrap()
            .map(|row| {
                let (k, _) = row.unwrap();
                let (at, bucket) = k.value();
                (at, bucket.to_owned())
            })
            .collect()
    }

    // The deletion policy is per redb commit: these tests open the file alone, where every
    // commit is one (behind a journal, commits are first kept as notes).
    #[test]
    fn doomed_grants_are_deleted_when_due_together_and_all_at_finish() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let mut store = Store::open(&path, &plain_file_opener()).unwrap();
        store.delete_batch = 1;
        let meta = BucketMeta { retain_ms: 1000, last_calls: 5, last_concurrent: 0 };
        store.commit(&[grant("a", 1_000, 1), grant("b", 1_500, 1), grant("a", 2_000, 1)], Millis(2_000)).unwrap();
        // Doomed at 2,500: a@1000 (age 1,500) is due at 3,000, b@1500 (age 1,000) at 3,500.
        store.commit(&[pruned("a", &[1_000]), pruned("b", &[1_500]), grant("c", 2_500, 1)], Millis(2_500)).unwrap();
        let all = |v: &[(u64, &str)]| v.iter().map(|(at, b)| (*at, (*b).to_owned())).collect::<Vec<_>>();
        assert_eq!(rows(&store), all(&[(1_000, "a"), (1_500, "b"), (2_000, "a"), (2_500, "c")]), "none due yet");
        store.commit(&[grant("c", 3_000, 1)], Millis(3_000)).unwrap();
        assert_eq!(rows(&store), all(&[(1_500, "b"), (2_000, "a"), (2_500, "c"), (3_000, "c")]));
        // Doomed young (age 600): due twice that later, at 3,700.
        store.commit(&[pruned("c", &[2_500]), grant("d", 3_100, 1)], Millis(3_100)).unwrap();
        assert_eq!(rows(&store).len(), 5);
        // A bucket record written for `c` (its window may have grown) deletes its doomed grants.
        store
            .commit(&[Effect::BucketMeta { bucket: Arc::from("c"), meta }, grant("c", 3_200, 1)], Millis(3_200))
            .unwrap();
        assert_eq!(rows(&store), all(&[(1_500, "b"), (2_000, "a"), (3_000, "c"), (3_100, "d"), (3_200, "c")]));
        // A tidying commit deletes every doomed grant, due or not.
        store.commit_and_tidy(&[pruned("d", &[3_100])], Millis(3_300)).unwrap();
        assert_eq!(rows(&store), all(&[(2_000, "a"), (3_000, "c"), (3_200, "c")]));
        // So does finishing.
        store.commit(&[pruned("c", &[3_000]), grant("e", 3_400, 1)], Millis(3_400)).unwrap();
        assert_eq!(rows(&store).len(), 4);
        store.finish(Millis(3_400)).unwrap();
        assert_eq!(rows(&store), all(&[(2_000, "a"), (3_200, "c"), (3_400, "e")]));
        store.finish(Millis(3_400)).unwrap();
        assert_eq!(store.grant_rows().unwrap(), 3);
    }

    /// Behind its journal, a commit is kept as a note (one append) until a commit of the notes
    /// alone takes them into redb; an open after a crash redoes them, in order.
    #[test]
    fn commits_kept_as_notes_are_redone_at_the_next_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let caller = || Arc::<str>::from("caller");
        {
            let mut store = Store::open(&path, &file_opener()).unwrap();
            store.commit(&[grant("a", 1_000, 2)], Millis(1_000)).unwrap();
            let throttle = Effect::ThrottleSet { key: caller(), until: Millis(9_000) };
            store.commit(&[throttle, grant("b", 1_100, 1)], Millis(1_100)).unwrap();
            store.commit(&[Effect::ThrottleEnded { key: caller() }], Millis(1_200)).unwrap();
            assert_eq!(store.journal_stats().unwrap().notes, 3);
            assert!(rows(&store).is_empty(), "not in redb yet");
            // Dropped without `finish`, as a crash leaves it.
        }
        let store = Store::open(&path, &file_opener()).unwrap();
        assert_eq!(rows(&store), vec![(1_000, "a".to_owned()), (1_100, "b".to_owned())]);
        let txn = store.db.begin_read().unwrap();
        assert!(txn.open_table(THROTTLES).unwrap().is_empty().unwrap(), "set, then ended, in order");
        assert_eq!(txn.open_table(META).unwrap().get(KEY_FLOOR).unwrap().unwrap().value(), 1_200);
        drop((txn, store));
        // The open's commit of the notes retired them: the next open finds nothing to redo.
        let store = Store::open(&path, &file_opener()).unwrap();
        assert_eq!(rows(&store).len(), 2);
        assert_eq!(store.journal_stats().unwrap().notes, 0);
    }

    fn ticket_state(lapse_at: u64) -> TicketState {
        TicketState {
            filed_at: Millis(1_000),
            retry_at: Millis(lapse_at - 500),
            lapse_at: Millis(lapse_at),
            grace_ms: 500,
            key: Arc::from("caller"),
            limits: vec![
                Limit::concurrent("a", 2).with_hold_ms(9_000),
                Limit::window("b", 5, 60_000),
                Limit::bucket("c", 5, 1_000).with_burst(9).with_initial(2),
            ],
            deadline: Some(Millis(lapse_at + 10_000)),
        }
    }

    /// The tickets in the file, by id.
    fn tickets(store: &Store) -> Vec<(u128, TicketState)> {
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(TICKETS).unwrap();
        table
            .iter()
            .unwrap()
            .map(|row| {
                let (k, v) = row.unwrap();
                (k.value(), decode_ticket(v.value()).unwrap().into_state().unwrap())
            })
            .collect()
    }

    /// A ticket is filed, renewed and ended in the file, as notes behind the journal (redone at
    /// the next open after a crash) and as redb commits; a note that names a ticket has a schema
    /// an older build refuses, and the older schema still reads.
    #[test]
    fn ceilings_and_adapted_tickets_are_kept_as_records_and_as_notes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let ceiling =
            |c, at| Ceiling { c, max: 20, cut_at: Some(Millis(at)), cuts: 1, grown_at: None, signal_at: Millis(at) };
        let set = |key: &str, c| Effect::CeilingSet { bucket: Arc::from(key), ceiling: ceiling(c, 900), change: None };
        let adapt = Adapt { min: 2, max: 20, increase: 1, keep_pct: 50 };
        let mut ticket = ticket_state(3_000);
        ticket.limits[1].adapt = Some(adapt);
        let id = TicketId(7 << 64 | 1);
        {
            let mut store = Store::open(&path, &file_opener()).unwrap();
            store.commit(&[set("a", 5), set("b", 7)], Millis(1_000)).unwrap();
            store.commit(&[Effect::CeilingForgotten { bucket: Arc::from("b") }], Millis(1_100)).unwrap();
            store.commit(&[Effect::TicketFiled { id, ticket: ticket.clone() }], Millis(1_200)).unwrap();
            assert_eq!(store.journal_stats().unwrap().notes, 3);
            // Dropped without `finish`, as a crash leaves it.
        }
        let mut store = Store::open(&path, &file_opener()).unwrap();
        let mut engine = Engine::new(crate::engine::EngineConfig::with(1000, 1));
        store.load(&mut engine).unwrap();
        assert_eq!(engine.ceilings(""), vec![("a".to_owned(), ceiling(5, 900))]);
        assert_eq!(tickets(&store), vec![(id.0, ticket.clone())], "the ticket keeps its adapt");
        // As redb commits.
        store
            .commit_and_tidy(&[set("c", 3), Effect::CeilingForgotten { bucket: Arc::from("a") }], Millis(1_300))
            .unwrap();
        let mut engine = Engine::new(crate::engine::EngineConfig::with(1000, 1));
        store.load(&mut engine).unwrap();
        assert_eq!(engine.ceilings(""), vec![("c".to_owned(), ceiling(3, 900))]);
        // A note of an older release that names a ceiling counting cuts is no note it wrote.
        for older in [NOTE_SCHEMA_V7, NOTE_SCHEMA_V8] {
            let mut forged = encode_note(Millis(9), &[set("a", 5)]);
            forged[0] = older;
            assert!(decode_note(&forged).unwrap_err().contains("format version 9"));
        }
    }

    #[test]
    fn tickets_are_kept_as_records_and_as_notes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let (one, two) = (TicketId(7 << 64 | 1), TicketId(7 << 64 | 2));
        let filed = |id, lapse| Effect::TicketFiled { id, ticket: ticket_state(lapse) };
        let renewed = |id, retry_at: u64, lapse_at: u64| Effect::TicketRenewed {
            id,
            retry_at: Millis(retry_at),
            lapse_at: Millis(lapse_at),
            grace_ms: 800,
        };
        {
            let mut store = Store::open(&path, &file_opener()).unwrap();
            store.commit(&[filed(one, 3_000), filed(two, 3_100)], Millis(1_000)).unwrap();
            store.commit(&[renewed(one, 4_000, 4_800)], Millis(1_500)).unwrap();
            store
                .commit(&[Effect::TicketEnded { id: two, end: crate::engine::TicketEnd::Left }], Millis(1_600))
                .unwrap();
            // A renewal of a ticket already gone writes nothing.
            store.commit(&[renewed(two, 4_000, 4_800)], Millis(1_700)).unwrap();
            assert_eq!(store.journal_stats().unwrap().notes, 4);
            assert!(tickets(&store).is_empty(), "not in redb yet");
            // Dropped without `finish`, as a crash leaves it.
        }
        let mut store = Store::open(&path, &file_opener()).unwrap();
        let mut renewed_one = ticket_state(3_000);
        (renewed_one.retry_at, renewed_one.lapse_at, renewed_one.grace_ms) = (Millis(4_000), Millis(4_800), 800);
        assert_eq!(tickets(&store), vec![(one.0, renewed_one.clone())]);
        let mut engine = Engine::new(crate::engine::EngineConfig::with(1000, 1));
        assert_eq!(store.load(&mut engine).unwrap(), Millis(1_700));
        assert_eq!(engine.facts(Millis(1_700)).tickets.into_iter().collect::<Vec<_>>(), vec![(one, renewed_one)]);
        // As redb commits (a tidying one is never a note): lapsed deletes.
        store.commit_and_tidy(&[Effect::TicketLapsed { id: one }, filed(two, 5_000)], Millis(4_800)).unwrap();
        assert_eq!(tickets(&store), vec![(two.0, ticket_state(5_000))]);

        let note = encode_note(Millis(9), &[filed(one, 3_000), Effect::TicketLapsed { id: two }]);
        assert_eq!(note[0], NOTE_SCHEMA);
        // What the previous release reads a note with: the schema byte refuses it.
        for older in [NOTE_SCHEMA_V4, NOTE_SCHEMA_V5, NOTE_SCHEMA_V6, NOTE_SCHEMA_V7, NOTE_SCHEMA_V8] {
            assert!(decode_schema::<Note<'_>>(older, &note).err().unwrap().contains("schema 6"));
        }
        let (floor, effects) = decode_note(&note).unwrap();
        assert_eq!(floor, Millis(9));
        assert!(
            matches!(&effects[..], [Effect::TicketFiled { id, .. }, Effect::TicketLapsed { id: gone }] if *id == one && *gone == two)
        );
        // A note of the previous release reads as it was written; one that names a ticket under
        // that schema is no note it wrote.
        let mut old = encode_note(Millis(9), &[grant("a", 9, 1)]);
        old[0] = NOTE_SCHEMA_V4;
        assert!(matches!(&decode_note(&old).unwrap().1[..], [Effect::WindowGrant { cost: 1, .. }]));
        let mut forged = note.clone();
        forged[0] = NOTE_SCHEMA_V4;
        assert!(decode_note(&forged).unwrap_err().contains("names a ticket"));
        // A ticket of the previous release's notes (schema 3) reads with no token bucket and no
        // horizon of its own; this build's record under that schema is no note it wrote.
        forged[0] = NOTE_SCHEMA_V6;
        assert!(decode_note(&forged).unwrap_err().contains("format version 8"));
        let mut previous = ticket_state(3_000);
        previous.limits.retain(|l| l.bucket.is_none());
        let v5 = TicketRecordV5 {
            filed_at: 1_000,
            retry_at: 2_500,
            lapse_at: 3_000,
            grace_ms: 500,
            key: "caller".into(),
            limits: vec![
                LimitRecordV5 { key: "a".into(), window: None, concurrent: Some(2), cost: 1, hold_ms: 9_000 },
                LimitRecordV5 {
                    key: "b".into(),
                    window: Some((5, 60_000)),
                    concurrent: None,
                    cost: 1,
                    hold_ms: 600_000,
                },
            ],
        };
        let read = decode_ticket(&encode(&v5)).unwrap().into_state().unwrap();
        assert_eq!(read, TicketState { deadline: None, ..previous });
    }

    /// Request id records (section 16) are kept, rewritten and forgotten as notes behind the
    /// journal (redone at the next open after a crash) and as redb commits; each kind of
    /// outcome reads back as written; notes of schema 2 that name an id are no notes the
    /// previous release wrote.
    #[test]
    fn request_ids_are_kept_as_records_and_as_notes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let share = WindowShare { bucket: Arc::from("w"), cost: 2, cap: 5, tokens: Some((5, 1000)) };
        let granted = RequestRecord {
            params: 0x1234_5678_9abc_def0_0fed_cba9_8765_4321,
            since: Millis(1_000),
            until: Millis(61_000),
            outcome: Outcome::Granted { at: Millis(1_000), permit: None, windows: Arc::from([share]) },
        };
        let ticketed = RequestRecord {
            params: 7,
            since: Millis(1_000),
            until: Millis(62_000),
            outcome: Outcome::Ticketed {
                ticket: TicketId(9 << 64 | 3),
                retry_at: Millis(2_000),
                reason: Reason::Concurrency,
                limit: Arc::from("c"),
                lapse_at: Millis(4_000),
            },
        };
        let released =
            RequestRecord { params: 0, since: Millis(1_000), until: Millis(63_000), outcome: Outcome::Released };
        let kept = |id: &str, record: &RequestRecord| Effect::RequestKept { id: Arc::from(id), record: record.clone() };
        let in_file = |store: &Store| -> Vec<(String, RequestRecord)> {
            let txn = store.db.begin_read().unwrap();
            let table = txn.open_table(REQUESTS).unwrap();
            let rows = table.iter().unwrap().map(|row| {
                let (k, v) = row.unwrap();
                let (since, id) = k.value();
                let record = decode_id(v.value()).unwrap();
                (id.to_owned(), RequestRecord { since: Millis(since), ..record })
            });
            rows.collect()
        };
        {
            let mut store = Store::open(&path, &file_opener()).unwrap();
            store.commit(&[kept("a", &granted), kept("b", &ticketed)], Millis(1_000)).unwrap();
            store.commit(&[kept("a", &released), kept("c", &released)], Millis(1_500)).unwrap();
            store
                .commit(&[Effect::RequestForgotten { id: Arc::from("c"), since: Millis(1_000) }], Millis(1_600))
                .unwrap();
            assert!(in_file(&store).is_empty(), "not in redb yet");
            // Dropped without `finish`, as a crash leaves it.
        }
        let store = Store::open(&path, &file_opener()).unwrap();
        let expected = vec![("a".to_owned(), released.clone()), ("b".to_owned(), ticketed.clone())];
        assert_eq!(in_file(&store), expected);
        let mut engine = Engine::new(crate::engine::EngineConfig::with(1000, 1));
        store.load(&mut engine).unwrap();
        assert_eq!(engine.remembered_ids(), 2);
        drop((engine, store));
        let mut store = Store::open(&path, &file_opener()).unwrap();
        store
            .commit_and_tidy(
                &[kept("d", &granted), Effect::RequestForgotten { id: Arc::from("a"), since: Millis(1_000) }],
                Millis(2_000),
            )
            .unwrap();
        assert_eq!(in_file(&store), vec![("b".to_owned(), ticketed), ("d".to_owned(), granted.clone())]);

        let note = encode_note(Millis(9), &[kept("e", &granted)]);
        assert_eq!(note[0], NOTE_SCHEMA);
        let mut forged = note.clone();
        forged[0] = NOTE_SCHEMA_V5;
        assert!(decode_note(&forged).unwrap_err().contains("names a request id"));
        let mut old = encode_note(Millis(9), &[Effect::TicketLapsed { id: TicketId(1) }]);
        old[0] = NOTE_SCHEMA_V5;
        assert!(matches!(&decode_note(&old).unwrap().1[..], [Effect::TicketLapsed { .. }]));
    }

    /// The bucket records in the file, in key order.
    fn records(store: &Store) -> Vec<(String, BucketMeta)> {
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(BUCKETS).unwrap();
        table
            .iter()
            .unwrap()
            .map(|row| {
                let (k, v) = row.unwrap();
                (k.value().to_owned(), decode(v.value()).unwrap())
            })
            .collect()
    }

    /// A forgotten bucket's record stays in the file until a batch of them waits: coming back as
    /// it was writes nothing, coming back changed writes the new record.
    #[test]
    fn forgotten_bucket_records_wait_for_a_batch_or_come_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let mut store = Store::open(&path, &plain_file_opener()).unwrap();
        let meta = BucketMeta { retain_ms: 1000, last_calls: 5, last_concurrent: 0 };
        let created = |key: &str, meta: BucketMeta| Effect::BucketMeta { bucket: Arc::from(key), meta };
        let forgotten = |key: &str| Effect::BucketForgotten { bucket: Arc::from(key), grants: vec![] };
        let n = RECORD_DELETE_BATCH;
        let keys: Vec<String> = (0..=n).map(|i| format!("k{i:03}")).collect();
        let all: Vec<Effect> = keys.iter().map(|k| created(k, meta)).collect();
        store.commit(&all, Millis(1_000)).unwrap();
        store.commit(&[forgotten("k000"), forgotten("k001"), grant("x", 2_000, 1)], Millis(2_000)).unwrap();
        assert_eq!(records(&store).len(), n + 1, "kept while fewer than a batch wait");
        // k000 comes back as it was: nothing to write, and it is no longer doomed.
        store.commit(&[created("k000", meta), grant("k000", 3_000, 1)], Millis(3_000)).unwrap();
        // k001 comes back changed: its record is rewritten.
        let wider = BucketMeta { retain_ms: 5_000, ..meta };
        store.commit(&[created("k001", wider), grant("k001", 3_100, 1)], Millis(3_100)).unwrap();
        assert_eq!(records(&store)[1], ("k001".to_owned(), wider));
        // A batch of forgotten records is deleted by the commit that completes it.
        let rest: Vec<Effect> = keys[1..].iter().map(|k| forgotten(k)).chain([grant("x", 4_000, 1)]).collect();
        store.commit(&rest, Millis(4_000)).unwrap();
        assert_eq!(records(&store), vec![("k000".to_owned(), meta)]);
        // Finishing deletes whatever waits.
        store.commit(&[forgotten("k000"), grant("x", 5_000, 1)], Millis(5_000)).unwrap();
        assert_eq!(records(&store).len(), 1);
        store.finish(Millis(5_000)).unwrap();
        assert!(records(&store).is_empty());
    }

    /// A commit that grants leaves due grants for later until a batch of them is due.
    #[test]
    fn doomed_grants_wait_for_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let mut store = Store::open(&path, &plain_file_opener()).unwrap();
        let n = DELETE_BATCH as u64;
        let old: Vec<Effect> = (0..n).map(|i| grant(&format!("k{i}"), 1_000 + i, 1)).collect();
        store.commit(&old, Millis(1_000 + n)).unwrap();
        // All but the last doomed at 10,000; each is due at once (older than DELETE_AFTER_MS).
        let mut effects: Vec<Effect> = (0..n - 1).map(|i| pruned(&format!("k{i}"), &[1_000 + i])).collect();
        effects.push(grant("new", 10_000, 1));
        store.commit(&effects, Millis(10_000)).unwrap();
        assert_eq!(store.grant_rows().unwrap(), n + 1, "one short of a batch: none deleted");
        store
            .commit(&[pruned(&format!("k{}", n - 1), &[1_000 + n - 1]), grant("new", 10_001, 1)], Millis(10_001))
            .unwrap();
        assert_eq!(store.grant_rows().unwrap(), 2, "a batch due: all deleted");
    }

    /// The floor a reopen starts from: a commit that grants leaves `clock_floor` alone, and the
    /// newest grant stands for it; one that grants nothing records it.
    #[test]
    fn the_floor_is_the_newest_grant_or_the_last_recorded_floor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let floor_after = |effects: &[Effect], floor: u64| {
            let mut store = Store::open(&path, &file_opener()).unwrap();
            store.commit(effects, Millis(floor)).unwrap();
            drop(store);
            let store = Store::open(&path, &file_opener()).unwrap();
            store.load(&mut Engine::new(crate::engine::EngineConfig::with(1000, 1))).unwrap()
        };
        let recorded = || {
            let store = Store::open(&path, &file_opener()).unwrap();
            let txn = store.db.begin_read().unwrap();
            txn.open_table(META).unwrap().get(KEY_FLOOR).unwrap().unwrap().value()
        };
        assert_eq!(floor_after(&[], 1_000), Millis(1_000));
        // A grant at the commit's `now` holds the floor: `clock_floor` is not written.
        assert_eq!(floor_after(&[grant("a", 2_000, 1)], 2_000), Millis(2_000));
        assert_eq!(recorded(), 1_000);
        // Granted at 5,000, committed at 6,000 (a sweep ran in between): the floor is 6,000.
        assert_eq!(floor_after(&[grant("a", 5_000, 1)], 6_000), Millis(6_000));
        let throttle = Effect::ThrottleSet { key: Arc::from("caller"), until: Millis(90_000) };
        assert_eq!(floor_after(&[throttle], 7_000), Millis(7_000));
        // Deleting grants without granting records the floor too.
        assert_eq!(floor_after(&[pruned("a", &[2_000, 5_000])], 9_500), Millis(9_500));
    }

    /// One batch grants `b` just before a sweep forgets `a` (its only grant a full window old).
    /// After a reopen whose clock reads earlier, the floor must be the batch's `now`: at the
    /// instant of `b`'s grant `a`'s grant would still count, and it is gone from the file.
    #[test]
    fn a_batch_that_grants_then_forgets_keeps_the_floor_of_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("limiter.redb");
        let mut store = Store::open(&path, &file_opener()).unwrap();
        let meta = BucketMeta { retain_ms: 10_000, last_calls: 1, last_concurrent: 0 };
        store
            .commit(&[Effect::BucketMeta { bucket: Arc::from("a"), meta }, grant("a", 1_000, 1)], Millis(1_000))
            .unwrap();
        let forgotten = Effect::BucketForgotten { bucket: Arc::from("a"), grants: vec![Millis(1_000)] };
        store.commit(&[grant("b", 10_999, 1), forgotten], Millis(11_000)).unwrap();
        drop(store);
        let store = Store::open(&path, &file_opener()).unwrap();
        let floor = store.load(&mut Engine::new(crate::engine::EngineConfig::with(1000, 1))).unwrap();
        assert_eq!(floor, Millis(11_000));
    }
}
