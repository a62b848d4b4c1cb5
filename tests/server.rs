//! The wire over real HTTP on 127.0.0.1:0: every rule and every error row of the spec, with an
//! injected clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use redb_limiter::limiter::LimiterOptions;
use redb_limiter::store::faulty::{FaultPlan, faulty_opener};
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
    _dir: tempfile::TempDir,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl TestServer {
    async fn start() -> Self {
        Self::start_with(None, None).await
    }

    async fn start_with(token: Option<&str>, plan: Option<Arc<FaultPlan>>) -> Self {
        let config = ServerConfig { token: token.map(str::to_owned), ..ServerConfig::default() };
        Self::start_config(config, plan).await
    }

    async fn start_config(config: ServerConfig, plan: Option<Arc<FaultPlan>>) -> Self {
        let token = config.token.clone();
        let token = token.as_deref();
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(FakeClock::new(T0));
        let mut options = LimiterOptions { clock: Some(clock.clone()), id_seed: Some(3), ..LimiterOptions::default() };
        if let Some(plan) = plan {
            options.opener = faulty_opener(plan);
        }
        let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, limiter, config, async move {
            let _ = stopped.await;
        }));
        TestServer { url, clock, http: reqwest::Client::new(), token: token.map(str::to_owned), _dir: dir, _stop: stop }
    }

    async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let mut req = self.http.post(format!("{}{path}", self.url)).body(body);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    async fn get(&self, path: &str) -> (u16, String) {
        let mut req = self.http.get(format!("{}{path}", self.url));
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.unwrap();
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    fn addr(&self) -> &str {
        self.url.trim_start_matches("http://")
    }

    /// Sends `bytes` on a new connection and reads until the server closes it (at most 5 s).
    async fn raw(&self, bytes: &[u8]) -> String {
        let mut stream = tokio::net::TcpStream::connect(self.addr()).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        read_until_closed(&mut stream).await
    }

    async fn state(&self) -> Value {
        let (status, body) = self.get("/state").await;
        assert_eq!(status, 200, "{body}");
        let mut v: Value = serde_json::from_str(&body).unwrap();
        v.as_object_mut().unwrap().remove("now");
        v
    }
}

async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the server did not close the connection; read so far: {}", String::from_utf8_lossy(&out));
    String::from_utf8_lossy(&out).into_owned()
}

/// The status and JSON body of a raw HTTP/1.1 response.
fn parse_response(text: &str) -> (u16, Value) {
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("no status in {text:?}"));
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {text:?}"));
    assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
    (status, serde_json::from_str(body).unwrap_or_else(|e| panic!("{body:?}: {e}")))
}

fn at(ms: u64) -> String {
    format_instant(T0.plus(ms))
}

fn window(bucket: &str, calls: u64, per_ms: u64) -> Value {
    json!({"key": "caller", "limits": [{"key": bucket, "calls": calls, "perMs": per_ms}]})
}

#[tokio::test]
async fn rolling_window_rules() {
    let s = TestServer::start().await;
    assert_eq!(s.post("/acquire", window("w", 2, 1000)).await, (200, json!({"granted": true, "at": at(0)})));
    s.clock.advance(400);
    assert_eq!(s.post("/acquire", window("w", 2, 1000)).await.1["granted"], true);
    s.clock.advance(100);
    assert_eq!(
        s.post("/acquire", window("w", 2, 1000)).await,
        (200, json!({"granted": false, "retryAt": at(1000), "reason": "rate", "limit": "w"}))
    );
    // At t + perMs the first grant no longer counts.
    s.clock.set(T0.plus(1000));
    assert_eq!(s.post("/acquire", window("w", 2, 1000)).await.1["granted"], true);
    // A cost over calls counts as calls: it waits for an empty window.
    let big = json!({"key": "caller", "cost": 9, "limits": [{"key": "w", "calls": 2, "perMs": 1000}]});
    assert_eq!(s.post("/acquire", big.clone()).await.1["retryAt"], at(2000));
    s.clock.set(T0.plus(2000));
    assert_eq!(s.post("/acquire", big).await.1["granted"], true);
    // A cost of 0 always fits in the window.
    let free = json!({"key": "caller", "limits": [{"key": "w", "calls": 2, "perMs": 1000, "cost": 0}]});
    assert_eq!(s.post("/acquire", free).await.1["granted"], true);
}

#[tokio::test]
async fn all_or_nothing_and_rule_six_ties() {
    let s = TestServer::start().await;
    assert_eq!(s.post("/acquire", window("full", 1, 1000)).await.1["granted"], true);
    let both = json!({"key": "caller", "limits": [
        {"key": "fresh", "calls": 1, "perMs": 1000},
        {"key": "full", "calls": 1, "perMs": 1000},
    ]});
    let before = s.state().await;
    let (_, refused) = s.post("/acquire", both).await;
    assert_eq!(refused, json!({"granted": false, "retryAt": at(1000), "reason": "rate", "limit": "full"}));
    assert_eq!(s.state().await, before, "a refused call counts in none of its buckets");
    // Throttle until the same instant: the throttle is reported on a tie.
    s.post("/throttle", json!({"key": "caller", "until": at(1000)})).await;
    let (_, tie) = s.post("/acquire", window("full", 1, 1000)).await;
    assert_eq!(tie, json!({"granted": false, "retryAt": at(1000), "reason": "throttle", "limit": "caller"}));
}

#[tokio::test]
async fn concurrency_permits_and_release() {
    let s = TestServer::start().await;
    let conc = json!({"key": "caller", "holdMs": 5000, "limits": [{"key": "c", "concurrent": 1}]});
    let (_, granted) = s.post("/acquire", conc.clone()).await;
    let permit = granted["permit"].as_str().unwrap().to_owned();
    assert!(permit.starts_with("p-"));
    // Refused for concurrency: the next recheck (250 ms) is sooner than the lapse.
    assert_eq!(
        s.post("/acquire", conc.clone()).await.1,
        json!({"granted": false, "retryAt": at(250), "reason": "concurrency", "limit": "c"})
    );
    s.clock.advance(4900);
    assert_eq!(s.post("/acquire", conc.clone()).await.1["retryAt"], at(5000));
    assert_eq!(s.post("/release", json!({"permit": permit})).await, (200, json!({"released": true})));
    assert_eq!(s.post("/release", json!({"permit": permit})).await, (200, json!({"released": false})));
    assert_eq!(s.post("/release", json!({"permit": "not-ours"})).await, (200, json!({"released": false})));
    let (_, again) = s.post("/acquire", conc.clone()).await;
    assert_ne!(again["permit"], json!(permit), "permits are never reused");
    // A place lapses holdMs after its grant, at the exact instant.
    s.clock.advance(5000);
    assert_eq!(s.post("/acquire", conc).await.1["granted"], true);
}

#[tokio::test]
async fn throttles_extend_only() {
    let s = TestServer::start().await;
    assert_eq!(
        s.post("/throttle", json!({"key": "k", "until": at(5000)})).await,
        (200, json!({"key": "k", "until": at(5000)}))
    );
    assert_eq!(s.post("/throttle", json!({"key": "k", "until": at(1000)})).await.1["until"], at(5000));
    // An offset is accepted on input, and written back in UTC.
    let later = "2027-01-15T09:30:00+01:00";
    assert_eq!(format_instant(T0), "2027-01-15T08:00:00.000Z");
    assert_eq!(s.post("/throttle", json!({"key": "x", "until": later})).await.1["until"], at(1_800_000));
    assert_eq!(s.post("/throttle", json!({"key": "k", "until": "2020-01-01T00:00:00Z"})).await.1["until"], at(5000));
    assert_eq!(
        s.post("/throttle", json!({"key": "new", "until": at(0)})).await.1,
        json!({"key": "new", "until": null})
    );
    let refused = s.post("/acquire", json!({"key": "k", "limits": []})).await.1;
    assert_eq!(refused, json!({"granted": false, "retryAt": at(5000), "reason": "throttle", "limit": "k"}));
    s.clock.advance(5000);
    assert_eq!(s.post("/acquire", json!({"key": "k", "limits": []})).await.1["granted"], true);
}

#[tokio::test]
async fn the_envelope_answers_like_the_direct_path() {
    let direct = TestServer::start().await;
    let envelope = TestServer::start().await;
    let calls = [
        ("acquire", window("w", 1, 1000)),
        ("acquire", window("w", 1, 1000)),
        ("throttle", json!({"key": "caller", "until": at(3000)})),
        ("acquire", window("x", 1, 1000)),
        ("release", json!({"permit": "p-00000000000000000000000000000000"})),
        ("acquire", json!({"key": "caller", "limits": [{"key": "w", "calls": 0, "perMs": 1}]})),
        ("throttle", json!({"key": "caller"})),
    ];
    for (method, params) in calls {
        let a = direct.post(&format!("/{method}"), params.clone()).await;
        let b = envelope.post("/", json!({"method": method, "params": params})).await;
        assert_eq!(a, b, "{method}");
    }
    assert_eq!(direct.state().await, envelope.state().await);
}

#[tokio::test]
async fn every_error_row() {
    let s = TestServer::start().await;
    let code = |v: &Value| v["error"]["code"].as_str().unwrap().to_owned();
    let message = |v: &Value| v["error"]["message"].as_str().unwrap().to_owned();
    let cases = [
        (
            json!({"key": "c", "limits": [{"key": "a", "calls": 1, "perMs": 0}]}),
            "limits[0].perMs must be an integer from 1 to 2678400000",
        ),
        (
            json!({"key": "c", "limits": [{"key": "a", "calls": 5.0, "perMs": 10}]}),
            "limits[0].calls must be an integer",
        ),
        (
            json!({"key": "c", "limits": [{"key": "a", "calls": 1e3, "perMs": 10}]}),
            "limits[0].calls must be an integer",
        ),
        (json!({"key": "c", "limits": [{"key": "a", "concurrent": "2"}]}), "limits[0].concurrent must be an integer"),
        (json!({"key": "c", "cost": -1, "limits": []}), "cost must be an integer from 0 to 1000000000"),
        (json!({"limits": []}), "key is required"),
        (json!({"key": "c", "limits": [{"key": "a", "calls": 3}]}), "limits[0].perMs is required with calls"),
        (json!({"key": "c", "limits": [{"key": "a"}]}), "limits[0] must have a window"),
        (json!({"key": "c", "holdMs": 86400001, "limits": []}), "holdMs must be an integer from 1 to 86400000"),
    ];
    for (body, want) in cases {
        let (status, reply) = s.post("/acquire", body.clone()).await;
        assert_eq!((status, code(&reply).as_str()), (400, "bad_request"), "{body}");
        assert!(message(&reply).starts_with(want), "{body}: {}", message(&reply));
    }
    let (status, reply) = s.post_raw("/acquire", "{not json").await;
    assert_eq!((status, code(&reply).as_str()), (400, "bad_request"));
    assert!(message(&reply).starts_with("body is not valid JSON"));
    assert_eq!(s.post("/release", json!({"permit": ""})).await.0, 400);
    assert_eq!(s.post("/release", json!({"permit": "p".repeat(129)})).await.0, 400);
    assert_eq!(s.post("/release", json!({"permit": 7})).await.0, 400);
    let (status, reply) = s.post("/throttle", json!({"key": "k", "until": at(86_400_001)})).await;
    assert_eq!((status, message(&reply).as_str()), (400, "until must be at most 24 hours ahead"));
    assert_eq!(s.post("/throttle", json!({"key": "k", "until": "soon"})).await.0, 400);

    let (status, reply) = s.post("/nope", json!({})).await;
    assert_eq!((status, code(&reply).as_str()), (404, "not_found"));
    let (status, reply) = s.post("/", json!({"method": "nope", "params": {}})).await;
    assert_eq!((status, code(&reply).as_str()), (404, "not_found"));
    let (status, body) = s.get("/acquire").await;
    assert_eq!(status, 405);
    assert!(body.contains("method_not_allowed"));
    let (status, reply) = s.post_raw("/acquire", vec![b' '; 64 * 1024 + 1]).await;
    assert_eq!((status, code(&reply).as_str()), (413, "payload_too_large"));
    // The unread body ends the connection, and the reply says so (no client reuses it).
    let resp = s.http.post(format!("{}/acquire", s.url)).body(vec![b' '; 64 * 1024 + 1]).send().await.unwrap();
    assert_eq!(resp.headers().get("connection").map(|v| v.as_bytes()), Some(&b"close"[..]));

    // None of it changed anything.
    assert_eq!(s.state().await["totals"], json!({"buckets": 0, "permits": 0, "throttles": 0}));
}

#[tokio::test]
async fn a_bad_limit_changes_nothing_even_after_good_ones() {
    let s = TestServer::start().await;
    let body = json!({"key": "c", "limits": [
        {"key": "good", "calls": 1, "perMs": 1000},
        {"key": "bad", "calls": 1, "perMs": 1000, "holdMs": 0},
    ]});
    let (status, reply) = s.post("/acquire", body).await;
    assert_eq!(status, 400);
    assert!(reply["error"]["message"].as_str().unwrap().starts_with("limits[1].holdMs"));
    assert_eq!(s.post("/acquire", window("good", 1, 1000)).await.1["granted"], true);
}

#[tokio::test]
async fn a_token_is_checked_first() {
    let s = TestServer::start_with(Some("s3cret"), None).await;
    let anon = reqwest::Client::new();
    for (method, path, body) in [
        ("POST", "/acquire", window("w", 1, 1000).to_string()),
        ("POST", "/nope", String::new()),
        ("GET", "/acquire", String::new()),
        ("POST", "/acquire", " ".repeat(70_000)),
        ("POST", "/acquire", "{bad".to_owned()),
        ("GET", "/state", String::new()),
        ("GET", "/metrics", String::new()),
    ] {
        let req = anon.request(method.parse().unwrap(), format!("{}{path}", s.url)).body(body.clone());
        let resp = req.bearer_auth("wrong").send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{method} {path}");
        let reply: Value = resp.json().await.unwrap();
        assert_eq!(reply["error"]["code"], "unauthorized");
    }
    let health = anon.get(format!("{}/health", s.url)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    assert_eq!(s.post("/acquire", window("w", 1, 1000)).await.1["granted"], true);
}

#[tokio::test]
async fn reads_health_state_and_metrics() {
    let s = TestServer::start().await;
    s.post("/acquire", window("team/a", 3, 1000)).await;
    s.post("/acquire", window("other/b", 3, 1000)).await;
    s.post("/acquire", window("team/a", 1, 1000)).await; // refused
    let (status, health) = s.get("/health").await;
    assert_eq!(status, 200);
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["ok"], true);
    assert!(health["path"].as_str().unwrap().ends_with("limiter.redb"));
    // It keeps `/wait`, so it speaks wire 4 (section 15).
    assert_eq!(health["wire"], 4, "{health}");
    let (_, state) = s.get("/state?prefix=team%2F").await;
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["buckets"].as_array().unwrap().len(), 1);
    assert_eq!(state["buckets"][0]["key"], "team/a");
    assert_eq!(state["buckets"][0]["windowUsed"], 1);
    assert_eq!(state["buckets"][0]["calls"], 3);
    let (_, metrics) = s.get("/metrics").await;
    assert!(
        metrics.contains(r#"redb_limiter_decisions_total{method="acquire",outcome="granted",reason=""} 2"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"redb_limiter_decisions_total{method="acquire",outcome="refused",reason="rate"} 1"#));
    assert!(metrics.contains("redb_limiter_live_buckets 2"));
    assert!(metrics.contains("redb_limiter_commit_seconds_count"));
}

#[tokio::test]
async fn a_store_that_cannot_commit_answers_unavailable() {
    let plan = FaultPlan::new();
    let s = TestServer::start_with(None, Some(plan.clone())).await;
    plan.fail_after(0);
    let (status, reply) = s.post("/acquire", window("w", 1, 1000)).await;
    assert_eq!((status, reply["error"]["code"].as_str().unwrap()), (503, "unavailable"));
    plan.disarm();
    // The limiter reopens its file by itself (retrying while the fault lasts); until then it
    // answers 503. The fault hit the commit's first write, not its final sync (after which the
    // call might still count, spec section 6): nothing was granted, and once back the window is
    // still empty.
    let mut reply = s.post("/acquire", window("w", 1, 1000)).await;
    for _ in 0..200 {
        if reply.0 != 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        reply = s.post("/acquire", window("w", 1, 1000)).await;
    }
    assert_eq!((reply.0, &reply.1["granted"]), (200, &json!(true)));
}

// ---------------------------------------------------------------------------------------------
// Section 9: peek, report, settle, lift.

fn tpm(cost: u64) -> Value {
    json!({"key": "caller", "permit": true, "limits": [
        {"key": "tpm", "calls": 100, "perMs": 60000, "cost": cost},
        {"key": "conc", "concurrent": 2},
    ]})
}

/// Section 12 over HTTP: a queued refusal names its ticket; asking again with it renews it; a
/// request that differs from the one it binds is a 400 naming `ticket`; a peek and a report show
/// the line; `release {ticket}` leaves it; a request without a ticket waits behind it.
#[tokio::test]
async fn the_line_over_http() {
    let s = TestServer::start().await;
    assert_eq!(s.post("/acquire", window("w", 1, 1000)).await.1["granted"], true);
    s.clock.advance(100);
    let mut queued = window("w", 1, 1000);
    queued["queue"] = json!(true);
    let (status, filed) = s.post("/acquire", queued.clone()).await;
    assert_eq!(status, 200);
    let ticket = filed["ticket"].as_str().expect("a ticket").to_owned();
    assert_eq!(
        filed,
        json!({"granted": false, "retryAt": at(1000), "reason": "rate", "limit": "w", "ticket": ticket,
            "lapseAt": at(3000), "ahead": 0, "now": at(100)})
    );
    // Behind it, a request that would fit waits for its retryAt, and says so in the figures.
    let mut free = json!({"key": "other", "limits": [{"key": "w", "calls": 5, "perMs": 1000}]});
    assert_eq!(
        s.post("/acquire", free.clone()).await.1,
        json!({"granted": false, "retryAt": at(1000), "reason": "rate", "limit": "w"})
    );
    free["report"] = json!(true);
    assert_eq!(s.post("/peek", free.clone()).await.1["limits"][0]["queued"], 1);
    // The ticket with another request: a bad request naming it.
    let mut other = window("w", 2, 1000);
    other["ticket"] = json!(ticket);
    let (status, err) = s.post("/acquire", other).await;
    assert_eq!(status, 400);
    assert!(err["error"]["message"].as_str().unwrap().starts_with("ticket "), "{err}");
    // Asked again before its retryAt: renewed, the same ticket.
    let mut again = window("w", 1, 1000);
    again["ticket"] = json!(ticket);
    again["graceMs"] = json!(500);
    let (_, renewed) = s.post("/acquire", again.clone()).await;
    assert_eq!((renewed["ticket"].as_str(), &renewed["lapseAt"]), (Some(ticket.as_str()), &json!(at(1500))));
    // Leaving: once true, then false; both given is a 400.
    let (status, _) = s.post("/release", json!({"ticket": ticket, "permit": "p-1"})).await;
    assert_eq!(status, 400);
    assert_eq!(s.post("/release", json!({"ticket": ticket})).await, (200, json!({"released": true})));
    assert_eq!(s.post("/release", json!({"ticket": ticket})).await, (200, json!({"released": false})));
    s.clock.set(T0.plus(1000));
    free.as_object_mut().unwrap().remove("report");
    assert_eq!(s.post("/acquire", free).await, (200, json!({"granted": true, "at": at(1000)})));
}

/// Section 12.7: `/state` lists each bucket's line (`queued`, `firstTicketAt`), a bucket with
/// only a line included; `/metrics` counts tickets filed, granted, lapsed and left, and the wait
/// of each granted one from its filing.
#[tokio::test]
async fn the_line_in_state_and_metrics() {
    let s = TestServer::start().await;
    let bucket = |v: &Value, key: &str| -> Value {
        v["buckets"].as_array().unwrap().iter().find(|b| b["key"] == key).cloned().unwrap_or(Value::Null)
    };
    let line = |caller: &str, grace: u64| {
        json!({"key": caller, "queue": true, "graceMs": grace, "limits": [
            {"key": "w", "calls": 1, "perMs": 1000}, {"key": "l", "concurrent": 5}]})
    };
    assert_eq!(s.post("/acquire", window("w", 1, 1000)).await.1["granted"], true);
    let state = s.state().await;
    assert_eq!((&bucket(&state, "w")["queued"], &bucket(&state, "w")["firstTicketAt"]), (&json!(0), &Value::Null));
    s.clock.advance(100);
    let mut first = window("w", 1, 1000);
    first["queue"] = json!(true);
    let a = s.post("/acquire", first.clone()).await.1["ticket"].as_str().unwrap().to_owned();
    s.clock.advance(100);
    let b = s.post("/acquire", line("b", 60_000)).await.1["ticket"].as_str().unwrap().to_owned();
    let c = s.post("/acquire", line("c", 100)).await.1;
    // Its own reserved instant behind `a` (1000), section 12.9: `b`, told 2000, holds no room
    // in `w` until a window before then, so `c` is told the same instant.
    assert_eq!((&c["retryAt"], &c["lapseAt"]), (&json!(at(2000)), &json!(at(2100))), "{c}");

    let state = s.state().await;
    assert_eq!(bucket(&state, "w")["queued"], 3);
    assert_eq!(bucket(&state, "w")["firstTicketAt"], at(100));
    assert_eq!(bucket(&state, "w")["firstTicket"], json!(a), "an operator can release the first ticket");
    // `l` holds no grant and no place: only a line.
    assert_eq!(
        bucket(&state, "l"),
        json!({"key": "l", "windowUsed": 0, "calls": 0, "perMs": 0, "concurrent": 0, "oldestGrant": null,
            "placesHeld": 0, "nextLapse": null, "queued": 2, "firstTicketAt": at(200), "firstTicket": b})
    );

    assert_eq!(s.post("/release", json!({"ticket": b})).await.1, json!({"released": true}));
    s.clock.set(T0.plus(1000));
    first["ticket"] = json!(a);
    assert_eq!(s.post("/acquire", first).await.1, json!({"granted": true, "at": at(1000)}));
    // `c` lapses at +2100 without asking again; the next grant's commit carries the lapse.
    s.clock.set(T0.plus(3200));
    assert_eq!(s.post("/acquire", window("x", 1, 1000)).await.1["granted"], true);
    let state = s.state().await;
    // `w`'s last grant (+1000) has left too: both buckets are forgotten with their lines.
    assert_eq!(bucket(&state, "w"), Value::Null, "{state}");
    assert_eq!(bucket(&state, "l"), Value::Null, "a bucket whose line emptied is forgotten: {state}");

    let (_, metrics) = s.get("/metrics").await;
    for (event, n) in [("filed", 3), ("granted", 1), ("lapsed", 1), ("left", 1)] {
        let line = format!("redb_limiter_tickets_total{{event=\"{event}\"}} {n}\n");
        assert!(metrics.contains(&line), "{line} missing from {metrics}");
    }
    // Ticket `a` waited 900 ms, from its filing at +100 to its grant at +1000.
    for line in [
        "redb_limiter_ticket_wait_seconds_count 1\n",
        "redb_limiter_ticket_wait_seconds_sum 0.9\n",
        "redb_limiter_ticket_wait_seconds_bucket{le=\"0.5\"} 0\n",
        "redb_limiter_ticket_wait_seconds_bucket{le=\"1.0\"} 1\n",
    ] {
        assert!(metrics.contains(line), "{line} missing from {metrics}");
    }
}

#[tokio::test]
async fn peek_decides_as_acquire_and_changes_nothing() {
    let s = TestServer::start().await;
    assert_eq!(s.post("/acquire", tpm(90)).await.1["granted"], true);
    let before = s.state().await;
    let (status, peek) = s.post("/peek", tpm(20)).await;
    assert_eq!(status, 200);
    assert_eq!(
        peek,
        json!({"fits": false, "retryAt": at(60000), "reason": "rate", "limit": "tpm", "now": at(0), "limits": [
            {"key": "tpm", "used": 90, "remaining": 10}, {"key": "conc", "held": 1, "free": 1}]})
    );
    assert_eq!(s.state().await, before, "a peek changes nothing");
    let (_, acquired) = s.post("/acquire", tpm(20)).await;
    assert_eq!(acquired, json!({"granted": false, "retryAt": at(60000), "reason": "rate", "limit": "tpm"}));
    let (_, fits) = s.post("/peek", tpm(10)).await;
    assert_eq!(fits["fits"], true);
    assert!(fits.get("retryAt").is_none());
    // The envelope answers the same.
    let (_, enveloped) = s.post("/", json!({"method": "peek", "params": tpm(10)})).await;
    assert_eq!(enveloped, fits);
    let (_, metrics) = s.get("/metrics").await;
    assert!(metrics.contains(r#"method="peek",outcome="refused",reason="rate"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"method="peek",outcome="fits",reason=""} 2"#), "{metrics}");
}

#[tokio::test]
async fn report_gives_the_figures_after_the_decision() {
    let s = TestServer::start().await;
    let mut body = tpm(30);
    body["report"] = json!(true);
    let (_, granted) = s.post("/acquire", body.clone()).await;
    assert_eq!(granted["granted"], true);
    assert_eq!(granted["now"], at(0));
    assert_eq!(
        granted["limits"],
        json!([{"key": "tpm", "used": 30, "remaining": 70}, {"key": "conc", "held": 1, "free": 1}])
    );
    // Without report the reply is section 3's.
    let (_, plain) = s.post("/acquire", tpm(30)).await;
    assert_eq!(plain.as_object().unwrap().keys().collect::<Vec<_>>(), vec!["at", "granted", "permit"]);
}

#[tokio::test]
async fn settle_down_up_again_unknown_and_release_with_costs() {
    let s = TestServer::start().await;
    let (_, granted) = s.post("/acquire", tpm(90)).await;
    let permit = granted["permit"].as_str().unwrap().to_owned();
    assert_eq!(s.post("/acquire", tpm(20)).await.1["granted"], false);
    let settle = |cost: u64| json!({"permit": permit, "costs": [{"key": "tpm", "cost": cost}]});
    // Down: room at once.
    assert_eq!(s.post("/settle", settle(10)).await, (200, json!({"settled": true})));
    assert_eq!(s.post("/peek", tpm(90)).await.1["fits"], true);
    // Up, above calls: counts as calls, so the next grant waits for the settled grant to leave.
    s.clock.advance(100);
    assert_eq!(s.post("/settle", settle(5000)).await, (200, json!({"settled": true})));
    assert_eq!(s.post("/acquire", tpm(1)).await.1["retryAt"], at(60000));
    // Again: the latest stands.
    assert_eq!(s.post("/settle", settle(40)).await.1["settled"], true);
    assert_eq!(s.post("/peek", tpm(60)).await.1["fits"], true);
    // A key that was not a window of the grant: a named error, and nothing changes.
    let before = s.state().await;
    let bad = json!({"permit": permit, "costs": [{"key": "tpm", "cost": 0}, {"key": "conc", "cost": 1}]});
    let (status, body) = s.post("/settle", bad).await;
    assert_eq!(
        (status, body["error"]["message"].as_str().unwrap()),
        (400, "costs[1].key is not a window limit of the permit's grant")
    );
    assert_eq!(s.state().await, before);
    // Unknown permits: settled false, whatever the keys.
    let unknown = json!({"permit": "p-nope", "costs": [{"key": "anything", "cost": 1}]});
    assert_eq!(s.post("/settle", unknown).await, (200, json!({"settled": false})));
    // Release with costs: settles, then releases, in one step.
    let release = json!({"permit": permit, "costs": [{"key": "tpm", "cost": 0}]});
    assert_eq!(s.post("/release", release.clone()).await, (200, json!({"released": true})));
    assert_eq!(s.post("/peek", tpm(100)).await.1["limits"][0], json!({"key": "tpm", "used": 0, "remaining": 100}));
    assert_eq!(s.post("/release", release).await, (200, json!({"released": false})));
    assert_eq!(s.post("/settle", settle(1)).await, (200, json!({"settled": false})));
    // A permit without places lives its holdMs.
    let placeless = json!({"key": "caller", "permit": true, "holdMs": 1000,
        "limits": [{"key": "rpm", "calls": 5, "perMs": 60000}]});
    let (_, granted) = s.post("/acquire", placeless).await;
    let permit = granted["permit"].as_str().unwrap().to_owned();
    s.clock.advance(999);
    let settle = json!({"permit": permit, "costs": [{"key": "rpm", "cost": 2}]});
    assert_eq!(s.post("/settle", settle.clone()).await.1["settled"], true);
    s.clock.advance(1);
    assert_eq!(s.post("/settle", settle).await.1["settled"], false);
    let (_, metrics) = s.get("/metrics").await;
    for line in [
        r#"method="settle",outcome="down""#,
        r#"method="settle",outcome="up""#,
        r#"method="settle",outcome="unknown""#,
        r#"method="peek",outcome="fits""#,
    ] {
        assert!(metrics.contains(line), "{line} missing from {metrics}");
    }
}

#[tokio::test]
async fn lift_ends_a_throttle_in_force() {
    let s = TestServer::start().await;
    s.post("/throttle", json!({"key": "caller", "until": at(50_000)})).await;
    assert_eq!(s.post("/acquire", window("w", 1, 1000)).await.1["reason"], "throttle");
    assert_eq!(s.post("/lift", json!({"key": "caller"})).await, (200, json!({"key": "caller", "lifted": true})));
    assert_eq!(s.post("/acquire", window("w", 1, 1000)).await.1["granted"], true);
    assert_eq!(
        s.post("/", json!({"method": "lift", "params": {"key": "caller"}})).await,
        (200, json!({"key": "caller", "lifted": false}))
    );
    let (_, metrics) = s.get("/metrics").await;
    assert!(metrics.contains(r#"method="lift",outcome="lifted""#), "{metrics}");
}

#[tokio::test]
async fn a_refusal_naming_a_longer_window_is_not_granted_before_its_retry_at() {
    let s = TestServer::start().await;
    for _ in 0..5 {
        assert_eq!(s.post("/acquire", window("b", 5, 500)).await.1["granted"], true);
    }
    assert_eq!(s.post("/acquire", window("b", 5, 60_000)).await.1["retryAt"], at(60_000));
    s.clock.advance(600);
    assert_eq!(s.post("/acquire", window("b", 5, 60_000)).await.1["retryAt"], at(60_000));
    s.clock.set(T0.plus(60_000));
    assert_eq!(s.post("/acquire", window("b", 5, 60_000)).await.1["granted"], true);
}

#[tokio::test]
async fn every_bad_input_of_section_9_is_named_and_changes_nothing() {
    let s = TestServer::start().await;
    let (_, granted) = s.post("/acquire", tpm(10)).await;
    let permit = granted["permit"].as_str().unwrap().to_owned();
    let before = s.state().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/acquire", json!({"key": "k", "limits": [], "report": "yes"}), "report must be true or false"),
        ("/acquire", json!({"key": "k", "limits": [], "permit": 1}), "permit must be true or false"),
        (
            "/peek",
            json!({"key": "k", "limits": [{"key": "a", "calls": 0, "perMs": 1}]}),
            "limits[0].calls must be an integer from 1 to 1000000000",
        ),
        ("/peek", json!({"limits": []}), "key is required"),
        ("/settle", json!({"costs": [{"key": "tpm", "cost": 1}]}), "permit is required"),
        (
            "/settle",
            json!({"permit": "x".repeat(129), "costs": [{"key": "tpm", "cost": 1}]}),
            "permit must be a string of 1 to 128 bytes",
        ),
        ("/settle", json!({"permit": permit}), "costs is required"),
        ("/settle", json!({"permit": permit, "costs": []}), "costs must have 1 to 64 entries"),
        (
            "/settle",
            json!({"permit": permit, "costs": [{"key": "tpm", "cost": -1}]}),
            "costs[0].cost must be an integer from 0 to 1000000000",
        ),
        (
            "/settle",
            json!({"permit": permit, "costs": [{"key": "tpm", "cost": 1e3}]}),
            "costs[0].cost must be an integer from 0 to 1000000000",
        ),
        ("/settle", json!({"permit": permit, "costs": [{"key": "tpm"}]}), "costs[0].cost is required"),
        (
            "/settle",
            json!({"permit": permit, "costs": [{"key": "tpm", "cost": 1}, {"key": "tpm", "cost": 2}]}),
            "costs[1].key must be unique within the request",
        ),
        (
            "/settle",
            json!({"permit": permit, "costs": [{"key": "nope", "cost": 1}]}),
            "costs[0].key is not a window limit of the permit's grant",
        ),
        (
            "/release",
            json!({"permit": permit, "costs": [{"key": "nope", "cost": 1}]}),
            "costs[0].key is not a window limit of the permit's grant",
        ),
        ("/release", json!({"permit": permit, "costs": "tpm"}), "costs must be an array"),
        ("/lift", json!({}), "key is required"),
        ("/lift", json!({"key": ""}), "key must be a string of 1 to 512 bytes"),
    ];
    for (path, body, message) in cases {
        let (status, reply) = s.post(path, body.clone()).await;
        assert_eq!((status, reply["error"]["code"].as_str()), (400, Some("bad_request")), "{path} {body}");
        assert_eq!(reply["error"]["message"], message, "{path} {body}");
        let method = path.trim_start_matches('/');
        let (status, enveloped) = s.post("/", json!({"method": method, "params": body})).await;
        assert_eq!((status, &enveloped), (400, &reply), "the envelope answers as {path}");
    }
    assert_eq!(s.state().await, before, "a request that errs changes nothing");
    assert_eq!(s.post("/peek", json!({"key": "k", "limits": []})).await.0, 200);
}

/// Errors hyper answers by itself carry the JSON error body; a malformed chunked body is a 400
/// (not a 413); an `until` before 1970 is a past instant. None of it changes anything.
#[tokio::test]
async fn malformed_http_gets_json_errors() {
    let s = TestServer::start().await;
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        (b"GARBAGE\r\n\r\n".to_vec(), 400, "malformed"),
        (b"POST /acquire HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n".to_vec(), 400, "malformed"),
        (
            b"POST /acquire HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n".to_vec(),
            400,
            "malformed",
        ),
        (format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(), 414, "URI is too long"),
        (
            format!("GET /health HTTP/1.1\r\nhost: x\r\n{}\r\n", "x-h: 1\r\n".repeat(200)).into_bytes(),
            431,
            "head is too large",
        ),
        (
            b"POST /acquire HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(),
            400,
            "body could not be read",
        ),
    ];
    for (request, status, message) in cases {
        let text = s.raw(&request).await;
        let (got, body) = parse_response(&text);
        assert_eq!(got, status, "{text}");
        assert_eq!(body["error"]["code"], "bad_request", "{text}");
        assert!(body["error"]["message"].as_str().unwrap().contains(message), "{text}");
    }
    let (status, reply) = s.post("/throttle", json!({"key": "k", "until": "1969-12-31T23:59:59.000Z"})).await;
    assert_eq!((status, reply), (200, json!({"key": "k", "until": null})));
    assert_eq!(s.state().await["totals"], json!({"buckets": 0, "permits": 0, "throttles": 0}));
}

fn short_timeouts() -> ServerConfig {
    ServerConfig {
        request_timeout: Duration::from_millis(200),
        idle_timeout: Duration::from_millis(600),
        ..ServerConfig::default()
    }
}

/// A request's head and body must arrive within the request timeout of its first byte; an idle
/// keep-alive connection is closed after the idle timeout, and one in use is not.
#[tokio::test]
async fn stalled_requests_and_idle_connections_are_closed() {
    let s = TestServer::start_config(short_timeouts(), None).await;
    for partial in [
        &b"POST /acquire HTTP/1.1\r\nhost: x\r\n"[..],
        &b"POST /acquire HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"key\":"[..],
    ] {
        let started = Instant::now();
        assert_eq!(s.raw(partial).await, "", "closed unanswered");
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(190) && took < Duration::from_millis(1500), "{took:?}");
    }
    // Idle after a request: closed after the idle timeout, not the request timeout.
    let mut stream = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    stream.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let idle_from = Instant::now();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Still open within the idle timeout: a second request is answered, and restarts it.
    stream.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let idle_from_again = Instant::now();
    assert_eq!(read_until_closed(&mut stream).await, "");
    let idle = idle_from_again.elapsed();
    assert!(idle >= Duration::from_millis(550) && idle < Duration::from_millis(2000), "{idle:?}");
    assert!(idle_from.elapsed() >= Duration::from_millis(950));
}

/// At most `max_connections` are served at once; the next waits to be accepted and is served
/// once one closes.
#[tokio::test]
async fn max_connections_is_honoured() {
    let s = TestServer::start_config(ServerConfig { max_connections: 2, ..ServerConfig::default() }, None).await;
    let health = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut held = Vec::new();
    let mut buf = vec![0u8; 4096];
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
        stream.write_all(health).await.unwrap();
        let n = stream.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let mut third = tokio::net::TcpStream::connect(s.addr()).await.unwrap();
    third.write_all(health).await.unwrap();
    let waited = tokio::time::timeout(Duration::from_millis(300), third.read(&mut buf)).await;
    assert!(waited.is_err(), "a third connection was served while two were open");
    drop(held.pop());
    let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}

/// Every log line the tests' tracing writes (set up once, for the whole test binary).
static LOG: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_lines_naming(needle: &str) -> usize {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| tracing_subscriber::fmt().with_writer(|| LogWriter).with_ansi(false).init());
    String::from_utf8_lossy(&LOG.lock().unwrap()).lines().filter(|l| l.contains(needle)).count()
}

/// While the store cannot commit, `/health` answers 503 with the reason; the failures are
/// logged once, then at most once a second; once commits succeed again, health is ok.
#[tokio::test]
async fn health_reports_an_outage_and_it_logs_once_a_second() {
    let plan = FaultPlan::new();
    let s = TestServer::start_with(None, Some(plan.clone())).await;
    let (_, health) = s.get("/health").await;
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["ok"], true);
    assert!(health.get("reason").is_none(), "{health}");
    let path = health["path"].as_str().unwrap().to_owned();
    assert_eq!(log_lines_naming(&path), 0);
    plan.fail_after(0);
    let started = Instant::now();
    let mut refused = 0;
    while started.elapsed() < Duration::from_millis(1500) {
        assert_eq!(s.post("/acquire", window("w", 1, 1000)).await.0, 503);
        refused += 1;
        let (status, health) = s.get("/health").await;
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!((status, &health["ok"]), (503, &json!(false)), "{health}");
        assert!(health["reason"].as_str().unwrap().contains(&path), "{health}");
    }
    let lines = log_lines_naming(&path);
    assert!((1..=3).contains(&lines), "{lines} error lines in 1.5 s for {refused} failed requests");
    plan.disarm();
    let mut reply = s.post("/acquire", window("w", 1, 1000)).await;
    for _ in 0..200 {
        if reply.0 != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        reply = s.post("/acquire", window("w", 1, 1000)).await;
    }
    assert_eq!(reply.0, 200);
    let (status, health) = s.get("/health").await;
    assert_eq!(status, 200, "{health}");
}

/// Answers 503 until `/acquire` does, for at most `within`; returns how long that took.
async fn until_unavailable(s: &TestServer, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (status, reply) = s.post("/acquire", window("w", 1_000_000, 1000)).await;
        if status == 503 {
            assert_eq!(reply["error"]["code"], "unavailable");
            return started.elapsed();
        }
        assert_eq!(status, 200);
        assert!(started.elapsed() < within, "still granting {:?} after the file went", started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A file deleted, or replaced by another, while serving is noticed within a second: every
/// request is then answered 503 and `/health` says why (and it is not reopened as a new file).
#[tokio::test]
async fn a_deleted_or_replaced_file_is_noticed_within_a_second() {
    for replace in [false, true] {
        let s = TestServer::start().await;
        assert_eq!(s.post("/acquire", window("w", 1_000_000, 1000)).await.0, 200);
        let path = s._dir.path().join("limiter.redb");
        if replace {
            let other = s._dir.path().join("other.redb");
            std::fs::copy(&path, &other).unwrap();
            std::fs::rename(&other, &path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
        let took = until_unavailable(&s, Duration::from_millis(1500)).await;
        assert!(took <= Duration::from_millis(1100), "noticed after {took:?}");
        let (status, health) = s.get("/health").await;
        let health: Value = serde_json::from_str(&health).unwrap();
        assert_eq!((status, &health["ok"]), (503, &json!(false)), "{health}");
        let why = if replace { "replaced" } else { "deleted" };
        assert!(health["reason"].as_str().unwrap().contains(why), "{health}");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(s.post("/acquire", window("w", 1_000_000, 1000)).await.0, 503, "still unavailable");
        assert_eq!(path.exists(), replace, "a deleted file is not created again");
    }
}

/// `/state` pages: at most `limit` buckets, permits and throttles each, in key order, after
/// `after` (exclusive), `truncated` while more remain; a bad `limit` is a 400 naming it.
#[tokio::test]
async fn state_pages_in_key_order() {
    let s = TestServer::start().await;
    let limits: Vec<Value> =
        (0..25).map(|i| json!({"key": format!("b{i:02}"), "calls": 5, "perMs": 60_000, "concurrent": 9})).collect();
    for _ in 0..3 {
        assert_eq!(s.post("/acquire", json!({"key": "c", "limits": limits})).await.1["granted"], true);
    }
    for i in 0..4 {
        s.post("/throttle", json!({"key": format!("t{i}"), "until": at(60_000)})).await;
    }
    let s = &s;
    let page = |query: String| async move {
        let (status, body) = s.get(&format!("/state?{query}")).await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()
    };
    let keys = |v: &Value, kind: &str, field: &str| -> Vec<String> {
        v[kind].as_array().unwrap().iter().map(|b| b[field].as_str().unwrap().to_owned()).collect()
    };
    let all = page(String::new()).await;
    assert_eq!(all["truncated"], false);
    let every_bucket = keys(&all, "buckets", "key");
    assert_eq!(every_bucket, (0..25).map(|i| format!("b{i:02}")).collect::<Vec<_>>());
    let every_permit = keys(&all, "permits", "permit");
    assert_eq!(every_permit.len(), 3);
    let (mut buckets, mut permits, mut throttles) = (Vec::new(), Vec::new(), Vec::new());
    let mut after = String::new();
    loop {
        let p = page(format!("limit=10&after={after}")).await;
        let (b, pe, t) = (keys(&p, "buckets", "key"), keys(&p, "permits", "permit"), keys(&p, "throttles", "key"));
        assert!(b.len() <= 10 && pe.len() <= 10 && t.len() <= 10);
        assert!(b.iter().all(|k| *k > after), "after is exclusive");
        assert_eq!(p["totals"], all["totals"]);
        buckets.extend(b.clone());
        if after.is_empty() {
            permits = pe;
            throttles = t;
        }
        if p["truncated"] == false {
            break;
        }
        after = b.last().unwrap().clone();
    }
    assert_eq!(buckets, every_bucket);
    assert_eq!((permits, throttles), (every_permit, keys(&all, "throttles", "key")));
    let tail = page("limit=10&after=b20".to_owned()).await;
    assert_eq!((keys(&tail, "buckets", "key").len(), &tail["truncated"]), (4, &json!(false)));
    let b1 = page("limit=3&prefix=b1".to_owned()).await;
    assert_eq!(
        (keys(&b1, "buckets", "key"), &b1["truncated"]),
        (vec!["b10".into(), "b11".into(), "b12".into()], &json!(true))
    );
    let b19 = page("prefix=b1&after=b18".to_owned()).await;
    assert_eq!((keys(&b19, "buckets", "key"), &b19["truncated"]), (vec!["b19".to_owned()], &json!(false)));
    let one = page("limit=1&prefix=t".to_owned()).await;
    assert_eq!((keys(&one, "throttles", "key"), &one["truncated"]), (vec!["t0".to_owned()], &json!(true)));
    assert!(keys(&one, "buckets", "key").is_empty());
    for bad in ["limit=0", "limit=100001", "limit=ten", "limit=-1"] {
        let (status, body) = s.get(&format!("/state?{bad}")).await;
        assert_eq!(status, 400, "{bad}");
        assert!(body.contains("limit must be an integer from 1 to 100000"), "{bad}: {body}");
    }
}

/// A burst of 100,000 keys that then go idle leaves no lasting growth: the writer forgets them,
/// deletes their grants and compacts the file while serving, to at most 2 MiB within 60 s. The
/// database's length is read both as redb sees it (`file_bytes` in `/metrics`, the journal's
/// commits included) and on disk (the compaction checkpoints the journal into the file).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_file_shrinks_after_a_burst_of_keys_goes_idle() {
    let s = TestServer::start().await;
    let path = s._dir.path().join("limiter.redb");
    let on_disk = || std::fs::metadata(&path).unwrap().len();
    let logical = || async {
        let text = s.http.get(format!("{}/metrics", s.url)).send().await.unwrap().text().await.unwrap();
        let line = text.lines().find(|l| l.starts_with("redb_limiter_file_bytes ")).expect("the file_bytes gauge");
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    let mut set = tokio::task::JoinSet::new();
    for r in 0..1563 {
        if set.len() >= 8 {
            set.join_next().await.unwrap().unwrap();
        }
        let limits: Vec<Value> =
            (0..64).map(|i| json!({"key": format!("burst/{:06}", r * 64 + i), "calls": 1, "perMs": 1000})).collect();
        let (http, url) = (s.http.clone(), s.url.clone());
        set.spawn(async move {
            let body = json!({"key": "burst", "limits": limits}).to_string();
            let resp = http.post(format!("{url}/acquire")).body(body).send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 200);
        });
    }
    while let Some(done) = set.join_next().await {
        done.unwrap();
    }
    assert_eq!(s.state().await["totals"]["buckets"], 100_032);
    let peak = logical().await;
    assert!(peak > 8 << 20, "100,032 keys take more than 8 MiB ({peak} bytes)");
    let idle_from = Instant::now();
    let (mut after, mut disk) = (peak, on_disk());
    while idle_from.elapsed() < Duration::from_secs(60) {
        s.clock.advance(1000);
        tokio::time::sleep(Duration::from_millis(200)).await;
        (after, disk) = (logical().await, on_disk());
        if after <= 2 << 20 && disk <= 2 << 20 {
            break;
        }
    }
    let took = idle_from.elapsed();
    eprintln!(
        "100,032 keys: {peak} bytes at the burst's end, {after} bytes ({disk} on disk) {took:?} after it went idle"
    );
    assert!(after <= 2 << 20 && disk <= 2 << 20, "still {after} bytes ({disk} on disk) after {took:?} (peak {peak})");
    assert_eq!(s.state().await["totals"]["buckets"], 0);
    // Still serving, from the compacted file.
    assert_eq!(s.post("/acquire", window("w", 1, 1000)).await.1["granted"], true);
}
