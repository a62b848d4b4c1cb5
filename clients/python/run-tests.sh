#!/usr/bin/env bash
# The Python client's tests: a virtual environment in .venv (made when missing), the package
# installed with its test extra, mypy --strict over it, then pytest against the real server
# (REDB_LIMITER_BIN, else target/release/redb-limiter at the repository root, built when
# missing). tests/test_line.py runs when the server keeps the line (wire section 12); without
# it the script fails under CI and says so loudly elsewhere. Arguments go to the main pytest run.
set -euo pipefail
cd "$(dirname "$0")"

# PYTHON picks the interpreter (for example a 3.9 one); each gets a venv of its own.
python=${PYTHON:-python3}
venv=.venv
[ -z "${PYTHON:-}" ] || venv=".venv-$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install --quiet --disable-pip-version-check ".[test]"

echo "mypy --strict src/redb_limiter ($("$py" --version))"
"$py" -m mypy --strict src/redb_limiter

# pytest's exit 5 (no test collected) is a failure too: a run that tests nothing is not green.
run_pytest() {
  local status=0
  "$py" -m pytest "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    echo "pytest collected no test: failing" >&2
    return 1
  fi
  return "$status"
}

run_pytest tests --ignore=tests/test_line.py "$@"

if "$py" tests/line_probe.py; then
  run_pytest tests/test_line.py
elif [ -n "${CI:-}" ]; then
  echo "tests/test_line.py cannot run: this server files no tickets (wire section 12)" >&2
  exit 1
else
  echo "=================================================================================" >&2
  echo "tests/test_line.py NOT RUN: this server files no tickets (wire section 12)." >&2
  echo "It runs here by itself once the server keeps the line." >&2
  echo "=================================================================================" >&2
fi
