"""Run by the interpreter of a virtual environment where the wheel is installed (run.sh): the
binary is in the environment's scripts, find_server() finds it, start_server() serves with it."""

import os
import sys
import sysconfig
import tempfile

import redb_limiter

found = redb_limiter.find_server()
expected = os.path.join(sysconfig.get_path("scripts"), "redb-limiter")
assert found == expected, (found, expected)
assert os.path.dirname(sys.executable) == sysconfig.get_path("scripts")

with tempfile.TemporaryDirectory() as folder:
    server = redb_limiter.start_server(os.path.join(folder, "api-check.redb"), "127.0.0.1:0")
    with redb_limiter.Limiter(server.url) as limiter:
        limiter.try_acquire("api-check", [redb_limiter.Limit.window("api-check/rpm", 1, 60_000)]).release()
    code = server.stop()
    assert code == 0, code
print(f"ok: find_server() -> {found}; start_server() served {server.url} and stopped with 0")
