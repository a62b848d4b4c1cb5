"""Hand-off through one concurrency limit: how soon a freed place is used (not run by the tests).

N calls of a fixed length through ``Limit.concurrent(key, places)``, split between two client
instances (two ``AsyncLimiter``, or with ``--sync`` two ``Limiter`` each in threads), all asked
at once; prints the wall time against the ideal (``calls * call_ms / places``), with wakes off
(a waiter sleeps to each ``retryAt``, as before wire 4) and on.

    python bench/handoff.py --url http://127.0.0.1:7411 [--calls 200] [--call-ms 10] [--places 4] [--sync]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from redb_limiter import AsyncLimiter, Limit, Limiter


async def run_async(url: str, calls: int, call_s: float, places: int, wakes: bool) -> float:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", places)
    clients = [AsyncLimiter(url, wakes=wakes, timeout=60), AsyncLimiter(url, wakes=wakes, timeout=60)]

    async def call(limiter: AsyncLimiter) -> None:
        async with limiter.acquire(me, [conc], permit=False):
            await asyncio.sleep(call_s)

    try:
        started = time.monotonic()
        await asyncio.gather(*(call(clients[i % 2]) for i in range(calls)))
        return time.monotonic() - started
    finally:
        for c in clients:
            await c.aclose()


def run_sync(url: str, calls: int, call_s: float, places: int, wakes: bool) -> float:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", places)
    clients = [Limiter(url, wakes=wakes, timeout=60), Limiter(url, wakes=wakes, timeout=60)]

    def call(i: int) -> None:
        with clients[i % 2].acquire(me, [conc], permit=False):
            time.sleep(call_s)

    try:
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=calls) as pool:
            list(pool.map(call, range(calls)))
        return time.monotonic() - started
    finally:
        for c in clients:
            c.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7411")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--call-ms", type=int, default=10)
    parser.add_argument("--places", type=int, default=4)
    parser.add_argument("--sync", action="store_true", help="two Limiter in threads, not two AsyncLimiter")
    args = parser.parse_args()
    ideal = args.calls * args.call_ms / 1000 / args.places
    twin = "sync Limiter" if args.sync else "AsyncLimiter"
    print(f"{args.calls} calls of {args.call_ms} ms through concurrent: {args.places}, two {twin}; ideal {ideal:.2f} s")
    for wakes in (False, True):
        if args.sync:
            wall = run_sync(args.url, args.calls, args.call_ms / 1000, args.places, wakes)
        else:
            wall = asyncio.run(run_async(args.url, args.calls, args.call_ms / 1000, args.places, wakes))
        print(f"  wakes {'on ' if wakes else 'off'}: {wall:6.2f} s  ({wall / ideal:4.1f}x ideal)")


if __name__ == "__main__":
    main()
