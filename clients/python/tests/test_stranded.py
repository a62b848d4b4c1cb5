"""Nothing stranded: however a host stops waiting, it leaves its shape's line moving.

Against the real server, through a proxy of the tests' own (``proxy.py``) that delays, drops or
hangs its replies and records every request.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import TWINS, Server, close_twin, make_twin
from proxy import HANG, PASS, Act, Proxy, Seen
from redb_limiter import Limit, QueueTimeout, Unreachable

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


# The waits.


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
        assert len(proxy.requests("/acquire")) == 1  # only the head asked the hung server
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
