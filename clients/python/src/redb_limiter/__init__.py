"""redb-limiter's host side in Python: ask a redb-limiter server before every call to a
rate-limited provider, and wait as it says.

- :class:`Limiter` and :class:`AsyncLimiter`: twins with the same methods and errors.
  ``try_acquire`` asks once; ``acquire`` waits (on the limiter's clock, first in first out per
  request shape, in the limiter's line with a ticket) and is a context manager that releases
  on exit; ``peek``, ``release``, ``settle``, ``throttle``, ``lift``; ``limit`` decorates a
  function; ``throttle_from`` and ``httpx_hook`` read a provider's 429s and budgets.
- :class:`Limit`: one bucket, ``Limit.window(key, calls, per_ms)`` or
  ``Limit.concurrent(key, n)``, checked against the wire's bounds before sending.
- Errors: :class:`Refused`, :class:`QueueTimeout`, :class:`QueueFull`, :class:`Unavailable`
  (and :class:`Unreachable`), :class:`BadRequest` naming the field, all :class:`LimiterError`.
- :func:`find_server` (the ``redb-limiter`` binary the wheel installed) and :func:`start_server`
  (a local server for a test or a laptop).
- :mod:`redb_limiter.vendor` (providers' signals), :mod:`redb_limiter.estimate` (tokens),
  :mod:`redb_limiter.langchain` (``RedbRateLimiter``), :func:`wait_retry_at` (tenacity).

Durations are seconds (``max_wait=2.5``); the wire's milliseconds appear only in the names
that say so (``per_ms``, ``hold_ms``). Instants are aware UTC ``datetime`` values.
"""

from ._async import AcquireContext, AsyncLimiter, AsyncPermit
from ._base import Clock, WaitReport
from ._errors import (
    BadRequest,
    LimiterError,
    NoTicket,
    ProtocolError,
    QueueFull,
    QueueTimeout,
    Refused,
    Unauthorized,
    Unavailable,
    Unreachable,
)
from ._request import Adapt, Costs, Limit, Limits
from ._server import LocalServer, ServerNotFound, find_server, start_server
from ._sync import Limiter, Permit
from ._wire import LimitFigures, Peek
from .estimate import (
    EstimateError,
    Usage,
    estimate_tokens,
    request_tokens,
    request_usage,
    token_usage,
    usage_costs,
    usage_tokens,
)
from .retry import wait_retry_at
from .vendor import vendor_budget, vendor_outcome, vendor_wait_ms

__all__ = [
    "AcquireContext",
    "Adapt",
    "AsyncLimiter",
    "AsyncPermit",
    "BadRequest",
    "Clock",
    "Costs",
    "EstimateError",
    "Limit",
    "LimitFigures",
    "Limiter",
    "LimiterError",
    "Limits",
    "LocalServer",
    "NoTicket",
    "Peek",
    "Permit",
    "ProtocolError",
    "QueueFull",
    "QueueTimeout",
    "Refused",
    "ServerNotFound",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "Usage",
    "WaitReport",
    "estimate_tokens",
    "find_server",
    "request_tokens",
    "request_usage",
    "start_server",
    "token_usage",
    "usage_costs",
    "usage_tokens",
    "vendor_budget",
    "vendor_outcome",
    "vendor_wait_ms",
    "wait_retry_at",
]

__version__ = "0.1.0"
