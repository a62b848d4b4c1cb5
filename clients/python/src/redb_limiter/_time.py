"""Instants: the wire's ISO strings, HTTP dates and milliseconds since the epoch.

Owns the conversions between the wire's instants (JavaScript's ``toISOString`` form on output,
RFC 3339 with or without fraction or offset on input), HTTP-dates (``Retry-After``, ``Date``)
and aware UTC ``datetime`` values. It reads no clock: every ``now`` is a parameter.
"""

from __future__ import annotations

import calendar
from datetime import datetime, timedelta, timezone

from ._errors import BadRequest

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_DIGITS = "0123456789"


def is_ascii_digits(s: str) -> bool:
    """Whether ``s`` is one or more ASCII digits (``str.isdigit`` also takes other scripts)."""
    return len(s) > 0 and all(c in _DIGITS for c in s)


def ms_to_datetime(ms: int) -> datetime:
    """Milliseconds since the epoch as an aware UTC ``datetime``."""
    return _EPOCH + timedelta(milliseconds=ms)


def datetime_to_ms(at: datetime, field: str = "instant") -> int:
    """An aware ``datetime`` as whole milliseconds since the epoch (rounded down)."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise BadRequest(f"{field} must be an aware datetime (with a time zone), got a naive one", field)
    delta = at - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000 + delta.microseconds // 1_000


def format_instant(ms: int) -> str:
    """``2026-11-30T03:11:09.123Z``: the form of every instant the wire carries."""
    at = ms_to_datetime(ms)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def parse_instant(s: str) -> int:
    """An RFC 3339 instant (``2026-11-30T03:11:09.123Z``, ``...:09Z``, ``...+01:00``) as
    milliseconds since the epoch; an instant before the epoch reads as the epoch.

    Raises ``ValueError`` for anything else (the same strict grammar the server applies).
    """
    form = ValueError(f"{s!r} is not an RFC 3339 instant like 2026-11-30T03:11:09.123Z")
    if not (20 <= len(s) <= 64) or not s.isascii():
        raise form

    def num(start: int, length: int) -> int:
        part = s[start : start + length]
        if len(part) != length or not is_ascii_digits(part):
            raise form
        return int(part)

    def sep(at: int, allowed: str) -> None:
        if s[at] not in allowed:
            raise form

    year = num(0, 4)
    sep(4, "-")
    month = num(5, 2)
    sep(7, "-")
    day = num(8, 2)
    sep(10, "Tt")
    hour = num(11, 2)
    sep(13, ":")
    minute = num(14, 2)
    sep(16, ":")
    second = num(17, 2)
    at = 19
    millis = 0
    if s[at] == ".":
        at += 1
        start = at
        while at < len(s) and s[at] in _DIGITS:
            at += 1
        digits = s[start:at]
        if not digits:
            raise form
        millis = int((digits + "00")[:3])
    if at < len(s) and s[at] in "Zz" and at + 1 == len(s):
        offset = 0
    elif at < len(s) and s[at] in "+-" and at + 6 == len(s):
        sep(at + 3, ":")
        oh, om = num(at + 1, 2), num(at + 4, 2)
        if oh > 23 or om > 59:
            raise ValueError(f"{s!r} has an offset out of range")
        offset = (oh * 3600 + om * 60) * (-1 if s[at] == "-" else 1)
    else:
        raise form
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"{s!r} has a time of day out of range")
    try:
        civil = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError:
        raise ValueError(f"{s!r} has a date that does not exist") from None
    ms = calendar.timegm(civil.timetuple()) * 1000 - offset * 1000 + millis
    return max(ms, 0)


_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
_DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
_LONG_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _two(s: str) -> int | None:
    return int(s) if len(s) == 2 and is_ascii_digits(s) else None


def parse_http_date(value: str) -> int | None:
    """An HTTP-date in any of RFC 9110's three forms (IMF-fixdate, RFC 850, asctime) as seconds
    since the epoch; ``None`` when it is not one, names the wrong weekday, or is before 1970."""
    if not value.isascii():
        return None
    s = value.strip()
    fields: tuple[int | None, ...] | None = None
    if len(s) == 29 and s.endswith(" GMT") and s[16] == " " and s[19] == ":" and s[22] == ":":
        # Sun, 06 Nov 1994 08:49:37 GMT
        if s[3:5] == ", " and s[:3] in _DAYS and s[7] == " " and s[11] == " " and s[8:11] in _MONTHS:
            year = int(s[12:16]) if is_ascii_digits(s[12:16]) else None
            fields = (year, _MONTHS.index(s[8:11]) + 1, _two(s[5:7]), _two(s[17:19]), _two(s[20:22]),
                      _two(s[23:25]), _DAYS.index(s[:3]))
    if fields is None:
        # Sunday, 06-Nov-94 08:49:37 GMT
        for wday, name in enumerate(_LONG_DAYS):
            if s.startswith(name + ", "):
                rest = s[len(name) + 2 :]
                if (len(rest) == 22 and rest[12] == ":" and rest[15] == ":" and rest.endswith(" GMT")
                        and rest[2] == "-" and rest[6] == "-" and rest[3:6] in _MONTHS):
                    yy = _two(rest[7:9])
                    year = None if yy is None else yy + (2000 if yy < 70 else 1900)
                    fields = (year, _MONTHS.index(rest[3:6]) + 1, _two(rest[0:2]), _two(rest[10:12]),
                              _two(rest[13:15]), _two(rest[16:18]), wday)
                break
    if fields is None and len(s) == 24 and s[10] == " " and s[13] == ":" and s[16] == ":" and s[19] == " ":
        # Sun Nov  6 08:49:37 1994
        if s[3] == " " and s[:3] in _DAYS and s[7] == " " and s[4:7] in _MONTHS:
            day = (int(s[9]) if s[9] in _DIGITS else None) if s[8] == " " else _two(s[8:10])
            year = int(s[20:24]) if is_ascii_digits(s[20:24]) else None
            fields = (year, _MONTHS.index(s[4:7]) + 1, day, _two(s[11:13]), _two(s[14:16]), _two(s[17:19]),
                      _DAYS.index(s[:3]))
    if fields is None or any(f is None for f in fields):
        return None
    year, month, day, hour, minute, second, wday = (int(f) for f in fields if f is not None)
    if not (1970 <= year <= 9999) or hour > 23 or minute > 59 or second > 59:
        return None
    try:
        civil = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError:
        return None
    if civil.weekday() != wday:
        return None
    return calendar.timegm(civil.timetuple())
