"""Adaptive ceilings (wire section 14) through both twins against the real server: ``Adapt`` on
a window, checked naming its field before anything is sent; a request that adapts asks for a
permit by itself; the ceiling starts at ``calls`` and is reported; a ``"limited"`` outcome cuts it
once for every grant made before the cut; ``throttle_from`` with the permit throttles and cuts;
``observe`` reads a low remaining count as limited; a body that raised reports no clean outcome."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from redb_limiter import Adapt, BadRequest, Limit, vendor_outcome


def rpm(prefix: str, adapt: Adapt) -> Limit:
    return Limit.window(f"{prefix}/rpm", 10, 60_000, adapt=adapt)


@pytest.mark.parametrize(
    ("adapt", "field"),
    [
        (Adapt(min=0), "limits[0].adapt.min"),
        (Adapt(min=11), "limits[0].adapt.min"),
        (Adapt(max=9), "limits[0].adapt.max"),
        (Adapt(increase=-1), "limits[0].adapt.increase"),
        (Adapt(keep_pct=100), "limits[0].adapt.keep_pct"),
    ],
)
async def test_adapt_is_checked_naming_its_field(twin: Any, prefix: str, adapt: Adapt, field: str) -> None:
    with pytest.raises(BadRequest) as bad:
        await twin.try_acquire(prefix, [rpm(prefix, adapt)])
    assert bad.value.field == field


async def test_adapt_needs_a_window_or_a_bucket_and_an_outcome_is_clean_or_limited(twin: Any, prefix: str) -> None:
    with pytest.raises(BadRequest) as bad:
        await twin.try_acquire(prefix, [Limit(f"{prefix}/c", concurrency=2, adapt=Adapt())])
    assert bad.value.field == "limits[0].adapt"
    with pytest.raises(BadRequest) as outcome:
        await twin.release("p", outcome="fine")
    assert outcome.value.field == "outcome"


async def test_a_limited_outcome_cuts_once_for_the_grants_before_the_cut(twin: Any, prefix: str) -> None:
    limit = rpm(prefix, Adapt(min=2, keep_pct=50))
    a = await twin.try_acquire(prefix, [limit])
    b = await twin.try_acquire(prefix, [limit])
    assert a.id is not None and b.id is not None, "an adapted request asks for a permit by itself"
    assert a.adapted and a.limits[0].ceiling == 10
    assert await a.release(outcome="limited")
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 5
    await b.release(outcome="limited")  # granted before the cut: the same overload
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 5
    c = await twin.try_acquire(prefix, [limit])
    await c.settle({limit.key: 1}, outcome="limited")
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 2
    await c.release()  # a later outcome of the same permit changes nothing
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 2


async def test_throttle_from_with_the_permit_cuts_and_observe_reads_a_floor(twin: Any, prefix: str) -> None:
    limit = rpm(prefix, Adapt(keep_pct=40))
    p = await twin.try_acquire(prefix, [limit])
    response = httpx.Response(429, headers={"retry-after": "1"})
    assert await twin.throttle_from(prefix, response, permit=getattr(p, "permit", p)) is not None
    assert p.outcome == "limited"
    peek = await twin.peek(prefix, [limit])
    assert peek.reason == "throttle" and peek.limits[0].ceiling == 4
    await p.release()
    await twin.lift(prefix)

    q = await twin.try_acquire(prefix, [limit])
    assert q.observe(httpx.Response(200, headers={"x-ratelimit-remaining-requests": "12"}), floor=3) == "clean"
    assert q.observe(httpx.Response(200, headers={"anthropic-ratelimit-requests-remaining": "3"}), floor=3) == "limited"
    assert q.observe(httpx.Response(200)) == "clean"
    assert q.outcome == "limited", "limited stays"
    assert q.observe(httpx.Response(500)) is None
    await q.release()
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 1


async def test_a_body_that_raised_reports_no_clean_outcome(twin: Any, prefix: str) -> None:
    limit = Limit.window(f"{prefix}/rpm", 10, 60_000, adapt=Adapt(increase=5, max=20))
    # Five grants held: the next fills the window past half the ceiling, so it is in play and a
    # clean outcome would grow it.
    permits = [await twin.try_acquire(prefix, [limit]) for _ in range(5)]
    with pytest.raises(RuntimeError):
        async with twin.acquire(prefix, [limit]):
            raise RuntimeError("provider down")
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 10
    async with twin.acquire(prefix, [limit]):
        pass
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 15
    for p in permits:
        await p.release(outcome="clean")  # grown within this window already: no second step
    assert (await twin.peek(prefix, [limit])).limits[0].ceiling == 15


def test_vendor_outcome() -> None:
    assert vendor_outcome(429, {}) == "limited"
    assert vendor_outcome(200, {"x-ratelimit-remaining-requests": "0"}) == "clean"  # no floor: only a 429
    assert vendor_outcome(200, {"x-ratelimit-remaining-requests": "2"}, floor=2) == "limited"
    assert vendor_outcome(503, {}) is None
    with pytest.raises(ValueError):
        vendor_outcome(200, {}, floor=-1)
