"""The limiter's line (wire section 12): tickets, leaving the line, no overtaking across hosts.

These need a server that files tickets; `run-tests.sh` runs this file when the server does
(`line_probe.py` asks it) and says loudly that it did not otherwise. Every test here fails
against a server without tickets.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from conftest import TWINS, Server, close_twin, make_twin
from redb_limiter import AsyncLimiter, Limit, QueueTimeout

MS = timedelta(milliseconds=1)


async def until(condition: Callable[[], Any], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not await condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def queued(twin: Any, me: str, limit: Limit) -> int:
    """The tickets in the bucket's line. A peek that does not queue is told `queued` only while
    the line is not empty (section 12.7: a host that never queues sees the figures of section 9
    alone), so no `queued` is an empty line; `line_probe.py` made sure the server keeps one."""
    figures = (await twin.peek(me, [limit])).limits[0]
    return 0 if figures.queued is None else int(figures.queued)


async def test_a_waiting_acquire_holds_a_ticket_until_granted(twin: Any, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rps", 1, 800)
    fill = await twin.acquire(me, [window], permit=False)
    waiter = asyncio.ensure_future(twin.acquire(me, [window], max_wait=10, permit=False))
    await until(lambda: _is(queued(twin, me, window), 1))
    granted = await waiter
    assert granted.at - fill.at >= 800 * MS
    assert await queued(twin, me, window) == 0  # the grant ended the ticket


async def _is(count: Any, expected: int) -> bool:
    return bool(await count == expected)


@pytest.mark.parametrize("kind", TWINS)
async def test_a_timeout_leaves_the_line_at_once(kind: str, server: Server, prefix: str) -> None:
    twin = make_twin(kind, server.url)
    try:
        me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1, 60_000)
        await twin.acquire(me, [window], permit=False)
        with pytest.raises(QueueTimeout):
            await twin.acquire(me, [window], max_wait=1.0)
        # Left, not lapsed: a lapse would wait for the retryAt a minute away plus the grace.
        assert await queued(twin, me, window) == 0
        # Without `queue`, no ticket is filed at all.
        with pytest.raises(QueueTimeout):
            await twin.acquire(me, [window], max_wait=1.0, queue=False)
        assert await queued(twin, me, window) == 0
    finally:
        await close_twin(twin)


async def test_cancellation_leaves_the_line_at_once(server: Server, prefix: str) -> None:
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
    async with AsyncLimiter(server.url) as limiter:
        holder = await limiter.acquire(me, [conc])
        waiter = asyncio.ensure_future(limiter.acquire(me, [conc]))
        await until(lambda: _is(queued(limiter, me, conc), 1))
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter  # at once: the ticket is left in the background
        # Left, not lapsed: within a second, where a lapse takes the retryAt plus a 2 s grace.
        await until(lambda: _is(queued(limiter, me, conc), 0), seconds=1.0)
        await holder.release()


@pytest.mark.parametrize("kind", TWINS)
async def test_a_later_host_never_overtakes_a_ticket(kind: str, server: Server, prefix: str) -> None:
    """A large call waiting with its ticket is granted before small calls that another host
    (another limiter, as another process would be) asks for after it filed."""
    window = Limit.window(f"{prefix}/tps", 3, 600)
    first, second = make_twin(kind, server.url), make_twin(kind, server.url)
    try:
        fill = await first.acquire(f"{prefix}/a", [window], cost=3, permit=False)
        big = asyncio.ensure_future(first.acquire(f"{prefix}/a", [window], cost=3, max_wait=10, permit=False))
        await until(lambda: _is(queued(first, f"{prefix}/a", window), 1))
        small: list[datetime] = []
        for _ in range(3):
            permit = await second.acquire(f"{prefix}/b", [window], cost=1, max_wait=10, permit=False)
            small.append(permit.at)
        large = await big
        assert large.at >= fill.at + 600 * MS
        assert all(at >= large.at + 600 * MS for at in small), (large.at, small)
    finally:
        await close_twin(first)
        await close_twin(second)
