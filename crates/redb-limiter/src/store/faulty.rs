//! A storage backend that fails on command, in redb's own fuzzing style: it wraps the file
//! backend and fails the Nth write or sync from the moment it is armed. Tests and the fuzz
//! targets use it to prove that a failed commit grants nothing and loses nothing committed, on
//! the file alone ([`faulty_opener`]) and behind its journal ([`faulty_journal_opener`]).

use std::fs::OpenOptions;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use super::journal::{JournalBackend, JournalOptions, journal_path};
use super::{Opener, open_backend, open_journaled};

/// Shared between a test and every backend it opens: `fail_in` counts the writes and syncs
/// still allowed; at zero, that operation and every later one fails until `disarm`.
#[derive(Debug, Default)]
pub struct FaultPlan {
    fail_in: AtomicU64,
    failing: AtomicU64,
    panic_at_sync: AtomicBool,
}

impl FaultPlan {
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(FaultPlan {
            fail_in: AtomicU64::new(u64::MAX),
            failing: AtomicU64::new(0),
            panic_at_sync: AtomicBool::new(false),
        })
    }

    /// Lets `n` more writes or syncs through, then fails.
    pub fn fail_after(&self, n: u64) {
        self.failing.store(0, Ordering::SeqCst);
        self.fail_in.store(n, Ordering::SeqCst);
    }

    /// Makes the next sync panic (once), as a bug below the store would.
    pub fn panic_at_next_sync(&self) {
        self.panic_at_sync.store(true, Ordering::SeqCst);
    }

    /// Lets everything through again.
    pub fn disarm(&self) {
        self.failing.store(0, Ordering::SeqCst);
        self.fail_in.store(u64::MAX, Ordering::SeqCst);
    }

    /// Whether a fault has fired since the last `fail_after`.
    #[must_use]
    pub fn fired(&self) -> bool {
        self.failing.load(Ordering::SeqCst) != 0
    }

    fn check(&self) -> io::Result<()> {
        if self.failing.load(Ordering::SeqCst) != 0 {
            return Err(io::Error::other("injected fault"));
        }
        let left = self.fail_in.load(Ordering::SeqCst);
        if left == u64::MAX {
            return Ok(());
        }
        if left == 0 {
            self.failing.store(1, Ordering::SeqCst);
            return Err(io::Error::other("injected fault"));
        }
        self.fail_in.store(left - 1, Ordering::SeqCst);
        Ok(())
    }
}

/// The file backend with a [`FaultPlan`] in front of its writes and syncs.
#[derive(Debug)]
pub struct FaultyBackend {
    inner: FileBackend,
    plan: Arc<FaultPlan>,
}

/// An opener whose every database runs on a [`FaultyBackend`] following `plan`.
#[must_use]
pub fn faulty_opener(plan: Arc<FaultPlan>) -> Opener {
    Box::new(move |path: &Path| {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        open_backend(FaultyBackend { inner: FileBackend::new(file)?, plan: plan.clone() }).map(Into::into)
    })
}

/// An opener whose every database runs behind its journal, as in production, with one
/// [`FaultPlan`] in front of the writes and syncs of both the journal and the file (checkpoints
/// included): the Nth of all of them fails.
#[must_use]
pub fn faulty_journal_opener(plan: Arc<FaultPlan>) -> Opener {
    Box::new(move |path: &Path| {
        let faulty = |p: &Path| -> Result<Box<dyn StorageBackend>, redb::DatabaseError> {
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p)?;
            Ok(Box::new(FaultyBackend { inner: FileBackend::new(file)?, plan: plan.clone() }))
        };
        let data = faulty(path)?;
        let log = faulty(&journal_path(path))?;
        open_journaled(JournalBackend::open_with(data, log, &JournalOptions::default()))
    })
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.plan.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), io::Error> {
        assert!(!self.plan.panic_at_sync.swap(false, Ordering::SeqCst), "injected panic");
        self.plan.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.plan.check()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }
    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}
