"""What the clients take as input, checked before anything is sent: limits, named by their
place in the request as the server names them."""

from __future__ import annotations

import pytest

from conftest import TWINS, close_twin, make_twin
from proxy import Proxy
from redb_limiter import BadRequest, Limit


@pytest.mark.parametrize("kind", TWINS)
async def test_limit_errors_name_the_limit_by_its_place(kind: str, proxy: Proxy, prefix: str) -> None:
    twin = make_twin(kind, proxy.url)
    me, ok = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 10, 60_000)
    cases = [
        (Limit.window(f"{prefix}/b", 0, 1_000), "limits[1].calls"),
        (Limit.window(f"{prefix}/b", 1, 1_000, cost=-1), "limits[1].cost"),
        (Limit.concurrent(f"{prefix}/b", 10**6 + 1), "limits[1].concurrency"),
        (Limit(f"{prefix}/b", calls=5), "limits[1].per_ms"),
        (Limit(f"{prefix}/b"), "limits[1].calls"),
    ]
    try:
        for limit, field in cases:
            for call in (twin.acquire, twin.try_acquire, twin.peek):
                with pytest.raises(BadRequest) as bad:
                    await call(me, [ok, limit])
                assert bad.value.field == field and str(bad.value).startswith("limits[1]"), bad.value
    finally:
        await close_twin(twin)
    assert proxy.seen == []  # checked before sending
