"""LangChain: chat models in two processes, paced by RedbRateLimiter, share one limit."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from langchain_core.rate_limiters import BaseRateLimiter

from conftest import Server
from redb_limiter import AsyncLimiter, Limit, Limiter, QueueTimeout
from redb_limiter.langchain import RedbRateLimiter

WORKER = Path(__file__).with_name("langchain_worker.py")


def test_two_processes_sharing_one_limit_never_exceed_it(server: Server, prefix: str) -> None:
    calls = 4
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), server.url, prefix, str(calls), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode in ("sync", "async")
    ]
    grants: list[datetime] = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        grants += [datetime.fromisoformat(at) for at in json.loads(out)]
    assert len(grants) == 2 * calls
    grants.sort()
    window = timedelta(milliseconds=1_000)
    for start in grants:  # 3 calls in any 1,000 ms, across both processes
        assert sum(1 for at in grants if start <= at < start + window) <= 3, grants
    assert grants[-1] - grants[0] >= 2 * window  # 8 calls at 3 a second took two full windows


def test_the_limiter_is_langchains_and_answers_without_blocking(server: Server, prefix: str) -> None:
    with Limiter(server.url) as limiter:
        paced = RedbRateLimiter(limiter, f"{prefix}/caller", [Limit.window(f"{prefix}/rpm", 1, 60_000)], max_wait=0.5)
        assert isinstance(paced, BaseRateLimiter)
        assert paced.acquire(blocking=False) is True
        assert paced.acquire(blocking=False) is False
        with pytest.raises(QueueTimeout):
            paced.acquire()


async def test_aacquire_with_either_twin(server: Server, prefix: str) -> None:
    limits = [Limit.window(f"{prefix}/rpm", 2, 60_000)]
    async with AsyncLimiter(server.url) as limiter:
        paced = RedbRateLimiter(limiter, f"{prefix}/caller", limits)
        assert await paced.aacquire() is True
    with Limiter(server.url) as sync_limiter:
        paced = RedbRateLimiter(sync_limiter, f"{prefix}/caller", limits)
        assert await paced.aacquire(blocking=False) is True
        assert await paced.aacquire(blocking=False) is False
        assert paced.acquire(blocking=False) is False


def test_aacquire_from_a_sync_limiter_works_in_each_event_loop(server: Server, prefix: str) -> None:
    with Limiter(server.url) as limiter:
        paced = RedbRateLimiter(limiter, f"{prefix}/caller", [Limit.window(f"{prefix}/rpm", 5, 60_000)])
        for _ in range(3):  # as a script calling asyncio.run per model call would
            assert asyncio.run(paced.aacquire()) is True
