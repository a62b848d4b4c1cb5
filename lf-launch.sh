#!/bin/sh
# How listen-fire starts this module (lf-external.yaml's `command` and `check`): runs the first
# server binary found with the arguments given (`serve`, `check`), so that an install that has a
# binary skips the compile:
#   1. $REDB_LIMITER_BIN;
#   2. ./redb-limiter beside this script (a binary copied here, for example from a package);
#   3. one a package installed: node_modules/.bin/redb-limiter in this folder (npm install
#      redb-limiter), then `redb-limiter` on PATH (pip install redb-limiter, npm install -g);
#   4. else `cargo run --release --quiet --` (the first start builds it).
# A candidate from 3 must answer `--version`: an npm command whose platform package is missing
# does not, and is passed over.
set -eu
cd "$(dirname "$0")"

if [ -n "${REDB_LIMITER_BIN:-}" ]; then exec "$REDB_LIMITER_BIN" "$@"; fi
if [ -x ./redb-limiter ]; then exec ./redb-limiter "$@"; fi
for candidate in ./node_modules/.bin/redb-limiter "$(command -v redb-limiter || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" --version >/dev/null 2>&1; then
    exec "$candidate" "$@"
  fi
done
if command -v cargo >/dev/null 2>&1; then exec cargo run --release --quiet -- "$@"; fi
echo "redb-limiter: no server binary here and no Rust toolchain. Install one: npm install redb-limiter" \
  "(in this folder), pip install redb-limiter, or copy a redb-limiter binary beside lf-external.yaml;" \
  "or install Rust (https://rustup.rs) to build it." >&2
exit 127
