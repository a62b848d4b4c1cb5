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
- :func:`token_usage` and :func:`request_usage`: the same figures per kind (:class:`Usage`:
  input, output, cache reads and cache writes apart), from a reply and from a request (whose
  output part is the most the reply may hold, so that a settle after the call brings it down to
  the real output).
- :func:`usage_costs`: a usage as the costs of the buckets a host declares: the input its
  provider counts to an input bucket, the output to an output bucket, both to a tokens bucket.
  Anthropic counts no cache reads towards its input limits; OpenAI and Google count cached
  prompt tokens like any other.

::

    tokens = estimate_tokens(messages, max_tokens=1024)
    async with limiter.acquire("me", [Limit.window("a/tpm", 40_000, 60_000)], cost=tokens) as permit:
        reply = await client.messages.create(model=..., messages=messages, max_tokens=1024)
        await permit.settle({"a/tpm": usage_tokens(reply, "anthropic")})
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = [
    "EstimateError",
    "Usage",
    "estimate_tokens",
    "request_tokens",
    "request_usage",
    "token_usage",
    "usage_costs",
    "usage_tokens",
]

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
        raise EstimateError("provider must be one of anthropic, openai, google")
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
    usage = request_usage(
        body, provider, default_max_output=default_max_output, tokenizer=tokenizer, chars_per_token=chars_per_token
    )
    return usage.input + usage.output


@dataclass(frozen=True)
class Usage:
    """A call's tokens per kind, as its provider counts them. ``input`` holds no cached
    tokens: the prompt is ``input + cache_read + cache_write``."""

    #: Prompt tokens read neither from nor into a cache.
    input: int
    #: Reply tokens (reasoning included).
    output: int
    #: Prompt tokens read from a cache.
    cache_read: int = 0
    #: Prompt tokens written into a cache (Anthropic's ``cache_creation_input_tokens``).
    cache_write: int = 0

    @property
    def total(self) -> int:
        """Every token of the call, cached or not."""
        return self.input + self.output + self.cache_read + self.cache_write

    def counted_input(self, provider: str) -> int:
        """The input ``provider`` counts towards its input limits: all of the prompt, but for
        Anthropic, whose cache reads count towards none."""
        reads = 0 if _provider(provider) == "anthropic" else self.cache_read
        return self.input + self.cache_write + reads


def request_usage(
    body: object,
    provider: str,
    *,
    default_max_output: int = 4096,
    tokenizer: Optional[Tokenizer] = None,
    chars_per_token: int = 4,
) -> Usage:
    """The guess before a call, per kind, from its request body (a dict or JSON): the prompt
    fields as input (as :func:`request_tokens` counts them), and as output the most the reply
    may hold. Acquire with it, then settle to the reply's :func:`token_usage`, which brings the
    output down to what was spent."""
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
    return Usage(tokens, default_max_output if max_output is None else max_output)


def _part_of(part: int, whole: int, part_field: str, whole_field: str) -> int:
    if part > whole:
        raise EstimateError(f"{part_field} exceeds {whole_field}")
    return whole - part


def token_usage(reply: object, provider: str) -> Usage:
    """The provider's usage of a call, per kind, from its reply (a dict, JSON text, or an SDK's
    reply object), strictly: a missing or malformed figure raises :class:`EstimateError` naming
    it. Anthropic: ``usage.input_tokens`` and ``output_tokens``, ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` (0 when absent). OpenAI: ``prompt_tokens`` and
    ``completion_tokens`` (Chat Completions) or ``input_tokens`` and ``output_tokens`` (the
    Responses API), their ``*_tokens_details.cached_tokens`` as cache reads, and
    ``total_tokens``, when given, checked against the two. Google:
    ``usageMetadata.promptTokenCount`` (its ``cachedContentTokenCount`` as cache reads) and the
    rest of ``totalTokenCount`` (the reply and its thoughts) as output."""
    obj = _as_object(reply)
    name = _provider(provider)
    if name == "anthropic":
        usage = _member(obj, "usage")
        return Usage(
            _required(usage, "input_tokens", "usage.input_tokens"),
            _required(usage, "output_tokens", "usage.output_tokens"),
            _count(usage, "cache_read_input_tokens", "usage.cache_read_input_tokens") or 0,
            _count(usage, "cache_creation_input_tokens", "usage.cache_creation_input_tokens") or 0,
        )
    if name == "openai":
        usage = _member(obj, "usage")
        a, b = ("input", "output") if "input_tokens" in usage or "output_tokens" in usage else ("prompt", "completion")
        prompt = _required(usage, f"{a}_tokens", f"usage.{a}_tokens")
        output = _required(usage, f"{b}_tokens", f"usage.{b}_tokens")
        details = usage.get(f"{a}_tokens_details")
        cached = 0
        if details is not None:
            if not isinstance(details, Mapping):
                raise EstimateError(f"usage.{a}_tokens_details must be a JSON object")
            cached = _count(details, "cached_tokens", f"usage.{a}_tokens_details.cached_tokens") or 0
        uncached = _part_of(cached, prompt, f"usage.{a}_tokens_details.cached_tokens", f"usage.{a}_tokens")
        total = _count(usage, "total_tokens", "usage.total_tokens")
        if total is not None and prompt + output != total:
            raise EstimateError(f"usage.total_tokens is not usage.{a}_tokens + usage.{b}_tokens")
        return Usage(uncached, output, cached)
    meta = _member(obj, "usageMetadata")
    prompt = _required(meta, "promptTokenCount", "usageMetadata.promptTokenCount")
    total = _required(meta, "totalTokenCount", "usageMetadata.totalTokenCount")
    cached = _count(meta, "cachedContentTokenCount", "usageMetadata.cachedContentTokenCount") or 0
    uncached = _part_of(cached, prompt, "usageMetadata.cachedContentTokenCount", "usageMetadata.promptTokenCount")
    if total < prompt:
        raise EstimateError("usageMetadata.totalTokenCount is below usageMetadata.promptTokenCount")
    return Usage(uncached, total - prompt, cached)


_MAX_BUCKET_KEY_BYTES = 512


def usage_costs(
    usage: Usage,
    provider: str,
    *,
    input: Optional[str] = None,
    output: Optional[str] = None,
    tokens: Optional[str] = None,
) -> Dict[str, int]:
    """A usage as the costs of the buckets a host declares, by key, for ``settle`` (or a
    limit's ``cost`` when acquiring with a :func:`request_usage`): the input the provider
    counts to ``input``, the output to ``output``, both to ``tokens``. Raises
    :class:`EstimateError` naming the bucket at fault."""
    counted = usage.counted_input(provider)
    named = (("input", input, counted), ("output", output, usage.output), ("tokens", tokens, counted + usage.output))
    costs: Dict[str, int] = {}
    for i, (kind, key, cost) in enumerate(named):
        if key is None:
            continue
        size = len(key.encode("utf-8")) if isinstance(key, str) else -1
        if not 1 <= size <= _MAX_BUCKET_KEY_BYTES:
            got = size if size >= 0 else type(key).__name__
            raise EstimateError(f"buckets.{kind} must be 1 to {_MAX_BUCKET_KEY_BYTES} bytes of UTF-8, got {got}")
        earlier = next((k for k, other, _ in named[:i] if other == key), None)
        if earlier is not None:
            raise EstimateError(f"buckets.{kind} repeats buckets.{earlier}")
        costs[key] = cost
    if not costs:
        raise EstimateError("buckets must name input, output or tokens")
    return costs


def usage_tokens(reply: object, provider: str) -> int:
    """The tokens the provider reports for a call, from its reply: a dict, JSON text, or an
    SDK's reply object (``anthropic.types.Message``, ``openai.types.chat.ChatCompletion``)."""
    obj = _as_object(reply)
    name = _provider(provider)
    if name == "anthropic":
        return token_usage(obj, name).total
    if name == "openai":
        usage = _member(obj, "usage")
        total = _required(usage, "total_tokens", "usage.total_tokens")
        for a, b in (("prompt_tokens", "completion_tokens"), ("input_tokens", "output_tokens")):
            pa, pb = _count(usage, a, f"usage.{a}"), _count(usage, b, f"usage.{b}")
            if pa is not None and pb is not None and pa + pb != total:
                raise EstimateError(f"usage.total_tokens is not usage.{a} + usage.{b}")
        return total
    return _required(_member(obj, "usageMetadata"), "totalTokenCount", "usageMetadata.totalTokenCount")
