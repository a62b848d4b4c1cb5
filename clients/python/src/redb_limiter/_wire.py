"""The one reply parser both twins share: JSON bodies of the wire into values and errors.

It reads no clock and does no I/O: an HTTP status and a body in, a value or an exception out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, List, Optional, Union

from ._errors import BadRequest, LimiterError, NoTicket, ProtocolError, Unauthorized, Unavailable
from ._time import ms_to_datetime, parse_instant, parse_http_date

__all__ = ["Grant", "LimitFigures", "Peek", "Refusal"]


@dataclass(frozen=True)
class Grant:
    """A grant: its instant on the limiter's clock, the permit id when it holds one, and each
    limit's figures after it when the acquire asked for a report."""

    at_ms: int
    permit: str | None
    now_ms: int | None = None
    limits: tuple[LimitFigures, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """A refusal as the wire gives it, with the line's fields when a ticket was filed, and
    ``no_ticket`` when the limiter says why it filed none."""

    retry_at_ms: int
    reason: str
    limit: str
    now_ms: int | None = None
    ticket: str | None = None
    lapse_at_ms: int | None = None
    ahead: int | None = None
    no_ticket: NoTicket | None = None
    limits: tuple[LimitFigures, ...] = ()


@dataclass(frozen=True)
class LimitFigures:
    """How full one limit is: a window's ``used``/``remaining``, a token bucket's
    ``level``/``burst`` (``level`` in whole tokens, rounded down, negative while a settle left it
    in debt), a concurrency limit's ``held``/``free``, and the live tickets in its line
    (``queued``) when the limiter keeps one."""

    key: str
    used: int | None = None
    remaining: int | None = None
    held: int | None = None
    free: int | None = None
    queued: int | None = None
    level: int | None = None
    burst: int | None = None
    #: An adapted limit's ceiling, as the request is judged (wire section 14).
    ceiling: int | None = None


@dataclass(frozen=True)
class Peek:
    """Would an acquire be granted now, and how full is each limit. ``reason``, ``limit`` and
    ``retry_at`` are what that acquire would have been refused with (``None`` when it fits)."""

    fits: bool
    now: datetime
    limits: List[LimitFigures] = field(default_factory=list)
    reason: Optional[str] = None
    limit: Optional[str] = None
    retry_at: Optional[datetime] = None


Outcome = Union[Grant, Refusal]


def _instant(data: dict[str, Any], name: str, method: str) -> int:
    value = data.get(name)
    if not isinstance(value, str):
        raise ProtocolError(f"{method}: {name} must be an instant, got {value!r}")
    try:
        return parse_instant(value)
    except ValueError as e:
        raise ProtocolError(f"{method}: {name}: {e}") from None


def _opt_instant(data: dict[str, Any], name: str, method: str) -> int | None:
    return None if data.get(name) is None else _instant(data, name, method)


def _str(data: dict[str, Any], name: str, method: str) -> str:
    value = data.get(name)
    if not isinstance(value, str):
        raise ProtocolError(f"{method}: {name} must be a string, got {value!r}")
    return value


def _opt_int(data: dict[str, Any], name: str) -> int | None:
    value = data.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(data: dict[str, Any], name: str, method: str) -> bool:
    value = data.get(name)
    if not isinstance(value, bool):
        raise ProtocolError(f"{method}: {name} must be a boolean, got {value!r}")
    return value


_REASONS = ("rate", "concurrency", "throttle")


def _no_ticket(value: object) -> NoTicket | None:
    # A cause this client does not know (a later wire) reads as unsaid: no ticket is no ticket.
    if value == "horizon":
        return "horizon"
    if value == "full":
        return "full"
    return None


def parse_refusal(data: dict[str, Any], method: str) -> Refusal:
    reason = _str(data, "reason", method)
    if reason not in _REASONS:
        raise ProtocolError(f"{method}: unknown reason {reason!r}")
    ticket = data.get("ticket")
    return Refusal(
        retry_at_ms=_instant(data, "retryAt", method),
        reason=reason,
        limit=_str(data, "limit", method),
        now_ms=_opt_instant(data, "now", method),
        ticket=ticket if isinstance(ticket, str) and ticket else None,
        lapse_at_ms=_opt_instant(data, "lapseAt", method),
        ahead=_opt_int(data, "ahead"),
        no_ticket=_no_ticket(data.get("noTicket")),
        limits=tuple(_limits(data, method)),
    )


def parse_acquire(data: dict[str, Any]) -> Outcome:
    if _bool(data, "granted", "acquire"):
        permit = data.get("permit")
        if permit is not None and not isinstance(permit, str):
            raise ProtocolError(f"acquire: permit must be a string, got {permit!r}")
        return Grant(
            _instant(data, "at", "acquire"), permit, _opt_instant(data, "now", "acquire"), tuple(_limits(data, "acquire"))
        )
    return parse_refusal(data, "acquire")


def _limits(data: dict[str, Any], method: str) -> list[LimitFigures]:
    """The figures of a peek or a reported acquire (none when the reply has none)."""
    raw = data.get("limits", [])
    if not isinstance(raw, list):
        raise ProtocolError(f"{method}: limits must be a list")
    return [_figures(entry, method) for entry in raw]


def _figures(entry: object, method: str) -> LimitFigures:
    if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
        raise ProtocolError(f"{method}: each of limits must be an object with a key, got {entry!r}")
    return LimitFigures(
        key=entry["key"],
        used=_opt_int(entry, "used"),
        remaining=_opt_int(entry, "remaining"),
        held=_opt_int(entry, "held"),
        free=_opt_int(entry, "free"),
        queued=_opt_int(entry, "queued"),
        level=_opt_int(entry, "level"),
        burst=_opt_int(entry, "burst"),
        ceiling=_opt_int(entry, "ceiling"),
    )


def parse_peek(data: dict[str, Any]) -> Peek:
    fits = _bool(data, "fits", "peek")
    now = ms_to_datetime(_instant(data, "now", "peek"))
    figures = _limits(data, "peek")
    if fits:
        return Peek(True, now, figures)
    refusal = parse_refusal(data, "peek")
    return Peek(False, now, figures, refusal.reason, refusal.limit, ms_to_datetime(refusal.retry_at_ms))


def parse_bool(data: dict[str, Any], name: str, method: str) -> bool:
    return _bool(data, name, method)


def parse_throttle(data: dict[str, Any]) -> datetime | None:
    until = _opt_instant(data, "until", "throttle")
    return None if until is None else ms_to_datetime(until)


def parse_wait(data: dict[str, Any]) -> bool:
    """A ``/wait`` answer (wire section 15): whether a ticket it named is ready or gone (then
    the head asks again at once); ``False`` for empty lists (its time passed, or the limiter
    answered at once: past its bound on waits, or shutting down)."""
    ready, gone = data.get("ready"), data.get("gone")
    if not isinstance(ready, list) or not isinstance(gone, list):
        raise ProtocolError(f"wait: the reply names no ready and gone lists: {data!r}"[:300])
    return bool(ready or gone)


def decode(method: str, status: int, content: bytes) -> dict[str, Any]:
    """The JSON object of a 200 reply, or the error a non-200 reply stands for."""
    try:
        data = json.loads(content.decode("utf-8")) if content else None
    except (ValueError, RecursionError):
        data = None
    if status == 200:
        if not isinstance(data, dict):
            raise ProtocolError(f"{method}: the reply is not a JSON object: {content[:200]!r}", status)
        return data
    raise error_from(method, status, content, data)


def error_from(method: str, status: int, content: bytes, data: object = None) -> LimiterError:
    """The typed error of a non-200 reply (``{"error": {"code", "message"}}``)."""
    message = content.decode("utf-8", "replace")[:500]
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        text = data["error"].get("message")
        if isinstance(text, str):
            message = text
    if status == 400:
        return BadRequest(message)
    if status == 401:
        return Unauthorized(f"{method}: {message}")
    if status == 503:
        return Unavailable(f"{method}: {message}")
    return ProtocolError(f"{method} answered {status}: {message}", status)


def date_header_ms(value: str | None) -> int | None:
    """The HTTP ``Date`` header in milliseconds since the epoch (second precision)."""
    if value is None:
        return None
    seconds = parse_http_date(value)
    return None if seconds is None else seconds * 1000
