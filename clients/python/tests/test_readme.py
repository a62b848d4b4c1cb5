"""Every Python block of the README runs as written, against the test server.

A block that calls a provider does so through the real SDK (``anthropic``, LangChain's
``ChatAnthropic``), pointed by its own environment variables (``ANTHROPIC_BASE_URL``,
``ANTHROPIC_API_KEY``) at a fake provider here that answers every Messages call.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import Server, server_binary

README = Path(__file__).resolve().parents[1] / "README.md"
DEFAULT_URL = "http://127.0.0.1:7411"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)

MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [{"type": "text", "text": "Sliding windows, token buckets and GCRA."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 9},
}


class FakeProvider(BaseHTTPRequestHandler):
    """Anthropic's Messages API, as far as the README's blocks call it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        body = json.dumps(MESSAGE).encode()
        self.send_response(200 if self.path.endswith("/v1/messages") else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.send_header("anthropic-ratelimit-requests-remaining", "49")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeProvider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_every_block_talks_to_the_server_it_names() -> None:
    # A block names the default server (replaced by the test's), or starts one of its own.
    assert len(BLOCKS) >= 7
    strays = [b for b in BLOCKS if DEFAULT_URL not in b and "start_server(" not in b]
    assert not strays, strays


@pytest.mark.parametrize("block", BLOCKS, ids=[f"example{i}" for i in range(len(BLOCKS))])
def test_a_readme_example_runs(
    block: str, server: Server, provider: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("ANTHROPIC_API_URL", "ANTHROPIC_AUTH_TOKEN"):  # would take precedence
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", provider)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("REDB_LIMITER_BIN", str(server_binary()))  # for the block that starts its own
    exec(compile(block.replace(DEFAULT_URL, server.url), str(README), "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip(), "each example shows what it did"
