"""Hand-off through one concurrency limit: how soon a freed place is used (not run by the tests).

N calls of a fixed length through ``Limit.concurrent(key, places)``, split between two client
instances (two ``AsyncLimiter``, or with ``--sync`` two ``Limiter`` each in threads), all asked
at once; prints the wall time against the ideal (``calls * call_ms / places``), and where the
time goes: the acquires and waits sent per call (counted at the client's ``_post``, whatever
its transport) and the host process's CPU per call.
``--wakes-off`` also measures each build with wakes off (a waiter sleeps to each ``retryAt``,
as before wire 4).

Side by side: ``--client DIR`` (repeatable) names a folder holding another build's
``redb_limiter`` package (for example a copy of an earlier ``src``); each run measures every
build in turn, each batch in a process of its own. Without it, the installed package.

    python bench/handoff.py --url http://127.0.0.1:7411 [--calls 200] [--call-ms 10] [--places 4] [--sync]
    python bench/handoff.py --url ... --runs 5 --client /tmp/before --client src
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def counting(limiter: Any, sent: dict[str, int], is_async: bool) -> None:
    """Counts the limiter's requests by method, at its ``_post`` (any build, any transport)."""
    post = limiter._post

    def count(method: str, *args: Any, **kwargs: Any) -> Any:
        sent[method] = sent.get(method, 0) + 1
        return post(method, *args, **kwargs)

    limiter._post = count


async def run_async(url: str, calls: int, call_s: float, places: int, wakes: bool, sent: dict[str, int]) -> float:
    from redb_limiter import AsyncLimiter, Limit

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", places)
    clients = [AsyncLimiter(url, wakes=wakes, timeout=60), AsyncLimiter(url, wakes=wakes, timeout=60)]
    for c in clients:
        await c.peek(me, [conc])  # opens a connection first: the run measures hand-offs
        counting(c, sent, True)

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


def run_sync(url: str, calls: int, call_s: float, places: int, wakes: bool, sent: dict[str, int]) -> float:
    from redb_limiter import Limit, Limiter

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", places)
    clients = [Limiter(url, wakes=wakes, timeout=60), Limiter(url, wakes=wakes, timeout=60)]
    for c in clients:
        c.peek(me, [conc])
        counting(c, sent, False)

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


def child(args: argparse.Namespace) -> None:
    """One batch with one build, its figures printed as JSON."""
    if args.client:
        sys.path.insert(0, args.client[0])
    sent: dict[str, int] = {}
    run = run_sync if args.sync else lambda *a: asyncio.run(run_async(*a))
    cpu = time.process_time()
    wall = run(args.url, args.calls, args.call_ms / 1000, args.places, not args.off, sent)
    print(json.dumps({"wall": wall, "sent": sent, "cpu": time.process_time() - cpu}))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7411")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--call-ms", type=int, default=10)
    parser.add_argument("--places", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--sync", action="store_true", help="two Limiter in threads, not two AsyncLimiter")
    parser.add_argument("--client", action="append", default=[], help="a folder with another build's redb_limiter")
    parser.add_argument("--wakes-off", action="store_true", help="also measure each build with wakes off")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--off", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    ideal = args.calls * args.call_ms / 1000 / args.places
    twin = "sync Limiter" if args.sync else "AsyncLimiter"
    print(f"{args.calls} calls of {args.call_ms} ms through concurrent: {args.places}, two {twin}; ideal {ideal:.2f} s")
    builds = args.client or [""]
    modes = [False, True] if args.wakes_off else [False]
    walls: dict[tuple[str, bool], list[float]] = {}
    cpus: dict[tuple[str, bool], list[float]] = {}
    for run in range(1, args.runs + 1):
        for build in builds:
            for off in modes:
                command = [sys.executable, __file__, "--child", "--url", args.url, "--calls", str(args.calls)]
                command += ["--call-ms", str(args.call_ms), "--places", str(args.places)]
                command += (["--client", build] if build else []) + (["--sync"] if args.sync else [])
                command += ["--off"] if off else []
                figures = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
                wall, sent = figures["wall"], figures["sent"]
                walls.setdefault((build, off), []).append(wall)
                cpus.setdefault((build, off), []).append(figures["cpu"] * 1000 / args.calls)
                print(
                    f"  run {run}, {build or 'installed'}{' (wakes off)' if off else ''}: {wall:6.3f} s"
                    f" ({wall / ideal:4.2f}x ideal); {sent.get('acquire', 0) / args.calls:.2f} acquires"
                    f" and {sent.get('wait', 0) / args.calls:.2f} waits per call;"
                    f" CPU {figures['cpu'] * 1000 / args.calls:.2f} ms per call",
                    flush=True,
                )
    for (build, off), ws in walls.items():
        median = statistics.median(ws)
        print(
            f"{build or 'installed'}{' (wakes off)' if off else ''}: median {median:.3f} s = {median / ideal:.2f}x"
            f" the ideal (best {min(ws):.3f} s, worst {max(ws):.3f} s);"
            f" CPU {statistics.median(cpus[(build, off)]):.2f} ms per call (median)"
        )


if __name__ == "__main__":
    main()
