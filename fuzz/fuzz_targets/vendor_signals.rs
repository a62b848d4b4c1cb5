//! A provider's response, as arbitrary bytes, into `vendor_wait` and `vendor_budget`, and every
//! header value into the duration parsers: never a panic, and every result within its clamp.
//!
//! The input reads like a response: header lines `name: value`, an empty line, then the body
//! (so the seed corpus is real vendor responses, written by hand).

#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use redb_limiter::Millis;
use redb_limiter_client::vendor::{
    MAX_WAIT_MS, MIN_WAIT_MS, parse_go_duration, parse_proto_duration, parse_retry_after, parse_seconds, vendor_budget,
    vendor_wait,
};

/// The longest Go duration: `i64::MAX` nanoseconds, in milliseconds rounded up.
const MAX_GO_MS: u64 = (i64::MAX as u64).div_ceil(1_000_000);
/// The longest protobuf duration: 315,576,000,000 s and 999,999,999 ns, rounded up.
const MAX_PROTO_MS: u64 = 315_576_000_000_000 + 1_000;
/// A plausible now (2026-01-01T00:00:00Z), the epoch, and the end of time.
const NOWS: [Millis; 3] = [Millis(1_767_225_600_000), Millis::ZERO, Millis(u64::MAX)];
const DEFAULTS: [u64; 3] = [0, 5_000, u64::MAX];

fn check_parsers(text: &str, now: Millis) {
    if let Some(ms) = parse_go_duration(text) {
        assert!(ms <= MAX_GO_MS, "{text:?} gave {ms}");
    }
    if let Some(ms) = parse_proto_duration(text) {
        assert!(ms <= MAX_PROTO_MS, "{text:?} gave {ms}");
    }
    let _ = parse_retry_after(text, now);
    // Plain seconds (a budget reset in either header family): digits, at most one dot with
    // digits on both sides, nothing else; whole milliseconds rounded up.
    if let Some(ms) = parse_seconds(text) {
        let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
        assert!(!whole.is_empty() && whole.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        assert!(frac.len() <= 9 && frac.bytes().all(|b| b.is_ascii_digit()), "{text:?}");
        assert!(text.contains('.') == !frac.is_empty(), "{text:?}");
        if let Ok(seconds) = whole.parse::<u64>() {
            assert!(
                ms >= seconds.saturating_mul(1000) && ms <= seconds.saturating_mul(1000).saturating_add(1000),
                "{text:?} gave {ms}"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (head, body) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let mut headers = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }
    for now in NOWS {
        for value in headers.values() {
            if let Ok(text) = std::str::from_utf8(value.as_bytes()) {
                check_parsers(text, now);
            }
        }
        for default_ms in DEFAULTS {
            let wait = vendor_wait(&headers, body, now, default_ms);
            assert!((MIN_WAIT_MS..=MAX_WAIT_MS).contains(&wait), "wait {wait}");
        }
        if let Some(reset) = vendor_budget(&headers, now) {
            assert!(reset > now && reset <= now.plus(MAX_WAIT_MS), "reset {reset:?} at {now:?}");
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        check_parsers(text, NOWS[0]);
    }
});
