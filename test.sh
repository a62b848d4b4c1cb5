#!/usr/bin/env bash
# The whole test suite, the README's test command: every crate of the workspace
# (`cargo test --release`), then the JavaScript client (clients/js: `npm ci && npm test`) and the
# Python client (clients/python/run-tests.sh), both against the binary the first step built.
#
# PostgreSQL mode's tests need a real PostgreSQL: give one in REDB_LIMITER_TEST_POSTGRES, or,
# when `initdb` is installed (Debian's `postgresql`), this script starts a throwaway cluster on a
# free port for the run and stops it by its PID at the end. Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")"

if [ -z "${REDB_LIMITER_TEST_POSTGRES:-}" ] \
  && { command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }; then
  pg_env=$(.ci/start-postgres.sh)
  pg_pid=$(sed -n 's/^PG_PID=//p' <<<"$pg_env")
  pg_data=$(sed -n 's/^PG_DATA=//p' <<<"$pg_env")
  trap 'kill "$pg_pid" 2>/dev/null || true; for _ in $(seq 50); do kill -0 "$pg_pid" 2>/dev/null || break; sleep 0.1; done; rm -rf "$pg_data" "$pg_data.initdb.log"' EXIT
  REDB_LIMITER_TEST_POSTGRES=$(sed -n 's/^PG_URL=//p' <<<"$pg_env")
  export REDB_LIMITER_TEST_POSTGRES
fi

cargo test --release "$@"

# The clients' suites start the binary built above.
export REDB_LIMITER_BIN="$PWD/target/release/redb-limiter"
(cd clients/js && npm ci --no-audit --no-fund && npm test)
clients/python/run-tests.sh
