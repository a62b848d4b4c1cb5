"""Wake-ups (wire section 15): a waiter is served when a place frees, not a recheck later.

Every test here runs against a server that tells a concurrency waiter to ask again only in a
minute (``slow_server``: ``--recheck-ms 60000``), so a waiter served within seconds was woken:
by the limiter's ``/wait`` (a release through another client), or by its own limiter (a
release through it, even when ``/wait`` answers 404). Margins are generous: the machine may be
busy.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from conftest import TWINS, Server, close_twin, make_twin
from proxy import NOT_FOUND, PASS, Proxy, Seen
from redb_limiter import AsyncLimiter, Limit

#: Far less than the minute a waiter is told to wait, far more than a wake takes.
WOKEN_WITHIN = 5.0


async def queued(server: Server, prefix: str) -> int:
    async with httpx.AsyncClient() as client:
        state = (await client.get(f"{server.url}/state", params={"prefix": prefix})).json()
    return sum(int(b.get("queued") or 0) for b in state["buckets"])


async def until(condition: Any, seconds: float = 10.0) -> None:
    """Polls ``condition`` (a state, not a timing) until it holds."""
    deadline = time.monotonic() + seconds
    while not await condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


def refusals(proxy: Proxy) -> int:
    return sum(1 for s in proxy.requests("/acquire") if isinstance(s.reply, dict) and s.reply.get("granted") is False)


@pytest.mark.parametrize("kind", TWINS)
async def test_a_release_through_another_client_wakes_a_waiting_head(
    kind: str, slow_server: Server, prefix: str
) -> None:
    holder_side = AsyncLimiter(slow_server.url)
    twin = make_twin(kind, slow_server.url)
    try:
        me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
        holder = await holder_side.acquire(me, [conc])
        waiter = asyncio.ensure_future(twin.acquire(me, [conc], max_wait=120))
        await until(lambda: _at_least(queued(slow_server, prefix), 1))  # refused, holding a ticket
        await asyncio.sleep(0.3)  # on its way into /wait (a release before it is met at once)
        released = time.monotonic()
        assert await holder.release() is True
        permit = await asyncio.wait_for(waiter, 30)
        assert time.monotonic() - released < WOKEN_WITHIN  # not the minute of its retryAt
        await permit.release()
    finally:
        await holder_side.aclose()
        await close_twin(twin)


async def _at_least(count: Any, expected: int) -> bool:
    return bool(await count >= expected)


@pytest.mark.parametrize("kind", TWINS)
async def test_a_release_through_the_same_client_wakes_it_without_wait_and_the_404_is_remembered(
    kind: str, slow_server: Server, prefix: str
) -> None:
    def rule(seen: Seen) -> Any:
        return NOT_FOUND if seen.path == "/wait" else PASS

    with Proxy(slow_server.url, rule) as proxy:
        twin = make_twin(kind, proxy.url)
        try:
            me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
            for round in (1, 2):
                holder = await twin.acquire(me, [conc])
                waiter = asyncio.ensure_future(twin.acquire(me, [conc], max_wait=120))
                await asyncio.to_thread(proxy.wait_for, lambda: refusals(proxy) >= round)
                await asyncio.sleep(0.3)  # past its /wait (answered 404), asleep to its retryAt
                released = time.monotonic()
                assert await holder.release() is True
                permit = await asyncio.wait_for(waiter, 30)
                assert time.monotonic() - released < WOKEN_WITHIN
                await permit.release()
            assert len(proxy.requests("/wait")) == 1  # the 404 was remembered
        finally:
            await close_twin(twin)


@pytest.mark.parametrize("kind", TWINS)
async def test_a_release_through_the_same_client_leaves_a_pending_wait_to_the_limiter(
    kind: str, slow_server: Server, prefix: str
) -> None:
    """Another host's ticket stands first: the release through this client frees the room for
    it, and this client's waiter, on ``/wait`` behind it, keeps waiting rather than ask (an ask
    the line would refuse); the limiter answers its wait when its own turn comes."""
    other = AsyncLimiter(slow_server.url)
    with Proxy(slow_server.url) as proxy:
        twin = make_twin(kind, proxy.url)
        try:
            conc = Limit.concurrent(f"{prefix}/conc", 1)
            holder = await twin.acquire(f"{prefix}/holder", [conc])
            first = asyncio.ensure_future(other.acquire(f"{prefix}/other", [conc], max_wait=120))
            await until(lambda: _is(queued(slow_server, prefix), 1))
            second = asyncio.ensure_future(twin.acquire(f"{prefix}/me", [conc], max_wait=120))
            await until(lambda: _is(queued(slow_server, prefix), 2))
            await asyncio.to_thread(proxy.wait_for, lambda: proxy.requests("/wait"))
            await asyncio.sleep(0.3)
            assert await holder.release() is True
            served = await asyncio.wait_for(first, 30)  # the other host's ticket, through its /wait
            await asyncio.sleep(0.3)
            assert refusals(proxy) == 1  # the second's first ask only: no ask at the release
            assert not second.done()
            released = time.monotonic()
            await served.release()
            permit = await asyncio.wait_for(second, 30)
            assert time.monotonic() - released < WOKEN_WITHIN
            assert refusals(proxy) == 1
            waits = proxy.requests("/wait")
            assert len(waits) == 1 and waits[0].reply["ready"], [w.reply for w in waits]
            await permit.release()
        finally:
            await other.aclose()
            await close_twin(twin)


async def test_cancelling_a_wait_ends_it_at_once_and_leaves_no_ticket(slow_server: Server, prefix: str) -> None:
    with Proxy(slow_server.url) as proxy:
        async with AsyncLimiter(proxy.url) as limiter:
            me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
            holder = await limiter.acquire(me, [conc])
            waiter = asyncio.ensure_future(limiter.acquire(me, [conc]))
            await asyncio.to_thread(proxy.wait_for, lambda: proxy.requests("/wait"))  # waiting on the limiter
            cancelled = time.monotonic()
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert time.monotonic() - cancelled < 1.0
            assert limiter.waiting(me, [conc]) == 0
            await until(lambda: _is(queued(slow_server, prefix), 0), 3.0)  # it left the line
            # The /wait it held ended too: answered (the ticket gone) or dropped.
            await asyncio.to_thread(proxy.wait_for, lambda: all(s.done.is_set() for s in proxy.requests("/wait")), 5.0)
            await holder.release()


@pytest.mark.parametrize("kind", TWINS)
async def test_max_wait_ends_a_pending_wait_at_once(kind: str, server: Server, prefix: str) -> None:
    twin = make_twin(kind, server.url)
    try:
        me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
        holder = await twin.acquire(me, [conc])
        started = time.monotonic()
        from redb_limiter import QueueTimeout

        with pytest.raises(QueueTimeout):
            await twin.acquire(me, [conc], max_wait=1.5)
        assert 1.4 <= time.monotonic() - started < 4.0
        await until(lambda: _is(queued(server, prefix), 0), 3.0)
        await holder.release()
    finally:
        await close_twin(twin)


async def _is(count: Any, expected: int) -> bool:
    return bool(await count == expected)
