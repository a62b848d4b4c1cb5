//! `redb-limiter status --watch` through the real binary in a pseudo-terminal (`script`, from
//! util-linux), against a real server: it draws the live view on its own screen, redraws it, and
//! q or Ctrl-C (read as keys, the terminal being in non-canonical mode) ends it with exit 0 and
//! the terminal given back.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redb_limiter::limiter::LimiterOptions;
use redb_limiter::time::FakeClock;
use redb_limiter::{Limiter, Millis};
use redb_limiter_server::server::{ServerConfig, serve};
use serde_json::json;

async fn server() -> (String, tempfile::TempDir, tokio::sync::oneshot::Sender<()>) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(FakeClock::new(Millis(1_800_000_000_000)));
    let options = LimiterOptions { clock: Some(clock), id_seed: Some(3), ..LimiterOptions::default() };
    let limiter = Arc::new(Limiter::open_with(dir.path().join("limiter.redb"), options).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(listener, limiter, ServerConfig::default(), async move {
        let _ = stopped.await;
    }));
    let http = reqwest::Client::new();
    for body in [
        json!({"key": "agent-1", "limits": [{"key": "api/requests", "calls": 5, "perMs": 60000}]}),
        json!({"key": "agent-1", "limits": [{"key": "api/requests", "calls": 1, "perMs": 60000}]}),
    ] {
        http.post(format!("{url}/acquire")).body(body.to_string()).send().await.unwrap();
    }
    (url, dir, stop)
}

/// Runs `status --watch` in a pseudo-terminal until its second frame, sends `key`, and returns
/// its exit status and everything it drew.
fn watch_until(url: &str, key: &[u8]) -> (std::process::ExitStatus, String) {
    let bin = env!("CARGO_BIN_EXE_redb-limiter");
    let mut child = Command::new("script")
        .args(["-qec", &format!("{bin} status --watch --url {url}"), "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("script (util-linux) runs");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn({
        let seen = seen.clone();
        move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        }
    });
    let frames = || String::from_utf8_lossy(&seen.lock().unwrap()).matches("\x1b[H\x1b[2J").count();
    let deadline = Instant::now() + Duration::from_secs(30);
    while frames() < 2 {
        assert!(Instant::now() < deadline, "no second frame: {}", String::from_utf8_lossy(&seen.lock().unwrap()));
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(key).unwrap();
    stdin.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("status --watch did not quit on {key:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    reader.join().unwrap();
    let out = String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    (status, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_redraws_in_place_and_quits_on_q_or_ctrl_c() {
    let (url, _dir, _stop) = server().await;
    for key in [&b"q"[..], &b"\x03"[..]] {
        let (status, out) = tokio::task::spawn_blocking({
            let url = url.clone();
            move || watch_until(&url, key)
        })
        .await
        .unwrap();
        assert!(status.success(), "{status}: {out}");
        // Its own screen, cursor hidden, then both given back.
        assert!(out.starts_with("\x1b[?1049h\x1b[?25l"), "{out:?}");
        assert!(out.trim_end().ends_with("\x1b[?25h\x1b[?1049l"), "{out:?}");
        let last = out.rsplit("\x1b[H\x1b[2J").next().unwrap();
        assert!(last.contains("redb-limiter  2027-01-15T08:00:00.000Z  1 buckets"), "{last}");
        assert!(last.contains("api/requests  [##........] 1/5"), "{last}");
        assert!(last.contains("LAST MINUTE  1 granted · refused 1 rate, 0 concurrency, 0 throttle"), "{last}");
        assert!(last.contains("0ms ago  agent-1  api/requests  rate  told to wait 1m 00s"), "{last}");
    }
}
