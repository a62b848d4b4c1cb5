"""The async client's own connections (``redb_limiter._transport``), against the real server.

Between the client and the server sits a small HTTP relay in the test's own event loop: it
counts the connections it accepts and, as each test's rule says, passes the server's answer,
cuts it short, holds it (the server silent), closes the connection after it, or re-frames it
as ``Transfer-Encoding: chunked``. What the client reads is always what the server answered,
or a part of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from conftest import Server
from redb_limiter import AsyncLimiter, Limit, Unreachable
from redb_limiter._transport import ConnectError, ConnectionLost, TransportTimeout

#: What the relay does with one request, by its path: "pass", "cut" (half the answer, then
#: close), "stall" (half the answer, then nothing), "hold" (nothing), "close" (the answer with
#: ``Connection: close``, then close), "end" (the answer, then close without saying so),
#: "chunked" (the answer re-framed in chunks).
Rule = Callable[[str], str]


class Relay:
    def __init__(self, upstream: Server, rule: Rule) -> None:
        self.upstream = upstream
        self.rule = rule
        self.connections = 0
        self.requests: list[str] = []
        self.held = asyncio.Event()
        self.closed_by_client = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(self.upstream.url.rsplit(":", 1)[1]))
        try:
            while True:
                try:
                    request = await read_message(reader)
                except asyncio.IncompleteReadError:
                    self.closed_by_client.set()
                    return
                path = request.split(b" ", 2)[1].decode()
                self.requests.append(path)
                act = self.rule(path)
                if act == "hold":
                    self.held.set()
                    await self._until_closed(reader)
                    return
                up_writer.write(request)
                answer = await read_message(up_reader)
                if act in ("cut", "stall"):
                    writer.write(answer[: len(answer) // 2])
                    await writer.drain()
                    if act == "stall":
                        self.held.set()
                        await self._until_closed(reader)
                    return
                if act == "close":
                    head, body = answer.split(b"\r\n\r\n", 1)
                    answer = head + b"\r\nconnection: close\r\n\r\n" + body
                elif act == "chunked":
                    answer = chunked(answer)
                writer.write(answer)
                await writer.drain()
                if act in ("close", "end"):
                    return
        finally:
            up_writer.close()
            writer.close()
            self._tasks.discard(task)

    async def _until_closed(self, reader: asyncio.StreamReader) -> None:
        while await reader.read(65536):
            pass
        self.closed_by_client.set()


async def read_message(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 request or answer framed by ``Content-Length`` (the server's are)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        assert name.strip().lower() != b"transfer-encoding", head
    return head + await reader.readexactly(length)


def chunked(answer: bytes) -> bytes:
    head, body = answer.split(b"\r\n\r\n", 1)
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"content-length:")]
    half = len(body) // 2
    chunks = b"".join(b"%x;note=1\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]) if part)
    return b"\r\n".join(lines + [b"Transfer-Encoding: chunked"]) + b"\r\n\r\n" + chunks + b"0\r\nx-trailer: 1\r\n\r\n"


@pytest.fixture
async def relay(server: Server) -> AsyncIterator[Relay]:
    made = Relay(server, lambda path: "pass")
    await made.start()
    yield made
    await made.close()


def pool_of(limiter: AsyncLimiter) -> tuple[int, int]:
    """The limiter's open and idle connections."""
    assert limiter._pool is not None
    return limiter._pool.connections, limiter._pool.idle


async def test_sequential_requests_share_one_kept_alive_connection(relay: Relay, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    async with AsyncLimiter(relay.url) as limiter:
        for _ in range(10):
            async with limiter.acquire(me, [window]):
                pass
        assert (await limiter.peek(me, [window])).limits[0].used == 10
        assert relay.connections == 1, relay.connections
        assert len(relay.requests) == 21  # 10 acquires, 10 releases, a peek
        assert pool_of(limiter) == (1, 1)
        # Concurrent requests open connections of their own, kept for the requests after them.
        await asyncio.gather(*(limiter.peek(me, [window]) for _ in range(4)))
        opened = relay.connections
        assert 1 <= opened <= 4
        for _ in range(8):
            await limiter.peek(me, [window])
        assert relay.connections == opened
    assert relay.connections == opened


async def test_an_answer_cut_short_is_a_connection_error(relay: Relay, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    async with AsyncLimiter(relay.url) as limiter:
        await limiter.peek(me, [window])
        relay.rule = lambda path: "cut"
        with pytest.raises(Unreachable) as error:
            await limiter.peek(me, [window])
        assert isinstance(error.value.__cause__, ConnectionLost) and error.value.__cause__.received
        # An acquire whose answer is lost is asked again once, under its id; then it fails too.
        with pytest.raises(Unreachable):
            await limiter.try_acquire(me, [window], permit=False)
        assert relay.requests[-2:] == ["/acquire", "/acquire"]
        relay.rule = lambda path: "pass"
        assert pool_of(limiter) == (0, 0)  # nothing half-read was kept
        assert (await limiter.peek(me, [window])).fits


async def test_a_silent_server_times_out(relay: Relay, prefix: str) -> None:
    relay.rule = lambda path: "hold"
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    async with AsyncLimiter(relay.url, timeout=0.3) as limiter:
        started = time.monotonic()
        with pytest.raises(Unreachable) as error:
            await limiter.peek(me, [window])
        assert time.monotonic() - started < 2.0
        cause = error.value.__cause__
        assert isinstance(cause, TransportTimeout) and cause.phase == "read"
        await asyncio.wait_for(relay.closed_by_client.wait(), 2.0)  # the connection was closed
        assert pool_of(limiter) == (0, 0)


async def test_no_server_is_a_connect_error(prefix: str) -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    async with AsyncLimiter(f"http://127.0.0.1:{port}") as limiter:
        with pytest.raises(Unreachable) as error:
            await limiter.peek(f"{prefix}/me", [Limit.window(f"{prefix}/rpm", 1, 60_000)])
        assert isinstance(error.value.__cause__, ConnectError)


@pytest.mark.parametrize("act", ["hold", "stall"])
async def test_a_cancelled_request_leaves_no_connection_half_read(act: str, relay: Relay, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    async with AsyncLimiter(relay.url) as limiter:
        await limiter.try_acquire(me, [window], permit=False)  # one connection, kept
        relay.rule = lambda path: act if path == "/peek" else "pass"
        task = asyncio.ensure_future(limiter.peek(me, [window]))
        await asyncio.wait_for(relay.held.wait(), 5.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool_of(limiter) == (0, 0)
        await asyncio.wait_for(relay.closed_by_client.wait(), 2.0)
        # The next request reads its own answer on a new connection, not the abandoned one's.
        relay.rule = lambda path: "pass"
        permit = await limiter.try_acquire(me, [window])
        assert permit.limits[0].used == 2
        await permit.release()
        assert relay.connections == 2
        assert pool_of(limiter) == (1, 1)


async def test_a_connection_the_server_closed_between_requests_is_not_reused(relay: Relay, prefix: str) -> None:
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    async with AsyncLimiter(relay.url) as limiter:
        relay.rule = lambda path: "end"  # closed after each answer, unannounced
        for _ in range(3):
            await limiter.peek(me, [window])
            await asyncio.sleep(0.05)  # idle: the connection's end has arrived
        relay.rule = lambda path: "close"  # announced: never pooled, however soon the next
        for _ in range(3):
            await limiter.peek(me, [window])
        assert relay.connections == 6
        assert pool_of(limiter) == (0, 0)


async def test_a_chunked_answer_is_read_whole(relay: Relay, prefix: str) -> None:
    relay.rule = lambda path: "chunked"
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    async with AsyncLimiter(relay.url) as limiter:
        for _ in range(3):
            async with limiter.acquire(me, [window]):
                pass
        assert (await limiter.peek(me, [window])).limits[0].used == 3
        assert relay.connections == 1


async def test_a_passed_httpx_client_is_used_as_given(relay: Relay, prefix: str) -> None:
    sent: list[str] = []

    async def note(request: httpx.Request) -> None:
        sent.append(request.url.path)

    http = httpx.AsyncClient(event_hooks={"request": [note]}, timeout=3.0)
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    async with AsyncLimiter(relay.url, http_client=http) as limiter:
        assert limiter._pool is None
        async with limiter.acquire(me, [window]):
            pass
        relay.rule = lambda path: "cut"
        with pytest.raises(Unreachable) as error:
            await limiter.peek(me, [window])
        assert isinstance(error.value.__cause__, httpx.TransportError)
    assert sent == ["/acquire", "/release", "/peek"]
    assert http.is_closed


async def test_a_closed_limiter_sends_nothing(relay: Relay, prefix: str) -> None:
    limiter = AsyncLimiter(relay.url)
    me, window = f"{prefix}/me", Limit.window(f"{prefix}/rpm", 1_000, 60_000)
    await limiter.peek(me, [window])
    await limiter.aclose()
    assert pool_of(limiter) == (0, 0)
    with pytest.raises(Unreachable):
        await limiter.peek(me, [window])
    assert relay.requests == ["/peek"]


async def test_an_idempotent_request_on_a_connection_closed_meanwhile_succeeds(relay: Relay) -> None:
    from redb_limiter._transport import ConnectionPool

    relay.rule = lambda path: "end"  # every connection closes after its answer, unannounced
    host, port = relay.url.removeprefix("http://").split(":")
    pool = ConnectionPool(host, int(port))
    try:
        for _ in range(5):  # back to back: a closed connection is dropped, or the GET sent afresh
            answer = await pool.request("GET", "/health", {})
            assert answer.status == 200 and answer.body
    finally:
        await pool.aclose()
    assert relay.requests.count("/health") <= 10
