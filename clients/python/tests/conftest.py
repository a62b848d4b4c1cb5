"""Starts the real redb-limiter server for the tests, and lets one suite drive both twins.

The binary is ``$REDB_LIMITER_BIN``, else ``target/release/redb-limiter`` at the repository
root, built with cargo when missing. Each server runs on a temporary file and a free port,
started and stopped (SIGTERM) by the package's own ``start_server``. The sync twin runs in
worker threads behind an async facade, so that each test is written once and run against
``Limiter`` and ``AsyncLimiter`` alike.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy import Proxy
import redb_limiter
from redb_limiter import AsyncLimiter, Limiter, LocalServer, Permit

REPO_ROOT = Path(__file__).resolve().parents[3]


def server_binary() -> Path:
    named = os.environ.get("REDB_LIMITER_BIN")
    if named:
        return Path(named)
    built = REPO_ROOT / "target" / "release" / "redb-limiter"
    if not built.exists():
        print("building the server: cargo build --release --bin redb-limiter", file=sys.stderr)
        subprocess.run(["cargo", "build", "--release", "--bin", "redb-limiter"], cwd=REPO_ROOT, check=True)
    return built


Server = LocalServer


def start_server(folder: Path, token: str | None = None, args: tuple[str, ...] = ()) -> Server:
    """A server on ``folder/limiter.redb`` and a free port, started by the package's own
    :func:`redb_limiter.start_server`; its log goes to ``folder/server.log``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDB_LIMITER_")}
    if token is not None:
        env["REDB_LIMITER_TOKEN"] = token
    with open(folder / "server.log", "w") as log:
        return redb_limiter.start_server(
            folder / "limiter.redb", binary=server_binary(), args=args, env=env, stderr=log, ready_timeout=60
        )


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    started = start_server(tmp_path_factory.mktemp("server"))
    yield started
    started.stop()


@pytest.fixture(scope="session")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server whose concurrency refusals say "ask again in a minute" (``--recheck-ms
    60000``): a waiter served sooner than that was woken (wire section 15)."""
    started = start_server(tmp_path_factory.mktemp("slow-server"), args=("--recheck-ms", "60000"))
    yield started
    started.stop()


@pytest.fixture
def proxy(server: Server) -> Iterator[Proxy]:
    """A proxy of the tests' own in front of the server (``proxy.py``): it passes everything
    until a test sets its ``rule``, and records every request."""
    made = Proxy(server.url)
    yield made
    made.close()


@pytest.fixture(scope="session")
def speaks_ids(server: Server) -> bool:
    """Whether the server keeps request ids (wire section 16): a ``release {id}`` it never saw
    answers ``released: false`` there, and 400 on a server without them. Tests check what
    only such a server can show (nothing stranded on it) when it does."""
    import httpx

    reply = httpx.post(f"{server.url}/release", json={"id": f"probe-{uuid.uuid4().hex}"})
    if reply.status_code != 200 and os.environ.get("CI"):
        # The suite runs against this repository's server, which keeps them: never skip quietly.
        pytest.fail(f"the server under test keeps no request ids (release {{id}} answered {reply.status_code})")
    return reply.status_code == 200


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests sharing the server never meet."""
    return f"t{uuid.uuid4().hex[:10]}"


class ThreadedPermit:
    """A sync ``Permit`` behind the async permit's methods."""

    def __init__(self, permit: Permit) -> None:
        self.permit = permit

    @property
    def at(self) -> Any:
        return self.permit.at

    @property
    def id(self) -> str | None:
        return self.permit.id

    @property
    def released(self) -> bool:
        return self.permit.released

    @property
    def limits(self) -> Any:
        return self.permit.limits

    @property
    def adapted(self) -> bool:
        return self.permit.adapted

    @property
    def outcome(self) -> str | None:
        return self.permit.outcome

    def observe(self, response: object, *, floor: int | None = None) -> str | None:
        return self.permit.observe(response, floor=floor)

    async def settle(self, costs: dict[str, int], **kwargs: Any) -> bool:
        return await asyncio.to_thread(self.permit.settle, costs, **kwargs)

    async def release(self, costs: dict[str, int] | None = None, **kwargs: Any) -> bool:
        return await asyncio.to_thread(self.permit.release, costs, **kwargs)


class ThreadedContext:
    def __init__(self, start: Callable[[], Permit]) -> None:
        self.start = start
        self.permit: ThreadedPermit | None = None

    async def run(self) -> ThreadedPermit:
        return ThreadedPermit(await asyncio.to_thread(self.start))

    def __await__(self) -> Any:
        return self.run().__await__()

    async def __aenter__(self) -> ThreadedPermit:
        self.permit = await self.run()
        return self.permit

    async def __aexit__(self, *exc: Any) -> None:
        assert self.permit is not None
        await asyncio.to_thread(self.permit.permit.__exit__, *exc)


class ThreadedLimiter:
    """The sync ``Limiter`` behind ``AsyncLimiter``'s signatures: each call in a thread."""

    kind = "sync"

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    def acquire(self, *args: Any, **kwargs: Any) -> ThreadedContext:
        return ThreadedContext(lambda: self.limiter.acquire(*args, **kwargs))

    def try_acquire(self, *args: Any, **kwargs: Any) -> ThreadedContext:
        return ThreadedContext(lambda: self.limiter.try_acquire(*args, **kwargs))

    def waiting(self, *args: Any) -> int:
        return self.limiter.waiting(*args)

    def server_now(self) -> Any:
        return self.limiter.server_now()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.limiter, name)

        async def threaded(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return threaded


TWINS = ["sync", "async"]


def make_twin(kind: str, url: str, **kwargs: Any) -> Any:
    if kind == "sync":
        return ThreadedLimiter(Limiter(url, **kwargs))
    limiter = AsyncLimiter(url, **kwargs)
    limiter.kind = "async"  # type: ignore[attr-defined]
    return limiter


async def close_twin(twin: Any) -> None:
    if isinstance(twin, ThreadedLimiter):
        twin.limiter.close()
    else:
        await twin.aclose()


@pytest.fixture(params=TWINS)
async def twin(request: pytest.FixtureRequest, server: Server) -> AsyncIterator[Any]:
    """``Limiter`` (in threads) and ``AsyncLimiter``: the same test runs against both."""
    made = make_twin(request.param, server.url)
    yield made
    await close_twin(made)
