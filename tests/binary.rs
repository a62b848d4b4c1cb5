//! The real binary: restart after `kill -9` keeps every window, place and throttle with its
//! original instants; a second server on the same file is refused; SIGTERM drains and exits 0;
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
