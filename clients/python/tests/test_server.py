"""The server from the wheel: ``find_server`` (the override, the places pip installs scripts to,
the error listing every place searched) and ``start_server`` against the real binary.
tests/packages/run.sh installs the built wheel itself into a fresh virtual environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path

import httpx
import pytest

import redb_limiter
from conftest import server_binary
from redb_limiter import Limit, Limiter, ServerNotFound, find_server, start_server

PACKAGE = Path(redb_limiter.__file__).resolve().parent


def test_the_override_wins_and_a_wrong_one_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("REDB_LIMITER_BIN", str(server_binary()))
    assert find_server() == str(server_binary())
    monkeypatch.setenv("REDB_LIMITER_BIN", str(tmp_path / "missing"))
    with pytest.raises(ServerNotFound, match="REDB_LIMITER_BIN names .*missing"):
        find_server()


def test_not_found_lists_every_place_searched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The test environment installs the client alone (no binary in its scripts).
    monkeypatch.delenv("REDB_LIMITER_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerNotFound) as raised:
        find_server()
    message = str(raised.value)
    assert sysconfig.get_path("scripts") in message
    assert " - PATH" in message
    assert "REDB_LIMITER_BIN" in message


def _find_from(site: Path) -> subprocess.CompletedProcess[str]:
    """``find_server()`` in a fresh interpreter that imports the package from ``site``."""
    env = {k: v for k, v in os.environ.items() if k != "REDB_LIMITER_BIN"}
    env["PYTHONPATH"] = str(site)
    env["PATH"] = "/nonexistent"
    return subprocess.run(
        [sys.executable, "-c", "import redb_limiter; print(redb_limiter.__file__); print(redb_limiter.find_server())"],
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("layout", ["prefix", "target"])
def test_finds_the_binary_of_a_prefix_or_target_install(layout: str, tmp_path: Path) -> None:
    # `pip install --prefix P`: P/lib/pythonX.Y/site-packages/redb_limiter and P/bin;
    # `pip install --target T`: T/redb_limiter and T/bin.
    version = "python%d.%d" % sys.version_info[:2]
    site = tmp_path / "lib" / version / "site-packages" if layout == "prefix" else tmp_path
    shutil.copytree(PACKAGE, site / "redb_limiter", ignore=shutil.ignore_patterns("__pycache__"))
    found = _find_from(site)
    assert found.returncode != 0 and "ServerNotFound" in found.stderr, found
    (tmp_path / "bin").mkdir()
    shutil.copy2(server_binary(), tmp_path / "bin" / "redb-limiter")
    found = _find_from(site)
    assert found.returncode == 0, found.stderr
    imported, binary = found.stdout.splitlines()
    assert imported == str(site / "redb_limiter" / "__init__.py")
    assert binary == str(tmp_path / "bin" / "redb-limiter")


def test_start_server_serves_the_file_at_the_address_until_stop(tmp_path: Path) -> None:
    path = tmp_path / "given.redb"
    server = start_server(path, "127.0.0.1:0", binary=server_binary(), stderr=subprocess.DEVNULL)
    assert server.url.startswith("http://127.0.0.1:")
    assert server.path == str(path)
    assert httpx.get(f"{server.url}/health").status_code == 200
    with Limiter(server.url) as limiter:
        key = f"k-{uuid.uuid4().hex}"
        limiter.try_acquire(key, [Limit.window(f"b-{key}", 1, 60_000)]).release()
    assert server.stop() == 0
    assert server.stop() == 0, "a second stop answers the same"
    assert path.exists(), "a file the caller named is kept"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/health")


def test_start_server_without_a_path_is_a_context_manager_that_cleans_up() -> None:
    with start_server(binary=server_binary(), stderr=subprocess.DEVNULL) as server:
        assert server.path is not None and Path(server.path).exists()
        assert httpx.get(f"{server.url}/health").status_code == 200
    assert server.process.returncode == 0
    assert not Path(server.path).parent.exists(), "the temporary folder is removed"


def test_start_server_says_when_the_server_cannot_start(tmp_path: Path) -> None:
    # A listen address that is not one: the server names it and exits 1 before listening.
    with pytest.raises(RuntimeError, match=r"exited \(1\) before its ready line"):
        start_server(tmp_path / "a.redb", "not-an-address", binary=server_binary(), stderr=subprocess.DEVNULL)
    with pytest.raises(RuntimeError, match="cannot run"):
        start_server(tmp_path / "b.redb", binary=tmp_path / "missing")
