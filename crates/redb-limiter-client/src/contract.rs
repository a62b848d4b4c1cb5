//! The contract suite: every rule of the wire spec as a case that any limiter serving the wire
//! must pass. Each case uses fresh unique keys, so it can run against a live limiter that
//! already holds other state. `redb-limiter contract --url URL` runs it; so do our tests.
//!
//! Cases whose rule is about time use the instants the limiter itself reports (a grant's `at`)
//! and, where an edge must be crossed, sleep past it on the wall clock.

use std::time::Duration;

use serde_json::{Value, json};

use crate::HttpLimiter;
use redb_limiter::time::{Millis, format_instant, parse_instant, wall_clock_now};

/// One case's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseResult {
    pub name: &'static str,
    pub outcome: Result<(), String>,
}

/// Every case, by name, in the order they run.
pub const CASES: &[&str] = &[
    "window: grants up to calls, then refuses until the oldest grant leaves",
    "window: a grant no longer counts at exactly t + perMs",
    "window: costs weigh, over calls counts as calls, 0 always fits",
    "window: judged with the request's own calls",
    "all or nothing: a refused call counts in none of its buckets",
    "retryAt: the latest refusal stands; ties go to the first limit",
    "concurrency: a permit holds a place until released",
    "concurrency: a place lapses holdMs after its grant",
    "concurrency: a cost of 0 still takes a place",
    "release: unknown and repeated permits are not released",
    "throttle: refuses the caller until its instant; only ever extends",
    "throttle: wins a tie with a rate refusal",
    "throttle: a past until changes nothing; more than 24 h ahead is refused",
    "envelope: POST / answers like the direct path",
    "errors: every bad field is a 400 naming it, and changes nothing",
    "errors: unknown path 404, wrong method 405, body over 64 KiB 413",
    "instants: every instant is written in toISOString form",
    "peek: decides exactly as the acquire after it",
    "peek: counts nowhere and holds no place",
    "report: an acquire with report gives the figures after its decision",
    "settle: down frees room at once",
    "settle: up delays the next grant until the grant leaves",
    "settle: an unknown permit is not settled; a key not of the grant is a 400",
    "release: with costs settles, then releases",
    "lift: ends a throttle in force, and only then says lifted",
    "rule 3: a refusal naming a longer window keeps the grants that long",
    "line: a queued refusal files a ticket with lapseAt, ahead and now; an unqueued one does not",
    "line: backfill: a call that leaves a live ticket room at its instant is granted; one that would delay it waits behind it",
    "line: tickets are served in filing order, and a granted ticket has ended",
    "line: a late first ticket keeps its reservation: those behind are told their own instants, never its lapseAt",
    "line: release {ticket} leaves the line once",
    "line: a ticket lapses at retryAt + graceMs, and then joins the back",
    "line: a ticket binds its caller and limits; a mismatch is a 400 naming ticket",
    "line: a throttle refusal files no ticket",
    "line: peek decides by rule Q and shows queued, filing nothing",
    "line: every bad queue, ticket, graceMs and maxWaitMs field is a 400 naming it",
    "line: beyond min(maxWaitMs, the horizon) a refusal files no ticket and says noTicket horizon",
    "line: a throttled ticket holds back no one and keeps its place",
    "state: each line names its first ticket, which an operator can release",
    "ids: a retried acquire is answered as the first time and counts once; other params are a 400 naming id",
    "ids: a retried filing names the same ticket, never a second; release {id} takes it out of the line",
    "ids: release {id} frees the places, and with costs of 0 the windows; a released id stays released",
    "ids: release {id} of an id never seen is false, and the acquire arriving after it changes nothing",
    "wait: a release wakes the wait on a ticket it makes ready; asked with it, the ticket is granted",
    "wait: a ticket that left is gone, a wait times out with empty lists, bad fields are a 400 naming them",
    "bucket: starts full, refuses at burst with rule B's retryAt, and refills continuously",
    "bucket: initial is the first level, and a cost above burst waits for a full bucket",
    "bucket: settle refunds up to burst and takes into debt; figures give level and burst",
    "bucket: with concurrent it holds a place; in the line a later call waits behind the ticket",
    "bucket: calls with refill, burst or initial without refill, initial above burst are a 400 naming them",
    "ceiling: a request is judged with the ceiling, which starts at calls",
    "ceiling: a limited outcome cuts once per overload, never below min",
    "ceiling: a clean outcome grows it only in play, at most once per perMs, never above max",
    "ceiling: an outcome counts once per permit; an unknown or released permit changes nothing",
    "ceiling: a throttle naming a permit cuts its buckets and closes the caller",
    "ceiling: a bucket's ceiling stands for refill and scales burst",
    "errors: bad adapt, outcome and throttle permit fields are a 400 naming them, and change nothing",
    "line: a ticket held back by a bucket of its own holds no room in a shared one until a window before its retryAt",
];

#[derive(Clone)]
struct Contract {
    api: HttpLimiter,
    prefix: String,
}

type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

impl Contract {
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<String>) -> Result<(u16, Value), String> {
        let mut req = self.api.request(method, path);
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        let resp = req.send().await.map_err(|e| format!("{path}: {e}"))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| format!("{path}: {e}"))?;
        let value =
            serde_json::from_str(&text).map_err(|e| format!("{path} answered {status} with non-JSON {text:?}: {e}"))?;
        Ok((status, value))
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value, String> {
        match self.send(reqwest::Method::POST, path, Some(body.to_string())).await? {
            (200, v) => Ok(v),
            (status, v) => Err(format!("{path} answered {status}: {v}")),
        }
    }

    async fn acquire(&self, body: Value) -> Result<Value, String> {
        self.post("/acquire", body).await
    }

    fn window(&self, bucket: &str, calls: u64, per_ms: u64) -> Value {
        json!({"key": self.key("caller"), "limits": [{"key": self.key(bucket), "calls": calls, "perMs": per_ms}]})
    }

    /// An acquire of `cost` from the token bucket `bucket` (section 13), with `extra` fields in
    /// its limit (`burst`, `initial`, `concurrent`).
    /// An acquire with `permit` and `report` of the window `bucket` adapted by `adapt` (section 14).
    fn adapted(&self, bucket: &str, calls: u64, per_ms: u64, adapt: Value) -> Value {
        json!({"key": self.key("caller"), "permit": true, "report": true,
            "limits": [{"key": self.key(bucket), "calls": calls, "perMs": per_ms, "adapt": adapt}]})
    }

    /// The ceiling a peek of `body` is judged with.
    async fn ceiling(&self, body: &Value) -> Result<u64, String> {
        let peek = self.post("/peek", body.clone()).await?;
        peek["limits"][0]["ceiling"].as_u64().ok_or_else(|| format!("no ceiling in {peek}"))
    }

    /// A grant of `body` and its permit.
    async fn permit(&self, body: &Value) -> Result<String, String> {
        let v = self.acquire(body.clone()).await?;
        granted(&v)?;
        v["permit"].as_str().map(str::to_owned).ok_or_else(|| format!("no permit in {v}"))
    }

    /// Releases `permit` with `outcome`: whether it was live.
    async fn release_with(&self, permit: &str, outcome: &str) -> Result<bool, String> {
        let v = self.post("/release", json!({"permit": permit, "outcome": outcome})).await?;
        v["released"].as_bool().ok_or_else(|| format!("no released in {v}"))
    }

    fn bucket(&self, bucket: &str, refill: u64, per_ms: u64, cost: u64, extra: Value) -> Value {
        let mut limit = json!({"key": self.key(bucket), "refill": refill, "perMs": per_ms, "cost": cost});
        if let (Some(limit), Value::Object(extra)) = (limit.as_object_mut(), extra) {
            limit.extend(extra);
        }
        json!({"key": self.key("caller"), "report": true, "limits": [limit]})
    }
}

/// A refusal by `limit` for rate told `at` exactly, or (asked late) a grant at or after it.
fn refused_until_or_granted_after(v: &Value, limit: &str, at: Millis) -> Check {
    if v["granted"] == true {
        let granted_at = instant(v, "at")?;
        ensure!(granted_at >= at, "granted at {granted_at}, before {at}: {v}");
        return Ok(());
    }
    let retry = refused(v, "rate", limit)?;
    ensure!(retry == at, "retryAt {retry} is not rule B's {at}: {v}");
    Ok(())
}

/// The `(level, burst)` a report or peek gives for its first limit.
fn level_of(v: &Value) -> Result<(i64, u64), String> {
    let f = &v["limits"][0];
    let level = f["level"].as_i64().ok_or_else(|| format!("no level in {v}"))?;
    Ok((level, f["burst"].as_u64().ok_or_else(|| format!("no burst in {v}"))?))
}

fn instant(v: &Value, field: &str) -> Result<Millis, String> {
    let s = v[field].as_str().ok_or_else(|| format!("{field} missing in {v}"))?;
    let at = parse_instant(s).map_err(|e| format!("{field} {s:?} {e}"))?;
    ensure!(format_instant(at) == s, "{field} {s:?} is not in toISOString form");
    Ok(at)
}

fn granted(v: &Value) -> Result<Millis, String> {
    ensure!(v["granted"] == true, "expected a grant, got {v}");
    instant(v, "at")
}

fn refused(v: &Value, reason: &str, limit: &str) -> Result<Millis, String> {
    ensure!(v["granted"] == false, "expected a refusal, got {v}");
    ensure!(v["reason"] == reason && v["limit"] == limit, "expected {reason} by {limit}, got {v}");
    instant(v, "retryAt")
}

/// A queued refusal's ticket, checked for the fields section 12.1 names: `(ticket, retryAt,
/// lapseAt, ahead)`.
fn ticketed(v: &Value, reason: &str, limit: &str) -> Result<(String, Millis, Millis, u64), String> {
    let retry = refused(v, reason, limit)?;
    let ticket = v["ticket"].as_str().ok_or_else(|| format!("a queued refusal must carry a ticket: {v}"))?;
    ensure!((1..=128).contains(&ticket.len()), "ticket {ticket:?} is not 1-128 bytes");
    let lapse = instant(v, "lapseAt")?;
    let now = instant(v, "now")?;
    ensure!(now <= retry && retry < lapse, "now {now}, retryAt {retry} and lapseAt {lapse} out of order: {v}");
    let ahead = v["ahead"].as_u64().ok_or_else(|| format!("ahead missing in {v}"))?;
    Ok((ticket.to_owned(), retry, lapse, ahead))
}

fn unticketed(v: &Value) -> Check {
    for field in ["ticket", "lapseAt", "ahead", "now"] {
        ensure!(v.get(field).is_none(), "{field} in a reply that joined no line: {v}");
    }
    Ok(())
}

async fn sleep_past(at: Millis) {
    let ms = at.since(wall_clock_now()) + 20;
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

async fn run_case(c: &Contract, case: usize) -> Check {
    match case {
        0 => {
            let w = c.window("w0", 2, 60_000);
            let first = granted(&c.acquire(w.clone()).await?)?;
            granted(&c.acquire(w.clone()).await?)?;
            let retry = refused(&c.acquire(w).await?, "rate", &c.key("w0"))?;
            ensure!(retry == first.plus(60_000), "retryAt {retry} is not the first grant {first} + perMs");
            Ok(())
        }
        1 => {
            let w = c.window("w1", 1, 400);
            let at = granted(&c.acquire(w.clone()).await?)?;
            let retry = refused(&c.acquire(w.clone()).await?, "rate", &c.key("w1"))?;
            ensure!(retry == at.plus(400), "retryAt {retry} != {}", at.plus(400));
            sleep_past(retry).await;
            granted(&c.acquire(w).await?)?;
            Ok(())
        }
        2 => {
            let caller = c.key("caller");
            let weighted = |cost: u64, calls: u64, bucket: &str| json!({"key": caller, "cost": cost, "limits": [{"key": c.key(bucket), "calls": calls, "perMs": 60_000}]});
            let at = granted(&c.acquire(weighted(3, 5, "w2")).await?)?;
            let retry = refused(&c.acquire(weighted(3, 5, "w2")).await?, "rate", &c.key("w2"))?;
            ensure!(retry == at.plus(60_000), "cost 3 after 3 of 5: retryAt {retry}");
            granted(&c.acquire(weighted(2, 5, "w2")).await?)?;
            granted(&c.acquire(weighted(0, 5, "w2")).await?)?;
            // Over calls: fits an empty window, then fills it.
            granted(&c.acquire(weighted(50, 5, "w2b")).await?)?;
            refused(&c.acquire(weighted(1, 5, "w2b")).await?, "rate", &c.key("w2b"))?;
            Ok(())
        }
        3 => {
            granted(&c.acquire(c.window("w3", 1, 60_000)).await?)?;
            refused(&c.acquire(c.window("w3", 1, 60_000)).await?, "rate", &c.key("w3"))?;
            granted(&c.acquire(c.window("w3", 2, 60_000)).await?)?;
            Ok(())
        }
        4 => {
            granted(&c.acquire(c.window("full", 1, 60_000)).await?)?;
            let both = json!({"key": c.key("caller"), "limits": [
                {"key": c.key("free"), "calls": 1, "perMs": 60_000},
                {"key": c.key("full"), "calls": 1, "perMs": 60_000},
                {"key": c.key("conc"), "concurrent": 1},
            ]});
            refused(&c.acquire(both).await?, "rate", &c.key("full"))?;
            granted(&c.acquire(c.window("free", 1, 60_000)).await?)?;
            let conc = json!({"key": c.key("caller"), "limits": [{"key": c.key("conc"), "concurrent": 1}]});
            granted(&c.acquire(conc).await?)?;
            Ok(())
        }
        5 => {
            granted(&c.acquire(c.window("long", 1, 60_000)).await?)?;
            granted(&c.acquire(c.window("short", 1, 30_000)).await?)?;
            let pair = |a: &str, b: &str, pa: u64, pb: u64| {
                json!({"key": c.key("caller"), "limits": [
                    {"key": c.key(a), "calls": 1, "perMs": pa}, {"key": c.key(b), "calls": 1, "perMs": pb}]})
            };
            refused(&c.acquire(pair("short", "long", 30_000, 60_000)).await?, "rate", &c.key("long"))?;
            // Two limits granted together leave together: the first in request order is reported.
            granted(&c.acquire(pair("tieA", "tieB", 60_000, 60_000)).await?)?;
            refused(&c.acquire(pair("tieB", "tieA", 60_000, 60_000)).await?, "rate", &c.key("tieB"))?;
            let dup = pair("tieA", "tieA", 60_000, 60_000);
            let (status, _) = c.send(reqwest::Method::POST, "/acquire", Some(dup.to_string())).await?;
            ensure!(status == 400, "duplicate bucket keys in one request must be a 400, got {status}");
            Ok(())
        }
        6 => {
            let conc =
                json!({"key": c.key("caller"), "holdMs": 60_000, "limits": [{"key": c.key("c6"), "concurrent": 1}]});
            let g = c.acquire(conc.clone()).await?;
            let at = granted(&g)?;
            let permit = g["permit"].as_str().ok_or("a concurrency grant must carry a permit")?.to_owned();
            let retry = refused(&c.acquire(conc.clone()).await?, "concurrency", &c.key("c6"))?;
            ensure!(retry > at && retry <= at.plus(60_000), "retryAt {retry} is not within the hold");
            ensure!(c.post("/release", json!({"permit": permit})).await? == json!({"released": true}), "release");
            let again = c.acquire(conc).await?;
            granted(&again)?;
            ensure!(again["permit"] != json!(permit), "a permit id was reused");
            let plain = c.acquire(c.window("w6", 5, 1000)).await?;
            ensure!(plain.get("permit").is_none(), "a grant without concurrency carries no permit: {plain}");
            Ok(())
        }
        7 => {
            let conc =
                json!({"key": c.key("caller"), "holdMs": 400, "limits": [{"key": c.key("c7"), "concurrent": 1}]});
            let at = granted(&c.acquire(conc.clone()).await?)?;
            refused(&c.acquire(conc.clone()).await?, "concurrency", &c.key("c7"))?;
            sleep_past(at.plus(400)).await;
            granted(&c.acquire(conc).await?)?;
            Ok(())
        }
        8 => {
            let conc = json!({"key": c.key("caller"), "cost": 0, "limits": [{"key": c.key("c8"), "concurrent": 1, "calls": 1, "perMs": 60_000}]});
            granted(&c.acquire(conc.clone()).await?)?;
            refused(&c.acquire(conc).await?, "concurrency", &c.key("c8"))?;
            Ok(())
        }
        9 => {
            let unknown = format!("{}never-issued", c.prefix).chars().take(128).collect::<String>();
            ensure!(c.post("/release", json!({"permit": unknown})).await? == json!({"released": false}), "unknown");
            let conc = json!({"key": c.key("caller"), "limits": [{"key": c.key("c9"), "concurrent": 1}]});
            let permit = c.acquire(conc).await?["permit"].clone();
            ensure!(c.post("/release", json!({"permit": permit})).await?["released"] == true, "first release");
            ensure!(c.post("/release", json!({"permit": permit})).await?["released"] == false, "second release");
            Ok(())
        }
        10 => {
            let caller = c.key("t10");
            let until = format_instant(wall_clock_now().plus(30_000));
            let set = c.post("/throttle", json!({"key": caller, "until": until})).await?;
            ensure!(set == json!({"key": caller, "until": until}), "throttle answered {set}");
            let earlier = format_instant(wall_clock_now().plus(10_000));
            let kept = c.post("/throttle", json!({"key": caller, "until": earlier})).await?;
            ensure!(kept["until"] == json!(until), "a throttle must only extend: {kept}");
            let r = c.acquire(json!({"key": caller, "limits": []})).await?;
            let retry = refused(&r, "throttle", &caller)?;
            ensure!(format_instant(retry) == until, "retryAt {retry} is not the throttle's until");
            let other = c.acquire(json!({"key": c.key("not-throttled"), "limits": []})).await?;
            granted(&other)?;
            Ok(())
        }
        11 => {
            let at = granted(&c.acquire(c.window("w11", 1, 60_000)).await?)?;
            let caller = c.key("caller11");
            let until = format_instant(at.plus(60_000));
            c.post("/throttle", json!({"key": caller, "until": until})).await?;
            let w = json!({"key": caller, "limits": [{"key": c.key("w11"), "calls": 1, "perMs": 60_000}]});
            refused(&c.acquire(w).await?, "throttle", &caller)?;
            Ok(())
        }
        12 => {
            let caller = c.key("t12");
            let past = c.post("/throttle", json!({"key": caller, "until": "2020-01-01T00:00:00.000Z"})).await?;
            ensure!(past == json!({"key": caller, "until": null}), "a past until: {past}");
            granted(&c.acquire(json!({"key": caller, "limits": []})).await?)?;
            let far = format_instant(wall_clock_now().plus(25 * 3_600_000));
            let (status, v) = c
                .send(reqwest::Method::POST, "/throttle", Some(json!({"key": caller, "until": far}).to_string()))
                .await?;
            ensure!(
                status == 400 && v["error"]["message"].as_str().is_some_and(|m| m.contains("until")),
                "{status} {v}"
            );
            Ok(())
        }
        13 => {
            let params = c.window("e13", 1, 60_000);
            let envelope = c.post("/", json!({"method": "acquire", "params": params})).await?;
            granted(&envelope)?;
            let direct = c.acquire(params.clone()).await?;
            let via = c.post("/", json!({"method": "acquire", "params": params})).await?;
            ensure!(direct["reason"] == via["reason"] && direct["retryAt"] == via["retryAt"], "{direct} vs {via}");
            let (status, _) =
                c.send(reqwest::Method::POST, "/", Some(json!({"method": "nope", "params": {}}).to_string())).await?;
            ensure!(status == 404, "an unknown envelope method is a 404, got {status}");
            Ok(())
        }
        14 => {
            let caller = c.key("caller");
            let bad = [
                (json!({"key": caller, "limits": [{"key": c.key("x"), "calls": 1, "perMs": 0}]}), "limits[0].perMs"),
                (json!({"key": caller, "limits": [{"key": c.key("x"), "calls": 5.0, "perMs": 10}]}), "limits[0].calls"),
                (json!({"key": caller, "limits": [{"key": c.key("x"), "calls": "5", "perMs": 10}]}), "limits[0].calls"),
                (json!({"key": caller, "limits": [{"key": c.key("x"), "concurrent": -1}]}), "limits[0].concurrent"),
                (json!({"limits": []}), "key"),
                (json!({"key": caller}), "limits"),
                (json!({"key": caller, "cost": 1e3, "limits": []}), "cost"),
                (
                    json!({"key": caller, "limits": [{"key": c.key("ok"), "calls": 1, "perMs": 60_000}, {"key": c.key("y")}]}),
                    "limits[1]",
                ),
            ];
            for (body, field) in bad {
                let (status, v) = c.send(reqwest::Method::POST, "/acquire", Some(body.to_string())).await?;
                ensure!(status == 400 && v["error"]["code"] == "bad_request", "{body}: {status} {v}");
                let message = v["error"]["message"].as_str().unwrap_or_default();
                ensure!(message.contains(field), "{body}: message {message:?} does not name {field}");
            }
            let (status, _) = c.send(reqwest::Method::POST, "/acquire", Some("{\"key\":".into())).await?;
            ensure!(status == 400, "malformed JSON must be a 400, got {status}");
            // The first limit of the last bad request was not counted.
            granted(&c.acquire(c.window("ok", 1, 60_000)).await?)?;
            Ok(())
        }
        15 => {
            let (status, v) = c.send(reqwest::Method::POST, "/nope", Some("{}".into())).await?;
            ensure!(status == 404 && v["error"]["code"] == "not_found", "{status} {v}");
            let (status, v) = c.send(reqwest::Method::GET, "/acquire", None).await?;
            ensure!(status == 405 && v["error"]["code"] == "method_not_allowed", "{status} {v}");
            let big = format!("{{\"key\":\"{}\",\"limits\":[],\"pad\":\"{}\"}}", c.key("big"), "x".repeat(70_000));
            let (status, v) = c.send(reqwest::Method::POST, "/acquire", Some(big)).await?;
            ensure!(status == 413 && v["error"]["code"] == "payload_too_large", "{status} {v}");
            Ok(())
        }
        16 => {
            let g = c.acquire(c.window("i16", 1, 60_000)).await?;
            let at = granted(&g)?;
            let s = g["at"].as_str().unwrap_or_default();
            ensure!(s.len() == 24 && s.ends_with('Z') && s.as_bytes()[19] == b'.', "at {s:?}");
            ensure!(at.since(wall_clock_now()) < 5_000, "at {s} is far from now");
            Ok(())
        }
        17 => {
            granted(&c.acquire(c.window("p17", 1, 60_000)).await?)?;
            let peek = c.post("/peek", c.window("p17", 1, 60_000)).await?;
            ensure!(peek["fits"] == false, "a full window must not fit: {peek}");
            let acquired = c.acquire(c.window("p17", 1, 60_000)).await?;
            let retry = refused(&acquired, "rate", &c.key("p17"))?;
            ensure!(instant(&peek, "retryAt")? == retry, "peek {peek} and acquire {acquired} differ");
            ensure!(peek["reason"] == "rate" && peek["limit"] == c.key("p17"), "peek {peek}");
            let fits = c.post("/peek", c.window("p17b", 1, 60_000)).await?;
            ensure!(fits["fits"] == true && fits.get("retryAt").is_none(), "an empty window fits: {fits}");
            granted(&c.acquire(c.window("p17b", 1, 60_000)).await?)?;
            Ok(())
        }
        18 => {
            let both = json!({"key": c.key("caller"), "limits": [
                {"key": c.key("w18"), "calls": 1, "perMs": 60_000}, {"key": c.key("c18"), "concurrent": 1}]});
            for _ in 0..3 {
                let peek = c.post("/peek", both.clone()).await?;
                ensure!(peek["fits"] == true, "{peek}");
                let figures = json!([{"key": c.key("w18"), "used": 0, "remaining": 1},
                    {"key": c.key("c18"), "held": 0, "free": 1}]);
                ensure!(peek["limits"] == figures, "figures {} != {figures}", peek["limits"]);
                instant(&peek, "now")?;
            }
            granted(&c.acquire(both).await?)?;
            Ok(())
        }
        19 => {
            let body = json!({"key": c.key("caller"), "report": true, "limits": [
                {"key": c.key("w19"), "calls": 10, "perMs": 60_000, "cost": 3}, {"key": c.key("c19"), "concurrent": 2}]});
            let g = c.acquire(body).await?;
            granted(&g)?;
            instant(&g, "now")?;
            let figures = json!([{"key": c.key("w19"), "used": 3, "remaining": 7},
                {"key": c.key("c19"), "held": 1, "free": 1}]);
            ensure!(g["limits"] == figures, "figures {} != {figures}", g["limits"]);
            let plain = c.acquire(c.window("w19b", 1, 60_000)).await?;
            ensure!(plain.get("limits").is_none() && plain.get("now").is_none(), "no report unasked: {plain}");
            Ok(())
        }
        20 | 21 => {
            let tpm = |cost: u64| {
                json!({"key": c.key("caller"), "permit": true,
                "limits": [{"key": c.key("tpm"), "calls": 100, "perMs": 60_000, "cost": cost}]})
            };
            let g = c.acquire(tpm(90)).await?;
            let at = granted(&g)?;
            let permit = g["permit"].as_str().ok_or("permit: true must give a permit")?.to_owned();
            refused(&c.acquire(tpm(20)).await?, "rate", &c.key("tpm"))?;
            let settle = |cost: u64| json!({"permit": permit, "costs": [{"key": c.key("tpm"), "cost": cost}]});
            if case == 20 {
                ensure!(c.post("/settle", settle(10)).await? == json!({"settled": true}), "settle down");
                granted(&c.acquire(tpm(90)).await?)?;
            } else {
                ensure!(c.post("/settle", settle(100)).await? == json!({"settled": true}), "settle up");
                let retry = refused(&c.acquire(tpm(1)).await?, "rate", &c.key("tpm"))?;
                ensure!(retry == at.plus(60_000), "retryAt {retry} is not the grant's {at} + perMs");
            }
            Ok(())
        }
        22 => {
            let unknown = json!({"permit": format!("{}nope", c.prefix), "costs": [{"key": c.key("any"), "cost": 1}]});
            ensure!(c.post("/settle", unknown).await? == json!({"settled": false}), "unknown permit");
            let g = c
                .acquire(json!({"key": c.key("caller"), "permit": true, "limits": [
                {"key": c.key("w22"), "calls": 5, "perMs": 60_000}, {"key": c.key("c22"), "concurrent": 1}]}))
                .await?;
            let permit = g["permit"].as_str().ok_or("a permit")?.to_owned();
            let bad = json!({"permit": permit, "costs": [{"key": c.key("w22"), "cost": 5}, {"key": c.key("c22"), "cost": 1}]});
            let (status, v) = c.send(reqwest::Method::POST, "/settle", Some(bad.to_string())).await?;
            ensure!(
                status == 400 && v["error"]["message"].as_str().is_some_and(|m| m.contains("costs[1].key")),
                "{status} {v}"
            );
            // Nothing changed: the window still has room for 4 more.
            let fits = c
                .post(
                    "/peek",
                    json!({"key": c.key("caller"), "cost": 4, "limits": [
                {"key": c.key("w22"), "calls": 5, "perMs": 60_000}]}),
                )
                .await?;
            ensure!(fits["fits"] == true, "a settle that erred changed the window: {fits}");
            Ok(())
        }
        23 => {
            let body = json!({"key": c.key("caller"), "limits": [
                {"key": c.key("w23"), "calls": 10, "perMs": 60_000, "cost": 10}, {"key": c.key("c23"), "concurrent": 1}]});
            let g = c.acquire(body.clone()).await?;
            let permit = g["permit"].as_str().ok_or("a permit")?.to_owned();
            let release = json!({"permit": permit, "costs": [{"key": c.key("w23"), "cost": 0}]});
            ensure!(c.post("/release", release.clone()).await? == json!({"released": true}), "release with costs");
            granted(&c.acquire(body).await?)?;
            ensure!(c.post("/release", release).await? == json!({"released": false}), "second release");
            Ok(())
        }
        24 => {
            let caller = c.key("t24");
            let until = format_instant(wall_clock_now().plus(60_000));
            c.post("/throttle", json!({"key": caller, "until": until})).await?;
            refused(&c.acquire(json!({"key": caller, "limits": []})).await?, "throttle", &caller)?;
            ensure!(c.post("/lift", json!({"key": caller})).await? == json!({"key": caller, "lifted": true}), "lift");
            granted(&c.acquire(json!({"key": caller, "limits": []})).await?)?;
            ensure!(c.post("/lift", json!({"key": caller})).await? == json!({"key": caller, "lifted": false}), "again");
            Ok(())
        }
        25 => {
            for _ in 0..2 {
                granted(&c.acquire(c.window("r25", 2, 300)).await?)?;
            }
            let retry = refused(&c.acquire(c.window("r25", 2, 60_000)).await?, "rate", &c.key("r25"))?;
            sleep_past(wall_clock_now().plus(400)).await;
            let again = refused(&c.acquire(c.window("r25", 2, 60_000)).await?, "rate", &c.key("r25"))?;
            ensure!(again == retry, "granted or moved before its retryAt: {again} != {retry}");
            Ok(())
        }
        26 => {
            let full = c.window("q26", 1, 60_000);
            let at = granted(&c.acquire(full.clone()).await?)?;
            let plain = c.acquire(full.clone()).await?;
            refused(&plain, "rate", &c.key("q26"))?;
            unticketed(&plain)?;
            let mut queued = full.clone();
            queued["queue"] = json!(true);
            let (ticket, retry, lapse, ahead) = ticketed(&c.acquire(queued.clone()).await?, "rate", &c.key("q26"))?;
            ensure!(retry == at.plus(60_000), "a ticket first in line is told rule 6's instant: {retry}");
            ensure!(lapse == retry.plus(2_000), "lapseAt {lapse} is not retryAt + the default grace");
            ensure!(ahead == 0, "the first ticket has {ahead} ahead");
            let (second, _, _, ahead) = ticketed(&c.acquire(queued).await?, "rate", &c.key("q26"))?;
            ensure!(second != ticket && ahead == 1, "a second ticket {second} with {ahead} ahead");
            Ok(())
        }
        27 => {
            let cost = |n: u64, queue: bool| {
                json!({"key": c.key("caller"), "cost": n, "queue": queue,
                    "limits": [{"key": c.key("q27"), "calls": 10, "perMs": 60_000}]})
            };
            let at = granted(&c.acquire(cost(4, false)).await?)?;
            // 8 fits once the grant of 4 leaves: the ticket is reserved that instant.
            let (ticket, retry, _, _) = ticketed(&c.acquire(cost(8, true)).await?, "rate", &c.key("q27"))?;
            ensure!(retry == at.plus(60_000), "the ticket is told {retry}, not when the grant {at} leaves");
            // 3 fits now but would still count then, beside the 8: it waits behind the ticket.
            // (A call in the grant's own millisecond would leave with it, so it comes later.)
            sleep_past(at).await;
            let small = c.acquire(cost(3, false)).await?;
            let told = refused(&small, "rate", &c.key("q27"))?;
            ensure!(told == retry.plus(60_000), "a call behind the ticket is told {told}, not its own instant");
            unticketed(&small)?;
            // 2 leaves it room (2 + 8 = 10): granted at once, ahead of the ticket.
            granted(&c.acquire(cost(2, false)).await?)?;
            // A request of another bucket is not held back by this line.
            granted(&c.acquire(c.window("q27b", 1, 60_000)).await?)?;
            ensure!(c.post("/release", json!({"ticket": ticket})).await? == json!({"released": true}), "leave");
            granted(&c.acquire(cost(3, false)).await?)?;
            Ok(())
        }
        28 => {
            let body = |queue: bool| {
                json!({"key": c.key("caller"), "queue": queue, "graceMs": 60_000,
                    "limits": [{"key": c.key("q28"), "calls": 1, "perMs": 400}]})
            };
            granted(&c.acquire(body(false)).await?)?;
            let (first, retry, _, _) = ticketed(&c.acquire(body(true)).await?, "rate", &c.key("q28"))?;
            let (second, _, _, ahead) = ticketed(&c.acquire(body(true)).await?, "rate", &c.key("q28"))?;
            ensure!(ahead == 1, "the second ticket has {ahead} ahead");
            sleep_past(retry).await;
            let mut again = body(true);
            again["ticket"] = json!(first);
            let at = granted(&c.acquire(again.clone()).await?)?;
            // The second now stands first; it fits when the first one's grant leaves.
            let mut next = body(true);
            next["ticket"] = json!(second.clone());
            let (kept, retry, _, ahead) = ticketed(&c.acquire(next.clone()).await?, "rate", &c.key("q28"))?;
            ensure!(kept == second && ahead == 0, "the second ticket kept {kept} with {ahead} ahead");
            ensure!(retry == at.plus(400), "retryAt {retry} is not the first grant {at} + perMs");
            // A granted ticket has ended: it cannot leave the line again.
            ensure!(c.post("/release", json!({"ticket": first})).await? == json!({"released": false}), "ended");
            sleep_past(retry).await;
            granted(&c.acquire(next).await?)?;
            granted(&c.acquire(c.window("q28b", 1, 400)).await?)?;
            Ok(())
        }
        29 => {
            let body = |queue: bool| {
                json!({"key": c.key("caller"), "queue": queue, "graceMs": 60_000,
                    "limits": [{"key": c.key("q29"), "calls": 1, "perMs": 300}]})
            };
            granted(&c.acquire(body(false)).await?)?;
            let (_, retry, lapse, _) = ticketed(&c.acquire(body(true)).await?, "rate", &c.key("q29"))?;
            let (second, _, _, _) = ticketed(&c.acquire(body(true)).await?, "rate", &c.key("q29"))?;
            // The first ticket is late: it has not asked again since its retryAt, well past it (a
            // limiter lets its host a round trip first: 50 ms in ours). It keeps its reservation
            // at now; the ticket behind it is reserved a window later, a newcomer two.
            sleep_past(retry.plus(200)).await;
            let mut newcomer = body(false);
            newcomer["report"] = json!(true);
            let r = c.acquire(newcomer).await?;
            let told = refused(&r, "rate", &c.key("q29"))?;
            let now = instant(&r, "now")?;
            ensure!(told == now.plus(600) && told < lapse, "a newcomer behind two tickets is told {told} at {now}");
            let mut behind = body(true);
            behind["ticket"] = json!(second);
            let r = c.acquire(behind).await?;
            let (_, told, _, ahead) = ticketed(&r, "rate", &c.key("q29"))?;
            let now = instant(&r, "now")?;
            ensure!(ahead == 1, "the ticket behind has {ahead} ahead");
            ensure!(told == now.plus(300), "the ticket behind a late one is told {told} at {now}, not its own instant");
            Ok(())
        }
        30 => {
            let body = |queue: bool| {
                json!({"key": c.key("caller"), "queue": queue,
                    "limits": [{"key": c.key("q30"), "concurrent": 1}]})
            };
            let g = c.acquire(body(false)).await?;
            granted(&g)?;
            let (ticket, _, _, _) = ticketed(&c.acquire(body(true)).await?, "concurrency", &c.key("q30"))?;
            ensure!(c.post("/release", json!({"permit": g["permit"]})).await?["released"] == true, "release");
            // The place is free, but a ticket waits for it.
            refused(&c.acquire(body(false)).await?, "concurrency", &c.key("q30"))?;
            ensure!(c.post("/release", json!({"ticket": ticket})).await? == json!({"released": true}), "leave");
            ensure!(c.post("/release", json!({"ticket": ticket})).await? == json!({"released": false}), "again");
            granted(&c.acquire(body(false)).await?)?;
            Ok(())
        }
        31 => {
            let body = |queue: bool| {
                json!({"key": c.key("caller"), "queue": queue, "graceMs": 100,
                    "limits": [{"key": c.key("q31"), "calls": 10, "perMs": 300}]})
            };
            let mut big = body(false);
            big["cost"] = json!(8);
            granted(&c.acquire(big).await?)?;
            let mut wants = body(true);
            wants["cost"] = json!(5);
            let (ticket, retry, lapse, _) = ticketed(&c.acquire(wants.clone()).await?, "rate", &c.key("q31"))?;
            ensure!(lapse == retry.plus(100), "lapseAt {lapse} is not retryAt {retry} + graceMs 100");
            sleep_past(lapse).await;
            // Lapsed: it left the line, so a call that fits is granted, and the ticket is unknown.
            granted(&c.acquire(body(false)).await?)?;
            ensure!(c.post("/release", json!({"ticket": ticket})).await? == json!({"released": false}), "lapsed");
            // Asked again with it, it joins the back: a grant, or a refusal with a new ticket.
            wants["ticket"] = json!(ticket);
            let again = c.acquire(wants).await?;
            if again["granted"] == false {
                let (renewed, _, _, _) = ticketed(&again, "rate", &c.key("q31"))?;
                ensure!(renewed != ticket, "a lapsed ticket was given back: {again}");
            }
            Ok(())
        }
        32 => {
            let body = json!({"key": c.key("caller"), "queue": true, "cost": 3,
                "limits": [{"key": c.key("q32"), "calls": 3, "perMs": 60_000}]});
            granted(&c.acquire(body.clone()).await?)?;
            let (ticket, _, _, _) = ticketed(&c.acquire(body.clone()).await?, "rate", &c.key("q32"))?;
            let mut other = body.clone();
            other["ticket"] = json!(ticket);
            other["cost"] = json!(2);
            for path in ["/acquire", "/peek"] {
                let (status, v) = c.send(reqwest::Method::POST, path, Some(other.to_string())).await?;
                ensure!(
                    status == 400 && v["error"]["message"].as_str().is_some_and(|m| m.contains("ticket")),
                    "{path} with another request's ticket: {status} {v}"
                );
            }
            // The same request with another grace is still its own (graceMs is not bound).
            let mut same = body;
            same["ticket"] = json!(ticket);
            same["graceMs"] = json!(5_000);
            let (kept, _, _, _) = ticketed(&c.acquire(same).await?, "rate", &c.key("q32"))?;
            ensure!(kept == ticket, "a renewal changed the ticket to {kept}");
            ensure!(c.post("/release", json!({"ticket": ticket})).await? == json!({"released": true}), "leave");
            Ok(())
        }
        33 => {
            let caller = c.key("t33");
            let until = format_instant(wall_clock_now().plus(60_000));
            c.post("/throttle", json!({"key": caller, "until": until})).await?;
            let body =
                json!({"key": caller, "queue": true, "limits": [{"key": c.key("q33"), "calls": 1, "perMs": 60_000}]});
            let r = c.acquire(body).await?;
            refused(&r, "throttle", &caller)?;
            ensure!(r.get("ticket").is_none(), "a throttle refusal filed a ticket: {r}");
            granted(&c.acquire(c.window("q33", 1, 60_000)).await?)?;
            Ok(())
        }
        34 => {
            let body = |cost: u64, queue: bool| {
                json!({"key": c.key("caller"), "cost": cost, "queue": queue,
                    "limits": [{"key": c.key("q34"), "calls": 10, "perMs": 60_000}]})
            };
            let at = granted(&c.acquire(body(8, false)).await?)?;
            let (ticket, retry, _, _) = ticketed(&c.acquire(body(5, true)).await?, "rate", &c.key("q34"))?;
            ticketed(&c.acquire(body(4, true)).await?, "rate", &c.key("q34"))?;
            // A call in the grant's own millisecond would leave with it: the peeks come later.
            sleep_past(at).await;
            // 1 leaves both tickets room (5 + 4 + 1 = 10): it would backfill; 2 would not.
            ensure!(c.post("/peek", body(1, false)).await?["fits"] == true, "a backfill is peeked as refused");
            for _ in 0..2 {
                let peek = c.post("/peek", body(2, false)).await?;
                ensure!(peek["fits"] == false && peek["reason"] == "rate", "peek behind a line fits: {peek}");
                let told = instant(&peek, "retryAt")?;
                ensure!(told == retry.plus(60_000), "peek {peek} is not told its own instant behind the line");
                ensure!(peek["limits"][0]["queued"] == 2, "peek shows {} queued, not 2", peek["limits"][0]);
            }
            let mut first = body(5, false);
            first["ticket"] = json!(ticket);
            let peek = c.post("/peek", first).await?;
            ensure!(peek["fits"] == false, "the first ticket fits 5 in 8 of 10: {peek}");
            ensure!(peek["limits"][0]["queued"] == 2, "a peek filed or ended a ticket: {peek}");
            Ok(())
        }
        35 => {
            let caller = c.key("caller");
            let limits = json!([{"key": c.key("q35"), "calls": 1, "perMs": 60_000}]);
            let bad = [
                (json!({"key": caller, "limits": limits, "queue": "yes"}), "queue"),
                (json!({"key": caller, "limits": limits, "queue": 1}), "queue"),
                (json!({"key": caller, "limits": limits, "ticket": ""}), "ticket"),
                (json!({"key": caller, "limits": limits, "ticket": "t".repeat(129)}), "ticket"),
                (json!({"key": caller, "limits": limits, "ticket": 7}), "ticket"),
                (json!({"key": caller, "limits": limits, "queue": true, "graceMs": 99}), "graceMs"),
                (json!({"key": caller, "limits": limits, "queue": true, "graceMs": 60_001}), "graceMs"),
                (json!({"key": caller, "limits": limits, "queue": true, "graceMs": 500.0}), "graceMs"),
                (json!({"key": caller, "limits": limits, "queue": true, "maxWaitMs": 0}), "maxWaitMs"),
                (json!({"key": caller, "limits": limits, "queue": true, "maxWaitMs": 86_400_001}), "maxWaitMs"),
                (json!({"key": caller, "limits": limits, "queue": true, "maxWaitMs": "5"}), "maxWaitMs"),
            ];
            for (body, field) in bad {
                for path in ["/acquire", "/peek"] {
                    let (status, v) = c.send(reqwest::Method::POST, path, Some(body.to_string())).await?;
                    ensure!(status == 400 && v["error"]["code"] == "bad_request", "{path} {body}: {status} {v}");
                    let message = v["error"]["message"].as_str().unwrap_or_default();
                    ensure!(message.contains(field), "{path} {body}: message {message:?} does not name {field}");
                }
            }
            let releases = [
                json!({"permit": "p-1", "ticket": "t-1"}),
                json!({"ticket": "t-1", "costs": [{"key": c.key("q35"), "cost": 1}]}),
                json!({"ticket": ""}),
            ];
            for body in releases {
                let (status, v) = c.send(reqwest::Method::POST, "/release", Some(body.to_string())).await?;
                ensure!(status == 400 && v["error"]["code"] == "bad_request", "/release {body}: {status} {v}");
            }
            // None of them filed a ticket or counted: the window is empty and its line too.
            granted(&c.acquire(json!({"key": caller, "limits": limits})).await?)?;
            Ok(())
        }
        36 => {
            let body = |bucket: &str, per_ms: u64, max_wait: Option<u64>| {
                let mut b = json!({"key": c.key("caller"), "queue": true,
                    "limits": [{"key": c.key(bucket), "calls": 1, "perMs": per_ms}]});
                if let Some(ms) = max_wait {
                    b["maxWaitMs"] = json!(ms);
                }
                b
            };
            // A 31-day window: its own instant is beyond any horizon.
            granted(&c.acquire(c.window("q36", 1, 2_678_400_000)).await?)?;
            let r = c.acquire(body("q36", 2_678_400_000, None)).await?;
            refused(&r, "rate", &c.key("q36"))?;
            ensure!(r["noTicket"] == "horizon" && r.get("ticket").is_none(), "a 31-day wait joined the line: {r}");
            // A minute is within the default horizon, but not within a host's 5 s.
            granted(&c.acquire(c.window("q36m", 1, 60_000)).await?)?;
            let r = c.acquire(body("q36m", 60_000, Some(5_000))).await?;
            ensure!(r["noTicket"] == "horizon" && r.get("ticket").is_none(), "beyond maxWaitMs: {r}");
            let (ticket, _, lapse, _) =
                ticketed(&c.acquire(body("q36m", 60_000, None)).await?, "rate", &c.key("q36m"))?;
            ensure!(c.post("/release", json!({"ticket": ticket})).await?["released"] == true, "leave at {lapse}");
            // Others are not held back: the shared window of 31 days has no line.
            let other = json!({"key": c.key("other"), "limits": [{"key": c.key("q36s"), "calls": 2, "perMs": 2_678_400_000_u64}]});
            granted(&c.acquire(other.clone()).await?)?;
            granted(&c.acquire(other).await?)?;
            Ok(())
        }
        37 => {
            let ask = |caller: &str, queue: bool| {
                json!({"key": c.key(caller), "queue": queue,
                    "limits": [{"key": c.key("q37"), "calls": 1, "perMs": 300}]})
            };
            granted(&c.acquire(ask("a", false)).await?)?;
            let (ticket, retry, _, _) = ticketed(&c.acquire(ask("a", true)).await?, "rate", &c.key("q37"))?;
            let until = format_instant(wall_clock_now().plus(60_000));
            c.post("/throttle", json!({"key": c.key("a"), "until": until})).await?;
            // Past the ticket's instant, another caller is granted: the throttled ticket yields.
            sleep_past(retry).await;
            granted(&c.acquire(ask("b", false)).await?)?;
            let mut again = ask("a", true);
            again["ticket"] = json!(ticket.clone());
            let r = c.acquire(again).await?;
            refused(&r, "throttle", &c.key("a"))?;
            ensure!(r["ticket"] == json!(ticket), "the throttled ticket lost its place: {r}");
            Ok(())
        }
        38 => {
            let body = json!({"key": c.key("caller"), "queue": true,
                "limits": [{"key": c.key("q38"), "calls": 1, "perMs": 60_000}]});
            granted(&c.acquire(c.window("q38", 1, 60_000)).await?)?;
            let (ticket, _, _, _) = ticketed(&c.acquire(body.clone()).await?, "rate", &c.key("q38"))?;
            ticketed(&c.acquire(body).await?, "rate", &c.key("q38"))?;
            let state = c.send(reqwest::Method::GET, &format!("/state?prefix={}", c.key("q38")), None).await?.1;
            let bucket = &state["buckets"][0];
            ensure!(bucket["queued"] == 2 && bucket["firstTicket"] == json!(ticket), "/state names {bucket}");
            ensure!(c.post("/release", json!({"ticket": ticket})).await?["released"] == true, "release it");
            Ok(())
        }
        39 => {
            let id = c.key("ask");
            let body = json!({"key": c.key("caller"), "id": id, "cost": 2,
                "limits": [{"key": c.key("w39"), "calls": 3, "perMs": 60_000}, {"key": c.key("c39"), "concurrent": 2}]});
            let first = c.acquire(body.clone()).await?;
            granted(&first)?;
            ensure!(first["permit"].is_string(), "a grant with a place names its permit: {first}");
            // The retry, with report and another graceMs (neither is bound), gets the same answer.
            let mut retry = body.clone();
            retry["report"] = json!(true);
            retry["graceMs"] = json!(5_000);
            let again = c.acquire(retry).await?;
            ensure!(
                again["at"] == first["at"] && again["permit"] == first["permit"],
                "the retry got {again}, not {first}"
            );
            let (used, held) = (&again["limits"][0]["used"], &again["limits"][1]["held"]);
            ensure!(*used == 2 && *held == 1, "the retry counted again: used {used}, held {held}");
            let mut other = body;
            other["cost"] = json!(1);
            let (status, v) = c.send(reqwest::Method::POST, "/acquire", Some(other.to_string())).await?;
            let message = v["error"]["message"].as_str().unwrap_or_default();
            ensure!(status == 400 && message.starts_with("id"), "the id with other params: {status} {v}");
            ensure!(c.post("/release", json!({"permit": first["permit"]})).await?["released"] == true, "release");
            Ok(())
        }
        40 => {
            let limits = json!([{"key": c.key("q40"), "calls": 1, "perMs": 60_000}]);
            granted(&c.acquire(c.window("q40", 1, 60_000)).await?)?;
            let body = json!({"key": c.key("caller"), "id": c.key("ask"), "queue": true, "limits": limits});
            let (ticket, retry, _, _) = ticketed(&c.acquire(body.clone()).await?, "rate", &c.key("q40"))?;
            let (again, retry_again, _, _) = ticketed(&c.acquire(body).await?, "rate", &c.key("q40"))?;
            ensure!(again == ticket && retry_again == retry, "the retry named {again} at {retry_again}");
            let peek = c.post("/peek", c.window("q40", 1, 60_000)).await?;
            ensure!(peek["limits"][0]["queued"] == 1, "a second ticket was filed: {peek}");
            let undo = json!({"id": c.key("ask"), "costs": [{"key": c.key("q40"), "cost": 0}]});
            ensure!(c.post("/release", undo.clone()).await? == json!({"released": true}), "the ticket leaves");
            let peek = c.post("/peek", c.window("q40", 1, 60_000)).await?;
            ensure!(peek["limits"][0].get("queued").is_none_or(|q| *q == 0), "the ticket is still in line: {peek}");
            ensure!(c.post("/release", undo).await? == json!({"released": false}), "only once");
            ensure!(c.post("/release", json!({"ticket": ticket})).await? == json!({"released": false}), "gone");
            Ok(())
        }
        41 => {
            let place = json!({"key": c.key("caller"), "id": c.key("place"),
                "limits": [{"key": c.key("c41"), "concurrent": 1}]});
            granted(&c.acquire(place.clone()).await?)?;
            let undo = json!({"id": c.key("place")});
            ensure!(c.post("/release", undo.clone()).await? == json!({"released": true}), "the place is freed");
            ensure!(c.post("/release", undo).await? == json!({"released": false}), "only once");
            let (status, v) = c.send(reqwest::Method::POST, "/acquire", Some(place.to_string())).await?;
            let message = v["error"]["message"].as_str().unwrap_or_default();
            ensure!(status == 400 && message.starts_with("id"), "a released id asked again: {status} {v}");
            let free = c
                .post("/peek", json!({"key": c.key("caller"), "limits": [{"key": c.key("c41"), "concurrent": 1}]}))
                .await?;
            ensure!(free["fits"] == true && free["limits"][0]["held"] == 0, "a place is held: {free}");
            // A grant with no place, undone with costs of 0, counts nowhere.
            let window = json!({"key": c.key("caller"), "id": c.key("window"), "cost": 2,
                "limits": [{"key": c.key("w41"), "calls": 2, "perMs": 60_000}]});
            granted(&c.acquire(window).await?)?;
            let undo = json!({"id": c.key("window"), "costs": [{"key": c.key("w41"), "cost": 0}]});
            ensure!(c.post("/release", undo).await? == json!({"released": true}), "the window is settled");
            granted(
                &c.acquire(json!({"key": c.key("caller"), "cost": 2,
                "limits": [{"key": c.key("w41"), "calls": 2, "perMs": 60_000}]}))
                    .await?,
            )?;
            Ok(())
        }
        42 => {
            let undo = json!({"id": c.key("early"), "costs": [{"key": c.key("w42"), "cost": 0}]});
            ensure!(c.post("/release", undo).await? == json!({"released": false}), "an id never seen");
            let late = json!({"key": c.key("caller"), "id": c.key("early"),
                "limits": [{"key": c.key("w42"), "calls": 1, "perMs": 60_000}]});
            let (status, v) = c.send(reqwest::Method::POST, "/acquire", Some(late.to_string())).await?;
            let message = v["error"]["message"].as_str().unwrap_or_default();
            ensure!(status == 400 && message.starts_with("id"), "the acquire after its release: {status} {v}");
            granted(&c.acquire(c.window("w42", 1, 60_000)).await?)?;
            for bad in
                [json!({"id": ""}), json!({"id": "x".repeat(129)}), json!({"id": 5}), json!({"id": "a", "permit": "p"})]
            {
                let (status, v) = c.send(reqwest::Method::POST, "/release", Some(bad.to_string())).await?;
                let message = v["error"]["message"].as_str().unwrap_or_default();
                ensure!(status == 400 && message.starts_with("id"), "release {bad}: {status} {v}");
            }
            Ok(())
        }
        43 => {
            let conc = json!({"key": c.key("caller"), "limits": [{"key": c.key("c43"), "concurrent": 1}]});
            let held = c.acquire(conc.clone()).await?;
            granted(&held)?;
            let mut queued = conc.clone();
            queued["queue"] = json!(true);
            let (ticket, _, _, _) = ticketed(&c.acquire(queued.clone()).await?, "concurrency", &c.key("c43"))?;
            let waiter = c.clone();
            let body = json!({"tickets": [ticket], "timeoutMs": 20_000});
            let wait = tokio::spawn(async move { waiter.post("/wait", body).await });
            tokio::time::sleep(Duration::from_millis(100)).await;
            if wait.is_finished() {
                let early = wait.await.map_err(|e| e.to_string())??;
                return Err(format!("the wait answered {early} while the place was held"));
            }
            ensure!(c.post("/release", json!({"permit": held["permit"]})).await?["released"] == true, "release");
            let answer = tokio::time::timeout(Duration::from_secs(10), wait)
                .await
                .map_err(|_| "no answer 10 s after the release".to_owned())?
                .map_err(|e| e.to_string())??;
            ensure!(answer["ready"] == json!([ticket]) && answer["gone"] == json!([]), "the wait answered {answer}");
            instant(&answer, "now")?;
            queued["ticket"] = json!(ticket);
            let granted_now = c.acquire(queued).await?;
            granted(&granted_now)?;
            ensure!(c.post("/release", json!({"permit": granted_now["permit"]})).await?["released"] == true, "release");
            Ok(())
        }
        44 => {
            let limits = json!([{"key": c.key("w44"), "calls": 1, "perMs": 60_000}]);
            granted(&c.acquire(json!({"key": c.key("caller"), "limits": limits})).await?)?;
            let queued = json!({"key": c.key("caller"), "queue": true, "limits": limits});
            let (ticket, _, _, _) = ticketed(&c.acquire(queued.clone()).await?, "rate", &c.key("w44"))?;
            let started = std::time::Instant::now();
            let answer = c.post("/wait", json!({"tickets": [ticket], "timeoutMs": 1_000})).await?;
            let waited = started.elapsed();
            ensure!(answer["ready"] == json!([]) && answer["gone"] == json!([]), "a wait on a rate ticket: {answer}");
            ensure!(waited >= Duration::from_millis(900), "the wait answered after {waited:?}, not at timeoutMs");
            // Still in line after the wait.
            let peek = c.post("/peek", json!({"key": c.key("caller"), "limits": limits})).await?;
            ensure!(peek["limits"][0]["queued"] == 1, "the ticket left the line during the wait: {peek}");
            ensure!(c.post("/release", json!({"ticket": ticket})).await?["released"] == true, "leave");
            let answer = c.post("/wait", json!({"tickets": [ticket, "t-nobody"]})).await?;
            ensure!(answer["gone"] == json!([ticket, "t-nobody"]), "left and unknown tickets are gone: {answer}");
            let bad = [
                (json!({}), "tickets"),
                (json!({"tickets": []}), "tickets"),
                (json!({"tickets": [5]}), "tickets[0]"),
                (json!({"tickets": ["t"], "timeoutMs": 999}), "timeoutMs"),
                (json!({"tickets": ["t"], "timeoutMs": 60_001}), "timeoutMs"),
            ];
            for (body, field) in bad {
                let (status, v) = c.send(reqwest::Method::POST, "/wait", Some(body.to_string())).await?;
                let message = v["error"]["message"].as_str().unwrap_or_default();
                ensure!(status == 400 && message.starts_with(field), "/wait {body}: {status} {v}");
            }
            Ok(())
        }
        45 => {
            // One token every 6 s, 10 at most: ten at once, then refused until the next token.
            let b = c.bucket("b45", 10, 60_000, 1, json!({}));
            let mut last = None;
            for _ in 0..10 {
                last = Some(c.acquire(b.clone()).await?);
                granted(last.as_ref().expect("asked"))?;
            }
            ensure!(level_of(last.as_ref().expect("asked"))? == (0, 10), "ten taken from a full bucket: {last:?}");
            let refusal = c.acquire(b).await?;
            let retry = refused(&refusal, "rate", &c.key("b45"))?;
            let now = instant(&refusal, "now")?;
            ensure!(retry > now && retry <= now.plus(6_000), "retryAt {retry} is not within one token of {now}");
            // Continuous: 1 token per 100 ms, burst 5; 5 taken at `at` are back at `at + 500`, and
            // not before.
            let five = c.bucket("b45c", 10, 1_000, 5, json!({"burst": 5}));
            let at = granted(&c.acquire(five.clone()).await?)?;
            refused_until_or_granted_after(&c.acquire(five).await?, &c.key("b45c"), at.plus(500))
        }
        46 => {
            // Created at 0 by the refusal that first names it; 1 token per 100 ms, burst 3.
            let first = c.bucket("b46", 1, 100, 1, json!({"burst": 3, "initial": 0}));
            let v = c.acquire(first).await?;
            let now = instant(&v, "now")?;
            ensure!(level_of(&v)? == (0, 3), "initial 0: {v}");
            refused_until_or_granted_after(&v, &c.key("b46"), now.plus(100))?;
            // A cost of 100 counts as the burst of 3: it waits for a full bucket, 300 ms after the
            // bucket was created (the refusal above was kept).
            let big = c.bucket("b46", 1, 100, 100, json!({"burst": 3, "initial": 0}));
            refused_until_or_granted_after(&c.acquire(big).await?, &c.key("b46"), now.plus(300))?;
            // A peek reads `initial` and creates nothing.
            let peek = c.post("/peek", c.bucket("b46p", 1, 100, 1, json!({"burst": 3, "initial": 2}))).await?;
            ensure!(peek["fits"] == true && level_of(&peek)? == (2, 3), "a peek of a new bucket: {peek}");
            Ok(())
        }
        47 => {
            // One token every 6 s, 10 at most: a grant of 6 and one of 4 empty it.
            let mut a = c.bucket("b47", 10, 60_000, 6, json!({}));
            a["permit"] = json!(true);
            let permit = c.acquire(a).await?;
            granted(&permit)?;
            let permit = permit["permit"].as_str().ok_or("a permit was asked for")?.to_owned();
            let settle = |cost: u64| json!({"permit": permit, "costs": [{"key": c.key("b47"), "cost": cost}]});
            ensure!(c.post("/settle", settle(1)).await?["settled"] == true, "settled");
            let peek = c.post("/peek", c.bucket("b47", 10, 60_000, 1, json!({}))).await?;
            ensure!(level_of(&peek)? == (9, 10), "5 went back: {peek}");
            ensure!(c.post("/settle", settle(0)).await?["settled"] == true, "settled");
            let peek = c.post("/peek", c.bucket("b47", 10, 60_000, 1, json!({}))).await?;
            ensure!(level_of(&peek)? == (10, 10), "never above burst: {peek}");
            granted(&c.acquire(c.bucket("b47", 10, 60_000, 10, json!({}))).await?)?;
            ensure!(c.post("/settle", settle(4)).await?["settled"] == true, "settled");
            let peek = c.post("/peek", c.bucket("b47", 10, 60_000, 1, json!({}))).await?;
            ensure!(level_of(&peek)? == (-4, 10), "taken into debt: {peek}");
            // Five tokens to refill for a cost of 1: about 30 s.
            let refusal = c.acquire(c.bucket("b47", 10, 60_000, 1, json!({}))).await?;
            let (retry, now) = (refused(&refusal, "rate", &c.key("b47"))?, instant(&refusal, "now")?);
            ensure!(retry > now.plus(24_000) && retry <= now.plus(30_000), "in debt, retryAt {retry} from {now}");
            Ok(())
        }
        48 => {
            // With concurrent: a place held by the first grant refuses the second for concurrency.
            let placed = c.bucket("b48c", 10, 60_000, 1, json!({"concurrent": 1}));
            let first = c.acquire(placed.clone()).await?;
            granted(&first)?;
            refused(&c.acquire(placed).await?, "concurrency", &c.key("b48c"))?;
            let f = &first["limits"][0];
            ensure!(f["held"] == 1 && f["free"] == 0 && f["level"] == 9, "figures of both kinds: {first}");
            // The line: one token a minute, 2 at most, emptied; a ticket for 1 is reserved the
            // next token, and a call after it the one after that.
            granted(&c.acquire(c.bucket("b48", 1, 60_000, 2, json!({"burst": 2}))).await?)?;
            let mut queued = c.bucket("b48", 1, 60_000, 1, json!({"burst": 2}));
            queued["queue"] = json!(true);
            let (ticket, retry, _, _) = ticketed(&c.acquire(queued).await?, "rate", &c.key("b48"))?;
            let behind = c.acquire(c.bucket("b48", 1, 60_000, 1, json!({"burst": 2}))).await?;
            let behind = refused(&behind, "rate", &c.key("b48"))?;
            ensure!(behind == retry.plus(60_000), "behind the ticket at {retry}: told {behind}");
            ensure!(c.post("/release", json!({"ticket": ticket})).await?["released"] == true, "left");
            Ok(())
        }
        49 => {
            let caller = c.key("caller");
            let limit = |extra: Value| {
                let mut limit = json!({"key": c.key("x")});
                if let (Some(limit), Value::Object(extra)) = (limit.as_object_mut(), extra) {
                    limit.extend(extra);
                }
                json!({"key": caller, "limits": [{"key": c.key("ok"), "refill": 1, "perMs": 60_000}, limit]})
            };
            let bad = [
                (limit(json!({"calls": 5, "refill": 5, "perMs": 1000})), "limits[1].calls and limits[1].refill"),
                (limit(json!({"burst": 5, "concurrent": 1})), "limits[1].burst"),
                (limit(json!({"initial": 1, "calls": 5, "perMs": 1000})), "limits[1].initial"),
                (limit(json!({"refill": 5, "perMs": 1000, "burst": 3, "initial": 4})), "limits[1].initial"),
                (limit(json!({"refill": 0, "perMs": 1000})), "limits[1].refill"),
                (limit(json!({"refill": 5})), "limits[1].perMs"),
            ];
            for (body, field) in bad {
                let (status, v) = c.send(reqwest::Method::POST, "/acquire", Some(body.to_string())).await?;
                ensure!(status == 400 && v["error"]["code"] == "bad_request", "{body}: {status} {v}");
                let message = v["error"]["message"].as_str().unwrap_or_default();
                ensure!(message.starts_with(field), "{body}: message {message:?} does not name {field}");
            }
            // Nothing was taken from the first limit's bucket.
            let peek = c.post("/peek", c.bucket("ok", 1, 60_000, 1, json!({}))).await?;
            ensure!(level_of(&peek)? == (1, 1), "a request that errs changes nothing: {peek}");
            Ok(())
        }
        50 => {
            let body = c.adapted("c50", 3, 60_000, json!({}));
            ensure!(c.ceiling(&body).await? == 3, "starts at calls");
            for _ in 0..3 {
                let v = c.acquire(body.clone()).await?;
                granted(&v)?;
                ensure!(v["limits"][0]["ceiling"] == 3, "the report gives the ceiling: {v}");
            }
            refused(&c.acquire(body).await?, "rate", &c.key("c50"))?;
            Ok(())
        }
        51 => {
            let body = c.adapted("c51", 10, 60_000, json!({"min": 2, "keepPct": 50}));
            let (a, b) = (c.permit(&body).await?, c.permit(&body).await?);
            // Both granted before the cut, in its millisecond or not: one overload.
            ensure!(c.release_with(&a, "limited").await?, "released");
            ensure!(c.ceiling(&body).await? == 5, "cut to half");
            // Granted before that cut: the same overload.
            ensure!(c.release_with(&b, "limited").await?, "released");
            ensure!(c.ceiling(&body).await? == 5, "two 429s of one overload cut once");
            // Judged with 5: two counted, three more fit.
            for _ in 0..2 {
                granted(&c.acquire(body.clone()).await?)?;
            }
            let after = c.permit(&body).await?;
            refused(&c.acquire(body.clone()).await?, "rate", &c.key("c51"))?;
            let settle = json!({"permit": after, "costs": [{"key": c.key("c51"), "cost": 1}], "outcome": "limited"});
            ensure!(c.post("/settle", settle).await?["settled"] == true, "settled");
            ensure!(c.ceiling(&body).await? == 2, "a grant after the cut cuts again: 5 to 2");
            Ok(())
        }
        52 => {
            let body = c.adapted("c52", 4, 400, json!({"max": 7, "increase": 2}));
            // One of 4 in the window: not in play, no growth.
            let quiet = c.permit(&body).await?;
            ensure!(c.release_with(&quiet, "clean").await?, "released");
            ensure!(c.ceiling(&body).await? == 4, "a ceiling that binds nothing does not grow");
            // Two of 4: half, in play.
            let busy = c.permit(&body).await?;
            ensure!(c.release_with(&busy, "clean").await?, "released");
            ensure!(c.ceiling(&body).await? == 6, "grown by increase");
            let again = c.permit(&body).await?;
            ensure!(c.release_with(&again, "clean").await?, "released");
            ensure!(c.ceiling(&body).await? == 6, "at most once per perMs");
            // A window later (the ceiling, below max, outlives the empty window), three of 6 are
            // in play again: it grows, up to max.
            sleep_past(wall_clock_now().plus(400)).await;
            let mut last = String::new();
            for _ in 0..3 {
                last = c.permit(&body).await?;
            }
            ensure!(c.release_with(&last, "clean").await?, "released");
            ensure!(c.ceiling(&body).await? == 7, "6 + 2 is bounded by max");
            Ok(())
        }
        53 => {
            let body = c.adapted("c53", 10, 60_000, json!({}));
            let first = c.permit(&body).await?;
            let settle = json!({"permit": first, "costs": [{"key": c.key("c53"), "cost": 1}], "outcome": "limited"});
            ensure!(c.post("/settle", settle).await?["settled"] == true, "settled");
            ensure!(c.ceiling(&body).await? == 5, "cut");
            let later = c.permit(&body).await?;
            let settle = json!({"permit": later, "costs": [{"key": c.key("c53"), "cost": 1}], "outcome": "limited"});
            ensure!(c.post("/settle", settle).await?["settled"] == true, "settled");
            ensure!(c.ceiling(&body).await? == 2, "cut again");
            // The same permit's outcome again: counted once.
            ensure!(c.release_with(&later, "limited").await?, "still live, released");
            ensure!(c.ceiling(&body).await? == 2, "an outcome counts once per permit");
            ensure!(!c.release_with(&later, "limited").await?, "released already");
            ensure!(!c.release_with("p-00000000000000000000000000000000", "limited").await?, "unknown");
            ensure!(c.ceiling(&body).await? == 2, "an unknown or released permit changes nothing");
            Ok(())
        }
        54 => {
            let body = c.adapted("c54", 10, 60_000, json!({}));
            let permit = c.permit(&body).await?;
            let until = format_instant(wall_clock_now().plus(60_000));
            let throttle = json!({"key": c.key("caller"), "until": until, "permit": permit});
            ensure!(c.post("/throttle", throttle).await?["until"] == until, "in force");
            ensure!(c.ceiling(&body).await? == 5, "limited for the permit's bucket");
            refused(&c.acquire(body).await?, "throttle", &c.key("caller"))?;
            ensure!(c.post("/lift", json!({"key": c.key("caller")})).await?["lifted"] == true, "lifted");
            Ok(())
        }
        55 => {
            let mut body = c.bucket("c55", 10, 60_000, 1, json!({"burst": 20, "adapt": {}}));
            body["permit"] = json!(true);
            let v = c.acquire(body.clone()).await?;
            granted(&v)?;
            ensure!(v["limits"][0]["ceiling"] == 10 && v["limits"][0]["burst"] == 20, "starts at refill: {v}");
            let permit = v["permit"].as_str().ok_or_else(|| format!("no permit in {v}"))?.to_owned();
            ensure!(c.release_with(&permit, "limited").await?, "released");
            let peek = c.post("/peek", body).await?;
            ensure!(peek["limits"][0]["ceiling"] == 5 && peek["limits"][0]["burst"] == 10, "burst scales: {peek}");
            Ok(())
        }
        56 => {
            let caller = c.key("caller");
            let with = |limit: Value| json!({"key": caller, "permit": true, "limits": [limit]});
            let w = |adapt: Value| with(json!({"key": c.key("w"), "calls": 10, "perMs": 60_000, "adapt": adapt}));
            let bad = [
                ("/acquire", w(json!({"keepPct": 100})), "limits[0].adapt.keepPct"),
                ("/acquire", w(json!({"min": 11})), "limits[0].adapt.min"),
                ("/acquire", w(json!({"max": 9})), "limits[0].adapt.max"),
                ("/acquire", w(json!({"increase": -1})), "limits[0].adapt.increase"),
                ("/acquire", w(json!(5)), "limits[0].adapt"),
                ("/peek", with(json!({"key": c.key("p"), "concurrent": 1, "adapt": {}})), "limits[0].adapt"),
                ("/release", json!({"permit": "p-1", "outcome": "ok"}), "outcome"),
                ("/settle", json!({"permit": "p-1", "costs": [{"key": "a", "cost": 1}], "outcome": 1}), "outcome"),
                ("/throttle", json!({"key": caller, "until": format_instant(wall_clock_now()), "permit": 5}), "permit"),
            ];
            for (path, body, field) in bad {
                let (status, v) = c.send(reqwest::Method::POST, path, Some(body.to_string())).await?;
                ensure!(status == 400 && v["error"]["code"] == "bad_request", "{body}: {status} {v}");
                let message = v["error"]["message"].as_str().unwrap_or_default();
                ensure!(message.starts_with(field), "{body}: message {message:?} does not name {field}");
            }
            // Nothing was counted.
            let peek = c.post("/peek", c.window("w", 10, 60_000)).await?;
            ensure!(peek["limits"][0]["used"] == 0, "a request that errs changes nothing: {peek}");
            Ok(())
        }
        57 => {
            // The large caller's own bucket is full for a minute; the shared one frees in 300 ms.
            let large = |queue: bool| {
                json!({"key": c.key("large"), "queue": queue, "limits": [
                    {"key": c.key("q57"), "calls": 1, "perMs": 300},
                    {"key": c.key("q57own"), "calls": 1, "perMs": 60_000}]})
            };
            let at = granted(&c.acquire(large(false)).await?)?;
            let (ticket, retry, _, _) = ticketed(&c.acquire(large(true)).await?, "rate", &c.key("q57own"))?;
            ensure!(retry == at.plus(60_000), "the ticket is told its own bucket's instant: {retry}");
            // Once the shared window has room, another caller uses it: the ticket, a minute
            // away, holds none of it yet (a grant now has left that window by its retryAt).
            sleep_past(at.plus(300)).await;
            let other = c.window("q57", 1, 300);
            granted(&c.acquire(other.clone()).await?)?;
            refused(&c.acquire(other).await?, "rate", &c.key("q57"))?;
            ensure!(c.post("/release", json!({"ticket": ticket})).await? == json!({"released": true}), "leave");
            Ok(())
        }
        _ => Err(format!("no case {case}")),
    }
}

/// Runs every case against the limiter at `url`, printing one line per case when `print`.
pub async fn run(url: &str, token: Option<String>, print: bool) -> Vec<CaseResult> {
    let run_id = format!("{:x}", wall_clock_now().0 ^ u64::from(std::process::id()) << 40);
    let contract = Contract { api: HttpLimiter::new(url, token), prefix: format!("contract/{run_id}/") };
    let mut results = Vec::new();
    for (i, name) in CASES.iter().enumerate() {
        let outcome =
            Box::pin(run_case(&Contract { prefix: format!("{}{i}/", contract.prefix), ..contract.clone() }, i)).await;
        if print {
            match &outcome {
                Ok(()) => println!("ok    {name}"),
                Err(why) => println!("FAIL  {name}: {why}"),
            }
        }
        results.push(CaseResult { name, outcome });
    }
    results
}

/// The closing line: `N passed, N failed`.
#[must_use]
pub fn summary(results: &[CaseResult]) -> String {
    let passed = results.iter().filter(|r| r.outcome.is_ok()).count();
    format!("{passed} passed, {} failed", results.len() - passed)
}
