"""wait_retry_at: tenacity sleeps until the limiter's retryAt, and falls back otherwise."""

from __future__ import annotations

from datetime import timedelta

import pytest
import tenacity

from conftest import Server
from redb_limiter import Limit, Limiter, Permit, Refused, wait_retry_at


def test_tenacity_sleeps_until_retry_at(server: Server, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rps", 1, 400)
    attempts: list[int] = []
    sleeps: list[float] = []
    with Limiter(server.url) as limiter:

        @tenacity.retry(
            retry=tenacity.retry_if_exception_type(Refused),
            wait=wait_retry_at(),
            stop=tenacity.stop_after_attempt(5),
            sleep=lambda seconds: (sleeps.append(seconds), tenacity.nap.sleep(seconds))[1],
            reraise=True,
        )
        def call() -> Permit:
            attempts.append(1)
            return limiter.try_acquire(me, [window], permit=False)

        first = call()
        second = call()
    assert second.at - first.at >= timedelta(milliseconds=400)
    assert len(attempts) == 3, sleeps  # one refusal, one sleep right to its retryAt, one grant
    assert len(sleeps) == 1 and 0 < sleeps[0] <= 0.4


def test_other_failures_take_the_fallback() -> None:
    sleeps: list[float] = []
    for fallback, expected in [(0.25, 0.25), (tenacity.wait_fixed(0.5), 0.5)]:
        sleeps.clear()
        retrying = tenacity.Retrying(
            wait=wait_retry_at(fallback),
            stop=tenacity.stop_after_attempt(3),
            sleep=sleeps.append,
            reraise=True,
        )
        with pytest.raises(ValueError):
            retrying(lambda: (_ for _ in ()).throw(ValueError("not a refusal")))
        assert sleeps == [expected, expected]
