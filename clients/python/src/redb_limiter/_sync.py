"""The blocking twin: :class:`Limiter` over ``httpx.Client``, and its :class:`Permit`.

Every method has its twin of the same name in :mod:`redb_limiter._async`; both build their
requests and read their replies through the shared modules, and differ only in how they send
and sleep.

Every way out of a wait is a clean one: a timeout, ``max_wait`` (enforced while an ask is in
flight too), a connection error, Ctrl-C or any other exception leaves the in-process line and
the limiter's, and an ask whose answer was lost is undone by its id (wire section 16) in a
thread of its own, bounded in time, which :meth:`Limiter.close` waits for.
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections.abc import Callable
from datetime import datetime
from typing import Any, Optional, Type, TypeVar, cast

import httpx

from ._base import (
    UNDO_SECONDS,
    PermitOutcome,
    Clock,
    _WaitCall,
    LimiterBase,
    Wait,
    WaitReport,
    answered,
    capped_timeout,
    check_max_waiters,
    check_seconds,
    log,
    lost_answer,
    refused,
    timed_out,
    wait_body,
    wait_timeout,
)
from ._errors import LimiterError, ProtocolError, QueueTimeout, Unreachable
from ._lines import SyncLines, _Line, _Turn
from ._request import AcquireRequest, Costs, Limits, check_key, check_outcome
from ._time import ms_to_datetime
from ._wire import Grant, LimitFigures, Outcome, Peek, decode, parse_acquire, parse_bool, parse_peek, parse_throttle, parse_wait

__all__ = ["Limiter", "Permit"]

F = TypeVar("F", bound=Callable[..., Any])


class Permit(PermitOutcome):
    """A grant. Use it as a context manager: on exit its places are released (after a settle
    in the body, the settled costs stand), whether the body returned or raised.

    ``at`` is the grant's instant on the limiter's clock; ``id`` the permit id (``None`` when
    the grant holds no place and was not asked for one)."""

    def __init__(self, limiter: Limiter, grant: Grant, buckets: tuple[str, ...]) -> None:
        self._limiter = limiter
        self._buckets = buckets
        self.at: datetime = ms_to_datetime(grant.at_ms)
        self.id: str | None = grant.permit
        #: Each limit's figures after the grant (a window's ``used``/``remaining``, a token
        #: bucket's ``level``/``burst``, places ``held``/``free``), in the request's order.
        self.limits: list[LimitFigures] = list(grant.limits)
        self.released = False
        #: The costs of the latest successful settle, if any.
        self.costs: dict[str, int] | None = None

    def __repr__(self) -> str:
        return f"Permit(at={self.at.isoformat()}, id={self.id!r}, released={self.released})"

    def settle(self, costs: Costs, *, outcome: str | None = None) -> bool:
        """Sets the grant's real cost in each named window bucket (the latest settle stands);
        ``False`` when the permit is no longer live (or the grant has no permit id). An adapted
        grant's ``outcome`` goes with it (wire section 14): the one given, else the observed one."""
        if self.id is None or self.released:
            return False
        said = check_outcome(outcome) or self.outcome
        settled = self._limiter._settle(self.id, costs, self._buckets, said)
        if settled:
            self.costs = dict(costs)
        return settled

    def release(self, costs: Costs | None = None, *, outcome: str | None = None) -> bool:
        """Releases the places now, after settling ``costs`` if given (one durable step);
        ``True`` when the permit was live. A second release sends nothing. An adapted grant
        reports its outcome (wire section 14): ``outcome``, else the observed one, else
        ``"clean"``."""
        return self._release_with(costs, self._release_outcome(outcome))

    def _release_with(self, costs: Costs | None, outcome: str | None) -> bool:
        if self.id is None or self.released:
            return False
        live = self._limiter._release(self.id, costs, self._buckets, outcome)
        self.released = True
        return live

    def __enter__(self) -> Permit:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[types.TracebackType],
    ) -> None:
        if exc is None:
            self.release()
            return
        try:  # a call that failed reports only a limited outcome it saw, never a clean one
            self._release_with(None, self._release_outcome(None, failed=True))
        except LimiterError as e:  # never hide the body's own error behind the release's
            log.warning("releasing permit %s after an error failed: %s; its places lapse at holdMs", self.id, e)


class Limiter(LimiterBase):
    """A blocking client of a redb-limiter server (thread-safe; share one per process).

    ``url`` is the server's address (``http://127.0.0.1:7411``), ``token`` its bearer token,
    ``timeout`` the seconds one HTTP request may take. ``max_waiters`` bounds the callers that
    may wait for one request shape at once (a call beyond raises :class:`QueueFull`);
    ``on_wait`` is called after every wait. ``http_client`` replaces the ``httpx.Client``.
    ``wakes=False`` makes every wait sleep to its ``retryAt``, woken by nothing (as clients
    before wire 4 did; for comparison).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float | None = 10.0,
        *,
        max_waiters: int | None = None,
        on_wait: Optional[Callable[[WaitReport], None]] = None,
        clock: Clock | None = None,
        http_client: httpx.Client | None = None,
        wakes: bool = True,
    ) -> None:
        super().__init__(url, token, timeout, max_waiters, clock, on_wait, wakes)
        self._http = http_client if http_client is not None else httpx.Client(timeout=self.timeout)
        self._lines = SyncLines()
        self._cleanups: set[threading.Thread] = set()
        self._cleanups_lock = threading.Lock()

    def close(self) -> None:
        """Waits (a few seconds at most) for the clean-ups that abandoned waits left running,
        then closes the connections."""
        deadline = self.clock.monotonic() + 2 * UNDO_SECONDS + 1
        with self._cleanups_lock:
            running = list(self._cleanups)
        for thread in running:
            thread.join(max(deadline - self.clock.monotonic(), 0.0))
        self._http.close()

    def __enter__(self) -> Limiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _lines_waiting(self, shape: str) -> int:
        return self._lines.waiting(shape)

    def _post(
        self, method: str, body: dict[str, Any], timeout: Any = httpx.USE_CLIENT_DEFAULT
    ) -> tuple[dict[str, Any], float]:
        """POSTs ``body`` to ``/method``: the reply's JSON and the limiter's clock at receipt."""
        sent = self.clock.wall()
        try:
            response = self._http.post(self._method_url(method), json=body, headers=self._headers(), timeout=timeout)
        except httpx.TransportError as e:
            raise Unreachable(f"{method}: {self.url}: {e!r}") from e
        data = decode(method, response.status_code, response.content)
        return data, self._observe(sent, response.headers.get("date"), data)

    def _ask(self, request: AcquireRequest, body: dict[str, Any], wait: Wait | None = None) -> tuple[Outcome, float]:
        """One ask, and what follows when its answer is lost. A connection dropped before any
        answer is asked again once, under the same id. When the ask ends without an answer
        this host reads -- the request timed out or failed, ``max_wait`` ran out while it was
        in flight (then :class:`QueueTimeout`), Ctrl-C or any other exception -- it is undone
        by its id before this raises, so nothing it was granted or filed stays behind."""
        retried = False
        try:
            while True:
                seconds = None if wait is None else wait.ask_seconds(self.clock.monotonic())
                timeout: Any = httpx.USE_CLIENT_DEFAULT
                capped = False
                if seconds is not None:  # max_wait bounds the request in flight too
                    timeout, capped = capped_timeout(self._http.timeout, seconds)
                try:
                    data, now_ms = self._post("acquire", body, timeout)
                    return parse_acquire(data), now_ms
                except Unreachable as e:
                    if not retried and lost_answer(e) and (wait is None or not wait.over(self.clock.monotonic())):
                        retried = True
                        continue
                    if wait is not None and capped and timed_out(e):
                        raise wait.timeout(self.clock.monotonic()) from e
                    raise
        except BaseException as e:
            if not answered(e):
                self._undo(request.undo_body(body["id"]))
            raise

    def _undo(self, body: dict[str, Any], permit: str | None = None) -> None:
        """``release {id}`` (and of ``permit``, when a grant was read but never handed over),
        in a thread of its own. A server without wire section 16 answers 400: that, like any
        failure here, is only logged at debug level (the places then lapse at ``holdMs``)."""

        def undo() -> None:
            try:
                self._post("release", body, self._cleanup_timeout())
            except LimiterError as e:
                log.debug("release {id: %s} failed: %s", body["id"], e)
            if permit is not None:
                self._post("release", self._release_body(permit, None), self._cleanup_timeout())

        self._later(undo)

    def _later(self, work: Callable[[], None]) -> None:
        """Runs a clean-up in a thread of its own, so that the caller raises at once; each of
        its requests is bounded by ``UNDO_SECONDS``, and :meth:`close` waits for it."""

        def run() -> None:
            try:
                work()
            except Exception as e:
                log.debug("a clean-up after giving up failed: %s", e)
            finally:
                with self._cleanups_lock:
                    self._cleanups.discard(threading.current_thread())

        thread = threading.Thread(target=run, name="redb-limiter-cleanup")
        with self._cleanups_lock:
            self._cleanups.add(thread)
        thread.start()

    def _cleanup_timeout(self) -> httpx.Timeout:
        return capped_timeout(self._http.timeout, UNDO_SECONDS)[0]

    def try_acquire(
        self,
        key: str,
        limits: Limits,
        cost: int = 1,
        *,
        hold_ms: int | None = None,
        permit: bool = True,
    ) -> Permit:
        """Asks once: the :class:`Permit`, or :class:`Refused`. Never waits, never queues.

        ``permit`` asks for a permit id even when the grant holds no place, so it can be
        settled; without it, a grant of window limits alone has nothing to release."""
        request = AcquireRequest.build(key, limits, cost, hold_ms=hold_ms, permit=permit)
        outcome, now_ms = self._ask(request, request.body(ask_id=self._new_id(), report=True))
        if isinstance(outcome, Grant):
            return Permit(self, outcome, request.buckets)
        raise refused(outcome, now_ms, self.clock.monotonic())

    def acquire(
        self,
        key: str,
        limits: Limits,
        cost: int = 1,
        max_wait: float | None = None,
        queue: bool = True,
        *,
        hold_ms: int | None = None,
        grace_ms: int | None = None,
        permit: bool = True,
        max_waiters: int | None = None,
    ) -> Permit:
        """Waits until granted and returns the :class:`Permit` (a context manager).

        Sleeps until each refusal's ``retryAt``, measured on the limiter's clock; callers of
        the same shape (caller key and buckets) go first in, first out. With ``queue`` it
        takes a ticket in the limiter's line, so callers in other processes that come later
        do not overtake it, and leaves the line when it gives up. ``max_wait`` (seconds) ends
        the wait with :class:`QueueTimeout`, at once when the next ``retryAt`` lies beyond it;
        each ask in the line sends what remains of it (``maxWaitMs``), so the limiter files no
        ticket for a call it could not grant in time (``QueueTimeout.last.no_ticket`` is then
        ``"horizon"``); an ask still in flight at the deadline is abandoned. ``max_waiters``
        overrides the limiter's.

        However the wait ends without a permit (``max_wait``, the limiter out of reach, Ctrl-C),
        the ask it abandoned is undone by its id, and the callers behind it in this process
        move on; when the limiter could not be reached, they fail with the same error."""
        request = AcquireRequest.build(key, limits, cost, hold_ms=hold_ms, grace_ms=grace_ms, permit=permit)
        waited = check_seconds("max_wait", max_wait)
        bound = check_max_waiters(max_waiters) or self.max_waiters
        started = self.clock.monotonic()
        deadline = None if waited is None else started + waited
        line = self._lines.join(request.shape, request.buckets, bound)
        try:
            turn = None if deadline is None else deadline - self.clock.monotonic()
            if not self._lines.take_turn(line, turn):
                raise QueueTimeout(self.clock.monotonic() - started, None)
            failure: Unreachable | None = None
            try:
                return self._wait(line, request, queue, started, deadline)
            except Unreachable as e:
                failure = e  # those behind meet it now, not one timeout each in turn
                raise
            finally:
                self._lines.pass_turn(line, failure)
        finally:
            self._lines.leave(request.shape, line)

    def _wait(
        self, line: _Line[_Turn], request: AcquireRequest, queue: bool, started: float, deadline: float | None
    ) -> Permit:
        wait = Wait(request, queue, started, deadline, self._new_id)
        body: dict[str, Any] = {}
        grant: Grant | None = None
        answered_last = False
        call: _WaitCall | None = None  # this head's /wait, answered or not
        try:
            while True:
                body = wait.body(self.clock.monotonic())
                seen = line.woke  # a release answered after this is a reason to ask again
                answered_last = False
                outcome, now_ms = self._ask(request, body, wait)
                answered_last = True
                if isinstance(outcome, Grant):
                    grant = outcome
                    wait.granted()
                    return Permit(self, outcome, request.buckets)
                seconds = wait.refused(outcome, now_ms, self.clock.monotonic())
                call = self._pause(line, wait, seen, seconds, call)
                self._report(seconds, wait.last)  # the time to retryAt, as before wakes
        except BaseException as e:
            if grant is not None:  # granted, and interrupted before the permit was handed over
                self._undo(request.undo_body(body["id"]), grant.permit)
            if wait.ticket is not None:
                if answered_last and isinstance(e, Exception):
                    self._leave(wait.ticket)  # the limiter has just answered: leave before raising
                else:
                    ticket = wait.ticket
                    self._later(lambda: self._leave(ticket))
            raise

    def _pause(
        self, line: _Line[_Turn], wait: Wait, seen: int, seconds: float, call: _WaitCall | None
    ) -> _WaitCall | None:
        """Waits until ``retryAt`` (``seconds`` from now), or less. Holding a ticket, until the
        limiter says it is ready or gone (``/wait``, wire section 15: a release by any host,
        this one's included, wakes it within a round trip). A release through this limiter does
        not end that wait: the limiter answers it at the same change, and only when the room
        freed is this ticket's, where an ask at the release would be refused whenever another
        host's ticket stands first. Otherwise (no ticket, or a limiter without waits) until a
        release through this limiter wakes the line. The ``/wait`` runs in a thread of its own,
        so that ``max_wait`` or Ctrl-C end this at once; one that is still pending is waited on
        again for the same ticket, and ends by itself once the ticket does. Returns that
        ``/wait``."""
        start = self.clock.monotonic()
        if not self.wakes:
            self.clock.sleep(seconds)
            return None
        within = None if self._no_waits else wait.wait_seconds(start)
        if within is not None and wait.ticket is not None:
            if call is None or call.done or call.ticket != wait.ticket:
                call = self._start_wait(wait.ticket, within)
            current = call
            bound = None if wait.deadline is None else max(wait.deadline - start, 0.0)
            if not self._lines.pause(line, None, lambda: current.done, bound):
                raise wait.timeout(self.clock.monotonic())  # max_wait ran out while waiting
            if current.ready:
                return call  # the ticket is ready or gone: ask again now
            # Empty lists (its time passed, or the limiter's bound), a failure or a 404.
        left = start + seconds - self.clock.monotonic()
        if left > 0:
            self._lines.pause(line, seen, lambda: False, left)
        return call

    def _start_wait(self, ticket: str, seconds: float) -> _WaitCall:
        """``/wait`` for ``ticket`` in a daemon thread, which notifies the lines when answered."""
        call = _WaitCall(ticket)

        def run() -> None:
            ready = False
            try:
                ready = parse_wait(self._post("wait", wait_body(ticket, seconds), wait_timeout(seconds))[0])
            except ProtocolError as e:
                if e.status == 404:
                    self._no_waits = True  # no wire section 15: retryAt from now on
                else:
                    log.debug("wait for ticket %s failed: %s", ticket, e)
            except Exception as e:  # out of reach, or the limiter closed meanwhile: on to retryAt
                log.debug("wait for ticket %s failed: %s", ticket, e)
            finally:
                with self._lines.changed:
                    call.ready, call.done = ready, True
                    self._lines.changed.notify_all()

        threading.Thread(target=run, name="redb-limiter-wait", daemon=True).start()
        return call

    def _leave(self, ticket: str) -> None:
        """Leaves the limiter's line (a ticket not asked again would hold it for its grace)."""
        try:
            self._post("release", {"ticket": ticket}, self._cleanup_timeout())
        except LimiterError as e:
            log.warning("leaving the line with ticket %s failed: %s; it lapses after its grace", ticket, e)

    def peek(self, key: str, limits: Limits, cost: int = 1, *, hold_ms: int | None = None) -> Peek:
        """Would this acquire be granted now, and how full is each limit? Changes nothing."""
        request = AcquireRequest.build(key, limits, cost, hold_ms=hold_ms)
        return parse_peek(self._post("peek", request.body())[0])

    def release(self, permit: str, costs: Costs | None = None, *, outcome: str | None = None) -> bool:
        """Releases a permit's places (settling ``costs`` first, in one durable step);
        ``True`` when it was live. Wakes this limiter's waiting heads (a :class:`Permit`'s own
        release wakes only those of its buckets). ``outcome`` (``"clean"`` or ``"limited"``)
        tells the adaptive ceilings of the grant's buckets what the call met (wire section 14)."""
        return self._release(permit, costs, None, outcome)

    def settle(self, permit: str, costs: Costs, *, outcome: str | None = None) -> bool:
        """Sets a permit's grant's real costs: ``True`` when the permit was live. ``outcome``
        as in :meth:`release`."""
        return self._settle(permit, costs, None, outcome)

    def _release(
        self, permit: str, costs: Costs | None, buckets: tuple[str, ...] | None, outcome: str | None = None
    ) -> bool:
        live = parse_bool(self._post("release", self._release_body(permit, costs, outcome))[0], "released", "release")
        self._lines.wake(buckets)  # answered: the heads it may let through ask again now
        return live

    def _settle(
        self, permit: str, costs: Costs, buckets: tuple[str, ...] | None, outcome: str | None = None
    ) -> bool:
        settled = parse_bool(self._post("settle", self._settle_body(permit, costs, outcome))[0], "settled", "settle")
        self._lines.wake(buckets)
        return settled

    def throttle(self, key: str, until: datetime, *, permit: str | None = None) -> datetime | None:
        """Closes caller ``key`` until ``until`` (an aware ``datetime``; throttles only extend);
        returns the throttle now in force. With the ``permit`` of the call the provider refused,
        it also counts as a ``"limited"`` outcome for that permit's adaptive ceilings."""
        return parse_throttle(self._post("throttle", self._throttle_body(key, until, permit))[0])

    def lift(self, key: str) -> bool:
        """Ends the throttle of ``key`` early: ``True`` when one was in force."""
        check_key("key", key)
        return parse_bool(self._post("lift", {"key": key})[0], "lifted", "lift")

    def throttle_from(
        self,
        key: str,
        response: object,
        *,
        default_ms: int = 5_000,
        permit: Permit | str | None = None,
        floor: int | None = None,
    ) -> datetime | None:
        """Reads a provider's answer for caller ``key``: a 429 throttles it for the wait the
        provider asked (``default_ms`` when it names none), a success reporting an exhausted
        budget until the reset. Returns the throttle now in force, if this answer set one.

        ``response`` is an ``httpx.Response`` (its body read, for a 429's ``RetryInfo``) or an
        SDK error carrying one (``openai.RateLimitError``). Given the call's ``permit``, the
        answer is also its outcome for adaptive ceilings (wire section 14): a throttle set here
        carries it, and a :class:`Permit` keeps what :meth:`Permit.observe` reads (``floor``:
        see there) for its release."""
        if isinstance(permit, Permit):
            permit.observe(response, floor=floor)
        permit_id = permit.id if isinstance(permit, Permit) else permit
        until = self._throttle_from_until(response, default_ms)
        return None if until is None else self.throttle(key, ms_to_datetime(until), permit=permit_id)

    def httpx_hook(self, key: str, *, default_ms: int = 5_000) -> Callable[[Any], None]:
        """A response event hook for an ``httpx.Client`` (or the same client of httpx's fork
        ``httpx2``, which the newer OpenAI and Anthropic SDKs take as ``http_client``) that
        calls :meth:`throttle_from` for every response. A limiter that cannot be reached is
        logged, never raised into the provider's call."""
        check_key("key", key)

        def hook(response: Any) -> None:
            if response.status_code == 429:
                response.read()  # for a RetryInfo in the body
            try:
                self.throttle_from(key, response, default_ms=default_ms)
            except LimiterError as e:
                log.warning("could not throttle %s after a %s: %s", key, response.status_code, e)

        return hook

    def limit(self, key: str, limits: Limits, cost: int = 1, max_wait: float | None = None) -> Callable[[F], F]:
        """A decorator: every call of the function first waits for a grant (as :meth:`acquire`)
        and releases its places when the function returns or raises. For ``async def``
        functions use :meth:`AsyncLimiter.limit`."""
        AcquireRequest.build(key, limits, cost)
        check_seconds("max_wait", max_wait)

        def decorate(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):
                raise TypeError(f"{fn.__qualname__} is async: decorate it with AsyncLimiter.limit")

            @functools.wraps(fn)
            def limited(*args: Any, **kwargs: Any) -> Any:
                with self.acquire(key, limits, cost, max_wait, permit=False):
                    return fn(*args, **kwargs)

            return cast(F, limited)

        return decorate
