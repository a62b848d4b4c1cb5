"""A provider's answers throttle its caller, through the real OpenAI and Anthropic SDKs.

The provider is an ``httpx.MockTransport`` (its replies are what the test needs); the limiter
is the real server.
"""

from __future__ import annotations

import json
from datetime import timedelta
from collections.abc import Callable
from typing import Any

import anthropic
import anthropic._base_client
import httpx
import openai
import openai._base_client
import pytest

from conftest import TWINS, Server, close_twin, make_twin
from redb_limiter import AsyncLimiter, Limit, Limiter, Refused, usage_tokens
from redb_limiter._time import datetime_to_ms, format_instant, parse_instant

# The HTTP library each SDK takes as `http_client`: httpx, or its fork httpx2 in newer releases.
OPENAI_HTTP: Any = getattr(openai._base_client, "httpx2", httpx)
ANTHROPIC_HTTP: Any = getattr(anthropic._base_client, "httpx2", httpx)

CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-test",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29},
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 9, "output_tokens": 41},
}


async def throttled_until(twin: Any, key: str) -> Any:
    with pytest.raises(Refused) as refused:
        await twin.try_acquire(key, [Limit.window(f"{key}/rpm", 1000, 60_000)], permit=False)
    assert refused.value.reason == "throttle" and refused.value.limit == key
    return refused.value.retry_at


@pytest.mark.parametrize("kind", TWINS)
async def test_throttle_from_reads_429s_and_spent_budgets(kind: str, server: Server, prefix: str) -> None:
    twin = make_twin(kind, server.url)
    try:
        me = f"{prefix}/cred"
        await twin.peek(me, [Limit.window(f"{prefix}/x", 1, 1000)])  # learn the server's clock
        before = twin.server_now()
        until = await twin.throttle_from(me, httpx.Response(429, headers={"retry-after": "2"}))
        assert until is not None
        assert before + timedelta(seconds=2) - timedelta(milliseconds=50) <= until
        assert until <= twin.server_now() + timedelta(seconds=2)
        assert await throttled_until(twin, me) == until
        assert await twin.lift(me) is True
        # A success without a spent budget, and an error other than a 429: no throttle, nothing sent.
        assert await twin.throttle_from(me, httpx.Response(200, headers={"x-ratelimit-remaining-tokens": "5"})) is None
        assert await twin.throttle_from(me, httpx.Response(500, headers={"retry-after": "9"})) is None
        await twin.try_acquire(me, [Limit.window(f"{prefix}/rpm", 1000, 60_000)], permit=False)
        # A success that spent its budget closes the caller until the reset.
        spent = httpx.Response(200, headers={"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"})
        until = await twin.throttle_from(me, spent)
        assert until is not None and timedelta(seconds=19.99) <= until - before < timedelta(seconds=22)
        assert await throttled_until(twin, me) == until
        # Google's RetryInfo in a 429's body.
        body = {"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "38s"}]}}
        until = await twin.throttle_from(me, httpx.Response(429, json=body))
        assert until is not None and timedelta(seconds=37.99) <= until - before < timedelta(seconds=40)
    finally:
        await close_twin(twin)


def test_the_hook_throttles_openai_and_anthropic_sdk_callers(server: Server, prefix: str) -> None:
    replies: list[tuple[int, dict[str, str], dict[str, Any]]] = []

    def provider(http: Any) -> Callable[[Any], Any]:
        def reply(request: Any) -> Any:
            status, headers, body = replies.pop(0)
            return http.Response(status, headers=headers, json=body)

        return reply

    with Limiter(server.url) as limiter:
        openai_key = f"{prefix}/openai-cred"
        http = OPENAI_HTTP.Client(
            transport=OPENAI_HTTP.MockTransport(provider(OPENAI_HTTP)),
            event_hooks={"response": [limiter.httpx_hook(openai_key)]},
        )
        client = openai.OpenAI(api_key="k", base_url="http://provider.test/v1", http_client=http, max_retries=0)
        replies.append((200, {}, CHAT))
        done = client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hello"}])
        assert usage_tokens(done, "openai") == 29
        limiter.try_acquire(openai_key, [Limit.window(f"{prefix}/rpm", 100, 60_000)], permit=False)  # not throttled
        error = {"error": {"message": "slow down", "type": "rate_limit_error"}}
        replies.append((429, {"retry-after-ms": "3000"}, error))
        before = limiter.server_now()
        with pytest.raises(openai.RateLimitError) as rate_limited:
            client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hello"}])
        with pytest.raises(Refused) as refused:
            limiter.try_acquire(openai_key, [Limit.window(f"{prefix}/rpm", 100, 60_000)])
        assert refused.value.reason == "throttle"
        assert timedelta(seconds=2.99) <= refused.value.retry_at - before < timedelta(seconds=5)
        # The SDK's error carries the response: throttle_from takes it as well.
        again = limiter.throttle_from(openai_key, rate_limited.value)
        assert again is not None and timedelta(0) <= again - refused.value.retry_at < timedelta(seconds=1)

        anthropic_key = f"{prefix}/anthropic-cred"
        http = ANTHROPIC_HTTP.Client(
            transport=ANTHROPIC_HTTP.MockTransport(provider(ANTHROPIC_HTTP)),
            event_hooks={"response": [limiter.httpx_hook(anthropic_key)]},
        )
        claude = anthropic.Anthropic(api_key="k", base_url="http://provider.test", http_client=http, max_retries=0)
        reset = limiter.server_now() + timedelta(seconds=10)
        headers = {
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": format_instant(datetime_to_ms(reset) // 1000 * 1000),
        }
        replies.append((200, headers, MESSAGE))
        message = claude.messages.create(model="claude-test", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
        assert usage_tokens(message, "anthropic") == 50
        with pytest.raises(Refused) as refused:
            limiter.try_acquire(anthropic_key, [Limit.window(f"{prefix}/rpm", 100, 60_000)])
        assert parse_instant(headers["anthropic-ratelimit-tokens-reset"]) == datetime_to_ms(refused.value.retry_at)
        assert not replies


async def test_the_async_hook_throttles_async_sdk_callers(server: Server, prefix: str) -> None:
    async def provider(request: Any) -> Any:
        body = json.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}})
        return ANTHROPIC_HTTP.Response(429, headers={"retry-after": "4"}, content=body.encode())

    async with AsyncLimiter(server.url) as limiter:
        key = f"{prefix}/cred"
        http = ANTHROPIC_HTTP.AsyncClient(
            transport=ANTHROPIC_HTTP.MockTransport(provider), event_hooks={"response": [limiter.httpx_hook(key)]}
        )
        client = anthropic.AsyncAnthropic(api_key="k", base_url="http://provider.test", http_client=http, max_retries=0)
        await limiter.peek(key, [Limit.window(f"{prefix}/x", 1, 1000)])
        before = limiter.server_now()
        with pytest.raises(anthropic.RateLimitError):
            await client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(Refused) as refused:
            await limiter.try_acquire(key, [Limit.window(f"{prefix}/rpm", 100, 60_000)])
        assert timedelta(seconds=3.99) <= refused.value.retry_at - before < timedelta(seconds=6)
        await http.aclose()


def test_a_hook_whose_limiter_is_down_never_breaks_the_provider_call() -> None:
    with Limiter("http://127.0.0.1:9", timeout=1.0) as limiter:
        http = httpx.Client(
            transport=httpx.MockTransport(lambda request: httpx.Response(429, headers={"retry-after": "1"})),
            event_hooks={"response": [limiter.httpx_hook("me")]},
        )
        assert http.get("http://provider.test/").status_code == 429
