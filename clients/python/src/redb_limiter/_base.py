"""What the twins share: the configuration, the clocks, the limiter's clock as seen from the
host, the waiting rules of one ``acquire`` (a pure state machine) and the reading of a
provider's response. :class:`~redb_limiter.Limiter` and :class:`~redb_limiter.AsyncLimiter`
add only their transport (``httpx.Client``; the limiter's own connections, or the
``httpx.AsyncClient`` a host passes) and how they sleep.

Nothing here does I/O; only the clock seam (:class:`Clock`) reads the host's clocks.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional, Tuple

import httpx

from ._errors import BadRequest, QueueTimeout, Refused, Unauthorized, Unavailable, Unreachable
from ._request import AcquireRequest, Costs, Limits, check_key, check_outcome, costs_body, new_ask_id, permit_id
from ._time import datetime_to_ms, format_instant, ms_to_datetime, parse_instant
from ._transport import ConnectionLost, TransportTimeout
from ._wire import LimitFigures, Refusal, date_header_ms
from .vendor import Headers, vendor_budget_ms, vendor_outcome, vendor_wait_ms

log = logging.getLogger("redb_limiter")

__all__ = ["Clock", "WaitReport"]

#: The bound, in seconds, on each clean-up sent after giving up (``release {id}``, leaving the
#: line), and on the wait for a late answer to an abandoned ask.
UNDO_SECONDS = 2.0
#: An ask in flight is abandoned when ``max_wait`` runs out, but is always given this long.
MIN_ASK_SECONDS = 0.1
#: A head holding a ticket waits on ``/wait`` (wire section 15) for at most this long at a time,
#: and not at all when less than :data:`MIN_WAIT_SECONDS` remains of its ``max_wait``.
WAIT_ROUND_SECONDS = 25.0
MIN_WAIT_SECONDS = 1.0
#: The HTTP bound on a ``/wait``: its own time and this margin for the answer.
WAIT_MARGIN_SECONDS = 5.0


class Clock:
    """The host's clocks, as the clients read them. Subclass it to test a host whose wall clock
    is off, or to watch the sleeps; the default reads the real clocks. With wakes (the
    default) a wait is timed on :meth:`monotonic` and ended by a wake; :meth:`sleep` and
    :meth:`asleep` are the waits of a limiter made with ``wakes=False``."""

    def wall(self) -> float:
        """Seconds since the epoch (``time.time()``)."""
        return time.time()

    def monotonic(self) -> float:
        """A clock that never steps (``time.monotonic()``): deadlines are measured on it."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)



@dataclass(frozen=True)
class WaitReport:
    """One wait, as the ``on_wait`` hook sees it: how long (seconds), why, and the limit key
    (for a throttle, the caller key) whose ``retryAt`` was slept on."""

    waited: float
    reason: str
    limit: str


class ServerClock:
    """The limiter's clock as the host sees it: the host's wall clock plus a skew learned from
    replies. A reply's own ``now`` (a queued refusal, a reported acquire, a peek) sets it to the
    millisecond; otherwise the HTTP ``Date`` header (whole seconds) bounds it: the host's
    reading is kept while it agrees with ``Date`` and pulled inside its second when it does not,
    so a host whose clock is off still sleeps the right time."""

    def __init__(self) -> None:
        self.skew_ms = 0.0

    def observe(self, sent_ms: float, received_ms: float, now_ms: int | None, date_ms: int | None) -> float:
        """The limiter's clock when a reply arrived, in ms since the epoch; learns the skew."""
        if now_ms is not None:
            estimate = float(now_ms)
        else:
            estimate = received_ms + self.skew_ms
            if date_ms is not None:
                # Stamped between sending and receiving, with second precision.
                latest = date_ms + 1000 + max(received_ms - sent_ms, 0.0)
                estimate = min(max(estimate, float(date_ms)), latest)
        self.skew_ms = estimate - received_ms
        return estimate

    def now_ms(self, wall_ms: float) -> int:
        return int(wall_ms + self.skew_ms)


def check_seconds(field: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
        raise BadRequest(f"{field} must be a finite number of seconds, at least 0, got {value!r}", field)
    return float(value)


def check_max_waiters(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise BadRequest(f"max_waiters must be an integer of at least 1, got {value!r}", "max_waiters")
    return value


def refused(refusal: Refusal, server_now_ms: float, received_at: float) -> Refused:
    return Refused(
        refusal.reason,
        refusal.limit,
        ms_to_datetime(refusal.retry_at_ms),
        max(refusal.retry_at_ms - server_now_ms, 0.0) / 1000,
        received_at=received_at,
        no_ticket=refusal.no_ticket,
        limits=refusal.limits,
    )


class Wait:
    """The rules of one waiting acquire, apart from any I/O: what to send next (with the ticket
    once the limiter filed one, and what remains of ``max_wait`` as ``maxWaitMs``), and after
    each refusal, how long to sleep on the limiter's clock, or that ``max_wait`` cannot be met
    (then :class:`QueueTimeout` at once, rather than a sleep past the deadline)."""

    def __init__(
        self,
        request: AcquireRequest,
        queue: bool,
        started: float,
        deadline: float | None,
        new_id: Callable[[], str] = new_ask_id,
    ) -> None:
        self.request = request
        self.queue = queue
        self.started = started
        self.deadline = deadline
        self.new_id = new_id
        self.ticket: str | None = None
        self.last: Refused | None = None

    def body(self, monotonic: float) -> dict[str, Any]:
        """The next ask, at ``monotonic`` on the host's clock, under a fresh id (wire section 16:
        an ask again at a new ``retryAt`` is a new ask)."""
        # `report` makes every answer carry the limiter's `now`, to size sleeps on its clock.
        left = None if self.deadline is None else self.deadline - monotonic
        return self.request.body(ask_id=self.new_id(), queue=self.queue, ticket=self.ticket, report=True, max_wait=left)

    def ask_seconds(self, monotonic: float) -> float | None:
        """How long an ask sent at ``monotonic`` may stay in flight before ``max_wait`` ends it
        (at least :data:`MIN_ASK_SECONDS`); ``None`` without a deadline."""
        return None if self.deadline is None else max(self.deadline - monotonic, MIN_ASK_SECONDS)

    def over(self, monotonic: float) -> bool:
        """Whether ``max_wait`` has run out."""
        return self.deadline is not None and monotonic >= self.deadline

    def granted(self) -> None:
        self.ticket = None  # a grant ends the ticket

    def refused(self, refusal: Refusal, server_now_ms: float, monotonic: float) -> float:
        """The seconds to sleep before asking again; raises :class:`QueueTimeout`."""
        if refusal.ticket is not None:
            self.ticket = refusal.ticket
        elif refusal.no_ticket is not None or refusal.reason != "throttle":
            # Lapsed, or none filed (`no_ticket`: beyond the horizon, or the line is full): hold
            # nothing stale, and wait as plain hosts do, asking to join the line again.
            self.ticket = None
        self.last = refused(refusal, server_now_ms, monotonic)
        seconds = max(refusal.retry_at_ms - server_now_ms, 1.0) / 1000
        if self.deadline is not None and monotonic + seconds > self.deadline:
            raise self.timeout(monotonic)
        return seconds

    def timeout(self, monotonic: float) -> QueueTimeout:
        return QueueTimeout(monotonic - self.started, self.last)

    def wait_seconds(self, monotonic: float) -> float | None:
        """How long the head may wait on ``/wait`` for its ticket now: at most
        :data:`WAIT_ROUND_SECONDS` and what remains of ``max_wait``; ``None`` without a ticket
        or with less than :data:`MIN_WAIT_SECONDS` left (then it sleeps to ``retryAt``)."""
        if self.ticket is None:
            return None
        seconds = WAIT_ROUND_SECONDS if self.deadline is None else min(self.deadline - monotonic, WAIT_ROUND_SECONDS)
        return seconds if seconds >= MIN_WAIT_SECONDS else None


class _WaitCall:
    """One ``/wait`` of a head's for ``ticket``: ``done`` once answered (or failed), ``ready``
    when it named the ticket ready or gone."""

    __slots__ = ("ticket", "done", "ready")

    def __init__(self, ticket: str) -> None:
        self.ticket = ticket
        self.done = False
        self.ready = False


def capped_timeout(timeout: httpx.Timeout, seconds: float) -> tuple[httpx.Timeout, bool]:
    """An HTTP client's timeouts, each at most ``seconds``, and whether that cut the read's."""

    def cap(phase: float | None) -> float:
        return seconds if phase is None else min(phase, seconds)

    capped = timeout.read is None or seconds < timeout.read
    phases = httpx.Timeout(
        connect=cap(timeout.connect), read=cap(timeout.read), write=cap(timeout.write), pool=cap(timeout.pool)
    )
    return phases, capped


def wait_body(ticket: str, seconds: float) -> dict[str, Any]:
    """A ``/wait`` for one ticket, for ``seconds`` (within the wire's 1 to 60 s)."""
    return {"tickets": [ticket], "timeoutMs": min(max(int(seconds * 1000), 1_000), 60_000)}


def wait_timeout(seconds: float) -> httpx.Timeout:
    """The HTTP bound on a ``/wait`` of ``seconds``, whatever the client's own timeout."""
    return httpx.Timeout(seconds + WAIT_MARGIN_SECONDS)


def lost_answer(error: Unreachable) -> bool:
    """The connection dropped after the ask may have reached the limiter and before any answer
    came back (not a timeout): the one failure an ask is retried after, with its id."""
    return isinstance(error.__cause__, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, ConnectionLost))


def timed_out(error: Unreachable) -> bool:
    return isinstance(error.__cause__, (httpx.TimeoutException, TransportTimeout))


def answered(error: BaseException) -> bool:
    """The limiter answered the ask with an error (400, 401, 503): it granted and filed nothing,
    so there is nothing to undo."""
    if isinstance(error, Unreachable):
        return False
    return isinstance(error, (BadRequest, Unauthorized, Unavailable))


# A bearer token as the Authorization header carries it: visible ASCII, inner spaces allowed.
_TOKEN = re.compile(r"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")


def check_token(token: str | None) -> str | None:
    if token is None:
        return None
    if not isinstance(token, str) or not token.strip():
        raise BadRequest("token must be a non-empty string or None", "token")
    if token != token.strip():
        raise BadRequest("token must not begin or end with whitespace (the server trims its own)", "token")
    if not _TOKEN.fullmatch(token):
        raise BadRequest("token must be printable ASCII (it travels as an Authorization header)", "token")
    return token


def check_url(url: str) -> httpx.URL:
    """The server's address: an ``http://`` or ``https://`` URL (any case), with or without a
    path, query or trailing slash; the fragment is dropped."""
    bad = BadRequest(f"url must be an http:// or https:// URL, got {url!r}", "url")
    if not isinstance(url, str):
        raise bad
    try:
        parsed = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError, ValueError):
        raise bad from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise bad
    return parsed.copy_with(path=parsed.path.rstrip("/") or "/", fragment=None)


def response_parts(response: object) -> Tuple[int, Headers, bytes]:
    """Status, headers and (when read) body of a provider's response: an ``httpx.Response``
    (or one of httpx's forks', as the OpenAI and Anthropic SDKs use), or an SDK's error that
    carries one as ``.response`` (``openai.RateLimitError``, ``anthropic.RateLimitError``)."""
    inner = getattr(response, "response", None)
    if inner is not None and isinstance(getattr(inner, "status_code", None), int):
        response = inner
    status = getattr(response, "status_code", None)
    headers = getattr(response, "headers", None)
    if not isinstance(status, int) or headers is None:
        raise TypeError(f"expected an HTTP response (or an error carrying one), got {type(response).__name__}")
    try:
        body = getattr(response, "content", b"")
    except Exception:  # the body was not read (httpx's ResponseNotRead, or its forks')
        body = b""
    return status, headers, body if isinstance(body, bytes) else b""


def throttle_until_ms(status: int, headers: Headers, body: bytes, now_ms: int, default_ms: int) -> int | None:
    """Until when a provider's answer closes its caller: a 429 for the wait it asked, a success
    reporting an exhausted budget until the reset; ``None`` for anything else."""
    if status == 429:
        return now_ms + vendor_wait_ms(headers, body, now=ms_to_datetime(now_ms), default_ms=default_ms)
    if 200 <= status < 300:
        return vendor_budget_ms(headers, now_ms)
    return None


class PermitOutcome:
    """What a permit of either twin reports to adaptive ceilings (wire section 14): the outcome
    its call met, read from the provider's answer by :meth:`observe` or said outright."""

    limits: list[LimitFigures]
    #: ``"limited"`` or ``"clean"`` once :meth:`observe` read an answer that says so.
    outcome: str | None = None

    @property
    def adapted(self) -> bool:
        """Whether a limit of the grant adapts a ceiling: its release then reports an outcome,
        ``"clean"`` unless the call was seen ``"limited"``."""
        return any(f.ceiling is not None for f in self.limits)

    def observe(self, response: object, *, floor: int | None = None) -> str | None:
        """Reads the provider's answer to this call (an ``httpx.Response``, or an SDK error
        carrying one): a 429, or a success whose remaining requests are at or below ``floor``,
        makes the outcome ``"limited"`` (which stays); any other success ``"clean"``; another
        failure says nothing. The outcome goes with the release (or settle). Returns what this
        answer said."""
        status, headers, _ = response_parts(response)
        seen = vendor_outcome(status, headers, floor=floor)
        if seen == "limited" or (seen == "clean" and self.outcome is None):
            self.outcome = seen
        return seen

    def _release_outcome(self, outcome: str | None, failed: bool = False) -> str | None:
        """The outcome a release sends: the one given, else the one observed, else ``"clean"``
        for an adapted grant whose call did not fail."""
        check_outcome(outcome)
        if outcome is not None:
            return outcome
        if self.outcome is not None or failed:
            return self.outcome
        return "clean" if self.adapted else None


class LimiterBase:
    """The configuration and the request builders both twins share."""

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float | None,
        max_waiters: int | None,
        clock: Clock | None,
        on_wait: Optional[Callable[[WaitReport], None]],
        wakes: bool = True,
    ) -> None:
        self._base = check_url(url)
        #: The server's address, as given (normalised: lower-case scheme, no trailing slash).
        self.url = str(self._base) if self._base.query else str(self._base).rstrip("/")
        self.token = check_token(token)
        self.timeout = check_seconds("timeout", timeout)
        self.max_waiters = check_max_waiters(max_waiters)
        self.clock = clock if clock is not None else Clock()
        self.on_wait = on_wait
        self._server = ServerClock()
        #: Whether a waiting head is woken by releases (its own process's, and the limiter's
        #: ``/wait``); without, it sleeps to each ``retryAt`` (as clients before wire 4 did).
        self.wakes = bool(wakes)
        #: The limiter answered ``/wait`` with 404 (no wire section 15): not asked again.
        self._no_waits = False
        #: Where ask ids come from (a fresh one per ask); tests may replace it.
        self._new_id: Callable[[], str] = new_ask_id

    def _method_url(self, method: str) -> httpx.URL:
        """``/method`` under the server's address (its path kept, its query kept)."""
        return self._base.copy_with(path=f"{self._base.path.rstrip('/')}/{method}")

    def _headers(self) -> dict[str, str]:
        return {} if self.token is None else {"Authorization": f"Bearer {self.token}"}

    def _observe(self, sent_wall: float, date: str | None, data: Mapping[str, Any]) -> float:
        """Learns the limiter's clock from a reply (its ``now``, else its ``Date`` header);
        returns its ``now`` at receipt, in ms."""
        now = data.get("now")
        now_ms: int | None = None
        if isinstance(now, str):
            try:
                now_ms = parse_instant(now)
            except ValueError:
                now_ms = None
        return self._server.observe(
            sent_wall * 1000, self.clock.wall() * 1000, now_ms, date_header_ms(date)
        )

    def server_now(self) -> datetime:
        """The limiter's clock as this host estimates it from the replies so far."""
        return ms_to_datetime(self._server.now_ms(self.clock.wall() * 1000))

    def waiting(self, key: str, limits: Limits) -> int:
        """How many callers in this process wait for this request shape (the head included)."""
        return self._lines_waiting(AcquireRequest.build(key, limits).shape)

    def _lines_waiting(self, shape: str) -> int:
        raise NotImplementedError

    def _report(self, seconds: float, refusal: Refused | None) -> None:
        if self.on_wait is not None and refusal is not None:
            self.on_wait(WaitReport(seconds, refusal.reason, refusal.limit))

    @staticmethod
    def _release_body(permit: str, costs: Costs | None, outcome: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"permit": permit_id("permit", permit)}
        if costs is not None:
            body["costs"] = costs_body(costs)
        if check_outcome(outcome) is not None:
            body["outcome"] = outcome
        return body

    @staticmethod
    def _settle_body(permit: str, costs: Costs, outcome: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"permit": permit_id("permit", permit), "costs": costs_body(costs)}
        if check_outcome(outcome) is not None:
            body["outcome"] = outcome
        return body

    def _throttle_body(self, key: str, until: datetime, permit: str | None = None) -> dict[str, Any]:
        check_key("key", key)
        body: dict[str, Any] = {"key": key, "until": format_instant(max(datetime_to_ms(until, "until"), 0))}
        if permit is not None:
            body["permit"] = permit_id("permit", permit)
        return body

    def _throttle_from_until(self, response: object, default_ms: int) -> int | None:
        status, headers, body = response_parts(response)
        now_ms = self._server.now_ms(self.clock.wall() * 1000)
        return throttle_until_ms(status, headers, body, now_ms, default_ms)
