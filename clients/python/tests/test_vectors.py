"""The shared provider-signal vectors (tests/vectors/vendor-signals.json at the repository
root), which the Rust and JavaScript clients read too: every case, by name. The usage cases
give a reply's (or a request's) usage per kind and its costs in the buckets the case declares,
or the error, by its exact message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from redb_limiter import EstimateError, request_usage, token_usage, usage_costs, vendor_budget, vendor_wait_ms
from redb_limiter._time import datetime_to_ms, format_instant, ms_to_datetime, parse_instant

VECTORS = Path(__file__).resolve().parents[3] / "tests" / "vectors" / "vendor-signals.json"
CASES: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8"))


def test_the_vectors_are_all_there() -> None:
    assert len(CASES["wait"]) >= 50 and len(CASES["budget"]) >= 50


@pytest.mark.parametrize("case", CASES["wait"], ids=[c["name"] for c in CASES["wait"]])
def test_wait(case: dict[str, Any]) -> None:
    now = ms_to_datetime(parse_instant(case["now"]))
    got = vendor_wait_ms(case["headers"], case["body"], now=now, default_ms=case["defaultMs"])
    assert got == case["expectMs"]
    # The same through httpx's headers, as a provider's response carries them.
    headers = httpx.Headers(list(case["headers"].items()))
    assert vendor_wait_ms(headers, case["body"], now=now, default_ms=case["defaultMs"]) == case["expectMs"]


@pytest.mark.parametrize("case", CASES["budget"], ids=[c["name"] for c in CASES["budget"]])
def test_budget(case: dict[str, Any]) -> None:
    now = ms_to_datetime(parse_instant(case["now"]))
    got = vendor_budget(case["headers"], now=now)
    assert (None if got is None else format_instant(datetime_to_ms(got))) == (
        None if case["expect"] is None else format_instant(parse_instant(case["expect"]))
    )
    assert vendor_budget(httpx.Headers(list(case["headers"].items())), now=now) == got


def _usage_case(case: dict[str, Any], read: Any, body: str) -> None:
    try:
        usage = read(body, case["provider"])
        costs = usage_costs(usage, case["provider"], **case["buckets"])
    except EstimateError as e:
        assert case["error"] is not None, f"unexpected error {e}"
        assert str(e) == case["error"]
        return
    assert case["error"] is None, f"expected the error {case['error']!r}, got {usage} {costs}"
    got = {"input": usage.input, "output": usage.output, "cacheRead": usage.cache_read, "cacheWrite": usage.cache_write}
    assert got == case["usage"]
    assert costs == case["costs"]


def test_the_usage_vectors_are_all_there() -> None:
    assert len(CASES["usage"]) >= 20 and len(CASES["estimate"]) >= 5


@pytest.mark.parametrize("case", CASES["usage"], ids=[c["name"] for c in CASES["usage"]])
def test_usage(case: dict[str, Any]) -> None:
    _usage_case(case, token_usage, case["body"])


@pytest.mark.parametrize("case", CASES["estimate"], ids=[c["name"] for c in CASES["estimate"]])
def test_estimate(case: dict[str, Any]) -> None:
    _usage_case(case, request_usage, case["request"])
