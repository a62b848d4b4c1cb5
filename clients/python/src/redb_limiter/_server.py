"""The server binary from the wheel: where it is (:func:`find_server`) and a local server for a
test or a laptop (:func:`start_server`: starts it, reads its ready line, stops it with SIGTERM).

The wheel for a platform carries the ``redb-limiter`` binary in its scripts, which pip installs
beside ``python`` (the virtual environment's ``bin``); a client-only install (``pip install
./clients/python``) carries none, and these find one installed elsewhere or named by
``REDB_LIMITER_BIN``. Nothing here is used by the client itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Mapping, Sequence
from fnmatch import fnmatch
from pathlib import Path
from types import TracebackType
from typing import IO, Any

SERVER_BIN_ENV = "REDB_LIMITER_BIN"
"""The environment variable that names a server binary to use instead of the installed one."""


class ServerNotFound(FileNotFoundError):
    """No server binary: the message lists every place searched."""


def _user_scheme() -> str:
    if sys.version_info >= (3, 10):
        return sysconfig.get_preferred_scheme("user")
    if os.name == "nt":
        return "nt_user"
    if sys.platform == "darwin" and getattr(sys, "_framework", None):
        return "osx_framework_user"
    return "posix_user"


def _above(path: Path, pattern: str) -> Path | None:
    """``path`` without its last parts when they match ``pattern`` (``/``-separated, ``*``
    wildcards, case-insensitive): the folder a package was installed into."""
    wanted = pattern.split("/")
    parts = path.parts
    if len(parts) <= len(wanted):
        return None
    tail = parts[len(parts) - len(wanted) :]
    if not all(fnmatch(part.lower(), want.lower()) for part, want in zip(tail, wanted)):
        return None
    return Path(*parts[: len(parts) - len(wanted)])


def _search_folders() -> list[Path]:
    """Where pip puts the wheel's scripts, in the order ruff and uv search for their binary."""
    package = Path(__file__).resolve().parent
    candidates: list[str | Path | None] = [
        # This interpreter's scripts: the virtual environment's bin (Scripts on Windows).
        sysconfig.get_path("scripts"),
        # The base interpreter's scripts (an install outside the virtual environment).
        sysconfig.get_path("scripts", vars={"base": sys.base_prefix}),
        # The user scheme: `pip install --user` (~/.local/bin).
        sysconfig.get_path("scripts", scheme=_user_scheme()),
    ]
    # `pip install --prefix P`: the package in P/lib/pythonX.Y/site-packages, the binary in P/bin.
    prefix = _above(package, "lib/python*/site-packages/redb_limiter")
    candidates.append(prefix / "bin" if prefix else None)
    # `pip install --target T`: the package in T, the binary in T/bin.
    target = _above(package, "redb_limiter")
    candidates.append(target / "bin" if target else None)
    folders: list[Path] = []
    for candidate in candidates:
        if candidate and Path(candidate) not in folders:
            folders.append(Path(candidate))
    return folders


def find_server() -> str:
    """The path of the ``redb-limiter`` server binary.

    ``$REDB_LIMITER_BIN`` when set; else the one the wheel installed: this interpreter's scripts
    folder, the base interpreter's, the user scheme's, a ``--prefix`` or ``--target`` install's
    ``bin``; else ``redb-limiter`` on ``PATH``. Raises :class:`ServerNotFound` listing every
    place searched.
    """
    named = os.environ.get(SERVER_BIN_ENV)
    if named:
        if not os.path.isfile(named):
            raise ServerNotFound(f"{SERVER_BIN_ENV} names {named}, which is not a file")
        return named
    exe = "redb-limiter" + (sysconfig.get_config_var("EXE") or "")
    folders = _search_folders()
    for folder in folders:
        candidate = folder / exe
        if candidate.is_file():
            return str(candidate)
    on_path = shutil.which("redb-limiter")
    if on_path:
        return on_path
    searched = "\n".join(f" - {folder}" for folder in [*folders, "PATH"])
    raise ServerNotFound(
        f"no redb-limiter server binary found; searched:\n{searched}\n"
        "The wheels for Linux carry it (pip install redb-limiter); elsewhere build it from the "
        f"repository (cargo build --release) and set {SERVER_BIN_ENV} to target/release/redb-limiter."
    )


class LocalServer:
    """A running server started by :func:`start_server`; a context manager that stops it."""

    def __init__(
        self,
        url: str,
        path: str | None,
        process: subprocess.Popen[str],
        scratch: Path | None,
        drain: threading.Thread,
    ) -> None:
        self.url = url
        """Its base URL, from its ready line (``http://127.0.0.1:PORT``)."""
        self.path = path
        """Its redb file (``None`` in PostgreSQL mode)."""
        self.process = process
        self._scratch = scratch
        self._drain = drain

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 15.0) -> int:
        """Sends SIGTERM (the server drains, commits and closes its file), waits for the exit
        (SIGKILL after ``timeout`` seconds), removes the temporary folder if it made one, and
        returns the exit code (0 after a clean drain). Calling it again returns the same code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._drain.join(timeout=5)
        if self.process.stdout is not None and not self._drain.is_alive():
            self.process.stdout.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
        return self.process.returncode

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalServer(url={self.url!r}, path={self.path!r}, pid={self.pid})"


def start_server(
    path: str | os.PathLike[str] | None = None,
    listen: str = "127.0.0.1:0",
    *,
    binary: str | os.PathLike[str] | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stderr: int | IO[Any] | None = None,
    ready_timeout: float = 30.0,
) -> LocalServer:
    """Starts ``redb-limiter serve`` and returns once it prints its ready line (the file is open
    and the socket listens).

    ``path``: the redb file; by default one in a new temporary folder that :meth:`LocalServer.stop`
    removes. ``listen``: the address; port 0 (the default) takes a free port, named in ``url``.
    ``binary``: by default :func:`find_server`. ``args``: more flags of ``serve``. ``env``: the
    server's whole environment (by default this process's). ``stderr``: where its log goes (as
    :class:`subprocess.Popen` takes it; by default this process's stderr). Raises
    :class:`RuntimeError` when the server exits before its ready line or prints none within
    ``ready_timeout`` seconds.
    """
    program = os.fspath(binary) if binary is not None else find_server()
    scratch: Path | None = None
    if path is None:
        scratch = Path(tempfile.mkdtemp(prefix="redb-limiter-"))
        file = str(scratch / "limiter.redb")
    else:
        file = os.fspath(path)
    try:
        process = subprocess.Popen(
            [program, "serve", "--path", file, "--listen", listen, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=dict(env) if env is not None else None,
        )
    except OSError as error:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(f"cannot run {program}: {error}") from error
    stdout = process.stdout
    assert stdout is not None
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=ready_timeout)
    line = first[0].strip() if first else ""
    problem = None
    ready: dict[str, Any] = {}
    if first and not line:
        # Its stdout closed: it is exiting.
        try:
            problem = f"redb-limiter exited ({process.wait(timeout=10)}) before its ready line"
        except subprocess.TimeoutExpired:
            problem = "redb-limiter closed its stdout before its ready line"
    elif not first:
        problem = f"redb-limiter printed no ready line within {ready_timeout} s"
    else:
        try:
            ready = json.loads(line)
        except ValueError:
            ready = {}
        if ready.get("ready") is not True or not isinstance(ready.get("url"), str):
            problem = f"redb-limiter printed an unexpected ready line {line!r}"
    if problem is not None:
        if process.poll() is None:
            process.kill()
        process.wait()
        reader.join(timeout=5)
        stdout.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(problem)
    # Anything printed after the ready line is read and dropped, so the pipe never fills.
    drain = threading.Thread(target=lambda: [None for _ in stdout], daemon=True)
    drain.start()
    found = ready.get("path")
    return LocalServer(ready["url"], found if isinstance(found, str) else None, process, scratch, drain)
