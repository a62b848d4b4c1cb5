"""A small HTTP/1.1 proxy of the tests' own, between a client and the real server.

It forwards each request as it comes (keep-alive on both sides), records it, and does to its
reply what the test's rule says: pass it (after a delay), drop the connection without it, or
hang (never answer, the connection held open). The server itself is never mocked: what it
answers is what the client gets, unless the rule withholds it.

    proxy = Proxy(server.url, rule=lambda seen: Act(delay=0.4) if seen.path == "/acquire" else PASS)
    ... proxy.url ...
    proxy.seen  # every request, in arrival order, with its JSON body and the server's status
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Act:
    """What the proxy does with one request: ``forward`` it to the server or not, wait ``delay``
    seconds, then ``reply`` ("pass": the server's answer; "drop": close the connection with no
    answer; "hang": keep it open and never answer; "not-found": a 404, as a server without the
    path answers)."""

    forward: bool = True
    delay: float = 0.0
    reply: str = "pass"


PASS = Act()
HANG = Act(forward=False, reply="hang")
NOT_FOUND = Act(forward=False, reply="not-found")

_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 9\r\n\r\nnot found"


@dataclass
class Seen:
    """One request through the proxy."""

    method: str
    path: str
    body: Any
    at: float  # time.monotonic() when it arrived
    status: Optional[int] = None  # the server's, when forwarded and answered
    reply: Any = None  # the server's JSON answer, when forwarded and answered
    answered: bool = False  # the client was sent an answer
    done: threading.Event = field(default_factory=threading.Event)

    def json(self) -> dict[str, Any]:
        return self.body if isinstance(self.body, dict) else {}


Rule = Callable[[Seen], Act]


class Proxy:
    def __init__(self, upstream: str, rule: Rule | None = None) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rule: Rule = rule if rule is not None else (lambda seen: PASS)
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in list(self._sockets):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def requests(self, path: str) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.seen if seen.path.split("?")[0] == path]

    def wait_for(self, condition: Callable[[], Any], seconds: float = 10.0) -> Any:
        """Polls ``condition`` (a state, not a timing) until it is truthy; returns it."""
        deadline = time.monotonic() + seconds
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"the proxy never saw it; it saw {[(s.path, s.body) for s in self.seen]}")
            time.sleep(0.01)

    # The connections.

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.add(client)
            threading.Thread(target=self._serve, args=(client,), name="proxy-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: http.client.HTTPConnection | None = None
        reader = client.makefile("rb")
        try:
            while not self._closed.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                method, target, headers, body = request
                try:
                    parsed: Any = json.loads(body) if body else None
                except ValueError:
                    parsed = body
                seen = Seen(method, target, parsed, time.monotonic())
                with self._lock:
                    self.seen.append(seen)
                act = self.rule(seen)
                answer = None
                if act.forward:
                    if upstream is None:
                        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
                    upstream.request(method, target, body=body, headers=headers)
                    response = upstream.getresponse()
                    content = response.read()
                    seen.status = response.status
                    try:
                        seen.reply = json.loads(content) if content else None
                    except ValueError:
                        seen.reply = content
                    answer = _response_bytes(response, content)
                if act.delay:
                    self._closed.wait(act.delay)
                if act.reply == "not-found":
                    seen.status = 404
                    answer = _NOT_FOUND
                if act.reply in ("pass", "not-found") and answer is not None:
                    try:
                        client.sendall(answer)
                        seen.answered = True
                    finally:
                        seen.done.set()
                    continue
                seen.done.set()
                if act.reply == "hang":
                    self._hang(client)
                return  # "drop", or a hang the client gave up
        except OSError:
            return
        finally:
            if upstream is not None:
                upstream.close()
            reader.close()
            client.close()
            with self._lock:
                self._sockets.discard(client)

    def _hang(self, client: socket.socket) -> None:
        """Holds the connection open, answering nothing, until the client closes it."""
        while not self._closed.is_set():
            readable, _, _ = select.select([client], [], [], 0.05)
            if readable and not client.recv(65536):
                return


def _read_request(reader: Any) -> tuple[str, str, dict[str, str], bytes] | None:
    line = reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        line = reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, value = line.decode("latin-1").split(":", 1)
        headers[name.strip()] = value.strip()
    length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
    body = reader.read(length) if length else b""
    dropped = ("connection", "keep-alive", "host", "accept-encoding")  # answers stay readable as JSON
    keep = {k: v for k, v in headers.items() if k.lower() not in dropped}
    return method, target, keep, body


def _response_bytes(response: http.client.HTTPResponse, content: bytes) -> bytes:
    head = [f"HTTP/1.1 {response.status} {response.reason}"]
    for name, value in response.getheaders():
        if name.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length"):
            head.append(f"{name}: {value}")
    head.append(f"content-length: {len(content)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + content
