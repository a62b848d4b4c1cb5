//! Tests of the page journal: unit tests of the format and the overlay, a power-cut simulation
//! under a real `redb::Database`, sabotage runs that the simulation must catch, fault injection,
//! and a commit-rate benchmark (ignored by default).

use super::*;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

// ---------------------------------------------------------------------------------------------
// An in-memory disk with a page cache that a power cut empties.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

/// `Vec::resize` with zeros, without a per-byte loop in unoptimized builds.
fn resize_zeroed(bytes: &mut Vec<u8>, len: usize) {
    if len <= bytes.len() {
        bytes.truncate(len);
    } else {
        bytes.extend_from_slice(&vec![0u8; len - bytes.len()]);
    }
}

fn apply_op(bytes: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write(offset, data) => {
            let start = *offset as usize;
            let end = start + data.len();
            if bytes.len() < end {
                resize_zeroed(bytes, end);
            }
            bytes[start..end].copy_from_slice(data);
        }
        Op::SetLen(len) => resize_zeroed(bytes, *len as usize),
    }
}

/// One file: what a read sees (`volatile`), what survives a power cut for sure (`durable`), and
/// the writes since the last sync (`pending`), any of which may or may not survive a cut.
#[derive(Clone, Debug, Default)]
struct Disk {
    durable: Vec<u8>,
    volatile: Vec<u8>,
    pending: Vec<Op>,
}

impl Disk {
    fn with_bytes(bytes: Vec<u8>) -> Self {
        Disk { durable: bytes.clone(), volatile: bytes, pending: Vec::new() }
    }
}

#[derive(Debug)]
struct PowerInner {
    /// Mutating operations left before the cut; `None`: no cut planned.
    countdown: Option<u64>,
    rng: fastrand::Rng,
    /// Chance that each unsynced write survives the cut anyway (written back in time).
    survive: f64,
    disks: Vec<Arc<Mutex<Disk>>>,
}

/// The machine's power, shared by its disks: counts their mutating operations and cuts at zero.
#[derive(Debug)]
struct Power {
    inner: Mutex<PowerInner>,
    off: AtomicBool,
    ops: AtomicU64,
    in_journal_sync: AtomicBool,
    cut_in_journal_sync: AtomicBool,
}

enum Tick {
    Run,
    /// This operation is the one in flight when the power goes.
    Cut,
}

impl Power {
    fn new(seed: u64, survive: f64) -> Arc<Self> {
        Arc::new(Power {
            inner: Mutex::new(PowerInner {
                countdown: None,
                rng: fastrand::Rng::with_seed(seed),
                survive,
                disks: Vec::new(),
            }),
            off: AtomicBool::new(false),
            ops: AtomicU64::new(0),
            in_journal_sync: AtomicBool::new(false),
            cut_in_journal_sync: AtomicBool::new(false),
        })
    }

    fn arm(&self, ops: u64) {
        self.inner.lock().unwrap().countdown = Some(ops);
    }

    fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    fn tick(&self) -> io::Result<Tick> {
        if self.is_off() {
            return Err(io::Error::other("power is off"));
        }
        self.ops.fetch_add(1, Ordering::SeqCst);
        let mut inner = self.inner.lock().unwrap();
        match inner.countdown.as_mut() {
            Some(0) | None => Ok(Tick::Run),
            Some(n) => {
                *n -= 1;
                Ok(if *n == 0 { Tick::Cut } else { Tick::Run })
            }
        }
    }

    fn coin(&self) -> bool {
        self.inner.lock().unwrap().rng.bool()
    }

    fn below(&self, n: usize) -> usize {
        self.inner.lock().unwrap().rng.usize(..n)
    }

    /// Cuts the power: every unsynced write survives with the configured chance, in order.
    fn cut(&self) {
        if self.off.swap(true, Ordering::SeqCst) {
            return;
        }
        self.cut_in_journal_sync.store(self.in_journal_sync.load(Ordering::SeqCst), Ordering::SeqCst);
        let mut inner = self.inner.lock().unwrap();
        let disks = inner.disks.clone();
        for disk in disks {
            let mut d = disk.lock().unwrap();
            let pending = std::mem::take(&mut d.pending);
            for op in &pending {
                if inner.rng.f64() < inner.survive {
                    apply_op(&mut d.durable, op);
                }
            }
            d.volatile = d.durable.clone();
        }
    }
}

/// A [`StorageBackend`] on a [`Disk`] of a machine with [`Power`].
#[derive(Debug)]
struct PowerCutBackend {
    power: Arc<Power>,
    disk: Arc<Mutex<Disk>>,
}

impl PowerCutBackend {
    fn power_off() -> io::Error {
        io::Error::other("power is off")
    }
}

impl StorageBackend for PowerCutBackend {
    fn len(&self) -> io::Result<u64> {
        if self.power.is_off() {
            return Err(Self::power_off());
        }
        Ok(self.disk.lock().unwrap().volatile.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        if self.power.is_off() {
            return Err(Self::power_off());
        }
        let d = self.disk.lock().unwrap();
        let start = offset as usize;
        let end = start + out.len();
        if end > d.volatile.len() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"));
        }
        out.copy_from_slice(&d.volatile[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        match self.power.tick()? {
            Tick::Run => {
                let mut d = self.disk.lock().unwrap();
                let op = Op::SetLen(len);
                apply_op(&mut d.volatile, &op);
                d.pending.push(op);
                Ok(())
            }
            Tick::Cut => {
                if self.power.coin() {
                    self.disk.lock().unwrap().pending.push(Op::SetLen(len));
                }
                self.power.cut();
                Err(Self::power_off())
            }
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        let tick = self.power.tick()?;
        // A sync in flight at the cut may have completed on the device, or not.
        let completed = match tick {
            Tick::Run => true,
            Tick::Cut => self.power.coin(),
        };
        if completed {
            let mut d = self.disk.lock().unwrap();
            let pending = std::mem::take(&mut d.pending);
            for op in &pending {
                apply_op(&mut d.durable, op);
            }
        }
        if let Tick::Cut = tick {
            self.power.cut();
            return Err(Self::power_off());
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self.power.tick()? {
            Tick::Run => {
                let mut d = self.disk.lock().unwrap();
                let op = Op::Write(offset, data.to_vec());
                apply_op(&mut d.volatile, &op);
                d.pending.push(op);
                Ok(())
            }
            Tick::Cut => {
                // Torn: a random prefix of the write may reach the page cache.
                let keep = self.power.below(data.len() + 1);
                if keep > 0 {
                    self.disk.lock().unwrap().pending.push(Op::Write(offset, data[..keep].to_vec()));
                }
                self.power.cut();
                Err(Self::power_off())
            }
        }
    }
}

/// A machine with a database disk and a journal disk.
struct Machine {
    power: Arc<Power>,
    data: Arc<Mutex<Disk>>,
    log: Arc<Mutex<Disk>>,
    seed: u64,
}

impl Machine {
    fn new(seed: u64, survive: f64) -> Self {
        Self::with_disks(seed, survive, Disk::default(), Disk::default())
    }

    fn with_disks(seed: u64, survive: f64, data: Disk, log: Disk) -> Self {
        let power = Power::new(seed, survive);
        let data = Arc::new(Mutex::new(data));
        let log = Arc::new(Mutex::new(log));
        power.inner.lock().unwrap().disks.extend([data.clone(), log.clone()]);
        Machine { power, data, log, seed }
    }

    fn data_backend(&self) -> PowerCutBackend {
        PowerCutBackend { power: self.power.clone(), disk: self.data.clone() }
    }

    fn log_backend(&self) -> PowerCutBackend {
        PowerCutBackend { power: self.power.clone(), disk: self.log.clone() }
    }

    fn backends(&self) -> (Box<dyn StorageBackend>, Box<dyn StorageBackend>) {
        (Box::new(self.data_backend()), Box::new(self.log_backend()))
    }

    /// Power cut (now, if it has not happened yet), then a boot from what is durable.
    fn reboot(&self) -> Machine {
        self.power.cut();
        let data = Disk::with_bytes(self.data.lock().unwrap().durable.clone());
        let log = Disk::with_bytes(self.log.lock().unwrap().durable.clone());
        Machine::with_disks(self.seed.wrapping_add(1), 0.0, data, log)
    }

    /// The process dies but the machine stays up: the page cache survives, synced or not.
    fn restart_process(&self) -> Machine {
        let data = self.data.lock().unwrap().clone();
        let log = self.log.lock().unwrap().clone();
        Machine::with_disks(self.seed.wrapping_add(2), 0.0, data, log)
    }
}

/// The journal under redb, telling the machine's power while a barrier is in progress.
#[derive(Debug)]
struct Flagged {
    inner: JournalBackend,
    power: Arc<Power>,
}

impl StorageBackend for Flagged {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.power.in_journal_sync.store(true, Ordering::SeqCst);
        let result = self.inner.sync_data();
        self.power.in_journal_sync.store(false, Ordering::SeqCst);
        result
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.inner.write(offset, data)
    }
    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
}

// ---------------------------------------------------------------------------------------------
// Fault injection: fail the Nth write, set_len or sync of one inner backend.
// ---------------------------------------------------------------------------------------------

const F_WRITE: u8 = 1;
const F_SET_LEN: u8 = 2;
const F_SYNC: u8 = 4;

#[derive(Debug)]
struct FaultPlan {
    kinds: u8,
    left: Mutex<Option<u64>>,
    fired: AtomicBool,
}

impl FaultPlan {
    /// Fails the `nth` (from 1) operation of `kinds`, once.
    fn new(kinds: u8, nth: u64) -> Arc<Self> {
        Arc::new(FaultPlan { kinds, left: Mutex::new(Some(nth.saturating_sub(1))), fired: AtomicBool::new(false) })
    }

    fn check(&self, kind: u8) -> io::Result<()> {
        if self.kinds & kind == 0 {
            return Ok(());
        }
        let mut left = self.left.lock().unwrap();
        match *left {
            Some(0) => {
                *left = None;
                self.fired.store(true, Ordering::SeqCst);
                Err(io::Error::other("injected fault"))
            }
            Some(n) => {
                *left = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

#[derive(Debug)]
struct FaultyBackend {
    inner: PowerCutBackend,
    plan: Arc<FaultPlan>,
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.plan.check(F_SET_LEN)?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.plan.check(F_SYNC)?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.plan.check(F_WRITE)?;
        self.inner.write(offset, data)
    }
}

// ---------------------------------------------------------------------------------------------
// The workload: random committed transactions on one table, and the check after a reboot.
// ---------------------------------------------------------------------------------------------

const TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("t");
type Model = BTreeMap<u64, Vec<u8>>;

fn random_value(rng: &mut fastrand::Rng) -> Vec<u8> {
    let len = match rng.u32(..100) {
        0..=79 => rng.usize(1..100),
        80..=96 => rng.usize(500..6000),
        _ => rng.usize(60_000..150_000),
    };
    let mut v = vec![0u8; len];
    v.fill(rng.u8(..));
    for b in v.iter_mut().take(16) {
        *b = rng.u8(..);
    }
    v
}

enum TxnEnd {
    Committed,
    /// The commit returned an error: its changes may or may not be durable, whole.
    CommitFailed,
    /// Something before the commit failed: nothing of it may be durable.
    FailedBefore,
}

/// The region of runs with notes.
const NOTE_REGION: u64 = 1 << 20;

/// Notes acknowledged since the last redb commit, each one insert, oldest first: what the store
/// does with its commits, in miniature.
type Notes = Vec<(u64, Vec<u8>)>;

fn note_bytes(key: u64, value: &[u8]) -> Vec<u8> {
    let mut note = key.to_le_bytes().to_vec();
    note.extend_from_slice(value);
    note
}

fn note_insert(note: &[u8]) -> (u64, Vec<u8>) {
    (u64_at(note, 0), note[8..].to_vec())
}

/// One step of the workload from `acked`: with `notes`, half the time a note (one insert kept
/// in `pending` until a commit writes it); otherwise a transaction. As the store does, the
/// waiting notes are first committed alone, then the transaction (or the insert the journal
/// refused as a note) in a commit of its own. Returns how it ended and the state it makes.
fn run_step(
    db: &Database,
    journal: &JournalMonitor,
    power: Option<&Power>,
    notes: bool,
    rng: &mut fastrand::Rng,
    acked: &Model,
    pending: &mut Notes,
) -> (TxnEnd, Model) {
    let mut next = acked.clone();
    if notes && rng.bool() {
        let (key, value) = (rng.u64(..48), random_value(rng));
        next.insert(key, value.clone());
        power.inspect(|p| p.in_journal_sync.store(true, Ordering::SeqCst));
        let appended = journal.append_note(&note_bytes(key, &value));
        power.inspect(|p| p.in_journal_sync.store(false, Ordering::SeqCst));
        return match appended {
            Ok(true) => {
                pending.push((key, value));
                (TxnEnd::Committed, next)
            }
            // Not a note: the waiting notes are committed alone, then the insert on its own.
            Ok(false) => match commit_notes(db, journal, pending) {
                TxnEnd::Committed => (commit_inserts(db, &[(key, value)]), next),
                end => (end, acked.clone()),
            },
            Err(_) => (TxnEnd::CommitFailed, next),
        };
    }
    match commit_notes(db, journal, pending) {
        TxnEnd::Committed => {}
        end => return (end, next),
    }
    let end = run_txn(db, rng, &mut next);
    (end, next)
}

/// One commit of the waiting notes alone, if any; the journal is then told they are held.
fn commit_notes(db: &Database, journal: &JournalMonitor, pending: &mut Notes) -> TxnEnd {
    if pending.is_empty() {
        return TxnEnd::Committed;
    }
    let end = commit_inserts(db, pending);
    if matches!(end, TxnEnd::Committed) {
        journal.notes_held();
        pending.clear();
    }
    end
}

/// One commit of `inserts`, in order, and nothing else.
fn commit_inserts(db: &Database, inserts: &[(u64, Vec<u8>)]) -> TxnEnd {
    let Ok(txn) = db.begin_write() else { return TxnEnd::FailedBefore };
    {
        let Ok(mut table) = txn.open_table(TABLE) else { return TxnEnd::FailedBefore };
        for (key, value) in inserts {
            if table.insert(key, value.as_slice()).is_err() {
                return TxnEnd::FailedBefore;
            }
        }
    }
    match txn.commit() {
        Ok(()) => TxnEnd::Committed,
        Err(_) => TxnEnd::CommitFailed,
    }
}

fn run_txn(db: &Database, rng: &mut fastrand::Rng, model: &mut Model) -> TxnEnd {
    let Ok(mut txn) = db.begin_write() else { return TxnEnd::FailedBefore };
    if txn.set_durability(Durability::Immediate).is_err() {
        return TxnEnd::FailedBefore;
    }
    {
        let Ok(mut table) = txn.open_table(TABLE) else { return TxnEnd::FailedBefore };
        for _ in 0..rng.usize(1..6) {
            let key = rng.u64(..48);
            if rng.u8(..4) == 0 {
                if table.remove(key).is_err() {
                    return TxnEnd::FailedBefore;
                }
                model.remove(&key);
            } else {
                let value = random_value(rng);
                if table.insert(key, value.as_slice()).is_err() {
                    return TxnEnd::FailedBefore;
                }
                model.insert(key, value);
            }
        }
    }
    match txn.commit() {
        Ok(()) => TxnEnd::Committed,
        Err(_) => TxnEnd::CommitFailed,
    }
}

fn read_table(db: &Database) -> Result<Model, String> {
    let txn = db.begin_read().map_err(|e| format!("begin_read: {e}"))?;
    let table = match txn.open_table(TABLE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Model::new()),
        Err(e) => return Err(format!("open_table: {e}")),
    };
    let mut out = Model::new();
    for row in table.iter().map_err(|e| format!("iter: {e}"))? {
        let (k, v) = row.map_err(|e| format!("row: {e}"))?;
        out.insert(k.value(), v.value().to_vec());
    }
    Ok(out)
}

fn describe(m: &Model) -> String {
    let keys: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{}", v.len())).collect();
    format!("{{{}}}", keys.join(" "))
}

/// What a run acknowledged, and what the one commit that failed would have made.
struct Outcome {
    acked: Model,
    in_flight: Option<Model>,
    /// Whether seeing `in_flight` after the reboot is allowed.
    in_flight_allowed: bool,
    /// Whether creating the database returned; until it has, redb may find a file it refuses
    /// (its creation writes the magic number in a last barrier), as it would on a plain file.
    created: bool,
    acked_commits: u64,
}

/// Opens the rebooted machine through the journal and redb and checks the table is the state
/// after the last acknowledged commit, or (when allowed) after the commit in flight.
/// `damaged`: a byte of the journal before its newest record was flipped after the cut; then a
/// refusal is right too, and anything served must still be the acknowledged state.
fn verify(
    m: &Machine,
    outcome: &Outcome,
    rng: &mut fastrand::Rng,
    cov: &Coverage,
    damaged: bool,
) -> Result<(), String> {
    let options = JournalOptions { region_bytes: [64 << 10, 256 << 10][rng.usize(..2)], ..Default::default() };
    let (data, log) = m.backends();
    let journal = match JournalBackend::open_with(data, log, &options) {
        Ok(journal) => journal,
        Err(_) if damaged => {
            count(&cov.refused_damage, 1);
            return Ok(());
        }
        Err(e) => return Err(format!("journal open: {e}")),
    };
    if damaged {
        count(&cov.served_despite_damage, 1);
    }
    let recovery = journal.recovery().clone();
    let monitor = journal.monitor();
    let notes = monitor.take_recovered_notes();
    if notes.len() as u64 != recovery.pending_notes {
        return Err(format!("{} notes handed over, {} reported", notes.len(), recovery.pending_notes));
    }
    count(&cov.runs, 1);
    count(&cov.acked_commits, outcome.acked_commits);
    if recovery.replayed_records > 0 {
        count(&cov.runs_with_replay, 1);
        count(&cov.replayed_records, recovery.replayed_records);
    }
    count(&cov.rebound, u64::from(recovery.rebound));
    let mut db = match Database::builder().create_with_backend(journal) {
        Ok(db) => db,
        Err(e) if !outcome.created && e.to_string().contains("magic number mismatch") => {
            count(&cov.refused_unfinished_creation, 1);
            return Ok(());
        }
        Err(e) => return Err(format!("redb open: {e}")),
    };
    match db.check_integrity() {
        Ok(true) => {}
        Ok(false) => return Err("the integrity check had to repair the file".into()),
        Err(e) => return Err(format!("integrity check: {e}")),
    }
    if !notes.is_empty() {
        // What the store does at open: one commit redoes the notes, in order.
        count(&cov.notes_redone, notes.len() as u64);
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        {
            let mut table = txn.open_table(TABLE).map_err(|e| e.to_string())?;
            for note in &notes {
                let (key, value) = note_insert(note);
                table.insert(key, value.as_slice()).map_err(|e| e.to_string())?;
            }
        }
        txn.commit().map_err(|e| format!("commit of the notes: {e}"))?;
        monitor.notes_held();
    }
    let found = read_table(&db)?;
    if found != outcome.acked {
        let in_flight = outcome.in_flight.as_ref().is_some_and(|f| *f == found);
        if !in_flight {
            return Err(format!(
                "found {} but acknowledged {} (in flight: {})",
                describe(&found),
                describe(&outcome.acked),
                outcome.in_flight.as_ref().map_or("none".into(), describe)
            ));
        }
        if !outcome.in_flight_allowed {
            return Err("the commit in flight is visible though the cut was not inside its barrier".into());
        }
        count(&cov.in_flight_seen, 1);
    }
    // The recovered journal keeps working: one more commit, a clean close, a cut, a reopen.
    if rng.bool() {
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        txn.open_table(TABLE)
            .map_err(|e| e.to_string())?
            .insert(1000, b"after".as_slice())
            .map_err(|e| e.to_string())?;
        txn.commit().map_err(|e| format!("commit after recovery: {e}"))?;
        drop(db);
        let again = m.reboot();
        let (data, log) = again.backends();
        let journal = JournalBackend::open_with(data, log, &options).map_err(|e| format!("journal reopen: {e}"))?;
        if journal.recovery().replayed_records != 0 {
            return Err("a clean close left records to replay".into());
        }
        let db = Database::builder().create_with_backend(journal).map_err(|e| format!("redb reopen: {e}"))?;
        let mut expected = found;
        expected.insert(1000, b"after".to_vec());
        if read_table(&db)? != expected {
            return Err("the commit after recovery did not survive a clean close".into());
        }
    }
    Ok(())
}

/// What the simulation runs went through, to show that every path is exercised.
#[derive(Default)]
struct Coverage {
    runs: AtomicU64,
    acked_commits: AtomicU64,
    runs_with_replay: AtomicU64,
    replayed_records: AtomicU64,
    in_flight_seen: AtomicU64,
    rebound: AtomicU64,
    refused_unfinished_creation: AtomicU64,
    checkpoints: AtomicU64,
    requested_checkpoints: AtomicU64,
    direct_batches: AtomicU64,
    notes: AtomicU64,
    notes_redone: AtomicU64,
    refused_damage: AtomicU64,
    served_despite_damage: AtomicU64,
}

fn count(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Mutating backend operations of opening a new database, and of one commit (generous).
const OPS_OPEN: u64 = 20;
const OPS_PER_TXN: u64 = 6;

fn random_options(rng: &mut fastrand::Rng) -> JournalOptions {
    JournalOptions {
        region_bytes: [64 << 10, 128 << 10, 1 << 20][rng.usize(..3)],
        checkpoint_records: [0, 0, 2, 5][rng.usize(..4)],
        checkpoint_bytes: [0, 0, 0, 100 << 10][rng.usize(..4)],
    }
}

/// One power-cut run: a random workload, a cut after a random count of operations, a reboot.
fn simulate(seed: u64, sabotage: Sabotage, cov: &Coverage) -> Result<(), String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let survive = [0.0, 0.0, 0.3, 0.7][rng.usize(..4)];
    let mut options = random_options(&mut rng);
    let txns = rng.usize(1..20);
    let machine = Machine::new(seed, survive);
    let cut_at = rng.u64(1..=OPS_OPEN + txns as u64 * OPS_PER_TXN);
    let clean_close = rng.u8(..4) == 0;
    // Some runs also ask for checkpoints between commits, as a compaction does.
    let requests_checkpoints = rng.u8(..3) == 0;
    // Half the runs keep some commits as notes, as the store does, in a region large enough
    // for them (a quarter of it) and the commits around them.
    let notes = rng.bool();
    if notes {
        options.region_bytes = NOTE_REGION;
    }
    let mut pending = Notes::new();
    machine.power.arm(cut_at);
    let mut monitor = None;
    let mut outcome =
        Outcome { acked: Model::new(), in_flight: None, in_flight_allowed: false, created: false, acked_commits: 0 };
    'run: {
        let (data, log) = machine.backends();
        let Ok(journal) = JournalBackend::open_sabotaged(data, log, &options, sabotage) else { break 'run };
        let handle = journal.monitor();
        monitor = Some(journal.monitor());
        let flagged = Flagged { inner: journal, power: machine.power.clone() };
        let Ok(db) = Database::builder().create_with_backend(flagged) else { break 'run };
        outcome.created = true;
        for _ in 0..txns {
            if requests_checkpoints && rng.bool() {
                handle.request_checkpoint();
                count(&cov.requested_checkpoints, 1);
            }
            let (end, next) =
                run_step(&db, &handle, Some(&machine.power), notes, &mut rng, &outcome.acked, &mut pending);
            match end {
                TxnEnd::Committed => {
                    outcome.acked = next;
                    outcome.acked_commits += 1;
                }
                TxnEnd::CommitFailed => {
                    outcome.in_flight = Some(next);
                    break;
                }
                TxnEnd::FailedBefore => break,
            }
        }
        if !clean_close {
            machine.power.cut();
        }
        drop(db);
    }
    outcome.in_flight_allowed = machine.power.cut_in_journal_sync.load(Ordering::SeqCst);
    if let Some(stats) = monitor.map(|m| m.stats()) {
        count(&cov.checkpoints, stats.checkpoints);
        count(&cov.direct_batches, stats.direct_batches);
        count(&cov.notes, stats.notes);
    }
    // A third of the runs also flip a byte of the journal at rest, anywhere before its newest
    // record (a header slot, an older record): refused, or exactly the acknowledged state.
    let rebooted = machine.reboot();
    let damaged = rng.u8(..3) == 0 && damage_before_newest(&rebooted, &mut rng);
    verify(&rebooted, &outcome, &mut rng, cov, damaged)
        .map_err(|e| format!("seed {seed} (cut at op {cut_at}, damaged {damaged}): {e}"))
}

/// Flips one byte of the journal's header slots or of a record before its newest one; `false`
/// when the journal has no valid header to find its records by.
fn damage_before_newest(m: &Machine, rng: &mut fastrand::Rng) -> bool {
    let mut disk = m.log.lock().unwrap();
    let log = &mut disk.volatile;
    let has_header = log.len() >= REGION_START as usize
        && (0..2).any(|i| matches!(Header::decode(&log[i * SLOT_LEN..(i + 1) * SLOT_LEN]), Slot::Valid(_)));
    if !has_header {
        return false;
    }
    let spans = record_spans(log);
    let at = if spans.len() >= 2 && rng.bool() {
        let (pos, size) = spans[rng.usize(..spans.len() - 1)];
        (pos + rng.u64(..size)) as usize
    } else {
        rng.usize(..REGION_START as usize)
    };
    log[at] ^= 1 << rng.u8(..8);
    disk.durable = log.clone();
    true
}

/// One fault run: the Nth write, set_len or sync of the journal or of the data file fails.
fn simulate_fault(seed: u64, cov: &Coverage) -> Result<(), String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let survive = [0.0, 0.5][rng.usize(..2)];
    let mut options = random_options(&mut rng);
    let notes = rng.bool();
    if notes {
        options.region_bytes = NOTE_REGION;
    }
    let txns = rng.usize(1..12);
    let machine = Machine::new(seed, survive);
    let kinds = [F_WRITE | F_SET_LEN | F_SYNC, F_SYNC, F_WRITE][rng.usize(..3)];
    let nth = rng.u64(1..=(OPS_OPEN + txns as u64 * OPS_PER_TXN) / 2);
    let plan = FaultPlan::new(kinds, nth);
    let on_log = rng.bool();
    let mut monitor = None;
    let mut outcome =
        Outcome { acked: Model::new(), in_flight: None, in_flight_allowed: true, created: false, acked_commits: 0 };
    {
        let data: Box<dyn StorageBackend> = if on_log {
            Box::new(machine.data_backend())
        } else {
            Box::new(FaultyBackend { inner: machine.data_backend(), plan: plan.clone() })
        };
        let log: Box<dyn StorageBackend> = if on_log {
            Box::new(FaultyBackend { inner: machine.log_backend(), plan: plan.clone() })
        } else {
            Box::new(machine.log_backend())
        };
        'run: {
            let Ok(journal) = JournalBackend::open_with(data, log, &options) else { break 'run };
            let handle = journal.monitor();
            monitor = Some(journal.monitor());
            let Ok(db) = Database::builder().create_with_backend(journal) else { break 'run };
            outcome.created = true;
            let mut pending = Notes::new();
            for _ in 0..txns {
                let (end, next) = run_step(&db, &handle, None, notes, &mut rng, &outcome.acked, &mut pending);
                match end {
                    TxnEnd::Committed => {
                        outcome.acked = next;
                        outcome.acked_commits += 1;
                    }
                    TxnEnd::CommitFailed => {
                        outcome.in_flight = Some(next);
                        break;
                    }
                    TxnEnd::FailedBefore => break,
                }
            }
        }
    }
    if let Some(stats) = monitor.map(|m| m.stats()) {
        count(&cov.checkpoints, stats.checkpoints);
        count(&cov.direct_batches, stats.direct_batches);
        count(&cov.notes, stats.notes);
    }
    let what = format!(
        "seed {seed} (fault {} #{nth} of kinds {kinds}, fired {})",
        if on_log { "log" } else { "data" },
        plan.fired.load(Ordering::SeqCst)
    );
    verify(&machine.restart_process(), &outcome, &mut rng, cov, false)
        .map_err(|e| format!("{what}, process restart: {e}"))?;
    verify(&machine.reboot(), &outcome, &mut rng, cov, false).map_err(|e| format!("{what}, power cut: {e}"))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `f` over `seeds` on two threads; returns the failures.
fn run_seeds(seeds: std::ops::Range<u64>, f: impl Fn(u64) -> Result<(), String> + Sync) -> Vec<String> {
    let next = AtomicU64::new(seeds.start);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= seeds.end {
                        break;
                    }
                    // A corrupt file can make redb panic (the sabotage runs): that is a failure too.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(seed)))
                        .unwrap_or_else(|_| Err(format!("seed {seed}: panicked")));
                    if let Err(e) = result {
                        failures.lock().unwrap().push(e);
                    }
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

fn assert_no_failures(what: &str, count: u64, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{what}: {} of {count} seeds failed, first ones:\n{}",
        failures.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The random cut points cover the whole run: opening and each commit fit the budget.
#[test]
fn operation_budget_covers_the_workload() {
    let machine = Machine::new(0, 0.0);
    let journal = open_on(&machine, &options(1 << 20));
    let db = Database::builder().create_with_backend(journal).unwrap();
    let after_open = machine.power.ops.load(Ordering::SeqCst);
    let mut rng = fastrand::Rng::with_seed(1);
    let mut model = Model::new();
    for _ in 0..20 {
        assert!(matches!(run_txn(&db, &mut rng, &mut model), TxnEnd::Committed));
    }
    let after = machine.power.ops.load(Ordering::SeqCst);
    let per_txn = (after - after_open) as f64 / 20.0;
    println!("mutating operations: {after_open} to open, {per_txn} per commit");
    assert!(after_open <= OPS_OPEN && per_txn <= OPS_PER_TXN as f64);
}

impl Coverage {
    fn report(&self, what: &str, seeds: u64) -> String {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "{what}, {seeds} seeds: {} reboots checked, {} acknowledged commits, {} recoveries replayed \
             {} records, {} in-flight commits found whole, {} rebinds, {} unfinished creations refused \
             by redb, {} checkpoints ({} asked for), {} direct batches, {} notes ({} redone at an open), \
             journals damaged at rest: {} refused, {} served whole",
            get(&self.runs),
            get(&self.acked_commits),
            get(&self.runs_with_replay),
            get(&self.replayed_records),
            get(&self.in_flight_seen),
            get(&self.rebound),
            get(&self.refused_unfinished_creation),
            get(&self.checkpoints),
            get(&self.requested_checkpoints),
            get(&self.direct_batches),
            get(&self.notes),
            get(&self.notes_redone),
            get(&self.refused_damage),
            get(&self.served_despite_damage),
        )
    }
}

fn power_cut_runs(start: u64, count: u64) {
    let cov = Coverage::default();
    let failures = run_seeds(start..start + count, |seed| simulate(seed, Sabotage::None, &cov));
    assert_no_failures("power cut", count, &failures);
    println!("{}", cov.report("power cut", count));
    if count >= 200 {
        let (refused, served) =
            (cov.refused_damage.load(Ordering::Relaxed), cov.served_despite_damage.load(Ordering::Relaxed));
        assert!(refused > 0 && served > 0, "journal damage exercised: {refused} refused, {served} served");
    }
}

fn fault_runs(start: u64, count: u64) {
    let cov = Coverage::default();
    let failures = run_seeds(start..start + count, |seed| simulate_fault(seed, &cov));
    assert_no_failures("fault injection", count, &failures);
    println!("{}", cov.report("fault injection", count));
}

/// 1,000 seeds by default; `JOURNAL_SIM_SEEDS` and `JOURNAL_SIM_START` choose others.
#[test]
fn power_cut_simulation() {
    power_cut_runs(env_u64("JOURNAL_SIM_START", 0), env_u64("JOURNAL_SIM_SEEDS", 1000));
}

#[test]
fn fault_injection() {
    fault_runs(env_u64("JOURNAL_SIM_START", 0), env_u64("JOURNAL_FAULT_SEEDS", 500));
}

/// 100,000 power-cut seeds and 10,000 fault seeds (or `JOURNAL_SIM_SEEDS` and a tenth of it):
/// `cargo test --release -- --ignored sim_large --nocapture`.
#[test]
#[ignore = "long: run with --release -- --ignored"]
fn sim_large() {
    let start = env_u64("JOURNAL_SIM_START", 1_000_000);
    let count = env_u64("JOURNAL_SIM_SEEDS", 100_000);
    power_cut_runs(start, count);
    fault_runs(start, count / 10);
}

/// Runs the simulation with a deliberate bug; returns the seeds' failures.
fn sabotaged_runs(sabotage: Sabotage, count: u64) -> Vec<String> {
    let cov = Coverage::default();
    let mut failures = run_seeds(0..count, |seed| simulate(seed, sabotage, &cov));
    failures.sort();
    failures
}

#[test]
fn sabotage_ack_before_log_sync_is_caught() {
    let count = 300;
    let failures = sabotaged_runs(Sabotage::SkipLogSync, count);
    println!("acknowledging before the journal sync: {} of {count} seeds failed, e.g.", failures.len());
    for e in failures.iter().take(3) {
        println!("  {e}");
    }
    assert!(!failures.is_empty(), "the simulation did not catch barriers acknowledged before the journal sync");
}

#[test]
fn sabotage_checkpoint_without_data_sync_is_caught() {
    let count = 300;
    let failures = sabotaged_runs(Sabotage::SkipDataSyncAtCheckpoint, count);
    println!("checkpointing without syncing the data file: {} of {count} seeds failed, e.g.", failures.len());
    for e in failures.iter().take(3) {
        println!("  {e}");
    }
    assert!(!failures.is_empty(), "the simulation did not catch checkpoints that skip the data sync");
}

// ---------------------------------------------------------------------------------------------
// Unit tests.
// ---------------------------------------------------------------------------------------------

fn options(region: u64) -> JournalOptions {
    JournalOptions { region_bytes: region, ..Default::default() }
}

fn open_on(m: &Machine, opts: &JournalOptions) -> JournalBackend {
    let (data, log) = m.backends();
    JournalBackend::open_with(data, log, opts).unwrap()
}

fn contents(backend: &dyn StorageBackend) -> Vec<u8> {
    let mut out = vec![0u8; backend.len().unwrap() as usize];
    backend.read(0, &mut out).unwrap();
    out
}

fn disk_bytes(disk: &Arc<Mutex<Disk>>) -> Vec<u8> {
    disk.lock().unwrap().volatile.clone()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
}

#[test]
fn xxh64_matches_reference_vectors() {
    assert_eq!(xxh64(b""), 0xef46_db37_51d8_e999);
    assert_eq!(xxh64(b"a"), 0xd24e_c4f1_a98c_6e5b);
    assert_eq!(xxh64(b"abc"), 0x44bc_2cf5_ad77_0999);
    assert_eq!(xxh64(b"Nobody inspects the spammish repetition"), 0xfbce_a83c_8a37_8bf1);
    let bytes: Vec<u8> = (0..100).collect();
    assert_eq!(xxh64(&bytes), 0x6ac1_e580_3216_6597);
    assert_eq!(xxh64(b"0123456789abcdef0123456789abcdef0123456789abcdef"), 0xe352_1644_4a3c_253b);
}

/// A header slot and a record as the previous release wrote them, byte for byte: their
/// checksums (and so every byte they cover) are pinned to what its own xxHash64 gave.
#[test]
fn header_and_record_bytes_are_those_of_the_previous_release() {
    let header = Header {
        version: FORMAT_VERSION,
        journal_id: [7; 16],
        generation: 3,
        next_seq: 9,
        region_len: 65_536,
        data_len: 12_288,
        image: pattern(4, HEAD_LEN),
    };
    let slot = header.encode();
    let whole = xxh64(&slot);
    assert_eq!(
        u64_at(&slot, SLOT_CHECKSUM_AT),
        PINNED_SLOT_SUM,
        "slot checksum {:#x}",
        u64_at(&slot, SLOT_CHECKSUM_AT)
    );
    assert_eq!(whole, PINNED_SLOT_BYTES, "slot bytes {whole:#x}");
    let mut buf = Vec::new();
    sample_record(&mut buf, &[9; 16], 2, 5);
    assert_eq!(xxh64(&buf), PINNED_RECORD_BYTES, "record bytes {:#x}", xxh64(&buf));
}

const PINNED_SLOT_SUM: u64 = 0xdef0_fef7_af16_3389;
const PINNED_SLOT_BYTES: u64 = 0xad55_e759_c485_1dc3;
const PINNED_RECORD_BYTES: u64 = 0x0de2_ba46_15c9_57dc;

fn sample_record(buf: &mut Vec<u8>, id: &[u8; 16], generation: u64, seq: u64) -> Vec<(u64, Vec<u8>)> {
    // Trailing zeros are left out of the record and restored.
    let mut mostly_zeros = pattern(2, 4096);
    mostly_zeros[1000..].fill(0);
    let entries = vec![(0u64, pattern(1, 320)), (8192, mostly_zeros), (20000, vec![0; 777]), (30000, pattern(3, 777))];
    let iter = || entries.iter().map(|(o, b)| (*o, b.as_slice()));
    let size = record_size(iter());
    let key = RecordKey { journal_id: id, generation, seq };
    let head = RecordHead { flags: 0, size, min_len: 16384, final_len: 40960, count: entries.len() };
    encode_record(buf, &key, &head, iter());
    entries
}

#[test]
fn record_round_trips() {
    let id = [7u8; 16];
    let mut buf = Vec::new();
    let entries = sample_record(&mut buf, &id, 3, 9);
    assert_eq!(buf.len() as u64, ALIGN, "320 + 1000 + 0 + 777 bytes stored, in one page");
    let key = RecordKey { journal_id: &id, generation: 3, seq: 9 };
    let record = decode_record(&buf, &key).unwrap().unwrap();
    assert_eq!(
        record,
        Record {
            seq: 9,
            note: false,
            retires_notes: false,
            min_len: 16384,
            final_len: 40960,
            entries,
            size: buf.len() as u64
        }
    );
    // Another generation, sequence number or journal is not this record.
    for (g, s, i) in [(4, 9, id), (3, 10, id), (3, 9, [8u8; 16])] {
        let key = RecordKey { journal_id: &i, generation: g, seq: s };
        assert_eq!(decode_record(&buf, &key).unwrap(), None);
    }
}

#[test]
fn torn_or_corrupt_records_end_the_log() {
    let id = [7u8; 16];
    let mut buf = Vec::new();
    sample_record(&mut buf, &id, 3, 9);
    let key = RecordKey { journal_id: &id, generation: 3, seq: 9 };
    let body_end = buf.len() - buf.iter().rev().take_while(|&&b| b == 0).count();
    let mut rng = fastrand::Rng::with_seed(5);
    for _ in 0..500 {
        // A torn write: a prefix, and whatever was there before (zeros here) after it.
        let mut torn = buf.clone();
        let keep = rng.usize(..body_end);
        torn[keep..].fill(0);
        assert_eq!(decode_record(&torn, &key).unwrap(), None, "torn at {keep}");
        // A flipped bit anywhere in the checksummed part.
        let mut flipped = buf.clone();
        let at = rng.usize(..body_end);
        flipped[at] ^= 1 << rng.u8(..8);
        assert_eq!(decode_record(&flipped, &key).unwrap(), None, "flipped at {at}");
    }
}

#[test]
fn header_slots_round_trip_and_detect_tears() {
    let header = Header {
        version: FORMAT_VERSION,
        journal_id: [9u8; 16],
        generation: 12,
        next_seq: 400,
        region_len: 1 << 20,
        data_len: 123_456,
        image: pattern(4, HEAD_LEN),
    };
    let bytes = header.encode();
    assert_eq!(Header::decode(&bytes), Slot::Valid(header.clone()));
    assert_eq!(Header::decode(&vec![0u8; SLOT_LEN]), Slot::Blank);
    for keep in [1, 5, 8, 100, 4090, 8000] {
        let mut torn = bytes.clone();
        torn[keep..].fill(0);
        assert_eq!(Header::decode(&torn), Slot::Torn, "torn at {keep}");
    }
    let mut other = bytes.clone();
    other[0] = b'X';
    assert_eq!(Header::decode(&other), Slot::Foreign);
}

#[test]
fn first_page_check_accepts_versions_and_torn_mixes_only() {
    let old = pattern(1, 512);
    let new = pattern(2, 512);
    assert!(is_version_or_torn_mix(&old, &old, &new));
    assert!(is_version_or_torn_mix(&new, &old, &new));
    for cut in [0, 1, 100, 511, 512] {
        let mix: Vec<u8> = new[..cut].iter().chain(&old[cut..]).copied().collect();
        assert!(is_version_or_torn_mix(&mix, &old, &new));
    }
    assert!(!is_version_or_torn_mix(&pattern(3, 512), &old, &new));
    let mut patched = old.clone();
    patched[200] ^= 1;
    assert!(!is_version_or_torn_mix(&patched, &old, &new));
}

#[test]
fn extents_split_overlapping_writes() {
    let mut e = Extents::default();
    e.insert(100, &[1; 100]);
    e.insert(150, &[2; 10]);
    e.insert(90, &[3; 20]);
    e.insert(195, &[4; 10]);
    let flat: Vec<(u64, Vec<u8>)> = e.map.iter().map(|(o, b)| (*o, b.clone())).collect();
    assert_eq!(
        flat,
        vec![(90, vec![3; 20]), (110, vec![1; 40]), (150, vec![2; 10]), (160, vec![1; 35]), (195, vec![4; 10])]
    );
    e.truncate(155);
    let flat: Vec<(u64, usize)> = e.map.iter().map(|(o, b)| (*o, b.len())).collect();
    assert_eq!(flat, vec![(90, 20), (110, 40), (150, 5)]);
}

/// Random writes, truncations, reads and barriers against a flat model; then a power cut must
/// leave exactly the model as of the last barrier, and a clean close the model itself.
#[test]
fn overlay_reads_match_a_flat_model_and_survive_a_cut() {
    for seed in 0..150 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let m = Machine::new(seed, [0.0, 0.5, 1.0][rng.usize(..3)]);
        let opts =
            JournalOptions { region_bytes: 64 << 10, checkpoint_records: [0, 3][rng.usize(..2)], ..Default::default() };
        let j = open_on(&m, &opts);
        let mut model: Vec<u8> = Vec::new();
        let mut synced = model.clone();
        for _ in 0..120 {
            match rng.u8(..12) {
                0..=4 => {
                    let offset = rng.usize(..model.len() + 9000);
                    let len = if rng.u8(..20) == 0 { rng.usize(60_000..90_000) } else { rng.usize(1..9000) };
                    let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                    j.write(offset as u64, &bytes).unwrap();
                    apply_op(&mut model, &Op::Write(offset as u64, bytes));
                }
                5 => {
                    let len = rng.usize(..model.len() + 9000);
                    j.set_len(len as u64).unwrap();
                    model.resize(len, 0);
                }
                6..=8 if !model.is_empty() => {
                    let start = rng.usize(..model.len());
                    let end = rng.usize(start..=model.len());
                    let mut out = vec![0u8; end - start];
                    j.read(start as u64, &mut out).unwrap();
                    assert_eq!(out, model[start..end], "seed {seed}: read {start}..{end}");
                }
                9 | 10 => {
                    j.sync_data().unwrap();
                    synced = model.clone();
                }
                _ => {
                    assert_eq!(j.len().unwrap(), model.len() as u64);
                    assert_eq!(contents(&j), model, "seed {seed}");
                }
            }
        }
        assert!(j.read(model.len() as u64, &mut [0u8; 1]).is_err());
        let expected = if rng.bool() {
            j.close().unwrap();
            model
        } else {
            synced
        };
        let m2 = m.reboot();
        let j2 = open_on(&m2, &opts);
        assert_eq!(contents(&j2), expected, "seed {seed}: after reboot");
        // Recovery left the data file itself complete.
        assert_eq!(disk_bytes(&m2.data), expected, "seed {seed}: data file after recovery");
    }
}

#[test]
fn replay_applies_records_in_order() {
    let m = Machine::new(1, 0.0);
    let j = open_on(&m, &options(1 << 20));
    j.set_len(20_000).unwrap();
    j.write(8192, &[1; 3000]).unwrap();
    j.write(100, &[1; 50]).unwrap();
    j.sync_data().unwrap();
    j.write(9000, &[2; 100]).unwrap();
    j.write(120, &[2; 10]).unwrap();
    j.sync_data().unwrap();
    j.set_len(9050).unwrap();
    j.set_len(12_000).unwrap();
    j.sync_data().unwrap();
    let expected = contents(&j);
    assert_eq!(&expected[9000..9050], &[2; 50]);
    assert_eq!(&expected[9050..12_000], &[0; 2950][..]);
    let m2 = m.reboot();
    // Nothing but the journal made it: the data file is still empty.
    assert!(disk_bytes(&m2.data).is_empty());
    let j2 = open_on(&m2, &options(1 << 20));
    assert_eq!(j2.recovery().replayed_records, 3);
    assert_eq!(contents(&j2), expected);
}

#[test]
fn a_torn_last_record_is_not_replayed() {
    for seed in 0..40 {
        let m = Machine::new(seed, 0.0);
        let j = open_on(&m, &options(1 << 20));
        j.write(5000, &pattern(1, 6000)).unwrap();
        j.sync_data().unwrap();
        j.write(7000, &pattern(2, 9000)).unwrap();
        j.sync_data().unwrap();
        let expected = contents(&j);
        j.write(6000, &pattern(3, 20_000)).unwrap();
        // The next operation, the append of the third record, is cut: a random prefix lands.
        m.power.arm(1);
        assert!(j.sync_data().is_err());
        let j2 = open_on(&m.reboot(), &options(1 << 20));
        assert_eq!(j2.recovery().replayed_records, 2, "seed {seed}");
        assert_eq!(contents(&j2), expected, "seed {seed}");
    }
}

#[test]
fn a_record_failing_its_checksum_before_whole_ones_is_refused_and_the_last_one_rolls_back() {
    let m = Machine::new(1, 0.0);
    let j = open_on(&m, &options(1 << 20));
    j.write(5000, &pattern(1, 6000)).unwrap();
    j.sync_data().unwrap();
    j.write(5000, &pattern(2, 6000)).unwrap();
    j.sync_data().unwrap();
    let after_second = contents(&j);
    j.write(5000, &pattern(3, 6000)).unwrap();
    j.sync_data().unwrap();
    let m2 = m.reboot();
    let record = REGION_START + record_size([(5000u64, &pattern(1, 6000)[..])].into_iter());
    // A flipped byte inside the second record, with the third whole beyond it: damage.
    let mut damaged = m2.log.lock().unwrap().clone();
    damaged.volatile[(record + 200) as usize] ^= 0x40;
    let m3 = Machine::with_disks(3, 0.0, m2.data.lock().unwrap().clone(), damaged);
    let (data, log) = m3.backends();
    let err = JournalBackend::open_with(data, log, &options(1 << 20)).unwrap_err();
    assert!(matches!(err, JournalError::Damaged(_)), "{err}");
    assert!(err.to_string().contains("record 2"), "{err}");
    // The same flip in the last record cannot be told from a torn tail: the commit before.
    m2.log.lock().unwrap().volatile[(2 * record - REGION_START + 200) as usize] ^= 0x40;
    let j2 = open_on(&m2, &options(1 << 20));
    assert_eq!(j2.recovery().replayed_records, 2);
    assert_eq!(contents(&j2), after_second);
}

/// A database that crashed with records pending in its journal, and another database.
fn two_databases() -> (Machine, Machine) {
    let a = Machine::new(1, 0.0);
    {
        let db = Database::builder().create_with_backend(open_on(&a, &options(1 << 20))).unwrap();
        let mut rng = fastrand::Rng::with_seed(1);
        let mut model = Model::new();
        for _ in 0..5 {
            assert!(matches!(run_txn(&db, &mut rng, &mut model), TxnEnd::Committed));
        }
        a.power.cut();
    }
    let b = Machine::new(2, 0.0);
    {
        let db = Database::builder().create_with_backend(open_on(&b, &options(1 << 20))).unwrap();
        let mut rng = fastrand::Rng::with_seed(2);
        let mut model = Model::new();
        for _ in 0..5 {
            assert!(matches!(run_txn(&db, &mut rng, &mut model), TxnEnd::Committed));
        }
    }
    (a.reboot(), b.reboot())
}

#[test]
fn a_journal_of_another_file_is_refused() {
    let (a, b) = two_databases();
    let a_log = a.log.lock().unwrap().clone();
    let b_data = b.data.lock().unwrap().clone();
    let mixed = Machine::with_disks(3, 0.0, b_data.clone(), a_log.clone());
    let (data, log) = mixed.backends();
    let err = JournalBackend::open_with(data, log, &options(1 << 20)).unwrap_err();
    assert!(matches!(err, JournalError::Foreign), "{err}");
    // Both files untouched.
    assert_eq!(disk_bytes(&mixed.data), b_data.volatile);
    assert_eq!(disk_bytes(&mixed.log), a_log.volatile);
    // The journal over its own file replays.
    let j = open_on(&a, &options(1 << 20));
    assert!(j.recovery().replayed_records > 0);
    let db = Database::builder().create_with_backend(j).unwrap();
    assert_eq!(read_table(&db).unwrap().len(), {
        let mut rng = fastrand::Rng::with_seed(1);
        let mut model = Model::new();
        let scratch = Machine::new(9, 0.0);
        let db2 = Database::builder().create_with_backend(open_on(&scratch, &options(1 << 20))).unwrap();
        for _ in 0..5 {
            run_txn(&db2, &mut rng, &mut model);
        }
        model.len()
    });
}

#[test]
fn a_clean_journal_over_a_changed_file_is_rebound() {
    let (_, b) = two_databases();
    // The file is written without the journal (the journal is clean after b's close).
    {
        let db = Database::builder().create_with_backend(b.data_backend()).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TABLE).unwrap().insert(7777, b"plain".as_slice()).unwrap();
        txn.commit().unwrap();
    }
    let j = open_on(&b, &options(1 << 20));
    assert!(j.recovery().rebound);
    assert_eq!(j.recovery().replayed_records, 0);
    let db = Database::builder().create_with_backend(j).unwrap();
    assert_eq!(read_table(&db).unwrap().get(&7777).map(Vec::as_slice), Some(&b"plain"[..]));
}

#[test]
fn a_missing_journal_is_created_for_an_existing_file() {
    let m = Machine::new(1, 0.0);
    {
        let db = Database::builder().create_with_backend(m.data_backend()).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TABLE).unwrap().insert(1, b"before the journal".as_slice()).unwrap();
        txn.commit().unwrap();
    }
    assert!(disk_bytes(&m.log).is_empty());
    let before = disk_bytes(&m.data);
    let j = open_on(&m, &options(64 << 10));
    assert_eq!(j.recovery(), &Recovery { created: true, generation: 1, ..Recovery::default() });
    assert_eq!(disk_bytes(&m.log).len() as u64, REGION_START + (64 << 10));
    assert_eq!(disk_bytes(&m.data), before);
    let db = Database::builder().create_with_backend(j).unwrap();
    assert_eq!(read_table(&db).unwrap().get(&1).map(Vec::as_slice), Some(&b"before the journal"[..]));
}

#[test]
fn a_new_journal_over_a_new_file_is_a_no_op() {
    let m = Machine::new(1, 0.0);
    let j = open_on(&m, &options(64 << 10));
    assert!(j.recovery().created);
    assert_eq!(j.len().unwrap(), 0);
    j.close().unwrap();
    let m2 = m.reboot();
    let j2 = open_on(&m2, &options(64 << 10));
    assert_eq!(j2.recovery(), &Recovery { generation: 1, ..Recovery::default() });
    assert!(disk_bytes(&m2.data).is_empty());
}

#[test]
fn a_half_created_journal_is_created_again_and_a_foreign_file_refused() {
    let template = Machine::with_disks(1, 0.0, Disk::with_bytes(pattern(1, 10_000)), Disk::default());
    drop(open_on(&template, &options(64 << 10)));
    let header = disk_bytes(&template.log)[..SLOT_LEN].to_vec();
    for keep in [0, 3, 8, 100, 5000, SLOT_LEN - 1] {
        let mut log = vec![0u8; keep.max(1)];
        log[..keep].copy_from_slice(&header[..keep]);
        let m = Machine::with_disks(2, 0.0, Disk::default(), Disk::with_bytes(log));
        let j = open_on(&m, &options(64 << 10));
        assert!(j.recovery().created, "kept {keep}");
    }
    let m = Machine::with_disks(2, 0.0, Disk::default(), Disk::with_bytes(b"some other file".to_vec()));
    let (data, log) = m.backends();
    assert!(matches!(JournalBackend::open_with(data, log, &options(64 << 10)), Err(JournalError::NotAJournal)));
    assert_eq!(disk_bytes(&m.log), b"some other file");
}

#[test]
fn checkpoints_reset_the_region_and_keep_everything() {
    let m = Machine::new(1, 0.0);
    let j = open_on(&m, &options(64 << 10));
    let monitor = j.monitor();
    for i in 0..60u8 {
        j.write(u64::from(i) * 5000, &pattern(i, 9000)).unwrap();
        j.sync_data().unwrap();
    }
    let expected = contents(&j);
    let stats = monitor.stats();
    assert_eq!(stats.records, 60);
    assert!(stats.checkpoints >= 10, "{stats:?}");
    assert_eq!(stats.direct_batches, 0);
    let j2 = open_on(&m.reboot(), &options(64 << 10));
    assert!(j2.recovery().replayed_records > 0);
    assert_eq!(contents(&j2), expected);
}

#[test]
fn checkpoint_every_n_records() {
    let m = Machine::new(1, 0.0);
    let opts = JournalOptions { checkpoint_records: 4, ..options(1 << 20) };
    let j = open_on(&m, &opts);
    let monitor = j.monitor();
    for i in 0..10u8 {
        j.write(u64::from(i) * 100, &[i; 100]).unwrap();
        j.sync_data().unwrap();
    }
    assert_eq!(monitor.stats().checkpoints, 2);
    let j2 = open_on(&m.reboot(), &opts);
    assert_eq!(j2.recovery().replayed_records, 2);
}

#[test]
fn a_batch_larger_than_the_region_goes_to_the_data_file() {
    let m = Machine::new(1, 0.0);
    let j = open_on(&m, &options(64 << 10));
    let monitor = j.monitor();
    j.write(0, &pattern(1, 5000)).unwrap();
    j.sync_data().unwrap();
    j.write(3000, &pattern(2, 200_000)).unwrap();
    j.sync_data().unwrap();
    let expected = contents(&j);
    assert_eq!(monitor.stats().direct_batches, 1);
    let m2 = m.reboot();
    let j2 = open_on(&m2, &options(64 << 10));
    assert_eq!(j2.recovery().replayed_records, 0);
    assert_eq!(contents(&j2), expected);
}

/// A file stamps each commit with the journal's next sequence number (its claim); a commit
/// too big for the region goes straight to the file, and a crash before the next record must
/// not leave a journal that seems older than that stamp.
#[test]
fn a_crash_after_a_batch_larger_than_the_region_reopens_under_the_files_claim() {
    let m = Machine::new(1, 0.0);
    let opts = options(64 << 10);
    let j = open_on(&m, &opts);
    let monitor = j.monitor();
    j.write(0, &pattern(1, 5000)).unwrap();
    j.sync_data().unwrap();
    let stamped = monitor.next_seq();
    j.write(3000, &pattern(2, 200_000)).unwrap();
    j.sync_data().unwrap();
    assert_eq!(monitor.stats().direct_batches, 1);
    let expected = contents(&j);
    let claim = FileClaim { journal_id: monitor.journal_id(), next_seq: stamped, open: true };
    drop(j);
    let m2 = m.reboot();
    let (data, log) = m2.backends();
    let j2 = JournalBackend::open_claimed(data, log, &opts, Some(&claim)).unwrap();
    assert_eq!(contents(&j2), expected);
    // And the next record goes on past the stamp.
    assert!(j2.monitor().next_seq() > stamped);
}

#[test]
fn the_journal_is_resized_when_asked() {
    let m = Machine::new(1, 0.0);
    let j = open_on(&m, &options(64 << 10));
    j.write(0, &pattern(1, 10_000)).unwrap();
    j.sync_data().unwrap();
    let expected = contents(&j);
    let m2 = m.reboot();
    let j2 = open_on(&m2, &options(256 << 10));
    assert!(j2.recovery().resized);
    assert_eq!(j2.recovery().replayed_records, 1);
    assert_eq!(disk_bytes(&m2.log).len() as u64, REGION_START + (256 << 10));
    assert_eq!(contents(&j2), expected);
    j2.write(20_000, &[5; 100]).unwrap();
    j2.sync_data().unwrap();
    let expected = contents(&j2);
    let m3 = m2.reboot();
    let j3 = open_on(&m3, &options(64 << 10));
    assert!(j3.recovery().resized);
    assert_eq!(disk_bytes(&m3.log).len() as u64, REGION_START + (64 << 10));
    assert_eq!(contents(&j3), expected);
}

#[test]
fn a_failed_barrier_latches_the_backend() {
    let m = Machine::new(1, 0.0);
    // Syncs of a new journal: the zero fill, the two header slots, then the first record's.
    let plan = FaultPlan::new(F_SYNC, 4);
    let log = FaultyBackend { inner: m.log_backend(), plan: plan.clone() };
    let j = JournalBackend::open_with(Box::new(m.data_backend()), Box::new(log), &options(64 << 10)).unwrap();
    j.write(5000, &[1; 100]).unwrap();
    assert!(j.sync_data().is_err());
    assert!(plan.fired.load(Ordering::SeqCst));
    // Latched: no more writes, even though the fault was transient; reads still work.
    assert!(j.write(0, &[1]).is_err());
    assert!(j.set_len(1).is_err());
    assert!(j.sync_data().is_err());
    let mut out = [0u8; 100];
    j.read(5000, &mut out).unwrap();
    assert_eq!(out, [1; 100]);
    // Closing does not checkpoint over the failure.
    j.close().unwrap();
    // The record was written but its sync failed: a process restart finds it whole (the page
    // cache kept it), a power cut without it.
    let j2 = open_on(&m.restart_process(), &options(64 << 10));
    assert_eq!(j2.recovery().replayed_records, 1);
    j2.read(5000, &mut out).unwrap();
    assert_eq!(out, [1; 100]);
    let j3 = open_on(&m.reboot(), &options(64 << 10));
    assert_eq!(j3.recovery().replayed_records, 0);
    assert_eq!(j3.len().unwrap(), 0);
}

#[test]
fn a_failed_checkpoint_keeps_the_records() {
    let m = Machine::new(1, 0.0);
    let plan = FaultPlan::new(F_WRITE, 1);
    let data = FaultyBackend { inner: m.data_backend(), plan };
    let j = JournalBackend::open_with(Box::new(data), Box::new(m.log_backend()), &options(64 << 10)).unwrap();
    j.write(5000, &[1; 100]).unwrap();
    j.sync_data().unwrap();
    // Between checkpoints the data file is not written.
    assert!(disk_bytes(&m.data).is_empty());
    // The checkpoint at close fails writing the data file.
    assert!(j.close().is_err());
    let j2 = open_on(&m.reboot(), &options(64 << 10));
    assert_eq!(j2.recovery().replayed_records, 1);
    let mut out = [0u8; 100];
    j2.read(5000, &mut out).unwrap();
    assert_eq!(out, [1; 100]);
}

#[test]
fn files_on_disk_round_trip_and_refuse_a_second_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let opts = options(256 << 10);
    {
        let j = JournalBackend::open_path(&path, &opts).unwrap();
        assert!(j.recovery().created);
        let second = JournalBackend::open_path(&path, &opts);
        assert!(matches!(second, Err(JournalError::Held)), "{second:?}");
        let db = Database::builder().create_with_backend(j).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(TABLE).unwrap().insert(1, b"one".as_slice()).unwrap();
        txn.commit().unwrap();
        // redb's own lock on the data file also keeps a journal open out.
        let third = JournalBackend::open_path(&path, &opts);
        assert!(matches!(third, Err(JournalError::Held)), "{third:?}");
    }
    assert_eq!(std::fs::metadata(journal_path(&path)).unwrap().len(), REGION_START + (256 << 10));
    assert_eq!(journal_path(&path).file_name().unwrap(), "limiter.redb-journal");
    let j = JournalBackend::open_path(&path, &opts).unwrap();
    assert_eq!(j.recovery().replayed_records, 0);
    assert!(!j.recovery().rebound);
    let db = Database::builder().create_with_backend(j).unwrap();
    assert_eq!(read_table(&db).unwrap().get(&1).map(Vec::as_slice), Some(&b"one"[..]));
    drop(db);
    // A plain redb open of the data file keeps the journal out too (nothing is replayed under it).
    let plain = Database::builder().create(&path).unwrap();
    let held = JournalBackend::open_path(&path, &opts);
    assert!(matches!(held, Err(JournalError::Held)), "{held:?}");
    drop(plain);
    assert!(JournalBackend::open_path(&path, &opts).is_ok());
}

/// An open refused because another holds the journal removes nothing: the files are the
/// holder's, even when they did not exist a moment before this open began.
#[test]
fn an_open_refused_as_held_leaves_the_holders_files_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(64 << 10);
    let path = dir.path().join("held.redb");
    let holder = JournalBackend::open_path(&path, &opts).unwrap();
    let journal = std::fs::read(journal_path(&path)).unwrap();
    let second = JournalBackend::open_path(&path, &opts);
    assert!(matches!(second, Err(JournalError::Held)), "{second:?}");
    assert!(path.exists());
    assert_eq!(std::fs::read(journal_path(&path)).unwrap(), journal);
    drop(holder);
    // Two opens starting together on a new path: one holds, the other is refused, and the
    // holder's files stay (the refused one must not take them for its own half-made ones).
    for round in 0..40 {
        let path = dir.path().join(format!("race-{round}.redb"));
        let start = std::sync::Barrier::new(2);
        let results: Vec<Result<JournalBackend, JournalError>> = std::thread::scope(|s| {
            let open = || {
                start.wait();
                JournalBackend::open_path(&path, &opts)
            };
            let a = s.spawn(open);
            let b = s.spawn(open);
            vec![a.join().unwrap(), b.join().unwrap()]
        });
        let held = results.iter().filter(|r| r.is_ok()).count();
        let errors: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(ToString::to_string)).collect();
        assert!(held >= 1, "round {round}: {errors:?}");
        assert!(results.iter().all(|r| matches!(r, Ok(_) | Err(JournalError::Held))), "round {round}: {errors:?}");
        assert!(path.exists(), "round {round}: the data file was removed");
        let log = std::fs::metadata(journal_path(&path));
        assert!(
            log.is_ok_and(|m| m.len() == REGION_START + (64 << 10)),
            "round {round}: the holder's journal was removed"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Benchmark: durable commits per second, plain file against journal, on real files.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    Journal,
}

fn open_bench_db(variant: Variant, dir: &Path) -> (Database, Option<JournalMonitor>) {
    match variant {
        Variant::Plain => {
            let path = dir.join("plain.redb");
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap();
            (Database::builder().create_with_backend(FileBackend::new(file).unwrap()).unwrap(), None)
        }
        Variant::Journal => {
            let journal = JournalBackend::open_path(&dir.join("journal.redb"), &JournalOptions::default()).unwrap();
            let monitor = journal.monitor();
            (Database::builder().create_with_backend(journal).unwrap(), Some(monitor))
        }
    }
}

/// CPU time (user + system) of this process so far, in seconds, where procfs tells it.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// One durable commit of one small insert, as the limiter's store makes per grant.
fn one_commit(db: &Database, key: u64) {
    let mut txn = db.begin_write().unwrap();
    txn.set_durability(Durability::Immediate).unwrap();
    txn.open_table(TABLE).unwrap().insert(key % 10_000, [7u8; 24].as_slice()).unwrap();
    txn.commit().unwrap();
}

/// The floor under each design: `pages` writes of 4 KiB at scattered offsets of a 4 MiB file
/// (plain redb's commit), or one sequential write of `pages` pages into a preallocated file
/// (the journal's), then one fdatasync; returns syncs per second over `secs`.
fn raw_sync_rate(dir: &Path, sequential: bool, pages: usize, secs: u64) -> f64 {
    use std::os::unix::fs::FileExt;
    let path = dir.join(if sequential { "raw-seq" } else { "raw-scattered" });
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).unwrap();
    let size = 4u64 << 20;
    file.write_all_at(&vec![0u8; size as usize], 0).unwrap();
    file.sync_all().unwrap();
    let mut rng = fastrand::Rng::with_seed(1);
    let buf = vec![5u8; 4096 * pages];
    let mut pos = 0u64;
    let start = std::time::Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs() < secs {
        if sequential {
            if pos + buf.len() as u64 > size {
                pos = 0;
            }
            file.write_all_at(&buf, pos).unwrap();
            pos += buf.len() as u64;
        } else {
            for _ in 0..pages {
                file.write_all_at(&buf[..4096], rng.u64(..size / 4096) * 4096).unwrap();
            }
        }
        file.sync_data().unwrap();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// `cargo test --release -- --ignored bench --nocapture`; `JOURNAL_BENCH_SECS` (3) per run,
/// `JOURNAL_BENCH_ROUNDS` (3) rounds of plain then journal, `JOURNAL_BENCH_DIR` for the files.
#[test]
#[ignore = "benchmark: run with --release -- --ignored bench --nocapture"]
fn bench_durable_commits() {
    let secs = env_u64("JOURNAL_BENCH_SECS", 3);
    let rounds = env_u64("JOURNAL_BENCH_ROUNDS", 3);
    let dir = match std::env::var("JOURNAL_BENCH_DIR") {
        Ok(d) => tempfile::tempdir_in(d).unwrap(),
        Err(_) => tempfile::tempdir().unwrap(),
    };
    println!("files in {}", dir.path().display());
    let mut key = 0u64;
    let mut ratios = Vec::new();
    for round in 1..=rounds {
        let mut rates = Vec::new();
        for variant in [Variant::Plain, Variant::Journal] {
            let (db, monitor) = open_bench_db(variant, dir.path());
            for _ in 0..200 {
                key += 1;
                one_commit(&db, key);
            }
            let before = monitor.as_ref().map(JournalMonitor::stats).unwrap_or_default();
            let cpu_before = cpu_seconds();
            let start = std::time::Instant::now();
            let mut commits = 0u64;
            while start.elapsed().as_secs() < secs {
                key += 1;
                one_commit(&db, key);
                commits += 1;
            }
            let rate = commits as f64 / start.elapsed().as_secs_f64();
            let cpu = match (cpu_before, cpu_seconds()) {
                (Some(a), Some(b)) => format!(", {:.0} µs CPU/commit", (b - a) * 1e6 / commits as f64),
                _ => String::new(),
            };
            let detail = match monitor.as_ref().map(JournalMonitor::stats) {
                Some(after) => format!(
                    " ({:.2} records/commit, {:.1} KiB/record, {} checkpoints)",
                    (after.records - before.records) as f64 / commits as f64,
                    (after.record_bytes - before.record_bytes) as f64
                        / 1024.0
                        / (after.records - before.records) as f64,
                    after.checkpoints - before.checkpoints
                ),
                None => String::new(),
            };
            println!("round {round} {variant:?}: {rate:.0} commits/s{cpu}{detail}");
            rates.push(rate);
            drop(db);
        }
        ratios.push(rates[1] / rates[0]);
        println!("round {round}: journal / plain = {:.2}", rates[1] / rates[0]);
    }
    ratios.sort_by(f64::total_cmp);
    println!("median ratio journal / plain: {:.2}", ratios[ratios.len() / 2]);
    // Finer interleaving against drift in the disk's speed: both open, 250 ms slices in turn.
    let (plain, _) = open_bench_db(Variant::Plain, dir.path());
    let (journal, _) = open_bench_db(Variant::Journal, dir.path());
    let mut totals = [(0u64, 0f64); 2];
    for _ in 0..(secs * rounds * 2) {
        for (i, db) in [&plain, &journal].into_iter().enumerate() {
            let start = std::time::Instant::now();
            while start.elapsed().as_millis() < 250 {
                key += 1;
                one_commit(db, key);
                totals[i].0 += 1;
            }
            totals[i].1 += start.elapsed().as_secs_f64();
        }
    }
    let [p, j] = totals.map(|(n, t)| n as f64 / t);
    println!(
        "250 ms slices, {}x each: plain {p:.0} commits/s, journal {j:.0} commits/s, ratio {:.2}",
        secs * rounds * 2,
        j / p
    );
    drop((plain, journal));
    let scattered = raw_sync_rate(dir.path(), false, 7, secs);
    let sequential = raw_sync_rate(dir.path(), true, 7, secs);
    println!(
        "raw floor: 7 scattered 4 KiB writes + fdatasync {scattered:.0}/s, one 28 KiB append + fdatasync \
         {sequential:.0}/s"
    );
}

#[test]
fn readers_run_alongside_commits() {
    let m = Machine::new(1, 0.0);
    let opts = JournalOptions { checkpoint_records: 7, ..options(64 << 10) };
    let db = Database::builder().create_with_backend(open_on(&m, &opts)).unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut seen = 0;
                while !done.load(Ordering::SeqCst) {
                    let rows = read_table(&db).unwrap();
                    // Commit i writes keys 0..=i, each holding its own number.
                    assert!(rows.iter().all(|(k, v)| v.len() == 600 && v[0] == *k as u8));
                    assert!(rows.len() >= seen, "a reader went back in time");
                    seen = rows.len();
                }
            });
        }
        for i in 0..150u64 {
            let txn = db.begin_write().unwrap();
            txn.open_table(TABLE).unwrap().insert(i, vec![i as u8; 600].as_slice()).unwrap();
            txn.commit().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    assert_eq!(read_table(&db).unwrap().len(), 150);
}

#[test]
fn stored_len_drops_exactly_the_trailing_zeros() {
    let mut rng = fastrand::Rng::with_seed(5);
    for _ in 0..5000 {
        let len = rng.usize(0..600);
        let mut bytes = vec![0u8; len];
        for _ in 0..rng.usize(0..4) {
            if len > 0 {
                bytes[rng.usize(0..len)] = rng.u8(1..);
            }
        }
        let naive = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        assert_eq!(stored_len(&bytes), naive, "{bytes:?}");
    }
}

/// A version-1 header slot made from `slot` (one written at the current version).
fn as_version_1(slot: &[u8]) -> Vec<u8> {
    let mut s = slot.to_vec();
    s[8..12].copy_from_slice(&1u32.to_le_bytes());
    s[SLOT_CHECKSUM_AT..SLOT_CHECKSUM_AT + 8].fill(0);
    let sum = xxh64(&s);
    s[SLOT_CHECKSUM_AT..SLOT_CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    s
}

#[test]
fn a_version_1_journal_opens_and_is_rewritten_at_the_current_version() {
    let m = Machine::new(1, 0.0);
    let mut rng = fastrand::Rng::with_seed(1);
    let mut model = Model::new();
    let db = Database::builder().create_with_backend(open_on(&m, &options(64 << 10))).unwrap();
    assert!(matches!(run_txn(&db, &mut rng, &mut model), TxnEnd::Committed));
    drop(db);
    let mut log = disk_bytes(&m.log);
    for slot in 0..2 {
        let at = slot * SLOT_LEN;
        if let Slot::Valid(_) = Header::decode(&log[at..at + SLOT_LEN]) {
            let old = as_version_1(&log[at..at + SLOT_LEN]);
            log[at..at + SLOT_LEN].copy_from_slice(&old);
        }
    }
    let version_of = |log: &[u8]| {
        let slots = [Header::decode(&log[..SLOT_LEN]), Header::decode(&log[SLOT_LEN..2 * SLOT_LEN])];
        slots
            .into_iter()
            .filter_map(|s| if let Slot::Valid(h) = s { Some(h) } else { None })
            .max_by_key(|h| h.generation)
    };
    assert_eq!(version_of(&log).unwrap().version, 1);
    let old = Machine::with_disks(2, 0.0, Disk::with_bytes(disk_bytes(&m.data)), Disk::with_bytes(log));
    let db = Database::builder().create_with_backend(open_on(&old, &options(64 << 10))).unwrap();
    assert_eq!(read_table(&db).unwrap(), model, "a version-1 journal serves unchanged");
    let header = version_of(&disk_bytes(&old.log)).unwrap();
    assert_eq!(header.version, FORMAT_VERSION, "rewritten before anything new is appended");
}

/// What a power cut would leave of `m` now, as another machine; `m` keeps running.
fn durable_copy(m: &Machine) -> Machine {
    let durable = |disk: &Arc<Mutex<Disk>>| Disk::with_bytes(disk.lock().unwrap().durable.clone());
    Machine::with_disks(m.seed.wrapping_add(3), 0.0, durable(&m.data), durable(&m.log))
}

#[test]
fn notes_wait_across_a_close_and_are_retired_by_the_record_after_their_commit() {
    let m = Machine::new(1, 0.0);
    let opts = options(1 << 20);
    let journal = open_on(&m, &opts);
    let monitor = journal.monitor();
    let db = Database::builder().create_with_backend(journal).unwrap();
    assert!(monitor.append_note(&note_bytes(1, b"one")).unwrap());
    assert!(monitor.append_note(&note_bytes(2, b"two")).unwrap());
    assert_eq!(monitor.stats().notes, 2);
    // A clean close with notes waiting keeps the records: no checkpoint may retire them.
    drop(db);
    let m = m.reboot();
    let journal = open_on(&m, &opts);
    assert_eq!(journal.recovery().pending_notes, 2);
    let monitor = journal.monitor();
    let notes = monitor.take_recovered_notes();
    assert_eq!(notes.iter().map(|n| note_insert(n)).collect::<Vec<_>>(), [(1, b"one".to_vec()), (2, b"two".to_vec())]);
    assert!(monitor.take_recovered_notes().is_empty(), "handed over once");
    let db = Database::builder().create_with_backend(journal).unwrap();
    let mut pending: Notes = notes.iter().map(|n| note_insert(n)).collect();
    assert!(matches!(commit_notes(&db, &monitor, &mut pending), TxnEnd::Committed));
    // Held, but no record says so yet: a crash now redoes them (idempotent by contract).
    let crashed = durable_copy(&m);
    assert_eq!(open_on(&crashed, &opts).recovery().pending_notes, 2);
    // One more record (here a note) retires them; only the new note waits.
    assert!(monitor.append_note(&note_bytes(3, b"three")).unwrap());
    let crashed = durable_copy(&m);
    let journal = open_on(&crashed, &opts);
    assert_eq!(journal.monitor().take_recovered_notes(), vec![note_bytes(3, b"three")]);
    drop(db);
}

#[test]
fn notes_stop_at_a_quarter_of_the_region_and_a_checkpoint_makes_room_when_none_waits() {
    let m = Machine::new(1, 0.0);
    let region = 256 << 10;
    let journal = open_on(&m, &options(region));
    let monitor = journal.monitor();
    let db = Database::builder().create_with_backend(journal).unwrap();
    // The region holds the records of the database's creation, then the notes.
    let used = monitor.stats().record_bytes;
    let mut appended = 0;
    while monitor.append_note(&note_bytes(appended, &[7; 100])).unwrap() {
        appended += 1;
    }
    assert_eq!(appended, (region / NOTE_ROOM_DIVISOR - used) / ALIGN, "one aligned record each, up to a quarter");
    let checkpoints = monitor.stats().checkpoints;
    let mut pending: Notes = (0..appended).map(|k| (k, vec![7; 100])).collect();
    assert!(matches!(commit_notes(&db, &monitor, &mut pending), TxnEnd::Committed));
    assert!(monitor.append_note(&note_bytes(99, b"after")).unwrap(), "room again");
    assert_eq!(monitor.stats().checkpoints, checkpoints + 1, "made by a checkpoint");
    drop(db);
}

// ---------------------------------------------------------------------------------------------
// A journal belongs to one file; damage is refused, never replayed up to.
// ---------------------------------------------------------------------------------------------

/// The records of the current generation in a journal's bytes: (offset, size), in order.
fn record_spans(log: &[u8]) -> Vec<(u64, u64)> {
    let headers: Vec<Header> = (0..2)
        .filter_map(|i| match Header::decode(&log[i * SLOT_LEN..(i + 1) * SLOT_LEN]) {
            Slot::Valid(h) => Some(h),
            _ => None,
        })
        .collect();
    let current = headers.iter().max_by_key(|h| h.generation).expect("a valid header");
    let mut spans = Vec::new();
    let mut pos = REGION_START;
    let mut seq = current.next_seq;
    loop {
        let key = RecordKey { journal_id: &current.journal_id, generation: current.generation, seq };
        let end = (pos as usize + (current.region_len as usize)).min(log.len());
        match decode_record(&log[pos as usize..end], &key) {
            Ok(Some(r)) => {
                spans.push((pos, r.size));
                pos += r.size;
                seq += 1;
            }
            _ => return spans,
        }
    }
}

/// Nine barriers, a checkpoint after the sixth: generation 2 holds records 7, 8 and 9. Returns
/// the machine after a power cut, the state after every barrier, and the claim its file holds.
fn nine_barriers() -> (Machine, Vec<Vec<u8>>, FileClaim) {
    let m = Machine::new(11, 0.0);
    let opts = JournalOptions { checkpoint_records: 6, ..options(256 << 10) };
    let j = open_on(&m, &opts);
    let monitor = j.monitor();
    let mut states = Vec::new();
    for i in 0..9u8 {
        j.set_len(40_000 + u64::from(i) * 3000).unwrap();
        j.write(u64::from(i) * 2500, &pattern(i, 7000 + usize::from(i) * 300)).unwrap();
        j.sync_data().unwrap();
        states.push(contents(&j));
    }
    assert_eq!(monitor.stats().checkpoints, 1);
    let claim = FileClaim { journal_id: monitor.journal_id(), next_seq: 6, open: true };
    (m.reboot(), states, claim)
}

fn open_bytes(data: &Disk, log: Vec<u8>, claim: Option<&FileClaim>) -> Result<Vec<u8>, JournalError> {
    let m = Machine::with_disks(5, 0.0, data.clone(), Disk::with_bytes(log));
    let (d, l) = m.backends();
    let opts = JournalOptions { checkpoint_records: 6, ..options(256 << 10) };
    JournalBackend::open_claimed(d, l, &opts, claim).map(|j| contents(&j))
}

#[test]
fn damage_anywhere_but_the_newest_record_is_refused_never_replayed_short() {
    let (m, states, claim) = nine_barriers();
    let data = m.data.lock().unwrap().clone();
    let log = m.log.lock().unwrap().durable.clone();
    let (last, before_last) = (&states[8], &states[7]);
    assert_eq!(open_bytes(&data, log.clone(), Some(&claim)).unwrap(), *last, "undamaged");
    let spans = record_spans(&log);
    assert_eq!(spans.len(), 3, "records 7, 8 and 9 in generation 2");
    let current_slot = (0..2).find(|&i| matches!(Header::decode(&log[i * SLOT_LEN..(i + 1) * SLOT_LEN]), Slot::Valid(ref h) if h.generation == 2)).unwrap();
    let mut cases: Vec<(String, Vec<u8>, &str)> = Vec::new();
    let flip = |at: usize| {
        let mut l = log.clone();
        l[at] ^= 0x10;
        l
    };
    // Every field of both header slots, and bytes of the bound first page and the checksum.
    for slot in 0..2 {
        for field in
            [0, 8, 12, 16, 24, 32, 40, 48, 56, 64, 70, 1000, SLOT_CHECKSUM_AT, HEAD_LEN, HEAD_LEN + 300, SLOT_LEN - 1]
        {
            let expect = if slot == current_slot { "refused" } else { "exact" };
            cases.push((format!("slot {slot} byte {field}"), flip(slot * SLOT_LEN + field), expect));
        }
    }
    // The first, the middle and the last record: every header field, the entries, the checksum.
    for (i, &(pos, size)) in spans.iter().enumerate() {
        let expect = if i + 1 == spans.len() { "newest" } else { "refused" };
        for at in [0, 4, 8, 20, 24, 32, 40, 48, 56, 64, 72, 80, 88, 300, 2000] {
            cases.push((format!("record {i} byte {at}"), flip((pos + at) as usize), expect));
        }
        let _ = size;
    }
    // Truncations: at every record boundary, inside records, inside the header slots, to nothing.
    let mut cuts = vec![0, 100, SLOT_LEN as u64, SLOT_LEN as u64 + 4000, REGION_START, log.len() as u64 - 1];
    for &(pos, size) in &spans {
        cuts.extend([pos, pos + 1, pos + 72, pos + size / 2, pos + size - 1, pos + size]);
    }
    for cut in cuts {
        cases.push((format!("cut at {cut}"), log[..cut as usize].to_vec(), "refused"));
    }
    // Zeroed, emptied.
    cases.push(("zeroed".into(), vec![0; log.len()], "refused"));
    for (what, bytes, expect) in cases {
        let outcome = open_bytes(&data, bytes, Some(&claim));
        match (expect, &outcome) {
            (_, Ok(state)) if state == last => assert_ne!(expect, "refused", "{what}: served, but refusal expected"),
            ("newest", Ok(state)) => {
                assert_eq!(state, before_last, "{what}: the newest commit's own bytes roll back to the one before")
            }
            (_, Ok(_)) => panic!("{what}: served a state other than the acknowledged one"),
            ("exact", Err(e)) => panic!("{what}: refused ({e}), but nothing acknowledged is lost"),
            (_, Err(e)) => assert!(!e.to_string().contains("full while notes wait"), "{what}: {e}"),
        }
    }
}

#[test]
fn both_header_slots_are_written_at_creation() {
    let m = Machine::new(1, 0.0);
    drop(open_on(&m, &options(64 << 10)));
    let log = disk_bytes(&m.log);
    let slot = |i: usize| Header::decode(&log[i * SLOT_LEN..(i + 1) * SLOT_LEN]);
    let (Slot::Valid(a), Slot::Valid(b)) = (slot(0), slot(1)) else { panic!("both slots valid") };
    assert_eq!((a.generation, b.generation), (1, 0));
    assert_eq!(a.journal_id, b.journal_id);
    // A write to the new journal, then slot 0 damaged: slot 1 is whole, and the record of
    // generation 1 beyond it says the damaged slot was the current one.
    let m = m.reboot();
    let j = open_on(&m, &options(64 << 10));
    j.write(0, &pattern(1, 5000)).unwrap();
    j.sync_data().unwrap();
    let m = m.reboot();
    let mut log = disk_bytes(&m.log);
    log[40] ^= 1;
    let err = open_bytes(&m.data.lock().unwrap().clone(), log, None).unwrap_err();
    assert!(matches!(err, JournalError::Damaged(_)), "{err}");
}

#[test]
fn a_truncated_journal_is_refused_with_its_true_cause() {
    let (m, _, claim) = nine_barriers();
    let data = m.data.lock().unwrap().clone();
    let log = m.log.lock().unwrap().durable.clone();
    let spans = record_spans(&log);
    let inside = (spans[1].0 + 100) as usize;
    let err = open_bytes(&data, log[..inside].to_vec(), Some(&claim)).unwrap_err();
    assert!(matches!(err, JournalError::Truncated { .. }), "{err}");
    assert!(err.to_string().contains("truncated") && err.to_string().contains(&inside.to_string()), "{err}");
}

#[test]
fn a_claim_refuses_another_journal_an_older_copy_and_a_missing_one_unchanged() {
    let older = {
        // The journal as it was when created, before any record: a copy taken then.
        let m = Machine::new(11, 0.0);
        drop(open_on(&m, &JournalOptions { checkpoint_records: 6, ..options(256 << 10) }));
        m.log.lock().unwrap().durable.clone()
    };
    let (m, states, claim) = nine_barriers();
    let data = m.data.lock().unwrap().clone();
    let log = m.log.lock().unwrap().durable.clone();
    assert_eq!(open_bytes(&data, log.clone(), Some(&claim)).unwrap(), states[8]);
    // Another journal (its id differs), with no records to catch it by.
    let err = open_bytes(&data, older.clone(), Some(&claim)).unwrap_err();
    assert!(matches!(err, JournalError::NotThisFilesJournal { .. }), "{err}");
    // The same journal, earlier: its records end before the file's commits.
    let mut earlier = older;
    let id = &log[16..32];
    for slot in 0..2 {
        let Slot::Valid(mut h) = Header::decode(&earlier[slot * SLOT_LEN..(slot + 1) * SLOT_LEN]) else { panic!() };
        h.journal_id.copy_from_slice(id);
        earlier[slot * SLOT_LEN..(slot + 1) * SLOT_LEN].copy_from_slice(&h.encode());
    }
    let err = open_bytes(&data, earlier.clone(), Some(&claim)).unwrap_err();
    assert!(matches!(err, JournalError::Older { .. }), "{err}");
    // Without the claim that copy would be rebound and the commits after it lost.
    let served = open_bytes(&data, earlier, None).unwrap();
    assert_ne!(served, states[8]);
    // Missing (empty) while the file says it was open: refused.
    assert!(matches!(open_bytes(&data, Vec::new(), Some(&claim)), Err(JournalError::Missing)));
    // Closed cleanly: a new journal is made.
    let clean = FileClaim { open: false, ..claim };
    assert_eq!(open_bytes(&data, Vec::new(), Some(&clean)).unwrap(), data.volatile);
}

/// Both header slots zeroed (or one zeroed, one torn) over a journal that holds records is
/// damage, not a journal still being created: refused, and the records are not wiped.
#[test]
fn zeroed_header_slots_over_records_are_refused_not_wiped() {
    let (m, _, _) = nine_barriers();
    let data = m.data.lock().unwrap().clone();
    let log = m.log.lock().unwrap().durable.clone();
    assert!(!record_spans(&log).is_empty());
    for torn_second in [false, true] {
        let mut damaged = log.clone();
        damaged[..SLOT_LEN].fill(0);
        if torn_second {
            damaged[SLOT_LEN + 100] ^= 1;
        } else {
            damaged[SLOT_LEN..2 * SLOT_LEN].fill(0);
        }
        let m2 = Machine::with_disks(5, 0.0, data.clone(), Disk::with_bytes(damaged.clone()));
        let (d, l) = m2.backends();
        let opts = JournalOptions { checkpoint_records: 6, ..options(256 << 10) };
        let err = JournalBackend::open_claimed(d, l, &opts, None).err();
        assert!(matches!(err, Some(JournalError::Damaged(_) | JournalError::NotAJournal)), "{err:?}");
        assert_eq!(disk_bytes(&m2.log), damaged, "the journal is left as it was");
        assert_eq!(disk_bytes(&m2.data), data.volatile, "the file is left as it was");
    }
}

/// A header whose region length would take the region's end past 2^64 is refused as damage.
#[test]
fn a_header_region_past_the_end_of_the_address_space_is_refused() {
    let (m, _, _) = nine_barriers();
    let data = m.data.lock().unwrap().clone();
    let mut log = m.log.lock().unwrap().durable.clone();
    for slot in 0..2 {
        let Slot::Valid(mut h) = Header::decode(&log[slot * SLOT_LEN..(slot + 1) * SLOT_LEN]) else { panic!() };
        h.region_len = u64::MAX - (ALIGN - 1);
        log[slot * SLOT_LEN..(slot + 1) * SLOT_LEN].copy_from_slice(&h.encode());
    }
    let err = open_bytes(&data, log, None).err();
    assert!(matches!(err, Some(JournalError::Damaged(_))), "{err:?}");
}

#[test]
fn an_emptied_file_is_not_bound_to_a_journal_of_a_file_with_content() {
    let (m, _, _) = nine_barriers();
    let log = m.log.lock().unwrap().durable.clone();
    // Bring the journal to a checkpoint (no records) over its file, then empty the file.
    let m2 = Machine::with_disks(6, 0.0, m.data.lock().unwrap().clone(), Disk::with_bytes(log));
    let j = open_on(&m2, &JournalOptions { checkpoint_records: 6, ..options(256 << 10) });
    j.close().unwrap();
    let log = disk_bytes(&m2.log);
    let err = open_bytes(&Disk::default(), log, None).unwrap_err();
    assert!(matches!(err, JournalError::FileEmptied { .. }), "{err}");
}
