"""One process of the Ctrl-C tests: the sync client in the main thread, interrupted as Ctrl-C
interrupts it (SIGINT to the main thread, raising KeyboardInterrupt wherever it waits), with a
proxy of the tests' own between it and the server.

Usage: python interrupt_worker.py URL PREFIX SCENARIO. Prints one JSON object of findings.

- ``queued``: a place is held; a helper thread's caller is the head of the shape's line, asking
  and sleeping; the main thread's caller of the same shape waits behind it, a third behind that,
  and the main thread's is interrupted. Then the place is freed: the head is granted, and the
  third must be served as soon as the head releases.
- ``in_flight``: the main thread's caller is interrupted while its acquire is in flight (the
  proxy holds the server's grant back). Its ask must be released by id, and the next caller
  of the shape served.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy import PASS, Act, Proxy, Seen  # noqa: E402

from redb_limiter import Limit, Limiter  # noqa: E402

MAIN = threading.main_thread().ident


def interrupt_main_when(condition: Callable[[], bool]) -> threading.Thread:
    """A helper thread that sends SIGINT to the main thread once ``condition`` holds."""

    def run() -> None:
        deadline = time.monotonic() + 30
        while not condition():
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        assert MAIN is not None
        signal.pthread_kill(MAIN, signal.SIGINT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def served_within(limiter: Limiter, me: str, limits: list[Limit], seconds: float) -> dict[str, Any]:
    """The next caller of the shape: how long until it was served (or what ended it)."""
    started = time.monotonic()
    try:
        with limiter.acquire(me, limits, max_wait=seconds):
            return {"served": True, "after": time.monotonic() - started}
    except Exception as e:  # QueueTimeout when the line is blocked
        return {"served": False, "after": time.monotonic() - started, "error": repr(e)}


def queued(url: str, prefix: str) -> dict[str, Any]:
    me, conc = f"{prefix}/me", Limit.concurrent(f"{prefix}/conc", 1)
    with Proxy(url) as proxy, Limiter(proxy.url) as limiter:
        holder = limiter.try_acquire(me, [conc])
        found: dict[str, Any] = {}

        def head() -> None:
            with limiter.acquire(me, [conc], max_wait=30) as permit:
                found["head_granted"] = permit.at.isoformat()

        def third() -> None:  # queued behind the interrupted caller
            found["next"] = served_within(limiter, me, [conc], 10)
            found["next"]["after_release"] = time.monotonic() - found["released"]

        threads = [threading.Thread(target=head), threading.Thread(target=third)]
        threads[0].start()
        while not proxy.requests("/acquire")[1:]:  # the head asks (the holder asked first)
            time.sleep(0.005)

        def then_third() -> bool:
            if limiter.waiting(me, [conc]) == 2 and not threads[1].is_alive():
                threads[1].start()
            return limiter.waiting(me, [conc]) == 3

        interrupt_main_when(then_third)
        interrupted = False
        try:
            limiter.acquire(me, [conc], max_wait=30)
        except KeyboardInterrupt:
            interrupted = True
        found["waiting_after"] = limiter.waiting(me, [conc])
        found["released"] = time.monotonic()
        holder.release()
        for thread in threads:
            thread.join(30)
        del found["released"]
        return {**found, "interrupted": interrupted, "waiting_at_end": limiter.waiting(me, [conc])}


def in_flight(url: str, prefix: str) -> dict[str, Any]:
    me = f"{prefix}/me"
    limits = [Limit.window(f"{prefix}/rpm", 100, 60_000), Limit.concurrent(f"{prefix}/conc", 2)]
    held_back: list[Seen] = []

    def rule(seen: Seen) -> Act:
        if seen.path == "/acquire" and not held_back:
            held_back.append(seen)
            return Act(delay=5.0)  # forwarded: the server grants; its answer is held back
        return PASS

    with Proxy(url, rule) as proxy:
        with Limiter(proxy.url) as limiter:
            interrupt_main_when(lambda: bool(held_back) and held_back[0].status is not None)
            interrupted = False
            started = time.monotonic()
            try:
                limiter.acquire(me, limits, max_wait=30)
            except KeyboardInterrupt:
                interrupted = True
            took = time.monotonic() - started
            waiting_after = limiter.waiting(me, limits)
            following = served_within(limiter, me, limits, 10)
        # Closed: the limiter waited for its clean-ups, so every request it sent is in.
        return {
            "interrupted": interrupted,
            "took": took,
            "waiting_after": waiting_after,
            "next": following,
            "first": {"body": held_back[0].body, "status": held_back[0].status, "reply": held_back[0].reply},
            "releases": [{"body": s.body, "status": s.status} for s in proxy.requests("/release")],
        }


def main() -> None:
    # Ctrl-C raises KeyboardInterrupt, even when this process was started with SIGINT ignored
    # (as a shell starts background jobs).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    url, prefix, scenario = sys.argv[1], sys.argv[2], sys.argv[3]
    found = {"queued": queued, "in_flight": in_flight}[scenario](url, prefix)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
