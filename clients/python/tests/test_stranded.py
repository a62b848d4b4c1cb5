"""Nothing stranded: however a host stops waiting -- its own timeout, ``max_wait``, a cancelled
task, Ctrl-C, a hung or dropped connection -- it gives up at once, leaves its shape's line
moving, and undoes by its id (wire section 16) an ask whose answer it never read.

Against the real server, through a proxy of the tests' own (``proxy.py``) that delays, drops or
hangs its replies and records every request. A server without section 16 answers
``release {id}`` with 400, which the client swallows; where the server keeps ids, the tests
also check that ``/state`` holds no stray place or ticket within a second.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import TWINS, Server, close_twin, make_twin
from proxy import HANG, PASS, Act, Proxy, Seen
from redb_limiter import AsyncLimiter, Limit, QueueTimeout, Unreachable

WORKER = Path(__file__).with_name("interrupt_worker.py")


def on_acquire(act: Act) -> Callable[[Seen], Act]:
    return lambda seen: act if seen.path == "/acquire" else PASS


async def seen(proxy: Proxy, path: str, count: int = 1, seconds: float = 5.0) -> list[Seen]:
    """Polls the proxy's record (a state, not a timing) until ``count`` requests to ``path``
    have passed it, each with what the proxy was told to do with it done (so the server's
    status is in, when it was forwarded)."""
    deadline = time.monotonic() + seconds
    while True:
        found = proxy.requests(path)
        if len(found) >= count and all(s.done.is_set() for s in found):
            return found
        assert time.monotonic() < deadline, [(s.path, s.body) for s in proxy.seen]
        await asyncio.sleep(0.01)


async def nothing_stranded(server: Server, prefix: str, seconds: float = 1.0) -> None:
    """``/state`` lists no held place and no ticket under ``prefix`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient() as client:
        while True:
            state = (await client.get(f"{server.url}/state", params={"prefix": prefix})).json()
            stray = [b for b in state["buckets"] if b.get("placesHeld") or b.get("queued")]
            if not stray:
                return
            assert time.monotonic() < deadline, stray
            await asyncio.sleep(0.02)


def undo_body(ask: Seen, windows: list[Limit]) -> dict[str, Any]:
    body: dict[str, Any] = {"id": ask.json()["id"]}
    if windows:
        body["costs"] = [{"key": window.key, "cost": 0} for window in windows]
    return body


# Request ids.


@pytest.mark.parametrize("kind", TWINS)
async def test_every_ask_names_a_fresh_id(kind: str, proxy: Proxy, prefix: str) -> None:
    twin = make_twin(kind, proxy.url)
    try:
        me, window = f"{prefix}/me", Limit.window(f"{prefix}/rps", 1, 300)
        await twin.try_acquire(me, [window], permit=False)
        await twin.acquire(me, [window], max_wait=5, permit=False)  # refused, then asks again
    finally:
        await close_twin(twin)
    ids = [ask.json().get("id") for ask in proxy.requests("/acquire")]
    assert len(ids) >= 3, ids
    assert all(isinstance(i, str) and 1 <= len(i.encode()) <= 128 for i in ids), ids
    assert len(set(ids)) == len(ids), ids  # an ask again at a new retryAt is a new ask


@pytest.mark.parametrize("kind", TWINS)
async def test_an_ask_whose_answer_was_dropped_is_asked_again_under_the_same_id(
    kind: str, proxy: Proxy, prefix: str, server: Server, speaks_ids: bool
) -> None:
    dropped: list[Seen] = []

    def rule(seen: Seen) -> Act:
        if seen.path == "/acquire" and not dropped:
            dropped.append(seen)
            return Act(reply="drop")  # the server decided; the connection closes unanswered
        return PASS

    proxy.rule = rule
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 5, 60_000)
    twin = make_twin(kind, proxy.url)
    try:
        permit = await twin.acquire(me, [window], permit=False)
        assert permit.at is not None
        first, retry = await seen(proxy, "/acquire", 2)
        assert first.json()["id"] == retry.json()["id"]
        assert first.status == 200 and retry.answered
        if speaks_ids:  # the same grant, never counted twice
            assert (await twin.peek(me, [window])).limits[0].used == 1
    finally:
        await close_twin(twin)


@pytest.mark.parametrize("kind", TWINS)
async def test_a_client_timeout_in_flight_releases_the_ask_by_its_id(
    kind: str, proxy: Proxy, prefix: str, server: Server, speaks_ids: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redb_limiter")
    proxy.rule = on_acquire(Act(delay=0.6))  # the server grants; the answer comes too late
    me = f"{prefix}/me"
    window, conc = Limit.window(f"{prefix}/rpm", 10, 60_000), Limit.concurrent(f"{prefix}/conc", 4)
    twin = make_twin(kind, proxy.url, timeout=0.15)
    try:
        with pytest.raises(Unreachable):
            await twin.acquire(me, [window, conc])
        (ask,) = await seen(proxy, "/acquire")
        (release,) = await seen(proxy, "/release")
        assert release.json() == undo_body(ask, [window])  # costs of 0: the call counts nowhere
        assert release.at >= ask.at
        if speaks_ids:
            await nothing_stranded(server, prefix)
        else:
            assert release.status == 400  # a server without section 16: swallowed, as before
    finally:
        await close_twin(twin)
    # Nothing a caller must act on: no warning, no "Task exception was never retrieved".
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records


@pytest.mark.parametrize("kind", TWINS)
async def test_a_concurrency_only_ask_is_released_by_id_without_costs(kind: str, proxy: Proxy, prefix: str) -> None:
    proxy.rule = on_acquire(HANG)
    twin = make_twin(kind, proxy.url, timeout=0.2)
    try:
        with pytest.raises(Unreachable):
            await twin.try_acquire(f"{prefix}/me", [Limit.concurrent(f"{prefix}/conc", 1)])
        (ask,) = await seen(proxy, "/acquire")
        (release,) = await seen(proxy, "/release")
        assert release.json() == {"id": ask.json()["id"]}  # costs name window buckets only
    finally:
        await close_twin(twin)


# The waits.


@pytest.mark.parametrize("kind", TWINS)
async def test_max_wait_ends_an_ask_in_flight(kind: str, proxy: Proxy, prefix: str) -> None:
    proxy.rule = on_acquire(HANG)
    window = Limit.window(f"{prefix}/rpm", 10, 60_000)
    twin = make_twin(kind, proxy.url, timeout=5.0)
    try:
        started = time.monotonic()
        with pytest.raises(QueueTimeout):
            await twin.acquire(f"{prefix}/me", [window], max_wait=1.0)
        took = time.monotonic() - started
        assert took < 3.0, f"max_wait=1 with timeout=5 ended after {took:.2f} s"
        (ask,) = await seen(proxy, "/acquire")
        (release,) = await seen(proxy, "/release")
        assert release.json() == undo_body(ask, [window])
    finally:
        await close_twin(twin)


@pytest.mark.parametrize("timeout", [10.0, None])
async def test_cancelling_an_ask_in_flight_takes_effect_at_once(
    timeout: float | None, proxy: Proxy, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy.rule = on_acquire(HANG)
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
    limiter = AsyncLimiter(proxy.url, timeout=timeout)
    started = time.monotonic()
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(limiter.acquire(me, [conc]), 0.2)
    took = time.monotonic() - started
    assert took < 1.5, f"wait_for(acquire, 0.2) raised after {took:.2f} s"
    # A task cancelled while its ask is in flight actually ends.
    task = asyncio.ensure_future(limiter.acquire(me, [conc]))
    await seen(proxy, "/acquire", 2)
    cancelled = time.monotonic()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5.0)
    assert task in done and task.cancelled()
    assert time.monotonic() - cancelled < 1.0
    assert limiter.waiting(me, [conc]) == 0
    # Each abandoned ask is released by its id, in a task the cancellation did not stop.
    asks = proxy.requests("/acquire")
    releases = await seen(proxy, "/release", 2)
    assert sorted(r.json()["id"] for r in releases) == sorted(a.json()["id"] for a in asks)
    closing = time.monotonic()
    await limiter.aclose()  # the clean-ups are bounded: closing does not wait for the hung asks
    assert time.monotonic() - closing < 4.0
    gc.collect()  # an abandoned task whose exception nobody read would be reported now
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.records


@pytest.mark.parametrize("kind", TWINS)
async def test_a_hung_head_does_not_make_each_waiter_wait_a_timeout_more(kind: str, proxy: Proxy, prefix: str) -> None:
    proxy.rule = on_acquire(HANG)
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 10, 60_000)
    twin = make_twin(kind, proxy.url, timeout=1.0)
    try:
        started = time.monotonic()
        ended: list[float] = []

        async def call() -> BaseException | None:
            try:
                await twin.acquire(me, [window])
            except Exception as e:
                return e
            finally:
                ended.append(time.monotonic() - started)
            return None

        errors = await asyncio.gather(*(call() for _ in range(5)))
        assert all(isinstance(e, Unreachable) for e in errors), errors
        # Before: 1, 2, 3, 4 and 5 s. Each waiter met the head's failure, not a timeout of its own.
        assert max(ended) < 3.0, ended
        # Only the head asked the hung server (before, each waiter asked in turn); a caller that
        # a loaded machine started after the head's failure would be a new head and ask anew.
        assert len(proxy.requests("/acquire")) <= 2, proxy.requests("/acquire")
        assert twin.waiting(me, [window]) == 0
    finally:
        await close_twin(twin)


@pytest.mark.parametrize("kind", TWINS)
async def test_a_waiter_behind_a_hung_head_keeps_its_own_deadline(kind: str, proxy: Proxy, prefix: str) -> None:
    proxy.rule = on_acquire(HANG)
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 10, 60_000)
    twin = make_twin(kind, proxy.url, timeout=5.0)
    try:
        head = asyncio.ensure_future(twin.acquire(me, [window]))
        await seen(proxy, "/acquire")
        started = time.monotonic()
        with pytest.raises(QueueTimeout) as timeout:
            await twin.acquire(me, [window], max_wait=0.5)
        assert time.monotonic() - started < 2.5
        assert timeout.value.last is None  # it never asked: it waited behind the head
        with pytest.raises(Unreachable):
            await head
    finally:
        await close_twin(twin)


# Ctrl-C in the sync client: SIGINT to the main thread of a process of its own.


def interrupted(server: Server, prefix: str, scenario: str) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, str(WORKER), server.url, prefix, scenario], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    found: dict[str, Any] = json.loads(run.stdout)
    return found


def test_ctrl_c_behind_the_head_leaves_the_line_moving(server: Server, prefix: str) -> None:
    found = interrupted(server, prefix, "queued")
    assert found["interrupted"] is True
    assert found["waiting_after"] == 2  # the head, and the caller behind the interrupted one
    assert "head_granted" in found
    # The caller behind is served as soon as the server has room; before, the turn went to the
    # interrupted caller, and it waited out its max_wait (10 s) with the place free.
    assert found["next"]["served"] is True, found["next"]
    assert found["next"]["after_release"] < 5.0, found["next"]
    assert found["waiting_at_end"] == 0


async def test_ctrl_c_during_an_acquire_releases_its_ask_by_id(server: Server, prefix: str, speaks_ids: bool) -> None:
    found = await asyncio.to_thread(interrupted, server, prefix, "in_flight")
    assert found["interrupted"] is True
    assert found["first"]["status"] == 200 and found["first"]["reply"]["granted"] is True
    assert found["waiting_after"] == 0
    assert found["next"]["served"] is True, found["next"]
    undo = {"id": found["first"]["body"]["id"], "costs": [{"key": f"{prefix}/rpm", "cost": 0}]}
    assert undo in [release["body"] for release in found["releases"]], found["releases"]
    if speaks_ids:
        await nothing_stranded(server, prefix)
