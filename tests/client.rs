//! The host side: the waiting client on paused tokio time over an engine-backed test limiter,
//! vendor signals into throttles, the HTTP client's typed errors, and the contract suite run
//! against our own server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redb_limiter::engine::{Engine, EngineConfig};
use redb_limiter::limiter::LimiterOptions;
use redb_limiter::{AcquireRequest, Cost, Limit, Limiter, Millis, Reason};
use redb_limiter_client::contract;
use redb_limiter_client::{
    AcquireOptions, Client, ClientError, HttpLimiter, LimiterApi, NoTicket, Outcome, PeekOutcome, Refusal, WaitReport,
};
use redb_limiter_server::server::{ServerConfig, serve};

const T0: Millis = Millis(1_800_000_000_000);

/// A limiter whose clock is tokio's (paused in these tests) and whose answers can be delayed.
struct EngineLimiter {
    engine: Mutex<Engine>,
    start: tokio::time::Instant,
    delay: Duration,
}

impl EngineLimiter {
    fn new(delay: Duration) -> Arc<Self> {
        Arc::new(EngineLimiter {
            engine: Mutex::new(Engine::new(EngineConfig::default())),
            start: tokio::time::Instant::now(),
            delay,
        })
    }

    fn held(&self) -> usize {
        let now = self.now();
        self.engine.lock().unwrap().view(now, "").buckets.iter().map(|b| b.places_held).sum()
    }
}

impl LimiterApi for EngineLimiter {
    async fn acquire(&self, req: AcquireRequest) -> Result<Outcome, ClientError> {
        tokio::time::sleep(self.delay).await;
        let now = self.now();
        let answer = self.engine.lock().unwrap().acquire_in_line(&req, now, &mut Vec::new());
        let answer = answer.map_err(|e| ClientError::BadRequest(e.0))?;
        Ok(Outcome::from_decision(answer.decision, answer.ticket))
    }

    async fn leave(&self, ticket: String) -> Result<bool, ClientError> {
        let now = self.now();
        Ok(self.engine.lock().unwrap().leave(&ticket, now, &mut Vec::new()))
    }

    async fn release(&self, permit: String) -> Result<bool, ClientError> {
        let now = self.now();
        Ok(self.engine.lock().unwrap().release(&permit, now, &mut Vec::new()))
    }

    async fn throttle(&self, key: String, until: Millis) -> Result<Option<Millis>, ClientError> {
        let now = self.now();
        Ok(self.engine.lock().unwrap().throttle(&key, until, now, &mut Vec::new()))
    }

    async fn peek(&self, req: AcquireRequest) -> Result<PeekOutcome, ClientError> {
        let now = self.now();
        let engine = self.engine.lock().unwrap();
        let refusal = engine.peek(&req, now).map(|r| Refusal::new(r.retry_at, r.reason, r.limit));
        Ok(PeekOutcome { refusal, now, limits: engine.figures(&req, now) })
    }

    async fn settle(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let now = self.now();
        let settled = self.engine.lock().unwrap().settle(&permit, &costs, now, &mut Vec::new());
        settled.map(|s| s.is_settled()).map_err(|e| ClientError::BadRequest(e.0))
    }

    async fn release_with_costs(&self, permit: String, costs: Vec<Cost>) -> Result<bool, ClientError> {
        let now = self.now();
        let released = self.engine.lock().unwrap().release_with(&permit, &costs, now, &mut Vec::new());
        released.map_err(|e| ClientError::BadRequest(e.0))
    }

    async fn lift(&self, key: String) -> Result<bool, ClientError> {
        let now = self.now();
        Ok(self.engine.lock().unwrap().lift(&key, now, &mut Vec::new()))
    }

    fn now(&self) -> Millis {
        T0.plus(self.start.elapsed().as_millis() as u64)
    }
}

fn window_req(cost: u64) -> AcquireRequest {
    AcquireRequest::new("host", vec![Limit::window("tpm", 10, 1000).with_cost(cost)]).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_large_call_is_served_before_smaller_ones_behind_it() {
    let limiter = EngineLimiter::new(Duration::ZERO);
    let client = Client::new(limiter.clone());
    client.try_acquire(window_req(5)).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, cost) in [(0, 10), (1, 1), (2, 1), (3, 1)] {
        let client = client.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let permit = client.acquire(window_req(cost), AcquireOptions::default()).await.unwrap();
            order.lock().unwrap().push((i, permit.at()));
        }));
        tokio::task::yield_now().await; // queue them in this order
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let ids: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, vec![0, 1, 2, 3], "first in, first out");
    // The large call waited for the window to empty; the small ones then waited for it in turn.
    assert_eq!(order[0].1, T0.plus(1000));
    assert_eq!(order[1].1, T0.plus(2000));
}

#[tokio::test(start_paused = true)]
async fn queue_full_and_queue_timeout_are_typed() {
    let limiter = EngineLimiter::new(Duration::ZERO);
    let client = Client::new(limiter.clone());
    client.try_acquire(window_req(10)).await.unwrap();
    match client.try_acquire(window_req(1)).await {
        Err(ClientError::Refused(r)) => assert_eq!((r.reason, r.retry_at), (Reason::Rate, T0.plus(1000))),
        other => panic!("{other:?}"),
    }
    // A head of line with no deadline waits for the window.
    let head = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire(window_req(1), AcquireOptions::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await; // the head takes its place in line
    let full = AcquireOptions { max_waiters: Some(1), ..AcquireOptions::default() };
    match client.acquire(window_req(1), full).await {
        Err(ClientError::QueueFull { waiting: 1 }) => {}
        other => panic!("expected QueueFull, got {other:?}"),
    }
    // Behind the head, a deadline runs out in line.
    let short = AcquireOptions { max_wait: Some(Duration::from_millis(300)), ..AcquireOptions::default() };
    match client.acquire(window_req(1), short).await {
        Err(ClientError::QueueTimeout { waited_ms: 300, last: None }) => {}
        other => panic!("expected QueueTimeout in line, got {other:?}"),
    }
    assert_eq!(head.await.unwrap().unwrap().at(), T0.plus(1000));
    // Alone, a refusal whose retryAt lies past the deadline fails at once, naming it.
    let solo = |cost| AcquireRequest::new("host", vec![Limit::window("solo", 10, 1000).with_cost(cost)]).unwrap();
    let filled = client.try_acquire(solo(10)).await.unwrap().at();
    match client.acquire(solo(1), short).await {
        Err(ClientError::QueueTimeout { last: Some(last), .. }) => {
            assert_eq!((last.limit.as_str(), last.retry_at), ("solo", filled.plus(1000)))
        }
        other => panic!("expected QueueTimeout, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_arrives_after_cancellation_is_released() {
    let limiter = EngineLimiter::new(Duration::from_millis(100));
    let client = Client::new(limiter.clone());
    let conc = AcquireRequest::new("host", vec![Limit::concurrent("conc", 1)]).unwrap();
    let cancelled =
        tokio::time::timeout(Duration::from_millis(50), client.acquire(conc.clone(), AcquireOptions::default()));
    assert!(cancelled.await.is_err(), "the acquire was cut off before its answer");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(limiter.held(), 0, "the late grant was given back");
    // Dropping a permit releases it too.
    let permit = client.acquire(conc.clone(), AcquireOptions::default()).await.unwrap();
    assert_eq!(limiter.held(), 1);
    drop(permit);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(limiter.held(), 0);
    let permit = client.acquire(conc, AcquireOptions::default()).await.unwrap();
    assert!(permit.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn the_observer_sees_every_wait() {
    let limiter = EngineLimiter::new(Duration::ZERO);
    let waits = Arc::new(Mutex::new(Vec::new()));
    let seen = waits.clone();
    let client = Client::new(limiter.clone()).with_observer(move |w: &WaitReport| seen.lock().unwrap().push(w.clone()));
    client.try_acquire(window_req(10)).await.unwrap();
    limiter.throttle("host".into(), T0.plus(1500)).await.unwrap();
    client.acquire(window_req(1), AcquireOptions::default()).await.unwrap();
    let waits = waits.lock().unwrap().clone();
    assert_eq!(waits, vec![WaitReport { waited_ms: 1500, reason: Reason::Throttle, limit: "host".into() }]);
}

#[tokio::test(start_paused = true)]
async fn provider_answers_throttle_the_caller() {
    let limiter = EngineLimiter::new(Duration::ZERO);
    let client = Client::new(limiter.clone()).with_throttle_after(Duration::from_secs(3));
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after", "7".parse().unwrap());
    assert_eq!(client.observe_response("host", 429, &headers, b"").await.unwrap(), Some(T0.plus(7000)));
    match client.try_acquire(window_req(1)).await {
        Err(ClientError::Refused(r)) => assert_eq!((r.reason, r.retry_at), (Reason::Throttle, T0.plus(7000))),
        other => panic!("{other:?}"),
    }
    // A 429 that names no wait stands for the default.
    let empty = http::HeaderMap::new();
    assert_eq!(client.observe_response("other", 429, &empty, b"{}").await.unwrap(), Some(T0.plus(3000)));
    // A success with an exhausted budget throttles until its reset; a budget left does nothing.
    let mut budget = http::HeaderMap::new();
    budget.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
    budget.insert("x-ratelimit-reset-requests", "20s".parse().unwrap());
    assert_eq!(client.observe_response("third", 200, &budget, b"").await.unwrap(), Some(T0.plus(20_000)));
    budget.insert("x-ratelimit-remaining-requests", "3".parse().unwrap());
    assert_eq!(client.observe_response("fourth", 200, &budget, b"").await.unwrap(), None);
}

async fn start_server() -> (String, tempfile::TempDir, tokio::sync::oneshot::Sender<()>) {
    start_server_with(LimiterOptions::default()).await
}

async fn start_server_with(options: LimiterOptions) -> (String, tempfile::TempDir, tokio::sync::oneshot::Sender<()>) {
    let dir = tempfile::tempdir().unwrap();
    let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, limiter, ServerConfig::default(), async move {
        let _ = stopped.await;
    }));
    (url, dir, stop)
}

#[tokio::test]
async fn the_contract_suite_passes_against_our_server() {
    let (url, _dir, _stop) = start_server().await;
    let results = contract::run(&url, None, false).await;
    let failed: Vec<_> = results.iter().filter(|r| r.outcome.is_err()).collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(contract::summary(&results), format!("{} passed, 0 failed", contract::CASES.len()));
}

#[tokio::test]
async fn http_errors_are_typed() {
    let (url, _dir, _stop) = start_server().await;
    let remote = HttpLimiter::new(&url, None);
    let client = Client::new(Arc::new(remote));
    let conc = AcquireRequest::new("host", vec![Limit::concurrent("c", 1)]).unwrap();
    let permit = client.try_acquire(conc.clone()).await.unwrap();
    assert!(permit.id().is_some_and(|p| p.starts_with("p-")));
    match client.try_acquire(conc).await {
        Err(ClientError::Refused(r)) => assert_eq!(r.reason, Reason::Concurrency),
        other => panic!("{other:?}"),
    }
    assert!(permit.release().await.unwrap());
    let too_far = client.limiter().now().plus(25 * 3_600_000);
    assert!(
        matches!(client.limiter().throttle("host".into(), too_far).await, Err(ClientError::BadRequest(m)) if m.contains("until"))
    );
    // Nothing listens here: unreachable, not refused.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let gone = HttpLimiter::new(dead, None);
    assert!(matches!(gone.acquire(window_req(1)).await, Err(ClientError::Unreachable(_))));
}

/// Section 9 on the host side, the same through the embedded limiter and over HTTP: peek,
/// `Permit::settle` (a permit dropped after a settle still releases), release with costs, lift.
async fn settle_and_peek_through<L: LimiterApi>(limiter: Arc<L>) {
    let client = Client::new(limiter.clone());
    let tpm = |cost| {
        AcquireRequest::new("host", vec![Limit::window("tpm", 100, 60_000).with_cost(cost), Limit::concurrent("c", 1)])
            .unwrap()
    };
    let peeked = client.peek(tpm(90)).await.unwrap();
    assert!(peeked.fits());
    assert_eq!(peeked.limits[0].window, Some((0, 100)));
    let permit = client.try_acquire(tpm(90)).await.unwrap();
    let peeked = client.peek(tpm(20)).await.unwrap();
    assert_eq!(
        peeked.refusal.as_ref().map(|r| (r.reason, r.limit.as_str())),
        Some((Reason::Rate, "tpm")),
        "the later retryAt stands"
    );
    assert_eq!(peeked.limits[0].window, Some((90, 10)));
    assert_eq!(peeked.limits[1].places, Some((1, 0)));
    // Settle down, then drop: the place is released, and the settled cost stays.
    assert!(permit.settle(vec![Cost::new("tpm", 15)]).await.unwrap());
    let bad = permit.settle(vec![Cost::new("c", 1)]).await;
    assert!(matches!(bad, Err(ClientError::BadRequest(m)) if m.contains("costs[0].key")), "a place is no window");
    drop(permit);
    let mut released = false;
    for _ in 0..100 {
        let peeked = client.peek(tpm(85)).await.unwrap();
        if peeked.fits() {
            assert_eq!(peeked.limits[0].window, Some((15, 85)));
            released = true;
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(released, "a permit dropped after a settle released its place");
    // Release with costs: one step.
    let permit = client.try_acquire(tpm(50)).await.unwrap();
    assert!(permit.release_with_costs(vec![Cost::new("tpm", 0)]).await.unwrap());
    assert_eq!(client.peek(tpm(1)).await.unwrap().limits[0].window, Some((15, 85)));
    // A place-less permit asked for with `permit`.
    let placeless = AcquireRequest::new("host", vec![Limit::window("rpm", 5, 60_000)]).unwrap().with_permit();
    let permit = client.try_acquire(placeless).await.unwrap();
    assert!(permit.id().is_some());
    assert!(permit.settle(vec![Cost::new("rpm", 5)]).await.unwrap());
    assert!(
        !client.peek(AcquireRequest::new("host", vec![Limit::window("rpm", 5, 60_000)]).unwrap()).await.unwrap().fits()
    );
    assert!(permit.release().await.unwrap());
    // Lift.
    let until = limiter.now().plus(60_000);
    limiter.throttle("host".into(), until).await.unwrap();
    assert!(limiter.lift("host".into()).await.unwrap());
    assert!(!limiter.lift("host".into()).await.unwrap());
}

#[tokio::test]
async fn settle_and_peek_embedded_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), LimiterOptions::default()).unwrap());
    settle_and_peek_through(embedded).await;
    let (url, _dir, _stop) = start_server().await;
    settle_and_peek_through(Arc::new(HttpLimiter::new(&url, None))).await;
}

#[tokio::test(start_paused = true)]
async fn the_waiting_acquire_queues_and_asks_again_with_its_ticket() {
    let limiter = EngineLimiter::new(Duration::ZERO);
    let client = Client::new(limiter.clone());
    let other = Client::new(limiter.clone());
    let tpm = |key: &str, cost| AcquireRequest::new(key, vec![Limit::window("tpm", 10, 1000).with_cost(cost)]).unwrap();
    other.try_acquire(tpm("other", 4)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    other.try_acquire(tpm("other", 4)).await.unwrap(); // 8 used: room for 2
    let large = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire(tpm("large", 8), AcquireOptions::default()).await })
    };
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(limiter.engine.lock().unwrap().tickets(), 1, "the refused acquire took a ticket");
    // A small call that leaves the ticket room at its instant (T0 + 1400: 2 + 8 = 10) is
    // granted at once, ahead of it (backfill, section 12.9).
    other.try_acquire(tpm("other", 2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await; // T0 + 1101: the first 4 left
    // Two more would fit now, but not beside the ticket then: told its own instant behind it
    // (when the 2 of T0 + 401 leave).
    match other.try_acquire(tpm("other", 2)).await {
        Err(ClientError::Refused(r)) => {
            assert_eq!((r.reason, r.retry_at, r.line), (Reason::Rate, T0.plus(1401), None));
        }
        other => panic!("the ticket still stands first: {other:?}"),
    }
    // Asked again with its ticket at its retryAt (T0 + 1400, when 8 fit), it is granted then.
    let permit = large.await.unwrap().unwrap();
    assert_eq!(permit.at(), T0.plus(1400));
    assert_eq!(limiter.engine.lock().unwrap().tickets(), 0, "the grant ended the ticket");
    // With the line turned off, the same wait takes no ticket.
    let off = AcquireOptions { no_queue: true, max_wait: Some(Duration::from_millis(10)), ..AcquireOptions::default() };
    match client.acquire(tpm("large", 8), off).await {
        Err(ClientError::QueueTimeout { last: Some(last), .. }) => assert_eq!(last.line, None),
        other => panic!("expected QueueTimeout, got {other:?}"),
    }
    assert_eq!(limiter.engine.lock().unwrap().tickets(), 0);
}

/// How many tickets wait in the line of `bucket` (a 10-per-minute window), as a peek sees it.
async fn queued<L: LimiterApi>(limiter: &L, bucket: &str) -> u64 {
    let req = AcquireRequest::new("peeker", vec![Limit::window(bucket, 10, 60_000)]).unwrap();
    limiter.peek(req).await.unwrap().limits[0].queued.unwrap_or(0)
}

/// Polls `queued` until it is `want` (the leave of a dropped wait is sent from a spawned task).
async fn until_queued<L: LimiterApi>(limiter: &L, bucket: &str, want: u64) {
    for _ in 0..500 {
        if queued(limiter, bucket).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{bucket}: the line never held {want} (it holds {})", queued(limiter, bucket).await);
}

/// Queues by default, leaves the line at `max_wait` and when the waiting future is dropped.
async fn queue_and_leave_through<L: LimiterApi>(limiter: Arc<L>) {
    let client = Client::new(limiter.clone());
    let req = |key: &str, bucket: &str, cost| {
        AcquireRequest::new(key, vec![Limit::window(bucket, 10, 60_000).with_cost(cost)]).unwrap()
    };
    client.try_acquire(req("filler", "lh/a", 10)).await.unwrap();
    // max_wait: the refusal's retryAt (a minute away) lies past it, so the limiter files no
    // ticket (section 12.9) and the host gives up at once.
    let short = AcquireOptions { max_wait: Some(Duration::from_millis(200)), ..AcquireOptions::default() };
    let last = match client.acquire(req("host", "lh/a", 1), short).await {
        Err(ClientError::QueueTimeout { last: Some(last), .. }) => last,
        other => panic!("expected QueueTimeout, got {other:?}"),
    };
    assert_eq!((last.line.clone(), last.no_ticket), (None, Some(NoTicket::Horizon)), "{last:?}");
    assert_eq!(queued(&*limiter, "lh/a").await, 0, "it never joined the line");
    // Within its max_wait it queues (by default), and leaves the line when it gives up.
    let minute = AcquireOptions { max_wait: Some(Duration::from_secs(61)), ..AcquireOptions::default() };
    let waiting = {
        let (client, req) = (client.clone(), req("host", "lh/a", 1));
        tokio::spawn(async move { client.acquire(req, minute).await })
    };
    until_queued(&*limiter, "lh/a", 1).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    until_queued(&*limiter, "lh/a", 0).await;
    // The line turned off: no ticket.
    let off = AcquireOptions { no_queue: true, ..short };
    match client.acquire(req("host", "lh/a", 1), off).await {
        Err(ClientError::QueueTimeout { last: Some(last), .. }) => assert_eq!(last.line, None),
        other => panic!("expected QueueTimeout, got {other:?}"),
    }
    // Dropped while it waits: the ticket leaves the line.
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire(req("host", "lh/a", 1), AcquireOptions::default()).await })
    };
    until_queued(&*limiter, "lh/a", 1).await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    until_queued(&*limiter, "lh/a", 0).await;
    // A caller who stops waiting while its first ask is on its way leaves the line too.
    client.try_acquire(req("filler", "lh/b", 10)).await.unwrap();
    let cut = tokio::time::timeout(Duration::ZERO, client.acquire(req("host", "lh/b", 1), AcquireOptions::default()));
    assert!(cut.await.is_err());
    until_queued(&*limiter, "lh/b", 0).await;
}

#[tokio::test]
async fn the_waiting_acquire_queues_and_leaves_embedded_and_over_http() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), LimiterOptions::default()).unwrap());
    queue_and_leave_through(embedded).await;
    let (url, _dir, _stop) = start_server().await;
    queue_and_leave_through(Arc::new(HttpLimiter::new(&url, None))).await;
}

/// Eight hosts stream small calls into a window while a ninth waits for 30% of it: in line,
/// it is granted within two window lengths, and no small call that asked after its ticket was
/// filed is granted before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_call_is_not_starved_by_small_ones_from_other_hosts() {
    const PER_MS: u64 = 500;
    let (url, _dir, _stop) = start_server().await;
    let req = |key: String, cost| {
        AcquireRequest::new(key, vec![Limit::window("lh/fair", 100, PER_MS).with_cost(cost)]).unwrap()
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // (asked at, granted at) of every small grant, on the limiter's clock.
    let smalls = Arc::new(Mutex::new(Vec::new()));
    let mut hosts = Vec::new();
    for i in 0..8u64 {
        let client = Client::new(Arc::new(HttpLimiter::new(&url, None)));
        let (stop, smalls) = (stop.clone(), smalls.clone());
        hosts.push(tokio::spawn(async move {
            let mut cost = i;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                cost = cost * 7 % 10 + 1;
                let asked = client.limiter().now();
                let permit = client.acquire(req(format!("small-{i}"), cost), AcquireOptions::default()).await.unwrap();
                smalls.lock().unwrap().push((asked, permit.at()));
            }
        }));
    }
    let large = Client::new(Arc::new(HttpLimiter::new(&url, None)));
    tokio::time::sleep(Duration::from_millis(PER_MS)).await; // the window is saturated
    let options = AcquireOptions { max_wait: Some(Duration::from_millis(10 * PER_MS)), ..AcquireOptions::default() };
    // Its first ask files its ticket (and tells the instant); the waiting acquire goes on with it.
    let (asked, told, granted) = match large.try_acquire(req("large".into(), 30).with_queue()).await {
        Ok(permit) => (permit.at(), permit.at(), permit.at()),
        Err(ClientError::Refused(refusal)) => {
            let line = refusal.line.expect("a queued refusal names its ticket");
            let with_ticket = req("large".into(), 30).with_ticket(line.ticket).unwrap();
            let permit = large.acquire(with_ticket, options).await.expect("the large call is granted");
            (line.now, refusal.retry_at, permit.at())
        }
        Err(other) => panic!("{other:?}"),
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hosts {
        h.await.unwrap();
    }
    let waited = granted.since(asked);
    assert!(waited <= 2 * PER_MS, "the large call waited {waited} ms, over two windows of {PER_MS} ms");
    let smalls = smalls.lock().unwrap();
    assert!(smalls.iter().filter(|(_, at)| *at < asked).count() >= 10, "the small hosts saturated the window");
    // The limiter's clock is the host's here (one machine). A small call asked after the large
    // call's ticket was filed went before it only where it left it room (section 12.9's
    // backfill): the large call was granted at the instant its ticket was told, give or take
    // the round trip of its ask.
    let overtook = smalls.iter().filter(|(a, at)| *a > asked && *at < granted).count();
    assert!(
        granted <= told.plus(250),
        "the large call, told {told}, was granted at {granted}: {overtook} small calls asked after it overtook it"
    );
}
