//! A page journal under redb: [`JournalBackend`], a [`StorageBackend`] that turns each of redb's
//! write barriers into one sequential, checksummed append to a preallocated journal file.
//!
//! Without it, a durable redb commit writes its header and a handful of scattered pages into the
//! database file and calls `fdatasync` on it. With it, the commit's writes are gathered in
//! memory, appended as ONE record to a journal file that was preallocated (so `fdatasync` never
//! has to flush file-size metadata), and the journal is synced once: one write and one sync per
//! barrier. The database file itself is written and synced only at a checkpoint, once per
//! journal-full of records, each page once however often it changed in between.
//!
//! [`super::file_opener`] opens every limiter file behind it; [`super::Store::open`] first
//! replays a journal onto its file ([`JournalBackend::recover_path`]) so that the file's checks
//! see the whole acknowledged state. Its proofs are its tests: power cuts over every write and
//! sync, injected faults, and a sabotaged journal that the simulation must catch.
//!
//! # Files
//!
//! The backend wraps two inner backends: `data`, the database file redb sees (its bytes are
//! exactly redb's bytes, nothing is added), and `log`, the journal, a sibling file named by
//! [`journal_path`] (`limiter.redb` → `limiter.redb-journal`). Either may be any
//! [`StorageBackend`], which lets tests put a fault-injecting backend under each.
//!
//! # Journal layout
//!
//! All integers are little-endian. The file is two header slots and a record region:
//!
//! | bytes | what |
//! | --- | --- |
//! | `0..8192` | header slot 0 |
//! | `8192..16384` | header slot 1 |
//! | `16384..16384 + region` | the record region (`JournalOptions::region_bytes`, 16 MiB by default) |
//!
//! The whole file is written with zeros when it is created, so later appends overwrite allocated
//! blocks and never change the file's size.
//!
//! A header slot (8192 bytes):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `redbJRNL` |
//! | 8 | 4 | format version (1) |
//! | 12 | 4 | first-page length (4096) |
//! | 16 | 16 | journal id: random, chosen when the journal is created |
//! | 32 | 8 | generation: bumped by every checkpoint |
//! | 40 | 8 | sequence number of the first record of this generation |
//! | 48 | 8 | region offset (16384) |
//! | 56 | 8 | region length |
//! | 64 | 8 | the data file's length at the checkpoint |
//! | 72..4088 | | zero |
//! | 4088 | 8 | xxHash64 of the whole slot, computed with this field zeroed |
//! | 4096 | 4096 | the data file's first 4096 bytes at the checkpoint (zero past its length) |
//!
//! The valid slot (magic, version and checksum all good) with the higher generation is current.
//! A checkpoint writes the other slot, so a torn header write leaves the previous one in force.
//!
//! A record, written at a 4096-byte-aligned position of the region:
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `JREC` |
//! | 4 | 4 | flags: 1 a note (see below), 2 retires the notes before it |
//! | 8 | 16 | journal id |
//! | 24 | 8 | generation |
//! | 32 | 8 | sequence number |
//! | 40 | 8 | record length, padding included (a multiple of 4096) |
//! | 48 | 8 | the smallest length the file had during the batch (after `set_len` calls) |
//! | 56 | 8 | the file's length at the end of the batch |
//! | 64 | 4 | entry count |
//! | 68 | 4 | zero |
//! | 72 | | entries: offset (8), length (4), stored length (4), the stored bytes |
//! | | 8 | xxHash64 of everything from offset 0 to the end of the entries |
//! | | | zero padding to the record length |
//!
//! The entries are the batch's final bytes, non-overlapping (a later write to the same bytes
//! replaces an earlier one in memory) and all below the final length. An entry's trailing zeros
//! are not stored (redb's pages fill from the front: most of a page is often zeros). Applying a record means:
//! cut the file to the smallest length (bytes the batch truncated and regrew read as zeros), set
//! the final length, write the entries. Applying the same records again gives the same file.
//!
//! # Notes
//!
//! A note is a record of the caller's own bytes (one entry at offset 0, lengths 0), appended and
//! synced by [`JournalMonitor::append_note`] between redb's commits: the store keeps a commit
//! as a note (its effects), one append and one sync, and later makes one redb commit of many
//! notes at once. Nothing of a note is applied to the file. The rules:
//!
//! * Notes are appended only while the region is at most a quarter full
//!   (`NOTE_ROOM_DIVISOR`); when none waits, a note first checkpoints to make room.
//! * While notes wait, no checkpoint runs (it would retire them), not even at a close: the
//!   records stay for the next open. The rest of the region is for redb's own barriers in the
//!   meantime (a repair at an open) and the commit that holds the notes.
//! * [`JournalMonitor::notes_held`], called once a redb commit holding what every note says has
//!   returned, makes the next record carry flag 2: from that record on, the notes are retired.
//!   A crash before it redoes the notes on top of that commit, so what a note says must be
//!   idempotent (the store's effects are, when the commit holds the notes alone).
//! * Recovery hands the notes after the last retiring record to the caller
//!   ([`JournalMonitor::take_recovered_notes`]) and then neither checkpoints nor resizes: appends
//!   go on after the records, in the same generation.
//! * A journal of format version 1 (before notes) opens unchanged and its header is rewritten at
//!   version 2 before anything is appended, so a build that knows only version 1 refuses a
//!   journal that may hold notes instead of applying their bytes as pages.
//!
//! # The write path
//!
//! * `write` and `set_len` touch memory only: the batch, an overlay of extents (offset → bytes;
//!   a write over older extents splits them) and the logical length. `read` and `len` see the
//!   batch first, then the committed overlay below, then the data file as of the checkpoint.
//! * `sync_data` is redb's barrier. If nothing changed since the last one it returns at once.
//!   Otherwise it encodes the batch as one record, appends it at the write position, and calls
//!   `log.sync_data()` once: the barrier is durable, and acknowledged, from here on. The batch
//!   then joins the committed overlay, in memory. Each barrier is exactly one record, in order.
//! * Between checkpoints the data file is not written at all.
//!
//! # Checkpoints
//!
//! A checkpoint writes the committed overlay to the data file (cut and set to its length first),
//! calls `data.sync_data()`, then writes the non-current header slot with generation + 1 and the
//! data file's first page, and calls `log.sync_data()`. From then on the old records are stale
//! (wrong generation) and appends start again at the beginning of the region: the journal is
//! reused by reset, never grown. A checkpoint runs before a record that would not fit in the
//! rest of the region, before one that would pass `checkpoint_records` or `checkpoint_bytes`,
//! at `close`, and at the end of a recovery that replayed anything.
//!
//! A batch whose record is larger than the whole region is not journaled: the backend
//! checkpoints, then checkpoints again with the batch added (written directly to the data file
//! and synced). That one barrier is then exactly as atomic as it is on a plain file, which is what
//! redb's own commit protocol (copy-on-write pages, checksummed commit slots) is built for; it is
//! correct, only slower. With the default 16 MiB region it takes a transaction that writes about
//! 16 MiB.
//!
//! # Recovery (`open`)
//!
//! Before redb sees the data file:
//!
//! 1. The journal is locked exclusively (when its backend supports locks), and a data file that
//!    another handle holds a lock on is refused ([`JournalError::Held`]).
//! 2. An empty journal (a data file from before the journal existed, or a new database) is
//!    created: the data file is synced, its first page bound into a new header, nothing replayed.
//! 3. Otherwise the records of the current generation are read from the start of the region, in
//!    order: each must have the magic, the journal id, the current generation, the next sequence
//!    number, a length inside the region, well-formed entries and a matching checksum. The first
//!    record that fails any of these ends the log: it was never acknowledged (its sync did not
//!    return) or it is a stale record of an earlier generation.
//! 4. If there are records, the data file's first page must be the one bound at the checkpoint,
//!    or the one the records lead to, or a torn mix of these two (a prefix of one and the rest of
//!    the other: a checkpoint cut off while writing it). Anything else means the journal belongs to
//!    another file (or the file was replaced or restored from elsewhere), and the open is refused
//!    with [`JournalError::Foreign`], leaving both files untouched. If there are no records,
//!    nothing could be applied to the wrong file: a first page or length other than the bound
//!    one (the file was written without the journal, or a checkpoint of a batch too large for the
//!    journal was cut off) is simply bound by a new checkpoint ([`Recovery::rebound`]).
//! 5. The records are applied in order, in memory, from the checkpoint's length, and a checkpoint
//!    writes the result to the data file, unless notes wait (see above).
//!
//! The random journal id keeps a record of another journal incarnation from ever being taken
//! for one of this journal's; the bound first page is the data file's identity. redb keeps its
//! header there: the commit slots with their transaction ids and the checksums of the table
//! roots, so two files with the same first page hold the same committed state. The header is the
//! first 320 bytes, inside one disk sector, which is why a cut-off checkpoint can only leave the
//! old page, the new one, or one torn mix of the two there.
//!
//! # Fault model
//!
//! * A power cut may lose any write not followed by a completed sync, in any combination, and may
//!   tear the write in flight. A barrier is never acknowledged before `log.sync_data()` returns,
//!   a torn record fails its checksum, and only whole records are replayed, so after a cut the
//!   database holds every acknowledged barrier and, of the one in flight, all or nothing.
//! * A checkpoint cut off leaves the data file partly written, which replaying the same records
//!   again repairs: the data file is synced before a new header retires them.
//! * A failed I/O call latches the backend: that `sync_data` and every later write, `set_len` and
//!   `sync_data` fail (reads still work), and `close` does not checkpoint. A barrier whose call
//!   failed may or may not be durable; the next open finds it whole or not at all.
//! * Only one process may use the pair of files at a time; redb's own locks go to the data file,
//!   and the journal takes an exclusive lock of its own. Between checkpoints the data file alone
//!   is an older state of the database (what a crash at the last checkpoint would have left):
//!   open it only through this backend, or the commits since are lost. Losing the journal file
//!   after a crash loses the commits it held, as with any write-ahead log.
//! * Memory: the writes since the last barrier, and the distinct bytes written since the last
//!   checkpoint (at most the region's size); recovery reads the pending records into memory.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// The journal file's name suffix: `limiter.redb` → `limiter.redb-journal`.
pub const JOURNAL_SUFFIX: &str = "-journal";

/// Bytes at the start of the data file held in memory between checkpoints.
const HEAD_LEN: usize = 4096;
const HEAD: u64 = HEAD_LEN as u64;
/// Records start at multiples of this.
const ALIGN: u64 = 4096;
const SLOT_LEN: usize = 2 * HEAD_LEN;
const SLOT_CHECKSUM_AT: usize = HEAD_LEN - 8;
const REGION_START: u64 = 2 * SLOT_LEN as u64;
const MIN_REGION: u64 = 64 * 1024;
const DEFAULT_REGION: u64 = 16 * 1024 * 1024;
const JOURNAL_MAGIC: [u8; 8] = *b"redbJRNL";
/// The format version written. Version 2 added notes; a version-1 header (no notes) is read and
/// rewritten as version 2 before the first note, so a build that knows only version 1 refuses a
/// journal that may hold notes instead of misreading them.
const FORMAT_VERSION: u32 = 2;
const OLDEST_FORMAT_VERSION: u32 = 1;
/// A record's flags: a note (see the module docs), not a batch of pages.
const FLAG_NOTE: u32 = 1;
/// Notes are appended only while the region is at most this fraction full (1/4): while they
/// wait no checkpoint may run, so the rest stays for redb's own commits in the meantime (a
/// repair at an open) and for the commit that holds them.
const NOTE_ROOM_DIVISOR: u64 = 4;
/// A record's flags: every note before this record is retired (a redb commit holding what they
/// say returned before this record was appended).
const FLAG_RETIRES_NOTES: u32 = 2;
const RECORD_MAGIC: [u8; 4] = *b"JREC";
const RECORD_HEADER_LEN: usize = 72;
const ENTRY_HEADER_LEN: usize = 16;
const CHECKSUM_LEN: usize = 8;
const ZERO_CHUNK: usize = 1 << 20;

/// Derives the journal's path from the data file's: the same directory, the name plus
/// [`JOURNAL_SUFFIX`].
#[must_use]
pub fn journal_path(data_path: &Path) -> PathBuf {
    let mut name = data_path.file_name().map(OsString::from).unwrap_or_default();
    name.push(JOURNAL_SUFFIX);
    data_path.with_file_name(name)
}

/// How big the journal is and when it checkpoints.
#[derive(Clone, Debug)]
pub struct JournalOptions {
    /// Size of the record region; the journal file is this plus 16 KiB of header slots. Rounded
    /// down to a multiple of 4096, at least 64 KiB. An existing journal of another size is
    /// reformatted to this size after its recovery.
    pub region_bytes: u64,
    /// Checkpoint before the record that would make this many in the region (0: only when full).
    pub checkpoint_records: u64,
    /// Checkpoint before the record that would bring the region's bytes past this (0: only when
    /// full).
    pub checkpoint_bytes: u64,
}

impl Default for JournalOptions {
    fn default() -> Self {
        JournalOptions { region_bytes: DEFAULT_REGION, checkpoint_records: 0, checkpoint_bytes: 0 }
    }
}

impl JournalOptions {
    fn region_len(&self) -> u64 {
        (self.region_bytes / ALIGN * ALIGN).max(MIN_REGION)
    }
}

/// What a data file says of its journal (the store keeps it in the file's own tables): the
/// journal it was last open behind, how far that journal reached when the file's newest commit
/// began, and whether it was closed cleanly since. [`JournalBackend::open_claimed`] refuses a
/// journal that contradicts it, before anything is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileClaim {
    /// The journal's id as [`JournalMonitor::journal_id`] gives it.
    pub journal_id: u64,
    /// [`JournalMonitor::next_seq`] when the file's newest commit began: that commit's records
    /// carry this sequence number or a later one, so the file's journal reaches past it.
    pub next_seq: u64,
    /// Open behind the journal and not closed cleanly since: its journal holds commits the file
    /// alone lacks, and must be there.
    pub open: bool,
}

/// Deliberate bugs, so that tests can show the power-cut simulation catches them.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Sabotage {
    #[default]
    None,
    /// Acknowledge a barrier without syncing the journal.
    SkipLogSync,
    /// Retire the records at a checkpoint without syncing the data file first.
    SkipDataSyncAtCheckpoint,
}

/// What [`JournalBackend::open`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// The journal was missing (or empty) and was created.
    pub created: bool,
    /// Records replayed onto the data file.
    pub replayed_records: u64,
    /// Bytes of page data in those records.
    pub replayed_bytes: u64,
    /// There was nothing to replay and the data file's first page or length differed from the
    /// bound ones (the file was written without the journal); the journal now binds it as it is.
    pub rebound: bool,
    /// The journal was rewritten at another size (the options asked for one, or it was short).
    pub resized: bool,
    /// The generation current after the open.
    pub generation: u64,
    /// Notes found after the last redb commit, handed to the store through
    /// [`JournalMonitor::take_recovered_notes`]; the journal is not checkpointed while they wait.
    pub pending_notes: u64,
}

/// Counters since the open, readable through a [`JournalMonitor`] while redb owns the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Records appended (barriers journaled).
    pub records: u64,
    /// Bytes appended, padding included.
    pub record_bytes: u64,
    /// Checkpoints taken.
    pub checkpoints: u64,
    /// Barriers too large for the region, written directly to the data file.
    pub direct_batches: u64,
    /// Notes appended.
    pub notes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    records: AtomicU64,
    record_bytes: AtomicU64,
    checkpoints: AtomicU64,
    direct_batches: AtomicU64,
    notes: AtomicU64,
    /// Set by [`JournalMonitor::request_checkpoint`]; taken by the next barrier.
    checkpoint_requested: AtomicBool,
    /// The database's length as of the last barrier (what redb sees; the file on disk catches
    /// up at checkpoints).
    len: AtomicU64,
}

/// A handle on a [`JournalBackend`] that stays usable after the backend is moved into a
/// `redb::Database`: its counters, and its notes (once the database is dropped, appending one
/// fails).
#[derive(Clone)]
pub struct JournalMonitor {
    counters: Arc<Counters>,
    shared: Weak<Shared>,
}

impl fmt::Debug for JournalMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalMonitor").field("counters", &self.counters).finish_non_exhaustive()
    }
}

impl JournalMonitor {
    #[must_use]
    pub fn stats(&self) -> JournalStats {
        let c = &self.counters;
        JournalStats {
            records: c.records.load(Ordering::Relaxed),
            record_bytes: c.record_bytes.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
            direct_batches: c.direct_batches.load(Ordering::Relaxed),
            notes: c.notes.load(Ordering::Relaxed),
        }
    }

    /// The database's length as redb sees it after the last durable barrier, journal included
    /// (the file on disk has it only from the next checkpoint).
    #[must_use]
    pub fn database_len(&self) -> u64 {
        self.counters.len.load(Ordering::Relaxed)
    }

    /// The journal's id as a data file names it (its first 8 bytes, little-endian).
    #[must_use]
    pub fn journal_id(&self) -> u64 {
        self.shared
            .upgrade()
            .and_then(|shared| shared.state.read().ok().map(|st| short_id(&st.journal_id)))
            .unwrap_or(0)
    }

    /// The sequence number the next record will carry.
    #[must_use]
    pub fn next_seq(&self) -> u64 {
        self.shared.upgrade().and_then(|shared| shared.state.read().ok().map(|st| st.next_seq)).unwrap_or(0)
    }

    /// Checks the journal file as it is on disk against the one open: as long as its header
    /// says, and its current header slot whole and of this journal. Catches a journal truncated
    /// or overwritten in place while open (a delete or a replace changes its inode instead).
    pub fn verify_on_disk(&self) -> Result<(), &'static str> {
        let Some(shared) = self.shared.upgrade() else { return Ok(()) };
        let Ok(st) = shared.state.read() else { return Ok(()) };
        if st.closed || st.failed.is_some() {
            return Ok(());
        }
        let expected = REGION_START + st.region_len;
        match shared.log.len() {
            Ok(len) if len < expected => return Err("its journal was truncated while open"),
            Ok(_) => {}
            Err(_) => return Err("its journal cannot be read while open"),
        }
        let mut slot = vec![0u8; SLOT_LEN];
        if shared.log.read((st.active_slot * SLOT_LEN) as u64, &mut slot).is_err() {
            return Err("its journal cannot be read while open");
        }
        match Header::decode(&slot) {
            Slot::Valid(h) if h.journal_id == st.journal_id && h.generation == st.generation => Ok(()),
            _ => Err("its journal was overwritten while open"),
        }
    }

    /// Asks for a checkpoint right after the next barrier (redb's next durable commit), so that
    /// the data file on disk holds everything up to it: after a compaction, to give its space
    /// back now rather than when the region fills.
    pub fn request_checkpoint(&self) {
        self.counters.checkpoint_requested.store(true, Ordering::Release);
    }

    /// Appends `note` (bytes of the caller's own, see the module docs) as one record and syncs
    /// it: `Ok(true)` once it is durable. `Ok(false)`, having written nothing, when the journal
    /// wants the note's contents committed through redb instead (it would pass a quarter of the
    /// region).
    /// Call it between redb commits only (never with a write transaction open). An error latches
    /// the backend as a failed barrier does: the note may or may not be durable, and the
    /// database must be reopened.
    pub fn append_note(&self, note: &[u8]) -> io::Result<bool> {
        let shared = self.shared.upgrade().ok_or_else(|| io::Error::other("journal: the database is closed"))?;
        let mut st = shared.state.write().map_err(|_| poisoned())?;
        let appended = st.append_note(&*shared.data, &*shared.log, &shared.counters, note);
        if let Err(e) = &appended {
            st.failed = Some(e.to_string());
        }
        appended
    }

    /// Says that a redb commit holding what every note so far says has returned: the next
    /// record retires them, and checkpoints may run again. Until that record is durable a crash
    /// leaves the notes to be redone on top of that commit, so what a note says must be
    /// idempotent (the store's effects are: each sets or removes a record). Call it only after
    /// the commit returned `Ok` (a commit may make several barriers, and only its last holds it).
    pub fn notes_held(&self) {
        if let Some(shared) = self.shared.upgrade()
            && let Ok(mut st) = shared.state.write()
            && st.notes_pending > 0
        {
            st.notes_pending = 0;
            st.retire_notes = true;
        }
    }

    /// The notes the open found after the last redb commit, oldest first; each is returned once.
    /// They stay in the journal until a redb commit (which must hold what they say) follows them.
    #[must_use]
    pub fn take_recovered_notes(&self) -> Vec<Vec<u8>> {
        match self.shared.upgrade() {
            Some(shared) => std::mem::take(&mut *shared.recovered_notes.lock().unwrap_or_else(|e| e.into_inner())),
            None => Vec::new(),
        }
    }
}

/// Why a journal cannot be opened.
#[derive(Debug)]
#[non_exhaustive]
pub enum JournalError {
    /// An I/O call of an inner backend failed.
    Io(io::Error),
    /// The journal holds records for a data file other than this one.
    Foreign,
    /// The journal file is not a journal (and is not an empty or half-created one).
    NotAJournal,
    /// The journal was written by a newer format version.
    UnsupportedVersion(u32),
    /// A record passed its checksum but is malformed.
    Corrupt(String),
    /// Another instance holds the journal or the data file.
    Held,
    /// The data file names another journal than this one ([`FileClaim::journal_id`]).
    NotThisFilesJournal { file_names: u64, journal_is: u64 },
    /// The journal ends before commits the data file already holds: an earlier copy of itself.
    Older { file_reaches: u64, journal_ends: u64 },
    /// The data file was not closed cleanly and its journal is empty or gone: the commits only
    /// the journal held are missing.
    Missing,
    /// The journal file is shorter than its header says: it was truncated.
    Truncated { len: u64, expected: u64 },
    /// Damage other than a torn newest record: refused, never replayed up to it.
    Damaged(String),
    /// The data file is empty but the journal is bound to a file of this many bytes.
    FileEmptied { bound_len: u64 },
    /// Too little room on the disk to create the journal.
    NoRoom { needs: u64, cause: io::Error },
}

impl fmt::Display for JournalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JournalError::Io(e) => write!(f, "journal I/O: {e}"),
            JournalError::Foreign => f.write_str(
                "the journal holds unapplied commits of another database file (or of an earlier copy \
                 of this one); refusing to apply them",
            ),
            JournalError::NotAJournal => f.write_str("the journal file is not a redb page journal"),
            JournalError::UnsupportedVersion(v) => write!(f, "journal format version {v} is not supported"),
            JournalError::Corrupt(why) => write!(f, "the journal is corrupt: {why}"),
            JournalError::Held => f.write_str("the journal or its database file is in use elsewhere"),
            JournalError::NotThisFilesJournal { file_names, journal_is } => write!(
                f,
                "the journal belongs to another database file: the file names journal {file_names:016x}, this \
                 journal is {journal_is:016x}; refusing to open the pair"
            ),
            JournalError::Older { file_reaches, journal_ends } => write!(
                f,
                "the journal is older than the file (an earlier copy of it): the file holds commits up to journal \
                 record {file_reaches}, the journal ends before record {journal_ends}"
            ),
            JournalError::Missing => f.write_str(
                "the file was not closed cleanly and its journal is missing or empty: the newest commits were only \
                 in the journal; restore the journal beside the file",
            ),
            JournalError::Truncated { len, expected } => write!(
                f,
                "the journal was truncated: it is {len} bytes, its header says {expected}; refusing to open it"
            ),
            JournalError::Damaged(why) => write!(f, "the journal is damaged: {why}; refusing to open it"),
            JournalError::FileEmptied { bound_len } => write!(
                f,
                "the journal belongs to a file of {bound_len} bytes but the file is empty (truncated or replaced)"
            ),
            JournalError::NoRoom { needs, cause } => {
                write!(f, "too little room for the journal: it needs {needs} bytes ({cause})")
            }
        }
    }
}

impl std::error::Error for JournalError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            JournalError::Io(e) | JournalError::NoRoom { cause: e, .. } => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for JournalError {
    fn from(e: io::Error) -> Self {
        JournalError::Io(e)
    }
}

impl From<JournalError> for io::Error {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Io(e) => e,
            JournalError::Held => io::Error::new(io::ErrorKind::WouldBlock, e),
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// A [`StorageBackend`] that journals redb's write barriers; see the module docs.
pub struct JournalBackend {
    shared: Arc<Shared>,
    recovery: Recovery,
}

/// What the backend and its [`JournalMonitor`] (for notes) both reach.
struct Shared {
    data: Box<dyn StorageBackend>,
    log: Box<dyn StorageBackend>,
    state: RwLock<State>,
    counters: Arc<Counters>,
    /// The notes recovery found pending, until the store takes them.
    recovered_notes: Mutex<Vec<Vec<u8>>>,
}

impl fmt::Debug for JournalBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JournalBackend")
            .field("data", &self.shared.data)
            .field("log", &self.shared.log)
            .field("recovery", &self.recovery)
            .finish_non_exhaustive()
    }
}

/// A file read through redb without changing it: reads see the file, writes stay in memory.
/// How a file that a crash left for redb to repair is looked at before its journal is touched
/// (redb's read-only open refuses such a file).
#[derive(Debug)]
pub struct ScratchBackend {
    file: Box<dyn StorageBackend>,
    writes: Mutex<(Extents, u64)>,
}

impl ScratchBackend {
    /// Over `file`, whose length is the starting length.
    pub fn new(file: Box<dyn StorageBackend>) -> io::Result<Self> {
        let len = file.len()?;
        Ok(ScratchBackend { file, writes: Mutex::new((Extents::default(), len)) })
    }
}

impl StorageBackend for ScratchBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.writes.lock().map_err(|_| poisoned())?.1)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let guard = self.writes.lock().map_err(|_| poisoned())?;
        let (extents, len) = (&guard.0, guard.1);
        if offset.checked_add(out.len() as u64).is_none_or(|end| end > len) {
            return Err(unexpected_eof());
        }
        let file_len = self.file.len()?;
        layered(extents, offset, out, |pos, out| read_cut(&*self.file, file_len, pos, out))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut guard = self.writes.lock().map_err(|_| poisoned())?;
        if len < guard.1 {
            guard.0.truncate(len);
        }
        guard.1 = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut guard = self.writes.lock().map_err(|_| poisoned())?;
        guard.0.insert(offset, data);
        guard.1 = guard.1.max(offset + data.len() as u64);
        Ok(())
    }
}

/// Non-overlapping extents keyed by offset.
#[derive(Debug, Default)]
struct Extents {
    map: BTreeMap<u64, Vec<u8>>,
}

impl Extents {
    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn insert(&mut self, offset: u64, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if let Some(old) = self.map.get_mut(&offset)
            && old.len() == bytes.len()
        {
            old.copy_from_slice(bytes);
            return;
        }
        self.cut(offset, offset + bytes.len() as u64);
        self.map.insert(offset, bytes.to_vec());
    }

    fn insert_vec(&mut self, offset: u64, bytes: Vec<u8>) {
        if bytes.is_empty() {
            return;
        }
        let same_span = self.map.get(&offset).is_some_and(|old| old.len() == bytes.len());
        if !same_span {
            self.cut(offset, offset + bytes.len() as u64);
        }
        self.map.insert(offset, bytes);
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.map.iter().map(|(o, b)| (*o, b.as_slice()))
    }

    /// Removes `[start, end)` from every extent, keeping what lies outside it.
    fn cut(&mut self, start: u64, end: u64) {
        if let Some((&s, v)) = self.map.range(..start).next_back()
            && s + v.len() as u64 > start
            && let Some(mut v) = self.map.remove(&s)
        {
            let e = s + v.len() as u64;
            if e > end {
                let tail = v[(end - s) as usize..].to_vec();
                self.map.insert(end, tail);
            }
            v.truncate((start - s) as usize);
            self.map.insert(s, v);
        }
        let inside: Vec<u64> = self.map.range(start..end).map(|(&k, _)| k).collect();
        for k in inside {
            if let Some(mut v) = self.map.remove(&k) {
                let e = k + v.len() as u64;
                if e > end {
                    let tail = v.split_off((end - k) as usize);
                    self.map.insert(end, tail);
                }
            }
        }
    }

    fn truncate(&mut self, len: u64) {
        self.cut(len, u64::MAX);
    }

    /// The extents overlapping `[start, end)`, in order.
    fn overlapping(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &[u8])> {
        let before = self
            .map
            .range(..start)
            .next_back()
            .filter(|(s, v)| **s + v.len() as u64 > start)
            .map(|(s, v)| (*s, v.as_slice()));
        let inside = self.map.range(start..end).map(|(s, v)| (*s, v.as_slice()));
        before.into_iter().chain(inside)
    }
}

struct State {
    /// Logical length now.
    len: u64,
    /// Smallest logical length since the last barrier.
    min_len: u64,
    /// Writes since the last barrier.
    batch: Extents,
    /// Logical length at the last barrier.
    committed_len: u64,
    /// The barriers since the checkpoint, not yet in the data file.
    applied: Extents,
    /// Smallest logical length at any barrier since the checkpoint: the data file's bytes past it
    /// are stale (they read as zeros unless `applied` has them).
    ck_min_len: u64,
    /// The data file's physical length.
    phys: u64,
    /// Whether the current header binds the data file as it is (nothing to write or rebind).
    bound: bool,
    journal_id: [u8; 16],
    generation: u64,
    next_seq: u64,
    /// Slot holding the current header.
    active_slot: usize,
    region_len: u64,
    write_pos: u64,
    records_in_region: u64,
    /// Notes appended and not yet held by a redb commit: while any wait, no checkpoint runs.
    notes_pending: u64,
    /// The notes before the next record are held by a redb commit: it says so
    /// ([`FLAG_RETIRES_NOTES`]).
    retire_notes: bool,
    /// Record buffer, reused.
    buf: Vec<u8>,
    failed: Option<String>,
    closed: bool,
    checkpoint_records: u64,
    checkpoint_bytes: u64,
    #[cfg(test)]
    sabotage: Sabotage,
}

impl State {
    /// A state whose logical file is the data file as of a checkpoint of length `len`, the data
    /// file itself being `phys` long now.
    fn new(len: u64, phys: u64, journal_id: [u8; 16], options: &JournalOptions) -> Self {
        State {
            len,
            min_len: len,
            batch: Extents::default(),
            committed_len: len,
            applied: Extents::default(),
            ck_min_len: len.min(phys),
            phys,
            bound: true,
            journal_id,
            generation: 1,
            next_seq: 1,
            active_slot: 0,
            region_len: options.region_len(),
            write_pos: REGION_START,
            records_in_region: 0,
            notes_pending: 0,
            retire_notes: false,
            buf: Vec::new(),
            failed: None,
            closed: false,
            checkpoint_records: options.checkpoint_records,
            checkpoint_bytes: options.checkpoint_bytes,
            #[cfg(test)]
            sabotage: Sabotage::None,
        }
    }
}

fn unexpected_eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end of the database file")
}

fn poisoned() -> io::Error {
    io::Error::other("journal state poisoned by a panic")
}

fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads `out.len()` bytes at `offset`, zeros past the backend's length.
fn read_zero_extended(backend: &dyn StorageBackend, offset: u64, out: &mut [u8]) -> io::Result<()> {
    let len = backend.len()?;
    let end = offset + out.len() as u64;
    let avail = len.clamp(offset, end);
    let split = (avail - offset) as usize;
    if split > 0 {
        backend.read(offset, &mut out[..split])?;
    }
    out[split..].fill(0);
    Ok(())
}

/// Whether `cur` is `a`, `b`, or a prefix of one followed by the rest of the other.
fn is_version_or_torn_mix(cur: &[u8], a: &[u8], b: &[u8]) -> bool {
    let lcp = |x: &[u8]| cur.iter().zip(x).take_while(|(p, q)| p == q).count();
    let lcs = |x: &[u8]| cur.iter().rev().zip(x.iter().rev()).take_while(|(p, q)| p == q).count();
    let n = cur.len();
    cur == a || cur == b || lcp(a) + lcs(b) >= n || lcp(b) + lcs(a) >= n
}

/// A new journal's id: 16 random bytes from the OS.
fn random_id() -> io::Result<[u8; 16]> {
    let mut out = [0u8; 16];
    getrandom::fill(&mut out).map_err(|e| io::Error::other(format!("journal: no random id from the OS: {e}")))?;
    Ok(out)
}

/// xxHash64 (seed 0), the checksum of header slots and records.
fn xxh64(data: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(data, 0)
}

/// The fields of a header slot.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Header {
    /// The format version read (headers are always written at [`FORMAT_VERSION`]).
    version: u32,
    journal_id: [u8; 16],
    generation: u64,
    next_seq: u64,
    region_len: u64,
    data_len: u64,
    image: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
enum Slot {
    Valid(Header),
    /// All zeros: never written.
    Blank,
    /// Our magic, but a bad checksum (a torn write).
    Torn,
    /// Something else entirely.
    Foreign,
    /// A good checksum but another format version.
    Version(u32),
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut s = vec![0u8; SLOT_LEN];
        s[0..8].copy_from_slice(&JOURNAL_MAGIC);
        s[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        s[12..16].copy_from_slice(&(HEAD_LEN as u32).to_le_bytes());
        s[16..32].copy_from_slice(&self.journal_id);
        s[32..40].copy_from_slice(&self.generation.to_le_bytes());
        s[40..48].copy_from_slice(&self.next_seq.to_le_bytes());
        s[48..56].copy_from_slice(&REGION_START.to_le_bytes());
        s[56..64].copy_from_slice(&self.region_len.to_le_bytes());
        s[64..72].copy_from_slice(&self.data_len.to_le_bytes());
        s[HEAD_LEN..].copy_from_slice(&self.image);
        let sum = xxh64(&s);
        s[SLOT_CHECKSUM_AT..SLOT_CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
        s
    }

    fn decode(s: &[u8]) -> Slot {
        if s.iter().all(|&b| b == 0) {
            return Slot::Blank;
        }
        if s[0..8] != JOURNAL_MAGIC {
            // A header write torn inside the magic leaves a prefix of it and zeros.
            let k = s.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            if k < JOURNAL_MAGIC.len() && s[..k] == JOURNAL_MAGIC[..k] {
                return Slot::Torn;
            }
            return Slot::Foreign;
        }
        let stored = u64_at(s, SLOT_CHECKSUM_AT);
        let mut copy = s.to_vec();
        copy[SLOT_CHECKSUM_AT..SLOT_CHECKSUM_AT + 8].fill(0);
        if xxh64(&copy) != stored {
            return Slot::Torn;
        }
        let version = u32_at(s, 8);
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Slot::Version(version);
        }
        let region_len = u64_at(s, 56);
        if u32_at(s, 12) as usize != HEAD_LEN
            || u64_at(s, 48) != REGION_START
            || region_len < MIN_REGION
            || !region_len.is_multiple_of(ALIGN)
        {
            return Slot::Foreign;
        }
        let mut journal_id = [0u8; 16];
        journal_id.copy_from_slice(&s[16..32]);
        Slot::Valid(Header {
            version,
            journal_id,
            generation: u64_at(s, 32),
            next_seq: u64_at(s, 40),
            region_len,
            data_len: u64_at(s, 64),
            image: s[HEAD_LEN..SLOT_LEN].to_vec(),
        })
    }
}

/// A decoded record.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    seq: u64,
    /// A note: its one entry (at offset 0) is the note's bytes; nothing is applied to the file.
    note: bool,
    /// The notes before it are retired.
    retires_notes: bool,
    min_len: u64,
    final_len: u64,
    entries: Vec<(u64, Vec<u8>)>,
    size: u64,
}

struct RecordKey<'a> {
    journal_id: &'a [u8; 16],
    generation: u64,
    seq: u64,
}

/// The figures of a record's header besides its key (see the record layout above).
struct RecordHead {
    flags: u32,
    /// The whole record's length, padding included ([`record_size`]).
    size: u64,
    min_len: u64,
    final_len: u64,
    count: usize,
}

/// The length of `bytes` without its trailing zeros, which records leave out.
fn stored_len(bytes: &[u8]) -> usize {
    // Whole 64-byte blocks of zeros first (the OR of a block vectorizes), then the bytes of the
    // last block that is not all zeros: a mostly empty 4 KiB page costs a few dozen compares
    // instead of thousands.
    const BLOCK: usize = 64;
    let mut end = bytes.len();
    while end >= BLOCK && bytes[end - BLOCK..end].iter().fold(0u8, |acc, &b| acc | b) == 0 {
        end -= BLOCK;
    }
    bytes[..end].iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

fn record_size<'a>(entries: impl Iterator<Item = (u64, &'a [u8])>) -> u64 {
    let body: u64 = entries.map(|(_, b)| (ENTRY_HEADER_LEN + stored_len(b)) as u64).sum();
    align_up(RECORD_HEADER_LEN as u64 + body + CHECKSUM_LEN as u64)
}

fn encode_record<'a>(
    buf: &mut Vec<u8>,
    key: &RecordKey<'_>,
    head: &RecordHead,
    entries: impl Iterator<Item = (u64, &'a [u8])>,
) {
    let RecordHead { flags, size, min_len, final_len, count } = *head;
    buf.clear();
    buf.extend_from_slice(&RECORD_MAGIC);
    buf.extend_from_slice(&flags.to_le_bytes());
    buf.extend_from_slice(key.journal_id);
    buf.extend_from_slice(&key.generation.to_le_bytes());
    buf.extend_from_slice(&key.seq.to_le_bytes());
    buf.extend_from_slice(&size.to_le_bytes());
    buf.extend_from_slice(&min_len.to_le_bytes());
    buf.extend_from_slice(&final_len.to_le_bytes());
    buf.extend_from_slice(&(count as u32).to_le_bytes());
    buf.extend_from_slice(&0u32.to_le_bytes());
    for (offset, bytes) in entries {
        let stored = stored_len(bytes);
        buf.extend_from_slice(&offset.to_le_bytes());
        buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        buf.extend_from_slice(&(stored as u32).to_le_bytes());
        buf.extend_from_slice(&bytes[..stored]);
    }
    let sum = xxh64(buf);
    buf.extend_from_slice(&sum.to_le_bytes());
    // Padding is less than ALIGN bytes.
    const ZEROS: [u8; ALIGN as usize] = [0; ALIGN as usize];
    let pad = size as usize - buf.len();
    buf.extend_from_slice(&ZEROS[..pad]);
}

/// Decodes the record in `buf` if it is whole and is the one `key` expects; `None` ends the log.
fn decode_record(buf: &[u8], key: &RecordKey<'_>) -> Result<Option<Record>, JournalError> {
    if buf.len() < RECORD_HEADER_LEN
        || buf[0..4] != RECORD_MAGIC
        || buf[8..24] != key.journal_id[..]
        || u64_at(buf, 24) != key.generation
        || u64_at(buf, 32) != key.seq
    {
        return Ok(None);
    }
    let size = u64_at(buf, 40);
    if !size.is_multiple_of(ALIGN) || size == 0 || size > buf.len() as u64 {
        return Ok(None);
    }
    let rec = &buf[..size as usize];
    let count = u32_at(rec, 64) as usize;
    let body_limit = rec.len() - CHECKSUM_LEN;
    let mut at = RECORD_HEADER_LEN;
    let mut spans = Vec::with_capacity(count.min(body_limit / ENTRY_HEADER_LEN));
    for _ in 0..count {
        if at + ENTRY_HEADER_LEN > body_limit {
            return Ok(None);
        }
        let offset = u64_at(rec, at);
        let len = u32_at(rec, at + 8) as usize;
        let stored = u32_at(rec, at + 12) as usize;
        at += ENTRY_HEADER_LEN;
        if stored > len || stored > body_limit - at {
            return Ok(None);
        }
        spans.push((offset, at, len, stored));
        at += stored;
    }
    if u64_at(rec, at) != xxh64(&rec[..at]) {
        return Ok(None);
    }
    let (min_len, final_len) = (u64_at(rec, 48), u64_at(rec, 56));
    let flags = u32_at(rec, 4);
    if flags & !(FLAG_NOTE | FLAG_RETIRES_NOTES) != 0 {
        return Err(JournalError::Corrupt(format!("record {} has unknown flags {flags:#x}", key.seq)));
    }
    let (note, retires_notes) = (flags & FLAG_NOTE != 0, flags & FLAG_RETIRES_NOTES != 0);
    if note {
        return match spans.as_slice() {
            [(0, start, len, stored)] => {
                let mut bytes = vec![0u8; *len];
                bytes[..*stored].copy_from_slice(&rec[*start..*start + *stored]);
                let entries = vec![(0, bytes)];
                Ok(Some(Record { seq: key.seq, note, retires_notes, min_len, final_len, entries, size }))
            }
            _ => Err(JournalError::Corrupt(format!("note {} is not one entry at offset 0", key.seq))),
        };
    }
    if min_len > final_len {
        return Err(JournalError::Corrupt(format!("record {} shrinks to {min_len} past {final_len}", key.seq)));
    }
    let mut entries = Vec::with_capacity(spans.len());
    for (offset, start, len, stored) in spans {
        match offset.checked_add(len as u64) {
            Some(end) if end <= final_len => {
                let mut bytes = vec![0u8; len];
                bytes[..stored].copy_from_slice(&rec[start..start + stored]);
                entries.push((offset, bytes));
            }
            _ => {
                return Err(JournalError::Corrupt(format!(
                    "record {} writes at {offset}+{len} past its length {final_len}",
                    key.seq
                )));
            }
        }
    }
    Ok(Some(Record { seq: key.seq, note, retires_notes, min_len, final_len, entries, size }))
}

/// Reads the record at `pos`, if a valid one is there.
fn read_record(
    log: &dyn StorageBackend,
    pos: u64,
    region_end: u64,
    key: &RecordKey<'_>,
) -> Result<Option<Record>, JournalError> {
    if pos + RECORD_HEADER_LEN as u64 > region_end {
        return Ok(None);
    }
    let mut header = [0u8; RECORD_HEADER_LEN];
    log.read(pos, &mut header)?;
    if header[0..4] != RECORD_MAGIC || u64_at(&header, 24) != key.generation || u64_at(&header, 32) != key.seq {
        return Ok(None);
    }
    let size = u64_at(&header, 40);
    if !size.is_multiple_of(ALIGN) || size < ALIGN || size > region_end - pos {
        return Ok(None);
    }
    let mut buf = vec![0u8; size as usize];
    log.read(pos, &mut buf)?;
    decode_record(&buf, key)
}

/// Applies a batch's lengths to the data file: shrink to the smallest length (never below the
/// first page, which is kept in memory), then set the final one.
fn apply_lengths(data: &dyn StorageBackend, phys: &mut u64, min_len: u64, final_len: u64) -> io::Result<()> {
    let floor = (*phys).min(HEAD);
    let shrink_to = min_len.max(floor);
    if shrink_to < *phys {
        data.set_len(shrink_to)?;
        *phys = shrink_to;
    }
    let target = final_len.max(floor);
    if target != *phys {
        data.set_len(target)?;
        *phys = target;
    }
    Ok(())
}

/// Applies a batch to an image of the first page.
fn apply_head<'a>(head: &mut [u8], min_len: u64, entries: impl Iterator<Item = (u64, &'a [u8])>) {
    if min_len < HEAD {
        head[min_len as usize..].fill(0);
    }
    for (offset, bytes) in entries {
        if offset >= HEAD {
            continue;
        }
        let n = (HEAD - offset).min(bytes.len() as u64) as usize;
        head[offset as usize..offset as usize + n].copy_from_slice(&bytes[..n]);
    }
}

/// Writes zeros over `[start, end)` of the log.
fn zero_fill(log: &dyn StorageBackend, start: u64, end: u64) -> io::Result<()> {
    let zeros = vec![0u8; ZERO_CHUNK];
    let mut pos = start;
    while pos < end {
        let n = (end - pos).min(ZERO_CHUNK as u64) as usize;
        log.write(pos, &zeros[..n])?;
        pos += n as u64;
    }
    Ok(())
}

/// Whether `e` says the disk (or the quota) has no room left.
fn is_no_room(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge)
}

fn is_unsupported(e: &BackendError) -> bool {
    match e {
        BackendError::Unsupported => true,
        BackendError::Io(io) => io.kind() == io::ErrorKind::Unsupported,
        _ => false,
    }
}

fn backend_error(e: BackendError) -> io::Error {
    match e {
        BackendError::Io(io) => io,
        other => io::Error::other(other.to_string()),
    }
}

/// Reads `[start, start + out.len())` through `extents`, filling the gaps from `base`.
fn layered(
    extents: &Extents,
    start: u64,
    out: &mut [u8],
    mut base: impl FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    let end = start + out.len() as u64;
    let mut pos = start;
    for (s, bytes) in extents.overlapping(start, end) {
        if s > pos {
            base(pos, &mut out[(pos - start) as usize..(s - start) as usize])?;
        }
        let from = s.max(pos);
        let to = (s + bytes.len() as u64).min(end);
        out[(from - start) as usize..(to - start) as usize]
            .copy_from_slice(&bytes[(from - s) as usize..(to - s) as usize]);
        pos = to;
    }
    if pos < end {
        base(pos, &mut out[(pos - start) as usize..])?;
    }
    Ok(())
}

/// Reads `[start, start + out.len())` of `data` below `valid_end`, zeros from there on.
fn read_cut(data: &dyn StorageBackend, valid_end: u64, start: u64, out: &mut [u8]) -> io::Result<()> {
    let end = start + out.len() as u64;
    let split = (end.min(valid_end).max(start) - start) as usize;
    if split > 0 {
        data.read(start, &mut out[..split])?;
    }
    out[split..].fill(0);
    Ok(())
}

impl State {
    fn usable(&self) -> io::Result<()> {
        if self.closed {
            return Err(io::Error::other("journal: the backend is closed"));
        }
        if let Some(cause) = &self.failed {
            return Err(io::Error::other(format!("journal: an earlier I/O error stopped writes: {cause}")));
        }
        Ok(())
    }

    /// The file as of the last barrier.
    fn read_committed(&self, data: &dyn StorageBackend, start: u64, out: &mut [u8]) -> io::Result<()> {
        layered(&self.applied, start, out, |pos, out| read_cut(data, self.ck_min_len, pos, out))
    }

    /// The file now.
    fn read(&self, data: &dyn StorageBackend, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let end = offset.checked_add(out.len() as u64).ok_or_else(unexpected_eof)?;
        if end > self.len {
            return Err(unexpected_eof());
        }
        layered(&self.batch, offset, out, |pos, out| {
            // As of the last barrier, cut to the smallest length since.
            let split = ((pos + out.len() as u64).min(self.min_len).max(pos) - pos) as usize;
            self.read_committed(data, pos, &mut out[..split])?;
            out[split..].fill(0);
            Ok(())
        })
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.usable()?;
        if bytes.len() > u32::MAX as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "journal: a single write of 4 GiB or more"));
        }
        let end = offset
            .checked_add(bytes.len() as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "journal: write past 2^64"))?;
        self.len = self.len.max(end);
        self.batch.insert(offset, bytes);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.usable()?;
        if len < self.len {
            self.batch.truncate(len);
            self.min_len = self.min_len.min(len);
        }
        self.len = len;
        Ok(())
    }

    fn dirty(&self) -> bool {
        !self.batch.is_empty() || self.len != self.committed_len || self.min_len != self.committed_len
    }

    /// Makes the batch part of the committed state (in memory; the data file waits for the
    /// checkpoint).
    fn absorb_batch(&mut self) {
        let min_len = self.min_len.min(self.committed_len);
        self.applied.truncate(min_len);
        self.ck_min_len = self.ck_min_len.min(min_len);
        for (offset, bytes) in std::mem::take(&mut self.batch).map {
            self.applied.insert_vec(offset, bytes);
        }
        self.committed_len = self.len;
        self.min_len = self.len;
    }

    /// One write barrier: the batch becomes one durable record.
    fn barrier(&mut self, data: &dyn StorageBackend, log: &dyn StorageBackend, counters: &Counters) -> io::Result<()> {
        if self.dirty() {
            self.append(data, log, counters)?;
        }
        if counters.checkpoint_requested.swap(false, Ordering::AcqRel) {
            self.checkpoint(data, log, counters)?;
        }
        counters.len.store(self.committed_len, Ordering::Relaxed);
        Ok(())
    }

    /// Journals the batch as one record (or writes it directly when larger than the region).
    fn append(&mut self, data: &dyn StorageBackend, log: &dyn StorageBackend, counters: &Counters) -> io::Result<()> {
        let size = record_size(self.batch.iter());
        let waiting_notes = self.notes_pending > 0;
        if size > self.region_len {
            if waiting_notes {
                return Err(io::Error::other("journal: a commit larger than the whole journal while notes wait"));
            }
            return self.direct_barrier(data, log, counters);
        }
        let used = self.write_pos - REGION_START;
        let full = used + size > self.region_len;
        let by_records = self.checkpoint_records > 0 && self.records_in_region >= self.checkpoint_records;
        let by_bytes = self.checkpoint_bytes > 0 && self.records_in_region > 0 && used + size > self.checkpoint_bytes;
        let due = full || by_records || by_bytes;
        if due && !waiting_notes {
            self.checkpoint(data, log, counters)?;
        } else if full {
            // Notes use at most a quarter of the region (see `append_note`), so only commits of
            // megabytes while notes wait get here.
            return Err(io::Error::other("journal: full while notes wait for the commit that holds them"));
        }
        let batch = std::mem::take(&mut self.batch);
        let head = RecordHead { flags: 0, size, min_len: self.min_len, final_len: self.len, count: batch.map.len() };
        let written = self.write_record(log, counters, head, batch.iter());
        self.batch = batch;
        written?;
        counters.records.fetch_add(1, Ordering::Relaxed);
        self.absorb_batch();
        Ok(())
    }

    /// Encodes one record at the write position, writes it and syncs the journal: the one
    /// write and the one sync of a barrier or a note. The first record after
    /// [`JournalMonitor::notes_held`] also retires the notes.
    fn write_record<'a>(
        &mut self,
        log: &dyn StorageBackend,
        counters: &Counters,
        mut head: RecordHead,
        entries: impl Iterator<Item = (u64, &'a [u8])>,
    ) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        let key = RecordKey { journal_id: &self.journal_id, generation: self.generation, seq: self.next_seq };
        if self.retire_notes {
            head.flags |= FLAG_RETIRES_NOTES;
        }
        let size = head.size;
        encode_record(&mut buf, &key, &head, entries);
        let appended = log.write(self.write_pos, &buf);
        self.buf = buf;
        appended?;
        #[cfg(test)]
        let skip_sync = self.sabotage == Sabotage::SkipLogSync;
        #[cfg(not(test))]
        let skip_sync = false;
        if !skip_sync {
            log.sync_data()?;
        }
        self.write_pos += size;
        self.next_seq += 1;
        self.records_in_region += 1;
        self.retire_notes = false;
        counters.record_bytes.fetch_add(size, Ordering::Relaxed);
        Ok(())
    }

    /// Appends `note` as one record and syncs it: durable once this returns `Ok(true)`. A
    /// note that would take the region past a quarter full ([`NOTE_ROOM_DIVISOR`]) first
    /// checkpoints when no note waits; `Ok(false)` when one does: the caller commits through
    /// redb instead.
    fn append_note(
        &mut self,
        data: &dyn StorageBackend,
        log: &dyn StorageBackend,
        counters: &Counters,
        note: &[u8],
    ) -> io::Result<bool> {
        self.usable()?;
        // Writes redb made since its last barrier (a shrink after a compaction) stay in the
        // batch for its next one: a note is redone onto the last barrier's state, as the store
        // expects (the last commit).
        if note.len() > u32::MAX as usize {
            return Ok(false);
        }
        let size = record_size(std::iter::once((0, note)));
        let room = |st: &State| st.write_pos - REGION_START + size <= st.region_len / NOTE_ROOM_DIVISOR;
        if !room(self) && self.notes_pending == 0 && !self.dirty() {
            // Every record so far is in redb's commits: a checkpoint makes room.
            self.checkpoint(data, log, counters)?;
        }
        if !room(self) {
            return Ok(false);
        }
        // Lengths of 0, so that a reader that took it for pages would find an entry past the
        // file's end and refuse it (the header's version already keeps such readers out).
        let head = RecordHead { flags: FLAG_NOTE, size, min_len: 0, final_len: 0, count: 1 };
        self.write_record(log, counters, head, std::iter::once((0, note)))?;
        self.notes_pending += 1;
        counters.notes.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// A batch larger than the region: straight to the data file between two checkpoints.
    fn direct_barrier(
        &mut self,
        data: &dyn StorageBackend,
        log: &dyn StorageBackend,
        counters: &Counters,
    ) -> io::Result<()> {
        self.checkpoint(data, log, counters)?;
        self.absorb_batch();
        self.bound = false;
        counters.direct_batches.fetch_add(1, Ordering::Relaxed);
        self.checkpoint(data, log, counters)
    }

    /// Writes the committed state to the data file, makes it durable and retires every record.
    fn checkpoint(
        &mut self,
        data: &dyn StorageBackend,
        log: &dyn StorageBackend,
        counters: &Counters,
    ) -> io::Result<()> {
        if (self.records_in_region == 0 && self.bound) || self.notes_pending > 0 {
            // Nothing to do, or notes wait: retiring the records would lose them. The commit
            // that holds them checkpoints if one was due; a close leaves them to the next open.
            return Ok(());
        }
        // The logical first page: the header binds it, and a shrink inside it is written with it.
        let mut image = vec![0u8; HEAD_LEN];
        let head = self.committed_len.min(HEAD) as usize;
        self.read_committed(data, 0, &mut image[..head])?;
        apply_lengths(data, &mut self.phys, self.ck_min_len, self.committed_len)?;
        for (offset, bytes) in self.applied.iter() {
            data.write(offset, bytes)?;
        }
        if self.ck_min_len < HEAD && head > 0 {
            data.write(0, &image[..head])?;
        }
        if self.phys != self.committed_len {
            data.set_len(self.committed_len)?;
            self.phys = self.committed_len;
        }
        #[cfg(test)]
        let skip_sync = self.sabotage == Sabotage::SkipDataSyncAtCheckpoint;
        #[cfg(not(test))]
        let skip_sync = false;
        if !skip_sync {
            data.sync_data()?;
        }
        self.write_header(log, self.region_len, image)?;
        self.applied = Extents::default();
        self.ck_min_len = self.committed_len;
        self.bound = true;
        counters.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes the next generation's header into the other slot and syncs it.
    fn write_header(&mut self, log: &dyn StorageBackend, region_len: u64, image: Vec<u8>) -> io::Result<()> {
        let header = Header {
            version: FORMAT_VERSION,
            journal_id: self.journal_id,
            generation: self.generation + 1,
            next_seq: self.next_seq,
            region_len,
            data_len: self.committed_len,
            image,
        };
        let slot = 1 - self.active_slot;
        log.write((slot * SLOT_LEN) as u64, &header.encode())?;
        log.sync_data()?;
        self.generation += 1;
        self.active_slot = slot;
        self.region_len = region_len;
        self.write_pos = REGION_START;
        self.records_in_region = 0;
        Ok(())
    }

    /// Rewrites a clean journal (just checkpointed) at another region size.
    fn resize(&mut self, data: &dyn StorageBackend, log: &dyn StorageBackend, region_len: u64) -> io::Result<()> {
        let old_end = log.len()?;
        let new_end = REGION_START + region_len;
        if new_end > old_end {
            log.set_len(new_end)?;
            zero_fill(log, old_end, new_end)?;
            log.sync_data()?;
        }
        self.write_header(log, region_len, read_head(data)?)?;
        if new_end < old_end {
            log.set_len(new_end)?;
        }
        Ok(())
    }
}

impl JournalBackend {
    /// Opens the journal over `data` with the default options; see [`Self::open_with`].
    pub fn open(data: Box<dyn StorageBackend>, log: Box<dyn StorageBackend>) -> Result<Self, JournalError> {
        Self::open_with(data, log, &JournalOptions::default())
    }

    /// Opens the journal `log` over the database file `data`, replaying the journal onto the data
    /// file first (see the module docs). An empty `log` is formatted as a new journal.
    pub fn open_with(
        data: Box<dyn StorageBackend>,
        log: Box<dyn StorageBackend>,
        options: &JournalOptions,
    ) -> Result<Self, JournalError> {
        Self::open_claimed(data, log, options, None)
    }

    /// [`Self::open_with`], refusing a journal that contradicts what the data file says of it
    /// (`claim`, see [`FileClaim`]) before anything is written to either.
    pub fn open_claimed(
        data: Box<dyn StorageBackend>,
        log: Box<dyn StorageBackend>,
        options: &JournalOptions,
        claim: Option<&FileClaim>,
    ) -> Result<Self, JournalError> {
        let counters = Arc::new(Counters::default());
        match recover(&*data, &*log, options, &counters, claim) {
            Ok((state, recovery, notes)) => {
                counters.len.store(state.committed_len, Ordering::Relaxed);
                let shared =
                    Shared { data, log, state: RwLock::new(state), counters, recovered_notes: Mutex::new(notes) };
                Ok(JournalBackend { shared: Arc::new(shared), recovery })
            }
            Err(e) => {
                let _ = log.close();
                let _ = data.close();
                Err(e)
            }
        }
    }

    /// Opens (creating when missing) the data file at `data_path` and its journal at
    /// [`journal_path`], both as redb's `FileBackend`s. When it creates either file it syncs the
    /// directory, so that a new journal cannot vanish in a power cut. A creation that fails (too
    /// little room: [`JournalError::NoRoom`]) removes what it created.
    pub fn open_path(data_path: &Path, options: &JournalOptions) -> Result<Self, JournalError> {
        Self::open_path_claimed(data_path, options, None)
    }

    /// [`Self::open_path`] with the data file's [`FileClaim`].
    pub fn open_path_claimed(
        data_path: &Path,
        options: &JournalOptions,
        claim: Option<&FileClaim>,
    ) -> Result<Self, JournalError> {
        let log_path = journal_path(data_path);
        let (data_new, log_new) = (!data_path.exists(), !log_path.exists());
        let open = |p: &Path| -> io::Result<Box<dyn StorageBackend>> {
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p)?;
            let backend = FileBackend::new(file).map_err(|e| io::Error::other(e.to_string()))?;
            Ok(Box::new(backend))
        };
        // Removes what this call created, when its open fails: nothing half-made stays.
        let undo = |e: JournalError| {
            if log_new {
                let _ = std::fs::remove_file(&log_path);
            }
            if data_new && std::fs::metadata(data_path).is_ok_and(|m| m.len() == 0) {
                let _ = std::fs::remove_file(data_path);
            }
            match e {
                JournalError::Io(cause) if log_new && is_no_room(&cause) => {
                    JournalError::NoRoom { needs: REGION_START + options.region_len(), cause }
                }
                other => other,
            }
        };
        let opened = (|| {
            let data = open(data_path)?;
            let log = open(&log_path)?;
            if data_new || log_new {
                let dir = match data_path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                File::open(dir)?.sync_all()?;
            }
            Ok::<_, JournalError>((data, log))
        })();
        let (data, log) = opened.map_err(undo)?;
        Self::open_claimed(data, log, options, claim).map_err(undo)
    }

    /// Replays the journal beside `data_path` onto the data file and closes both, so that the
    /// file on its own holds every acknowledged commit: how [`super::Store::open`] looks at a
    /// file (read-only, through redb) without missing the commits still in its journal. A
    /// journal that contradicts `claim` is refused unchanged.
    pub fn recover_path(data_path: &Path, claim: Option<&FileClaim>) -> Result<Recovery, JournalError> {
        let journal = Self::open_path_claimed(data_path, &JournalOptions::default(), claim)?;
        let recovery = journal.recovery.clone();
        journal.close()?;
        Ok(recovery)
    }

    /// Opens with a deliberate bug in the write path (not in the recovery).
    #[cfg(test)]
    pub(crate) fn open_sabotaged(
        data: Box<dyn StorageBackend>,
        log: Box<dyn StorageBackend>,
        options: &JournalOptions,
        sabotage: Sabotage,
    ) -> Result<Self, JournalError> {
        let journal = Self::open_with(data, log, options)?;
        journal.shared.state.write().map_err(|_| poisoned())?.sabotage = sabotage;
        Ok(journal)
    }

    /// What the open found and did.
    #[must_use]
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// A handle on the counters, usable after the backend is handed to redb.
    #[must_use]
    pub fn monitor(&self) -> JournalMonitor {
        JournalMonitor { counters: self.shared.counters.clone(), shared: Arc::downgrade(&self.shared) }
    }

    fn read_state(&self) -> io::Result<RwLockReadGuard<'_, State>> {
        self.shared.state.read().map_err(|_| poisoned())
    }

    fn write_state(&self) -> io::Result<RwLockWriteGuard<'_, State>> {
        self.shared.state.write().map_err(|_| poisoned())
    }
}

/// Takes the journal's own lock and checks that nobody holds the data file.
fn lock_pair(data: &dyn StorageBackend, log: &dyn StorageBackend) -> Result<(), JournalError> {
    match log.try_lock_range(Bound::Unbounded, Bound::Unbounded) {
        Ok(true) => {}
        Ok(false) => return Err(JournalError::Held),
        Err(e) if is_unsupported(&e) => {}
        Err(e) => return Err(JournalError::Io(backend_error(e))),
    }
    // Best effort: a backend that cannot answer is not refused.
    if let Ok(true) = data.query_lock_range(Bound::Unbounded, Bound::Unbounded) {
        return Err(JournalError::Held);
    }
    Ok(())
}

fn read_head(data: &dyn StorageBackend) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; HEAD_LEN];
    read_zero_extended(data, 0, &mut head)?;
    Ok(head)
}

fn recover(
    data: &dyn StorageBackend,
    log: &dyn StorageBackend,
    options: &JournalOptions,
    counters: &Counters,
    claim: Option<&FileClaim>,
) -> Result<(State, Recovery, Vec<Vec<u8>>), JournalError> {
    lock_pair(data, log)?;
    let region_len = options.region_len();
    let mut slots = [Slot::Blank, Slot::Blank];
    for (i, slot) in slots.iter_mut().enumerate() {
        let mut buf = vec![0u8; SLOT_LEN];
        read_zero_extended(log, (i * SLOT_LEN) as u64, &mut buf)?;
        *slot = Header::decode(&buf);
    }
    for slot in &slots {
        if let Slot::Version(v) = slot {
            return Err(JournalError::UnsupportedVersion(*v));
        }
    }
    let current = slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Slot::Valid(h) => Some((i, h)),
            _ => None,
        })
        .max_by_key(|(_, h)| h.generation);
    let log_len = log.len()?;
    let Some((active_slot, header)) = current else {
        // No valid header: a new journal, or one whose creation was cut off before its header
        // was durable (no record is ever written before that). A file that was open behind a
        // journal needs that journal's records: an empty one is its journal missing.
        if claim.is_some_and(|c| c.open) {
            return Err(JournalError::Missing);
        }
        let half_made = match slots {
            [Slot::Blank, Slot::Blank | Slot::Torn] => true,
            // A creation by a release that wrote slot 0 alone, torn: only when no record
            // follows (damage to the header of a journal with records is not a new journal).
            [Slot::Torn, Slot::Blank] => !region_has_records(log, log_len)?,
            _ => false,
        };
        if !half_made {
            if slots.iter().any(|s| matches!(s, Slot::Torn)) {
                return Err(JournalError::Damaged("no header slot is whole".to_owned()));
            }
            return Err(JournalError::NotAJournal);
        }
        let (state, recovery) = create(data, log, options, region_len)?;
        return Ok((state, recovery, Vec::new()));
    };
    let header = header.clone();
    if let Some(claim) = claim
        && claim.journal_id != short_id(&header.journal_id)
    {
        return Err(JournalError::NotThisFilesJournal {
            file_names: claim.journal_id,
            journal_is: short_id(&header.journal_id),
        });
    }
    // The journal is preallocated and never shorter than its header's region: shorter, it was
    // truncated, and what was cut off may have been acknowledged.
    let expected = REGION_START + header.region_len;
    if log_len < expected {
        return Err(JournalError::Truncated { len: log_len, expected });
    }

    // The records of the current generation, in order, up to the first that is not whole.
    let region_end = expected;
    let mut records = Vec::new();
    let mut pos = REGION_START;
    let mut seq = header.next_seq;
    loop {
        let key = RecordKey { journal_id: &header.journal_id, generation: header.generation, seq };
        match read_record(log, pos, region_end, &key)? {
            Some(record) => {
                pos += record.size;
                seq += 1;
                records.push(record);
            }
            None => break,
        }
    }
    // What ends the log is the torn tail only if nothing valid and newer lies beyond it: a
    // record is written only once the one before it is durable, and a header only once the
    // records it retires are in the file.
    if let Some(newer) = newer_record_beyond(log, pos, region_end, &header, seq)? {
        return Err(JournalError::Damaged(format!(
            "record {seq} at byte {pos} fails its checks but a later one ({newer}) is whole"
        )));
    }
    if let Some(claim) = claim
        && claim.next_seq >= seq
    {
        return Err(JournalError::Older { file_reaches: claim.next_seq, journal_ends: seq });
    }

    let current_head = read_head(data)?;
    let data_len = data.len()?;
    let mut recovery = Recovery::default();
    let mut notes = Vec::new();
    let mut state;
    if records.is_empty() {
        if data_len == 0 && (header.data_len > 0 || header.image.iter().any(|&b| b != 0)) {
            // The journal was bound to a file with content: this empty one is not it.
            return Err(JournalError::FileEmptied { bound_len: header.data_len });
        }
        // Nothing to apply: the file as it is. If it changed since the checkpoint, bind it anew.
        state = State::new(data_len, data_len, header.journal_id, options);
        if current_head != header.image || data_len != header.data_len {
            recovery.rebound = true;
            state.bound = false;
        }
    } else {
        // Between checkpoints the data file is not written, so its first page is the bound one,
        // or (a checkpoint cut off) the one the records lead to, or a torn mix of the two.
        let mut last = header.image.clone();
        for r in records.iter().filter(|r| !r.note) {
            apply_head(&mut last, r.min_len, r.entries.iter().map(|(o, b)| (*o, b.as_slice())));
        }
        if !is_version_or_torn_mix(&current_head, &header.image, &last) {
            return Err(JournalError::Foreign);
        }
        // Replay in memory from the checkpoint's length; the checkpoint below writes it all.
        state = State::new(header.data_len, data_len, header.journal_id, options);
        state.records_in_region = records.len() as u64;
        for mut r in records {
            if r.retires_notes {
                notes.clear();
            }
            if r.note {
                notes.push(r.entries.pop().map(|(_, bytes)| bytes).unwrap_or_default());
                continue;
            }
            recovery.replayed_records += 1;
            recovery.replayed_bytes += r.entries.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
            state.min_len = r.min_len;
            state.len = r.final_len;
            for (offset, bytes) in r.entries {
                state.batch.insert_vec(offset, bytes);
            }
            state.absorb_batch();
        }
    }
    state.generation = header.generation;
    state.next_seq = seq;
    state.active_slot = active_slot;
    state.region_len = header.region_len;
    state.write_pos = pos;
    state.notes_pending = notes.len() as u64;
    if header.version < FORMAT_VERSION {
        // Rewrite the header at this version before anything new is appended.
        state.bound = false;
    }
    if notes.is_empty() {
        state.checkpoint(data, log, counters)?;
        if header.region_len != region_len {
            state.resize(data, log, region_len)?;
            recovery.resized = true;
        }
    } else {
        // The records stay, in this generation, until the commit that holds the notes: appends
        // go on after them, in the region as it is.
        state.region_len = header.region_len;
    }
    recovery.generation = state.generation;
    recovery.pending_notes = notes.len() as u64;
    Ok((state, recovery, notes))
}

/// The first 8 bytes of a journal id, little-endian: how a data file names its journal.
fn short_id(id: &[u8; 16]) -> u64 {
    u64_at(id, 0)
}

/// Whether any 4096-aligned block of the region starts with a record's magic.
fn region_has_records(log: &dyn StorageBackend, log_len: u64) -> io::Result<bool> {
    let mut found = false;
    scan_region(log, REGION_START, log_len, |_, _| {
        found = true;
        Ok(false)
    })?;
    Ok(found)
}

/// Calls `visit(offset, block)` for every 4096-aligned block in `[start, end)` of the log that
/// starts with a record's magic, while it returns `Ok(true)`.
fn scan_region(
    log: &dyn StorageBackend,
    start: u64,
    end: u64,
    mut visit: impl FnMut(u64, &[u8]) -> Result<bool, JournalError>,
) -> Result<(), JournalError> {
    let mut buf = vec![0u8; ZERO_CHUNK];
    let mut pos = start;
    while pos < end {
        let n = (end - pos).min(ZERO_CHUNK as u64) as usize;
        log.read(pos, &mut buf[..n])?;
        for at in (0..n).step_by(ALIGN as usize) {
            let block = &buf[at..n.min(at + RECORD_HEADER_LEN)];
            if block.len() == RECORD_HEADER_LEN && block[0..4] == RECORD_MAGIC && !visit(pos + at as u64, block)? {
                return Ok(());
            }
        }
        pos += n as u64;
    }
    Ok(())
}

/// A whole record of this journal in `[start, end)` newer than the log read so far (a later
/// generation than `header`'s, or its generation from `next_seq` on), described, if any.
fn newer_record_beyond(
    log: &dyn StorageBackend,
    start: u64,
    end: u64,
    header: &Header,
    next_seq: u64,
) -> Result<Option<String>, JournalError> {
    let mut found = None;
    scan_region(log, start, end, |at, block| {
        let (generation, seq) = (u64_at(block, 24), u64_at(block, 32));
        let newer = generation > header.generation || (generation == header.generation && seq >= next_seq);
        if block[8..24] != header.journal_id[..] || !newer {
            return Ok(true);
        }
        let key = RecordKey { journal_id: &header.journal_id, generation, seq };
        match read_record(log, at, end, &key) {
            Ok(Some(_)) | Err(JournalError::Corrupt(_)) => {
                found = Some(format!("record {seq} of generation {generation} at byte {at}"));
                Ok(false)
            }
            Ok(None) => Ok(true),
            Err(e) => Err(e),
        }
    })?;
    Ok(found)
}

/// Formats a new journal bound to the data file as it is.
fn create(
    data: &dyn StorageBackend,
    log: &dyn StorageBackend,
    options: &JournalOptions,
    region_len: u64,
) -> Result<(State, Recovery), JournalError> {
    data.sync_data()?;
    let data_len = data.len()?;
    let end = REGION_START + region_len;
    log.set_len(end)?;
    zero_fill(log, 0, end)?;
    log.sync_data()?;
    let mut header = Header {
        version: FORMAT_VERSION,
        journal_id: random_id()?,
        generation: 0,
        next_seq: 1,
        region_len,
        data_len,
        image: read_head(data)?,
    };
    // Both slots, so that one damaged slot is never taken for a journal still being created:
    // slot 1 at generation 0 first, then slot 0 at generation 1, the current one.
    log.write(SLOT_LEN as u64, &header.encode())?;
    log.sync_data()?;
    header.generation = 1;
    log.write(0, &header.encode())?;
    log.sync_data()?;
    let state = State::new(data_len, data_len, header.journal_id, options);
    Ok((state, Recovery { created: true, generation: 1, ..Recovery::default() }))
}

impl StorageBackend for JournalBackend {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.read_state()?.len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let st = self.read_state()?;
        if st.closed {
            return Err(io::Error::other("journal: the backend is closed"));
        }
        st.read(&*self.shared.data, offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.write_state()?.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut st = self.write_state()?;
        st.usable()?;
        let Shared { data, log, counters, .. } = &*self.shared;
        let result = st.barrier(&**data, &**log, counters);
        if let Err(e) = &result {
            st.failed = Some(e.to_string());
        }
        result
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.write_state()?.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        let mut st = self.write_state()?;
        if st.closed {
            return Ok(());
        }
        let Shared { data, log, counters, .. } = &*self.shared;
        let mut result = Ok(());
        if st.failed.is_none() {
            // With notes pending the checkpoint waits (see the module docs): the next open
            // replays the records after the last one.
            result = st.barrier(&**data, &**log, counters).and_then(|()| st.checkpoint(&**data, &**log, counters));
            if let Err(e) = &result {
                st.failed = Some(e.to_string());
            }
        }
        st.closed = true;
        let data = data.close();
        let log = log.close();
        result.and(data).and(log)
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.shared.data.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.shared.data.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.shared.data.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.shared.data.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.shared.data.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.shared.data.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests;
