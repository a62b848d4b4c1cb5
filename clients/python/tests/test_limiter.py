"""Both twins against the real server: each test runs for ``Limiter`` and ``AsyncLimiter``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import TWINS, Server, close_twin, make_twin, start_server
from redb_limiter._request import AcquireRequest
from redb_limiter import (
    AsyncLimiter,
    BadRequest,
    Clock,
    Limit,
    Limiter,
    QueueFull,
    QueueTimeout,
    Refused,
    Unauthorized,
    Unavailable,
    Unreachable,
    WaitReport,
)

MS = timedelta(milliseconds=1)


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Polls a state (not a timing) until it holds."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.005)


async def test_try_acquire_grants_then_refuses_naming_the_limit(twin: Any, prefix: str) -> None:
    me, rpm = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 2, 60_000)
    first = await twin.try_acquire(me, [rpm])
    assert first.at.utcoffset() == timedelta(0)
    assert first.id is not None  # asked with permit: true, so it can be settled
    await twin.try_acquire(me, rpm)
    with pytest.raises(Refused) as refused:
        await twin.try_acquire(me, [rpm])
    assert refused.value.reason == "rate"
    assert refused.value.limit == rpm.key
    assert refused.value.retry_at == first.at + 60_000 * MS
    assert refused.value.retry_at.utcoffset() == timedelta(0)
    assert 55 < refused.value.retry_after <= 60
    peek = await twin.peek(me, [rpm])
    assert not peek.fits and peek.reason == "rate" and peek.limit == rpm.key
    assert peek.retry_at == refused.value.retry_at
    assert (peek.limits[0].used, peek.limits[0].remaining) == (2, 0)


async def test_acquire_sleeps_until_retry_at_then_is_granted(twin: Any, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rps", 1, 400)
    first = await twin.acquire(me, [window])
    started = time.monotonic()
    second = await twin.acquire(me, [window], max_wait=5)
    assert second.at - first.at >= 400 * MS
    assert time.monotonic() - started < 2.0
    assert twin.waiting(me, [window]) == 0


async def test_max_wait_ends_the_wait_at_once_when_retry_at_is_beyond_it(twin: Any, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1, 60_000)
    await twin.acquire(me, [window])
    started = time.monotonic()
    with pytest.raises(QueueTimeout) as timeout:
        await twin.acquire(me, [window], max_wait=2.0)
    assert time.monotonic() - started < 1.5  # it did not sleep towards a retryAt past the deadline
    assert timeout.value.last is not None
    assert (timeout.value.last.reason, timeout.value.last.limit) == ("rate", window.key)
    assert twin.waiting(me, [window]) == 0


async def test_max_waiters_and_the_turn_timeout(twin: Any, prefix: str) -> None:
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
    holder = await twin.acquire(me, [conc])
    waiter = asyncio.ensure_future(twin.acquire(me, [conc], max_wait=20))
    await until(lambda: twin.waiting(me, [conc]) == 1)
    with pytest.raises(QueueFull) as full:
        await twin.acquire(me, [conc], max_waiters=1)
    assert full.value.waiting == 1
    # Behind the head of its shape's line, a caller whose time runs out leaves with no refusal.
    with pytest.raises(QueueTimeout) as timeout:
        await twin.acquire(me, [conc], max_wait=0.3)
    assert timeout.value.last is None
    assert twin.waiting(me, [conc]) == 1
    assert await holder.release() is True
    granted = await waiter
    assert granted.id is not None
    assert await granted.release() is True
    assert twin.waiting(me, [conc]) == 0


async def test_same_shape_waiters_are_served_first_in_first_out(twin: Any, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/tps", 3, 500)
    fill = await twin.acquire(me, [window], cost=3, permit=False)
    grants: list[tuple[str, datetime]] = []

    async def call(name: str, cost: int) -> None:
        permit = await twin.acquire(me, [window], cost=cost, max_wait=10, permit=False)
        grants.append((name, permit.at))

    big = asyncio.ensure_future(call("big", 3))
    await until(lambda: twin.waiting(me, [window]) == 1)
    small = [asyncio.ensure_future(call(f"small{i}", 1)) for i in range(3)]
    await until(lambda: twin.waiting(me, [window]) == 4)
    await asyncio.gather(big, *small)
    assert grants[0][0] == "big", grants
    assert grants[0][1] >= fill.at + 500 * MS
    assert all(at >= grants[0][1] + 500 * MS for _, at in grants[1:]), grants


async def test_the_context_manager_settles_and_releases_on_errors(twin: Any, prefix: str) -> None:
    me = f"{prefix}/me"
    tpm, conc = Limit.window(f"{prefix}/tpm", 1_000, 60_000), Limit.concurrent(f"{prefix}/conc", 1)
    with pytest.raises(RuntimeError, match="the provider failed"):
        async with twin.acquire(me, [tpm, conc], cost=500) as permit:
            inside = await twin.peek(me, [tpm, conc])
            assert (inside.limits[0].used, inside.limits[1].held) == (500, 1)
            assert await permit.settle({tpm.key: 120}) is True
            raise RuntimeError("the provider failed")
    after = await twin.peek(me, [tpm, conc])
    assert (after.limits[0].used, after.limits[1].held, after.limits[1].free) == (120, 0, 1)
    assert permit.released
    # A body that returns releases too; release(costs=...) settles and releases in one step.
    async with twin.acquire(me, [tpm, conc], cost=300) as permit:
        pass
    assert (await twin.peek(me, [tpm, conc])).limits[1].held == 0
    again = await twin.acquire(me, [tpm, conc], cost=300)
    assert await again.release({tpm.key: 7}) is True
    assert await again.release() is False  # nothing is sent twice
    peek = await twin.peek(me, [tpm, conc])
    assert (peek.limits[0].used, peek.limits[1].held) == (120 + 300 + 7, 0)


async def test_release_settle_throttle_and_lift(twin: Any, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 10, 60_000)
    permit = await twin.try_acquire(me, [window], cost=5)
    assert permit.id is not None
    assert await twin.settle(permit.id, {window.key: 2}) is True
    assert (await twin.peek(me, [window])).limits[0].used == 2
    assert await twin.release(permit.id) is True
    assert await twin.release(permit.id) is False
    assert await twin.settle(permit.id, {window.key: 1}) is False

    until_at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=30)
    assert await twin.throttle(me, until_at) == until_at
    assert await twin.throttle(me, until_at - timedelta(seconds=10)) == until_at  # only extends
    with pytest.raises(Refused) as refused:
        await twin.try_acquire(me, [window])
    assert (refused.value.reason, refused.value.limit, refused.value.retry_at) == ("throttle", me, until_at)
    assert await twin.lift(me) is True
    assert await twin.lift(me) is False
    assert (await twin.try_acquire(me, [window], permit=False)).id is None


async def test_bad_requests_name_the_field_and_change_nothing(twin: Any, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1, 60_000)
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: twin.acquire("", [window]), "key"),
        (lambda: twin.acquire(me, [window, Limit.window(window.key, 2, 10)]), "limits[1].key"),
        (lambda: twin.acquire(me, [window], cost=-1), "cost"),
        (lambda: twin.acquire(me, [window], max_wait=-1), "max_wait"),
        (lambda: twin.acquire(me, [window], hold_ms=0), "hold_ms"),
        (lambda: twin.acquire(me, [window], grace_ms=50), "grace_ms"),
        (lambda: twin.try_acquire(me, ["not a limit"]), "limits[0]"),
        (lambda: twin.release(""), "permit"),
        (lambda: twin.settle("p-1", {}), "costs"),
        (lambda: twin.throttle(me, datetime(2030, 1, 1)), "until"),
    ]
    for call, field in cases:
        with pytest.raises(BadRequest) as bad:
            await call()
        assert bad.value.field == field, (field, bad.value)
        assert isinstance(bad.value, ValueError)
    # The server's own 400s name the field too: a throttle more than 24 hours ahead.
    with pytest.raises(BadRequest) as bad:
        await twin.throttle(me, datetime.now(timezone.utc) + timedelta(days=2))
    assert bad.value.field == "until", bad.value
    # ... and a settle naming a bucket the grant does not count in.
    permit = await twin.try_acquire(me, [window])
    with pytest.raises(BadRequest) as bad:
        await permit.settle({f"{prefix}/other": 1})
    assert bad.value.field is not None and bad.value.field.startswith("costs"), bad.value
    peek = await twin.peek(me, [window])
    assert peek.limits[0].used == 1  # nothing changed


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Limit.window("k", 0, 1000), "calls"),
        (lambda: Limit.window("k", 10**9 + 1, 1000), "calls"),
        (lambda: Limit.window("k", 1, 0), "per_ms"),
        (lambda: Limit.window("k", 1, 2_678_400_001), "per_ms"),
        (lambda: Limit.window("k", 1, 1.5), "per_ms"),
        (lambda: Limit.window("k", True, 1000), "calls"),
        (lambda: Limit.window("k", 1, 1000, cost=10**9 + 1), "cost"),
        (lambda: Limit.concurrent("k", 0), "concurrency"),
        (lambda: Limit.concurrent("k", 10**6 + 1), "concurrency"),
        (lambda: Limit.concurrent("k", 1, hold_ms=86_400_001), "hold_ms"),
        (lambda: Limit.window("", 1, 1000), "key"),
        (lambda: Limit.window("x" * 513, 1, 1000), "key"),
        (lambda: Limit("k"), "calls"),
        (lambda: Limit("k", calls=1), "per_ms"),
    ],
)
def test_limits_are_checked_with_the_wire_bounds(make: Callable[[], Limit], field: str) -> None:
    # In a request, the error names the limit by its place, as the server's own errors do.
    with pytest.raises(BadRequest) as bad:
        AcquireRequest.build("me", [Limit.window("ok", 1, 1000), make()])
    assert bad.value.field == f"limits[1].{field}"
    assert str(bad.value).startswith("limits[1]"), bad.value
    # Alone, Limit.check() names the field itself.
    with pytest.raises(BadRequest) as alone:
        make().check()
    assert alone.value.field == field


def test_limits_at_the_bounds_are_accepted() -> None:
    assert Limit.window("é" * 256, 10**9, 2_678_400_000, cost=0).to_wire() == {
        "key": "é" * 256,
        "calls": 10**9,
        "perMs": 2_678_400_000,
        "cost": 0,
    }
    both = Limit("k", calls=1, per_ms=1, concurrency=10**6, hold_ms=86_400_000)
    assert both.to_wire() == {"key": "k", "calls": 1, "perMs": 1, "concurrent": 10**6, "holdMs": 86_400_000}


@pytest.mark.parametrize("kind", TWINS)
async def test_an_unreachable_server_is_unavailable(kind: str) -> None:
    twin = make_twin(kind, "http://127.0.0.1:9", timeout=2.0)
    try:
        with pytest.raises(Unreachable) as error:
            await twin.try_acquire("me", [Limit.window("k", 1, 1000)])
        assert isinstance(error.value, Unavailable)
    finally:
        await close_twin(twin)


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = start_server(tmp_path_factory.mktemp("token"), token="s3cret")
    yield started
    started.stop()


@pytest.mark.parametrize("kind", TWINS)
async def test_the_token_is_sent_as_a_bearer(kind: str, token_server: Server, prefix: str) -> None:
    window = Limit.window(f"{prefix}/rpm", 5, 60_000)
    for token in (None, "wrong"):
        twin = make_twin(kind, token_server.url, token=token)
        try:
            with pytest.raises(Unauthorized):
                await twin.try_acquire("me", [window])
        finally:
            await close_twin(twin)
    twin = make_twin(kind, token_server.url, token="s3cret")
    try:
        assert (await twin.try_acquire("me", [window])).at is not None
    finally:
        await close_twin(twin)


async def test_the_limit_decorator_waits_and_releases(twin: Any, prefix: str) -> None:
    me = f"{prefix}/me"
    window, conc = Limit.window(f"{prefix}/rps", 2, 400), Limit.concurrent(f"{prefix}/conc", 1)
    calls: list[float] = []
    waits: list[WaitReport] = []
    (twin.limiter if twin.kind == "sync" else twin).on_wait = waits.append
    if twin.kind == "sync":
        limiter: Limiter = twin.limiter

        @limiter.limit(me, [window, conc], max_wait=5)
        def work(n: int) -> int:
            calls.append(time.monotonic())
            return n * 2

        results = [await asyncio.to_thread(work, n) for n in range(3)]
        with pytest.raises(TypeError, match="AsyncLimiter.limit"):

            @limiter.limit(me, [window])
            async def wrong() -> None: ...

    else:
        alimiter: AsyncLimiter = twin

        @alimiter.limit(me, [window, conc], max_wait=5)
        async def awork(n: int) -> int:
            calls.append(time.monotonic())
            return n * 2

        results = [await awork(n) for n in range(3)]
        with pytest.raises(TypeError, match="Limiter.limit"):

            @alimiter.limit(me, [window])
            def wrong() -> None: ...

    assert results == [0, 2, 4]
    assert len(calls) == 3
    assert [w.limit for w in waits if w.reason == "rate"] == [window.key]  # the third call waited for the window
    assert (await twin.peek(me, [window, conc])).limits[1].held == 0  # every place released


class SkewedClock(Clock):
    """A host whose wall clock is off by ``skew`` seconds; records the sleeps."""

    def __init__(self, skew: float) -> None:
        self.skew = skew
        self.sleeps: list[float] = []

    def wall(self) -> float:
        return time.time() + self.skew

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(seconds)


@pytest.mark.parametrize("kind", TWINS)
@pytest.mark.parametrize("skew", [-3600.0, 3600.0])
async def test_sleeps_are_sized_on_the_server_clock_whatever_the_host_clock(
    kind: str, skew: float, server: Server, prefix: str
) -> None:
    clock = SkewedClock(skew)
    twin = make_twin(kind, server.url, clock=clock, wakes=False)
    try:
        me, window = f"{prefix}/me", Limit.window(f"{prefix}/rps", 1, 500)
        first = await twin.acquire(me, [window], permit=False)
        second = await twin.acquire(me, [window], permit=False, max_wait=5)
        assert second.at - first.at >= 500 * MS
        assert len(clock.sleeps) == 1, clock.sleeps  # one sleep, right to the retryAt
        assert 0 < clock.sleeps[0] <= 0.5
        assert abs((twin.server_now() - datetime.now(timezone.utc)).total_seconds()) < 1.0
    finally:
        await close_twin(twin)


async def test_on_wait_reports_every_sleep(server: Server, prefix: str) -> None:
    reports: list[WaitReport] = []
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rps", 1, 300)
    async with AsyncLimiter(server.url, on_wait=reports.append) as limiter:
        await limiter.acquire(me, [window])
        await limiter.acquire(me, [window])
    assert [(r.reason, r.limit) for r in reports] == [("rate", window.key)]
    assert 0 < reports[0].waited <= 0.3


class SignallingClock(Clock):
    """Tells the test when a wait has gone to sleep."""

    def __init__(self) -> None:
        self.sleeping = asyncio.Event()

    async def asleep(self, seconds: float) -> None:
        self.sleeping.set()
        await asyncio.sleep(seconds)


async def held_none(limiter: AsyncLimiter, me: str, conc: Limit, why: object, seconds: float = 1.0) -> None:
    """Polls the limiter's figures (not a timing) until no place of ``conc`` is held."""
    deadline = time.monotonic() + seconds
    while (await limiter.peek(me, [conc])).limits[0].held != 0:
        assert time.monotonic() < deadline, f"a place is still held: {why}"
        await asyncio.sleep(0.01)


async def test_cancelling_a_wait_leaves_the_line_and_releases_a_late_grant(server: Server, prefix: str) -> None:
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
    clock = SignallingClock()
    async with AsyncLimiter(server.url, clock=clock, wakes=False) as limiter:
        holder = await limiter.acquire(me, [conc])
        waiting = asyncio.ensure_future(limiter.acquire(me, [conc]))
        await clock.sleeping.wait()  # it asked, was refused, and sleeps on its retryAt
        assert limiter.waiting(me, [conc]) == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert limiter.waiting(me, [conc]) == 0
        assert await holder.release() is True
        # Cancel at every point of an acquire, the request in flight included: no place leaks.
        # The cancelled task ends at once; a grant that arrives after it is released in the
        # background, within a second.
        for spins in range(12):
            task = asyncio.ensure_future(limiter.acquire(me, [conc]))
            for _ in range(spins):
                await asyncio.sleep(0)
            task.cancel()
            try:
                permit = await task
                await permit.release()
            except asyncio.CancelledError:
                pass
            assert limiter.waiting(me, [conc]) == 0
            await held_none(limiter, me, conc, spins)


async def test_a_cancelled_body_still_releases(server: Server, prefix: str) -> None:
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
    async with AsyncLimiter(server.url) as limiter:
        entered = asyncio.Event()

        async def body() -> None:
            async with limiter.acquire(me, [conc]):
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.ensure_future(body())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await limiter.peek(me, [conc])).limits[0].held == 0


def test_the_sync_twin_is_a_plain_context_manager(server: Server, prefix: str, tmp_path: Path) -> None:
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 2)
    with Limiter(server.url) as limiter:
        with limiter.acquire(me, [conc]) as permit:
            assert limiter.peek(me, [conc]).limits[0].held == 1
        assert permit.released
        assert limiter.peek(me, [conc]).limits[0].held == 0
