"""A tenacity-compatible wait: sleep until the limiter's ``retryAt``.

``wait_retry_at()`` is a callable of tenacity's ``RetryCallState``: when the attempt failed
with :class:`~redb_limiter.Refused`, it waits until the refusal's ``retry_at`` (sized on the
limiter's clock when it answered, less the time gone since); for any other failure it defers
to ``fallback`` (tenacity's own waits fit there). It imports nothing of tenacity.

    @tenacity.retry(retry=tenacity.retry_if_exception_type(Refused),
                    wait=wait_retry_at(), stop=tenacity.stop_after_delay(30))
    def call() -> str:
        with limiter.try_acquire("me", [Limit.window("api/rpm", 60, 60_000)]):
            return provider()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Union

from ._errors import Refused

__all__ = ["wait_retry_at"]


Fallback = Union[float, Callable[[Any], float]]


class wait_retry_at:  # noqa: N801 - named like tenacity's waits
    """Waits until a :class:`Refused`'s ``retry_at``; ``fallback`` (seconds, or a wait of
    tenacity's) for other failures. ``monotonic`` is the clock the refusal's ``received_at``
    was read on (``time.monotonic`` unless the limiter was given another clock)."""

    def __init__(self, fallback: Fallback = 1.0, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.fallback = fallback
        self.monotonic = monotonic

    def __call__(self, retry_state: Any) -> float:
        outcome = getattr(retry_state, "outcome", None)
        error = outcome.exception() if outcome is not None and getattr(outcome, "failed", True) else None
        if isinstance(error, Refused):
            gone = max(self.monotonic() - error.received_at, 0.0) if error.received_at else 0.0
            return max(error.retry_after - gone, 0.0)
        if callable(self.fallback):
            return float(self.fallback(retry_state))
        return float(self.fallback)
