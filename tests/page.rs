//! The live page (`GET /`) in a real headless Chromium, against a real server on 127.0.0.1:0 with
//! an injected clock: the test drives grants, places, a throttle and refusals over HTTP, lets
//! the page's JavaScript read `/state` and `/recent` within Chromium's virtual time, and asserts
//! on the DOM it leaves (bars, countdowns, refusal rows, the token form and its messages, the
//! empty state, paging, a restart). Screenshots land in `target/page-test/`.
//!
//! Chromium is Debian's `chromium` (or `$CHROMIUM`). Under CI (`CI` set) a missing browser fails
//! the tests; elsewhere they say so loudly and pass without running.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redb_limiter::limiter::LimiterOptions;
use redb_limiter::time::{FakeClock, format_instant};
use redb_limiter::{Limiter, Millis};
use redb_limiter_server::server::{ServerConfig, serve};
use serde_json::{Value, json};

const T0: Millis = Millis(1_800_000_000_000);

struct TestServer {
    url: String,
    clock: Arc<FakeClock>,
    http: reqwest::Client,
    token: Option<String>,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestServer {
    async fn start(token: Option<&str>) -> Self {
        Self::start_in(tempfile::tempdir().unwrap(), token, "127.0.0.1:0", Arc::new(FakeClock::new(T0))).await
    }

    async fn start_in(dir: tempfile::TempDir, token: Option<&str>, addr: &str, clock: Arc<FakeClock>) -> Self {
        let options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
        let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap());
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = ServerConfig { token: token.map(str::to_owned), ..ServerConfig::default() };
        let done = tokio::spawn(serve(listener, limiter, config, async move {
            let _ = stopped.await;
        }));
        let http = reqwest::Client::new();
        TestServer { url, clock, http, token: token.map(str::to_owned), dir, stop: Some(stop), done: Some(done) }
    }

    /// Stops serving and closes the file; gives back the folder, to serve it again.
    async fn stop(mut self) -> (tempfile::TempDir, Arc<FakeClock>) {
        let _ = self.stop.take().unwrap().send(());
        self.done.take().unwrap().await.unwrap().unwrap();
        (self.dir, self.clock)
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let mut req = self.http.post(format!("{}{path}", self.url)).body(body.to_string());
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.json().await.unwrap()
    }

    async fn acquire(&self, caller: &str, extra: Value) -> Value {
        let mut body = json!({"key": caller});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        self.post("/acquire", body).await
    }
}

fn at(ms: u64) -> String {
    format_instant(T0.plus(ms))
}

/// Where screenshots go: `target/page-test/`.
fn out_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("page-test");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The browser, or `None` (after saying so) where a missing one may skip the test.
fn chromium() -> Option<PathBuf> {
    let name = std::env::var_os("CHROMIUM").unwrap_or_else(|| "chromium".into());
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(&name))
        .chain(std::iter::once(PathBuf::from(&name)))
        .find(|p| p.is_absolute() && p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is not installed (CI must install it: apt-get install -y chromium)"
        );
        eprintln!("\n********\n* SKIPPED: chromium is not installed; the live page was NOT tested.\n********\n");
    }
    found
}

/// One browser at a time: the machines that run this have few cores.
static BROWSER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Loads `url` in headless Chromium with `budget_ms` of virtual time and returns the DOM after
/// the page's scripts ran; with `screenshot`, saves a 1200x800 PNG there instead.
async fn browse(browser: &Path, url: &str, budget_ms: u64, screenshot: Option<&Path>) -> String {
    let browser = browser.to_owned();
    let url = url.to_owned();
    let screenshot = screenshot.map(Path::to_owned);
    tokio::task::spawn_blocking(move || {
        let _one = BROWSER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let profile = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(&browser);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={budget_ms}"));
        match &screenshot {
            Some(png) => cmd.arg(format!("--screenshot={}", png.display())).arg("--window-size=1200,800"),
            None => cmd.arg("--dump-dom"),
        };
        cmd.arg(&url).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("chromium starts");
        let mut stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut out = String::new();
            stdout.read_to_string(&mut out).unwrap();
            out
        });
        let deadline = Instant::now() + Duration::from_secs(90);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("chromium did not finish {url} within 90 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let dom = reader.join().unwrap();
        if !status.success() {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            panic!("chromium failed on {url}: {status}\n{err}");
        }
        if let Some(png) = &screenshot {
            let bytes = std::fs::read(png).expect("chromium wrote the screenshot");
            assert!(bytes.starts_with(b"\x89PNG"), "{} is not a PNG", png.display());
        }
        // The page's own script is no part of what it shows.
        match (dom.find("<script"), dom.rfind("</script>")) {
            (Some(from), Some(to)) => format!("{}{}", &dom[..from], &dom[to + "</script>".len()..]),
            _ => dom,
        }
    })
    .await
    .unwrap()
}

/// The element that carries `attr` (from its start tag to the end of its table row).
fn row<'a>(dom: &'a str, attr: &str) -> &'a str {
    let at = dom.find(attr).unwrap_or_else(|| panic!("no {attr} in the page:\n{dom}"));
    let start = dom[..at].rfind('<').unwrap();
    let end = dom[at..].find("</tr>").map_or(dom.len(), |e| at + e);
    &dom[start..end]
}

/// The text of every element whose start tag contains `marker`, in order.
fn texts(dom: &str, marker: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = dom;
    while let Some(at) = rest.find(marker) {
        let after = &rest[at..];
        let open = after.find('>').unwrap() + 1;
        let close = after[open..].find('<').unwrap();
        out.push(after[open..open + close].to_owned());
        rest = &after[open + close..];
    }
    out
}

/// Seconds in a countdown's text (`44.6s`, `800ms`).
fn seconds(text: &str) -> f64 {
    if let Some(ms) = text.strip_suffix("ms") {
        ms.parse::<f64>().unwrap() / 1000.0
    } else {
        text.strip_suffix('s').unwrap_or_else(|| panic!("not a countdown: {text:?}")).parse().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_shows_buckets_throttles_and_refusals() {
    let Some(browser) = chromium() else { return };
    // 45 seconds of a batch job before T0: 1 to 5 grants a second, and every third second a
    // burst of two calls, the second refused.
    let clock = Arc::new(FakeClock::new(T0.minus(45_000)));
    let s = TestServer::start_in(tempfile::tempdir().unwrap(), None, "127.0.0.1:0", clock).await;
    let jobs = json!({"limits": [{"key": "batch/jobs", "calls": 1000, "perMs": 60000}]});
    let burst = json!({"limits": [{"key": "batch/burst", "calls": 1, "perMs": 1000}]});
    for sec in 0..45u64 {
        s.clock.set(T0.minus(45_000 - sec * 1000));
        for _ in 0..1 + sec % 5 {
            assert_eq!(s.acquire("batch", jobs.clone()).await["granted"], true);
        }
        if sec % 3 == 0 {
            assert_eq!(s.acquire("batch", burst.clone()).await["granted"], true);
            assert_eq!(s.acquire("batch", burst.clone()).await["reason"], "rate");
        }
    }
    s.clock.set(T0);
    let requests = json!({"limits": [{"key": "api/requests", "calls": 5, "perMs": 60000}]});
    for _ in 0..3 {
        assert_eq!(s.acquire("agent-1", requests.clone()).await["granted"], true);
        s.clock.advance(100);
    }
    let tokens = json!({"limits": [{"key": "api/tokens", "calls": 1000, "perMs": 60000, "cost": 900}]});
    assert_eq!(s.acquire("agent-1", tokens).await["granted"], true);
    let streams = json!({"holdMs": 30000, "limits": [{"key": "api/streams", "concurrent": 2}]});
    for _ in 0..2 {
        assert_eq!(s.acquire("agent-1", streams.clone()).await["granted"], true);
    }
    s.clock.advance(100); // now: T0 + 400
    let refused = s.acquire("agent-3", streams.clone()).await;
    assert_eq!(refused, json!({"granted": false, "retryAt": at(650), "reason": "concurrency", "limit": "api/streams"}));
    let qps = json!({"limits": [{"key": "search/qps", "calls": 2, "perMs": 1000}]});
    for _ in 0..2 {
        assert_eq!(s.acquire("agent-3", qps.clone()).await["granted"], true);
    }
    s.clock.advance(200); // now: T0 + 600
    assert_eq!(s.acquire("agent-3", qps).await["retryAt"], at(1400));
    s.post("/throttle", json!({"key": "agent-2", "until": at(45_000)})).await;
    let throttled = s.acquire("agent-2", requests.clone()).await;
    assert_eq!(throttled, json!({"granted": false, "retryAt": at(45_000), "reason": "throttle", "limit": "agent-2"}));

    // The feed the page reads: the latest refusals, newest first, and the counts of this second.
    let recent: Value = s.http.get(format!("{}/recent", s.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(recent["now"], at(600));
    assert_eq!(
        recent["refusals"][0],
        json!({"at": at(600), "caller": "agent-2", "limit": "agent-2", "reason": "throttle", "retryAt": at(45_000), "waitMs": 44_400})
    );
    assert_eq!(recent["refusals"].as_array().unwrap().len(), 3 + 15);
    let per_second = &recent["perSecond"];
    assert_eq!(per_second["granted"].as_array().unwrap().len(), 300);
    assert_eq!(per_second["from"], format_instant(T0.minus(299_000)));
    for (series, n) in [("granted", 8), ("rate", 1), ("concurrency", 1), ("throttle", 1)] {
        assert_eq!(per_second[series][299], n, "{series}");
    }

    let dom = browse(&browser, &format!("{}/", s.url), 3000, None).await;
    assert!(dom.contains(r#"<span id="status" class="live">live</span>"#), "{dom}");
    assert!(dom.contains("5 buckets · 2 permits · 1 throttles"), "{dom}");

    // Window use as a bar and as used/calls; places against concurrent.
    let r = row(&dom, r#"data-key="api/requests""#);
    assert!(r.contains(r#"aria-valuenow="3" aria-valuemax="5""#) && r.contains(">3/5<"), "{r}");
    assert!(r.contains(r#"style="width:60.0%""#), "{r}");
    let r = row(&dom, r#"data-key="api/tokens""#);
    assert!(r.contains(">900/1000<") && r.contains(r#"class="bar warn""#), "{r}");
    let r = row(&dom, r#"data-key="api/streams""#);
    assert!(r.contains(">2/2<") && r.contains(r#"class="bar full""#), "{r}");
    // Fullest first: the two full buckets, then 900/1000, then 3/5.
    let order: Vec<_> = texts(&dom, r#"<td class="key mono" title="#);
    assert_eq!(order, ["api/streams", "search/qps", "api/tokens", "api/requests", "batch/jobs"]);
    assert!(row(&dom, r#"data-key="batch/jobs""#).contains(">135/1000<"), "{dom}");
    // The oldest grant of search/qps (at +400) leaves at +1400: within the next second.
    let r = row(&dom, r#"data-key="search/qps""#);
    assert!(r.contains(&format!(r#"data-until="{}" data-soon="1000""#, T0.0 + 1400)), "{r}");

    // The throttle counts down from 44.4 s (the server's clock stands still; the page's moves on
    // by at most the virtual time budget between its reads).
    let r = row(&dom, r#"class="throttle" data-key="agent-2""#);
    assert!(r.contains(&at(45_000)), "{r}");
    let left = seconds(&texts(r, "countdown")[0]);
    assert!((41.0..=44.4).contains(&left), "throttle countdown {left} s: {r}");

    // The latest refusals, newest first: caller, bucket, reason, the wait it was told.
    let r = row(&dom, r#"<tr class="refusal""#);
    assert!(r.contains(">agent-2<") && r.contains(r#"class="reason">throttle<"#), "{r}");
    assert!(r.contains(r#"class="num wait">44.4s<"#), "{r}");
    assert_eq!(texts(&dom, r#"class="reason""#)[..4], ["throttle", "rate", "concurrency", "rate"]);
    assert_eq!(texts(&dom, r#"class="num wait""#)[..4], ["44.4s", "800ms", "250ms", "1.0s"]);
    assert_eq!(dom.matches(r#"<tr class="refusal">"#).count(), 10, "the latest 10 of 18");
    // Decisions in the last minute, by outcome.
    // 8 now, 135 + 15 in the batch's 45 seconds.
    for (id, n) in [("granted", "158"), ("rate", "16"), ("concurrency", "1"), ("throttle", "1")] {
        assert_eq!(texts(&dom, &format!(r#"<b id="{id}""#)), [n], "{id}");
    }
    // Places about to lapse: the two of api/streams, at +30 s.
    assert_eq!(dom.matches(r#"<tr class="permit">"#).count(), 2, "{dom}");

    let png = out_dir().join("page.png");
    browse(&browser, &format!("{}/", s.url), 3000, Some(&png)).await;
}

/// Section 12.7 on the page: each bucket's line (`queued`) and how long its first ticket has
/// waited, counting up; a bucket that holds only a line is shown too, with the full ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_shows_each_line_and_how_long_its_first_ticket_waited() {
    let Some(browser) = chromium() else { return };
    let s = TestServer::start(None).await;
    let rpm = json!({"key": "api/rpm", "calls": 1, "perMs": 60000});
    assert_eq!(s.acquire("agent-1", json!({"limits": [rpm]})).await["granted"], true);
    assert_eq!(
        s.acquire("agent-9", json!({"limits": [{"key": "api/idle", "calls": 10, "perMs": 60000}]})).await["granted"],
        true
    );
    s.clock.advance(100);
    let first = s.acquire("agent-2", json!({"queue": true, "limits": [rpm]})).await;
    assert_eq!((first["ahead"].as_u64(), first["lapseAt"].as_str()), (Some(0), Some(at(62_000).as_str())), "{first}");
    s.clock.advance(200);
    let second = json!({"queue": true, "limits": [rpm, {"key": "api/streams", "concurrent": 2}]});
    assert_eq!(s.acquire("agent-3", second).await["ahead"], 1);
    s.clock.set(T0.plus(5_100));

    let dom = browse(&browser, &format!("{}/", s.url), 3000, None).await;
    assert!(dom.contains(r#"class="live">live<"#), "{dom}");
    // Buckets with a line sort with the full ones (ties by key), before those with room.
    assert_eq!(texts(&dom, r#"<td class="key mono" title="#), ["api/rpm", "api/streams", "api/idle"]);
    // Two tickets wait for api/rpm, the first filed at +100: 5.0 s before the server's now, and
    // counting up by at most the virtual time budget since.
    let r = row(&dom, r#"data-key="api/rpm""#);
    assert!(r.contains(r#"<td class="num queued">2</td>"#), "{r}");
    assert!(r.contains(&format!(r#"data-since="{}""#, T0.0 + 100)), "{r}");
    let waited = seconds(&texts(r, r#"class="num waited""#)[0]);
    assert!((5.0..=8.0).contains(&waited), "the first ticket of api/rpm waited {waited} s: {r}");
    // Its first ticket is named, so an operator can release it (section 12.9).
    let ticket = first["ticket"].as_str().unwrap();
    assert!(
        r.contains(&format!(
            r#"<code class="ticket" title="release {{ticket}} takes it out of the line">{ticket}</code>"#
        )),
        "{r}"
    );
    // api/streams holds no place and no grant: only the second ticket's line.
    let r = row(&dom, r#"data-key="api/streams""#);
    assert!(r.contains(r#"<td class="num queued">1</td>"#) && !r.contains(r#"role="meter""#), "{r}");
    let waited = seconds(&texts(r, r#"class="num waited""#)[0]);
    assert!((4.8..=7.8).contains(&waited), "the first ticket of api/streams waited {waited} s: {r}");
    // A bucket without a line says so.
    let r = row(&dom, r#"data-key="api/idle""#);
    assert!(!r.contains("queued") && !r.contains("waited"), "{r}");

    let png = out_dir().join("page-line.png");
    browse(&browser, &format!("{}/", s.url), 3000, Some(&png)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_asks_for_the_token_and_says_when_it_is_wrong() {
    let Some(browser) = chromium() else { return };
    let s = TestServer::start(Some("s3cret")).await;
    s.acquire("agent-1", json!({"limits": [{"key": "api/requests", "calls": 5, "perMs": 60000}]})).await;
    // The page itself needs no token and carries no data; its reads do.
    let resp = reqwest::get(format!("{}/", s.url)).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/html; charset=utf-8");
    let html = resp.text().await.unwrap();
    assert!(!html.contains("api/requests"));
    assert!(!html.contains("http://") && !html.contains("https://"), "the page loads nothing from elsewhere");
    for path in ["/state", "/recent"] {
        assert_eq!(reqwest::get(format!("{}{path}", s.url)).await.unwrap().status(), 401, "{path}");
    }

    let dom = browse(&browser, &format!("{}/", s.url), 2000, None).await;
    assert!(dom.contains(r#"<form id="tokenform">"#), "the token form shows: {dom}");
    assert!(dom.contains(r#"class="auth">token needed<"#), "{dom}");
    assert!(dom.contains("This server needs a token."), "{dom}");
    assert!(dom.contains(r#"<div id="main" hidden="">"#), "no tables before a read: {dom}");
    assert!(!dom.contains("api/requests"), "{dom}");

    let dom = browse(&browser, &format!("{}/#token=wrong", s.url), 2000, None).await;
    assert!(dom.contains(r#"class="auth">token refused<"#), "{dom}");
    assert!(dom.contains("The server refused this token (401 unauthorized)."), "{dom}");
    assert!(dom.contains(r#"<form id="tokenform">"#), "{dom}");

    let dom = browse(&browser, &format!("{}/#token=s3cret", s.url), 2000, None).await;
    assert!(dom.contains(r#"class="live">live<"#), "{dom}");
    assert!(dom.contains(r#"<form id="tokenform" hidden="">"#), "{dom}");
    assert!(dom.contains(r#"<div id="main">"#), "{dom}");
    assert!(row(&dom, r#"data-key="api/requests""#).contains(">1/5<"), "{dom}");
    assert!(!dom.contains("s3cret"), "the token is not left in the page or its address");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_says_when_nothing_is_limited_and_filters_by_prefix() {
    let Some(browser) = chromium() else { return };
    let s = TestServer::start(None).await;
    let dom = browse(&browser, &format!("{}/", s.url), 2000, None).await;
    assert!(dom.contains(r#"class="live">live<"#), "{dom}");
    assert!(dom.contains("Nothing is limited right now: no buckets, places or throttles."), "{dom}");
    assert!(dom.contains("No caller is throttled.") && dom.contains("No place is held."), "{dom}");
    assert!(dom.contains("No refusal since the server started."), "{dom}");
    assert!(dom.contains("0 buckets · 0 permits · 0 throttles"), "{dom}");

    for key in ["openai/rpm", "search/qps"] {
        s.acquire("agent-1", json!({"limits": [{"key": key, "calls": 10, "perMs": 60000}]})).await;
    }
    let dom = browse(&browser, &format!("{}/#prefix=search/", s.url), 2000, None).await;
    assert_eq!(texts(&dom, r#"<td class="key mono" title="#), ["search/qps"]);
    let dom = browse(&browser, &format!("{}/#prefix=nothing", s.url), 2000, None).await;
    assert!(dom.contains("with prefix “nothing”."), "{dom}");
    assert!(!dom.contains(r#"class="bucket""#), "{dom}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_puts_the_fullest_first_and_pages_the_rest() {
    let Some(browser) = chromium() else { return };
    let s = TestServer::start(None).await;
    // 120 buckets, bucket i holding i + 1 of 200 calls (two acquires of 60 buckets each).
    for part in 0..2u64 {
        let limits: Vec<_> = (0..60u64)
            .map(|j| {
                let i = part * 60 + j;
                json!({"key": format!("b/{i:03}"), "calls": 200, "perMs": 60000, "cost": i + 1})
            })
            .collect();
        assert_eq!(s.acquire("bulk", json!({"limits": limits})).await["granted"], true);
    }
    let dom = browse(&browser, &format!("{}/", s.url), 2000, None).await;
    let keys = texts(&dom, r#"<td class="key mono" title="#);
    let expected: Vec<_> = (70..120).rev().map(|i| format!("b/{i:03}")).collect();
    assert_eq!(keys, expected, "the first page is the 50 fullest, fullest first");
    assert!(dom.contains(r#"<div id="pager">"#), "{dom}");
    assert!(dom.contains(r#"<span id="pageinfo" class="mono">1–50 of 120</span>"#), "{dom}");
    assert!(row(&dom, r#"data-key="b/119""#).contains(">120/200<"));
}

/// Whether the proxy has forwarded a `/state` read (then it cuts the page off).
static SERVED: AtomicBool = AtomicBool::new(false);

/// A stand-in for the network between the page and the server: forwards each request to the
/// server at `backend` over a connection of its own. Once it has forwarded the first `/state`
/// read, the server is gone (`backend` becomes `None`): it closes the page's connections
/// unanswered for the next `outage` reads, then holds requests until `backend` is set again.
fn proxy(backend: Arc<std::sync::Mutex<Option<String>>>, refuse: Arc<AtomicUsize>, outage: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let (backend, refuse) = (backend.clone(), refuse.clone());
            std::thread::spawn(move || {
                loop {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        match client.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let addr = loop {
                        if let Some(addr) = backend.lock().unwrap().clone() {
                            break addr;
                        }
                        if refuse.load(Ordering::SeqCst) > 0 {
                            if head.starts_with(b"GET /state") {
                                refuse.fetch_sub(1, Ordering::SeqCst);
                            }
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    };
                    let is_read = head.starts_with(b"GET /state");
                    let head = String::from_utf8(head).unwrap();
                    let head: String = head
                        .trim_end()
                        .split("\r\n")
                        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                        .map(|l| format!("{l}\r\n"))
                        .collect();
                    let mut server = TcpStream::connect(&addr).unwrap();
                    server.write_all(format!("{head}Connection: close\r\n\r\n").as_bytes()).unwrap();
                    let mut reply = Vec::new();
                    server.read_to_end(&mut reply).unwrap();
                    let reply = String::from_utf8(reply).unwrap();
                    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
                    if is_read {
                        let mut backend = backend.lock().unwrap();
                        if backend.as_deref() == Some(addr.as_str()) && !SERVED.load(Ordering::SeqCst) {
                            refuse.store(outage, Ordering::SeqCst);
                            *backend = None;
                            SERVED.store(true, Ordering::SeqCst);
                        }
                    }
                    let head: String = head
                        .split("\r\n")
                        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
                        .map(|l| format!("{l}\r\n"))
                        .collect();
                    if client.write_all(format!("{head}Connection: keep-alive\r\n\r\n{body}").as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn page_reconnects_after_a_restart() {
    let Some(browser) = chromium() else { return };
    let s = TestServer::start(None).await;
    let requests = json!({"limits": [{"key": "api/requests", "calls": 5, "perMs": 60000}]});
    s.acquire("agent-1", requests.clone()).await;
    let addr = s.url.trim_start_matches("http://").to_owned();
    let backend = Arc::new(std::sync::Mutex::new(Some(addr.clone())));
    let refuse = Arc::new(AtomicUsize::new(0));
    let url = proxy(backend.clone(), refuse.clone(), 3);

    // The page reads from the first server; then that server stops (the file is closed) and the
    // page's reads fail; then a second server opens the same file on the same address.
    let page = tokio::spawn({
        let browser = browser.clone();
        async move { browse(&browser, &format!("{url}/"), 8000, None).await }
    });
    // After the page's first read the proxy cuts it off; the server stops meanwhile.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !SERVED.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the page never read /state");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (dir, clock) = s.stop().await;
    while refuse.load(Ordering::SeqCst) > 0 {
        assert!(Instant::now() < deadline, "the page stopped reading while the server was down");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let s = TestServer::start_in(dir, None, &addr, clock).await;
    s.acquire("agent-1", requests).await;
    *backend.lock().unwrap() = Some(addr);
    let dom = page.await.unwrap();
    assert!(dom.contains(r#"class="live">live<"#), "{dom}");
    assert!(dom.contains(r#"data-reconnects="1""#), "the page said it was reconnecting, then read again: {dom}");
    assert!(dom.contains(r#"<div id="banner" hidden="">"#), "the reconnecting notice is gone: {dom}");
    assert!(!dom.contains(r#"class="stale""#), "{dom}");
    // What the second server read back from the file, plus its own grant.
    assert!(row(&dom, r#"data-key="api/requests""#).contains(">2/5<"), "{dom}");
}
