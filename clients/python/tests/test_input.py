"""What the clients take as input, checked before anything is sent: the server's URL (any
case, a path, a query), the token (as the Authorization header carries it), and limits, named
by their place in the request as the server names them."""

from __future__ import annotations

import pytest

from conftest import TWINS, Server, close_twin, make_twin
from proxy import Proxy
from redb_limiter import BadRequest, Limit


@pytest.mark.parametrize("kind", TWINS)
async def test_a_token_with_surrounding_spaces_is_a_bad_argument(kind: str, server: Server) -> None:
    for token in (" s3cret", "s3cret\n", "s3cr\x00t", "sécret"):
        with pytest.raises(BadRequest) as bad:
            make_twin(kind, server.url, token=token)
        assert bad.value.field == "token", (token, bad.value)


@pytest.mark.parametrize("kind", TWINS)
async def test_urls_in_any_case_with_a_path_or_a_query(kind: str, proxy: Proxy, prefix: str) -> None:
    window = Limit.window(f"{prefix}/rpm", 10, 60_000)
    for url in (proxy.url.replace("http://", "HTTP://"), proxy.url + "/", proxy.url + "/?x=1"):
        twin = make_twin(kind, url)
        try:
            assert (await twin.try_acquire(f"{prefix}/me", [window], permit=False)).at is not None
        finally:
            await close_twin(twin)
    assert [ask.path for ask in proxy.requests("/acquire")] == ["/acquire", "/acquire", "/acquire?x=1"]
    for bad in ("ftp://127.0.0.1", "127.0.0.1:7411", "http://", "http:///acquire"):
        with pytest.raises(BadRequest) as error:
            make_twin(kind, bad)
        assert error.value.field == "url"


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
        (Limit.bucket(f"{prefix}/b", 0, 1_000), "limits[1].refill"),
        (Limit.bucket(f"{prefix}/b", 10**9 + 1, 1_000), "limits[1].refill"),
        (Limit.bucket(f"{prefix}/b", 5, 0), "limits[1].per_ms"),
        (Limit(f"{prefix}/b", refill=5), "limits[1].per_ms"),
        (Limit(f"{prefix}/b", calls=5, refill=5, per_ms=1_000), "limits[1].refill"),
        (Limit.bucket(f"{prefix}/b", 5, 1_000, burst=0), "limits[1].burst"),
        (Limit.bucket(f"{prefix}/b", 5, 1_000, burst=3, initial=4), "limits[1].initial"),
        (Limit.bucket(f"{prefix}/b", 5, 1_000, initial=6), "limits[1].initial"),
        (Limit.bucket(f"{prefix}/b", 5, 1_000, cost=-1), "limits[1].cost"),
        (Limit(f"{prefix}/b", calls=5, per_ms=1_000, burst=3), "limits[1].burst"),
        (Limit(f"{prefix}/b", calls=5, per_ms=1_000, initial=0), "limits[1].initial"),
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
