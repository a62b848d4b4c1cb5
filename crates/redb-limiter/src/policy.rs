//! When lapsed state leaves memory and the file: the prune, delete and defer policy in one
//! place, with every knob it has.
//!
//! Correctness never depends on these numbers. What lapsed (a grant older than its bucket's
//! retention, an ended throttle or permit, an idle bucket) is judged by the engine at `now` and
//! never counts again; these constants only decide *when* the file pays for forgetting it. Until
//! then a lapsed entry costs file space, and loading the file prunes it again.
//!
//! 1. **Engine: prune in memory, report in batches.** A bucket prunes its window whenever a
//!    request or a sweep touches it, but reports the pruned grants to the store only in batches
//!    of [`PRUNE_BATCH`] (and all at once when the bucket is forgotten, its timer fires, or its
//!    window grows, since a longer window must not let a pruned grant count again).
//! 2. **Store: doom, then delete together.** Reported grants are spread over time (over their
//!    window), so deleting each at once would dirty one leaf each. The store dooms them and
//!    deletes doomed grants together, oldest first: a commit that carries a request's change
//!    deletes only once [`DELETE_BATCH`] are due (about a leaf of the grants table), at most
//!    [`DELETES_PER_GRANT`] per grant it writes (and at least [`DELETES_PER_COMMIT`]), and only
//!    those [`DELETE_AFTER_MS`] old (or twice as old as when doomed, if sooner). A forgotten
//!    bucket's record waits until [`RECORD_DELETE_BATCH`] wait, so a key with sparse traffic
//!    that comes back with the same record writes nothing. A tidying commit (a sweep's, a
//!    reopen's, the close) deletes everything doomed.
//! 3. **Limiter: defer sweep-only commits.** The writer sweeps at the engine's deadlines, at
//!    most every [`SWEEP_GRAIN_MS`] (a request sweeps for itself before deciding, so these sweeps
//!    only tidy). What a sweep alone changes rides along with the next commit a request needs,
//!    or is committed on its own once it is [`MAX_DEFERRED_MS`] old or [`MAX_DEFERRED_EFFECTS`]
//!    effects long.

/// Engine: pruned window entries are reported to the store in batches of at least this many
/// per bucket.
pub const PRUNE_BATCH: usize = 32;

/// Store: a commit that carries a request's change deletes doomed grants only once this many
/// are due (about a leaf of the grants table), so one commit in many rewrites the oldest leaf.
pub const DELETE_BATCH: usize = 128;
/// Store: most doomed grants a request's commit deletes, per grant it writes...
pub const DELETES_PER_GRANT: usize = 2;
/// ...and at least this many.
pub const DELETES_PER_COMMIT: usize = 512;
/// Store: a request's commit deletes a doomed grant only once it is this old (ms), or twice as
/// old as it was when doomed if that comes sooner.
pub const DELETE_AFTER_MS: u64 = 2_000;
/// Store: a request's commit deletes the records of forgotten buckets only once this many wait.
pub const RECORD_DELETE_BATCH: usize = 64;

/// Limiter: the writer sweeps at the engine's deadlines, but at most this often (ms).
pub const SWEEP_GRAIN_MS: u64 = 50;
/// Limiter: a sweep's effects wait for a request's commit at most this long (ms)...
pub const MAX_DEFERRED_MS: u64 = 1000;
/// ...or until there are this many.
pub const MAX_DEFERRED_EFFECTS: usize = 4096;

/// Store: commits kept as notes in the journal (one append each) before one redb commit takes
/// them all; the writer also commits them at quiet moments. A restart redoes at most this many.
pub const NOTES_BEFORE_COMMIT: usize = 256;
/// Store: ...and at most this many effects in all, so that the redb commit taking them stays
/// about as large as one group commit (a larger one grows the file: redb reuses no page freed
/// in the same commit). A commit with more effects than this goes to redb directly.
pub const NOTE_EFFECTS_BEFORE_COMMIT: usize = 1024;
