//! The crash test: a real child process grants under load and prints each grant only after it
//! was answered; we SIGKILL it at random moments over many rounds, reopen the file, and check
//! that every answered grant still counts and that no window ever held more than its calls.
//! The same test run against a deliberately broken mode (answer before commit) must fail.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use redb_limiter::engine::{Engine, EngineConfig};
use redb_limiter::store::{Store, file_opener};
use redb_limiter::time::wall_clock_now;
use redb_limiter_server::cli::grind::{BOUNDED_CALLS, BOUNDED_KEY};

/// What went wrong across the rounds, if anything.
#[derive(Debug, Default)]
struct Verdict {
    lost_grants: Vec<String>,
    over_calls: Option<u64>,
    answered: usize,
}

fn run_rounds(path: &Path, rounds: u32, broken: bool, seed: u64) -> Verdict {
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut verdict = Verdict::default();
    // Every grant ever answered: (bucket, at) → count.
    let mut answered: BTreeMap<(String, u64), u64> = BTreeMap::new();
    for _ in 0..rounds {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redb-limiter"));
        cmd.args(["grind", "--path"]).arg(path).args(["--tasks", "32"]);
        if broken {
            cmd.arg("--ack-before-commit");
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut ready = String::new();
        out.read_line(&mut ready).unwrap();
        assert_eq!(ready.trim(), "ready", "the child did not start");
        // Drain the pipe while the child runs: a full pipe would stall it, and a stalled child
        // has nothing uncommitted to lose when it is killed.
        let reader = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
            rest
        });
        std::thread::sleep(Duration::from_millis(20 + next() % 200));
        child.kill().unwrap();
        child.wait().unwrap();
        let mut rest = reader.join().unwrap();
        // A line cut by the kill has no newline: it was never fully printed, so it does not count.
        rest.truncate(rest.rfind('\n').map_or(0, |i| i + 1));
        for line in rest.lines() {
            let mut parts = line.split(' ');
            if let (Some("G"), Some(bucket), Some(at), None) = (parts.next(), parts.next(), parts.next(), parts.next())
                && let Ok(at) = at.parse::<u64>()
            {
                *answered.entry((bucket.to_owned(), at)).or_default() += 1;
                verdict.answered += 1;
            }
        }
        // Reopen and compare.
        let store = Store::open(path, &file_opener()).unwrap();
        let mut engine = Engine::new(EngineConfig::default());
        store.load(&mut engine).unwrap();
        drop(store);
        let facts = engine.facts(wall_clock_now());
        let held: BTreeMap<(String, u64), u64> = facts
            .buckets
            .iter()
            .flat_map(|(bucket, (grants, _))| grants.iter().map(move |(at, cost)| ((bucket.clone(), at.0), *cost)))
            .collect();
        for ((bucket, at), count) in &answered {
            if held.get(&(bucket.clone(), *at)).copied().unwrap_or(0) < *count {
                verdict.lost_grants.push(format!(
                    "{bucket} at {at}: answered {count}, file holds {:?}",
                    held.get(&(bucket.clone(), *at))
                ));
            }
        }
        let bounded: u64 = answered.iter().filter(|((b, _), _)| b == BOUNDED_KEY).map(|(_, c)| c).sum();
        let in_file: u64 = held.iter().filter(|((b, _), _)| b == BOUNDED_KEY).map(|(_, c)| c).sum();
        if bounded.max(in_file) > BOUNDED_CALLS {
            verdict.over_calls = Some(bounded.max(in_file));
        }
        if !verdict.lost_grants.is_empty() || verdict.over_calls.is_some() {
            break;
        }
    }
    verdict
}

#[test]
fn answered_grants_survive_sigkill_and_windows_never_overrun() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crash.redb");
    let verdict = run_rounds(&path, 25, false, 0x9e37_79b9_7f4a_7c15);
    assert!(
        verdict.lost_grants.is_empty(),
        "lost grants: {:?}",
        &verdict.lost_grants[..verdict.lost_grants.len().min(5)]
    );
    assert_eq!(verdict.over_calls, None);
    assert!(
        verdict.answered > 500,
        "only {} grants were answered: the load was too light to mean much",
        verdict.answered
    );
}

#[test]
fn the_crash_test_catches_an_answer_before_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.redb");
    let verdict = run_rounds(&path, 40, true, 0x2545_f491_4f6c_dd1d);
    assert!(
        !verdict.lost_grants.is_empty() || verdict.over_calls.is_some(),
        "answering before the commit went unnoticed over 40 kills ({} grants answered)",
        verdict.answered
    );
}
