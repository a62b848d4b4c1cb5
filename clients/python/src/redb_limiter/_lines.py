"""The in-process line: callers of the same request shape wait first in, first out.

The head of a shape's line holds its turn while it asks and sleeps, so nobody behind it
overtakes it (a large call is never starved by smaller ones of the same shape); across
processes, the server's own line (tickets) takes over. A line counts its waiters for
``max_waiters`` and disappears when the last one leaves. One registry per limiter; the sync
line blocks threads, the async one suspends tasks of one event loop.

Every way out of a wait keeps the line moving: a caller that gives up behind the head (its
deadline, a cancellation, Ctrl-C or any other exception) leaves it, passing on a turn handed
to it meanwhile; and when the head could not reach the limiter, the callers behind it are woken
with that failure (each its own :class:`Unreachable`) rather than each waiting out a
timeout of its own in turn.

A line also knows the buckets its shape names, so that a release made through this limiter
wakes the heads it may let through at once (:meth:`_Lines.wake`): each wake bumps the line's
``woke`` count, and a head that saw the count change since it last asked asks again.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Deque, Dict, FrozenSet, Generic, Optional, TypeVar

from ._errors import QueueFull, Unreachable

W = TypeVar("W")


def line_failure(failure: Unreachable) -> Unreachable:
    """What a caller behind the head of its shape's line raises when the head could not reach
    the limiter: the same failure, met once for all of them rather than one timeout each."""
    return Unreachable(f"{failure} (met by the caller ahead in this request shape's line)")


class _Line(Generic[W]):
    def __init__(self, buckets: FrozenSet[str]) -> None:
        self.waiting = 0  # every caller in the line, the head included
        self.busy = False  # someone holds the turn
        self.queue: Deque[W] = deque()
        self.buckets = buckets  # the buckets the shape names
        self.woke = 0  # local wakes so far: a release here may have let the head through


class _Lines(Generic[W]):
    """Shape -> line, counting callers in and out under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lines: Dict[str, _Line[W]] = {}

    def join(self, shape: str, buckets: Iterable[str], max_waiters: int | None) -> _Line[W]:
        with self._lock:
            line = self._lines.get(shape)
            if line is None:
                line = self._lines[shape] = _Line(frozenset(buckets))
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

    def wake(self, buckets: Iterable[str] | None) -> None:
        """Wakes the heads of the lines that name one of ``buckets`` (every line when
        ``None``: a release of a permit this limiter knows nothing about)."""
        freed = None if buckets is None else frozenset(buckets)
        with self._lock:
            woken = False
            for line in self._lines.values():
                if freed is None or not line.buckets.isdisjoint(freed):
                    line.woke += 1
                    woken = True
            if woken:
                self._notify_locked()

    def _notify_locked(self) -> None:
        raise NotImplementedError


class _Turn:
    """One caller waiting behind the head: woken with its turn, or with the head's failure."""

    __slots__ = ("ready", "failure")

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.failure: Optional[Unreachable] = None


class SyncLines(_Lines[_Turn]):
    def __init__(self) -> None:
        super().__init__()
        #: Notified on every local wake, and by a ``/wait`` of a head's when it is answered.
        self.changed = threading.Condition(self._lock)

    def _notify_locked(self) -> None:
        self.changed.notify_all()

    def pause(self, line: _Line[_Turn], seen: int | None, done: Callable[[], bool], timeout: float | None) -> bool:
        """Blocks until the line is woken (its ``woke`` count is no longer ``seen``; never with
        ``None``), ``done()`` holds, or ``timeout`` seconds pass; ``True`` unless the time ran
        out. Ctrl-C ends it."""
        with self.changed:
            return self.changed.wait_for(lambda: (seen is not None and line.woke != seen) or done(), timeout)

    def take_turn(self, line: _Line[_Turn], timeout: float | None) -> bool:
        """Waits to be the head; ``False`` when ``timeout`` seconds passed first. Raises the
        head's :class:`Unreachable` when it could not reach the limiter; anything raised
        meanwhile (``KeyboardInterrupt``) takes the caller out of the line."""
        with self._lock:
            if not line.busy:
                line.busy = True
                return True
            turn = _Turn()
            line.queue.append(turn)
        try:
            woken = turn.ready.wait(timeout if timeout is None else max(timeout, 0.0))
        except BaseException:
            self._give_up(line, turn)
            raise
        if not woken:
            self._give_up(line, turn)
            return False
        if turn.failure is not None:
            raise turn.failure
        return True

    def _give_up(self, line: _Line[_Turn], turn: _Turn) -> None:
        with self._lock:
            if not turn.ready.is_set():
                line.queue.remove(turn)
            elif turn.failure is None:
                self._pass_locked(line)  # handed the turn just as it left: pass it on

    def pass_turn(self, line: _Line[_Turn], failure: Unreachable | None = None) -> None:
        """Hands the turn to the next caller; with ``failure``, wakes every caller behind with
        it instead (each raises its own copy, made by ``line_failure``)."""
        with self._lock:
            if failure is None:
                self._pass_locked(line)
                return
            while line.queue:
                turn = line.queue.popleft()
                turn.failure = line_failure(failure)
                turn.ready.set()
            line.busy = False

    @staticmethod
    def _pass_locked(line: _Line[_Turn]) -> None:
        if line.queue:
            line.queue.popleft().ready.set()
        else:
            line.busy = False


#: A task's place behind the head: resolved with ``None`` (its turn) or the head's failure.
_Ready = asyncio.Future[Optional[Unreachable]]


class AsyncLines(_Lines[_Ready]):
    def __init__(self) -> None:
        super().__init__()
        self._signal: Optional[asyncio.Event] = None  # made in the loop, replaced at each wake

    def _notify_locked(self) -> None:
        if self._signal is not None:
            self._signal.set()
            self._signal = None

    def signal(self, line: _Line[_Ready], seen: int) -> Optional[asyncio.Event]:
        """What a head awaits to be woken: ``None`` when the line was woken already (its ``woke``
        count is no longer ``seen``)."""
        with self._lock:
            if line.woke != seen:
                return None
            if self._signal is None:
                self._signal = asyncio.Event()
            return self._signal

    async def take_turn(self, line: _Line[_Ready], timeout: float | None) -> bool:
        """Waits to be the head; ``False`` when ``timeout`` seconds passed first. Raises the
        head's :class:`Unreachable` when it could not reach the limiter. Cancelling the caller
        takes it out of the line."""
        with self._lock:
            if not line.busy:
                line.busy = True
                return True
            ready: _Ready = asyncio.get_running_loop().create_future()
            line.queue.append(ready)
        try:
            if timeout is None:
                failure = await asyncio.shield(ready)
            else:
                failure = await asyncio.wait_for(asyncio.shield(ready), max(timeout, 0.0))
        except asyncio.TimeoutError:
            self._give_up(line, ready)
            return False
        except BaseException:
            self._give_up(line, ready)
            raise
        if failure is not None:
            raise failure
        return True

    def _give_up(self, line: _Line[_Ready], ready: _Ready) -> None:
        with self._lock:
            if not ready.done():
                line.queue.remove(ready)
                ready.cancel()
            elif ready.result() is None:
                self._pass_locked(line)  # the turn arrived as we left: pass it on

    def pass_turn(self, line: _Line[_Ready], failure: Unreachable | None = None) -> None:
        """Hands the turn to the next caller; with ``failure``, wakes every caller behind with
        it instead."""
        with self._lock:
            if failure is None:
                self._pass_locked(line)
                return
            while line.queue:
                ready = line.queue.popleft()
                if not ready.done():
                    ready.set_result(line_failure(failure))
            line.busy = False

    @staticmethod
    def _pass_locked(line: _Line[_Ready]) -> None:
        while line.queue:
            ready = line.queue.popleft()
            if not ready.done():
                ready.set_result(None)
                return
        line.busy = False
