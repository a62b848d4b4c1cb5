"""The shared provider-signal vectors (tests/vectors/vendor-signals.json at the repository
root), which the Rust and JavaScript clients read too: every case, by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from redb_limiter import vendor_budget, vendor_wait_ms
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
