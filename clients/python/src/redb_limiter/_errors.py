"""The errors a caller can branch on: one base class, one subclass per way a call ends
without a grant. Every error that concerns one field of a request names it (``.field``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ._wire import LimitFigures

__all__ = [
    "BadRequest",
    "LimiterError",
    "NoTicket",
    "ProtocolError",
    "QueueFull",
    "QueueTimeout",
    "Refused",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
]

_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?)*)\b")


#: Why a refusal in the limiter's line filed no ticket (wire section 12.9): ``"horizon"`` when
#: the request's own ``retryAt`` lies beyond the host's ``max_wait`` (or the server's horizon,
#: 300 s by default), ``"full"`` when the line already holds 10,000 tickets.
NoTicket = Literal["horizon", "full"]


class LimiterError(Exception):
    """Base of every error this package raises."""


class Refused(LimiterError):
    """The limiter refused (``try_acquire`` only): a limit is full, or a provider's throttle
    closed the caller.

    ``reason`` is ``"rate"``, ``"concurrency"`` or ``"throttle"``; ``limit`` the bucket key
    (for a throttle, the caller key); ``retry_at`` an aware UTC ``datetime``, the earliest
    instant a new ask could be granted; ``retry_after`` the seconds until then as measured on
    the limiter's clock when it answered. ``no_ticket`` (a refusal in the line, as
    :class:`QueueTimeout`'s ``last``) says why the limiter filed no ticket, ``None`` when it did
    not say. ``limits`` holds each limit's figures at the refusal (a window's
    ``used``/``remaining``, a token bucket's ``level``/``burst``, places ``held``/``free``),
    in the request's order, when the limiter reported them.
    """

    def __init__(
        self,
        reason: str,
        limit: str,
        retry_at: datetime,
        retry_after: float,
        *,
        received_at: float = 0.0,
        no_ticket: NoTicket | None = None,
        limits: Sequence[LimitFigures] = (),
    ) -> None:
        why = "" if no_ticket is None else f", no ticket ({no_ticket})"
        super().__init__(f"refused ({reason}) by {limit} until {retry_at.isoformat()}{why}")
        self.reason = reason
        self.limit = limit
        self.retry_at = retry_at
        self.retry_after = retry_after
        self.no_ticket: NoTicket | None = no_ticket
        self.limits: list[LimitFigures] = list(limits)
        #: The host's monotonic clock when the refusal arrived (``time.monotonic()``).
        self.received_at = received_at


class QueueTimeout(LimiterError):
    """No grant within ``max_wait``. ``last`` is the refusal that stood then (``None`` when the
    time ran out in line behind earlier callers of the same request shape); its ``no_ticket`` is
    ``"horizon"`` when the limiter would not queue a call it could not grant within the wait."""

    def __init__(self, waited: float, last: Refused | None) -> None:
        standing = f"; last refusal: {last}" if last is not None else " in line behind earlier callers"
        super().__init__(f"no grant within {waited:.3f} s{standing}")
        self.waited = waited
        self.last = last


class QueueFull(LimiterError):
    """``max_waiters`` callers of this request shape already wait in this process."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} callers already wait for this request shape")
        self.waiting = waiting


class BadRequest(LimiterError, ValueError):
    """A request the limiter (or this client, before sending it) cannot accept; nothing
    changed. ``field`` names the field at fault, as the message does."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if field is None:
            match = _FIELD.match(message)
            field = match.group(1) if match else None
        self.field = field


class Unauthorized(LimiterError):
    """The server has a token and the request carried another, or none (HTTP 401)."""


class Unavailable(LimiterError):
    """The limiter cannot decide now: its store cannot commit, it is shutting down (HTTP 503),
    or (:class:`Unreachable`) it could not be reached at all. Nothing was granted."""


class Unreachable(Unavailable):
    """No answer from the limiter (connection refused, reset or timed out)."""


class ProtocolError(LimiterError):
    """The limiter answered something the wire does not allow."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
