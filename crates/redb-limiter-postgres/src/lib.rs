//! PostgreSQL mode: the limiter's rules decided inside one PostgreSQL database, so that servers
//! on many machines share one set of windows, places and throttles (wire spec, section 10).
//!
//! This crate owns the connection pool, the schema (created on first use, refused when it
//! carries an unknown format version) and the one round trip each request costs: a call to a
//! plpgsql function of `sql/schema.sql` that locks the named buckets in one sorted order,
//! judges windows, places and throttles at the database's clock (floored per bucket so it
//! never runs backwards) and writes the grant. A refusal and a peek are answered from a
//! snapshot: no row lock, no write, no WAL. `sql/schema.sql` documents the tables and how a
//! window's used cost stays a lookup however long the window.
//!
//! The most common request, an acquire of window limits only, is instead the one prepared
//! statement of `sql/acquire_window.sql` (`sql/acquire_windows.sql` for several limits): a
//! plain SELECT that decides it (a refusal costs no plpgsql at all) and calls a small function
//! to write a grant, or hands the request to the same `acquire()` in the same call when it is
//! not the common case. PostgreSQL spends most
//! of a call starting the executor for each statement it runs, so fewer statements is what
//! makes a call cheaper.
//!
//! While requests are concurrent, the one-window acquires waiting at once are instead decided
//! together by the one statement of `sql/acquire_window_batch.sql`, in one round trip and one
//! transaction, as a group commit does ([`batch`] owns the queue and says when): the same
//! decision for each, a refusal still writing and locking nothing, and a request it cannot
//! decide without waiting (or without `acquire()`) left to go alone afterwards. A request that
//! finds nothing in flight goes alone at once, as before.
//!
//! The line (wire section 12) lives in the database too (tables `tickets` and `line`, one
//! sequence numbering every ticket of every bucket), so every server sharing it keeps one line
//! per bucket. `acquire()` decides rule Q, and files, renews and ends tickets; the one-statement
//! paths and the batch leave a bucket with a line to it (one index probe of an empty table
//! where nobody queues), and a request with `queue` or `ticket` always goes to it.
//!
//! Request ids (wire section 16) live in the database too (table `requests`): an acquire or peek
//! named by an `id` is sent to `acquire_id()`, which locks the id (so servers presenting one id
//! at once decide one after the other), answers a retry from its record as the first time, or
//! has `acquire()` decide it and records a grant or filing in the same transaction; `release
//! {id}` is `undo()`. Every other request is sent as before and never reads the table. The digest
//! of the params a retry must repeat is the engine's own ([`redb_limiter::engine::params_digest`]).
//!
//! Token buckets (wire section 13) live in the database too (table `levels`: each bucket's level
//! in the engine's exact units, at its instant): `acquire()` judges rule B, takes a grant's cost,
//! settles a permit's or an id's share and reserves the line's tickets through a bucket as the
//! engine does, under the same bucket row lock as a window; a request naming a bucket never takes
//! the one-statement paths or the batch.
//!
//! Adaptive ceilings (wire section 14) live in the database too (table `ceilings`: one per
//! bucket, shared by every server): `acquire()` judges a request naming `adapt` with its
//! bucket's ceiling before anything else reads it (and never on the one-statement paths or the
//! batch), a grant's permit keeps what an outcome needs of each adapted bucket, and an outcome
//! (`release_outcome()`, `settle_outcome()`, `throttle_permit()`) cuts or grows the ceiling in
//! the transaction that counts it. Each answers the cuts and growths it made, which this server
//! counts in its metrics.
//!
//! Wake-ups (wire section 15) are `wakes.rs`: `/wait` asks the database's `wait_check()` how its
//! tickets stand (one round trip for all of them), and every change that can make a ticket ready
//! notifies (`pg_notify`, delivered at commit) the keys it freed to every server, each of which
//! listens on one connection of its own and wakes its waits on those keys.
//!
//! What it must never do: decide anything in Rust. The Rust engine is the oracle the SQL is
//! tested against (`tests/postgres.rs` drives both with the same operations and instants); this
//! crate only validates nothing further (requests arrive validated by
//! [`redb_limiter::request`]), passes them on and maps the answers. Every database error is
//! [`LimiterError::Unavailable`]: nothing is granted that the database did not commit.
//!
//! Health: `/health` must not cost a round trip per request. Every database call records its
//! outcome (with the sweeper's, about one a second even when idle); `/health` answers from the
//! latest outcome while it is under [`HEALTH_FRESH_MS`] old, a failure included (unavailable
//! until a later success), and otherwise runs one `SELECT 1`, one probe at a time. Only a
//! database that is out counts as a failure; a statement that failed for its request's sake
//! (its key, a timeout) shows the database answering ([`faults`], which also paces the log of
//! database errors: once, then at most once a second).
//!
//! Keys: every key and permit string crosses to the database escaped ([`keys`]), so that every
//! UTF-8 string the file serves, U+0000 included, is stored, ordered and prefix-matched as
//! itself.
//!
//! Connections: `tokio-postgres` with a `deadpool-postgres` pool (small, async, no ORM, prepared
//! statements cached per connection; the session used last is handed out first, and the
//! sweeper closes sessions left unused for [`PgOptions::idle_session`]; every session opened is
//! first warmed by the schema's `warm()`, so no request pays a fresh backend's compiling and
//! planning while it holds row locks), TLS through `rustls`
//! with the Mozilla roots when the URL asks for it (`sslmode=require`), as managed databases do.

pub mod batch;
pub mod faults;
pub mod keys;
mod wakes;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use redb_limiter::backend::Backend;
use redb_limiter::engine::{BucketMeta, BucketView, PermitId, PermitView, StateView, ThrottleView, Totals};
use redb_limiter::engine::{Ceiling, Figures, NoTicket, Refusal, TicketId, TicketNote};
use redb_limiter::limiter::{Acquired, Peeked, Report, Snapshot, StatePage, WaitAnswer};
use redb_limiter::request::{
    AcquireRequest, Cost, LeaveRequest, LiftRequest, Limit, ReleaseRequest, SettleRequest, ThrottleRequest,
    UndoRequest, WaitRequest,
};
use redb_limiter::time::Clock;
use redb_limiter::{Decision, LimiterError, Millis, Reason};
use serde_json::{Value, json};

use crate::keys::{escape, unescape};

/// The schema script; `__SCHEMA__` stands for the quoted schema name.
const SCHEMA_SQL: &str = include_str!("../sql/schema.sql");
/// The one statement that decides an acquire of one window limit (see the file); `__SCHEMA__`
/// as above.
const ACQUIRE_WINDOW_SQL: &str = include_str!("../sql/acquire_window.sql");
/// The same for two or more window limits.
const ACQUIRE_WINDOWS_SQL: &str = include_str!("../sql/acquire_windows.sql");
/// The one statement that decides a batch of one-window acquires (see the file and
/// [`batch`]); `__SCHEMA__` as above.
const ACQUIRE_WINDOW_BATCH_SQL: &str = include_str!("../sql/acquire_window_batch.sql");
/// The format version `sql/schema.sql` writes into its `meta` table.
pub const SCHEMA_VERSION: i32 = 7;
/// The steps from each earlier format version to the next: `MIGRATIONS[i]` takes a schema of
/// version `i + 1` to version `i + 2` (`sql/migrate/N-M.sql`; `__SCHEMA__` as above). Each
/// runs in its own transaction under the schema's advisory lock and does nothing unless the
/// schema still carries its starting version, so servers starting at once migrate once.
const MIGRATIONS: [&str; (SCHEMA_VERSION - 1) as usize] = [
    include_str!("../sql/migrate/1-2.sql"),
    include_str!("../sql/migrate/2-3.sql"),
    include_str!("../sql/migrate/3-4.sql"),
    include_str!("../sql/migrate/4-5.sql"),
    include_str!("../sql/migrate/5-6.sql"),
    include_str!("../sql/migrate/6-7.sql"),
];
/// The schema used when none is named.
pub const DEFAULT_SCHEMA: &str = "redb_limiter";
/// Rows of each kind one `sweep` call deletes at most.
pub const SWEEP_BATCH: i32 = 1000;
/// Most `sweep` calls one sweeper tick makes back to back while each finds work, so a backlog
/// drains in a tick and a tick's work stays bounded.
pub const SWEEP_BATCHES_PER_TICK: usize = 100;
/// `/health` answers from the latest database call's outcome while it is younger than this.
pub const HEALTH_FRESH_MS: u64 = 1000;

/// How to reach the database and how to run in it.
#[derive(Clone)]
pub struct PgOptions {
    /// A libpq-style URL or key=value string (`postgres://user:pass@host:port/db?sslmode=require`).
    pub url: String,
    /// The schema holding the limiter's tables and functions.
    pub schema: String,
    /// Connections in the pool.
    pub pool_size: usize,
    /// A call refused for concurrency is told to retry at most this long after `now`.
    pub recheck_ms: u64,
    /// The line's horizon (section 12.9).
    pub line_horizon_ms: u64,
    /// Longest a statement (lock waits included) may take before the request is answered
    /// `unavailable`.
    pub statement_timeout: Duration,
    /// Replaces the database's clock: tests only, to drive instants as the engine's tests do.
    pub clock: Option<Arc<dyn Clock>>,
    /// How many batches of one-window acquires may be in flight at once (see [`batch`]); 0
    /// sends every one-window acquire alone, as its own statement.
    pub batchers: usize,
    /// A pool session unused this long is closed by the sweeper's next tick
    /// ([`PgLimiter::close_idle_sessions`]); the pool opens one again when the load needs it.
    /// The pool hands out the session used last, so the sessions beyond what the load needs
    /// sit unused, holding a backend each, and a session unused for long may meanwhile have
    /// been cut by the network or by the server's `idle_session_timeout`.
    pub idle_session: Duration,
    /// At most this many `/wait`s pending at once (section 15); past it a wait answers at once.
    pub max_waits: usize,
}

/// [`PgOptions::idle_session`] unless set otherwise.
pub const DEFAULT_IDLE_SESSION: Duration = Duration::from_secs(60);

impl PgOptions {
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        PgOptions {
            url: url.into(),
            schema: DEFAULT_SCHEMA.to_owned(),
            pool_size: 32,
            recheck_ms: redb_limiter::engine::DEFAULT_RECHECK_MS,
            line_horizon_ms: redb_limiter::engine::DEFAULT_LINE_HORIZON_MS,
            statement_timeout: Duration::from_secs(5),
            clock: None,
            batchers: batch::DEFAULT_BATCHERS,
            idle_session: DEFAULT_IDLE_SESSION,
            max_waits: redb_limiter::limiter::DEFAULT_MAX_WAITS,
        }
    }
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may carry a password.
        f.debug_struct("PgOptions")
            .field("schema", &self.schema)
            .field("pool_size", &self.pool_size)
            .field("recheck_ms", &self.recheck_ms)
            .field("line_horizon_ms", &self.line_horizon_ms)
            .field("batchers", &self.batchers)
            .field("idle_session", &self.idle_session)
            .field("max_waits", &self.max_waits)
            .finish_non_exhaustive()
    }
}

/// Why PostgreSQL mode cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    #[error("the PostgreSQL URL is not valid: {0}")]
    BadUrl(#[source] tokio_postgres::Error),
    #[error("--pg-schema must be 1 to 63 characters of a-z, 0-9 and _, starting with a letter or _: {0:?}")]
    BadSchema(String),
    #[error("cannot reach PostgreSQL: {0}")]
    Unreachable(String),
    #[error("PostgreSQL runs with fsync=off: an acknowledged grant could be lost in a crash; refusing to serve")]
    FsyncOff,
    #[error("schema {schema}: {message}")]
    Schema { schema: String, message: String },
    #[error("PostgreSQL: {0}")]
    Database(#[from] tokio_postgres::Error),
    #[error("permit ids: no random key from the operating system: {0}")]
    NoRandomKey(String),
}

/// The limiter on PostgreSQL. Cheap to share behind an `Arc`; every method is one round trip
/// (shared with others when a batch decides it; two when a batch leaves it to go alone).
pub struct PgLimiter {
    pool: Pool,
    schema: String,
    options: PgOptions,
    /// Every statement this limiter sends, with the schema written in once.
    sql: Statements,
    /// Permit ids: the sequence in the low half, and in the high half a random part of each id's
    /// own (SipHash-2-4 of the sequence under this 128-bit key, drawn from the operating system
    /// when the limiter starts), so the ids a host was given tell nothing of another's and a
    /// permit cannot be guessed and released by someone who did not get it. Servers sharing the
    /// database issue the same id only by a 64-bit chance, which the permits' key refuses.
    permit_key: (u64, u64),
    sequence: AtomicU64,
    metrics: Arc<redb_limiter::metrics::Metrics>,
    synchronous_commit: String,
    started: std::time::Instant,
    /// The outcome of the latest database call, and the pace of the error log.
    faults: Arc<faults::Faults>,
    /// Held while `/health` probes, so a flood of requests costs one probe.
    probing: tokio::sync::Mutex<()>,
    probes: AtomicU64,
    /// Window-only acquires the statements decided, and those they left to `acquire()` (tests).
    window_decided: AtomicU64,
    window_left: AtomicU64,
    /// Gathers the one-window acquires of concurrent requests into one statement.
    batcher: Arc<batch::Batcher>,
    /// The pending `/wait`s and the listener that wakes them ([`wakes`]).
    wakes: Arc<wakes::Wakes>,
    /// How the listener connects: the pool's settings, under a name of its own.
    listen_config: tokio_postgres::Config,
}

impl Drop for PgLimiter {
    fn drop(&mut self) {
        self.wakes.stop();
    }
}

/// The text of every statement the limiter sends, for its schema: built once, so that a call
/// neither formats its statement nor hashes more text than it sends.
struct Statements {
    acquire: String,
    peek: String,
    acquire_id: String,
    peek_id: String,
    undo: String,
    acquire_window: String,
    acquire_windows: String,
    release: String,
    release_outcome: String,
    settle: String,
    settle_outcome: String,
    throttle: String,
    throttle_permit: String,
    lift: String,
    leave: String,
    state: String,
    sweep: String,
    sweep_tickets: String,
    wait_check: String,
}

impl Statements {
    /// A statement file as sent: its comments stay in the file, so that what is sent (and
    /// hashed by the statement cache on every call) is the statement alone.
    fn file(sql: &str, schema: &str) -> String {
        sql.lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("\n")
            .replace("__SCHEMA__", &format!("\"{schema}\""))
    }

    fn new(schema: &str) -> Statements {
        let quoted = format!("\"{schema}\".");
        let call = |sql: &str| sql.replace("S.", &quoted);
        let file = |sql: &str| Statements::file(sql, schema);
        Statements {
            acquire: call("SELECT S.acquire($1::jsonb, $2, $3, $4, $5)"),
            peek: call("SELECT S.acquire($1::jsonb, 'peek', $2, $3, $4)"),
            acquire_id: call("SELECT S.acquire_id($1::jsonb, $2, $3, $4, $5, $6, $7)"),
            peek_id: call("SELECT S.acquire_id($1::jsonb, 'peek', $2, '', $3, $4, $5)"),
            undo: call("SELECT S.undo($1, $2::jsonb, $3)"),
            acquire_window: file(ACQUIRE_WINDOW_SQL),
            acquire_windows: file(ACQUIRE_WINDOWS_SQL),
            release: call("SELECT S.release($1, $2::jsonb, $3)"),
            release_outcome: call("SELECT S.release_outcome($1, $2::jsonb, $3, $4)"),
            settle: call("SELECT S.settle($1, $2::jsonb, $3)"),
            settle_outcome: call("SELECT S.settle_outcome($1, $2::jsonb, $3, $4)"),
            throttle: call("SELECT S.throttle($1, $2, $3)"),
            throttle_permit: call("SELECT S.throttle_permit($1, $2, $3, $4)"),
            lift: call("SELECT S.lift($1, $2)"),
            leave: call("SELECT S.leave($1, $2)"),
            state: call("SELECT * FROM S.state_rows($1, $2, $3, $4)"),
            sweep: call("SELECT S.sweep($1, $2)"),
            sweep_tickets: call("SELECT S.sweep_tickets($1, $2)"),
            wait_check: call("SELECT S.wait_check($1, $2, $3, $4)"),
        }
    }
}

impl std::fmt::Debug for PgLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLimiter").field("schema", &self.schema).finish_non_exhaustive()
    }
}

/// Warms a new session (`warm()` in sql/schema.sql). A failure only leaves it cold: it is
/// logged and the session is handed out all the same.
async fn warm_session(client: &tokio_postgres::Client, warm_sql: &str) {
    match client.query_one(warm_sql, &[]).await {
        Ok(row) => tracing::debug!(ms = row.get::<_, i64>(0), "PostgreSQL session warmed"),
        Err(e) => tracing::warn!("PostgreSQL session not warmed: {e}"),
    }
}

fn valid_schema(name: &str) -> bool {
    let mut bytes = name.bytes();
    (1..=63).contains(&name.len())
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

fn random_permit_key() -> Result<(u64, u64), PgError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| PgError::NoRandomKey(e.to_string()))?;
    let half = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    Ok((half(&bytes[..8]), half(&bytes[8..])))
}

/// The id of the permit with sequence number `seq` under `key`: `random << 64 | seq`.
fn permit_id(key: (u64, u64), seq: u64) -> PermitId {
    use std::hash::Hasher;
    let mut hasher = siphasher::sip::SipHasher24::new_with_keys(key.0, key.1);
    hasher.write_u64(seq);
    PermitId((u128::from(hasher.finish()) << 64) | u128::from(seq))
}

fn tls() -> tokio_postgres_rustls::MakeRustlsConnect {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_postgres_rustls::MakeRustlsConnect::new(config)
}

/// A database error as the wire's `unavailable` (the message names no URL).
fn unavailable(e: &impl std::fmt::Display) -> LimiterError {
    LimiterError::Unavailable(format!("PostgreSQL: {e}"))
}

/// Brings a schema of an earlier format version to [`SCHEMA_VERSION`], one step at a time
/// ([`MIGRATIONS`]); a missing schema, or one of this version or a later one, is left to the
/// schema script (which creates the first and refuses the last).
async fn migrate(client: &tokio_postgres::Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    let quoted = format!("\"{schema}\"");
    let meta = format!("{quoted}.meta");
    let exists: bool = client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&meta]).await?.get(0);
    if !exists {
        return Ok(());
    }
    let version: Option<i32> = client.query_one(&format!("SELECT max(version) FROM {meta}"), &[]).await?.get(0);
    let Some(version) = version else { return Ok(()) };
    for step in MIGRATIONS.iter().skip(usize::try_from(version - 1).unwrap_or(usize::MAX)) {
        client.batch_execute(&step.replace("__SCHEMA__", &quoted)).await?;
    }
    Ok(())
}

impl PgLimiter {
    /// Connects, refuses `fsync=off`, warns when `synchronous_commit` is off, and creates or
    /// validates the schema (an unknown format version is refused, naming it).
    pub async fn connect(options: PgOptions) -> Result<PgLimiter, PgError> {
        if !valid_schema(&options.schema) {
            return Err(PgError::BadSchema(options.schema.clone()));
        }
        let mut config = tokio_postgres::Config::from_str(&options.url).map_err(PgError::BadUrl)?;
        let timeout_ms = options.statement_timeout.as_millis();
        // Every statement we send, and every one our functions run, probes indexes by key with
        // parameters: the generic plan is the plan. Left to choose, PostgreSQL plans a
        // statement over unnest() of array parameters again on every call (its custom plan
        // knows the arrays' lengths, so it looks cheaper), which costs more than running it.
        config.options(format!(
            "-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms} -c plan_cache_mode=force_generic_plan"
        ));
        // Named per schema, so an operator (or a test) can tell whose connections are whose.
        config.application_name(format!("redb-limiter/{}", options.schema));
        config.connect_timeout(Duration::from_secs(5));
        let mut listen_config = config.clone();
        listen_config.application_name(format!("redb-limiter/{}/wakes", options.schema));
        // A listener whose connection the network cut learns it within a minute.
        listen_config.keepalives_idle(Duration::from_secs(30));
        let manager = Manager::from_config(config, tls(), ManagerConfig { recycling_method: RecyclingMethod::Fast });
        // Last in, first out: the session used last is used next, so only as many sessions as
        // the load needs stay busy (and their backends' caches warm). First in, first out sent
        // each request to the session idle longest, cycling every backend of the pool even one
        // request at a time.
        // Every session the pool opens once the schema is ready is warmed before it is handed out
        // (`warm()` in sql/schema.sql): a fresh backend compiles and plans the hot paths on its
        // first calls, which would otherwise stall a request holding its buckets' row locks.
        let schema_ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let warm_sql: Arc<str> = Arc::from(format!("SELECT \"{}\".warm()", options.schema));
        let (ready, hook_sql) = (Arc::clone(&schema_ready), Arc::clone(&warm_sql));
        let warm = deadpool_postgres::Hook::async_fn(move |client, _| {
            let (ready, warm_sql) = (Arc::clone(&ready), Arc::clone(&hook_sql));
            Box::pin(async move {
                if ready.load(Ordering::Acquire) {
                    warm_session(client, &warm_sql).await;
                }
                Ok(())
            })
        });
        let pool = Pool::builder(manager)
            .post_create(warm)
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .max_size(options.pool_size.max(1))
            .wait_timeout(Some(options.statement_timeout))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| PgError::Unreachable(e.to_string()))?;
        let client = pool.get().await.map_err(|e| PgError::Unreachable(e.to_string()))?;
        let fsync: String = client.query_one("SHOW fsync", &[]).await?.get(0);
        if fsync == "off" {
            return Err(PgError::FsyncOff);
        }
        let synchronous_commit: String = client.query_one("SHOW synchronous_commit", &[]).await?.get(0);
        if synchronous_commit == "off" {
            tracing::warn!(
                "PostgreSQL runs with synchronous_commit=off: a grant acknowledged just before a database crash may be lost"
            );
        }
        let schema_error = |e: tokio_postgres::Error| PgError::Schema {
            schema: options.schema.clone(),
            message: e.as_db_error().map_or_else(|| e.to_string(), |db| db.message().to_owned()),
        };
        migrate(&client, &options.schema).await.map_err(schema_error)?;
        let script = SCHEMA_SQL.replace("__SCHEMA__", &format!("\"{}\"", options.schema));
        client.batch_execute(&script).await.map_err(schema_error)?;
        // A server's start is a restart for the line (section 12.6): tickets live at the
        // database's latest instant keep their place for at least their grace from now.
        let at = options.clock.as_ref().map(|c| millis_to_sql(c.now()));
        let resume = format!("SELECT \"{}\".resume_line($1)", options.schema);
        client.query_one(&resume, &[&at]).await?;
        schema_ready.store(true, Ordering::Release);
        warm_session(&client, &warm_sql).await;
        drop(client);
        let batch_sql = Statements::file(ACQUIRE_WINDOW_BATCH_SQL, &options.schema);
        let faults = Arc::new(faults::Faults::new(options.clock.clone()));
        let batcher = Arc::new(batch::Batcher::new(pool.clone(), batch_sql, options.batchers, Arc::clone(&faults)));
        Ok(PgLimiter {
            wakes: Arc::new(wakes::Wakes::new(options.max_waits)),
            listen_config,
            batcher,
            pool,
            schema: options.schema.clone(),
            sql: Statements::new(&options.schema),
            permit_key: random_permit_key()?,
            sequence: AtomicU64::new(0),
            metrics: Arc::new(redb_limiter::metrics::Metrics::default()),
            synchronous_commit,
            started: std::time::Instant::now(),
            faults,
            probing: tokio::sync::Mutex::new(()),
            probes: AtomicU64::new(0),
            window_decided: AtomicU64::new(0),
            window_left: AtomicU64::new(0),
            options,
        })
    }

    /// The schema this limiter serves.
    #[must_use]
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The database's `synchronous_commit` setting at connect.
    #[must_use]
    pub fn synchronous_commit(&self) -> &str {
        &self.synchronous_commit
    }

    #[must_use]
    pub fn metrics(&self) -> &redb_limiter::metrics::Metrics {
        &self.metrics
    }

    /// The instant to pass as `at_ms`: the injected clock's, or NULL for the database's.
    fn at(&self) -> Option<i64> {
        self.options.clock.as_ref().map(|c| millis_to_sql(c.now()))
    }

    fn next_permit(&self) -> PermitId {
        let seq = self.sequence.fetch_add(1, Ordering::Relaxed);
        permit_id(self.permit_key, seq)
    }

    /// Remembers what a database call said, for `/health`: an answer (a bad request the
    /// database refused included) shows it reachable. A database error was recorded where it
    /// arose, as out or as the request's own ([`faults`]); an answer this crate could not read
    /// says nothing about the database.
    fn record<T>(&self, result: &Result<T, LimiterError>) {
        if !matches!(result, Err(LimiterError::Unavailable(_))) {
            self.faults.answered();
        }
    }

    /// The latest outcome as `/health`'s answer, while it is fresh.
    fn fresh_outcome(&self) -> Option<Result<(), LimiterError>> {
        self.faults.fresh(HEALTH_FRESH_MS)
    }

    /// One call of a schema function returning one value; its outcome is recorded for
    /// `/health`.
    async fn call<T>(&self, sql: &str, params: &[&(dyn tokio_postgres::types::ToSql + Sync)]) -> Result<T, LimiterError>
    where
        T: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        let result = async { self.query_row(sql, params).await?.try_get(0).map_err(|e| unavailable(&e)) }.await;
        self.record(&result);
        result
    }

    /// One statement answering one row (prepared once per connection); a database error is
    /// `unavailable`, except the functions' own bad-request code (RL400).
    async fn query_row(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, LimiterError> {
        let client = self.pool.get().await.map_err(|e| self.faults.pool(&e))?;
        let result = async { client.query_one(&client.prepare_cached(sql).await?, params).await }.await;
        result.map_err(|e| match e.as_db_error() {
            Some(db) if db.code().code() == "RL400" => {
                LimiterError::BadRequest(redb_limiter::BadRequest(db.message().to_owned()))
            }
            _ => self.session_failed(client, &e),
        })
    }

    /// A database error on `client`'s session: recorded and logged ([`faults`]); a session whose
    /// database is out (cut, closed, shut down) is closed rather than handed out again, so the
    /// next request opens a fresh one instead of failing on it too.
    fn session_failed(&self, client: deadpool_postgres::Client, e: &tokio_postgres::Error) -> LimiterError {
        if faults::database_out(e) {
            drop(deadpool_postgres::Object::take(client));
        }
        self.faults.database(e)
    }

    /// Decides an acquire (with the figures after it when the request asked for a report); a
    /// grant is answered only once the database committed it.
    pub async fn acquire(&self, req: AcquireRequest) -> Result<Acquired, LimiterError> {
        let result = match windows_only(&req) {
            Some([limit]) => self.acquire_window_grouped(&req, limit).await,
            Some(_) => self.acquire_windows(&req).await,
            None => return self.acquire_any(req).await,
        };
        self.record(&result);
        let decision = result?;
        self.count(&decision);
        Ok(Acquired { decision, report: None, ticket: None, no_ticket: None })
    }

    /// Any acquire, by a call of the schema's `acquire()`, or of `acquire_id()` for one named by
    /// an `id` (section 16).
    async fn acquire_any(&self, req: AcquireRequest) -> Result<Acquired, LimiterError> {
        let permit = self.next_permit().to_string();
        let mode = if req.report { "report" } else { "acquire" };
        let body = request_json(&req, self.options.line_horizon_ms);
        let recheck_ms = to_i64(self.options.recheck_ms);
        let reply: Value = match req.id.as_deref() {
            None => self.call(&self.sql.acquire, &[&body, &mode, &recheck_ms, &permit, &self.at()]).await?,
            Some(id) => {
                let (id, params) = (escape(id), params_hex(&req));
                let id: &str = &id;
                self.call(&self.sql.acquire_id, &[&body, &mode, &recheck_ms, &permit, &id, &params, &self.at()]).await?
            }
        };
        let decision = decision_from(&reply).ok_or_else(|| protocol(&reply))?;
        self.count(&decision);
        let report = if req.report { Some(report_from(&reply).ok_or_else(|| protocol(&reply))?) } else { None };
        let ticket = ticket_from(&reply).ok_or_else(|| protocol(&reply))?;
        // A retry answered from its id's record changed nothing of the line.
        if reply.get("again").and_then(Value::as_bool) != Some(true) {
            self.count_line(&req, &reply, ticket.as_ref());
        }
        let no_ticket = reply.get("noTicket").and_then(Value::as_str).and_then(NoTicket::parse);
        Ok(Acquired { decision, report, ticket, no_ticket })
    }

    /// Counts in the metrics what an acquire did to the line, as the file counts its effects: a
    /// ticket lapsed at the ask, a ticket filed (the reply names one the request did not
    /// present), a ticket granted with its wait.
    fn count_line(&self, req: &AcquireRequest, reply: &Value, ticket: Option<&TicketNote>) {
        if reply.get("lapsedTicket").and_then(Value::as_bool) == Some(true) {
            self.metrics.ticket("lapsed");
        }
        if let Some(note) = ticket
            && req.ticket.as_deref().is_none_or(|presented| presented.parse::<TicketId>() != Ok(note.id))
        {
            self.metrics.ticket("filed");
        }
        if let Some(waited) = reply.get("waitedMs").and_then(Value::as_u64) {
            self.metrics.ticket_granted(waited);
        }
    }

    /// An acquire of one window limit: in a batch with those of concurrent requests when others
    /// are in flight (see [`batch`]), else, or when the batch leaves it, alone.
    async fn acquire_window_grouped(&self, req: &AcquireRequest, limit: &Limit) -> Result<Decision, LimiterError> {
        // One instant for the request, whichever path decides it (the injected clock's).
        let at = self.at();
        let window = limit.window.as_ref().expect("windows_only picks window limits");
        let item = || batch::Item {
            key: limit.key.clone(),
            calls: to_i64(window.calls),
            per_ms: to_i64(window.per_ms),
            cost: to_i64(limit.cost),
            caller: req.key.clone(),
            at,
        };
        match self.batcher.submit(item).await {
            batch::Turn::Lead(_turn) => self.acquire_window(req, limit, at).await,
            batch::Turn::Alone => self.acquire_window(req, limit, at).await,
            batch::Turn::Decided(decision) => decision,
        }
    }

    /// An acquire of one window limit, by the one statement of `sql/acquire_window.sql` at `at`
    /// (`None`: the database's clock): its row is the decision, or carries `acquire()`'s reply
    /// when it left the request to it.
    async fn acquire_window(
        &self,
        req: &AcquireRequest,
        limit: &Limit,
        at: Option<i64>,
    ) -> Result<Decision, LimiterError> {
        let window = limit.window.as_ref().expect("windows_only picks window limits");
        let (key, caller) = (escape(&limit.key), escape(&req.key));
        let (key, caller): (&str, &str) = (&key, &caller);
        let row = self
            .query_row(
                &self.sql.acquire_window,
                &[
                    &key,
                    &to_i64(window.calls),
                    &to_i64(window.per_ms),
                    &to_i64(limit.cost),
                    &caller,
                    &at,
                    &to_i64(self.options.recheck_ms),
                    &to_i64(req.hold_ms),
                    &to_i64(limit.hold_ms),
                ],
            )
            .await?;
        let column = |i: usize| row.try_get::<_, Option<i64>>(i).map_err(|e| unavailable(&e));
        if let Some(decision) = self.left_to_acquire(&row, 4)? {
            return Ok(decision);
        }
        let verdict: &str = row.try_get(0).map_err(|e| unavailable(&e))?;
        let (until, rate_at, now) = (column(1)?, column(2)?, column(3)?);
        let unexpected = || LimiterError::Unavailable(format!("PostgreSQL answered an unexpected verdict {verdict:?}"));
        match (verdict, until, rate_at, now) {
            ("g", _, _, Some(now)) => Ok(Decision::Granted { at: millis_from_sql(now), permit: None }),
            ("r", _, Some(at), _) => {
                Ok(Decision::Refused { retry_at: millis_from_sql(at), reason: Reason::Rate, limit: limit.key.clone() })
            }
            ("t", Some(until), _, _) => Ok(Decision::Refused {
                retry_at: millis_from_sql(until),
                reason: Reason::Throttle,
                limit: req.key.clone(),
            }),
            _ => Err(unexpected()),
        }
    }

    /// `acquire()`'s decision when the one-statement acquire left the request to it (its reply
    /// in column `at`), `None` when the statement decided itself; counts which path it was.
    fn left_to_acquire(&self, row: &tokio_postgres::Row, at: usize) -> Result<Option<Decision>, LimiterError> {
        let reply: Option<Value> = row.try_get(at).map_err(|e| unavailable(&e))?;
        let Some(reply) = reply else {
            self.window_decided.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        self.window_left.fetch_add(1, Ordering::Relaxed);
        decision_from(&reply).ok_or_else(|| protocol(&reply)).map(Some)
    }

    /// An acquire of two or more window limits, by the one statement of
    /// `sql/acquire_windows.sql`: its row is the decision, or carries `acquire()`'s reply when
    /// it left the request to it.
    async fn acquire_windows(&self, req: &AcquireRequest) -> Result<Decision, LimiterError> {
        let keys: Vec<std::borrow::Cow<'_, str>> = req.limits.iter().map(|l| escape(&l.key)).collect();
        let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
        let caller = escape(&req.key);
        let caller: &str = &caller;
        let figure = |f: fn(&Limit) -> u64| req.limits.iter().map(|l| to_i64(f(l))).collect::<Vec<i64>>();
        let calls = figure(|l| l.window.map_or(0, |w| w.calls));
        let per = figure(|l| l.window.map_or(0, |w| w.per_ms));
        let costs = figure(|l| l.cost);
        let holds = figure(|l| l.hold_ms);
        let row = self
            .query_row(
                &self.sql.acquire_windows,
                &[
                    &keys,
                    &calls,
                    &per,
                    &costs,
                    &caller,
                    &self.at(),
                    &to_i64(self.options.recheck_ms),
                    &to_i64(req.hold_ms),
                    &holds,
                ],
            )
            .await?;
        if let Some(decision) = self.left_to_acquire(&row, 5)? {
            return Ok(decision);
        }
        let verdict: &str = row.try_get(0).map_err(|e| unavailable(&e))?;
        let retry: Option<i64> = row.try_get(1).map_err(|e| unavailable(&e))?;
        let reason: Option<&str> = row.try_get(2).map_err(|e| unavailable(&e))?;
        let limit: Option<&str> = row.try_get(3).map_err(|e| unavailable(&e))?;
        let now: Option<i64> = row.try_get(4).map_err(|e| unavailable(&e))?;
        match (verdict, retry, reason.and_then(Reason::parse), limit, now) {
            ("g", _, _, _, Some(now)) => Ok(Decision::Granted { at: millis_from_sql(now), permit: None }),
            ("x", Some(retry), Some(reason), Some(limit), _) => Ok(Decision::Refused {
                retry_at: millis_from_sql(retry),
                reason,
                limit: unescape(limit).ok_or_else(|| protocol(&json!(limit)))?.into_owned(),
            }),
            _ => Err(LimiterError::Unavailable(format!("PostgreSQL answered an unexpected verdict {verdict:?}"))),
        }
    }

    /// Counts in the metrics the cuts and growths an outcome made (section 14).
    fn count_ceilings(&self, reply: &Value) {
        for (field, change) in [("cuts", "cut"), ("growths", "growth")] {
            for _ in 0..reply.get(field).and_then(Value::as_u64).unwrap_or(0) {
                self.metrics.ceiling_changed(change);
            }
        }
    }

    fn count(&self, decision: &Decision) {
        match decision {
            Decision::Granted { .. } => self.metrics.decided("acquire", "granted", ""),
            Decision::Refused { reason, .. } => self.metrics.decided("acquire", "refused", reason.as_str()),
        }
    }

    /// Decides as an acquire would at the same instant and changes nothing (a request named by
    /// an id answered before: as it would be answered again).
    pub async fn peek(&self, req: AcquireRequest) -> Result<Peeked, LimiterError> {
        let body = request_json(&req, self.options.line_horizon_ms);
        let recheck_ms = to_i64(self.options.recheck_ms);
        let reply: Value = match req.id.as_deref() {
            None => self.call(&self.sql.peek, &[&body, &recheck_ms, &"", &self.at()]).await?,
            Some(id) => {
                let (id, params) = (escape(id), params_hex(&req));
                let id: &str = &id;
                self.call(&self.sql.peek_id, &[&body, &recheck_ms, &id, &params, &self.at()]).await?
            }
        };
        let peeked = peeked_from(&reply).ok_or_else(|| protocol(&reply))?;
        match &peeked.refusal {
            None => self.metrics.decided("peek", "fits", ""),
            Some(r) => self.metrics.decided("peek", "refused", r.reason.as_str()),
        }
        Ok(peeked)
    }

    /// Releases a permit (settling `costs` first, in the same transaction): `true` when it was
    /// live.
    /// With an outcome (section 14), counted on the permit's adapted buckets before it goes.
    pub async fn release(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        let costs = (!req.costs.is_empty()).then(|| costs_json(&req.costs));
        let permit = escape(&req.permit);
        let permit: &str = &permit;
        let released = match req.outcome {
            None => self.call(&self.sql.release, &[&permit, &costs, &self.at()]).await?,
            Some(outcome) => {
                let reply: Value =
                    self.call(&self.sql.release_outcome, &[&permit, &costs, &outcome.as_str(), &self.at()]).await?;
                self.count_ceilings(&reply);
                reply.get("released").and_then(Value::as_bool).ok_or_else(|| protocol(&reply))?
            }
        };
        self.metrics.decided("release", if released { "released" } else { "unknown" }, "");
        Ok(released)
    }

    /// Settles a permit's grant to its real costs: `true` when the permit was live. An outcome
    /// (section 14) then counts on its adapted buckets.
    pub async fn settle(&self, req: SettleRequest) -> Result<bool, LimiterError> {
        let permit = escape(&req.permit);
        let permit: &str = &permit;
        let costs = costs_json(&req.costs);
        let result: Result<Value, LimiterError> = match req.outcome {
            None => self.call(&self.sql.settle, &[&permit, &costs, &self.at()]).await,
            Some(outcome) => {
                self.call(&self.sql.settle_outcome, &[&permit, &costs, &outcome.as_str(), &self.at()]).await
            }
        };
        if let Ok(reply) = &result {
            self.count_ceilings(reply);
        }
        let reply = match result {
            Err(e @ LimiterError::BadRequest(_)) => {
                self.metrics.decided("settle", "bad_request", "");
                return Err(e);
            }
            other => other?,
        };
        let settled = reply.get("settled").and_then(Value::as_bool).ok_or_else(|| protocol(&reply))?;
        self.metrics.decided("settle", if settled { "settled" } else { "unknown" }, "");
        Ok(settled)
    }

    /// Throttles a caller (only ever extends); the throttle in force afterwards.
    /// A `permit` counts as a `limited` outcome on its adapted buckets (section 14).
    pub async fn throttle(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        let key = escape(&req.key);
        let key: &str = &key;
        let until: Option<i64> = match &req.permit {
            None => self.call(&self.sql.throttle, &[&key, &millis_to_sql(req.until), &self.at()]).await?,
            Some(permit) => {
                let permit = escape(permit);
                let permit: &str = &permit;
                let reply: Value = self
                    .call(&self.sql.throttle_permit, &[&key, &millis_to_sql(req.until), &permit, &self.at()])
                    .await?;
                self.count_ceilings(&reply);
                reply.get("until").and_then(Value::as_i64)
            }
        };
        let until = until.map(millis_from_sql);
        self.metrics.decided("throttle", if until.is_some() { "in_force" } else { "none" }, "");
        Ok(until)
    }

    /// Leaves the line (`release {ticket}`, section 12.4): `true` when a live ticket left its
    /// lines. A string that is no ticket of ours is unknown without asking the database.
    pub async fn leave(&self, req: LeaveRequest) -> Result<bool, LimiterError> {
        let left = if req.ticket.parse::<TicketId>().is_ok() {
            let ticket: &str = &req.ticket;
            self.call(&self.sql.leave, &[&ticket, &self.at()]).await?
        } else {
            false
        };
        self.metrics.decided("release", if left { "left" } else { "unknown" }, "");
        if left {
            self.metrics.ticket("left");
        }
        Ok(left)
    }

    /// `release {id}` (section 16): undoes what the acquire named `req.id` got (its permit
    /// released, settled first to `costs`; the window shares of a grant without one settled to
    /// `costs`; its ticket out of the line), in one transaction, and remembers the id as
    /// released. `true` when it changed something; an id never seen is remembered as released
    /// (`false`).
    pub async fn undo(&self, req: UndoRequest) -> Result<bool, LimiterError> {
        let costs = (!req.costs.is_empty()).then(|| costs_json(&req.costs));
        let id = escape(&req.id);
        let id: &str = &id;
        let reply: Value = match self.call(&self.sql.undo, &[&id, &costs, &self.at()]).await {
            Err(e @ LimiterError::BadRequest(_)) => {
                self.metrics.decided("release", "bad_request", "");
                return Err(e);
            }
            other => other?,
        };
        let released = reply.get("released").and_then(Value::as_bool).ok_or_else(|| protocol(&reply))?;
        self.metrics.decided("release", if released { "released" } else { "unknown" }, "");
        if reply.get("left").and_then(Value::as_bool) == Some(true) {
            self.metrics.ticket("left");
        }
        Ok(released)
    }

    /// Ends the throttle of a caller: `true` when one was in force.
    pub async fn lift(&self, req: LiftRequest) -> Result<bool, LimiterError> {
        let key = escape(&req.key);
        let key: &str = &key;
        let lifted: bool = self.call(&self.sql.lift, &[&key, &self.at()]).await?;
        self.metrics.decided("lift", if lifted { "lifted" } else { "none" }, "");
        Ok(lifted)
    }

    /// The live state whose keys start with `prefix`, from `after`, at most `limit` entries of
    /// each kind.
    pub async fn state_page(&self, prefix: &str, after: &str, limit: usize) -> Result<StatePage, LimiterError> {
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        let (prefix, after) = (escape(prefix), escape(after));
        let prefix: &str = &prefix;
        let after = (!after.is_empty()).then_some(after.as_ref());
        let rows = async {
            let client = self.pool.get().await.map_err(|e| self.faults.pool(&e))?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&prefix, &after, &limit, &self.at()];
            let result = async { client.query(&client.prepare_cached(&self.sql.state).await?, &params).await }.await;
            result.map_err(|e| self.session_failed(client, &e))
        }
        .await;
        self.record(&rows);
        page_from(&rows?, usize::try_from(limit).unwrap_or(0))
    }

    /// The live state whose keys start with `prefix`, at most `limit` entries of each kind.
    pub async fn state(&self, prefix: &str, limit: usize) -> Result<Snapshot, LimiterError> {
        Ok(self.state_page(prefix, "", limit).await?.snapshot)
    }

    /// Deletes lapsed places, lapsed tickets (counted in the metrics), grants past their
    /// bucket's retention, idle buckets and ended throttles, at most `batch` rows of each; how
    /// many rows went.
    pub async fn sweep(&self, batch: i32) -> Result<i32, LimiterError> {
        let lapsed: i32 = self.call(&self.sql.sweep_tickets, &[&batch, &self.at()]).await?;
        for _ in 0..lapsed {
            self.metrics.ticket("lapsed");
        }
        let rows: i32 = self.call(&self.sql.sweep, &[&batch, &self.at()]).await?;
        Ok(rows + lapsed)
    }

    /// Sweeps `batch` rows at a time until a call deletes nothing or `max_batches` calls ran:
    /// what one sweeper tick does. How many rows went.
    pub async fn sweep_backlog(&self, batch: i32, max_batches: usize) -> Result<u64, LimiterError> {
        let mut done = 0u64;
        for _ in 0..max_batches {
            let rows = self.sweep(batch).await?;
            done += u64::try_from(rows).unwrap_or(0);
            if rows <= 0 {
                break;
            }
        }
        Ok(done)
    }

    /// Whether the database answers: the latest call's outcome while it is fresh (a failure
    /// stands until a later success), else one `SELECT 1`.
    pub async fn health(&self) -> Result<(), LimiterError> {
        if let Some(answer) = self.fresh_outcome() {
            return answer;
        }
        let _one_probe = self.probing.lock().await;
        // A probe that finished while this one waited answers for it.
        if let Some(answer) = self.fresh_outcome() {
            return answer;
        }
        self.probes.fetch_add(1, Ordering::Relaxed);
        let result = async {
            let client = self.pool.get().await.map_err(|e| self.faults.pool(&e))?;
            let result = client.simple_query("SELECT 1").await;
            result.map(drop).map_err(|e| self.session_failed(client, &e))
        }
        .await;
        self.record(&result);
        result
    }

    /// How many `SELECT 1` probes `health` ran (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn health_probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    /// How many window-only acquires `sql/acquire_window.sql` and `sql/acquire_windows.sql`
    /// decided themselves, and how many they left to `acquire()` (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn window_paths(&self) -> (u64, u64) {
        (self.window_decided.load(Ordering::Relaxed), self.window_left.load(Ordering::Relaxed))
    }

    /// How many batch statements (`sql/acquire_window_batch.sql`, two or more one-window
    /// acquires each) this limiter sent, how many requests they decided and how many they left
    /// to go alone (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn batch_paths(&self) -> (u64, u64, u64) {
        self.batcher.paths()
    }

    /// How many batch statements failed for a request's sake, their requests then decided
    /// again one by one (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn batches_failed(&self) -> u64 {
        self.batcher.failed()
    }

    /// The batch statement as this limiter sends it (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn acquire_window_batch_sql(&self) -> &str {
        self.batcher.sql()
    }

    /// The one-window statement as this limiter sends it (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn acquire_window_sql(&self) -> &str {
        &self.sql.acquire_window
    }

    /// Closes the pool's sessions that no request took for longer than
    /// [`PgOptions::idle_session`]; how many it closed. Sessions in use are not touched.
    pub fn close_idle_sessions(&self) -> usize {
        let idle = self.options.idle_session;
        self.pool.retain(|_, metrics| metrics.last_used() < idle).removed.len()
    }

    /// Runs [`PgLimiter::sweep_backlog`] (up to [`SWEEP_BATCHES_PER_TICK`] batches of
    /// [`SWEEP_BATCH`]) and [`PgLimiter::close_idle_sessions`] every `every`, the first at
    /// once, until the limiter is dropped (the task holds a weak handle).
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(limiter) = weak.upgrade() else { return };
                if let Err(e) = limiter.sweep_backlog(SWEEP_BATCH, SWEEP_BATCHES_PER_TICK).await {
                    tracing::debug!(error = %e, "sweep failed; the next one tries again");
                }
                let closed = limiter.close_idle_sessions();
                if closed > 0 {
                    tracing::debug!(closed, "closed database sessions left unused");
                }
            }
        });
    }
}

impl Backend for PgLimiter {
    fn kind(&self) -> &'static str {
        "postgres"
    }
    fn path(&self) -> Option<&std::path::Path> {
        None
    }
    async fn outage(&self) -> Option<String> {
        self.health().await.err().map(|e| e.to_string())
    }
    /// The host's clock, used only to bound a throttle's `until` and stamp the feed; decisions
    /// use the database's.
    fn now(&self) -> Millis {
        self.options.clock.as_ref().map_or_else(redb_limiter::time::wall_clock_now, |c| c.now())
    }
    fn uptime(&self) -> Duration {
        self.started.elapsed()
    }
    fn metrics(&self) -> &redb_limiter::metrics::Metrics {
        &self.metrics
    }
    async fn acquire(&self, req: AcquireRequest) -> Result<Acquired, LimiterError> {
        PgLimiter::acquire(self, req).await
    }
    async fn peek(&self, req: AcquireRequest) -> Result<Peeked, LimiterError> {
        PgLimiter::peek(self, req).await
    }
    async fn release(&self, req: ReleaseRequest) -> Result<bool, LimiterError> {
        PgLimiter::release(self, req).await
    }
    async fn leave(&self, req: LeaveRequest) -> Result<bool, LimiterError> {
        PgLimiter::leave(self, req).await
    }
    async fn undo(&self, req: UndoRequest) -> Result<bool, LimiterError> {
        PgLimiter::undo(self, req).await
    }
    async fn settle(&self, req: SettleRequest) -> Result<bool, LimiterError> {
        PgLimiter::settle(self, req).await
    }
    async fn throttle(&self, req: ThrottleRequest) -> Result<Option<Millis>, LimiterError> {
        PgLimiter::throttle(self, req).await
    }
    async fn lift(&self, req: LiftRequest) -> Result<bool, LimiterError> {
        PgLimiter::lift(self, req).await
    }
    fn keeps_waits(&self) -> bool {
        true
    }
    async fn wait(&self, req: WaitRequest) -> Result<WaitAnswer, LimiterError> {
        PgLimiter::wait(self, req).await
    }
    fn end_waits(&self) {
        PgLimiter::end_waits(self);
    }
    async fn state_page(&self, prefix: String, after: String, limit: usize) -> Result<StatePage, LimiterError> {
        PgLimiter::state_page(self, &prefix, &after, limit).await
    }
}

/// The limits of a request that `sql/acquire_window.sql` (one) or `sql/acquire_windows.sql`
/// (more) decides: an acquire (no report, no permit, no `queue`, `ticket` or `id`) of window
/// limits only, each with a cost above 0. Those statements leave a bucket with a line to
/// `acquire()`; a token bucket (section 13) and an adapted limit (section 14) never reach them:
/// `acquire()` decides them.
fn windows_only(req: &AcquireRequest) -> Option<&[Limit]> {
    let plain = |l: &Limit| {
        l.window.is_some() && l.bucket.is_none() && l.concurrent.is_none() && l.adapt.is_none() && l.cost > 0
    };
    (!req.report
        && !req.permit
        && !req.in_line()
        && req.id.is_none()
        && !req.limits.is_empty()
        && req.limits.iter().all(plain))
    .then_some(req.limits.as_slice())
}

/// The digest of what a retry with the same id must repeat (section 16), as the engine computes
/// it, in the 32 hex digits `acquire_id()` keeps.
fn params_hex(req: &AcquireRequest) -> String {
    format!("{:032x}", redb_limiter::engine::params_digest(req))
}

fn costs_json(costs: &[Cost]) -> Value {
    Value::Array(costs.iter().map(|c| json!({ "key": escape(&c.key), "cost": c.cost })).collect())
}

/// An acquire's JSON as `acquire()` takes it: the caller and limit keys escaped, for a request
/// in the line the server's horizon (section 12.9) as `lineHorizonMs`, and no `id` (which
/// `acquire_id()` takes escaped, apart).
fn request_json(req: &AcquireRequest, line_horizon_ms: u64) -> Value {
    let mut body = req.to_json();
    if req.id.is_some()
        && let Some(obj) = body.as_object_mut()
    {
        obj.remove("id");
    }
    if req.in_line()
        && let Some(obj) = body.as_object_mut()
    {
        obj.insert("lineHorizonMs".into(), Value::from(line_horizon_ms));
    }
    let escape_key = |v: &mut Value| {
        if let Some(Value::String(s)) = v.get_mut("key")
            && let std::borrow::Cow::Owned(escaped) = escape(s)
        {
            *s = escaped;
        }
    };
    escape_key(&mut body);
    // A ticket string that is none of ours is unknown: the request queues without it (12.3).
    if req.ticket.as_deref().is_some_and(|t| t.parse::<TicketId>().is_err())
        && let Some(obj) = body.as_object_mut()
    {
        obj.remove("ticket");
        obj.insert("queue".into(), Value::Bool(true));
    }
    if let Some(limits) = body.get_mut("limits").and_then(Value::as_array_mut) {
        limits.iter_mut().for_each(escape_key);
    }
    body
}

/// A key (or permit string) field of a reply, unescaped.
fn key_at(v: &Value, field: &str) -> Option<String> {
    unescape(v.get(field)?.as_str()?).map(std::borrow::Cow::into_owned)
}

fn figures_from(reply: &Value) -> Option<Vec<Figures>> {
    let mut out = Vec::new();
    for f in reply.get("limits")?.as_array()? {
        let pair = |a: &str, b: &str| Some((f.get(a)?.as_u64()?, f.get(b)?.as_u64()?));
        out.push(Figures {
            key: key_at(f, "key")?,
            window: pair("used", "remaining"),
            places: pair("held", "free"),
            bucket: f.get("level").and_then(Value::as_i64).zip(f.get("burst").and_then(Value::as_u64)),
            queued: f.get("queued").and_then(Value::as_u64),
            ceiling: f.get("ceiling").and_then(Value::as_u64),
        });
    }
    Some(out)
}

/// The ticket a refusal names (section 12.1), if any; `None` when the reply is malformed.
fn ticket_from(reply: &Value) -> Option<Option<TicketNote>> {
    let Some(ticket) = reply.get("ticket") else { return Some(None) };
    Some(Some(TicketNote {
        id: ticket.as_str()?.parse().ok()?,
        lapse_at: millis_at(reply, "lapseAt")?,
        ahead: reply.get("ahead")?.as_u64()?,
        now: millis_at(reply, "now")?,
    }))
}

fn report_from(reply: &Value) -> Option<Report> {
    Some(Report { now: millis_at(reply, "now")?, limits: figures_from(reply)? })
}

fn peeked_from(reply: &Value) -> Option<Peeked> {
    let refusal = if reply.get("fits")?.as_bool()? {
        None
    } else {
        Some(Refusal {
            retry_at: millis_at(reply, "retryAt")?,
            reason: Reason::parse(reply.get("reason")?.as_str()?)?,
            limit: key_at(reply, "limit")?,
        })
    };
    Some(Peeked { refusal, report: report_from(reply)? })
}

/// The database the tests run against: `REDB_LIMITER_TEST_POSTGRES` (`.ci/run` starts one).
/// Under `CI=true` a missing URL panics; elsewhere the tests say loudly that they did not run.
#[doc(hidden)]
#[must_use]
pub fn test_database_url() -> Option<String> {
    match std::env::var("REDB_LIMITER_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("REDB_LIMITER_TEST_POSTGRES is not set: .ci/run must start PostgreSQL for these tests")
        }
        _ => {
            eprintln!("NOT RUN: set REDB_LIMITER_TEST_POSTGRES=postgres://… (or run .ci/run) to test PostgreSQL mode");
            None
        }
    }
}

fn protocol(reply: &Value) -> LimiterError {
    LimiterError::Unavailable(format!("PostgreSQL answered something unexpected: {reply}"))
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn millis_to_sql(m: Millis) -> i64 {
    to_i64(m.0)
}

fn millis_from_sql(v: i64) -> Millis {
    Millis(u64::try_from(v).unwrap_or(0))
}

fn millis_at(v: &Value, field: &str) -> Option<Millis> {
    v.get(field)?.as_i64().map(millis_from_sql)
}

fn decision_from(reply: &Value) -> Option<Decision> {
    if reply.get("granted")?.as_bool()? {
        let permit = match reply.get("permit") {
            None | Some(Value::Null) => None,
            Some(p) => Some(PermitId::from_str(p.as_str()?).ok()?),
        };
        Some(Decision::Granted { at: millis_at(reply, "at")?, permit })
    } else {
        Some(Decision::Refused {
            retry_at: millis_at(reply, "retryAt")?,
            reason: Reason::parse(reply.get("reason")?.as_str()?)?,
            limit: key_at(reply, "limit")?,
        })
    }
}

/// A `/state` page from the rows of `state_rows()` (see the function): at most `limit` of each
/// kind, truncated when one kind had more. A row this crate cannot read (a key that is no
/// escaped form, an id it did not issue) fails the page: nothing is made up.
fn page_from(rows: &[tokio_postgres::Row], limit: usize) -> Result<StatePage, LimiterError> {
    let bad = |why: &dyn std::fmt::Display| {
        LimiterError::Unavailable(format!("PostgreSQL answered an unexpected state row: {why}"))
    };
    let mut now = None;
    let mut view = StateView::default();
    let mut truncated = false;
    // Each bucket's line ('q' rows: queued, first ticket filed, first ticket), merged by key below.
    let mut lines: Vec<(String, u64, Option<Millis>, Option<TicketId>)> = Vec::new();
    // Each token bucket's level ('l' rows: level, burst), merged by key below.
    let mut levels: Vec<(String, i64, u64)> = Vec::new();
    for row in rows {
        let number = |i: usize| row.try_get::<_, Option<i64>>(i).map_err(|e| bad(&e));
        let count = |i: usize| number(i).map(|v| u64::try_from(v.unwrap_or(0)).unwrap_or(0));
        let instant = |i: usize| number(i).map(|v| v.map(millis_from_sql));
        let text = |k: &str| unescape(k).map(std::borrow::Cow::into_owned).ok_or_else(|| bad(&format!("key {k:?}")));
        let key = || text(row.try_get::<_, &str>(1).map_err(|e| bad(&e))?);
        let kind: &str = row.try_get(0).map_err(|e| bad(&e))?;
        // Buckets and lines are merged first, then cut to the page (below).
        let taken = match kind {
            "p" => view.permits.len(),
            "t" => view.throttles.len(),
            "c" => view.ceilings.len(),
            _ => 0,
        };
        if taken == limit && kind != "n" {
            truncated = true; // one more than the page: more remain
            continue;
        }
        match kind {
            "n" => now = instant(2)?,
            "b" => view.buckets.push(BucketView {
                key: key()?,
                meta: BucketMeta { retain_ms: count(5)?, last_calls: count(4)?, last_concurrent: count(6)? },
                window_used: count(3)?,
                oldest_grant: instant(7)?,
                grant_entries: 0,
                places_held: usize::try_from(count(8)?).unwrap_or(usize::MAX),
                next_lapse: instant(9)?,
                queued: 0,
                first_ticket_at: None,
                first_ticket: None,
                level: None,
            }),
            "p" => {
                let keys: Vec<&str> = row.try_get(11).map_err(|e| bad(&e))?;
                let lapses: Vec<i64> = row.try_get(12).map_err(|e| bad(&e))?;
                let mut places = Vec::with_capacity(keys.len());
                for (k, lapse) in keys.into_iter().zip(lapses) {
                    places.push((text(k)?, millis_from_sql(lapse)));
                }
                let id = key()?;
                let id = PermitId::from_str(&id).map_err(|_| bad(&format!("permit {id:?}")))?;
                view.permits.push(PermitView { id, expires: instant(10)?.unwrap_or(Millis(0)), places });
            }
            "t" => view.throttles.push(ThrottleView { key: key()?, until: instant(10)?.unwrap_or(Millis(0)) }),
            "q" => {
                let first: Vec<&str> = row.try_get(11).map_err(|e| bad(&e))?;
                let first = match first.first() {
                    Some(t) => Some(t.parse::<TicketId>().map_err(|()| bad(&format!("ticket {t:?}")))?),
                    None => None,
                };
                lines.push((key()?, count(3)?, instant(7)?, first));
            }
            "l" => levels.push((key()?, number(3)?.unwrap_or(0), count(4)?)),
            "c" => view.ceilings.push((
                key()?,
                Ceiling {
                    c: count(3)?,
                    max: count(4)?,
                    cut_at: instant(10)?,
                    cuts: count(8)?,
                    grown_at: instant(9)?,
                    signal_at: instant(7)?.unwrap_or(Millis(0)),
                },
            )),
            other => return Err(bad(&format!("kind {other:?}"))),
        }
    }
    let now = now.ok_or_else(|| bad(&"no instant"))?;
    {
        // The first `limit` keys of the three lists (each up to `limit + 1` rows), in key
        // order: a bucket with only a line or a level is listed with nothing else counting in it.
        let mut buckets = std::mem::take(&mut view.buckets);
        let entry =
            |buckets: &mut Vec<BucketView>, key: String| match buckets.binary_search_by(|b| b.key.as_str().cmp(&key)) {
                Ok(i) => i,
                Err(i) => {
                    buckets.insert(
                        i,
                        BucketView {
                            key,
                            meta: BucketMeta::default(),
                            window_used: 0,
                            oldest_grant: None,
                            grant_entries: 0,
                            places_held: 0,
                            next_lapse: None,
                            queued: 0,
                            first_ticket_at: None,
                            first_ticket: None,
                            level: None,
                        },
                    );
                    i
                }
            };
        for (key, queued, first, first_ticket) in lines {
            let i = entry(&mut buckets, key);
            buckets[i].queued = usize::try_from(queued).unwrap_or(usize::MAX);
            buckets[i].first_ticket_at = first;
            buckets[i].first_ticket = first_ticket;
        }
        for (key, level, burst) in levels {
            let i = entry(&mut buckets, key);
            buckets[i].level = Some((level, burst));
        }
        if buckets.len() > limit {
            buckets.truncate(limit);
            truncated = true;
        }
        view.buckets = buckets;
    }
    let totals = Totals { buckets: view.buckets.len(), permits: view.permits.len(), throttles: view.throttles.len() };
    Ok(StatePage { snapshot: Snapshot { now, view, totals }, truncated })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each permit id has a random part of its own: consecutive ids share no prefix and their
    /// random parts are unrelated; two limiters (two servers) draw different keys; the low half
    /// is the sequence, so one limiter never repeats an id.
    #[test]
    fn permit_ids_have_a_random_part_of_their_own() {
        let key = random_permit_key().unwrap();
        let high = |id: PermitId| (id.0 >> 64) as u64;
        let ids: Vec<PermitId> = (0..1000).map(|seq| permit_id(key, seq)).collect();
        let parts: std::collections::BTreeSet<u64> = ids.iter().map(|id| high(*id)).collect();
        assert_eq!(parts.len(), ids.len(), "no two ids share their random part");
        for pair in ids.windows(2) {
            assert!((high(pair[0]) ^ high(pair[1])).count_ones() > 10, "{} then {}", pair[0], pair[1]);
            assert_eq!(pair[1].0 as u64, pair[0].0 as u64 + 1, "the low half counts");
        }
        let other = random_permit_key().unwrap();
        assert_ne!(key, other, "each limiter draws its own key");
        assert_ne!(high(permit_id(key, 0)), high(permit_id(other, 0)));
        assert_eq!(permit_id(key, 7), permit_id(key, 7));
    }

    #[test]
    fn schema_names_are_plain_identifiers() {
        for good in ["redb_limiter", "_x", "a1"] {
            assert!(valid_schema(good), "{good}");
        }
        for bad in ["", "1a", "Redb", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert!(!valid_schema(bad), "{bad}");
        }
    }

    #[test]
    fn replies_map_to_decisions() {
        let granted = json!({"granted": true, "at": 5, "permit": "p-0000000000000000000000000000002a", "now": 5});
        assert_eq!(decision_from(&granted), Some(Decision::Granted { at: Millis(5), permit: Some(PermitId(42)) }));
        let refused = json!({"granted": false, "retryAt": 9, "reason": "rate", "limit": "b", "now": 5});
        assert_eq!(
            decision_from(&refused),
            Some(Decision::Refused { retry_at: Millis(9), reason: Reason::Rate, limit: "b".into() })
        );
        assert_eq!(decision_from(&json!({"granted": false, "retryAt": 9, "reason": "nope", "limit": "b"})), None);
        assert_eq!(decision_from(&json!({"granted": true, "at": 5, "permit": "q-1"})), None);
    }
}
