//! The real binary: restart after `kill -9` keeps every window, place, throttle and ticket with
//! its original instants; a second server on the same file is refused; SIGTERM drains and exits 0;
//! `check` validates a file.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

struct Server {
    child: Child,
    url: String,
}

fn start(path: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redb-limiter"))
        .args(["serve", "--listen", "127.0.0.1:0", "--path"])
        .arg(path)
        .env_remove("REDB_LIMITER_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("ready line {line:?}: {e}"));
    assert_eq!(ready["ready"], true);
    assert_eq!(ready["path"], json!(std::path::absolute(path).unwrap().display().to_string()));
    Server { child, url: ready["url"].as_str().unwrap().to_owned() }
}

async fn post(url: &str, path: &str, body: Value) -> Value {
    reqwest::Client::new().post(format!("{url}{path}")).json(&body).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn kill_9_keeps_windows_places_and_throttles_with_their_instants() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    let window = json!({"key": "caller", "limits": [{"key": "rpm", "calls": 1, "perMs": 3_600_000}]});
    let granted = post(&server.url, "/acquire", window.clone()).await;
    assert_eq!(granted["granted"], true);
    let conc = json!({"key": "caller", "holdMs": 3_600_000, "limits": [{"key": "conc", "concurrent": 1}]});
    let held = post(&server.url, "/acquire", conc.clone()).await;
    assert_eq!(held["granted"], true);
    let until = "2099-01-01T00:00:00.000Z";
    let now = redb_limiter::time::format_instant(redb_limiter::time::wall_clock_now().plus(3_600_000));
    let throttle = post(&server.url, "/throttle", json!({"key": "throttled", "until": now})).await;
    assert_eq!(throttle["until"], json!(now));
    assert_ne!(now, until);
    let before = post(&server.url, "/acquire", window.clone()).await;
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();

    let mut server = start(&path);
    let after = post(&server.url, "/acquire", window).await;
    assert_eq!(after, before, "the window and its retryAt survive");
    let at = held["at"].as_str().unwrap();
    let lapse = redb_limiter::time::parse_instant(at).unwrap().plus(3_600_000);
    let state: Value =
        reqwest::Client::new().get(format!("{}/state", server.url)).send().await.unwrap().json().await.unwrap();
    let permit = &state["permits"][0];
    assert_eq!(permit["permit"], held["permit"]);
    assert_eq!(permit["places"][0]["lapse"], json!(redb_limiter::time::format_instant(lapse)));
    assert_eq!(post(&server.url, "/acquire", conc).await["reason"], "concurrency");
    let throttled = post(&server.url, "/acquire", json!({"key": "throttled", "limits": []})).await;
    assert_eq!((throttled["reason"].as_str(), &throttled["retryAt"]), (Some("throttle"), &json!(now)));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// A settle is durable before its reply: `kill -9` right after it keeps the settled cost, and
/// the permit (and so its place) survives with it.
#[tokio::test]
async fn kill_9_after_a_settle_keeps_the_settled_cost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    let tpm = |cost: u64| {
        json!({"key": "caller", "permit": true, "limits": [
            {"key": "tpm", "calls": 1000, "perMs": 3_600_000, "cost": cost}, {"key": "conc", "concurrent": 2}]})
    };
    let granted = post(&server.url, "/acquire", tpm(900)).await;
    let permit = granted["permit"].as_str().unwrap().to_owned();
    let settle = json!({"permit": permit, "costs": [{"key": "tpm", "cost": 150}]});
    assert_eq!(post(&server.url, "/settle", settle).await, json!({"settled": true}));
    server.child.kill().unwrap(); // SIGKILL, straight after the reply
    server.child.wait().unwrap();

    let mut server = start(&path);
    let peek = post(&server.url, "/peek", tpm(850)).await;
    assert_eq!(peek["fits"], true, "{peek}");
    assert_eq!(peek["limits"][0], json!({"key": "tpm", "used": 150, "remaining": 850}));
    assert_eq!(peek["limits"][1], json!({"key": "conc", "held": 1, "free": 1}));
    assert_eq!(post(&server.url, "/peek", tpm(851)).await["fits"], false);
    // Settled again after the restart, then released with costs.
    let release = json!({"permit": permit, "costs": [{"key": "tpm", "cost": 0}]});
    assert_eq!(post(&server.url, "/release", release).await, json!({"released": true}));
    let peek = post(&server.url, "/peek", tpm(1000)).await;
    assert_eq!(
        peek["limits"],
        json!([{"key": "tpm", "used": 0, "remaining": 1000}, {"key": "conc", "held": 0, "free": 2}])
    );
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// A token bucket's level is durable before its reply (section 13): `kill -9` straight after a
/// grant and a settle keeps the level, and the restart refills it by the time that passed, never
/// fuller; `/state` shows it with its burst.
#[tokio::test]
async fn kill_9_keeps_a_bucket_level_and_the_restart_refills_it_by_the_time_passed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    // One token an hour, burst 10: what passes during the test refills nothing.
    let tokens = |cost: u64| {
        json!({"key": "caller", "permit": true, "report": true, "limits": [
            {"key": "itpm", "refill": 10, "perMs": 36_000_000, "cost": cost}]})
    };
    let granted = post(&server.url, "/acquire", tokens(7)).await;
    assert_eq!((granted["granted"].as_bool(), &granted["limits"][0]["level"]), (Some(true), &json!(3)), "{granted}");
    let settle = json!({"permit": granted["permit"], "costs": [{"key": "itpm", "cost": 9}]});
    assert_eq!(post(&server.url, "/settle", settle).await, json!({"settled": true}));
    server.child.kill().unwrap(); // SIGKILL, straight after the reply
    server.child.wait().unwrap();

    let mut server = start(&path);
    let peek = post(&server.url, "/peek", tokens(1)).await;
    assert_eq!(peek["limits"][0], json!({"key": "itpm", "level": 1, "burst": 10}), "{peek}");
    assert_eq!(post(&server.url, "/peek", tokens(2)).await["fits"], false, "never fuller after the restart");
    let state: Value =
        reqwest::Client::new().get(format!("{}/state", server.url)).send().await.unwrap().json().await.unwrap();
    let bucket = &state["buckets"][0];
    assert_eq!((&bucket["key"], &bucket["level"], &bucket["burst"]), (&json!("itpm"), &json!(1), &json!(10)));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// An adaptive ceiling is durable before its reply (section 14): `kill -9` straight after the
/// outcome that cut it keeps the cut, the permit's outcome stays counted, and `/state` lists it.
#[tokio::test]
async fn kill_9_keeps_an_adaptive_ceiling_and_what_each_permit_counted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    let adapted = json!({"key": "caller", "permit": true, "report": true, "limits": [
        {"key": "rpm", "calls": 10, "perMs": 3_600_000, "adapt": {"min": 1, "keepPct": 50}}]});
    let first = post(&server.url, "/acquire", adapted.clone()).await;
    let second = post(&server.url, "/acquire", adapted.clone()).await;
    let settle = json!({"permit": first["permit"], "costs": [{"key": "rpm", "cost": 1}], "outcome": "limited"});
    assert_eq!(post(&server.url, "/settle", settle).await, json!({"settled": true}));
    server.child.kill().unwrap(); // SIGKILL, straight after the reply
    server.child.wait().unwrap();

    let mut server = start(&path);
    let peek = post(&server.url, "/peek", adapted.clone()).await;
    assert_eq!(peek["limits"][0]["ceiling"], 5, "{peek}");
    // The first permit's outcome was counted: again, it changes nothing; the second was granted
    // before the cut: one overload.
    let again = json!({"permit": first["permit"], "outcome": "limited"});
    assert_eq!(post(&server.url, "/release", again).await, json!({"released": true}));
    let before = json!({"permit": second["permit"], "outcome": "limited"});
    assert_eq!(post(&server.url, "/release", before).await, json!({"released": true}));
    assert_eq!(post(&server.url, "/peek", adapted).await["limits"][0]["ceiling"], 5);
    let state: Value =
        reqwest::Client::new().get(format!("{}/state", server.url)).send().await.unwrap().json().await.unwrap();
    let ceiling = &state["ceilings"][0];
    assert_eq!((&ceiling["key"], &ceiling["ceiling"]), (&json!("rpm"), &json!(5)), "{state}");
    assert!(ceiling["lastCutAt"].is_string(), "{state}");
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// Tickets are in the file: after a `kill -9` (straight after a renewal, which may be lost) and
/// after a clean stop, each ticket keeps its place and order in the line.
#[tokio::test]
async fn tickets_keep_their_place_and_order_across_kill_9_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    // A window of 4 minutes: within the line's horizon (5 minutes, section 12.9).
    let limits = json!([{"key": "rp4m", "calls": 1, "perMs": 240_000}]);
    assert_eq!(post(&server.url, "/acquire", json!({"key": "caller", "limits": limits})).await["granted"], true);
    let ask = |ticket: Option<&str>| match ticket {
        Some(t) => json!({"key": "caller", "limits": limits, "ticket": t, "graceMs": 1000}),
        None => json!({"key": "caller", "limits": limits, "queue": true, "graceMs": 1000}),
    };
    let first = post(&server.url, "/acquire", ask(None)).await;
    let second = post(&server.url, "/acquire", ask(None)).await;
    assert_eq!((first["reason"].as_str(), &first["ahead"], &second["ahead"]), (Some("rate"), &json!(0), &json!(1)));
    let (first, second) = (first["ticket"].as_str().unwrap().to_owned(), second["ticket"].as_str().unwrap().to_owned());
    // A renewal answers before any commit holds it: killed right after, it may be lost.
    assert_eq!(post(&server.url, "/acquire", ask(Some(&first))).await["ticket"], json!(first));
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();

    for stop in ["kill -9", "SIGTERM"] {
        let mut server = start(&path);
        for (ticket, ahead) in [(&second, 1), (&first, 0)] {
            let answer = post(&server.url, "/acquire", ask(Some(ticket))).await;
            assert_eq!(
                (&answer["ticket"], &answer["ahead"]),
                (&json!(ticket), &json!(ahead)),
                "after {stop}: {answer}"
            );
            let instant = |field: &str| redb_limiter::time::parse_instant(answer[field].as_str().unwrap()).unwrap();
            assert!(instant("lapseAt") >= instant("now").plus(1000), "after {stop}: {answer}");
        }
        if stop == "kill -9" {
            let status = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
            assert!(status.success());
            assert!(server.child.wait().unwrap().success());
        } else {
            server.child.kill().unwrap();
            server.child.wait().unwrap();
        }
    }
}

#[tokio::test]
async fn a_second_server_on_the_same_file_is_refused_and_sigterm_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut first = start(&path);
    let second = Command::new(env!("CARGO_BIN_EXE_redb-limiter"))
        .args(["serve", "--listen", "127.0.0.1:0", "--path"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("limiter.redb") && err.contains("held open by another process"), "{err}");
    assert!(second.stdout.is_empty(), "no ready line for a refused start");

    assert_eq!(post(&first.url, "/acquire", json!({"key": "c", "limits": []})).await["granted"], true);
    let status = Command::new("kill").args(["-TERM", &first.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = first.child.wait().unwrap();
    assert!(exit.success(), "SIGTERM must drain and exit 0, got {exit:?}");
}

#[test]
fn check_validates_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh.redb");
    let ok = Command::new(env!("CARGO_BIN_EXE_redb-limiter")).args(["check", "--path"]).arg(&fresh).output().unwrap();
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(out.starts_with("ok: ") && out.contains("fresh.redb") && out.contains("0 live buckets"), "{out}");
    let junk = dir.path().join("junk.redb");
    std::fs::write(&junk, b"this is not a database, just some text that is long enough").unwrap();
    let bad = Command::new(env!("CARGO_BIN_EXE_redb-limiter")).args(["check", "--path"]).arg(&junk).output().unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("junk.redb") && err.contains("corrupt"), "{err}");
}

#[tokio::test]
async fn status_reads_a_server_or_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    let body = json!({"key": "caller", "limits": [{"key": "team/rpm", "calls": 5, "perMs": 60_000}, {"key": "team/conc", "concurrent": 2}]});
    assert_eq!(post(&server.url, "/acquire", body).await["granted"], true);
    let until = redb_limiter::time::format_instant(redb_limiter::time::wall_clock_now().plus(90_000));
    post(&server.url, "/throttle", json!({"key": "caller", "until": until})).await;
    let status = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_redb-limiter")).arg("status").args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let table = status(&["--url", &server.url]);
    let whole = |args: &[&str]| {
        let mut v: Value = serde_json::from_str(&status(args)).unwrap();
        v.as_object_mut().unwrap().remove("now");
        v
    };
    let paged = whole(&["--json", "--url", &server.url, "--page-size", "1"]);
    assert_eq!(paged, whole(&["--json", "--url", &server.url]), "paging through /state one by one");
    assert_eq!(paged["buckets"].as_array().unwrap().len(), 2);
    let rpm = table.lines().find(|l| l.starts_with("team/rpm")).unwrap_or_else(|| panic!("{table}"));
    assert!(rpm.contains("1/5") && rpm.contains("60000ms"), "{rpm}");
    let conc = table.lines().find(|l| l.starts_with("team/conc")).unwrap();
    assert!(conc.trim_end().ends_with("1/2"), "{conc}");
    assert!(table.lines().any(|l| l.starts_with("caller") && l.trim_end().ends_with('s')), "{table}");
    assert!(table.contains("2 buckets, 1 permits holding 1 places, 1 throttles"), "{table}");
    // While the server holds the file, reading it directly is refused with a pointer to --url.
    let held = Command::new(env!("CARGO_BIN_EXE_redb-limiter")).args(["status", "--path"]).arg(&path).output().unwrap();
    assert!(!held.status.success());
    assert!(String::from_utf8_lossy(&held.stderr).contains("--url"));
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let json: Value = serde_json::from_str(&status(&["--json", "--path", path.to_str().unwrap()])).unwrap();
    assert_eq!(json["totals"], json!({"buckets": 2, "permits": 1, "throttles": 1}));
    assert_eq!(json["buckets"][1]["key"], "team/rpm");
    assert_eq!(json["buckets"][1]["windowUsed"], 1);
}

/// An empty or whitespace-only token file, or an empty `REDB_LIMITER_TOKEN`, is refused at start
/// (no ready line, the cause named); with no token at all the server says so, once.
#[test]
fn an_empty_token_refuses_to_start_and_no_token_is_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let blank = dir.path().join("token.txt");
    std::fs::write(&blank, " \n\t\n").unwrap();
    let serve = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redb-limiter"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--path"]).arg(&path).env_remove("REDB_LIMITER_TOKEN");
        cmd
    };
    for (what, out) in [
        ("blank token file", serve().arg("--token-file").arg(&blank).output().unwrap()),
        ("empty REDB_LIMITER_TOKEN", serve().env("REDB_LIMITER_TOKEN", "").output().unwrap()),
        ("blank REDB_LIMITER_TOKEN", serve().env("REDB_LIMITER_TOKEN", "  ").output().unwrap()),
    ] {
        assert!(!out.status.success(), "{what}: started");
        assert!(out.stdout.is_empty(), "{what}: printed a ready line");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("empty") && err.contains("refusing to serve"), "{what}: {err}");
        if what == "blank token file" {
            assert!(err.contains("token.txt"), "{err}");
        }
    }
    let mut child = serve().stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.contains("\"ready\":true"), "{line}");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("no token configured").count(), 1, "{err}");
}

/// SIGTERM exits 0 within the drain deadline even while clients hold half-sent requests (they
/// are closed unanswered), answering the request being decided.
#[tokio::test]
async fn sigterm_drains_within_the_deadline_despite_stuck_clients() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    let addr = server.url.trim_start_matches("http://").to_owned();
    let mut stuck = Vec::new();
    for partial in [
        &b"POST /acquire HTTP/1.1\r\nhost: x\r\n"[..],
        &b"POST /acquire HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"key\":"[..],
        &b""[..],
    ] {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        stream.write_all(partial).await.unwrap();
        stuck.push(stream);
    }
    assert_eq!(post(&server.url, "/acquire", json!({"key": "c", "limits": []})).await["granted"], true);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let status = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = tokio::task::spawn_blocking(move || server.child.wait().unwrap()).await.unwrap();
    let took = started.elapsed();
    assert!(exit.success(), "{exit:?}");
    assert!(took < std::time::Duration::from_secs(10), "drain took {took:?}");
    eprintln!("drained with {} stuck clients in {took:?}", stuck.len());
    for mut stream in stuck {
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        assert!(out.is_empty(), "a half-sent request was answered: {}", String::from_utf8_lossy(&out));
    }
}

/// One byte flipped at each of 600 offsets of a cleanly closed file with known state (windows,
/// a held place, a throttle): `status --path` (which opens the file as `serve` does) either
/// refuses it naming the file, or shows exactly the original state; `check` agrees with it.
/// The file's last commit is made redundant (it rewrites the floor only), so that damage to the
/// newest commit, rolled back as a torn tail (the store's fault model), shows no difference.
#[test]
fn flipped_bytes_are_refused_or_change_nothing() {
    use redb_limiter::limiter::Limiter;
    use redb_limiter::request::{AcquireRequest, Limit, ThrottleRequest};
    use redb_limiter::store::{Store, file_opener};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("known.redb");
    {
        let limiter = Limiter::open(&path).unwrap();
        for i in 0..40 {
            let limits = vec![
                Limit::window(format!("team/{}/rpm", i % 7), 1000, 2_678_400_000),
                Limit::window("global/tpm", 1_000_000, 2_678_400_000).with_cost(1 + i),
            ];
            assert!(limiter.acquire_blocking(AcquireRequest::new("caller", limits).unwrap()).unwrap().is_granted());
        }
        let conc = vec![Limit::concurrent("team/conc", 3).with_hold_ms(86_400_000)];
        assert!(limiter.acquire_blocking(AcquireRequest::new("caller", conc).unwrap()).unwrap().is_granted());
        let now = limiter.now();
        limiter.throttle_blocking(ThrottleRequest::new("throttled", now.plus(80_000_000), now).unwrap()).unwrap();
        limiter.close();
        let mut store = Store::open(&path, &file_opener()).unwrap();
        let floor = store.load(&mut redb_limiter::engine::Engine::new(Default::default())).unwrap();
        store.commit(&[], floor).unwrap();
    }
    let status = |file: &Path| {
        Command::new(env!("CARGO_BIN_EXE_redb-limiter"))
            .args(["status", "--json", "--path"])
            .arg(file)
            .output()
            .unwrap()
    };
    let state_of = |out: &std::process::Output| {
        let mut v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_object_mut().unwrap().remove("now");
        v
    };
    let original = std::fs::read(&path).unwrap();
    let copy = dir.path().join("flipped.redb");
    std::fs::write(&copy, &original).unwrap();
    let out = status(&copy);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expected = state_of(&out);
    assert_eq!(expected["totals"], json!({"buckets": 9, "permits": 1, "throttles": 1}));

    // Offsets: 450 among the bytes in use (non-zero), 150 anywhere; a fixed xorshift sequence.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let used: Vec<usize> = (0..original.len()).filter(|&i| original[i] != 0).collect();
    let mut offsets: Vec<usize> = (0..450).map(|_| used[next() as usize % used.len()]).collect();
    offsets.extend((0..150).map(|_| next() as usize % original.len()));
    let (mut refused, mut unchanged, mut differed) = (0, 0, Vec::new());
    for (n, &offset) in offsets.iter().enumerate() {
        let mut bytes = original.clone();
        bytes[offset] ^= (next() % 255 + 1) as u8;
        std::fs::write(&copy, &bytes).unwrap();
        let out = status(&copy);
        let refused_here = !out.status.success();
        if refused_here {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("flipped.redb"), "offset {offset}: refused without naming the file: {err}");
            refused += 1;
        } else if state_of(&out) == expected {
            unchanged += 1;
        } else {
            differed.push(offset);
        }
        if n % 10 == 0 {
            std::fs::write(&copy, &bytes).unwrap();
            let check =
                Command::new(env!("CARGO_BIN_EXE_redb-limiter")).args(["check", "--path"]).arg(&copy).output().unwrap();
            assert_eq!(!check.status.success(), refused_here, "offset {offset}: check and status disagree");
        }
    }
    eprintln!(
        "{} offsets flipped in a {}-byte file: {refused} refused naming the file, {unchanged} served the original state, {} differed",
        offsets.len(),
        original.len(),
        differed.len()
    );
    assert!(differed.is_empty(), "flips at {differed:?} were served as a different state");
}

/// `status --json | head`: the reader closes the pipe early, and the command ends quietly
/// (exit 0, no panic) instead of failing on the write.
#[test]
fn status_into_a_pipe_closed_early_exits_quietly() {
    use redb_limiter::limiter::Limiter;
    use redb_limiter::request::{AcquireRequest, Limit};
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("many.redb");
    {
        let limiter = Limiter::open(&path).unwrap();
        for i in 0..40 {
            let limits = (0..64).map(|j| Limit::window(format!("bucket/{i}/{j}"), 10, 3_600_000)).collect();
            assert!(limiter.acquire_blocking(AcquireRequest::new("caller", limits).unwrap()).unwrap().is_granted());
        }
        limiter.close();
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_redb-limiter"))
        .args(["status", "--json", "--path"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 100];
    child.stdout.take().unwrap().read_exact(&mut head).unwrap();
    // The pipe closes here, with most of the output (hundreds of KiB) not yet written.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(head.starts_with(b"{"), "{}", String::from_utf8_lossy(&head));
}

/// `check` refuses a journal damaged before its newest commit (here a flipped byte in its first
/// record, a crash having left every commit in it), naming the journal.
#[test]
fn check_refuses_a_damaged_journal_naming_it() {
    use redb_limiter::limiter::Limiter;
    use redb_limiter::request::{AcquireRequest, Limit};
    use redb_limiter::store::journal::journal_path;
    let dir = tempfile::tempdir().unwrap();
    let crashed = dir.path().join("crashed");
    std::fs::create_dir(&crashed).unwrap();
    let path = dir.path().join("limiter.redb");
    let copy = crashed.join("limiter.redb");
    {
        let limiter = Limiter::open(&path).unwrap();
        for _ in 0..5 {
            let limits = vec![Limit::window("w", 10, 3_600_000)];
            assert!(limiter.acquire_blocking(AcquireRequest::new("caller", limits).unwrap()).unwrap().is_granted());
        }
        // What a kill -9 leaves: every write made so far, the commits in the journal only.
        std::fs::copy(&path, &copy).unwrap();
        std::fs::copy(journal_path(&path), journal_path(&copy)).unwrap();
    }
    let check =
        || Command::new(env!("CARGO_BIN_EXE_redb-limiter")).args(["check", "--path"]).arg(&copy).output().unwrap();
    let mut journal = std::fs::read(journal_path(&copy)).unwrap();
    let first = (16384..journal.len()).step_by(4096).find(|&p| &journal[p..p + 4] == b"JREC").unwrap();
    journal[first + 100] ^= 0x20;
    std::fs::write(journal_path(&copy), &journal).unwrap();
    let out = check();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a damaged journal passed check");
    assert!(stderr.contains("limiter.redb-journal") && stderr.contains("damaged"), "{stderr}");
    journal[first + 100] ^= 0x20;
    std::fs::write(journal_path(&copy), &journal).unwrap();
    let out = check();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Section 16 across a crash: an acquire named by an id, retried after a `kill -9` and restart,
/// gets its first answer (same instant, same permit) and counts nothing again; `release {id}`
/// then undoes it, and the released id stays released across the next `kill -9`.
#[tokio::test]
async fn kill_9_keeps_request_ids_so_a_retry_never_counts_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    let ask = json!({"key": "caller", "id": "ask-1", "limits": [
        {"key": "rpm", "calls": 2, "perMs": 3_600_000}, {"key": "conc", "concurrent": 1}]});
    let first = post(&server.url, "/acquire", ask.clone()).await;
    assert_eq!(first["granted"], true, "{first}");
    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();

    let mut server = start(&path);
    let again = post(&server.url, "/acquire", ask.clone()).await;
    assert_eq!(again, first, "the retry gets its first answer");
    let mut report = ask.clone();
    report["report"] = json!(true);
    let figures = post(&server.url, "/acquire", report).await;
    assert_eq!(figures["limits"][0]["used"], 1, "counted once: {figures}");
    assert_eq!(figures["limits"][1]["held"], 1, "one place: {figures}");
    let undo = json!({"id": "ask-1", "costs": [{"key": "rpm", "cost": 0}]});
    assert_eq!(post(&server.url, "/release", undo).await, json!({"released": true}));
    server.child.kill().unwrap();
    server.child.wait().unwrap();

    let mut server = start(&path);
    let late = reqwest::Client::new().post(format!("{}/acquire", server.url)).json(&ask).send().await.unwrap();
    assert_eq!(late.status(), 400, "a released id stays released");
    let peek = post(
        &server.url,
        "/peek",
        json!({"key": "caller", "limits": [
        {"key": "rpm", "calls": 2, "perMs": 3_600_000}, {"key": "conc", "concurrent": 1}]}),
    )
    .await;
    assert_eq!((peek["limits"][0]["used"].clone(), peek["limits"][1]["held"].clone()), (json!(0), json!(0)), "{peek}");
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// Section 15 at SIGTERM: a `/wait` pending on a ticket that cannot be ready for a minute is
/// answered at once (200, empty lists), and the server still drains and exits 0.
#[tokio::test]
async fn sigterm_answers_every_pending_wait_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiter.redb");
    let mut server = start(&path);
    let window = json!({"key": "caller", "limits": [{"key": "rpm", "calls": 1, "perMs": 60_000}]});
    assert_eq!(post(&server.url, "/acquire", window.clone()).await["granted"], true);
    let mut queued = window.clone();
    queued["queue"] = json!(true);
    let ticket = post(&server.url, "/acquire", queued).await["ticket"].as_str().unwrap().to_owned();
    let url = server.url.clone();
    let wait = tokio::spawn(async move {
        let body = json!({"tickets": [ticket], "timeoutMs": 60_000});
        let resp = reqwest::Client::new().post(format!("{url}/wait")).json(&body).send().await.unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!wait.is_finished(), "the wait answered before SIGTERM");
    let started = std::time::Instant::now();
    let status = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let (code, answer) = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await.unwrap().unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!((code, answer["ready"].clone(), answer["gone"].clone()), (200, json!([]), json!([])), "{answer}");
    let exit = tokio::task::spawn_blocking(move || server.child.wait().unwrap()).await.unwrap();
    assert!(exit.success(), "{exit:?}");
}
