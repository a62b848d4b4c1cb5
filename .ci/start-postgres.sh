#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster for the limiter's database tests.
#
# usage: .ci/start-postgres.sh [DATA_DIR]   (stop: kill the printed PG_PID, or pg_ctl -D DATA_DIR stop)
# env:   PG_PORT (default: a free port), PG_OS_USER (default: postgres, created if missing),
#        PG_BIN (default: the directory holding initdb on PATH, else /usr/lib/postgresql/*/bin)
# A DATA_DIR that already holds a cluster is started as it is (after crash recovery, if it was
# killed): with its old PG_PORT, the same URL again.
#
# Prints three lines on stdout:
#   PG_URL=postgres://postgres@127.0.0.1:PORT/postgres
#   PG_PID=<postmaster pid>
#   PG_DATA=<DATA_DIR>
# Durability settings are the defaults (fsync=on, synchronous_commit=on), as a real
# deployment has them. The cluster is initialised with trust auth on 127.0.0.1 only.
set -euo pipefail

DATA=${1:-$(mktemp -d /tmp/redb-limiter-pg.XXXXXX)}
OS_USER=${PG_OS_USER:-postgres}
if [[ -z "${PG_BIN:-}" ]]; then
  if command -v initdb >/dev/null 2>&1; then
    PG_BIN=$(dirname "$(readlink -f "$(command -v initdb)")")
  else
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  fi
fi
[[ -x "$PG_BIN/initdb" ]] || { echo "no initdb found (apt-get install -y postgresql)" >&2; exit 1; }

free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
EOF
}
PORT=${PG_PORT:-$(free_port)}

as_user() {
  if [[ $(id -u) -eq 0 ]]; then
    id "$OS_USER" >/dev/null 2>&1 || useradd -m "$OS_USER"
    runuser -u "$OS_USER" -- "$@"
  else
    "$@"
  fi
}

mkdir -p "$DATA"
if [[ $(id -u) -eq 0 ]]; then chown "$OS_USER" "$DATA"; fi
if [[ ! -f "$DATA/PG_VERSION" ]]; then
  as_user "$PG_BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$DATA.initdb.log" 2>&1 \
    || { cat "$DATA.initdb.log" >&2; exit 1; }
fi
as_user "$PG_BIN/pg_ctl" -D "$DATA" -w -t 30 -l "$DATA/log" \
  -o "-p $PORT -k $DATA -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null \
  || { tail -20 "$DATA/log" >&2; exit 1; }
PID=$(head -1 "$DATA/postmaster.pid")
echo "PG_URL=postgres://postgres@127.0.0.1:$PORT/postgres"
echo "PG_PID=$PID"
echo "PG_DATA=$DATA"
