"""The in-process line: callers of the same request shape wait first in, first out.

The head of a shape's line holds its turn while it asks and sleeps, so nobody behind it
overtakes it (a large call is never starved by smaller ones of the same shape); across
processes, the server's own line (tickets) takes over. A line counts its waiters for
``max_waiters`` and disappears when the last one leaves. One registry per limiter; the sync
line blocks threads, the async one suspends tasks of one event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Deque, Dict, Generic, TypeVar

from ._errors import QueueFull

W = TypeVar("W")


class _Line(Generic[W]):
    def __init__(self) -> None:
        self.waiting = 0  # every caller in the line, the head included
        self.busy = False  # someone holds the turn
        self.queue: Deque[W] = deque()


class _Lines(Generic[W]):
    """Shape -> line, counting callers in and out under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: Dict[str, _Line[W]] = {}

    def join(self, shape: str, max_waiters: int | None) -> _Line[W]:
        with self._lock:
            line = self._lines.get(shape)
            if line is None:
                line = self._lines[shape] = _Line()
            if max_waiters is not None and line.waiting >= max_waiters:
                raise QueueFull(line.waiting)
            line.waiting += 1
            return line

    def leave(self, shape: str, line: _Line[W]) -> None:
        with self._lock:
            line.waiting -= 1
            if line.waiting == 0 and self._lines.get(shape) is line:
                del self._lines[shape]

    def waiting(self, shape: str) -> int:
        """How many callers of ``shape`` are in line (the head included)."""
        with self._lock:
            line = self._lines.get(shape)
            return 0 if line is None else line.waiting


class SyncLines(_Lines[threading.Event]):
    def take_turn(self, line: _Line[threading.Event], timeout: float | None) -> bool:
        """Waits to be the head; ``False`` when ``timeout`` seconds passed first."""
        with self._lock:
            if not line.busy:
                line.busy = True
                return True
            ready = threading.Event()
            line.queue.append(ready)
        if ready.wait(timeout if timeout is None else max(timeout, 0.0)):
            return True
        with self._lock:
            if ready.is_set():
                # Handed the turn just as the time ran out: pass it on.
                self._pass_locked(line)
            else:
                line.queue.remove(ready)
        return False

    def pass_turn(self, line: _Line[threading.Event]) -> None:
        with self._lock:
            self._pass_locked(line)

    @staticmethod
    def _pass_locked(line: _Line[threading.Event]) -> None:
        if line.queue:
            line.queue.popleft().set()
        else:
            line.busy = False


class AsyncLines(_Lines["asyncio.Future[None]"]):
    async def take_turn(self, line: _Line[asyncio.Future[None]], timeout: float | None) -> bool:
        """Waits to be the head; ``False`` when ``timeout`` seconds passed first. Cancelling the
        caller takes it out of the line."""
        with self._lock:
            if not line.busy:
                line.busy = True
                return True
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            line.queue.append(ready)
        try:
            if timeout is None:
                await asyncio.shield(ready)
            else:
                await asyncio.wait_for(asyncio.shield(ready), max(timeout, 0.0))
            return True
        except asyncio.TimeoutError:
            self._give_up(line, ready)
            return False
        except BaseException:
            self._give_up(line, ready)
            raise

    def _give_up(self, line: _Line[asyncio.Future[None]], ready: asyncio.Future[None]) -> None:
        with self._lock:
            if ready.done():
                self._pass_locked(line)  # the turn arrived as we left: pass it on
            else:
                line.queue.remove(ready)
                ready.cancel()

    def pass_turn(self, line: _Line[asyncio.Future[None]]) -> None:
        with self._lock:
            self._pass_locked(line)

    @staticmethod
    def _pass_locked(line: _Line[asyncio.Future[None]]) -> None:
        while line.queue:
            ready = line.queue.popleft()
            if not ready.done():
                ready.set_result(None)
                return
        line.busy = False


