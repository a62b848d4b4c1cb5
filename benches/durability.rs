//! Durable throughput and reopen time of the limiter on a real file.
//!
//! - `durability/grant_1`: one requester, one acquire at a time; every grant waits for its own
//!   durable commit, so this is bound by the disk's flush latency. `bench/durability.sh` runs the
//!   raw fdatasync probe and SQLite (WAL, `synchronous=FULL`) on the same filesystem in the same
//!   run for the ratios.
//! - `durability/grant_16`, `durability/grant_64`: 16 or 64 tasks in-process, each with one
//!   acquire in flight; the writer shares one commit among every request that arrived while the
//!   previous one was flushing. One iteration is one grant.
//! - `durability/grant_N_ids`: the same with a fresh request id on every ask (section 16), as
//!   the clients send them: each grant's record is committed with it and forgotten a minute on.
//! - `durability/grant_N_plain`: the same on the file alone, without its journal (redb's own
//!   commits), measured right after, for the journal's before/after.
//! - `durability/grant_1_caller`: one requester with `caller_commits` on, as the server runs:
//!   a request that arrives alone is committed in its caller's thread, with no hand-off to the
//!   writer thread and back.
//! - `reopen_1m/limiter`: a file with 1,000,000 live window entries (1,000 buckets x 1,000
//!   grants at distinct milliseconds, all inside a one-day window) opened with
//!   `Limiter::open_with` until it answers its first acquire, with the file in the OS page
//!   cache (a process restart).
//!   `reopen_1m/limiter_cold` drops the file from the page cache first (a reboot; Linux only),
//!   and `reopen_1m/store` times only `Store::open` + `load` + `finish_restore`, warm
//!   (`reopen_1m/store_plain`: the same on the file alone, without its journal).
//!
//! Every grant is of cost 1 in one of 1,000 buckets, walked round-robin, with room to spare,
//! in a one-second window as in the peer baselines. When a bucket's window lapses between two
//! of its grants (below 1,000 grants/s), the writer also commits forgetting it; those commits
//! are part of the figure.
//! The files go under `DURABILITY_BENCH_DIR` (default: `target/durability-bench` in the
//! project), never under a temp dir that may live in memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use redb_limiter::engine::{BucketMeta, Effect, Engine, EngineConfig};
use redb_limiter::store::{Opener, Store, file_opener, plain_file_opener};
use redb_limiter::time::{Clock, FakeClock};
use redb_limiter::{AcquireRequest, Limit, Limiter, LimiterOptions, Millis};
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

const BUCKETS: usize = 1_000;
/// Request ids are never reused across iterations: a reused one would be answered from memory.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// In-process requesters, each with one acquire in flight.
const REQUESTERS: [u64; 3] = [1, 16, 64];
/// Grants per bucket in the reopen file, each at its own millisecond.
const GRANTS_PER_BUCKET: u64 = 1_000;
/// The reopen file's window: long enough that nothing lapses while it is built and reopened.
const LONG_WINDOW_MS: u64 = 86_400_000;
const T0: Millis = Millis(1_800_000_000_000);

fn scratch_dir() -> PathBuf {
    let dir = std::env::var_os("DURABILITY_BENCH_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/durability-bench"), PathBuf::from);
    std::fs::create_dir_all(&dir).expect("create the bench directory");
    dir
}

/// A fresh file in the scratch dir, removed when dropped.
fn fresh_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("durability-").tempdir_in(scratch_dir()).expect("create a temp dir")
}

/// Round-robin over 1,000 buckets; never refused (a million calls a second per bucket).
fn grant_requests() -> Vec<AcquireRequest> {
    (0..BUCKETS)
        .map(|i| {
            AcquireRequest::new(format!("caller/{i}"), vec![Limit::window(format!("bench/b:{i}"), 1_000_000, 1000)])
        })
        .collect::<Result<_, _>>()
        .expect("valid requests")
}

/// A bench variant: its name's suffix, how the file is opened, `caller_commits`, and whether
/// each ask carries a fresh request id (section 16).
type Variant = (&'static str, fn() -> Opener, bool, bool);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

async fn grant(limiter: &Limiter, req: &AcquireRequest, id: Option<String>) {
    let mut req = req.clone();
    req.id = id;
    let decision = limiter.acquire(req).await.expect("the limiter answers");
    assert!(decision.is_granted(), "bench requests always have room: {decision:?}");
}

fn grants(c: &mut Criterion) {
    let rt = runtime();
    let reqs = Arc::new(grant_requests());
    let mut group = c.benchmark_group("durability");
    group.throughput(Throughput::Elements(1));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(8));
    group.sample_size(20);

    let dir = fresh_dir();
    for requesters in REQUESTERS {
        // The file behind its journal (production), the same with the caller committing when
        // it is alone (the server's setting) at one requester, then the file alone.
        let variants: &[Variant] = if requesters == 1 {
            &[
                ("", file_opener, false, false),
                ("_caller", file_opener, true, false),
                ("_plain", plain_file_opener, false, false),
            ]
        } else {
            &[
                ("", file_opener, false, false),
                ("_ids", file_opener, false, true),
                ("_plain", plain_file_opener, false, false),
            ]
        };
        for &(suffix, opener, caller_commits, ids) in variants {
            let name = format!("grant_{requesters}{suffix}");
            let options = LimiterOptions { opener: opener(), caller_commits, ..LimiterOptions::default() };
            let limiter = Arc::new(
                Limiter::open_with(dir.path().join(format!("{name}.redb")), options).expect("open the limiter"),
            );
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let started = Instant::now();
                        let mut tasks = JoinSet::new();
                        for t in 0..requesters {
                            // Split `iters` grants as evenly as possible over the requesters.
                            let share = iters / requesters + u64::from(t < iters % requesters);
                            let (limiter, reqs) = (limiter.clone(), reqs.clone());
                            tasks.spawn(async move {
                                for i in 0..share {
                                    let id = ids.then(|| {
                                        let n = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                        format!("r-5f0c2a7e91d34b6880a1c3e5f7092b4d-{n:x}")
                                    });
                                    grant(&limiter, &reqs[((t + i * requesters) as usize) % reqs.len()], id).await;
                                }
                            });
                        }
                        tasks.join_all().await;
                        started.elapsed()
                    })
                })
            });
        }
    }
    group.finish();
}

/// A closed file with `BUCKETS * GRANTS_PER_BUCKET` live window entries, as the engine would
/// have left it after `GRANTS_PER_BUCKET` milliseconds in which every bucket took one grant.
/// Written straight through `Store::commit` with the effects the engine reports for those
/// grants, one commit per millisecond as the limiter would make them, so the pages lie scattered
/// as after real use (the same records in a few big commits reopen cold about twice as fast);
/// through the limiter itself the 1,000,000 requests would take about a minute.
struct ReopenFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
    clock: Arc<FakeClock>,
}

fn build_reopen_file() -> ReopenFile {
    let started = Instant::now();
    let dir = fresh_dir();
    let path = dir.path().join("reopen_1m.redb");
    let mut store = Store::open(&path, &file_opener()).expect("create the store");
    let keys: Vec<Arc<str>> = (0..BUCKETS).map(|i| Arc::from(format!("bench/b:{i}"))).collect();
    let meta = BucketMeta { retain_ms: LONG_WINDOW_MS, last_calls: 1_000_000, last_concurrent: 0 };
    let mut effects: Vec<Effect> = keys.iter().map(|k| Effect::BucketMeta { bucket: k.clone(), meta }).collect();
    for ms in 1..=GRANTS_PER_BUCKET {
        let at = T0.plus(ms);
        effects.extend(keys.iter().map(|k| Effect::WindowGrant { bucket: k.clone(), at, cost: 1 }));
        store.commit(&effects, at).expect("commit");
        effects.clear();
    }
    let rows = store.grant_rows().expect("count the rows");
    assert_eq!(rows, BUCKETS as u64 * GRANTS_PER_BUCKET, "one window entry per bucket and millisecond");
    drop(store);
    let mb = std::fs::metadata(&path).map_or(0, |m| m.len()) / (1 << 20);
    eprintln!("built {rows} window entries ({mb} MiB) in {:.1} s", started.elapsed().as_secs_f64());
    ReopenFile { _dir: dir, path, clock: Arc::new(FakeClock::new(T0.plus(GRANTS_PER_BUCKET))) }
}

fn reopen(c: &mut Criterion) {
    let mut file: Option<ReopenFile> = None;
    let mut group = c.benchmark_group("reopen_1m");
    // Each iteration is a whole reopen (hundreds of ms): no warm-up to speak of, 10 of them.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(1));
    group.measurement_time(Duration::from_secs(1));

    let first = AcquireRequest::new("reopen", vec![Limit::window("reopen/first", 1_000_000, LONG_WINDOW_MS)])
        .expect("valid request");
    let mut reopen_limiter = |b: &mut criterion::Bencher, cold: bool| {
        let file = file.get_or_insert_with(build_reopen_file);
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                if cold {
                    evict_from_page_cache(&file.path);
                }
                let options =
                    LimiterOptions { clock: Some(file.clock.clone()), id_seed: Some(1), ..LimiterOptions::default() };
                let started = Instant::now();
                let limiter = Limiter::open_with(&file.path, options).expect("reopen");
                let decision = limiter.acquire_blocking(first.clone()).expect("first answer");
                total += started.elapsed();
                assert!(decision.is_granted());
                drop(limiter); // closing is not part of the reopen
            }
            total
        })
    };
    group.bench_function("limiter", |b| reopen_limiter(b, false));
    #[cfg(target_os = "linux")]
    group.bench_function("limiter_cold", |b| reopen_limiter(b, true));
    for (name, opener) in [("store", file_opener as fn() -> Opener), ("store_plain", plain_file_opener)] {
        group.bench_function(name, |b| {
            let file = file.get_or_insert_with(build_reopen_file);
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let now = file.clock.now();
                    let started = Instant::now();
                    let mut store = Store::open(&file.path, &opener()).expect("open the store");
                    let mut engine = Engine::new(EngineConfig::default());
                    store.load(&mut engine).expect("load");
                    let mut effects = Vec::new();
                    engine.finish_restore(now, &mut effects);
                    if !effects.is_empty() {
                        store.commit(&effects, now).expect("commit the pruning");
                    }
                    total += started.elapsed();
                    assert!(engine.totals().buckets >= BUCKETS, "every bucket is live");
                    // Closing is not part of the reopen: the notes go into the file.
                    store.finish(now).expect("close the store");
                    drop((store, engine));
                }
                total
            })
        });
    }
    group.finish();
}

/// Drops the file's pages from the OS page cache, as after a reboot. The file is closed and
/// its commits were flushed, so its pages are clean and all of them go.
fn evict_from_page_cache(path: &Path) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).expect("open the file to evict it");
        // SAFETY: `file` is an open descriptor for the whole call; fadvise only takes a hint.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise(DONTNEED) failed");
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}

criterion_group!(benches, grants, reopen);
criterion_main!(benches);
