//! What the tests of the Rust client against the real server share: a server process of the
//! test's own, on a temporary file and a free port, killed (by its handle) when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct Server {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `redb-limiter serve` with `args` besides its file and port (the environment's
/// `REDB_LIMITER_*` settings removed), and reads its ready line.
pub fn start_server(args: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_redb-limiter"));
    command.arg("serve").arg("--path").arg(dir.path().join("limiter.redb")).args(["--listen", "127.0.0.1:0"]);
    command.args(args);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("REDB_LIMITER_") {
            command.env_remove(name);
        }
    }
    let mut child = command.env("RUST_LOG", "error").stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut ready = String::new();
    stdout.read_line(&mut ready).unwrap();
    // Keep reading, so the server never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let ready: serde_json::Value =
        serde_json::from_str(&ready).unwrap_or_else(|e| panic!("no ready line from the server ({e}): {ready:?}"));
    assert_eq!(ready["ready"], true, "{ready}");
    Server { child, url: ready["url"].as_str().unwrap().to_owned(), _dir: dir }
}
