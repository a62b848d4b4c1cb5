"""Tokens of an LLM call: an estimate before it (to acquire with), the usage after it (to
settle with). The same rules as the Rust client's ``estimate`` module.

- :func:`estimate_tokens`: the prompt's characters / 4 (rounded up), or what a tokenizer
  (tiktoken or any other) counts, plus the most the reply may hold. A guess on purpose: the
  settle after the call corrects it.
- :func:`request_tokens`: the same, read from a provider's request body.
- :func:`usage_tokens`: the tokens the provider reports having counted, strictly: a missing or
  malformed figure is an error naming it, never a guess. Anthropic: ``usage.input_tokens +
  output_tokens`` (+ the cache tokens when present); OpenAI: ``usage.total_tokens``, checked
  against its parts when given (Chat Completions and the Responses API); Google:
  ``usageMetadata.totalTokenCount``.

::

    tokens = estimate_tokens(messages, max_tokens=1024)
    async with limiter.acquire("me", [Limit.window("a/tpm", 40_000, 60_000)], cost=tokens) as permit:
        reply = await client.messages.create(model=..., messages=messages, max_tokens=1024)
        await permit.settle({"a/tpm": usage_tokens(reply, "anthropic")})
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Dict, Optional

__all__ = ["EstimateError", "estimate_tokens", "request_tokens", "usage_tokens"]

#: Counts the tokens of one piece of text.
Tokenizer = Callable[[str], int]

_PROMPT_FIELDS = {
    "anthropic": ("system", "messages", "tools"),
    "openai": ("messages", "input", "instructions", "tools"),
    "google": ("contents", "systemInstruction", "tools"),
}


class EstimateError(ValueError):
    """A body gives no figure; the message names the field at fault."""


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _prompt_tokens(value: object, tokenizer: Optional[Tokenizer], chars_per_token: int) -> int:
    pieces = _strings(value)
    if tokenizer is not None:
        return sum(int(tokenizer(piece)) for piece in pieces)
    return -(-sum(len(piece) for piece in pieces) // max(chars_per_token, 1))


def estimate_tokens(
    messages: object,
    max_tokens: int,
    *,
    tokenizer: Optional[Tokenizer] = None,
    chars_per_token: int = 4,
) -> int:
    """The tokens a call may spend: its prompt (every string inside ``messages``: a list of
    message dicts, a string, any JSON-like value) as characters / ``chars_per_token`` rounded
    up, or summed over ``tokenizer(piece)``, plus ``max_tokens``.

    ``tokenizer`` may be, for tiktoken, ``lambda s: len(encoding.encode(s))``."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise EstimateError(f"max_tokens must be a non-negative integer, got {max_tokens!r}")
    return _prompt_tokens(messages, tokenizer, chars_per_token) + max_tokens


def _as_object(body: object, field: str = "body") -> Dict[str, Any]:
    if isinstance(body, (bytes, bytearray, str)):
        try:
            body = json.loads(body)
        except ValueError as e:
            raise EstimateError(f"{field} is not valid JSON: {e}") from None
    dump = getattr(body, "model_dump", None)  # an SDK's pydantic reply
    if callable(dump) and not isinstance(body, Mapping):
        body = dump()
    if not isinstance(body, Mapping):
        raise EstimateError(f"{field} must be a JSON object")
    return dict(body)


def _count(obj: Mapping[str, Any], name: str, field: str) -> Optional[int]:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EstimateError(f"{field} must be a non-negative integer")
    return int(value)


def _required(obj: Mapping[str, Any], name: str, field: str) -> int:
    value = _count(obj, name, field)
    if value is None:
        raise EstimateError(f"{field} is required")
    return value


def _member(obj: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    if name not in obj or obj[name] is None:
        raise EstimateError(f"{name} is required")
    value = obj[name]
    if not isinstance(value, Mapping):
        raise EstimateError(f"{name} must be a JSON object")
    return value


def _provider(provider: str) -> str:
    if provider not in _PROMPT_FIELDS:
        raise EstimateError(f"provider must be one of anthropic, openai, google, got {provider!r}")
    return provider


def request_tokens(
    body: object,
    provider: str,
    *,
    default_max_output: int = 4096,
    tokenizer: Optional[Tokenizer] = None,
    chars_per_token: int = 4,
) -> int:
    """:func:`estimate_tokens` of a provider's request body (a dict or JSON): the prompt
    fields, plus ``max_tokens`` or its equivalent (``max_completion_tokens``,
    ``max_output_tokens``, ``generationConfig.maxOutputTokens``), else ``default_max_output``."""
    obj = _as_object(body)
    name = _provider(provider)
    prompt = [obj[f] for f in _PROMPT_FIELDS[name] if f in obj]
    if name == "anthropic":
        max_output = _count(obj, "max_tokens", "max_tokens")
    elif name == "openai":
        max_output = _count(obj, "max_completion_tokens", "max_completion_tokens")
        if max_output is None:
            max_output = _count(obj, "max_output_tokens", "max_output_tokens")
        if max_output is None:
            max_output = _count(obj, "max_tokens", "max_tokens")
    else:
        config = obj.get("generationConfig")
        if config is None:
            max_output = None
        elif not isinstance(config, Mapping):
            raise EstimateError("generationConfig must be a JSON object")
        else:
            max_output = _count(config, "maxOutputTokens", "generationConfig.maxOutputTokens")
    tokens = _prompt_tokens(prompt, tokenizer, chars_per_token)
    return tokens + (default_max_output if max_output is None else max_output)


def usage_tokens(reply: object, provider: str) -> int:
    """The tokens the provider reports for a call, from its reply: a dict, JSON text, or an
    SDK's reply object (``anthropic.types.Message``, ``openai.types.chat.ChatCompletion``)."""
    obj = _as_object(reply)
    name = _provider(provider)
    if name == "anthropic":
        usage = _member(obj, "usage")
        return (
            _required(usage, "input_tokens", "usage.input_tokens")
            + _required(usage, "output_tokens", "usage.output_tokens")
            + (_count(usage, "cache_creation_input_tokens", "usage.cache_creation_input_tokens") or 0)
            + (_count(usage, "cache_read_input_tokens", "usage.cache_read_input_tokens") or 0)
        )
    if name == "openai":
        usage = _member(obj, "usage")
        total = _required(usage, "total_tokens", "usage.total_tokens")
        for a, b in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
            pa, pb = _count(usage, a, f"usage.{a}"), _count(usage, b, f"usage.{b}")
            if pa is not None and pb is not None and pa + pb != total:
                raise EstimateError(f"usage.total_tokens is not usage.{a} + usage.{b}")
        return total
    return _required(_member(obj, "usageMetadata"), "totalTokenCount", "usageMetadata.totalTokenCount")
