//! Vendor signals: turning a provider's HTTP response into the wait it asked for.
//!
//! This module owns reading the rate-limit hints that model providers put on their responses:
//! the wait a 429 asks for ([`vendor_wait`]: `retry-after-ms`, `Retry-After`, Google's
//! `google.rpc.RetryInfo`) and the instant an exhausted budget resets, reported on a success
//! ([`vendor_budget`]: Anthropic's `anthropic-ratelimit-*` and OpenAI's `x-ratelimit-*`
//! headers). It is pure: no network and no clock reads; `now` is always a parameter.
//!
//! It must never panic, never allocate without bound and never trust a vendor with an unbounded
//! wait: every input (header values, bodies) is hostile until parsed, the parsers are strict and
//! use checked arithmetic, and every wait is clamped to [`MIN_WAIT_MS`]`..=`[`MAX_WAIT_MS`].
//! A value that does not parse is not a signal; it is ignored, never guessed at.
//!
//! The rules are pinned by shared test vectors, `tests/vectors/vendor-signals.json` at the
//! repository root: each case gives headers, a body, `now` and the answer, and the Rust,
//! JavaScript and Python clients' tests all check every case, so the clients cannot disagree.
//! A change of rule here changes that file, and the other clients with it.

use http::HeaderMap;

use redb_limiter::request::Signal;
use redb_limiter::time::{Millis, parse_instant};

/// The shortest wait a 429 yields, whatever the vendor says.
pub const MIN_WAIT_MS: u64 = 1_000;
/// The longest wait a vendor can impose, through a 429 or an exhausted budget.
pub const MAX_WAIT_MS: u64 = 120_000;

/// Bodies longer than this are not inspected for `RetryInfo` (a Google error is a few hundred
/// bytes); this bounds what parsing a hostile body can allocate.
const MAX_BODY_BYTES: usize = 64 * 1024;

const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The `(remaining, reset)` header pairs whose reset is an RFC 3339 instant (Anthropic).
const INSTANT_BUDGETS: [(&str, &str); 4] = [
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
];

/// The `(remaining, reset)` header pairs whose reset is a Go duration from now (OpenAI).
const DURATION_BUDGETS: [(&str, &str); 2] = [
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
];

/// The wait a 429 asked for, in milliseconds, clamped to `MIN_WAIT_MS..=MAX_WAIT_MS`.
///
/// Looks, in order, at `retry-after-ms` (integer or decimal milliseconds), `Retry-After`
/// (delay-seconds or an HTTP-date, relative to `now`) and a `google.rpc.RetryInfo` detail in a
/// JSON error body (also inside a JSON array). The first source that parses wins; a source that
/// is present but does not parse is skipped. With no signal the answer is `default_ms`, clamped
/// like any other.
#[must_use]
pub fn vendor_wait(headers: &HeaderMap, body: &[u8], now: Millis, default_ms: u64) -> u64 {
    let asked = header(headers, "retry-after-ms")
        .and_then(parse_decimal_ms)
        .or_else(|| header(headers, "retry-after").and_then(|v| parse_retry_after(v, now)))
        .or_else(|| retry_info_ms(body))
        .unwrap_or(default_ms);
    asked.clamp(MIN_WAIT_MS, MAX_WAIT_MS)
}

/// When a success reports an exhausted budget, the instant it resets (at most `now + 120 s`);
/// `None` if no budget is exhausted.
///
/// A budget is exhausted when its `remaining` header is exactly `0`. Of the exhausted budgets
/// with a reset after `now`, the one resetting last binds. A pair whose remaining or reset does
/// not parse, or whose reset is not after `now`, is ignored.
#[must_use]
pub fn vendor_budget(headers: &HeaderMap, now: Millis) -> Option<Millis> {
    let exhausted = |remaining: &str| header(headers, remaining).and_then(parse_count) == Some(0);
    // Either family may give its reset as plain seconds from now (`30`, `0.5`).
    let seconds = |value: &str| parse_seconds(value).map(|ms| now.plus(ms));
    let anthropic = INSTANT_BUDGETS.iter().filter(|(remaining, _)| exhausted(remaining)).filter_map(|(_, reset)| {
        let value = header(headers, reset)?;
        parse_instant(value).ok().or_else(|| seconds(value))
    });
    let openai = DURATION_BUDGETS.iter().filter(|(remaining, _)| exhausted(remaining)).filter_map(|(_, reset)| {
        let value = header(headers, reset)?;
        parse_go_duration(value).map(|ms| now.plus(ms)).or_else(|| seconds(value))
    });
    anthropic.chain(openai).filter(|&reset| reset > now).max().map(|reset| reset.min(now.plus(MAX_WAIT_MS)))
}

/// Parses a `Retry-After` value into milliseconds from `now`.
///
/// Accepts delay-seconds (`1*DIGIT`, no sign, no fraction) or an HTTP-date in any of the three
/// forms of RFC 9110 (IMF-fixdate, RFC 850, asctime). A date at or before `now` gives `0`.
/// Surrounding whitespace is refused (header readers trim it first).
#[must_use]
pub fn parse_retry_after(value: &str, now: Millis) -> Option<u64> {
    // httpdate would forgive surrounding whitespace; a strict parser does not.
    if value.trim() != value {
        return None;
    }
    if value.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        let (seconds, rest) = digits(value.as_bytes())?;
        if !rest.is_empty() {
            return None;
        }
        return seconds.checked_mul(1_000);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    Some(Millis(u64::try_from(ms).ok()?).since(now))
}

/// Parses a Go `time.Duration` string (OpenAI's reset headers) into milliseconds, rounded up.
///
/// Grammar: one or more `digits[.digits]unit` components, units `h`, `m`, `s`, `ms`, `us`, `µs`
/// (or `μs`), `ns`; or a bare `0`. As in Go, a component may have no digits on one side of the
/// dot (`1.s`, `.5s`) but not on both, the duration is computed in whole nanoseconds (a
/// sub-nanosecond fraction is dropped) and it must fit Go's `i64` nanoseconds. Stricter than
/// Go: no sign, and each unit at most once, largest first (`1s1m` and `1s1s` are refused).
#[must_use]
pub fn parse_go_duration(s: &str) -> Option<u64> {
    // Units largest first, in nanoseconds; a component's unit must come after the previous one.
    const UNITS: [(&str, u64); 8] = [
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("\u{b5}s", 1_000),
        ("\u{3bc}s", 1_000),
        ("ns", 1),
    ];
    if s == "0" {
        return Some(0);
    }
    let mut rest = s.as_bytes();
    if rest.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let (whole, frac, after) = number(rest, Dot::Go, usize::MAX)?;
        // The unit is the longest run of non-number characters; it must be a known unit.
        let unit_len = after.iter().position(|&b| b.is_ascii_digit() || b == b'.').unwrap_or(after.len());
        let (unit, tail) = after.split_at(unit_len);
        let index = UNITS.iter().position(|(name, _)| name.as_bytes() == unit)?;
        if index < next_unit {
            return None;
        }
        // µs and μs share a rank with us: after any of them, only ns may follow.
        next_unit = if (4..=6).contains(&index) { 7 } else { index + 1 };
        let unit_ns = UNITS[index].1;
        let part = whole.checked_mul(unit_ns)?.checked_add(frac.scaled(unit_ns)?)?;
        total = total.checked_add(part)?;
        rest = tail;
    }
    if total > i64::MAX as u64 {
        return None;
    }
    Some(total.div_ceil(1_000_000))
}

/// Parses the JSON form of a `google.protobuf.Duration` (`"38s"`, `"1.5s"`) into milliseconds,
/// rounded up.
///
/// Grammar: `digits[.digits]s` with 1 to 9 fractional digits, as protobuf's JSON mapping allows.
/// Refused: a sign, an empty side of the dot (`.5s`, `1.s`), any other unit, and seconds beyond
/// protobuf's range (315,576,000,000 s, about 10,000 years).
#[must_use]
pub fn parse_proto_duration(s: &str) -> Option<u64> {
    const MAX_SECONDS: u64 = 315_576_000_000;
    let body = s.as_bytes().strip_suffix(b"s")?;
    let (seconds, frac, rest) = number(body, Dot::Strict, 9)?;
    if !rest.is_empty() || seconds > MAX_SECONDS {
        return None;
    }
    // Whole seconds are whole milliseconds, so only the fraction needs rounding up.
    seconds.checked_mul(1_000)?.checked_add(frac.scaled(1_000_000_000)?.div_ceil(1_000_000))
}

/// Plain decimal seconds (`30`, `0.5`: `digits[.digits]`, no sign, no unit) into milliseconds,
/// rounded up; at most 9 fractional digits.
#[must_use]
pub fn parse_seconds(s: &str) -> Option<u64> {
    let (seconds, frac, rest) = number(s.as_bytes(), Dot::Strict, 9)?;
    if !rest.is_empty() {
        return None;
    }
    seconds.checked_mul(1_000)?.checked_add(frac.scaled(1_000_000_000)?.div_ceil(1_000_000))
}

/// The value of header `name` as text, without surrounding optional whitespace; `None` when it
/// is absent, not UTF-8 or empty.
/// The providers' headers of remaining requests (Anthropic's, OpenAI's), as VernLLM reads its hint.
const REMAINING_REQUESTS: [&str; 2] = ["anthropic-ratelimit-requests-remaining", "x-ratelimit-remaining-requests"];

/// What a provider's answer says of the call for an adaptive ceiling (wire section 14):
/// [`Signal::Limited`] on a 429, or on a success whose remaining requests are at or below
/// `floor` (VernLLM's `proactiveFloor`; without one only a 429 counts); [`Signal::Clean`] on any
/// other success; `None` on any other failure, which says nothing of the limit.
#[must_use]
pub fn vendor_outcome(status: u16, headers: &HeaderMap, floor: Option<u64>) -> Option<Signal> {
    if status == 429 {
        return Some(Signal::Limited);
    }
    if !(200..300).contains(&status) {
        return None;
    }
    let low = |name: &&str| header(headers, name).and_then(parse_count).zip(floor).is_some_and(|(n, f)| n <= f);
    Some(if REMAINING_REQUESTS.iter().any(low) { Signal::Limited } else { Signal::Clean })
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(headers.get(name)?.as_bytes()).ok()?;
    let text = text.trim_matches([' ', '\t']);
    (!text.is_empty()).then_some(text)
}

/// A budget's remaining count: an unsigned decimal integer.
fn parse_count(s: &str) -> Option<u64> {
    match digits(s.as_bytes())? {
        (n, []) => Some(n),
        _ => None,
    }
}

/// `retry-after-ms`: `digits[.digits]` milliseconds, rounded up to a whole millisecond.
fn parse_decimal_ms(s: &str) -> Option<u64> {
    let (whole, frac, rest) = number(s.as_bytes(), Dot::Strict, usize::MAX)?;
    if !rest.is_empty() {
        return None;
    }
    whole.checked_add(u64::from(frac.is_nonzero()))
}

/// The retry delay of the first `google.rpc.RetryInfo` detail in a Google JSON error body, which
/// is `{"error": {...}}` or an array of such objects.
fn retry_info_ms(body: &[u8]) -> Option<u64> {
    if body.len() > MAX_BODY_BYTES {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let errors = match &value {
        serde_json::Value::Array(items) => items.as_slice(),
        other => std::slice::from_ref(other),
    };
    errors
        .iter()
        .filter_map(|item| item.get("error")?.get("details")?.as_array())
        .flatten()
        .filter(|detail| detail.get("@type").and_then(|t| t.as_str()) == Some(RETRY_INFO_TYPE))
        .find_map(|detail| parse_proto_duration(detail.get("retryDelay")?.as_str()?))
}

/// A leading run of ASCII digits as a `u64` and what follows it; `None` when there are no
/// digits or the number overflows.
fn digits(s: &[u8]) -> Option<(u64, &[u8])> {
    let len = s.iter().take_while(|b| b.is_ascii_digit()).count();
    if len == 0 {
        return None;
    }
    let (run, rest) = s.split_at(len);
    let n = run.iter().try_fold(0u64, |acc, &b| acc.checked_mul(10)?.checked_add(u64::from(b - b'0')))?;
    Some((n, rest))
}

/// The fractional digits of a decimal number, as written after the dot (possibly none).
#[derive(Clone, Copy)]
struct Fraction<'a>(&'a [u8]);

impl Fraction<'_> {
    fn is_nonzero(self) -> bool {
        self.0.iter().any(|&b| b != b'0')
    }

    /// `floor(0.digits × unit)`. Only the first 18 digits count: what they leave out is below
    /// `unit × 10⁻¹⁸`, under a nanosecond for every unit used here.
    fn scaled(self, unit: u64) -> Option<u64> {
        let kept = &self.0[..self.0.len().min(18)];
        let (numerator, denominator) =
            kept.iter().fold((0u128, 1u128), |(n, d), &b| (n * 10 + u128::from(b - b'0'), d * 10));
        u64::try_from(numerator * u128::from(unit) / denominator).ok()
    }
}

/// How much a decimal may leave out around its dot.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dot {
    /// Digits on both sides of a dot: `1.5`, never `.5` or `1.`.
    Strict,
    /// Go's rule: digits on at least one side (`.5`, `1.`), never a bare `.`.
    Go,
}

/// A decimal at the start of `s` with at most `max_frac` fractional digits: the whole part (0
/// when `Dot::Go` lets it be empty), the fraction and the rest of `s`.
fn number(s: &[u8], dot: Dot, max_frac: usize) -> Option<(u64, Fraction<'_>, &[u8])> {
    let (whole, rest) = match digits(s) {
        Some(found) => found,
        // Leading digits that did not parse overflowed.
        None if s.first().is_some_and(u8::is_ascii_digit) => return None,
        None => (0, s),
    };
    let had_whole = rest.len() < s.len();
    let Some(after_dot) = rest.strip_prefix(b".") else {
        return had_whole.then_some((whole, Fraction(&[]), rest));
    };
    let len = after_dot.iter().take_while(|b| b.is_ascii_digit()).count();
    let sides_ok = match dot {
        Dot::Strict => had_whole && len > 0,
        Dot::Go => had_whole || len > 0,
    };
    if !sides_ok || len > max_frac {
        return None;
    }
    let (frac, rest) = after_dot.split_at(len);
    Some((whole, Fraction(frac), rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    /// 2026-01-01T00:00:00Z.
    const NOW: Millis = Millis(1_767_225_600_000);
    /// Wed, 21 Oct 2015 07:28:00 GMT, the RFC 9110 example date.
    const RFC_DATE: Millis = Millis(1_445_412_480_000);

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for &(name, value) in pairs {
            map.append(name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn an_outcome_is_limited_on_a_429_or_a_remaining_count_at_the_floor() {
        let none = HeaderMap::new();
        assert_eq!(vendor_outcome(429, &none, None), Some(Signal::Limited));
        assert_eq!(vendor_outcome(200, &none, Some(3)), Some(Signal::Clean));
        let low = headers(&[("x-ratelimit-remaining-requests", "3")]);
        assert_eq!(vendor_outcome(200, &low, Some(3)), Some(Signal::Limited));
        assert_eq!(vendor_outcome(200, &low, Some(2)), Some(Signal::Clean));
        assert_eq!(vendor_outcome(200, &low, None), Some(Signal::Clean), "without a floor only a 429 counts");
        let anthropic = headers(&[("anthropic-ratelimit-requests-remaining", "0")]);
        assert_eq!(vendor_outcome(201, &anthropic, Some(0)), Some(Signal::Limited));
        let garbled = headers(&[("x-ratelimit-remaining-requests", "-1")]);
        assert_eq!(
            vendor_outcome(200, &garbled, Some(5)),
            Some(Signal::Clean),
            "a count that does not parse is no signal"
        );
        assert_eq!(vendor_outcome(503, &low, Some(3)), None);
    }

    const RETRY_INFO_38S: &str = r#"{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":[
        {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"PerMinute"}]},
        {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"38s"}]}}"#;

    #[test]
    fn go_durations_from_openai_docs_and_go() {
        for (input, ms) in [
            ("1s", 1_000),
            ("6m0s", 360_000),
            ("20ms", 20),
            ("2m52.8s", 172_800),
            ("1h2m3.5s", 3_723_500),
            ("7.66s", 7_660),
            ("1.5h", 5_400_000),
            ("500us", 1),
            ("1500\u{b5}s", 2),
            ("1500\u{3bc}s", 2),
            ("1ms1us", 2),
            ("1ns", 1),
            ("999999ns", 1),
            ("1000000ns", 1),
            ("1000001ns", 2),
            ("0", 0),
            ("0s", 0),
            ("0.0000000001s", 0),
            ("1.s", 1_000),
            (".5s", 500),
            ("1.000000000000000000000000000001s", 1_000),
            ("2562047h47m16.854775807s", 9_223_372_036_855),
        ] {
            assert_eq!(parse_go_duration(input), Some(ms), "{input:?}");
        }
    }

    #[test]
    fn go_durations_refused() {
        for input in [
            "",
            " ",
            "1s ",
            " 1s",
            "-1s",
            "+1s",
            "-0",
            "1",
            "00",
            "1.5",
            "s",
            ".s",
            "1..5s",
            "1s.",
            "1x",
            "1S",
            "1e3s",
            "1d",
            "\u{ff11}s",
            "1s1m",
            "1s1s",
            "1m1h",
            "1us1\u{b5}s",
            "1ns1us",
            "99999999999999999999s",
            "5124095576h",
            "2562047h47m16.854775808s",
            "1h1h",
        ] {
            assert_eq!(parse_go_duration(input), None, "{input:?}");
        }
    }

    #[test]
    fn proto_durations() {
        for (input, ms) in [
            ("38s", 38_000),
            ("1.5s", 1_500),
            ("0.000001s", 1),
            ("0.000000001s", 1),
            ("1.000000001s", 1_001),
            ("0s", 0),
            ("0.000s", 0),
            ("315576000000s", 315_576_000_000_000),
        ] {
            assert_eq!(parse_proto_duration(input), Some(ms), "{input:?}");
        }
        for input in [
            "",
            "s",
            "38",
            " 38s",
            "38s ",
            "-1s",
            "+1s",
            ".5s",
            "1.s",
            "1.0000000001s",
            "1m",
            "1.5ms",
            "1e1s",
            "315576000001s",
            "99999999999999999999s",
            "38ss",
        ] {
            assert_eq!(parse_proto_duration(input), None, "{input:?}");
        }
    }

    #[test]
    fn retry_after_seconds_and_all_three_date_forms() {
        assert_eq!(parse_retry_after("120", NOW), Some(120_000));
        assert_eq!(parse_retry_after("0", NOW), Some(0));
        let before = RFC_DATE.minus(30_000);
        for date in ["Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15 07:28:00 GMT", "Wed Oct 21 07:28:00 2015"] {
            assert_eq!(parse_retry_after(date, before), Some(30_000), "{date:?}");
            assert_eq!(parse_retry_after(date, RFC_DATE), Some(0), "{date:?}");
            assert_eq!(parse_retry_after(date, NOW), Some(0), "{date:?} is in the past");
        }
    }

    #[test]
    fn retry_after_refused() {
        for input in [
            "",
            " ",
            " 120",
            "120 ",
            "-1",
            "+1",
            "1.5",
            "120s",
            "99999999999999999999",
            "18446744073709552",
            "junk",
            "Wed, 21 Oct 2015 07:28:00 UTC",
            "Thu, 21 Oct 2015 07:28:00 GMT",
            " Wed, 21 Oct 2015 07:28:00 GMT",
            "Wed, 21 Oct 1969 07:28:00 GMT",
        ] {
            assert_eq!(parse_retry_after(input, NOW), None, "{input:?}");
        }
    }

    #[test]
    fn decimal_ms_and_counts() {
        assert_eq!(parse_decimal_ms("1500"), Some(1_500));
        assert_eq!(parse_decimal_ms("2500.1"), Some(2_501));
        assert_eq!(parse_decimal_ms("2500.000"), Some(2_500));
        for bad in ["", "-5", ".5", "5.", "5ms", "1e3", "99999999999999999999"] {
            assert_eq!(parse_decimal_ms(bad), None, "{bad:?}");
        }
        assert_eq!(parse_count("0"), Some(0));
        assert_eq!(parse_count("0042"), Some(42));
        for bad in ["", "-0", "+0", "0.0", "0x0", "junk", "99999999999999999999"] {
            assert_eq!(parse_count(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn wait_reads_each_source_in_order() {
        let none = HeaderMap::new();
        let cases: [(HeaderMap, &str, u64); 11] = [
            (headers(&[("retry-after-ms", "1500")]), "", 1_500),
            (headers(&[("retry-after-ms", "2500.1")]), "", 2_501),
            (headers(&[("retry-after-ms", "1500"), ("retry-after", "60")]), "", 1_500),
            (headers(&[("retry-after", "120")]), "", 120_000),
            (headers(&[("Retry-After", "20")]), RETRY_INFO_38S, 20_000),
            (headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:45 GMT")]), "", 45_000),
            (none.clone(), RETRY_INFO_38S, 38_000),
            (
                none.clone(),
                r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#,
                1_500,
            ),
            (none.clone(), &format!("[{RETRY_INFO_38S}]"), 38_000),
            // A source present but unparseable is skipped, not fatal.
            (headers(&[("retry-after-ms", "soon"), ("retry-after", "7")]), "", 7_000),
            (headers(&[("retry-after", "-1")]), RETRY_INFO_38S, 38_000),
        ];
        for (map, body, ms) in cases {
            assert_eq!(vendor_wait(&map, body.as_bytes(), RFC_DATE, 5_000), ms, "{map:?} {body}");
        }
    }

    #[test]
    fn wait_clamps_both_ends_and_defaults() {
        let none = HeaderMap::new();
        assert_eq!(vendor_wait(&none, b"", NOW, 5_000), 5_000);
        assert_eq!(vendor_wait(&none, b"", NOW, 0), MIN_WAIT_MS);
        assert_eq!(vendor_wait(&none, b"", NOW, u64::MAX), MAX_WAIT_MS);
        assert_eq!(vendor_wait(&headers(&[("retry-after-ms", "5")]), b"", NOW, 5_000), 1_000);
        assert_eq!(vendor_wait(&headers(&[("retry-after", "0")]), b"", NOW, 5_000), 1_000);
        assert_eq!(vendor_wait(&headers(&[("retry-after", "3600")]), b"", NOW, 5_000), 120_000);
        let past = headers(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")]);
        assert_eq!(vendor_wait(&past, b"", NOW, 5_000), 1_000);
        let long =
            r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"86400s"}]}}"#;
        assert_eq!(vendor_wait(&none, long.as_bytes(), NOW, 5_000), 120_000);
    }

    #[test]
    fn wait_ignores_what_is_not_a_signal() {
        let none = HeaderMap::new();
        let mut not_utf8 = HeaderMap::new();
        not_utf8.insert("retry-after-ms", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert_eq!(vendor_wait(&not_utf8, b"", NOW, 5_000), 5_000);
        let padded = headers(&[("retry-after", " 9\t")]);
        assert_eq!(vendor_wait(&padded, b"", NOW, 5_000), 9_000);
        for body in [
            "not json",
            "{",
            "[]",
            "{}",
            r#"{"error":"quota"}"#,
            r#"{"error":{"details":"x"}}"#,
            r#"{"error":{"details":[1,"x",null]}}"#,
            r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","retryDelay":"38s"}]}}"#,
            r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{"seconds":38}}]}}"#,
            r#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-38s"}]}}"#,
            r#"{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"38s"}]}"#,
        ] {
            assert_eq!(vendor_wait(&none, body.as_bytes(), NOW, 5_000), 5_000, "{body}");
        }
        let mut huge = RETRY_INFO_38S.to_string();
        huge.push_str(&" ".repeat(MAX_BODY_BYTES));
        assert_eq!(vendor_wait(&none, huge.as_bytes(), NOW, 5_000), 5_000);
        let deep = "[".repeat(10_000);
        assert_eq!(vendor_wait(&none, deep.as_bytes(), NOW, 5_000), 5_000);
    }

    #[test]
    fn budget_from_anthropic_headers() {
        let at = |s: &str| parse_instant(s).unwrap();
        let one = headers(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:30Z"),
            ("anthropic-ratelimit-tokens-remaining", "39000"),
            ("anthropic-ratelimit-tokens-reset", "2026-01-01T00:01:30Z"),
        ]);
        assert_eq!(vendor_budget(&one, NOW), Some(NOW.plus(30_000)));
        let two = headers(&[
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            ("anthropic-ratelimit-input-tokens-reset", "2026-01-01T00:00:12.5Z"),
            ("anthropic-ratelimit-output-tokens-remaining", "0"),
            ("anthropic-ratelimit-output-tokens-reset", "2026-01-01T01:00:40+01:00"),
        ]);
        assert_eq!(vendor_budget(&two, NOW), Some(at("2026-01-01T00:00:40Z")));
        let far = headers(&[
            ("anthropic-ratelimit-tokens-remaining", "0"),
            ("anthropic-ratelimit-tokens-reset", "2026-01-01T00:10:00Z"),
        ]);
        assert_eq!(vendor_budget(&far, NOW), Some(NOW.plus(MAX_WAIT_MS)));
    }

    #[test]
    fn budget_from_openai_headers() {
        let requests = headers(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ]);
        assert_eq!(vendor_budget(&requests, NOW), Some(NOW.plus(1_000)));
        let tokens = headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "20ms"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "52.8s"),
        ]);
        assert_eq!(vendor_budget(&tokens, NOW), Some(NOW.plus(52_800)));
        let capped = headers(&[("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", "2m52.8s")]);
        assert_eq!(vendor_budget(&capped, NOW), Some(NOW.plus(MAX_WAIT_MS)));
        let mixed = headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "5s"),
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:03Z"),
        ]);
        assert_eq!(vendor_budget(&mixed, NOW), Some(NOW.plus(5_000)));
    }

    /// Either family's reset may be plain seconds from now.
    #[test]
    fn budget_resets_given_as_plain_seconds() {
        let now = parse_instant("2026-01-01T00:00:00Z").unwrap();
        let openai = headers(&[("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", "30")]);
        assert_eq!(vendor_budget(&openai, now), Some(now.plus(30_000)));
        let openai = headers(&[("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "0.5")]);
        assert_eq!(vendor_budget(&openai, now), Some(now.plus(500)));
        let anthropic =
            headers(&[("anthropic-ratelimit-tokens-remaining", "0"), ("anthropic-ratelimit-tokens-reset", "30")]);
        assert_eq!(vendor_budget(&anthropic, now), Some(now.plus(30_000)));
        let anthropic =
            headers(&[("anthropic-ratelimit-requests-remaining", "0"), ("anthropic-ratelimit-requests-reset", "0.5")]);
        assert_eq!(vendor_budget(&anthropic, now), Some(now.plus(500)));
        for (value, ms) in [("0", Some(0)), ("30", Some(30_000)), ("0.5", Some(500)), ("1.0001", Some(1_001))] {
            assert_eq!(parse_seconds(value), ms, "{value}");
        }
        for bad in ["", "-1", "+1", ".5", "1.", "1s", "1e3", " 1", "0x10", "1.0000000001"] {
            assert_eq!(parse_seconds(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn budget_none_unless_exhausted_with_a_future_reset() {
        for pairs in [
            &[][..],
            &[("x-ratelimit-remaining-requests", "1"), ("x-ratelimit-reset-requests", "1s")],
            &[("x-ratelimit-remaining-requests", "0")],
            &[("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "0s")],
            &[("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "soon")],
            &[("x-ratelimit-remaining-requests", "-0"), ("x-ratelimit-reset-requests", "1s")],
            &[("x-ratelimit-remaining-tokens", "0.0"), ("x-ratelimit-reset-tokens", "1s")],
            &[("x-ratelimit-remaining-tokens", ""), ("x-ratelimit-reset-tokens", "1s")],
            &[
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:00Z"),
            ],
            &[
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2025-12-31T23:59:59Z"),
            ],
            &[("anthropic-ratelimit-requests-remaining", "0"), ("anthropic-ratelimit-requests-reset", "in 30 seconds")],
            &[
                ("anthropic-ratelimit-tokens-remaining", "5"),
                ("anthropic-ratelimit-tokens-reset", "2026-01-01T00:00:30Z"),
            ],
            // Reset headers crossed between vendors do not count.
            &[("anthropic-ratelimit-requests-remaining", "0"), ("anthropic-ratelimit-requests-reset", "30s")],
        ] {
            assert_eq!(vendor_budget(&headers(pairs), NOW), None, "{pairs:?}");
        }
        let mut not_utf8 = headers(&[("x-ratelimit-reset-requests", "1s")]);
        not_utf8.insert("x-ratelimit-remaining-requests", HeaderValue::from_bytes(b"0\xff").unwrap());
        assert_eq!(vendor_budget(&not_utf8, NOW), None);
        // One junk pair does not hide a good one.
        let partly = headers(&[
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "junk"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "2s"),
        ]);
        assert_eq!(vendor_budget(&partly, NOW), Some(NOW.plus(2_000)));
        // Near the end of time the cap saturates rather than overflows.
        let late = Millis(u64::MAX - 10);
        let tokens = headers(&[("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", "1h")]);
        assert_eq!(vendor_budget(&tokens, late), Some(Millis(u64::MAX)));
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC*", raw in proptest::collection::vec(any::<u8>(), 0..256), now in any::<u64>()) {
            let now = Millis(now);
            let _ = parse_go_duration(&s);
            let _ = parse_proto_duration(&s);
            let _ = parse_retry_after(&s, now);
            let mut map = HeaderMap::new();
            if let Ok(value) = HeaderValue::from_bytes(&raw) {
                for name in ["retry-after-ms", "retry-after", "x-ratelimit-remaining-tokens",
                             "x-ratelimit-reset-tokens", "anthropic-ratelimit-tokens-remaining",
                             "anthropic-ratelimit-tokens-reset"] {
                    map.insert(name, value.clone());
                }
            }
            let wait = vendor_wait(&map, &raw, now, 5_000);
            prop_assert!((MIN_WAIT_MS..=MAX_WAIT_MS).contains(&wait));
            if let Some(reset) = vendor_budget(&map, now) {
                prop_assert!(reset > now && reset <= now.plus(MAX_WAIT_MS));
            }
        }

        #[test]
        fn duration_like_strings_never_panic(s in "[0-9.hmsun\u{b5}-]{0,40}") {
            let _ = parse_go_duration(&s);
            let _ = parse_proto_duration(&s);
        }

        #[test]
        fn go_durations_match_their_parts(h in 0u64..10_000, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            prop_assert_eq!(parse_go_duration(&text), Some(((h * 60 + m) * 60 + s) * 1000 + ms));
            let text = format!("{s}.{ms:03}s");
            prop_assert_eq!(parse_proto_duration(&text), Some(s * 1000 + ms));
        }
    }
}
