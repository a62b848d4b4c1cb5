"""The line holds no host hostage (wire section 12.9): every ask in the line sends what remains
of ``max_wait`` as ``maxWaitMs``, and a refusal that files no ticket says why (``noTicket``).

First both twins against a scripted transport (no server): the bodies sent, the replies read.
Then against the real server: the tests marked ``wire_12_9`` (each named ``*horizon*`` or
``*no_ticket*``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import httpx
import pytest

from conftest import TWINS, Server
from redb_limiter import AsyncLimiter, Clock, Limit, Limiter, QueueTimeout, Refused

WINDOW = Limit.window("k/rpm", 1, 60_000)
Reply = Callable[[datetime], dict[str, Any]]


def at(instant: datetime) -> str:
    return instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def granted(now: datetime) -> dict[str, Any]:
    return {"granted": True, "at": at(now)}


def refused(seconds: float, **extra: Any) -> Reply:
    def reply(now: datetime) -> dict[str, Any]:
        retry_at = now + timedelta(seconds=seconds)
        return {"granted": False, "retryAt": at(retry_at), "reason": "rate", "limit": "k/rpm", **extra}

    return reply


def ticketed(seconds: float, ticket: str) -> Reply:
    return refused(seconds, ticket=ticket, lapseAt=at(datetime.now(timezone.utc) + timedelta(seconds=seconds + 2)), ahead=0)


class Script:
    """An ``httpx`` transport answering each ``/acquire`` with the next reply (each told the
    limiter's ``now``), and ``/release`` with ``released``; it records every body by path."""

    def __init__(self, *replies: Reply) -> None:
        self.replies = list(replies)
        self.sent: dict[str, list[dict[str, Any]]] = {"acquire": [], "release": []}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.strip("/")
        self.sent[path].append(json.loads(request.content))
        now = datetime.now(timezone.utc)
        body = {"released": True} if path == "release" else {"now": at(now), **self.replies.pop(0)(now)}
        return httpx.Response(200, json=body)


def scripted(kind: str, script: Script) -> Any:
    """A twin over the script. The sync one is called directly (the script never blocks)."""
    transport = httpx.MockTransport(script)
    if kind == "sync":
        return Limiter("http://limiter.test", http_client=httpx.Client(transport=transport))
    return AsyncLimiter("http://limiter.test", http_client=httpx.AsyncClient(transport=transport))


async def acquire(limiter: Any, *args: Any, **kwargs: Any) -> Any:
    if isinstance(limiter, Limiter):
        return limiter.acquire(*args, **kwargs)
    return await limiter.acquire(*args, **kwargs)


async def close(limiter: Any) -> None:
    if isinstance(limiter, Limiter):
        limiter.close()
    else:
        await limiter.aclose()


@pytest.mark.parametrize("kind", TWINS)
async def test_every_ask_in_the_line_sends_the_max_wait_that_remains(kind: str) -> None:
    script = Script(ticketed(0.06, "t-1"), ticketed(0.06, "t-1"), granted)
    await acquire(scripted(kind, script), "k", WINDOW, max_wait=5, permit=False)
    waits = [body["maxWaitMs"] for body in script.sent["acquire"]]
    assert all(isinstance(w, int) for w in waits), waits
    assert 4_900 < waits[0] <= 5_000, waits
    assert waits[1] <= waits[0] - 50 and waits[2] <= waits[1] - 50, f"it counts down: {waits}"
    assert script.sent["acquire"][1]["ticket"] == "t-1"


@pytest.mark.parametrize("kind", TWINS)
async def test_no_max_wait_ms_without_a_max_wait_or_a_line(kind: str) -> None:
    script = Script(granted, granted)
    limiter = scripted(kind, script)
    await acquire(limiter, "k", WINDOW, permit=False)
    await acquire(limiter, "k", WINDOW, max_wait=5, queue=False, permit=False)
    assert ["maxWaitMs" in body for body in script.sent["acquire"]] == [False, False]
    assert script.sent["acquire"][0]["queue"] is True


@pytest.mark.parametrize("kind", TWINS)
async def test_a_no_ticket_refusal_past_max_wait_times_out_at_once(kind: str) -> None:
    script = Script(refused(60, noTicket="horizon"))
    started = time.monotonic()
    with pytest.raises(QueueTimeout) as timeout:
        await acquire(scripted(kind, script), "k", WINDOW, max_wait=5)
    assert time.monotonic() - started < 0.5, "it did not sleep towards the retryAt"
    last = timeout.value.last
    assert last is not None and last.no_ticket == "horizon" and last.reason == "rate"
    assert script.sent["release"] == []  # no ticket was filed: none to leave


@pytest.mark.parametrize("kind", TWINS)
async def test_after_a_no_ticket_refusal_no_stale_ticket_is_presented(kind: str) -> None:
    script = Script(ticketed(0.03, "t-1"), refused(0.03, noTicket="full"), ticketed(0.03, "t-2"), granted)
    await acquire(scripted(kind, script), "k", WINDOW, max_wait=5, permit=False)
    asks = [(body.get("queue"), body.get("ticket")) for body in script.sent["acquire"]]
    assert asks == [(True, None), (None, "t-1"), (True, None), (None, "t-2")]


@pytest.mark.parametrize("kind", TWINS)
async def test_try_acquire_reads_no_ticket_onto_refused(kind: str) -> None:
    script = Script(refused(1, noTicket="full"), refused(1))
    limiter = scripted(kind, script)
    said = []
    for _ in range(2):
        with pytest.raises(Refused) as refusal:
            if isinstance(limiter, Limiter):
                limiter.try_acquire("k", WINDOW)
            else:
                await limiter.try_acquire("k", WINDOW)
        said.append(refusal.value.no_ticket)
    assert said == ["full", None]
    assert all("maxWaitMs" not in body and "queue" not in body for body in script.sent["acquire"])


# --- Against the real server: these need wire section 12.9 ---------------------------------

F = TypeVar("F", bound=Callable[..., Any])


def needs_12_9(test: F) -> F:
    """Marks a test ``wire_12_9`` (``pytest -m wire_12_9`` runs them all)."""
    marked: F = pytest.mark.wire_12_9(test)
    return marked


class Stop(Exception):
    """Raised by :class:`NoSleep` instead of the first sleep of a wait."""


class NoSleep(Clock):
    def sleep(self, seconds: float) -> None:
        raise Stop(seconds)

    async def asleep(self, seconds: float) -> None:
        raise Stop(seconds)


def recording(kind: str, url: str, **kwargs: Any) -> tuple[Any, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """A twin (called directly) whose every ``/acquire`` body and reply is recorded."""
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def note(response: httpx.Response) -> None:
        if response.request.url.path == "/acquire":
            seen.append((json.loads(response.request.content), response.json()))

    if kind == "sync":

        def hook(response: httpx.Response) -> None:
            response.read()
            note(response)

        return Limiter(url, http_client=httpx.Client(event_hooks={"response": [hook]}), **kwargs), seen

    async def ahook(response: httpx.Response) -> None:
        await response.aread()
        note(response)

    return AsyncLimiter(url, http_client=httpx.AsyncClient(event_hooks={"response": [ahook]}), **kwargs), seen


async def queued(twin: Any, me: str, limit: Limit) -> int:
    figures = (await twin.peek(me, [limit])).limits[0]
    return 0 if figures.queued is None else int(figures.queued)


@needs_12_9
async def test_a_call_beyond_its_max_wait_gets_no_ticket_horizon_and_times_out_at_once(twin: Any, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1, 60_000)
    await twin.acquire(me, [window], permit=False)
    started = time.monotonic()
    with pytest.raises(QueueTimeout) as timeout:
        await twin.acquire(me, [window], max_wait=1.0)
    took = time.monotonic() - started
    assert took < 0.5, f"gave up after {took:.3f} s"
    last = timeout.value.last
    assert last is not None and last.reason == "rate"
    assert last.no_ticket == "horizon"
    assert await queued(twin, me, window) == 0


@needs_12_9
@pytest.mark.parametrize("kind", TWINS)
async def test_without_max_wait_the_servers_horizon_files_no_ticket(kind: str, server: Server, prefix: str) -> None:
    """A call ten minutes out lies beyond the server's horizon (300 s by default)."""
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/10min", 1, 600_000)
    limiter, seen = recording(kind, server.url, clock=NoSleep(), wakes=False)
    try:
        assert (await acquire(limiter, me, window, permit=False)).at is not None
        with pytest.raises(Stop):
            await acquire(limiter, me, window, permit=False)
        sent, got = seen[-1]
        assert sent["queue"] is True and "maxWaitMs" not in sent
        assert got["granted"] is False and "ticket" not in got
        assert got["noTicket"] == "horizon"
    finally:
        await close(limiter)


@needs_12_9
@pytest.mark.parametrize("kind", TWINS)
async def test_within_its_horizon_a_call_still_takes_a_ticket(kind: str, server: Server, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rps", 1, 500)
    limiter, seen = recording(kind, server.url)
    try:
        await acquire(limiter, me, window, permit=False)
        del seen[:]
        await acquire(limiter, me, window, max_wait=5, permit=False)
        assert len(seen) >= 2, seen
        first_sent, first_got = seen[0]
        assert isinstance(first_got.get("ticket"), str) and "noTicket" not in first_got
        assert all(sent.get("ticket") == first_got["ticket"] for sent, _ in seen[1:])
        waits = [sent["maxWaitMs"] for sent, _ in seen]
        assert waits[0] <= 5_000 and waits == sorted(waits, reverse=True), waits
        assert seen[-1][1]["granted"] is True
    finally:
        await close(limiter)
