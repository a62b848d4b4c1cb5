"""LangChain: :class:`RedbRateLimiter`, a ``langchain_core`` rate limiter over a limiter, so
chat models in many processes (``rate_limiter=``) share one limit. Needs the ``[langchain]``
extra.

    limiter = Limiter("http://127.0.0.1:7411")
    model = ChatAnthropic(..., rate_limiter=RedbRateLimiter(
        limiter, "anthropic/cred:42", [Limit.window("anthropic/rpm", 50, 60_000)]))

LangChain calls ``acquire`` before each request and never says when it ends, so the grant
holds no permit: a concurrency limit's place is held until its ``hold_ms`` lapses.
"""

from __future__ import annotations

import asyncio
from typing import Optional, Union

from langchain_core.rate_limiters import BaseRateLimiter

from ._async import AsyncLimiter
from ._errors import Refused
from ._request import AcquireRequest, Limits
from ._sync import Limiter

__all__ = ["RedbRateLimiter"]


class RedbRateLimiter(BaseRateLimiter):
    """``acquire(blocking=True)`` waits for a grant (``max_wait`` seconds at most, then
    :class:`~redb_limiter.QueueTimeout`); ``blocking=False`` asks once and answers ``False``
    when refused. ``aacquire`` is the same for async calls.

    ``limiter`` is a :class:`Limiter` or an :class:`AsyncLimiter`; the other twin is made from
    its URL and token for the other kind of call."""

    def __init__(
        self,
        limiter: Union[Limiter, AsyncLimiter],
        key: str,
        limits: Limits,
        max_wait: Optional[float] = None,
        *,
        cost: int = 1,
    ) -> None:
        AcquireRequest.build(key, limits, cost)
        self.key = key
        self.limits = limits
        self.cost = cost
        self.max_wait = max_wait
        self._sync: Optional[Limiter] = limiter if isinstance(limiter, Limiter) else None
        self._async: Optional[AsyncLimiter] = limiter if isinstance(limiter, AsyncLimiter) else None
        self._made_for: Optional[asyncio.AbstractEventLoop] = None
        if self._sync is None and self._async is None:
            raise TypeError(f"limiter must be a Limiter or an AsyncLimiter, got {type(limiter).__name__}")

    def _sync_limiter(self) -> Limiter:
        if self._sync is None:
            assert self._async is not None
            a = self._async
            self._sync = Limiter(a.url, a.token, a.timeout, max_waiters=a.max_waiters, clock=a.clock)
        return self._sync

    def _async_limiter(self) -> AsyncLimiter:
        if self._async is not None and self._made_for is None:
            return self._async  # the caller's own
        loop = asyncio.get_running_loop()
        if self._async is None or self._made_for is not loop:
            # One made here belongs to the event loop it was made in (its connections do).
            s = self._sync_limiter()
            self._async = AsyncLimiter(s.url, s.token, s.timeout, max_waiters=s.max_waiters, clock=s.clock)
            self._made_for = loop
        return self._async

    def acquire(self, *, blocking: bool = True) -> bool:
        limiter = self._sync_limiter()
        if not blocking:
            try:
                limiter.try_acquire(self.key, self.limits, self.cost, permit=False)
            except Refused:
                return False
            return True
        limiter.acquire(self.key, self.limits, self.cost, self.max_wait, permit=False)
        return True

    async def aacquire(self, *, blocking: bool = True) -> bool:
        limiter = self._async_limiter()
        if not blocking:
            try:
                await limiter.try_acquire(self.key, self.limits, self.cost, permit=False)
            except Refused:
                return False
            return True
        await limiter.acquire(self.key, self.limits, self.cost, self.max_wait, permit=False)
        return True

