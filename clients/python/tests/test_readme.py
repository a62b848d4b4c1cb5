"""The README's runnable examples run as written, against the test server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import Server

README = Path(__file__).resolve().parents[1] / "README.md"
DEFAULT_URL = "http://127.0.0.1:7411"
BLOCKS = [block for block in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if DEFAULT_URL in block]


def test_the_readme_has_runnable_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("block", BLOCKS, ids=[f"example{i}" for i in range(len(BLOCKS))])
def test_a_readme_example_runs(block: str, server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(block.replace(DEFAULT_URL, server.url), str(README), "exec"), {"__name__": "__main__"})
    assert "granted at" in capsys.readouterr().out
