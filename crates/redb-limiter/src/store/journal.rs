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
//! One file per mechanism: `format.rs` (the bytes of header slots and records), `writer.rs`
//! (barriers, notes, checkpoints), `recovery.rs` (opening: checks, replay, creation),
//! `backend.rs` (the [`StorageBackend`] redb sees); this module holds the public types.
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
//! blocks and never change the file's size: a journal shorter than its header's region was
//! truncated, and is refused ([`JournalError::Truncated`]). Both header slots are written at
//! creation (slot 1 at generation 0, then slot 0 at generation 1), so that one damaged slot is
//! never taken for a journal still being created.
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
//!    created: the data file is synced, its first page bound into a new header, nothing replayed,
//!    unless the data file says it was open behind a journal and not closed cleanly
//!    ([`FileClaim`], which the store keeps in the file's own tables): then the journal holding
//!    its newest commits is missing ([`JournalError::Missing`]). A journal whose id is not the
//!    one the file names is refused ([`JournalError::NotThisFilesJournal`]).
//! 3. Otherwise the records of the current generation are read from the start of the region, in
//!    order: each must have the magic, the journal id, the current generation, the next sequence
//!    number, a length inside the region, well-formed entries and a matching checksum. The first
//!    record that fails any of these ends the log: it was never acknowledged (its sync did not
//!    return) or it is a stale record of an earlier generation. That holds only if nothing whole
//!    and newer lies beyond it (a record of this generation from that sequence number on, or of
//!    a later generation): a record is written only once the one before it is durable, and a
//!    header only once the records it retires are in the file. Anything whole and newer beyond
//!    means damage (a flipped byte in an older record, or in the current header slot), refused
//!    with [`JournalError::Damaged`], never replayed up to. The records must also reach past the
//!    commits the data file holds ([`FileClaim::next_seq`]), or the journal is an earlier copy
//!    of itself ([`JournalError::Older`]). The data file is written only at checkpoints, so this
//!    catches a copy older than the last checkpoint only: a copy taken since then ends at a
//!    commit the file does not yet hold, cannot be told from the journal itself, and opens
//!    without the commits made after it was taken.
//! 4. If there are records, the data file's first page must be the one bound at the checkpoint,
//!    or the one the records lead to, or a torn mix of these two (a prefix of one and the rest of
//!    the other: a checkpoint cut off while writing it). Anything else means the journal belongs to
//!    another file (or the file was replaced or restored from elsewhere), and the open is refused
//!    with [`JournalError::Foreign`], leaving both files untouched. If there are no records,
//!    nothing could be applied to the wrong file: a first page or length other than the bound
//!    one (the file was written without the journal, or a checkpoint of a batch too large for the
//!    journal was cut off) is simply bound by a new checkpoint ([`Recovery::rebound`]), except an
//!    empty data file under a journal bound to one with content ([`JournalError::FileEmptied`]).
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
//!   open it only through this backend, or the commits since are lost. A journal lost, cut,
//!   replaced by another's, or replaced by a copy of itself older than the last checkpoint
//!   after a crash is refused at the next open (the file's [`FileClaim`] and the checks above),
//!   never opened as if nothing happened. A copy taken since the last checkpoint cannot be told
//!   apart (the file does not yet name the commits after it): it opens, and those commits are
//!   lost. While open, the store checks the journal's length and header with the file's
//!   identity.
//! * Damage to the newest record's own bytes cannot be told from that record torn by a crash,
//!   as in every database: it rolls back to the commit before it.
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

mod backend;
mod format;
mod recovery;
mod writer;

pub use backend::ScratchBackend;
use backend::*;
use format::*;
#[cfg(test)]
use recovery::*;
use writer::*;

#[cfg(test)]
mod tests;
