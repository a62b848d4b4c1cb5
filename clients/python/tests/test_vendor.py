"""Providers' signals: the rules of the Rust client's vendor module, case by case."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from redb_limiter._time import format_instant, ms_to_datetime, parse_instant
from redb_limiter.vendor import (
    MAX_BODY_BYTES,
    MAX_WAIT_MS,
    MIN_WAIT_MS,
    _parse_count,
    _parse_decimal_ms,
    parse_go_duration,
    parse_proto_duration,
    parse_retry_after,
    parse_seconds,
    vendor_budget,
    vendor_wait_ms,
)

NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOW = ms_to_datetime(NOW_MS)
RFC_DATE_MS = 1_445_412_480_000  # Wed, 21 Oct 2015 07:28:00 GMT
RFC_DATE = ms_to_datetime(RFC_DATE_MS)

RETRY_INFO_38S = (
    '{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":['
    '{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"PerMinute"}]},'
    '{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"38s"}]}}'
)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1s", 1_000), ("6m0s", 360_000), ("20ms", 20), ("2m52.8s", 172_800), ("1h2m3.5s", 3_723_500),
        ("7.66s", 7_660), ("1.5h", 5_400_000), ("500us", 1), ("1500\u00b5s", 2), ("1500\u03bcs", 2),
        ("1ms1us", 2), ("1ns", 1), ("999999ns", 1), ("1000000ns", 1), ("1000001ns", 2), ("0", 0),
        ("0s", 0), ("0.0000000001s", 0), ("1.s", 1_000), (".5s", 500),
        ("1.000000000000000000000000000001s", 1_000), ("2562047h47m16.854775807s", 9_223_372_036_855),
    ],
)
def test_go_durations(text: str, ms: int) -> None:
    assert parse_go_duration(text) == ms


@pytest.mark.parametrize(
    "text",
    [
        "", " ", "1s ", " 1s", "-1s", "+1s", "-0", "1", "00", "1.5", "s", ".s", "1..5s", "1s.", "1x", "1S",
        "1e3s", "1d", "\uff11s", "1s1m", "1s1s", "1m1h", "1us1\u00b5s", "1ns1us", "99999999999999999999s",
        "5124095576h", "2562047h47m16.854775808s", "1h1h",
    ],
)
def test_go_durations_refused(text: str) -> None:
    assert parse_go_duration(text) is None


def test_proto_durations() -> None:
    for text, ms in [
        ("38s", 38_000), ("1.5s", 1_500), ("0.000001s", 1), ("0.000000001s", 1), ("1.000000001s", 1_001),
        ("0s", 0), ("0.000s", 0), ("315576000000s", 315_576_000_000_000),
    ]:
        assert parse_proto_duration(text) == ms, text
    for text in [
        "", "s", "38", " 38s", "38s ", "-1s", "+1s", ".5s", "1.s", "1.0000000001s", "1m", "1.5ms", "1e1s",
        "315576000001s", "99999999999999999999s", "38ss",
    ]:
        assert parse_proto_duration(text) is None, text


def test_retry_after_seconds_and_all_three_date_forms() -> None:
    assert parse_retry_after("120", NOW_MS) == 120_000
    assert parse_retry_after("0", NOW_MS) == 0
    for date in ["Wed, 21 Oct 2015 07:28:00 GMT", "Wednesday, 21-Oct-15 07:28:00 GMT", "Wed Oct 21 07:28:00 2015"]:
        assert parse_retry_after(date, RFC_DATE_MS - 30_000) == 30_000, date
        assert parse_retry_after(date, RFC_DATE_MS) == 0, date
        assert parse_retry_after(date, NOW_MS) == 0, date
    assert parse_retry_after("Sun Nov  6 08:49:37 1994", 784_111_777_000 - 1_000) == 1_000


@pytest.mark.parametrize(
    "text",
    [
        "", " ", " 120", "120 ", "-1", "+1", "1.5", "120s", "99999999999999999999", "18446744073709552", "junk",
        "Wed, 21 Oct 2015 07:28:00 UTC", "Thu, 21 Oct 2015 07:28:00 GMT", " Wed, 21 Oct 2015 07:28:00 GMT",
        "Wed, 21 Oct 1969 07:28:00 GMT", "Wed, 31 Feb 2015 07:28:00 GMT", "Wed, 21 Oct 2015 24:00:00 GMT",
    ],
)
def test_retry_after_refused(text: str) -> None:
    assert parse_retry_after(text, NOW_MS) is None


def test_decimal_ms_counts_and_seconds() -> None:
    assert _parse_decimal_ms("1500") == 1_500
    assert _parse_decimal_ms("2500.1") == 2_501
    assert _parse_decimal_ms("2500.000") == 2_500
    for bad in ["", "-5", ".5", "5.", "5ms", "1e3", "99999999999999999999"]:
        assert _parse_decimal_ms(bad) is None, bad
    assert _parse_count("0") == 0
    assert _parse_count("0042") == 42
    for bad in ["", "-0", "+0", "0.0", "0x0", "junk", "99999999999999999999", "\u0660"]:
        assert _parse_count(bad) is None, bad
    for value, ms in [("0", 0), ("30", 30_000), ("0.5", 500), ("1.0001", 1_001)]:
        assert parse_seconds(value) == ms, value
    for bad in ["", "-1", "+1", ".5", "1.", "1s", "1e3", " 1", "0x10", "1.0000000001"]:
        assert parse_seconds(bad) is None, bad


@pytest.mark.parametrize(
    ("headers", "body", "ms"),
    [
        ({"retry-after-ms": "1500"}, "", 1_500),
        ({"retry-after-ms": "2500.1"}, "", 2_501),
        ({"retry-after-ms": "1500", "retry-after": "60"}, "", 1_500),
        ({"retry-after": "120"}, "", 120_000),
        ({"Retry-After": "20"}, RETRY_INFO_38S, 20_000),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:45 GMT"}, "", 45_000),
        ({}, RETRY_INFO_38S, 38_000),
        ({}, '{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}', 1_500),
        ({}, f"[{RETRY_INFO_38S}]", 38_000),
        ({"retry-after-ms": "soon", "retry-after": "7"}, "", 7_000),
        ({"retry-after": "-1"}, RETRY_INFO_38S, 38_000),
        ({"retry-after": " 9\t"}, "", 9_000),
    ],
)
def test_wait_reads_each_source_in_order(headers: dict[str, str], body: str, ms: int) -> None:
    assert vendor_wait_ms(headers, body, now=RFC_DATE) == ms
    assert vendor_wait_ms(httpx.Headers(headers), body.encode(), now=RFC_DATE) == ms
    assert vendor_wait_ms(list(headers.items()), body, now=RFC_DATE) == ms


def test_wait_clamps_both_ends_and_defaults() -> None:
    assert vendor_wait_ms({}, None, now=NOW) == 5_000
    assert vendor_wait_ms({}, now=NOW, default_ms=0) == MIN_WAIT_MS
    assert vendor_wait_ms({}, now=NOW, default_ms=2**64) == MAX_WAIT_MS
    assert vendor_wait_ms({"retry-after-ms": "5"}, now=NOW) == 1_000
    assert vendor_wait_ms({"retry-after": "0"}, now=NOW) == 1_000
    assert vendor_wait_ms({"retry-after": "3600"}, now=NOW) == 120_000
    assert vendor_wait_ms({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=NOW) == 1_000
    long = '{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"86400s"}]}}'
    assert vendor_wait_ms({}, long, now=NOW) == 120_000


def test_wait_ignores_what_is_not_a_signal() -> None:
    not_utf8 = httpx.Headers([(b"retry-after-ms", b"\xff\xfe")])
    assert vendor_wait_ms(not_utf8, now=NOW) == 5_000
    for body in [
        "not json", "{", "[]", "{}", '{"error":"quota"}', '{"error":{"details":"x"}}',
        '{"error":{"details":[1,"x",null]}}',
        '{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","retryDelay":"38s"}]}}',
        '{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{"seconds":38}}]}}',
        '{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"-38s"}]}}',
        '{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"38s"}]}',
    ]:
        assert vendor_wait_ms({}, body, now=NOW) == 5_000, body
    assert vendor_wait_ms({}, RETRY_INFO_38S + " " * MAX_BODY_BYTES, now=NOW) == 5_000
    assert vendor_wait_ms({}, "[" * 100_000, now=NOW) == 5_000
    assert vendor_wait_ms({}, b"\xff\xfe", now=NOW) == 5_000


def test_budget_from_anthropic_headers() -> None:
    one = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:30Z",
        "anthropic-ratelimit-tokens-remaining": "39000",
        "anthropic-ratelimit-tokens-reset": "2026-01-01T00:01:30Z",
    }
    assert vendor_budget(one, now=NOW) == NOW + timedelta(seconds=30)
    two = {
        "anthropic-ratelimit-input-tokens-remaining": "0",
        "anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:12.5Z",
        "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": "2026-01-01T01:00:40+01:00",
    }
    assert vendor_budget(two, now=NOW) == ms_to_datetime(parse_instant("2026-01-01T00:00:40Z"))
    far = {"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": "2026-01-01T00:10:00Z"}
    assert vendor_budget(far, now=NOW) == NOW + timedelta(milliseconds=MAX_WAIT_MS)


def test_budget_from_openai_headers() -> None:
    requests = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert vendor_budget(requests, now=NOW) == NOW + timedelta(seconds=1)
    tokens = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "20ms",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "52.8s",
    }
    assert vendor_budget(tokens, now=NOW) == NOW + timedelta(milliseconds=52_800)
    capped = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "2m52.8s"}
    assert vendor_budget(capped, now=NOW) == NOW + timedelta(milliseconds=MAX_WAIT_MS)
    mixed = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "5s",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:03Z",
    }
    assert vendor_budget(mixed, now=NOW) == NOW + timedelta(seconds=5)
    for family in ("x-ratelimit-remaining-tokens", "anthropic-ratelimit-tokens-remaining"):
        reset = family.replace("remaining", "reset")
        assert vendor_budget({family: "0", reset: "30"}, now=NOW) == NOW + timedelta(seconds=30)
        assert vendor_budget({family: "0", reset: "0.5"}, now=NOW) == NOW + timedelta(milliseconds=500)


@pytest.mark.parametrize(
    "pairs",
    [
        {},
        {"x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": "1s"},
        {"x-ratelimit-remaining-requests": "0"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "0s"},
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "soon"},
        {"x-ratelimit-remaining-requests": "-0", "x-ratelimit-reset-requests": "1s"},
        {"x-ratelimit-remaining-tokens": "0.0", "x-ratelimit-reset-tokens": "1s"},
        {"x-ratelimit-remaining-tokens": "", "x-ratelimit-reset-tokens": "1s"},
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:00Z"},
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "2025-12-31T23:59:59Z"},
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "in 30 seconds"},
        {"anthropic-ratelimit-tokens-remaining": "5", "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:30Z"},
        {"anthropic-ratelimit-requests-remaining": "0", "anthropic-ratelimit-requests-reset": "30s"},
    ],
)
def test_budget_none_unless_exhausted_with_a_future_reset(pairs: dict[str, str]) -> None:
    assert vendor_budget(pairs, now=NOW) is None


def test_budget_ignores_junk_pairs_but_not_good_ones() -> None:
    not_utf8 = httpx.Headers([(b"x-ratelimit-remaining-requests", b"0\xff"), (b"x-ratelimit-reset-requests", b"1s")])
    assert vendor_budget(not_utf8, now=NOW) is None
    partly = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "junk",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "2s",
    }
    assert vendor_budget(partly, now=NOW) == NOW + timedelta(seconds=2)


def test_parsers_never_raise_on_junk() -> None:
    rng = random.Random(27)
    alphabet = "0123456789.hmsun\u00b5-+ :,GMTWedOct\t\u0660\uff11eE"
    for _ in range(3_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
        parse_go_duration(text)
        parse_proto_duration(text)
        parse_retry_after(text, NOW_MS)
        headers = {name: text for name in ["retry-after-ms", "retry-after", "x-ratelimit-remaining-tokens",
                                           "x-ratelimit-reset-tokens", "anthropic-ratelimit-tokens-remaining",
                                           "anthropic-ratelimit-tokens-reset"]}
        assert MIN_WAIT_MS <= vendor_wait_ms(headers, text, now=NOW) <= MAX_WAIT_MS
        reset = vendor_budget(headers, now=NOW)
        assert reset is None or NOW < reset <= NOW + timedelta(milliseconds=MAX_WAIT_MS)


def test_instants_round_trip_the_wire_form() -> None:
    for text in ["2026-11-30T03:11:09.123Z", "1970-01-01T00:00:00.000Z", "2026-02-28T23:59:59.999Z"]:
        assert format_instant(parse_instant(text)) == text
    assert parse_instant("2026-11-30T04:11:09+01:00") == parse_instant("2026-11-30T03:11:09.000Z")
    assert parse_instant("1969-12-31T23:59:59Z") == 0
    for bad in ["2026-11-30 03:11:09Z", "2026-11-30T03:11:09", "2026-02-30T00:00:00Z", "2026-11-30T03:11:09.Z",
                "2026-11-30T24:00:00Z", "2026-11-30T03:11:09+24:00"]:
        with pytest.raises(ValueError):
            parse_instant(bad)
    assert ms_to_datetime(0) == datetime(1970, 1, 1, tzinfo=timezone.utc)
