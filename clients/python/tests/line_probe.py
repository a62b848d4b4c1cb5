"""Does the server keep the line (wire section 12)? Exit 0 when a queued refusal names a
ticket, 1 when it does not. `run-tests.sh` runs tests/test_line.py only then."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import start_server  # noqa: E402


def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        server = start_server(Path(folder))
        try:
            body = {"key": "probe", "queue": True, "limits": [{"key": "probe/rpm", "calls": 1, "perMs": 60_000}]}
            httpx.post(f"{server.url}/acquire", json=body)
            reply = httpx.post(f"{server.url}/acquire", json=body).json()
        finally:
            server.stop()
    return 0 if reply.get("granted") is False and "ticket" in reply else 1


if __name__ == "__main__":
    sys.exit(main())
