//! Opening a journal: locking the pair, checking the header slots and what the data file says
//! of its journal ([`FileClaim`]), reading the records up to the torn tail (refusing damage
//! anywhere else), and replaying them; or creating a new journal. Nothing is written before
//! every check has passed.

use super::*;

/// Whether `cur` is `a`, `b`, or a prefix of one followed by the rest of the other.
pub(super) fn is_version_or_torn_mix(cur: &[u8], a: &[u8], b: &[u8]) -> bool {
    let lcp = |x: &[u8]| cur.iter().zip(x).take_while(|(p, q)| p == q).count();
    let lcs = |x: &[u8]| cur.iter().rev().zip(x.iter().rev()).take_while(|(p, q)| p == q).count();
    let n = cur.len();
    cur == a || cur == b || lcp(a) + lcs(b) >= n || lcp(b) + lcs(a) >= n
}

/// Applies a batch to an image of the first page.
pub(super) fn apply_head<'a>(head: &mut [u8], min_len: u64, entries: impl Iterator<Item = (u64, &'a [u8])>) {
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
        // Whether THIS call made each file (`create_new`): a test of existence before the
        // journal's lock could see a file that another open starting at the same moment made.
        let open = |p: &Path| -> io::Result<(Box<dyn StorageBackend>, bool)> {
            let (file, created) = match OpenOptions::new().read(true).write(true).create_new(true).open(p) {
                Ok(file) => (file, true),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    (OpenOptions::new().read(true).write(true).open(p)?, false)
                }
                Err(e) => return Err(e),
            };
            let backend = FileBackend::new(file).map_err(|e| io::Error::other(e.to_string()))?;
            Ok((Box::new(backend), created))
        };
        let (mut data_new, mut log_new) = (false, false);
        let opened = (|| {
            let (data, created) = open(data_path)?;
            data_new = created;
            let (log, created) = open(&log_path)?;
            log_new = created;
            if data_new || log_new {
                let dir = match data_path.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => Path::new("."),
                };
                File::open(dir)?.sync_all()?;
            }
            Ok::<_, JournalError>((data, log))
        })();
        // Removes what this call created, when its open fails: nothing half-made stays. Never
        // after `Held`: the files are another open's, which may have just made them.
        let undo = |e: JournalError| {
            if matches!(e, JournalError::Held) {
                return e;
            }
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
        let (data, log) = opened.map_err(undo)?;
        Self::open_claimed(data, log, options, claim).map_err(undo)
    }

    /// Replays the journal beside `data_path` onto the data file and closes both, so that the
    /// file on its own holds every acknowledged commit: how [`crate::store::Store::open`] looks at a
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

    pub(super) fn read_state(&self) -> io::Result<RwLockReadGuard<'_, State>> {
        self.shared.state.read().map_err(|_| poisoned())
    }

    pub(super) fn write_state(&self) -> io::Result<RwLockWriteGuard<'_, State>> {
        self.shared.state.write().map_err(|_| poisoned())
    }
}

/// Takes the journal's own lock and checks that nobody holds the data file.
pub(super) fn lock_pair(data: &dyn StorageBackend, log: &dyn StorageBackend) -> Result<(), JournalError> {
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

pub(super) fn recover(
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
            // Both blank (or blank and torn): the same, but only when no record follows either
            // (zeroed headers over records are damage, not a journal still being made).
            [Slot::Blank, Slot::Blank | Slot::Torn] => !region_has_records(log, log_len)?,
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
    let Some(expected) = REGION_START.checked_add(header.region_len) else {
        return Err(JournalError::Damaged(format!("the header's region length {} is past 2^64", header.region_len)));
    };
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

/// Whether any 4096-aligned block of the region starts with a record's magic.
pub(super) fn region_has_records(log: &dyn StorageBackend, log_len: u64) -> io::Result<bool> {
    let mut found = false;
    scan_region(log, REGION_START, log_len, |_, _| {
        found = true;
        Ok(false)
    })?;
    Ok(found)
}

/// Calls `visit(offset, block)` for every 4096-aligned block in `[start, end)` of the log that
/// starts with a record's magic, while it returns `Ok(true)`.
pub(super) fn scan_region(
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
pub(super) fn newer_record_beyond(
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
pub(super) fn create(
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
