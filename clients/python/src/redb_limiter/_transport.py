"""A lean HTTP/1.1 client over ``asyncio`` streams: how :class:`~redb_limiter.AsyncLimiter`
reaches its server when the host passes no ``httpx.AsyncClient`` of its own.

The limiter's requests are small JSON bodies with small JSON answers, and a waiting call is
mostly its requests; through ``httpx`` each costs several times the CPU of the exchange itself.
:class:`ConnectionPool` keeps connections to one server open between requests (at most
``max_connections`` at once, ``max_idle`` of them idle, each idle at most ``keepalive_expiry``
seconds) and speaks just the HTTP/1.1 this needs: a request with a ``Content-Length`` body, an
answer framed by ``Content-Length``, ``Transfer-Encoding: chunked`` or the connection's end.

A connection goes back to the pool only after its whole answer was read. Whatever else ends a
request -- an error, a timeout, the caller's cancellation -- closes the connection in use, so no
later request can read a stale answer. A request is never sent twice unless it is idempotent
(``GET``, ``HEAD``), went out on a reused connection, and that connection closed before any of
its answer came; a ``POST`` whose connection dropped raises :class:`ConnectionLost` (the client
decides: an acquire is asked again under its id, wire section 16).
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from collections import deque
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Deque, NamedTuple, Optional, Set, TypeVar

__all__ = [
    "BadResponse",
    "ConnectError",
    "ConnectionLost",
    "ConnectionPool",
    "Response",
    "Timeouts",
    "TransportError",
    "TransportTimeout",
]

T = TypeVar("T")

#: Methods sent again, once, when a reused connection closed before any of the answer came.
_IDEMPOTENT = frozenset({"GET", "HEAD"})
#: The longest answer head read (status line and headers).
_HEAD_LIMIT = 64 * 1024


class TransportError(Exception):
    """The request got no whole answer from the server."""


class ConnectError(TransportError):
    """No connection could be opened: refused, unresolvable, a failed TLS handshake, or the
    pool is closed. Nothing was sent."""


class ConnectionLost(TransportError):
    """The connection failed or closed after the request began to go out and before its whole
    answer came; the server may have acted on it. ``received``: whether any of the answer
    had arrived."""

    def __init__(self, message: str, *, received: bool) -> None:
        super().__init__(message)
        self.received = received


class TransportTimeout(TransportError):
    """A phase took longer than its bound: ``phase`` is ``"pool"``, ``"connect"``, ``"write"``
    or ``"read"`` (the whole answer, from the request's last byte)."""

    def __init__(self, phase: str, seconds: float | None) -> None:
        super().__init__(f"{phase} timed out after {seconds} s")
        self.phase = phase


class BadResponse(TransportError):
    """The server answered something that is not HTTP/1.1 as this client reads it."""


@dataclass(frozen=True)
class Timeouts:
    """Bounds in seconds (``None``: none) on one request's phases: waiting for a connection
    from a full pool, opening one (TLS included), sending the request, reading the answer."""

    connect: Optional[float] = None
    write: Optional[float] = None
    read: Optional[float] = None
    pool: Optional[float] = None


class Response(NamedTuple):
    """An answer: its status, headers (names in lower case; repeated ones joined by ``", "``)
    and whole body."""

    status: int
    headers: dict[str, str]
    body: bytes


if sys.version_info >= (3, 11):

    async def _within(seconds: float | None, work: Awaitable[T]) -> T:
        async with asyncio.timeout(seconds):
            return await work

else:

    async def _within(seconds: float | None, work: Awaitable[T]) -> T:
        return await asyncio.wait_for(work, seconds)


class _Connection:
    """One open connection and when it last went idle."""

    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def reusable(self, now: float, expiry: float) -> bool:
        """Open, nothing pending on it (an idle connection the server closed has seen its end
        by now), and idle for less than ``expiry`` seconds."""
        return (
            now - self.idle_since < expiry
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.reader.exception() is None
        )

    def abort(self) -> None:
        """Closes the connection at once, whatever is left unsent or unread."""
        try:
            self.writer.transport.abort()
        except RuntimeError:
            pass  # its event loop is closed: so is the socket


class ConnectionPool:
    """Kept-alive HTTP/1.1 connections to one server (``host``, ``port``; TLS when ``tls`` is
    given), shared by the requests of one event loop. ``authority`` is the ``Host`` header."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        authority: str | None = None,
        tls: ssl.SSLContext | None = None,
        max_connections: int = 100,
        max_idle: int = 20,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self.host = host
        self.port = port
        self.authority = authority if authority is not None else f"{host}:{port}"
        self.tls = tls
        self.max_connections = max_connections
        self.max_idle = max_idle
        self.keepalive_expiry = keepalive_expiry
        self._idle: Deque[_Connection] = deque()
        self._open: Set[_Connection] = set()
        self._slots: asyncio.Semaphore | None = None  # made in the loop that first uses it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def connections(self) -> int:
        """How many connections are open (idle or in use)."""
        return len(self._open)

    @property
    def idle(self) -> int:
        """How many open connections wait in the pool for a request."""
        return len(self._idle)

    async def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        timeouts: Timeouts = Timeouts(),
    ) -> Response:
        """Sends ``method target`` with ``headers`` (and ``body`` as ``application/json``, its
        ``Content-Length`` given) and reads the whole answer. Raises :class:`TransportError`."""
        if self._closed:
            raise ConnectError("the connection pool is closed")
        head = self._head(method, target, headers, body)
        slots = self._slots_for_loop()
        if slots.locked():
            try:
                await _within(timeouts.pool, slots.acquire())
            except asyncio.TimeoutError:
                raise TransportTimeout("pool", timeouts.pool) from None
        else:
            await slots.acquire()
        try:
            retried = False
            while True:
                conn = self._checkout()
                reused = conn is not None
                if conn is None:
                    conn = await self._connect(timeouts.connect)
                try:
                    response, keep = await self._exchange(conn, method, head, body, timeouts)
                except ConnectionLost as e:
                    self._discard(conn)
                    if reused and not retried and not e.received and method in _IDEMPOTENT:
                        retried = True  # closed by the server between requests: send it afresh
                        continue
                    raise
                except BaseException:
                    self._discard(conn)  # never pooled half-read: cancelled, timed out or failed
                    raise
                if keep:
                    self._checkin(conn)
                else:
                    self._discard(conn)
                return response
        finally:
            slots.release()

    async def aclose(self) -> None:
        """Closes every connection, those in use included; later requests fail."""
        self._closed = True
        self._idle.clear()
        closing = list(self._open)
        self._open.clear()
        for conn in closing:
            conn.writer.close()
        for conn in closing:
            try:
                await conn.writer.wait_closed()
            except (OSError, asyncio.CancelledError, RuntimeError):
                pass  # already reset, or its loop is gone

    # The connections.

    def _slots_for_loop(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or loop is not self._loop:
            # First use, or a new event loop: connections of another loop cannot serve this one.
            while self._idle:
                self._discard(self._idle.pop())
            self._loop = loop
            self._slots = asyncio.Semaphore(self.max_connections)
        return self._slots

    def _checkout(self) -> _Connection | None:
        """The most recently used idle connection still fit for a request, if any."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable(now, self.keepalive_expiry):
                return conn
            self._discard(conn)
        return None

    def _checkin(self, conn: _Connection) -> None:
        if self._closed:
            self._discard(conn)
            return
        conn.idle_since = time.monotonic()
        while self._idle and (
            len(self._idle) >= self.max_idle or conn.idle_since - self._idle[0].idle_since >= self.keepalive_expiry
        ):
            self._discard(self._idle.popleft())
        self._idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        self._open.discard(conn)
        conn.abort()

    async def _connect(self, timeout: float | None) -> _Connection:
        try:
            reader, writer = await _within(
                timeout,
                asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None,
                    limit=_HEAD_LIMIT,
                ),
            )
        except asyncio.TimeoutError:
            raise TransportTimeout("connect", timeout) from None
        except OSError as e:  # refused, unreachable, unresolvable, TLS (ssl.SSLError)
            raise ConnectError(f"cannot connect to {self.authority}: {e}") from e
        conn = _Connection(reader, writer)
        if self._closed:
            conn.abort()
            raise ConnectError("the connection pool is closed")
        self._open.add(conn)
        return conn

    # One exchange.

    def _head(self, method: str, target: str, headers: Mapping[str, str], body: bytes | None) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.authority}"]
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        if body is not None:
            lines.append("Content-Type: application/json")
            lines.append(f"Content-Length: {len(body)}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("latin-1")

    async def _exchange(
        self, conn: _Connection, method: str, head: bytes, body: bytes | None, timeouts: Timeouts
    ) -> tuple[Response, bool]:
        """Sends one request and reads its answer: the answer, and whether the connection may
        serve another request."""
        writer = conn.writer
        try:
            writer.write(head + body if body else head)
            if writer.transport.get_write_buffer_size():
                await _within(timeouts.write, writer.drain())
        except asyncio.TimeoutError:
            raise TransportTimeout("write", timeouts.write) from None
        except OSError as e:
            raise ConnectionLost(f"sending to {self.authority} failed: {e!r}", received=False) from e
        reading = _Reading(conn.reader, method)
        try:
            return await _within(timeouts.read, reading.answer())
        except asyncio.TimeoutError:
            raise TransportTimeout("read", timeouts.read) from None
        except asyncio.IncompleteReadError as e:
            received = reading.received or bool(e.partial)
            what = "closed the connection before the whole answer came" if received else "closed the connection without answering"
            raise ConnectionLost(f"{self.authority} {what}", received=received) from None
        except asyncio.LimitOverrunError as e:
            raise BadResponse(f"{self.authority} sent an answer head over {_HEAD_LIMIT} bytes") from e
        except OSError as e:  # reset
            raise ConnectionLost(f"reading from {self.authority} failed: {e!r}", received=reading.received) from e


class _Reading:
    """Reads one answer from a stream; ``received`` once any of it arrived."""

    __slots__ = ("reader", "method", "received")

    def __init__(self, reader: asyncio.StreamReader, method: str) -> None:
        self.reader = reader
        self.method = method
        self.received = False

    async def answer(self) -> tuple[Response, bool]:
        reader = self.reader
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            self.received = True
            version, status, headers = _parse_head(head)
            if not 100 <= status < 200 or status == 101:
                break  # an interim answer (100 Continue) is skipped
        keep = version == "HTTP/1.1"
        connection = headers.get("connection")
        if connection is not None:
            tokens = {token.strip().lower() for token in connection.split(",")}
            keep = "close" not in tokens and (keep or "keep-alive" in tokens)
        if self.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return Response(status, headers, b""), keep
        encoding = headers.get("transfer-encoding")
        if encoding is not None:
            if encoding.rsplit(",", 1)[-1].strip().lower() != "chunked":
                return Response(status, headers, await reader.read()), False  # framed by its end
            return Response(status, headers, await self._chunked()), keep
        length = headers.get("content-length")
        if length is None:
            return Response(status, headers, await reader.read()), False
        if not length.isdigit():
            raise BadResponse(f"bad Content-Length: {length!r}")
        return Response(status, headers, await reader.readexactly(int(length))), keep

    async def _chunked(self) -> bytes:
        reader = self.reader
        parts: list[bytes] = []
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadResponse(f"bad chunk size line: {line[:40]!r}") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers, ignored
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            if await reader.readexactly(2) != b"\r\n":
                raise BadResponse("a chunk does not end with CRLF")


def _parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """The version, status and headers of an answer's head (which ends with a blank line)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise BadResponse(f"bad status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:-2]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise BadResponse(f"bad header line: {line[:80]!r}")
        name = name.lower()
        value = value.strip()
        seen = headers.get(name)
        headers[name] = value if seen is None else f"{seen}, {value}"
    return parts[0], int(parts[1]), headers
