"""Requests as values, validated with the wire's bounds before anything is sent.

Owns :class:`Limit` and the one place every request body is built (both twins call it), so
that a bad value fails here with an error naming the field, and nothing reaches the server.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Dict, Union

from ._errors import BadRequest

__all__ = ["Adapt", "Limit", "Limits", "Costs", "CallOutcome"]

MAX_KEY_BYTES = 512
MAX_PERMIT_BYTES = 128
MAX_LIMITS = 64
MAX_CALLS = 10**9
MAX_PER_MS = 2_678_400_000
MAX_CONCURRENT = 10**6
MAX_COST = 10**9
MAX_HOLD_MS = 86_400_000
MIN_GRACE_MS, MAX_GRACE_MS = 100, 60_000
MAX_WAIT_MS = 86_400_000

#: Real costs after a call: bucket key -> cost in that bucket's window.
Costs = Mapping[str, int]

#: What a granted call met at the provider, for an adaptive ceiling (wire section 14):
#: ``"limited"`` (a 429, or a remaining count at or below the host's floor) cuts it, ``"clean"``
#: may grow it.
CallOutcome = str

MAX_CEILING = 10**9
MAX_INCREASE = 10**6


def check_outcome(outcome: object) -> str | None:
    if outcome is not None and outcome not in ("clean", "limited"):
        raise BadRequest(f"outcome must be 'clean' or 'limited', got {outcome!r}", "outcome")
    return outcome


@dataclass(frozen=True)
class Adapt:
    """An adaptive ceiling on a window or token bucket (wire section 14), kept by the limiter
    and shared by every host that names the bucket so: the limit is judged with the ceiling in
    place of ``calls`` (``refill``), cut to ``keep_pct`` percent of itself on a ``"limited"``
    outcome (once for every grant made before the cut), grown by ``increase`` on ``"clean"``
    ones while it binds, at most once a window, within ``[min, max]``. ``Adapt()`` takes the
    wire's defaults: ``min`` a tenth of ``calls`` (at least 1), ``max`` ``calls``, ``increase``
    1, ``keep_pct`` 50."""

    min: int | None = None
    max: int | None = None
    increase: int | None = None
    keep_pct: int | None = None

    def check(self, where: str, rate: int) -> Adapt:
        if self.min is not None:
            _int(f"{where}min", self.min, 1, rate)
        if self.max is not None:
            _int(f"{where}max", self.max, rate, MAX_CEILING)
        if self.increase is not None:
            _int(f"{where}increase", self.increase, 0, MAX_INCREASE)
        if self.keep_pct is not None:
            _int(f"{where}keep_pct", self.keep_pct, 1, 99)
        return self

    def to_wire(self) -> dict[str, int]:
        body: dict[str, int] = {}
        for name, value in (("min", self.min), ("max", self.max), ("increase", self.increase), ("keepPct", self.keep_pct)):
            if value is not None:
                body[name] = value
        return body


def _int(field: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{field} must be an integer from {low} to {high}, got {value!r}", field)
    return value


def check_key(field: str, value: object, max_bytes: int = MAX_KEY_BYTES) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string, got {type(value).__name__}", field)
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest(f"{field} must be valid UTF-8 text", field) from None
    if not 1 <= size <= max_bytes:
        raise BadRequest(f"{field} must be 1 to {max_bytes} bytes of UTF-8, got {size}", field)
    return value


@dataclass(frozen=True)
class Limit:
    """One bucket a call counts in: a rolling window (``calls`` per ``per_ms``) or a token
    bucket (``refill`` tokens every ``per_ms``, continuously, up to ``burst``), a concurrency
    limit (``concurrency`` places, each lapsing ``hold_ms`` after its grant unless released),
    or a window or token bucket with a concurrency limit. ``cost`` overrides the request's cost
    in this limit's window or token bucket.

    Build one with :meth:`Limit.window`, :meth:`Limit.bucket` or :meth:`Limit.concurrent` (or
    several fields at once).
    Every field is checked against the wire's bounds when a request names the limit, before
    anything is sent, and an error names it by its place in the request (``limits[1].calls``),
    as the server's own errors do.
    """

    key: str
    calls: int | None = None
    per_ms: int | None = None
    concurrency: int | None = None
    cost: int | None = None
    hold_ms: int | None = None
    refill: int | None = None
    burst: int | None = None
    initial: int | None = None
    adapt: Adapt | None = None

    def check(self, where: str = "") -> Limit:
        """Raises :class:`BadRequest` naming the first field out of the wire's bounds, each name
        prefixed with ``where`` (``"limits[1]."``); returns the limit."""
        check_key(f"{where}key", self.key)
        if self.calls is not None and self.refill is not None:
            raise BadRequest(
                f"{where}calls and {where}refill never go together: a limit is a window or a token bucket",
                f"{where}refill",
            )
        rate = "calls" if self.refill is None else "refill"
        if (getattr(self, rate) is None) != (self.per_ms is None):
            given, missing = (rate, "per_ms") if self.per_ms is None else ("per_ms", "calls")
            also = " (or refill)" if missing == "calls" else ""
            raise BadRequest(f"{where}{missing}{also} is required with {where}{given}", f"{where}{missing}")
        if self.per_ms is not None:
            _int(f"{where}{rate}", getattr(self, rate), 1, MAX_CALLS)
            _int(f"{where}per_ms", self.per_ms, 1, MAX_PER_MS)
        for name in ("burst", "initial"):
            if getattr(self, name) is not None and self.refill is None:
                raise BadRequest(f"{where}{name} needs refill (a token bucket)", f"{where}{name}")
        if self.burst is not None:
            _int(f"{where}burst", self.burst, 1, MAX_CALLS)
        if self.initial is not None:
            _int(f"{where}initial", self.initial, 0, self.burst if self.burst is not None else self.refill or 0)
        if self.concurrency is not None:
            _int(f"{where}concurrency", self.concurrency, 1, MAX_CONCURRENT)
        if self.per_ms is None and self.concurrency is None:
            named = where[:-1] if where else "a limit"
            raise BadRequest(
                f"{named} needs a window (calls and per_ms), a token bucket (refill and per_ms), a concurrency, "
                "or one of the first two with a concurrency",
                f"{where}calls",
            )
        if self.cost is not None:
            _int(f"{where}cost", self.cost, 0, MAX_COST)
        if self.hold_ms is not None:
            _int(f"{where}hold_ms", self.hold_ms, 1, MAX_HOLD_MS)
        if self.adapt is not None:
            if not isinstance(self.adapt, Adapt):
                raise BadRequest(f"{where}adapt must be an Adapt, got {type(self.adapt).__name__}", f"{where}adapt")
            if self.per_ms is None:
                raise BadRequest(
                    f"{where}adapt needs a window (calls and per_ms) or a token bucket (refill and per_ms)",
                    f"{where}adapt",
                )
            self.adapt.check(f"{where}adapt.", getattr(self, rate))
        return self

    @property
    def has_window(self) -> bool:
        """Whether the limit counts costs: a window or a token bucket (what a settle names)."""
        return self.per_ms is not None

    @classmethod
    def window(cls, key: str, calls: int, per_ms: int, cost: int | None = None, adapt: Adapt | None = None) -> Limit:
        """At most ``calls`` (counting each call's cost) in any stretch of ``per_ms``; with
        ``adapt``, at most the ceiling the limiter keeps for the bucket (wire section 14)."""
        return cls(key, calls=calls, per_ms=per_ms, cost=cost, adapt=adapt)

    @classmethod
    def bucket(
        cls,
        key: str,
        refill: int,
        per_ms: int,
        burst: int | None = None,
        initial: int | None = None,
        cost: int | None = None,
        adapt: Adapt | None = None,
    ) -> Limit:
        """A token bucket (wire section 13): ``refill`` tokens every ``per_ms``, added
        continuously, up to ``burst`` (default ``refill``). It holds ``initial`` (default
        ``burst``: full) the first time it is named. A call takes its cost from it, and waits
        while it holds less (a cost above ``burst`` waits for a full bucket)."""
        return cls(key, per_ms=per_ms, cost=cost, refill=refill, burst=burst, initial=initial, adapt=adapt)

    @classmethod
    def concurrent(cls, key: str, n: int, hold_ms: int | None = None) -> Limit:
        """At most ``n`` places held at once; a place not released lapses after ``hold_ms``."""
        return cls(key, concurrency=n, hold_ms=hold_ms)

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"key": self.key}
        if self.calls is not None:
            body["calls"] = self.calls
        if self.refill is not None:
            body["refill"] = self.refill
        if self.per_ms is not None:
            body["perMs"] = self.per_ms
        if self.burst is not None:
            body["burst"] = self.burst
        if self.initial is not None:
            body["initial"] = self.initial
        if self.concurrency is not None:
            body["concurrent"] = self.concurrency
        if self.cost is not None:
            body["cost"] = self.cost
        if self.hold_ms is not None:
            body["holdMs"] = self.hold_ms
        if self.adapt is not None:
            body["adapt"] = self.adapt.to_wire()
        return body


#: One limit or several.
Limits = Union[Limit, Sequence[Limit]]


@dataclass(frozen=True)
class AcquireRequest:
    """An acquire's params, validated: what every twin sends to ``/acquire`` and ``/peek``."""

    key: str
    limits: tuple[Limit, ...]
    cost: int
    hold_ms: int | None
    grace_ms: int | None
    permit: bool

    @classmethod
    def build(
        cls,
        key: str,
        limits: Limits,
        cost: int = 1,
        *,
        hold_ms: int | None = None,
        grace_ms: int | None = None,
        permit: bool = False,
    ) -> AcquireRequest:
        check_key("key", key)
        if isinstance(limits, Limit):
            limits = (limits,)
        if isinstance(limits, (str, bytes)) or not isinstance(limits, Sequence):
            raise BadRequest("limits must be a Limit or a sequence of Limit", "limits")
        if len(limits) > MAX_LIMITS:
            raise BadRequest(f"limits must have at most {MAX_LIMITS} entries, got {len(limits)}", "limits")
        seen: dict[str, int] = {}
        for i, limit in enumerate(limits):
            if not isinstance(limit, Limit):
                raise BadRequest(f"limits[{i}] must be a Limit, got {type(limit).__name__}", f"limits[{i}]")
            limit.check(f"limits[{i}].")
            if limit.key in seen:
                raise BadRequest(f"limits[{i}].key repeats limits[{seen[limit.key]}].key", f"limits[{i}].key")
            seen[limit.key] = i
        _int("cost", cost, 0, MAX_COST)
        if hold_ms is not None:
            _int("hold_ms", hold_ms, 1, MAX_HOLD_MS)
        if grace_ms is not None:
            _int("grace_ms", grace_ms, MIN_GRACE_MS, MAX_GRACE_MS)
        return cls(key, tuple(limits), cost, hold_ms, grace_ms, bool(permit))

    @property
    def adapts(self) -> bool:
        """Whether a limit of the request adapts a ceiling (wire section 14)."""
        return any(limit.adapt is not None for limit in self.limits)

    @property
    def buckets(self) -> tuple[str, ...]:
        """The buckets named: a release of a grant of this request may let through a waiter
        on any of them."""
        return tuple(limit.key for limit in self.limits)

    @property
    def shape(self) -> str:
        """Waiters queue per shape: the caller key and the buckets named, whatever the costs,
        so a large call at the head of the line is never overtaken by smaller ones."""
        return "\0".join([self.key, *(limit.key for limit in self.limits)])

    def body(
        self,
        *,
        ask_id: str | None = None,
        queue: bool = False,
        ticket: str | None = None,
        report: bool = False,
        max_wait: float | None = None,
    ) -> dict[str, Any]:
        """The wire's body. ``ask_id`` names this ask (wire section 16: a fresh id for every ask,
        the same for a retry of it). In the line (``queue`` or a ``ticket``), ``max_wait`` is the
        seconds left of the caller's wait, sent as ``maxWaitMs`` so that the limiter files no
        ticket for a call it could not grant in time (wire section 12.9)."""
        body: dict[str, Any] = {"key": self.key, "limits": [limit.to_wire() for limit in self.limits]}
        if ask_id is not None:
            body["id"] = ask_id
        if self.cost != 1:
            body["cost"] = self.cost
        if self.hold_ms is not None:
            body["holdMs"] = self.hold_ms
        # An adapted limit's signals travel on a permit (wire section 14): asked for by itself.
        if self.permit or self.adapts:
            body["permit"] = True
        if report:
            body["report"] = True
        if ticket is not None:
            body["ticket"] = ticket
        elif queue:
            body["queue"] = True
        if (queue or ticket is not None) and self.grace_ms is not None:
            body["graceMs"] = self.grace_ms
        if (queue or ticket is not None) and max_wait is not None:
            body["maxWaitMs"] = wait_ms(max_wait)
        return body


    def undo_body(self, ask_id: str) -> dict[str, Any]:
        """``release {id}`` for an ask whose answer was lost: it frees whatever that ask got (a
        place, a ticket), and costs of 0 in every window and token bucket make a call that was
        never made count nowhere (wire section 16); a limit with neither is named in none."""
        body: dict[str, Any] = {"id": ask_id}
        windows = [{"key": limit.key, "cost": 0} for limit in self.limits if limit.has_window]
        if windows:
            body["costs"] = windows
        return body


def new_ask_id() -> str:
    """A fresh id for one ask: 32 random hex digits (wire section 16 takes 1-128 bytes)."""
    return uuid.uuid4().hex


def wait_ms(seconds: float) -> int:
    """Seconds of waiting as the wire's ``maxWaitMs``: whole milliseconds rounded up (a float's
    last bits aside), within 1 to 86,400,000."""
    return min(max(math.ceil(round(seconds * 1000, 6)), 1), MAX_WAIT_MS)


def permit_id(field: str, value: object) -> str:
    """A permit (or ticket) id as the wire takes it: 1-128 bytes."""
    return check_key(field, value, MAX_PERMIT_BYTES)


def costs_body(costs: Costs) -> list[Dict[str, Any]]:
    """``costs`` as the wire's list, checked: 1-64 entries, keys 1-512 bytes, costs 0-10^9."""
    if not isinstance(costs, Mapping):
        raise BadRequest("costs must be a mapping of bucket key to cost", "costs")
    if not 1 <= len(costs) <= MAX_LIMITS:
        raise BadRequest(f"costs must have 1 to {MAX_LIMITS} entries, got {len(costs)}", "costs")
    out = []
    for key, cost in costs.items():
        check_key(f"costs[{key!r}]", key)
        out.append({"key": key, "cost": _int(f"costs[{key!r}]", cost, 0, MAX_COST)})
    return out
