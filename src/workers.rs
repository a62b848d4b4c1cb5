//! Connection workers: threads that each run a single-threaded Tokio runtime, for a server whose
//! requests spend their time waiting on the network (PostgreSQL mode).
//!
//! The accept loop hands each new connection to the next worker, round robin (see
//! `connections`), and the worker registers the socket with its own reactor; a backend that
//! keeps a pool per worker (`redb_limiter_postgres::enter_worker`) then keeps the database
//! connection and the task driving it on the same thread. A request is read, sent to the
//! database, answered by it and replied to without waking another thread: on a multi-threaded
//! runtime, each of those steps may wake an idle worker to look for work, which costs more CPU
//! than the request itself when requests come one at a time.
//!
//! What it owns: the threads and their runtimes, from start to a stop that ends each runtime
//! (dropping whatever it still runs) and joins its thread. It knows nothing of connections.

use std::io;
use std::thread::JoinHandle;

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// Running workers; [`Workers::stop`] ends them.
pub struct Workers {
    handles: Vec<Handle>,
    stops: Vec<oneshot::Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `count` workers; each thread calls `on_start(its index)` before it runs anything.
    pub fn start(count: usize, on_start: fn(usize)) -> io::Result<Workers> {
        let mut workers = Workers { handles: Vec::new(), stops: Vec::new(), threads: Vec::new() };
        for index in 0..count {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let (stop, stopped) = oneshot::channel::<()>();
            workers.handles.push(runtime.handle().clone());
            workers.stops.push(stop);
            let thread = std::thread::Builder::new().name(format!("redb-limiter-worker-{index}")).spawn(move || {
                on_start(index);
                // Runs the tasks spawned onto it until the stop is sent or dropped.
                let _ = runtime.block_on(stopped);
            })?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// Each worker's runtime, to spawn onto.
    #[must_use]
    pub fn handles(&self) -> Vec<Handle> {
        self.handles.clone()
    }

    /// Ends every worker's runtime (tasks still on it are dropped) and waits for its thread.
    pub async fn stop(self) {
        drop(self.stops);
        let threads = self.threads;
        let joined = tokio::task::spawn_blocking(move || threads.into_iter().all(|t| t.join().is_ok())).await;
        if !matches!(joined, Ok(true)) {
            tracing::warn!("a connection worker panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static STARTED: AtomicUsize = AtomicUsize::new(0);

    #[tokio::test]
    async fn each_worker_runs_its_tasks_on_its_own_thread_until_stopped() {
        let workers = Workers::start(2, |index| {
            STARTED.fetch_add(1 << (8 * index), Ordering::SeqCst);
        })
        .unwrap();
        let mut names = Vec::new();
        for handle in workers.handles() {
            let name = handle.spawn(async { std::thread::current().name().map(str::to_owned) }).await.unwrap();
            names.push(name.unwrap());
        }
        assert_eq!(names, ["redb-limiter-worker-0", "redb-limiter-worker-1"]);
        assert_eq!(STARTED.load(Ordering::SeqCst), 1 | (1 << 8), "each worker's on_start ran once, with its index");
        let parked = workers.handles()[0].spawn(std::future::pending::<()>());
        workers.stop().await;
        assert!(parked.await.unwrap_err().is_cancelled(), "a task still running was dropped at stop");
    }
}
