//! The write path: the in-memory batch and overlay ([`State`]), barriers (one record and one
//! sync each), notes, and checkpoints into the data file. It never reads records back: that is
//! recovery's.

use super::*;

/// Applies a batch's lengths to the data file: shrink to the smallest length (never below the
/// first page, which is kept in memory), then set the final one.
pub(super) fn apply_lengths(data: &dyn StorageBackend, phys: &mut u64, min_len: u64, final_len: u64) -> io::Result<()> {
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

/// Writes zeros over `[start, end)` of the log.
pub(super) fn zero_fill(log: &dyn StorageBackend, start: u64, end: u64) -> io::Result<()> {
    let zeros = vec![0u8; ZERO_CHUNK];
    let mut pos = start;
    while pos < end {
        let n = (end - pos).min(ZERO_CHUNK as u64) as usize;
        log.write(pos, &zeros[..n])?;
        pos += n as u64;
    }
    Ok(())
}

/// Reads `[start, start + out.len())` through `extents`, filling the gaps from `base`.
pub(super) fn layered(
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
pub(super) fn read_cut(data: &dyn StorageBackend, valid_end: u64, start: u64, out: &mut [u8]) -> io::Result<()> {
    let end = start + out.len() as u64;
    let split = (end.min(valid_end).max(start) - start) as usize;
    if split > 0 {
        data.read(start, &mut out[..split])?;
    }
    out[split..].fill(0);
    Ok(())
}

impl State {
    pub(super) fn usable(&self) -> io::Result<()> {
        if self.closed {
            return Err(io::Error::other("journal: the backend is closed"));
        }
        if let Some(cause) = &self.failed {
            return Err(io::Error::other(format!("journal: an earlier I/O error stopped writes: {cause}")));
        }
        Ok(())
    }

    /// The file as of the last barrier.
    pub(super) fn read_committed(&self, data: &dyn StorageBackend, start: u64, out: &mut [u8]) -> io::Result<()> {
        layered(&self.applied, start, out, |pos, out| read_cut(data, self.ck_min_len, pos, out))
    }

    /// The file now.
    pub(super) fn read(&self, data: &dyn StorageBackend, offset: u64, out: &mut [u8]) -> io::Result<()> {
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

    pub(super) fn write(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
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

    pub(super) fn set_len(&mut self, len: u64) -> io::Result<()> {
        self.usable()?;
        if len < self.len {
            self.batch.truncate(len);
            self.min_len = self.min_len.min(len);
        }
        self.len = len;
        Ok(())
    }

    pub(super) fn dirty(&self) -> bool {
        !self.batch.is_empty() || self.len != self.committed_len || self.min_len != self.committed_len
    }

    /// Makes the batch part of the committed state (in memory; the data file waits for the
    /// checkpoint).
    pub(super) fn absorb_batch(&mut self) {
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
    pub(super) fn barrier(
        &mut self,
        data: &dyn StorageBackend,
        log: &dyn StorageBackend,
        counters: &Counters,
    ) -> io::Result<()> {
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
    pub(super) fn append(
        &mut self,
        data: &dyn StorageBackend,
        log: &dyn StorageBackend,
        counters: &Counters,
    ) -> io::Result<()> {
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
    pub(super) fn write_record<'a>(
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
    pub(super) fn append_note(
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

    /// A batch larger than the region: straight to the data file between two checkpoints. It
    /// uses up a sequence number as a record would: the file it writes may name the number it
    /// was committed at (a claim), and the journal must then end past it, or a crash before the
    /// next record would leave a file its journal seems older than.
    pub(super) fn direct_barrier(
        &mut self,
        data: &dyn StorageBackend,
        log: &dyn StorageBackend,
        counters: &Counters,
    ) -> io::Result<()> {
        self.next_seq += 1;
        self.checkpoint(data, log, counters)?;
        self.absorb_batch();
        self.bound = false;
        counters.direct_batches.fetch_add(1, Ordering::Relaxed);
        self.checkpoint(data, log, counters)
    }

    /// Writes the committed state to the data file, makes it durable and retires every record.
    pub(super) fn checkpoint(
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
    pub(super) fn write_header(&mut self, log: &dyn StorageBackend, region_len: u64, image: Vec<u8>) -> io::Result<()> {
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
    pub(super) fn resize(
        &mut self,
        data: &dyn StorageBackend,
        log: &dyn StorageBackend,
        region_len: u64,
    ) -> io::Result<()> {
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

pub(super) fn read_head(data: &dyn StorageBackend) -> io::Result<Vec<u8>> {
    let mut head = vec![0u8; HEAD_LEN];
    read_zero_extended(data, 0, &mut head)?;
    Ok(head)
}
