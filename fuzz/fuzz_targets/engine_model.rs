//! The engine and the real store against the brute-force reference, in redb's fuzzing style: an
//! arbitrary sequence of operations, each applied to the engine (committing its effects to a redb
//! file behind its journal, as in production) and to `Reference`, then compared. Restarts
//! rebuild the engine from the file; a crash fails the Nth write or sync of a commit (the
//! journal's append or sync, or a checkpoint's writes and syncs of either file), and the engine
//! rebuilt from the file, its journal replayed, must hold exactly the state before that commit or
//! after it, whole.
//!
//! A journal damaged at rest after a crash (a flipped byte in a header slot or in a record
//! before its newest one) is refused, or serves exactly the committed state, never less.
//!
//! Section 9 rides along: every acquire is peeked first (the peek must equal it and leave the
//! engine byte for byte as it was), figures are compared with the reference's, permits are
//! settled up, down, again and after their grant left, released with costs, and throttles
//! lifted. Each bucket is named with two windows, so rule 3's retention is exercised.
//!
//! The line (section 12) rides along too: acquires queue, ask again with their tickets (the
//! request a ticket binds, or another: a bad request that changes nothing), and leave the line;
//! every grant is checked against the reference's live tickets (none older waits in any of its
//! buckets) and the oldest live ticket waits for nothing but its own request. The file keeps no
//! tickets (format version 5): after a restart or a crash every ticket live at the file's latest
//! instant keeps its place and lapses no sooner than the restart plus its grace
//! (`Reference::restart`).
//!
//! Token buckets (section 13) ride along: a limit may name the bucket `t{n}` (refill, `perMs`,
//! burst and initial fixed per key, as in tests.rs) instead of the window `b{n}`, with or without
//! `concurrent`; settles name them too, and their levels are kept in the file and refilled by
//! the time that passed after every restart and crash.
//!
//! Adaptive ceilings (section 14) ride along: a window limit may carry `adapt` (three variants
//! per key, so a ceiling is seen clamped to each host's own bounds), and the token buckets `t0`
//! to `t2` always carry one each (`C` in place of `refill`, the burst scaled with it; one
//! variant per key, so every request reads a bucket with the same figures at any one instant),
//! settles and releases carry `outcome`, and a throttle may name a permit (a `limited` outcome).
//! The reference keeps its own ceilings, ordering grants and cuts by when they were made; every
//! ceiling the engine keeps is compared with it after every operation, through restarts and
//! crashes (a ceiling free to go may go at any time until the next sweep, never sooner).
//!
//! Checked after every operation: identical decisions and `retryAt`s, no window over its
//! `calls` (for buckets named with one window and never settled up), no committed change lost
//! (`facts`), and nothing held past its instant.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use redb_limiter::Millis;
use redb_limiter::engine::model::Reference;
use redb_limiter::engine::{Decision, Effect, Engine, EngineConfig, Facts, NoTicket, PermitId, TicketId};
use redb_limiter::request::Cost as SettledCost;
use redb_limiter::request::{AcquireRequest, Adapt, BucketLimit, Limit, Signal, ThrottleRequest, WindowLimit};
use redb_limiter::store::faulty::{FaultPlan, faulty_journal_opener};
use redb_limiter::store::{Store, file_opener};

/// Every bucket key has a fixed `calls` and two windows it may be named with (see tests.rs).
const SHAPES: [(u64, [u64; 2]); 4] = [(3, [100, 100]), (5, [250, 900]), (2, [40, 400]), (8, [1000, 1000])];
/// Every token bucket key `t{n}` has fixed figures: (refill, perMs, burst, initial) (see tests.rs).
const TOKEN_SHAPES: [(u64, u64, u64, u64); 4] = [(3, 1000, 5, 5), (1, 700, 2, 0), (7, 300, 7, 3), (2, 50, 10, 10)];
/// The `adapt_of` variant each token bucket key `t{n}` always carries (`None`: never adapted), so
/// every request judges a bucket with the same figures at any one instant (see tests.rs).
const TOKEN_ADAPT: [Option<u64>; 4] = [Some(0), Some(1), Some(2), None];
const CALLERS: [&str; 2] = ["c0", "c1"];
const RECHECK_MS: u64 = 250;
/// The line's horizon here: short, so that requests beyond it are common.
const HORIZON_MS: u64 = 2_500;

fn config(seed: u64) -> EngineConfig {
    EngineConfig { line_horizon_ms: HORIZON_MS, ..EngineConfig::with(RECHECK_MS, seed) }
}
const T0: Millis = Millis(1_800_000_000_000);
/// Operations per run beyond this are ignored, to keep runs fast.
const MAX_OPS: usize = 64;
/// Limits per request beyond this are ignored.
const MAX_LIMITS: usize = 4;
/// A commit of a few effects makes about 8 to 16 writes and syncs.
const MAX_CRASH_OPS: u64 = 16;

/// An integer in `MIN..=MAX`.
#[derive(Debug, Clone, Copy)]
struct Between<const MIN: u64, const MAX: u64>(u64);

impl<'a, const MIN: u64, const MAX: u64> Arbitrary<'a> for Between<MIN, MAX> {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Between(u.int_in_range(MIN..=MAX)?))
    }

    fn size_hint(_depth: usize) -> (usize, Option<usize>) {
        (0, Some(size_of::<u64>()))
    }
}

/// A cost: 0 (fills nothing), small, or over every shape's `calls` for some buckets.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Cost {
    Zero,
    Small(Between<1, 3>),
    Over(Between<5, 20>),
}

#[derive(Arbitrary, Debug, Clone)]
struct LimitSpec {
    bucket: Between<0, 3>,
    long: bool,
    window: bool,
    /// The token bucket `t{bucket}` instead of the window `b{bucket}`.
    tokens: bool,
    concurrent: Option<Between<1, 3>>,
    cost: Cost,
    hold_ms: Between<1, 2000>,
    /// `adapt` (section 14), one of [`adapt_of`]'s variants, on a window (a token bucket carries
    /// its key's own, `TOKEN_ADAPT`).
    adapt: Option<Between<0, 2>>,
}

/// The `adapt` variants a bucket of `calls` is named with (as in tests.rs): hosts naming one
/// bucket with different bounds see its ceiling clamped to their own.
fn adapt_of(calls: u64, variant: u64) -> Adapt {
    match variant {
        0 => Adapt { min: 1, max: calls * 2, increase: 1, keep_pct: 50 },
        1 => Adapt { min: calls.div_ceil(2), max: calls + 1, increase: 2, keep_pct: 67 },
        _ => Adapt { min: 1, max: calls, increase: 3, keep_pct: 99 },
    }
}

/// An outcome reported on a permit (section 14).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Outcome {
    Clean,
    Limited,
}

impl Outcome {
    fn signal(self) -> Signal {
        match self {
            Outcome::Clean => Signal::Clean,
            Outcome::Limited => Signal::Limited,
        }
    }
}

#[derive(Arbitrary, Debug, Clone)]
struct AcquireOp {
    caller: Between<0, 1>,
    limits: Vec<LimitSpec>,
    permit: bool,
    report: bool,
    hold_ms: Between<1, 2000>,
    line: LineChoice,
    grace_ms: Between<100, 3000>,
    /// `maxWaitMs` (section 12.9), when given.
    max_wait_ms: Option<Between<1, 6000>>,
}

/// How an acquire takes part in the line.
#[derive(Arbitrary, Debug, Clone)]
enum LineChoice {
    None,
    Queue,
    /// One of the tickets issued so far, with this request (most often not the one it binds).
    Issued(u8),
    /// Any string: almost never one of ours.
    Text(String),
}

/// What a settle names: window or token buckets (maybe not of the grant) and their real costs.
#[derive(Arbitrary, Debug, Clone)]
struct SettleOp {
    permit: PermitChoice,
    costs: Vec<(Between<0, 3>, bool, Cost)>,
    /// `outcome` on the settle or release (section 14).
    outcome: Option<Outcome>,
}

#[derive(Arbitrary, Debug, Clone)]
enum PermitChoice {
    /// One of the permits issued so far (released, lapsed or lost ones included).
    Issued(u8),
    /// Any string: almost never one of ours.
    Text(String),
}

#[derive(Arbitrary, Debug, Clone)]
struct ThrottleOp {
    caller: Between<0, 1>,
    /// `until` relative to now; in the past changes nothing.
    offset: Between<0, 6000>,
    /// A permit whose call was limited (section 14).
    permit: Option<PermitChoice>,
}

/// A change to the state, which commits its effects.
#[derive(Arbitrary, Debug, Clone)]
enum Change {
    Acquire(AcquireOp),
    Release(PermitChoice),
    Throttle(ThrottleOp),
    Sweep,
    Settle(SettleOp),
    /// A release with costs (an empty list: a plain release).
    ReleaseWith(SettleOp),
    Lift(Between<0, 1>),
    /// The host of an issued ticket asks again with the request it binds.
    AskAgain(u8, Between<100, 3000>),
    /// `release {ticket}` of an issued ticket (or of any string).
    Leave(LineChoice),
}

#[derive(Arbitrary, Debug, Clone)]
enum Step {
    Zero,
    /// To the nth instant at which a grant, place or throttle leaves (an exact edge).
    Edge(u8),
    By(Between<0, 3000>),
    Jump(u32),
    /// To the nth live ticket's retryAt.
    Retry(u8),
}

#[derive(Arbitrary, Debug, Clone)]
enum FuzzOperation {
    Acquire(AcquireOp),
    Release(PermitChoice),
    Throttle(ThrottleOp),
    Sweep,
    Settle(SettleOp),
    ReleaseWith(SettleOp),
    Lift(Between<0, 1>),
    AskAgain(u8, Between<100, 3000>),
    Leave(LineChoice),
    /// Decides as an acquire, changing nothing.
    Peek(AcquireOp),
    Advance(Step),
    /// The same acquire again and again, `step` apart: long windows, many prunes.
    Burst {
        acquire: AcquireOp,
        times: Between<2, 48>,
        step: Between<0, 40>,
    },
    /// Close the file and rebuild the engine from it.
    Restart,
    /// Apply the change, then fail its commit after `after` writes or syncs: a crash.
    CrashAfter {
        after: Between<0, MAX_CRASH_OPS>,
        change: Change,
    },
    /// A crash (the store dropped without closing), then one bit of the journal flipped at
    /// `at` (taken modulo the bytes before its newest record), then a reopen.
    DamageJournal {
        at: u32,
        bit: u8,
    },
}

impl FuzzOperation {
    fn change(&self) -> Option<Change> {
        match self {
            FuzzOperation::Acquire(op) => Some(Change::Acquire(op.clone())),
            FuzzOperation::Release(p) => Some(Change::Release(p.clone())),
            FuzzOperation::Throttle(op) => Some(Change::Throttle(op.clone())),
            FuzzOperation::Sweep => Some(Change::Sweep),
            FuzzOperation::Settle(op) => Some(Change::Settle(op.clone())),
            FuzzOperation::ReleaseWith(op) => Some(Change::ReleaseWith(op.clone())),
            FuzzOperation::Lift(caller) => Some(Change::Lift(*caller)),
            FuzzOperation::AskAgain(nth, grace) => Some(Change::AskAgain(*nth, *grace)),
            FuzzOperation::Leave(choice) => Some(Change::Leave(choice.clone())),
            FuzzOperation::Peek(_)
            | FuzzOperation::Advance(_)
            | FuzzOperation::Burst { .. }
            | FuzzOperation::Restart
            | FuzzOperation::CrashAfter { .. }
            | FuzzOperation::DamageJournal { .. } => None,
        }
    }
}

fn to_request(op: &AcquireOp) -> AcquireRequest {
    let mut limits: Vec<Limit> = Vec::new();
    for spec in op.limits.iter().take(MAX_LIMITS) {
        let key = format!("{}{}", if spec.tokens { "t" } else { "b" }, spec.bucket.0);
        if limits.iter().any(|l| l.key == key) {
            continue; // bucket keys are unique within a request; the first stays, in order
        }
        let (calls, pers) = SHAPES[spec.bucket.0 as usize];
        let per_ms = pers[usize::from(spec.long)];
        let concurrent = spec.concurrent.map(|c| c.0);
        let (refill, token_ms, burst, initial) = TOKEN_SHAPES[spec.bucket.0 as usize];
        let tokens = spec.tokens.then_some(BucketLimit { refill, per_ms: token_ms, burst, initial });
        let window = (!spec.tokens && (spec.window || concurrent.is_none())).then_some(WindowLimit { calls, per_ms });
        limits.push(Limit {
            key,
            window,
            bucket: tokens,
            concurrent,
            cost: cost_of(spec.cost),
            hold_ms: spec.hold_ms.0,
            adapt: if spec.tokens {
                TOKEN_ADAPT[spec.bucket.0 as usize].map(|v| adapt_of(refill, v))
            } else {
                spec.adapt.filter(|_| window.is_some()).map(|v| adapt_of(calls, v.0))
            },
        });
    }
    let mut req = AcquireRequest::new(CALLERS[op.caller.0 as usize], limits)
        .and_then(|r| r.with_hold_ms(op.hold_ms.0))
        .expect("within the wire's bounds");
    req.permit = op.permit;
    req.report = op.report;
    req.grace_ms = op.grace_ms.0;
    req.max_wait_ms = op.max_wait_ms.map(|w| w.0);
    req
}

/// Facts without the line, which a restart resumes (its lapses move).
fn kept(mut facts: Facts) -> Facts {
    facts.tickets.clear();
    facts.lines.clear();
    facts
}

fn cost_of(cost: Cost) -> u64 {
    match cost {
        Cost::Zero => 0,
        Cost::Small(c) => c.0,
        Cost::Over(c) => c.0,
    }
}

/// A settle's costs: unique keys, in the order first named.
fn to_costs(op: &SettleOp) -> Vec<SettledCost> {
    let mut costs: Vec<SettledCost> = Vec::new();
    for (bucket, tokens, cost) in op.costs.iter().take(MAX_LIMITS) {
        let key = format!("{}{}", if *tokens { "t" } else { "b" }, bucket.0);
        if !costs.iter().any(|c| c.key == key) {
            costs.push(SettledCost::new(key, cost_of(*cost)));
        }
    }
    costs
}

/// Where the per-run files go: memory when the machine has a tmpfs there.
fn scratch_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
    })
}

struct Harness {
    _dir: tempfile::TempDir,
    path: PathBuf,
    plan: Arc<FaultPlan>,
    store: Option<Store>,
    /// Whether `store` was opened through the fault-injecting backend.
    faulty: bool,
    engine: Engine,
    seed: u64,
    reference: Reference,
    now: Millis,
    /// The clock floor the file holds: the `now` of its latest commit.
    durable_floor: Millis,
    issued: Vec<PermitId>,
    /// Every ticket issued, with the request it binds.
    tickets: Vec<(TicketId, AcquireRequest)>,
    /// The latest change was a sweep: no ceiling free to go may be kept after it.
    swept: bool,
}

impl Harness {
    fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("engine_model").tempdir_in(scratch_root()).expect("temp dir");
        let path = dir.path().join("limiter.redb");
        let store = Store::open(&path, &file_opener()).expect("a new file opens");
        let seed = 1;
        Harness {
            _dir: dir,
            path,
            plan: FaultPlan::new(),
            store: Some(store),
            faulty: false,
            engine: Engine::new(config(seed)),
            seed,
            reference: Reference::default(),
            now: T0,
            durable_floor: Millis::ZERO,
            issued: Vec::new(),
            tickets: Vec::new(),
            swept: false,
        }
    }

    fn store(&mut self) -> &mut Store {
        self.store.as_mut().expect("the store is open between operations")
    }

    /// Commits `effects` as the limiter does a request's: only when there are some.
    fn commit(&mut self, effects: &[Effect]) {
        self.commit_with(effects, false);
    }

    /// Commits `effects` as the limiter does a sweep's or a reopen's, deleting what is doomed.
    fn commit_and_tidy(&mut self, effects: &[Effect]) {
        self.commit_with(effects, true);
    }

    fn commit_with(&mut self, effects: &[Effect], tidy: bool) {
        if effects.is_empty() {
            return;
        }
        let now = self.now;
        let store = self.store();
        if tidy { store.commit_and_tidy(effects, now) } else { store.commit(effects, now) }.expect("commit");
        self.durable_floor = now;
    }

    fn run(&mut self, op: &FuzzOperation) {
        self.reference.advance(self.now);
        match op {
            FuzzOperation::Peek(op) => {
                let r = to_request(op);
                let before = format!("{:?}", self.engine);
                let peeked = self.engine.peek(&r, self.now).map(|p| (p.retry_at, p.reason, p.limit));
                assert_eq!(format!("{:?}", self.engine), before, "a peek changed the engine");
                assert_eq!(peeked, self.reference.decide(&r, self.now, RECHECK_MS), "peek {r:?}");
                assert_eq!(self.engine.figures(&r, self.now), self.reference.figures(&r, self.now));
            }
            FuzzOperation::Advance(step) => {
                self.now = match step {
                    Step::Zero => self.now,
                    Step::Edge(n) => {
                        let edges = self.reference.edges(self.now);
                        if edges.is_empty() { self.now } else { edges[usize::from(*n) % edges.len()] }
                    }
                    Step::By(ms) => self.now.plus(ms.0),
                    Step::Jump(ms) => self.now.plus(u64::from(*ms)),
                    Step::Retry(n) => {
                        let now = self.now;
                        let retries: Vec<Millis> =
                            self.reference.tickets.values().map(|t| t.state.retry_at).filter(|t| *t > now).collect();
                        if retries.is_empty() { now } else { retries[usize::from(*n) % retries.len()] }
                    }
                };
            }
            FuzzOperation::Restart => {
                self.store = None;
                let store = Store::open(&self.path, &file_opener()).expect("reopen after a clean close");
                self.faulty = false;
                let before = kept(self.engine.facts(self.now));
                let latest = self.durable_floor;
                let floor = self.rebuild(store);
                assert_eq!(floor, latest, "the floor is the now of the latest commit");
                assert_eq!(kept(self.engine.facts(self.now)), before, "rebuilt from the file");
                self.check_forgotten();
            }
            FuzzOperation::Burst { acquire, times, step } => {
                for _ in 0..times.0 {
                    let mut effects = Vec::new();
                    self.apply(&Change::Acquire(acquire.clone()), &mut effects);
                    self.commit(&effects);
                    self.check();
                    self.now = self.now.plus(step.0);
                    self.reference.advance(self.now);
                }
            }
            FuzzOperation::CrashAfter { after, change } => self.crash_after(after.0, change),
            FuzzOperation::DamageJournal { at, bit } => self.damage_journal(*at, *bit),
            other => {
                let change = other.change().expect("every other operation is a change");
                let mut effects = Vec::new();
                self.apply(&change, &mut effects);
                if matches!(change, Change::Sweep) { self.commit_and_tidy(&effects) } else { self.commit(&effects) }
            }
        }
        self.check();
    }

    /// A fresh engine loaded from `store`, with what lapsed pruned and committed; returns the
    /// clock floor the file held.
    fn rebuild(&mut self, store: Store) -> Millis {
        self.seed += 1;
        let mut engine = Engine::new(config(self.seed));
        let floor = store.load(&mut engine).expect("load");
        assert!(floor <= self.now, "the floor {floor:?} is ahead of now {:?}", self.now);
        self.durable_floor = floor;
        let mut effects = Vec::new();
        engine.resume_line(floor, self.now, &mut effects);
        engine.finish_restore(self.now, &mut effects);
        self.engine = engine;
        self.store = Some(store);
        // The file keeps the tickets: each one live at `floor` resumes its place.
        self.reference.restart(floor, self.now, HORIZON_MS);
        self.commit_and_tidy(&effects);
        // The restore pruned the file too: it keeps exactly the grants that still count.
        let live: usize = self.engine.facts(self.now).buckets.values().map(|(grants, _)| grants.len()).sum();
        assert_eq!(self.store().grant_rows().expect("count the grants"), live as u64, "stale grants in the file");
        floor
    }

    fn crash_after(&mut self, after: u64, change: &Change) {
        if !self.faulty {
            // The same file through the fault-injecting backend; the engine already matches it.
            self.store = None;
            self.store = Some(
                Store::open(&self.path, &faulty_journal_opener(self.plan.clone())).expect("reopen through the plan"),
            );
            self.faulty = true;
        }
        let before = self.reference.clone();
        let floor_before = self.durable_floor;
        let mut effects = Vec::new();
        self.apply(change, &mut effects);
        if effects.is_empty() {
            return; // nothing to commit, as in the limiter
        }
        self.plan.fail_after(after);
        let now = self.now;
        let result = self.store().commit(&effects, now);
        let fired = self.plan.fired();
        if result.is_ok() {
            assert!(!fired, "a commit succeeded although a fault fired in it");
            self.plan.disarm();
            self.durable_floor = now;
            return;
        }
        assert!(fired, "a commit failed with no fault: {result:?}");
        // The process dies here: the database is dropped with its backend still failing.
        self.store = None;
        self.plan.disarm();
        let store = Store::open(&self.path, &file_opener()).expect("reopen after a crash");
        self.faulty = false;
        let floor = self.rebuild(store);
        // A fault in the final sync may leave the whole batch in the file; a fault before it
        // leaves none of it. Nothing in between.
        // (The reference was restarted at `floor` by the rebuild; the state before, likewise.)
        let mut before = before;
        before.restart(floor, now, HORIZON_MS);
        let facts = self.engine.facts(now);
        let landed = facts == self.reference.facts(now);
        let lost = facts == before.facts(now);
        assert!(landed || lost, "after a failed commit the file holds neither the state before nor after it");
        if !landed {
            self.reference = before;
            assert_eq!(floor, floor_before, "a lost commit left its floor");
        } else if !lost {
            assert_eq!(floor, now, "a landed commit lost its floor");
        }
        self.check_forgotten();
    }

    /// Drops the store without closing it (a crash), flips one bit of the journal before its
    /// newest record, and reopens: a refusal is right (then the undamaged journal opens), and
    /// anything served must be exactly the committed state.
    fn damage_journal(&mut self, at: u32, bit: u8) {
        self.store = None;
        self.faulty = false;
        let journal = redb_limiter::store::journal::journal_path(&self.path);
        let original = std::fs::read(&journal).expect("the journal is there");
        let before_newest = before_newest_record(&original);
        if before_newest == 0 {
            let store = Store::open(&self.path, &file_opener()).expect("reopen after a crash");
            self.rebuild_same(store);
            return;
        }
        let mut damaged = original.clone();
        damaged[at as usize % before_newest] ^= 1 << (bit % 8);
        std::fs::write(&journal, &damaged).expect("write the journal");
        let store = match Store::open(&self.path, &file_opener()) {
            Ok(store) => store,
            Err(_) => {
                // Refused, and nothing changed: the journal as it was opens.
                assert_eq!(
                    std::fs::read(&journal).expect("read the journal"),
                    damaged,
                    "a refusal changed the journal"
                );
                std::fs::write(&journal, &original).expect("restore the journal");
                Store::open(&self.path, &file_opener()).expect("the undamaged journal opens")
            }
        };
        self.rebuild_same(store);
    }

    /// [`Self::rebuild`] after a crash that lost nothing: the engine must be what it was, but
    /// that the restart gives every live ticket a lapse no sooner than now plus its grace (12.6).
    fn rebuild_same(&mut self, store: Store) {
        let mut before = self.engine.facts(self.now);
        let latest = self.durable_floor;
        let floor = self.rebuild(store);
        assert_eq!(floor, latest, "the floor is the now of the latest commit");
        let mut lapses = std::collections::HashMap::new();
        for (id, ticket) in &mut before.tickets {
            ticket.lapse_at = ticket.lapse_at.max(self.now.plus(ticket.grace_ms));
            // (the file keeps no horizon of its own: the reference's restart bounds it anew)
            lapses.insert(id.number(), ticket.lapse_at);
        }
        for (number, lapse) in before.lines.values_mut().flatten() {
            *lapse = lapses[number];
        }
        assert_eq!(self.engine.facts(self.now), before, "every committed change is served");
        self.check_forgotten();
    }

    /// Applies `change` to the engine and the reference and compares their answers.
    fn apply(&mut self, change: &Change, effects: &mut Vec<Effect>) {
        let now = self.now;
        self.reference.advance(now);
        match change {
            Change::Acquire(op) => {
                let mut r = to_request(op);
                match &op.line {
                    LineChoice::None => {}
                    LineChoice::Queue => r.queue = true,
                    choice => r.ticket = Some(self.ticket_text(choice)).filter(|t| (1..=128).contains(&t.len())),
                }
                self.acquire(&r, effects);
            }
            Change::AskAgain(nth, grace) => {
                if self.tickets.is_empty() {
                    return;
                }
                let mut r = self.tickets[usize::from(*nth) % self.tickets.len()].1.clone();
                r.grace_ms = grace.0;
                self.acquire(&r, effects);
            }
            Change::Leave(choice) => {
                let ticket = self.ticket_text(choice);
                let id = ticket.parse::<TicketId>().ok();
                let live = id.is_some_and(|id| self.reference.tickets.get(&id.number()).is_some_and(|t| t.id == id));
                assert_eq!(self.engine.leave(&ticket, now, effects), live, "leave {ticket:?}");
                if let Some(id) = id.filter(|_| live) {
                    self.reference.tickets.remove(&id.number());
                }
            }
            Change::Settle(op) | Change::ReleaseWith(op) => {
                let permit = self.permit_text(&op.permit);
                let id = permit.parse::<PermitId>().ok();
                let costs = to_costs(op);
                let release = matches!(change, Change::ReleaseWith(_));
                if costs.is_empty() && !release {
                    return; // a settle needs 1 to 64 costs: the wire refuses it before the engine
                }
                let before = format!("{:?}", self.engine);
                let outcome = op.outcome.map(Outcome::signal);
                let settled = if costs.is_empty() { Ok(true) } else { self.reference.settle(id, &costs, now) };
                // Section 14: the outcome counts after the settle, on a permit still live.
                if let (Ok(true), Some(signal)) = (settled, outcome) {
                    self.reference.signal(id, signal, now);
                }
                let expected = match (costs.is_empty(), settled) {
                    (false, Err(())) => Err(()),
                    (_, Ok(settled)) if !release => Ok(settled),
                    _ => Ok(self.reference.release(id, now)),
                };
                let got = if release {
                    self.engine.release_with_outcome(&permit, &costs, outcome, now, effects).map_err(|_| ())
                } else {
                    self.engine
                        .settle_with_outcome(&permit, &costs, outcome, now, effects)
                        .map(|s| s.is_settled())
                        .map_err(|_| ())
                };
                assert_eq!(got, expected, "settle {permit:?} {costs:?} (release: {release})");
                if got.is_err() {
                    assert_eq!(format!("{:?}", self.engine), before, "a bad settle changed the engine");
                    assert!(effects.is_empty());
                }
            }
            Change::Lift(caller) => {
                let key = CALLERS[caller.0 as usize];
                assert_eq!(self.engine.lift(key, now, effects), self.reference.lift(key, now), "lift {key}");
            }
            Change::Release(choice) => {
                let permit = self.permit_text(choice);
                let expected = self.reference.release(permit.parse::<PermitId>().ok(), now);
                assert_eq!(self.engine.release(&permit, now, effects), expected, "release {permit:?}");
            }
            Change::Throttle(op) => {
                let key = CALLERS[op.caller.0 as usize];
                let until = now.plus(op.offset.0).minus(1000);
                let req = ThrottleRequest::new(key, until, now).expect("within 24 hours");
                if let Some(choice) = &op.permit {
                    // Section 14: the permit's call was limited, for each of its adapted buckets.
                    let permit = self.permit_text(choice);
                    let live = self.reference.signal(permit.parse::<PermitId>().ok(), Signal::Limited, now);
                    assert_eq!(self.engine.signal(&permit, Signal::Limited, now, effects), live, "throttle {permit:?}");
                }
                let expected = self.reference.throttle(&req.key, req.until, now);
                assert_eq!(self.engine.throttle(&req.key, req.until, now, effects), expected);
            }
            Change::Sweep => {
                self.swept = true;
                let next = self.engine.sweep(now, effects);
                assert!(next.is_none_or(|t| t > now), "the next deadline {next:?} is not after {now:?}");
                self.check_forgotten();
            }
        }
    }

    /// One acquire through the line, against the reference.
    fn acquire(&mut self, r: &AcquireRequest, effects: &mut Vec<Effect>) {
        let now = self.now;
        let before = format!("{:?}", self.engine);
        let peeked = self.engine.peek_in_line(r, now);
        assert_eq!(format!("{:?}", self.engine), before, "a peek changed the engine");
        let Ok(mine) = self.reference.presented(r) else {
            assert!(peeked.is_err(), "a ticket bound to another request was peeked: {peeked:?}");
            assert!(self.engine.acquire_in_line(r, now, effects).is_err(), "a ticket bound to another request");
            assert_eq!(format!("{:?}", self.engine), before, "a bad ticket changed the engine");
            assert!(effects.is_empty());
            return;
        };
        let peeked = peeked.expect("bound");
        let got = self.engine.acquire_in_line(r, now, effects).expect("bound");
        // A ceiling free to go may go with its bucket on the way (a lapsed ticket's end forgets a
        // bucket that kept only it): the reference follows.
        let keys = r.limits.iter().map(|l| l.key.as_str());
        self.reference.follow_forgotten(keys, |k| self.engine.ceiling(k).is_some(), now);
        let expected = self.reference.decide_as(r, now, RECHECK_MS, Some(mine));
        if let Some(number) = mine
            && self.reference.is_oldest(number)
        {
            assert_eq!(expected, self.reference.decide_as(r, now, RECHECK_MS, None), "the oldest ticket waited");
        }
        let mine_or_all = Some(mine.unwrap_or(u64::MAX));
        let reserved_before: Vec<_> =
            r.limits.iter().map(|l| self.reference.reservations(&l.key, now, mine_or_all)).collect();
        assert_eq!(
            peeked.map(Decision::from),
            (!got.decision.is_granted()).then(|| got.decision.clone()),
            "peek then acquire"
        );
        match (&got.decision, expected) {
            (Decision::Granted { at, permit }, None) => {
                assert_eq!(*at, now);
                assert_eq!(permit.is_some(), r.wants_permit());
                // A place is never granted over a ticket that holds (12.9).
                for l in r.limits.iter().filter(|l| l.concurrent.is_some()) {
                    let holds = self
                        .reference
                        .line(&l.key)
                        .filter(|(n, _)| mine.is_none_or(|m| *n < m))
                        .any(|(_, t)| self.reference.throttles.get(&*t.state.key).is_none_or(|u| *u <= now));
                    assert!(!holds, "a place was granted over a ticket in {}", l.key);
                }
                if let Some(p) = permit {
                    assert!(!self.issued.contains(p), "permit id {p} reused");
                    self.issued.push(*p);
                }
                self.reference.grant(r, now, *permit);
                if let Some(number) = mine {
                    self.reference.tickets.remove(&number);
                }
                // A backfill delays no older ticket: their reserved instants stand.
                let instants = |v: &[(u64, Millis, u64)]| v.iter().map(|(n, at, _)| (*n, *at)).collect::<Vec<_>>();
                for (l, before) in r.limits.iter().zip(&reserved_before) {
                    let after = self.reference.reservations(&l.key, now, mine_or_all);
                    assert_eq!(instants(&after), instants(before), "a grant delayed a ticket in {}", l.key);
                }
            }
            (Decision::Refused { retry_at, reason, limit }, Some((at, why, key))) => {
                assert_eq!((*retry_at, *reason, limit.as_str()), (at, why, key.as_str()), "{r:?}");
                assert!(
                    effects.iter().all(redb_limiter::engine::model::refusal_may_push),
                    "a refusal changed more than retention and the line: {effects:?}"
                );
                assert!(*retry_at > now);
                self.reference.refuse(r, now);
                match (mine, got.ticket) {
                    (Some(number), Some(note)) => {
                        assert_eq!(note.id.number(), number);
                        self.reference.renew(number, *retry_at, r.grace_ms);
                        assert_eq!(note.lapse_at, self.reference.tickets[&number].state.lapse_at, "renewed lapse");
                        assert_eq!(note.ahead, self.reference.ahead(number));
                    }
                    (None, Some(note)) => {
                        assert!(r.in_line() && *reason != redb_limiter::Reason::Throttle);
                        assert!(self.tickets.iter().all(|(t, _)| *t != note.id), "ticket id reused");
                        assert!(self.reference.tickets.keys().all(|n| *n < note.id.number()), "filed ahead");
                        let horizon = r.max_wait_ms.map_or(HORIZON_MS, |w| w.min(HORIZON_MS));
                        let own = self.reference.decide_as(r, now, RECHECK_MS, None).map_or(now, |d| d.0);
                        assert!(own <= now.plus(horizon), "filed beyond its horizon");
                        self.reference.file(note.id, r, *retry_at, now, horizon);
                        assert_eq!(
                            note.lapse_at,
                            self.reference.tickets[&note.id.number()].state.lapse_at,
                            "filed lapse"
                        );
                        assert_eq!(note.ahead, self.reference.ahead(note.id.number()));
                        let mut bound = r.clone();
                        bound.ticket = Some(note.id.to_string());
                        self.tickets.push((note.id, bound));
                    }
                    (None, None) => {
                        let horizon = r.max_wait_ms.map_or(HORIZON_MS, |w| w.min(HORIZON_MS));
                        let own = self.reference.decide_as(r, now, RECHECK_MS, None).map_or(now, |d| d.0);
                        let expected = if !r.in_line() || *reason == redb_limiter::Reason::Throttle {
                            None
                        } else if own > now.plus(horizon) {
                            Some(NoTicket::Horizon)
                        } else {
                            Some(NoTicket::Full)
                        };
                        assert_eq!(got.no_ticket, expected, "why no ticket");
                    }
                    (Some(_), None) => panic!("a live ticket refused was not renewed"),
                }
            }
            (got, expected) => panic!("engine {got:?}, reference {expected:?} for {r:?}"),
        }
        if r.report || r.in_line() {
            assert_eq!(self.engine.figures(r, now), self.reference.figures(r, now), "report");
        }
    }

    fn ticket_text(&self, choice: &LineChoice) -> String {
        match choice {
            LineChoice::Issued(n) if !self.tickets.is_empty() => {
                self.tickets[usize::from(*n) % self.tickets.len()].0.to_string()
            }
            LineChoice::Text(s) => s.clone(),
            _ => "t-ffffffffffffffffffffffffffffffff".to_owned(),
        }
    }

    fn permit_text(&self, choice: &PermitChoice) -> String {
        match choice {
            PermitChoice::Issued(n) if !self.issued.is_empty() => {
                self.issued[usize::from(*n) % self.issued.len()].to_string()
            }
            PermitChoice::Issued(_) => "p-ffffffffffffffffffffffffffffffff".to_owned(),
            PermitChoice::Text(s) => s.clone(),
        }
    }

    /// After a sweep or a restore: nothing lapsed is still kept.
    fn check_forgotten(&self) {
        let now = self.now;
        let totals = self.engine.totals();
        let permits = self.reference.permits.values().filter(|p| p.expires > now).count();
        let throttles = self.reference.throttles.values().filter(|u| **u > now).count();
        let facts = self.reference.facts(now);
        // A bucket is kept while it has grants, places or a line, and while its token level is
        // kept (full ones too, until they have stood full for their keeping time).
        let buckets = facts
            .buckets
            .keys()
            .chain(facts.lines.keys())
            .chain(self.reference.levels.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert_eq!(
            (totals.buckets, totals.permits, totals.throttles),
            (buckets, permits, throttles),
            "live at {now:?}"
        );
    }

    fn check(&mut self) {
        let now = self.now;
        self.reference.advance(now);
        assert_eq!(self.engine.facts(now), self.reference.facts(now), "a committed change was lost");
        let swept = std::mem::take(&mut self.swept);
        if let Err(e) = self.reference.sync_ceilings(&self.engine.ceilings(""), now, swept) {
            panic!("{e}");
        }
        for caller in CALLERS {
            let live = self.reference.throttles.get(caller).copied().filter(|u| *u > now);
            assert_eq!(self.engine.throttled_until(caller, now), live, "throttle of {caller}");
        }
        for (i, (calls, _)) in SHAPES.iter().enumerate() {
            let key = format!("b{i}");
            if let Some(per_ms) = self.reference.first_per_ms.get(&key)
                && !self.reference.unbounded.contains(&key)
            {
                let most = self.reference.max_window_use(&key, *per_ms);
                assert!(most <= *calls, "b{i} held {most} > {calls} in one window");
            }
        }
    }
}

/// How many bytes of a journal lie before its newest record (the header slots and the records
/// of its newest generation before the last one): damage there is never the torn tail a crash
/// leaves. 0 when it has no record.
fn before_newest_record(journal: &[u8]) -> usize {
    const REGION: usize = 16384;
    let at = |i: usize| u64::from_le_bytes(journal[i..i + 8].try_into().expect("8 bytes"));
    let mut records: Vec<(u64, u64, usize)> = (REGION..journal.len().saturating_sub(72))
        .step_by(4096)
        .filter(|&pos| &journal[pos..pos + 4] == b"JREC")
        .map(|pos| (at(pos + 24), at(pos + 32), pos))
        .collect();
    let Some(newest) = records.iter().map(|r| r.0).max() else { return 0 };
    records.retain(|r| r.0 == newest);
    records.sort();
    // The run that follows on from the first record of the newest generation.
    let run = records.windows(2).take_while(|w| w[0].1 + 1 == w[1].1).count() + 1;
    records.get(run - 1).map_or(0, |r| r.2)
}

fuzz_target!(|ops: Vec<FuzzOperation>| {
    let mut harness = Harness::new();
    for op in ops.iter().take(MAX_OPS) {
        harness.run(op);
    }
});
