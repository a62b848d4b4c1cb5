"""One process of the LangChain test: a fake chat model whose calls a RedbRateLimiter paces.

Usage: python langchain_worker.py URL PREFIX CALLS sync|async. Prints the grant instants (on
the limiter's clock) as a JSON list, one per model call.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeListChatModel

from redb_limiter import AcquireContext, AsyncLimiter, AsyncPermit, Limit, Limiter, Permit
from redb_limiter.langchain import RedbRateLimiter

grants: list[str] = []


class RecordingLimiter(Limiter):
    def acquire(self, *args: Any, **kwargs: Any) -> Permit:
        permit = super().acquire(*args, **kwargs)
        grants.append(permit.at.isoformat())
        return permit


class RecordingAsyncLimiter(AsyncLimiter):
    def acquire(self, *args: Any, **kwargs: Any) -> AcquireContext:
        context = super().acquire(*args, **kwargs)

        async def start() -> AsyncPermit:
            permit = await context
            grants.append(permit.at.isoformat())
            return permit

        return AcquireContext(start)


def main() -> None:
    url, prefix, calls, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    limits = [Limit.window(f"{prefix}/rps", 3, 1_000)]
    limiter: Limiter | AsyncLimiter = RecordingLimiter(url) if mode == "sync" else RecordingAsyncLimiter(url)
    model = FakeListChatModel(
        responses=[f"answer {i}" for i in range(calls)],
        rate_limiter=RedbRateLimiter(limiter, f"{prefix}/caller", limits, max_wait=30),
    )
    if mode == "sync":
        answers = [model.invoke(f"question {i}").content for i in range(calls)]
    else:

        async def run() -> list[Any]:
            return [(await model.ainvoke(f"question {i}")).content for i in range(calls)]

        answers = asyncio.run(run())
    assert answers == [f"answer {i}" for i in range(calls)], answers
    print(json.dumps(grants))


if __name__ == "__main__":
    main()
