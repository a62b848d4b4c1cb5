//! The shared provider-signal vectors (`tests/vectors/vendor-signals.json` at the repository
//! root) against `vendor_wait` and `vendor_budget`, and its usage cases against `Estimate::usage`,
//! `Estimate::request_usage` and `Usage::costs`.
//!
//! The JavaScript and Python clients read the same file, so the three implementations of the
//! rules cannot drift apart. Every case is checked and every failure is reported by name; the
//! file's form is checked too, so a case the other clients could not read fails here first.

use std::collections::HashSet;

use http::{HeaderMap, HeaderName, HeaderValue};
use redb_limiter::Millis;
use redb_limiter::time::{format_instant, parse_instant};
use redb_limiter_client::estimate::{Buckets, Estimate, EstimateError, Provider, Usage};
use redb_limiter_client::vendor::{vendor_budget, vendor_wait};
use serde_json::{Map, Value};

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/vendor-signals.json");

fn vectors() -> Map<String, Value> {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| panic!("reading {VECTORS}: {e}"));
    match serde_json::from_str(&text) {
        Ok(Value::Object(map)) => map,
        Ok(_) => panic!("{VECTORS} must hold a JSON object"),
        Err(e) => panic!("{VECTORS} is not JSON: {e}"),
    }
}

/// The cases of one section, each an object with exactly `fields`, and every name unique.
fn cases<'a>(all: &'a Map<String, Value>, section: &str, fields: &[&str]) -> Vec<(&'a str, &'a Map<String, Value>)> {
    let list = all.get(section).and_then(Value::as_array).unwrap_or_else(|| panic!("\"{section}\" must be an array"));
    assert!(!list.is_empty(), "\"{section}\" has no cases");
    let mut names = HashSet::new();
    list.iter()
        .enumerate()
        .map(|(i, case)| {
            let case = case.as_object().unwrap_or_else(|| panic!("{section}[{i}] must be an object"));
            let name = case.get("name").and_then(Value::as_str).unwrap_or_else(|| panic!("{section}[{i}].name"));
            assert!(names.insert(name), "{section}: the name {name:?} is used twice");
            let mut keys: Vec<&str> = case.keys().map(String::as_str).collect();
            keys.sort_unstable();
            let mut wanted = fields.to_vec();
            wanted.sort_unstable();
            assert_eq!(keys, wanted, "{section} {name:?}: the fields");
            (name, case)
        })
        .collect()
}

/// The case's headers; names are unique ignoring case, values printable ASCII (what every
/// client's header type accepts).
fn headers(case: &Map<String, Value>, name: &str) -> HeaderMap {
    let given = case.get("headers").and_then(Value::as_object).unwrap_or_else(|| panic!("{name:?}: headers"));
    let mut map = HeaderMap::new();
    for (key, value) in given {
        let value = value.as_str().unwrap_or_else(|| panic!("{name:?}: header {key} must be a string"));
        assert!(
            value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)),
            "{name:?}: header {key} must be printable ASCII"
        );
        let key_name = HeaderName::from_bytes(key.as_bytes()).unwrap_or_else(|e| panic!("{name:?}: header {key}: {e}"));
        let value = HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{name:?}: header {key}: {e}"));
        assert!(map.insert(key_name, value).is_none(), "{name:?}: header {key} is given twice (names ignore case)");
    }
    map
}

/// An instant that must be written exactly as JavaScript's `toISOString` writes it.
fn instant(value: &Value, name: &str, field: &str) -> Millis {
    let text = value.as_str().unwrap_or_else(|| panic!("{name:?}: {field} must be a string"));
    let at = parse_instant(text).unwrap_or_else(|e| panic!("{name:?}: {field} {e}"));
    assert_eq!(format_instant(at), text, "{name:?}: {field} must be in toISOString form");
    at
}

fn integer(case: &Map<String, Value>, name: &str, field: &str) -> u64 {
    case.get(field).and_then(Value::as_u64).unwrap_or_else(|| panic!("{name:?}: {field} must be a whole number"))
}

fn report(section: &str, total: usize, failures: &[String]) {
    assert!(failures.is_empty(), "{} of {total} {section} cases failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_wait_case_matches_vendor_wait() {
    let all = vectors();
    let cases = cases(&all, "wait", &["name", "headers", "body", "now", "defaultMs", "expectMs"]);
    let mut failures = Vec::new();
    for (name, case) in &cases {
        let map = headers(case, name);
        let body = match &case["body"] {
            Value::Null => "",
            Value::String(body) => body.as_str(),
            _ => panic!("{name:?}: body must be a string or null"),
        };
        let now = instant(&case["now"], name, "now");
        let default_ms = integer(case, name, "defaultMs");
        let expect = integer(case, name, "expectMs");
        let got = vendor_wait(&map, body.as_bytes(), now, default_ms);
        if got != expect {
            failures.push(format!("  {name:?}: expected {expect} ms, vendor_wait gave {got} ms"));
        }
    }
    report("wait", cases.len(), &failures);
}

#[test]
fn every_budget_case_matches_vendor_budget() {
    let all = vectors();
    let cases = cases(&all, "budget", &["name", "headers", "now", "expect"]);
    let mut failures = Vec::new();
    for (name, case) in &cases {
        let map = headers(case, name);
        let now = instant(&case["now"], name, "now");
        let expect = match &case["expect"] {
            Value::Null => None,
            value => Some(instant(value, name, "expect")),
        };
        let got = vendor_budget(&map, now);
        if got != expect {
            let show = |at: Option<Millis>| at.map_or_else(|| "null".to_owned(), format_instant);
            failures.push(format!("  {name:?}: expected {}, vendor_budget gave {}", show(expect), show(got)));
        }
    }
    report("budget", cases.len(), &failures);
}

/// The buckets a usage case declares: `input`, `output` and `tokens`, each a key, none required.
fn buckets(case: &Map<String, Value>, name: &str) -> Buckets {
    let given = case.get("buckets").and_then(Value::as_object).unwrap_or_else(|| panic!("{name:?}: buckets"));
    let mut buckets = Buckets::new();
    for (kind, key) in given {
        let key = key.as_str().unwrap_or_else(|| panic!("{name:?}: buckets.{kind} must be a string")).to_owned();
        match kind.as_str() {
            "input" => buckets.input = Some(key),
            "output" => buckets.output = Some(key),
            "tokens" => buckets.tokens = Some(key),
            other => panic!("{name:?}: buckets.{other} is no kind of bucket"),
        }
    }
    buckets
}

/// A case's expected usage, `{input, output, cacheRead, cacheWrite}`, or null for an error.
fn expected_usage(case: &Map<String, Value>, name: &str) -> Option<Usage> {
    let usage = match &case["usage"] {
        Value::Null => return None,
        Value::Object(usage) => usage,
        _ => panic!("{name:?}: usage must be an object or null"),
    };
    let mut keys: Vec<&str> = usage.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["cacheRead", "cacheWrite", "input", "output"], "{name:?}: the usage's fields");
    Some(Usage {
        input: integer(usage, name, "input"),
        output: integer(usage, name, "output"),
        cache_read: integer(usage, name, "cacheRead"),
        cache_write: integer(usage, name, "cacheWrite"),
    })
}

/// Checks one usage or estimate case: `read` gives the usage of its body, then the costs of its
/// buckets follow; the error (exactly one of `usage` and `error` is given) is the first met.
fn check_usage_case(
    name: &str,
    case: &Map<String, Value>,
    read: impl Fn(&Estimate, &[u8]) -> Result<Usage, EstimateError>,
    body: &str,
) -> Option<String> {
    let want_usage = expected_usage(case, name);
    let want_error = case["error"].as_str();
    assert!(want_usage.is_some() != want_error.is_some(), "{name:?}: exactly one of usage and error");
    let costs = |usage: Usage, provider: Provider| usage.costs(provider, &buckets(case, name));
    let got = case["provider"].as_str().unwrap_or_else(|| panic!("{name:?}: provider")).parse::<Provider>().and_then(
        |provider| {
            let usage = read(&Estimate::new(provider), body.as_bytes())?;
            Ok((usage, costs(usage, provider)?))
        },
    );
    match (got, want_usage) {
        (Ok((usage, got_costs)), Some(want)) => {
            let want_costs: Vec<(String, u64)> = case["costs"]
                .as_object()
                .unwrap_or_else(|| panic!("{name:?}: costs must be an object"))
                .iter()
                .map(|(key, cost)| (key.clone(), cost.as_u64().unwrap_or_else(|| panic!("{name:?}: costs[{key}]"))))
                .collect();
            let mut sorted = got_costs.clone();
            sorted.sort();
            let mut want_sorted = want_costs.clone();
            want_sorted.sort();
            (usage != want || sorted != want_sorted)
                .then(|| format!("  {name:?}: expected {want:?} {want_costs:?}, got {usage:?} {got_costs:?}"))
        }
        (Err(e), None) if Some(e.0.as_str()) == want_error => None,
        (got, _) => Some(format!("  {name:?}: expected {:?}, got {got:?}", want_error.unwrap_or("a usage"))),
    }
}

#[test]
fn every_usage_case_matches_estimate_usage() {
    let all = vectors();
    let cases = cases(&all, "usage", &["name", "provider", "body", "buckets", "usage", "costs", "error"]);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(name, case)| {
            let body = case["body"].as_str().unwrap_or_else(|| panic!("{name:?}: body must be a string"));
            check_usage_case(name, case, Estimate::usage, body)
        })
        .collect();
    report("usage", cases.len(), &failures);
}

#[test]
fn every_estimate_case_matches_request_usage() {
    let all = vectors();
    let cases = cases(&all, "estimate", &["name", "provider", "request", "buckets", "usage", "costs", "error"]);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(name, case)| {
            let body = case["request"].as_str().unwrap_or_else(|| panic!("{name:?}: request must be a string"));
            check_usage_case(name, case, Estimate::request_usage, body)
        })
        .collect();
    report("estimate", cases.len(), &failures);
}
