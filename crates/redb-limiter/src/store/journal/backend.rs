//! The [`StorageBackend`] redb sees ([`JournalBackend`]'s implementation over the writer), and
//! [`ScratchBackend`], a file read through redb without changing it.

use super::*;

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

/// Whether `e` says the disk (or the quota) has no room left.
pub(super) fn is_no_room(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge)
}

pub(super) fn is_unsupported(e: &BackendError) -> bool {
    match e {
        BackendError::Unsupported => true,
        BackendError::Io(io) => io.kind() == io::ErrorKind::Unsupported,
        _ => false,
    }
}

pub(super) fn backend_error(e: BackendError) -> io::Error {
    match e {
        BackendError::Io(io) => io,
        other => io::Error::other(other.to_string()),
    }
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
