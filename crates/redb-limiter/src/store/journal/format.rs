//! The journal's bytes: header slots ([`Header`]) and records ([`Record`]), their encoding and
//! checksums (xxHash64), and reading one record back. Nothing here writes a file or decides
//! what a record means for recovery; the layout is in the parent module's docs.

use super::*;

/// A new journal's id: 16 random bytes from the OS.
pub(super) fn random_id() -> io::Result<[u8; 16]> {
    let mut out = [0u8; 16];
    getrandom::fill(&mut out).map_err(|e| io::Error::other(format!("journal: no random id from the OS: {e}")))?;
    Ok(out)
}

/// xxHash64 (seed 0), the checksum of header slots and records.
pub(super) fn xxh64(data: &[u8]) -> u64 {
    xxhash_rust::xxh64::xxh64(data, 0)
}

/// The fields of a header slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Header {
    /// The format version read (headers are always written at [`FORMAT_VERSION`]).
    pub(super) version: u32,
    pub(super) journal_id: [u8; 16],
    pub(super) generation: u64,
    pub(super) next_seq: u64,
    pub(super) region_len: u64,
    pub(super) data_len: u64,
    pub(super) image: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Slot {
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
    pub(super) fn encode(&self) -> Vec<u8> {
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

    pub(super) fn decode(s: &[u8]) -> Slot {
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
pub(super) struct Record {
    pub(super) seq: u64,
    /// A note: its one entry (at offset 0) is the note's bytes; nothing is applied to the file.
    pub(super) note: bool,
    /// The notes before it are retired.
    pub(super) retires_notes: bool,
    pub(super) min_len: u64,
    pub(super) final_len: u64,
    pub(super) entries: Vec<(u64, Vec<u8>)>,
    pub(super) size: u64,
}

pub(super) struct RecordKey<'a> {
    pub(super) journal_id: &'a [u8; 16],
    pub(super) generation: u64,
    pub(super) seq: u64,
}

/// The figures of a record's header besides its key (see the record layout above).
pub(super) struct RecordHead {
    pub(super) flags: u32,
    /// The whole record's length, padding included ([`record_size`]).
    pub(super) size: u64,
    pub(super) min_len: u64,
    pub(super) final_len: u64,
    pub(super) count: usize,
}

/// The length of `bytes` without its trailing zeros, which records leave out.
pub(super) fn stored_len(bytes: &[u8]) -> usize {
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

pub(super) fn record_size<'a>(entries: impl Iterator<Item = (u64, &'a [u8])>) -> u64 {
    let body: u64 = entries.map(|(_, b)| (ENTRY_HEADER_LEN + stored_len(b)) as u64).sum();
    align_up(RECORD_HEADER_LEN as u64 + body + CHECKSUM_LEN as u64)
}

pub(super) fn encode_record<'a>(
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
pub(super) fn decode_record(buf: &[u8], key: &RecordKey<'_>) -> Result<Option<Record>, JournalError> {
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
pub(super) fn read_record(
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

/// The first 8 bytes of a journal id, little-endian: how a data file names its journal.
pub(super) fn short_id(id: &[u8; 16]) -> u64 {
    u64_at(id, 0)
}
