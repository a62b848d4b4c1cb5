"""Token estimates before a call and the provider's usage after it (the Rust client's rules)."""

from __future__ import annotations

import pytest

from redb_limiter import EstimateError, estimate_tokens, request_tokens, usage_tokens


def test_estimate_counts_characters_over_four_plus_the_maximum() -> None:
    messages = [{"role": "user", "content": "Hello there!"}]  # "user" + "Hello there!": 16 characters
    assert estimate_tokens(messages, 100) == 4 + 100
    assert estimate_tokens("a" * 41, 0) == 11  # rounded up
    assert estimate_tokens([{"role": "u", "content": [{"type": "text", "text": "ééé"}]}], 5) == 2 + 5  # characters
    assert estimate_tokens([], 7) == 7
    assert estimate_tokens(messages, 10, chars_per_token=2) == 8 + 10


def test_estimate_takes_a_tokenizer() -> None:
    seen: list[str] = []

    def words(text: str) -> int:
        seen.append(text)
        return len(text.split())

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three"}]
    assert estimate_tokens(messages, 50, tokenizer=words) == 1 + 2 + 1 + 3 + 50
    assert seen == ["system", "be brief", "user", "one two three"]


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_estimate_refuses_a_bad_maximum(bad: object) -> None:
    with pytest.raises(EstimateError, match="max_tokens"):
        estimate_tokens([], bad)  # type: ignore[arg-type]


def test_request_estimates_read_the_prompt_and_the_reply_limit() -> None:
    text = "a" * 36
    anthropic = {"model": "claude", "max_tokens": 1000, "system": "ab", "messages": [{"role": "u", "content": text + "x"}]}
    assert request_tokens(anthropic, "anthropic") == 10 + 1000
    chat = {"model": "gpt", "max_completion_tokens": 50, "messages": [{"role": "user", "content": text}]}
    assert request_tokens(chat, "openai") == 10 + 50
    assert request_tokens({"max_tokens": 60, "messages": [{"role": "user", "content": text}]}, "openai") == 10 + 60
    responses = {"model": "gpt", "max_output_tokens": 70, "instructions": "abcd", "input": text}
    assert request_tokens(responses, "openai") == 10 + 70
    google = {"contents": [{"role": "user", "parts": [{"text": text}]}], "generationConfig": {"maxOutputTokens": 80}}
    assert request_tokens(google, "google") == 10 + 80
    assert request_tokens('{"contents":[{"parts":[{"text":"ééé"}]}]}', "google") == 1 + 4096
    for body, provider, message in [
        ({"messages": [], "max_tokens": -1}, "openai", "max_tokens must be a non-negative integer"),
        ({"generationConfig": {"maxOutputTokens": "8"}}, "google", "generationConfig.maxOutputTokens"),
        ({"generationConfig": []}, "google", "generationConfig must be a JSON object"),
        ("5", "anthropic", "body must be a JSON object"),
        ("{", "anthropic", "body is not valid JSON"),
        ({}, "mistral", "provider must be one of"),
    ]:
        with pytest.raises(EstimateError, match=message):
            request_tokens(body, provider)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"usage":{"input_tokens":10,"output_tokens":5}}', 15),
        (
            '{"id":"msg","usage":{"input_tokens":10,"output_tokens":5,'
            '"cache_creation_input_tokens":100,"cache_read_input_tokens":1000}}',
            1115,
        ),
        ('{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":null}}', 15),
        ('{"usage":{"output_tokens":5}}', "usage.input_tokens is required"),
        ('{"usage":{"input_tokens":10}}', "usage.output_tokens is required"),
        ('{"usage":{"input_tokens":1.5,"output_tokens":5}}', "usage.input_tokens must be a non-negative integer"),
        ('{"usage":{"input_tokens":-1,"output_tokens":5}}', "usage.input_tokens must be a non-negative integer"),
        ('{"usage":{"input_tokens":"10","output_tokens":5}}', "usage.input_tokens must be a non-negative integer"),
        (
            '{"usage":{"input_tokens":1,"output_tokens":5,"cache_creation_input_tokens":1e2}}',
            "usage.cache_creation_input_tokens must be a non-negative integer",
        ),
        ('{"usage":[]}', "usage must be a JSON object"),
        ("{}", "usage is required"),
        ("[]", "body must be a JSON object"),
    ],
)
def test_anthropic_usage_counts_cache_tokens(body: str, expected: int | str) -> None:
    if isinstance(expected, int):
        assert usage_tokens(body, "anthropic") == expected
    else:
        with pytest.raises(EstimateError) as error:
            usage_tokens(body, "anthropic")
        assert str(error.value) == expected


def test_openai_and_google_usage() -> None:
    assert usage_tokens({"usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29}}, "openai") == 29
    responses = {"object": "response", "usage": {"input_tokens": 36, "output_tokens": 87, "total_tokens": 123}}
    assert usage_tokens(responses, "openai") == 123
    assert usage_tokens(b'{"usage":{"total_tokens":7}}', "openai") == 7
    assert usage_tokens({"usageMetadata": {"promptTokenCount": 4, "totalTokenCount": 13}}, "google") == 13
    for body, provider, message in [
        ({"usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 30}}, "openai",
         "usage.total_tokens is not usage.prompt_tokens + usage.completion_tokens"),
        ({"usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 3}}, "openai",
         "usage.total_tokens is not usage.input_tokens + usage.output_tokens"),
        ({"usage": {"input_tokens": 1, "output_tokens": 1}}, "openai", "usage.total_tokens is required"),
        ({"usage": {"total_tokens": True}}, "openai", "usage.total_tokens must be a non-negative integer"),
        ({"choices": []}, "openai", "usage is required"),
        ({"usageMetadata": {"promptTokenCount": 4}}, "google", "usageMetadata.totalTokenCount is required"),
        ({"usage": {"total_tokens": 1}}, "google", "usageMetadata is required"),
    ]:
        with pytest.raises(EstimateError) as error:
            usage_tokens(body, provider)
        assert str(error.value) == message
