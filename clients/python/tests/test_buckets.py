"""Token buckets (wire section 13) through both twins against the real server: a bucket starts
full (or at ``initial``), a grant takes its cost, a refusal's ``retry_at`` is the millisecond the
level refills to it, a settle gives back or takes more (into debt), and every reply carries the
bucket's ``level`` and ``burst``. Refills here are slow (a token a second or slower), so the
figures a test reads are exact however slowly a loaded machine answers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from redb_limiter import BadRequest, Limit, Refused

MS = timedelta(milliseconds=1)


async def test_a_bucket_starts_full_and_a_refusal_names_the_instant_it_refills(twin: Any, prefix: str) -> None:
    me = f"{prefix}/me"
    bucket = Limit.bucket(f"{prefix}/itpm", 10, 10_000)  # a token a second, burst 10
    peek = await twin.peek(me, [bucket], 10)
    assert peek.fits and (peek.limits[0].level, peek.limits[0].burst) == (10, 10)
    first = await twin.try_acquire(me, [bucket], 10)
    assert (first.limits[0].key, first.limits[0].level, first.limits[0].burst) == (bucket.key, 0, 10)
    with pytest.raises(Refused) as refused:
        await twin.try_acquire(me, [bucket], 1)
    assert refused.value.reason == "rate" and refused.value.limit == bucket.key
    assert refused.value.retry_at == first.at + 1_000 * MS  # one token a second, to the millisecond
    assert refused.value.limits[0].level == 0 and refused.value.limits[0].burst == 10
    # A cost above burst counts as burst: it waits for a full bucket, ten seconds after the take.
    with pytest.raises(Refused) as whole:
        await twin.try_acquire(me, [bucket], 25)
    assert whole.value.retry_at == first.at + 10_000 * MS
    # A cost of 0 always fits.
    assert (await twin.try_acquire(me, [bucket], 0)).limits[0].level == 0


async def test_a_bucket_starts_at_initial_when_asked(twin: Any, prefix: str) -> None:
    me = f"{prefix}/me"
    bucket = Limit.bucket(f"{prefix}/b", 1, 60_000, burst=5, initial=2)
    peek = await twin.peek(me, [bucket])
    assert (peek.limits[0].level, peek.limits[0].burst) == (2, 5)  # a peek reads initial
    assert (await twin.try_acquire(me, [bucket], 2)).limits[0].level == 0
    with pytest.raises(Refused):
        await twin.try_acquire(me, [bucket], 1)


async def test_settle_gives_back_and_takes_into_debt(twin: Any, prefix: str) -> None:
    me = f"{prefix}/me"
    bucket = Limit.bucket(f"{prefix}/otpm", 1, 3_600_000, burst=10)  # a token an hour
    big = await twin.try_acquire(me, [bucket], 8)
    assert big.limits[0].level == 2
    assert await big.settle({bucket.key: 3})  # 5 back
    assert (await twin.peek(me, [bucket])).limits[0].level == 7
    small = await twin.try_acquire(me, [bucket], 7)
    assert small.limits[0].level == 0
    assert await big.settle({bucket.key: 10})  # 7 more than the 3: the bucket owes them
    assert (await twin.peek(me, [bucket])).limits[0].level == -7
    with pytest.raises(Refused):
        await twin.try_acquire(me, [bucket], 1)
    assert await small.release({bucket.key: 0})  # all 7 back
    assert (await twin.peek(me, [bucket])).limits[0].level == 0


async def test_a_bucket_with_places(twin: Any, prefix: str) -> None:
    me = f"{prefix}/me"
    both = Limit(f"{prefix}/b", refill=100, per_ms=60_000, concurrency=1)
    async with twin.acquire(me, [both], 5) as permit:
        figures = permit.limits[0]
        assert (figures.level, figures.burst, figures.held, figures.free) == (95, 100, 1, 0)
        with pytest.raises(Refused) as refused:
            await twin.try_acquire(me, [both])
        assert refused.value.reason == "concurrency"
    peek = await twin.peek(me, [both])
    assert (peek.limits[0].level, peek.limits[0].held) == (95, 0)


async def test_hosts_naming_one_bucket_with_other_figures_and_a_bad_initial(twin: Any, prefix: str) -> None:
    # One bucket named with a burst above its first: the answer is the server's, never a level
    # above the largest burst named.
    me, key = f"{prefix}/me", f"{prefix}/b"
    await twin.try_acquire(me, [Limit.bucket(key, 1, 3_600_000, burst=3)], 0)
    peek = await twin.peek(me, [Limit.bucket(key, 1, 3_600_000, burst=9)])
    assert peek.limits[0].burst == 9 and peek.limits[0].level is not None and peek.limits[0].level <= 9
    with pytest.raises(BadRequest) as bad:
        await twin.try_acquire(me, [Limit.bucket(key, 1, 1_000, initial=2)])
    assert bad.value.field == "limits[0].initial"
