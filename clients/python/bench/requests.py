"""What one request costs the host: sequential acquires through one ``AsyncLimiter`` (not run by
the tests).

Each batch asks ``--requests`` acquires one after another (each granted, no permit kept) in a
process of its own, and prints the wall time and the process's CPU time per request. Side by
side: ``--client DIR`` (repeatable) names a folder holding another build's ``redb_limiter``
package; each round measures every build in turn against the same server.

    python bench/requests.py --url http://127.0.0.1:7411 --rounds 3 --client EARLIER_SRC --client src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid


async def batch(url: str, requests: int) -> tuple[float, float]:
    from redb_limiter import AsyncLimiter, Limit

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000_000, 60_000)
    async with AsyncLimiter(url) as limiter:
        for _ in range(20):  # a connection open, the code paths warm
            await limiter.try_acquire(me, [window], permit=False)
        wall, cpu = time.monotonic(), time.process_time()
        for _ in range(requests):
            await limiter.try_acquire(me, [window], permit=False)
        return time.monotonic() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7411")
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", action="append", default=[], help="a folder with another build's redb_limiter")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.client:
            sys.path.insert(0, args.client[0])
        wall, cpu = asyncio.run(batch(args.url, args.requests))
        print(json.dumps({"wall": wall, "cpu": cpu}))
        return
    print(f"{args.requests} sequential acquires through one AsyncLimiter, per request")
    builds = args.client or [""]
    figures: dict[str, list[tuple[float, float]]] = {}
    for round_ in range(1, args.rounds + 1):
        for build in builds:
            command = [sys.executable, __file__, "--child", "--url", args.url, "--requests", str(args.requests)]
            command += ["--client", build] if build else []
            got = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
            wall, cpu = got["wall"] * 1e6 / args.requests, got["cpu"] * 1e6 / args.requests
            figures.setdefault(build, []).append((wall, cpu))
            print(f"  round {round_}, {build or 'installed'}: {wall:6.0f} µs wall, {cpu:6.0f} µs CPU", flush=True)
    for build, runs in figures.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"{build or 'installed'}: median {statistics.median(walls):.0f} µs wall"
            f" ({min(walls):.0f}-{max(walls):.0f}), {statistics.median(cpus):.0f} µs CPU"
            f" ({min(cpus):.0f}-{max(cpus):.0f}) per request"
        )


if __name__ == "__main__":
    main()
