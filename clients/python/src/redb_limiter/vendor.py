"""Providers' signals: the wait a 429 asks for, and when an exhausted budget resets.

Owns reading the rate-limit hints model providers put on their responses, by the same rules
(and the same shared test vectors) as the Rust and JavaScript clients:

- :func:`vendor_wait_ms`: the wait a 429 asks for: ``retry-after-ms``, ``Retry-After``
  (seconds or an HTTP-date), or Google's ``google.rpc.RetryInfo`` in a JSON error body;
  clamped to 1-120 s.
- :func:`vendor_budget`: the instant an exhausted budget resets, from a success's headers
  (Anthropic's ``anthropic-ratelimit-*``, OpenAI's ``x-ratelimit-*``); at most 120 s ahead.

It is pure: no network and no clock read when ``now`` is given. Every input is hostile until
parsed; the parsers are strict, and a value that does not parse is no signal (it is ignored,
never guessed at).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Optional, Tuple, Union

from ._time import datetime_to_ms, ms_to_datetime, parse_http_date, parse_instant

__all__ = [
    "MAX_WAIT_MS",
    "MIN_WAIT_MS",
    "Headers",
    "parse_go_duration",
    "parse_proto_duration",
    "parse_retry_after",
    "parse_seconds",
    "vendor_budget",
    "vendor_outcome",
    "vendor_wait_ms",
]

#: The shortest wait a 429 yields, whatever the provider says.
MIN_WAIT_MS = 1_000
#: The longest wait a provider can impose, through a 429 or an exhausted budget.
MAX_WAIT_MS = 120_000
#: Bodies longer than this are not inspected for ``RetryInfo``.
MAX_BODY_BYTES = 64 * 1024

_U64 = 2**64 - 1
_I64 = 2**63 - 1
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"

_INSTANT_BUDGETS = (
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
)
_DURATION_BUDGETS = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
)

#: Response headers: a mapping (``httpx.Headers``, a ``dict``) or ``(name, value)`` pairs.
#: Headers with a ``raw`` list of byte pairs (httpx's) are read as sent, bytes included.
#: Names match case-insensitively; of a repeated header the first value counts.
Headers = Union[Mapping[str, str], Iterable[Tuple[str, str]]]


def _now_ms(now: datetime | None) -> int:
    return int(time.time() * 1000) if now is None else datetime_to_ms(now, "now")


def _header(headers: Headers, name: str) -> str | None:
    """The first value of header ``name`` without surrounding spaces and tabs; ``None`` when it
    is absent, not UTF-8 or empty."""
    value: str | bytes | None = None
    raw = getattr(headers, "raw", None)  # httpx's (and its forks') headers, as sent
    if isinstance(raw, list):
        for raw_name, raw_value in raw:
            if isinstance(raw_name, bytes) and raw_name.lower() == name.encode():
                value = raw_value
                break
    else:
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        for key, val in pairs:
            if key.lower() == name:
                value = val
                break
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    text = value.strip(" \t")
    return text or None


def _digits(s: str) -> tuple[int, str] | None:
    """A leading run of ASCII digits and what follows; ``None`` without digits or past u64."""
    n = 0
    while n < len(s) and s[n] in "0123456789":
        n += 1
    if n == 0:
        return None
    value = int(s[:n])
    return None if value > _U64 else (value, s[n:])


def _scaled(frac: str, unit: int) -> int | None:
    """``floor(0.frac * unit)`` on the first 18 fractional digits; ``None`` past u64."""
    kept = frac[:18]
    if not kept:
        return 0
    value = int(kept) * unit // 10 ** len(kept)
    return None if value > _U64 else value


def _number(s: str, go: bool, max_frac: int | None) -> tuple[int, str, str] | None:
    """A decimal at the start of ``s``: the whole part, the fraction's digits, the rest.

    Strict (``go=False``): digits on both sides of a dot. Go's rule: on at least one side."""
    found = _digits(s)
    if found is None:
        if s[:1] in tuple("0123456789"):
            return None  # digits that overflowed
        whole, rest = 0, s
    else:
        whole, rest = found
    had_whole = len(rest) < len(s)
    if not rest.startswith("."):
        return (whole, "", rest) if had_whole else None
    after = rest[1:]
    n = 0
    while n < len(after) and after[n] in "0123456789":
        n += 1
    sides_ok = (had_whole or n > 0) if go else (had_whole and n > 0)
    if not sides_ok or (max_frac is not None and n > max_frac):
        return None
    return whole, after[:n], after[n:]


def parse_go_duration(s: str) -> int | None:
    """A Go ``time.Duration`` string (OpenAI's resets: ``6m0s``, ``20ms``) in milliseconds,
    rounded up. No sign; each unit at most once, largest first."""
    units = (("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000),
             ("us", 1_000), ("\u00b5s", 1_000), ("\u03bcs", 1_000), ("ns", 1))
    if s == "0":
        return 0
    if not s:
        return None
    total = 0
    next_unit = 0
    rest = s
    while rest:
        parsed = _number(rest, True, None)
        if parsed is None:
            return None
        whole, frac, after = parsed
        n = 0
        while n < len(after) and after[n] not in "0123456789.":
            n += 1
        unit, rest = after[:n], after[n:]
        index = next((i for i, (name, _) in enumerate(units) if name == unit), None)
        if index is None or index < next_unit:
            return None
        next_unit = 7 if 4 <= index <= 6 else index + 1
        unit_ns = units[index][1]
        scaled = _scaled(frac, unit_ns)
        if scaled is None:
            return None
        part = whole * unit_ns + scaled
        total += part
        if whole * unit_ns > _U64 or part > _U64 or total > _U64:
            return None
    if total > _I64:
        return None
    return -(-total // 1_000_000)


def _seconds_ms(s: str, max_seconds: int | None) -> int | None:
    """``digits[.digits]`` seconds (at most 9 fractional digits) in milliseconds, rounded up."""
    parsed = _number(s, False, 9)
    if parsed is None or parsed[2]:
        return None
    whole, frac, _ = parsed
    if max_seconds is not None and whole > max_seconds:
        return None
    scaled = _scaled(frac, 1_000_000_000)
    if scaled is None or whole * 1000 > _U64:
        return None
    return whole * 1000 + -(-scaled // 1_000_000)


def parse_proto_duration(s: str) -> int | None:
    """The JSON form of a ``google.protobuf.Duration`` (``"38s"``, ``"1.5s"``) in milliseconds,
    rounded up: digits on both sides of a dot, at most 9 fractional digits, no sign."""
    return _seconds_ms(s[:-1], 315_576_000_000) if s.endswith("s") else None


def parse_seconds(s: str) -> int | None:
    """Plain decimal seconds (``30``, ``0.5``) in milliseconds, rounded up."""
    return _seconds_ms(s, None)


def _parse_decimal_ms(s: str) -> int | None:
    parsed = _number(s, False, None)
    if parsed is None or parsed[2]:
        return None
    whole, frac, _ = parsed
    value = whole + (1 if frac.strip("0") else 0)
    return None if value > _U64 else value


def _parse_count(s: str) -> int | None:
    found = _digits(s)
    return found[0] if found is not None and not found[1] else None


def parse_retry_after(value: str, now_ms: int) -> int | None:
    """A ``Retry-After`` value in milliseconds from ``now_ms``: delay-seconds, or an HTTP-date
    (a date at or before now gives 0). Surrounding whitespace is refused."""
    if value.strip() != value:
        return None
    if value[:1] in tuple("0123456789"):
        found = _digits(value)
        if found is None or found[1] or found[0] * 1000 > _U64:
            return None
        return found[0] * 1000
    at = parse_http_date(value)
    if at is None:
        return None
    return max(at * 1000 - now_ms, 0)


def _retry_info_ms(body: bytes | str | None) -> int | None:
    if body is None:
        return None
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    if len(raw) > MAX_BODY_BYTES:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    errors = value if isinstance(value, list) else [value]
    for item in errors:
        error = item.get("error") if isinstance(item, dict) else None
        details = error.get("details") if isinstance(error, dict) else None
        if not isinstance(details, list):
            continue
        for detail in details:
            if not isinstance(detail, dict) or detail.get("@type") != _RETRY_INFO:
                continue
            delay = detail.get("retryDelay")
            if isinstance(delay, str):
                ms = parse_proto_duration(delay)
                if ms is not None:
                    return ms
    return None


def vendor_wait_ms(
    headers: Headers,
    body: bytes | str | None = None,
    *,
    now: datetime | None = None,
    default_ms: int = 5_000,
) -> int:
    """The wait a 429 asked for, in milliseconds, clamped to 1,000-120,000.

    Looks, in order, at ``retry-after-ms`` (decimal milliseconds), ``Retry-After``
    (delay-seconds or an HTTP-date, relative to ``now``) and a ``google.rpc.RetryInfo`` detail
    in a JSON error body (also inside a JSON array). The first source that parses wins; one
    present but unparsable is skipped. With no signal the answer is ``default_ms``, clamped.
    """
    now_ms = _now_ms(now)
    asked: Optional[int] = None
    value = _header(headers, "retry-after-ms")
    if value is not None:
        asked = _parse_decimal_ms(value)
    if asked is None:
        value = _header(headers, "retry-after")
        if value is not None:
            asked = parse_retry_after(value, now_ms)
    if asked is None:
        asked = _retry_info_ms(body)
    if asked is None:
        asked = default_ms
    return min(max(asked, MIN_WAIT_MS), MAX_WAIT_MS)


def vendor_budget_ms(headers: Headers, now_ms: int) -> int | None:
    """:func:`vendor_budget` in milliseconds since the epoch."""

    def exhausted(name: str) -> bool:
        value = _header(headers, name)
        return value is not None and _parse_count(value) == 0

    resets: list[int] = []
    for remaining, reset in _INSTANT_BUDGETS:
        value = _header(headers, reset) if exhausted(remaining) else None
        if value is None:
            continue
        try:
            resets.append(parse_instant(value))
        except ValueError:
            seconds = parse_seconds(value)
            if seconds is not None:
                resets.append(now_ms + seconds)
    for remaining, reset in _DURATION_BUDGETS:
        value = _header(headers, reset) if exhausted(remaining) else None
        if value is None:
            continue
        ms = parse_go_duration(value)
        if ms is None:
            ms = parse_seconds(value)
        if ms is not None:
            resets.append(now_ms + ms)
    future = [r for r in resets if r > now_ms]
    if not future:
        return None
    return min(max(future), now_ms + MAX_WAIT_MS, _U64)


#: The providers' headers of remaining requests (Anthropic's, OpenAI's), as VernLLM reads its hint.
_REMAINING_REQUESTS = ("anthropic-ratelimit-requests-remaining", "x-ratelimit-remaining-requests")


def vendor_outcome(status: int, headers: Headers, *, floor: int | None = None) -> str | None:
    """What a provider's answer says of the call for an adaptive ceiling (wire section 14):
    ``"limited"`` on a 429, or on a success whose remaining requests are at or below ``floor``
    (VernLLM's ``proactiveFloor``; without one, only a 429 counts); ``"clean"`` on any other
    success; ``None`` on any other failure, which says nothing of the limit."""
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int) or floor < 0):
        raise ValueError(f"floor must be a non-negative integer, got {floor!r}")
    if status == 429:
        return "limited"
    if not 200 <= status < 300:
        return None
    if floor is not None:
        for name in _REMAINING_REQUESTS:
            value = _header(headers, name)
            count = None if value is None else _parse_count(value)
            if count is not None and count <= floor:
                return "limited"
    return "clean"


def vendor_budget(headers: Headers, *, now: datetime | None = None) -> datetime | None:
    """When a success reports an exhausted budget, the instant it resets (at most 120 s after
    ``now``); ``None`` when no budget is exhausted.

    A budget is exhausted when its ``remaining`` header is exactly ``0``. Of the exhausted
    budgets with a reset after ``now``, the one resetting last binds. A pair whose remaining or
    reset does not parse is ignored. Anthropic's resets are RFC 3339 instants, OpenAI's Go
    durations; either may be plain seconds.
    """
    at = vendor_budget_ms(headers, _now_ms(now))
    return None if at is None else ms_to_datetime(at)

