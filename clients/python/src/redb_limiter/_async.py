"""The asyncio twin: :class:`AsyncLimiter` and its :class:`AsyncPermit`. Same methods, names
and errors as :mod:`redb_limiter._sync`. Its requests go through kept-alive connections of its
own (:mod:`redb_limiter._transport`), or through the ``httpx.AsyncClient`` the host passes.

Cancellation is a way out like any other, and takes effect at once, an ask in flight included:
a cancelled wait leaves the in-process line and the limiter's, and an ask it abandons is undone
by its id (wire section 16) in a task of its own that is not cancelled with the caller, bounded
in time, which also releases a grant (or leaves a ticket) that arrives meanwhile, for servers
without section 16. ``max_wait`` ends an ask in flight the same way. :meth:`AsyncLimiter.aclose`
waits for those clean-ups.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import ssl
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from datetime import datetime
from typing import Any, Optional, Set, Tuple, Type, TypeVar, cast

import httpx

from ._base import (
    UNDO_SECONDS,
    PermitOutcome,
    Clock,
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
    wait_body,
    wait_timeout,
)
from ._errors import LimiterError, ProtocolError, QueueTimeout, Unreachable
from ._lines import AsyncLines, _Line, _Ready
from ._request import AcquireRequest, Costs, Limits, check_key, check_outcome
from ._time import ms_to_datetime
from ._transport import ConnectionPool, Timeouts, TransportError
from ._wire import Grant, LimitFigures, Outcome, Peek, decode, parse_acquire, parse_bool, parse_peek, parse_throttle, parse_wait

__all__ = ["AsyncLimiter", "AsyncPermit", "AcquireContext"]

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

#: A head's ``/wait``: its ticket, and the task answering whether it is ready or gone.
_Call = Tuple[str, "asyncio.Task[bool]"]


class AsyncPermit(PermitOutcome):
    """A grant. Use it with ``async with``: on exit its places are released (after a settle in
    the body, the settled costs stand), whether the body returned, raised or was cancelled."""

    def __init__(self, limiter: AsyncLimiter, grant: Grant, buckets: tuple[str, ...]) -> None:
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
        return f"AsyncPermit(at={self.at.isoformat()}, id={self.id!r}, released={self.released})"

    async def settle(self, costs: Costs, *, outcome: str | None = None) -> bool:
        """Sets the grant's real cost in each named window bucket (the latest settle stands);
        ``False`` when the permit is no longer live (or the grant has no permit id). An adapted
        grant's ``outcome`` goes with it (wire section 14): the one given, else the observed one."""
        if self.id is None or self.released:
            return False
        said = check_outcome(outcome) or self.outcome
        settled = await self._limiter._settle(self.id, costs, self._buckets, said)
        if settled:
            self.costs = dict(costs)
        return settled

    async def release(self, costs: Costs | None = None, *, outcome: str | None = None) -> bool:
        """Releases the places now, after settling ``costs`` if given (one durable step);
        ``True`` when the permit was live. A second release sends nothing. An adapted grant
        reports its outcome (wire section 14): ``outcome``, else the observed one, else
        ``"clean"``."""
        return await self._release_with(costs, self._release_outcome(outcome))

    async def _release_with(self, costs: Costs | None, outcome: str | None) -> bool:
        if self.id is None or self.released:
            return False
        live = await self._limiter._release(self.id, costs, self._buckets, outcome)
        self.released = True
        return live

    async def __aenter__(self) -> AsyncPermit:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[types.TracebackType],
    ) -> None:
        if exc is None:
            await self.release()
            return
        if self.id is None or self.released:
            return
        # Even when the body was cancelled, the release is sent: shielded, so that a second
        # cancellation cannot stop it halfway.
        try:  # a call that failed reports only a limited outcome it saw, never a clean one
            await self._limiter._shielded(self._release_with(None, self._release_outcome(None, failed=True)))
        except LimiterError as e:  # never hide the body's own error behind the release's
            log.warning("releasing permit %s after an error failed: %s; its places lapse at holdMs", self.id, e)


class AcquireContext:
    """What :meth:`AsyncLimiter.acquire` returns: ``await`` it for the permit, or use it with
    ``async with`` to release on exit."""

    def __init__(self, start: Callable[[], Coroutine[Any, Any, AsyncPermit]]) -> None:
        self._start = start
        self._permit: AsyncPermit | None = None

    def __await__(self) -> Generator[Any, None, AsyncPermit]:
        return self._start().__await__()

    async def __aenter__(self) -> AsyncPermit:
        self._permit = await self._start()
        return self._permit

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[types.TracebackType],
    ) -> None:
        if self._permit is not None:
            await self._permit.__aexit__(exc_type, exc, tb)


class AsyncLimiter(LimiterBase):
    """An asyncio client of a redb-limiter server; the twin of :class:`Limiter` (same
    arguments, methods and errors). Use one per event loop; ``await aclose()`` when done.

    Requests go through a pool of kept-alive HTTP/1.1 connections of the limiter's own (TLS for
    an ``https://`` URL, with the system's certificates). An ``http_client`` passed in is used
    instead, exactly as given (its hooks, transport, proxies and certificates); ``aclose()``
    closes it too."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float | None = 10.0,
        *,
        max_waiters: int | None = None,
        on_wait: Optional[Callable[[WaitReport], None]] = None,
        clock: Clock | None = None,
        http_client: httpx.AsyncClient | None = None,
        wakes: bool = True,
    ) -> None:
        super().__init__(url, token, timeout, max_waiters, clock, on_wait, wakes)
        self._http = http_client
        self._pool: ConnectionPool | None = None
        #: The default bound on each request's phases (the passed client's own, if any).
        self._timeout = http_client.timeout if http_client is not None else httpx.Timeout(self.timeout)
        self._phases = _phases(self._timeout)
        if http_client is None:
            secure = self._base.scheme == "https"
            host = self._base.raw_host.decode("ascii")
            self._pool = ConnectionPool(
                host,
                self._base.port or (443 if secure else 80),
                authority=self._base.netloc.decode("ascii"),
                tls=ssl.create_default_context() if secure else None,
            )
        self._targets: dict[str, str] = {}
        self._lines = AsyncLines()
        self._pending: Set[asyncio.Task[Any]] = set()

    async def aclose(self) -> None:
        """Waits for the clean-ups that cancelled waits left running, then closes."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)
        if self._pool is not None:
            await self._pool.aclose()
        if self._http is not None:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _lines_waiting(self, shape: str) -> int:
        return self._lines.waiting(shape)

    async def _shielded(self, work: Coroutine[Any, Any, Any]) -> Any:
        """Runs ``work`` to its end even if the caller is cancelled meanwhile."""
        task = asyncio.ensure_future(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return await asyncio.shield(task)

    def _later(self, work: Callable[[], Awaitable[Any]]) -> None:
        """Runs a clean-up in a task of its own, not cancelled with the caller, bounded by
        ``UNDO_SECONDS``; its failures are logged at debug level, never left unretrieved."""

        async def run() -> None:
            try:
                await asyncio.wait_for(work(), UNDO_SECONDS)
            except Exception as e:
                log.debug("a clean-up after giving up failed: %r", e)

        task = asyncio.ensure_future(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(
        self, method: str, body: dict[str, Any], timeout: httpx.Timeout | None = None
    ) -> tuple[dict[str, Any], float]:
        """POSTs ``body`` to ``/method`` (within ``timeout``, else the limiter's own): the
        reply's JSON and the limiter's clock at receipt."""
        sent = self.clock.wall()
        if self._pool is None:
            assert self._http is not None
            try:
                response = await self._http.post(
                    self._method_url(method),
                    json=body,
                    headers=self._headers(),
                    timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout,
                )
            except httpx.TransportError as e:
                raise Unreachable(f"{method}: {self.url}: {e!r}") from e
            status, content, date = response.status_code, response.content, response.headers.get("date")
        else:
            target = self._targets.get(method)
            if target is None:
                target = self._targets[method] = self._method_url(method).raw_path.decode("ascii")
            payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            phases = self._phases if timeout is None else _phases(timeout)
            try:
                answer = await self._pool.request("POST", target, self._headers(), payload, phases)
            except TransportError as e:
                raise Unreachable(f"{method}: {self.url}: {e!r}") from e
            status, content, date = answer.status, answer.body, answer.headers.get("date")
        data = decode(method, status, content)
        return data, self._observe(sent, date, data)

    def _cleanup_timeout(self) -> httpx.Timeout:
        return capped_timeout(self._timeout, UNDO_SECONDS)[0]

    async def _ask_once(self, body: dict[str, Any], wait: Wait | None) -> tuple[Outcome, float]:
        """Sends one ask; a connection dropped before any answer is asked again once, under
        the same id (wire section 16), while ``max_wait`` allows."""
        retried = False
        while True:
            try:
                data, now_ms = await self._post("acquire", body)
                return parse_acquire(data), now_ms
            except Unreachable as e:
                if retried or not lost_answer(e) or (wait is not None and wait.over(self.clock.monotonic())):
                    raise
                retried = True

    async def _ask(
        self, request: AcquireRequest, body: dict[str, Any], wait: Wait | None = None
    ) -> tuple[Outcome, float]:
        """One ask, abandoned at once when the caller is cancelled or ``max_wait`` runs out
        while it is in flight (then :class:`QueueTimeout`). An ask that ends without an answer
        this caller reads is undone in the background (:meth:`_undo`) before this raises."""
        flight = asyncio.ensure_future(self._ask_once(body, wait))
        try:
            seconds = None if wait is None else wait.ask_seconds(self.clock.monotonic())
            done, _ = await asyncio.wait({flight}, timeout=seconds)
            if not done:
                assert wait is not None
                raise wait.timeout(self.clock.monotonic())
            return flight.result()
        except BaseException as e:
            if not answered(e):
                self._undo(request.undo_body(body["id"]), flight)
            raise

    def _undo(self, body: dict[str, Any], flight: asyncio.Future[tuple[Outcome, float]] | None = None) -> None:
        """Undoes an abandoned ask in the background: ``release {id}``; when that fails (a server
        without wire section 16 answers it with 400), the answer of the ask itself if it comes
        within the bound: a late grant is released, a late ticket leaves the line."""

        async def undo() -> None:
            try:
                try:
                    await self._post("release", body, self._cleanup_timeout())
                    return  # undone (or remembered as released): the late answer no longer matters
                except LimiterError as e:
                    log.debug("release {id: %s} failed: %s", body["id"], e)
                if flight is None:
                    return
                try:
                    outcome, _ = await flight
                except Exception:
                    return  # no answer after all, or an error: nothing was got
                if isinstance(outcome, Grant):
                    if outcome.permit is not None:
                        await self._post("release", self._release_body(outcome.permit, None), self._cleanup_timeout())
                elif outcome.ticket is not None:
                    await self._leave(outcome.ticket)
            finally:
                if flight is not None:
                    if not flight.done():
                        flight.cancel()
                    elif not flight.cancelled():
                        flight.exception()  # retrieved: a lost answer is not an error to report

        self._later(undo)

    def try_acquire(
        self,
        key: str,
        limits: Limits,
        cost: int = 1,
        *,
        hold_ms: int | None = None,
        permit: bool = True,
    ) -> AcquireContext:
        """Asks once: the :class:`AsyncPermit`, or :class:`Refused`. Never waits, never queues.
        ``await`` it, or use it with ``async with``."""
        request = AcquireRequest.build(key, limits, cost, hold_ms=hold_ms, permit=permit)

        async def start() -> AsyncPermit:
            outcome, now_ms = await self._ask(request, request.body(ask_id=self._new_id(), report=True))
            if isinstance(outcome, Grant):
                return AsyncPermit(self, outcome, request.buckets)
            raise refused(outcome, now_ms, self.clock.monotonic())

        return AcquireContext(start)

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
    ) -> AcquireContext:
        """Waits until granted (see :meth:`Limiter.acquire`); ``await`` it for the
        :class:`AsyncPermit`, or ``async with`` it to release on exit. Cancelling the waiting
        task ends the wait at once, an ask in flight included: it leaves both lines, and the
        abandoned ask is undone by its id in the background."""
        request = AcquireRequest.build(key, limits, cost, hold_ms=hold_ms, grace_ms=grace_ms, permit=permit)
        waited = check_seconds("max_wait", max_wait)
        bound = check_max_waiters(max_waiters) or self.max_waiters

        async def start() -> AsyncPermit:
            started = self.clock.monotonic()
            deadline = None if waited is None else started + waited
            line = self._lines.join(request.shape, request.buckets, bound)
            try:
                turn = None if deadline is None else deadline - self.clock.monotonic()
                if not await self._lines.take_turn(line, turn):
                    raise QueueTimeout(self.clock.monotonic() - started, None)
                failure: Unreachable | None = None
                try:
                    return await self._wait(line, request, queue, started, deadline)
                except Unreachable as e:
                    failure = e  # those behind meet it now, not one timeout each in turn
                    raise
                finally:
                    self._lines.pass_turn(line, failure)
            finally:
                self._lines.leave(request.shape, line)

        return AcquireContext(start)

    async def _wait(
        self, line: _Line[_Ready], request: AcquireRequest, queue: bool, started: float, deadline: float | None
    ) -> AsyncPermit:
        wait = Wait(request, queue, started, deadline, self._new_id)
        answered_last = False
        call: _Call | None = None  # this head's /wait, answered or not
        try:
            while True:
                body = wait.body(self.clock.monotonic())
                seen = line.woke  # a release answered after this is a reason to ask again
                answered_last = False
                outcome, now_ms = await self._ask(request, body, wait)
                answered_last = True
                if isinstance(outcome, Grant):
                    wait.granted()
                    return AsyncPermit(self, outcome, request.buckets)
                seconds = wait.refused(outcome, now_ms, self.clock.monotonic())
                call = await self._pause(line, wait, seen, seconds, call)
                self._report(seconds, wait.last)  # the time to retryAt, as before wakes
        except BaseException as e:
            if wait.ticket is not None:
                if answered_last and isinstance(e, Exception):
                    # The limiter has just answered: leave before raising (shielded, so that a
                    # cancellation meanwhile cannot stop it halfway).
                    await self._shielded(self._leave(wait.ticket))
                else:
                    ticket = wait.ticket
                    self._later(lambda: self._leave(ticket))  # cancelled, or the limiter is out of reach
            raise
        finally:
            if call is not None:
                call[1].cancel()  # a /wait still pending ends with the wait, whatever ended it

    async def _pause(self, line: _Line[_Ready], wait: Wait, seen: int, seconds: float, call: _Call | None) -> _Call | None:
        """Waits until ``retryAt`` (``seconds`` from now), or less. Holding a ticket, until the
        limiter says it is ready or gone (``/wait``, wire section 15: a release by any host,
        this one's included, wakes it within a round trip). A release through this limiter does
        not end that wait: the limiter answers it at the same change, and only when the room
        freed is this ticket's, where an ask at the release would be refused whenever another
        host's ticket stands first. Otherwise (no ticket, or a limiter without waits) until a
        release through this limiter wakes the line. The ``/wait`` is a task of its own,
        cancelled with the wait; cancellation and ``max_wait`` end this at once."""
        start = self.clock.monotonic()
        if not self.wakes:
            await self.clock.asleep(seconds)
            return None
        within = None if self._no_waits else wait.wait_seconds(start)
        if within is not None and wait.ticket is not None:
            if call is None or call[1].done() or call[0] != wait.ticket:
                if call is not None:
                    call[1].cancel()
                call = (wait.ticket, asyncio.ensure_future(self._wait_call(wait.ticket, within)))
            task = call[1]
            bound = None if wait.deadline is None else max(wait.deadline - start, 0.0)
            done, _ = await asyncio.wait({task}, timeout=bound)
            if not done:
                raise wait.timeout(self.clock.monotonic())  # max_wait ran out while waiting
            if task.result():
                return call  # the ticket is ready or gone: ask again now
            # Empty lists (its time passed, or the limiter's bound), a failure or a 404.
        left = start + seconds - self.clock.monotonic()
        signal = self._lines.signal(line, seen)
        if left > 0 and signal is not None:
            try:
                await asyncio.wait_for(signal.wait(), left)
            except asyncio.TimeoutError:
                pass
        return call

    async def _wait_call(self, ticket: str, seconds: float) -> bool:
        """One ``/wait`` for ``ticket``: whether it is ready or gone. A 404 is remembered (no
        wire section 15: ``retryAt`` from now on); a failure is only logged."""
        try:
            data, _ = await self._post("wait", wait_body(ticket, seconds), wait_timeout(seconds))
            return parse_wait(data)
        except ProtocolError as e:
            if e.status == 404:
                self._no_waits = True
            else:
                log.debug("wait for ticket %s failed: %s", ticket, e)
        except Exception as e:  # out of reach, or the limiter closed meanwhile: on to retryAt
            log.debug("wait for ticket %s failed: %s", ticket, e)
        return False

    async def _leave(self, ticket: str) -> None:
        try:
            await self._post("release", {"ticket": ticket}, self._cleanup_timeout())
        except LimiterError as e:
            log.warning("leaving the line with ticket %s failed: %s; it lapses after its grace", ticket, e)

    async def peek(self, key: str, limits: Limits, cost: int = 1, *, hold_ms: int | None = None) -> Peek:
        """Would this acquire be granted now, and how full is each limit? Changes nothing."""
        request = AcquireRequest.build(key, limits, cost, hold_ms=hold_ms)
        return parse_peek((await self._post("peek", request.body()))[0])

    async def release(self, permit: str, costs: Costs | None = None, *, outcome: str | None = None) -> bool:
        """Releases a permit's places (settling ``costs`` first, in one durable step); wakes
        this limiter's waiting heads (see :meth:`Limiter.release`, and its ``outcome``)."""
        return await self._release(permit, costs, None, outcome)

    async def settle(self, permit: str, costs: Costs, *, outcome: str | None = None) -> bool:
        """Sets a permit's grant's real costs: ``True`` when the permit was live."""
        return await self._settle(permit, costs, None, outcome)

    async def _release(
        self, permit: str, costs: Costs | None, buckets: tuple[str, ...] | None, outcome: str | None = None
    ) -> bool:
        data, _ = await self._post("release", self._release_body(permit, costs, outcome))
        self._lines.wake(buckets)  # answered: the heads it may let through ask again now
        return parse_bool(data, "released", "release")

    async def _settle(
        self, permit: str, costs: Costs, buckets: tuple[str, ...] | None, outcome: str | None = None
    ) -> bool:
        data, _ = await self._post("settle", self._settle_body(permit, costs, outcome))
        self._lines.wake(buckets)
        return parse_bool(data, "settled", "settle")

    async def throttle(self, key: str, until: datetime, *, permit: str | None = None) -> datetime | None:
        """Closes caller ``key`` until ``until``; returns the throttle now in force (see
        :meth:`Limiter.throttle`, and its ``permit``)."""
        return parse_throttle((await self._post("throttle", self._throttle_body(key, until, permit)))[0])

    async def lift(self, key: str) -> bool:
        """Ends the throttle of ``key`` early: ``True`` when one was in force."""
        check_key("key", key)
        return parse_bool((await self._post("lift", {"key": key}))[0], "lifted", "lift")

    async def throttle_from(
        self,
        key: str,
        response: object,
        *,
        default_ms: int = 5_000,
        permit: AsyncPermit | str | None = None,
        floor: int | None = None,
    ) -> datetime | None:
        """See :meth:`Limiter.throttle_from`."""
        if isinstance(permit, AsyncPermit):
            permit.observe(response, floor=floor)
        permit_id = permit.id if isinstance(permit, AsyncPermit) else permit
        until = self._throttle_from_until(response, default_ms)
        return None if until is None else await self.throttle(key, ms_to_datetime(until), permit=permit_id)

    def httpx_hook(self, key: str, *, default_ms: int = 5_000) -> Callable[[Any], Awaitable[None]]:
        """A response event hook for an ``httpx.AsyncClient`` (the ``http_client`` of
        ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic``); see :meth:`Limiter.httpx_hook`."""
        check_key("key", key)

        async def hook(response: Any) -> None:
            if response.status_code == 429:
                await response.aread()
            try:
                await self.throttle_from(key, response, default_ms=default_ms)
            except LimiterError as e:
                log.warning("could not throttle %s after a %s: %s", key, response.status_code, e)

        return hook

    def limit(self, key: str, limits: Limits, cost: int = 1, max_wait: float | None = None) -> Callable[[F], F]:
        """A decorator for ``async def`` functions: each call waits for a grant first and
        releases its places when it returns, raises or is cancelled."""
        AcquireRequest.build(key, limits, cost)
        check_seconds("max_wait", max_wait)

        def decorate(fn: F) -> F:
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"{fn.__qualname__} is not async: decorate it with Limiter.limit")

            @functools.wraps(fn)
            async def limited(*args: Any, **kwargs: Any) -> Any:
                async with self.acquire(key, limits, cost, max_wait, permit=False):
                    return await fn(*args, **kwargs)

            return cast(F, limited)

        return decorate


def _phases(timeout: httpx.Timeout) -> Timeouts:
    """An ``httpx.Timeout`` as the limiter's own connections bound a request."""
    return Timeouts(connect=timeout.connect, write=timeout.write, read=timeout.read, pool=timeout.pool)
