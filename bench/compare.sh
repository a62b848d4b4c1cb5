#!/usr/bin/env bash
# Our server against the peer baselines, side by side, in one invocation.
#
# usage: bench/compare.sh            (from anywhere; as root it installs what is missing)
# env:   SECS=8  CLIENTS="1 16 64"  VARIANTS="granted refused"  REPS=3  FSYNC_SECS=3  SINK_SECS=3
#        SYSTEMS="ours redis pg ourspg ourspg2 sqlite"  (any subset, in this order)
#        PG_POOL=<n> (ourspg/ourspg2: --pg-pool of each server; unset: the server's default)
#        PEERS=<repo>/../shared/bench/peers  DATA_DIR=/tmp/compare-ours  OUT=<repo>/bench/results
#
# Systems:
#   ours     our server on a redb file (`serve --path`)
#   redis    the peers' run_redis.sh always (Lua sliding window, appendfsync always)
#   pg       the peers' run_pg.sh (pgbench, one autocommit call of a plpgsql acquire())
#   ourspg   our server in PostgreSQL mode (`serve --postgres`), one server
#   ourspg2  two servers in PostgreSQL mode on one database and schema; two `redb-limiter
#            bench` processes run at once, c/2 connections each, and their acquires/s are
#            summed (c = 1 cannot be split: one server takes the one connection, the other
#            none, so that cell is the one-server cell with a second server idle beside it)
#   sqlite   the peers' run_sqlite.sh (in-process SQLite, WAL, synchronous=FULL, c threads),
#            granted only: a reference without HTTP
# ourspg and ourspg2 use a PostgreSQL cluster this script starts once with
# .ci/start-postgres.sh in $DATA_DIR/pg (the same filesystem as the peers' data, default
# settings, max_connections=200), a fresh schema per cell (dropped after it) and a CHECKPOINT
# before each cell, as run_pg.sh does before each of its runs.
#
# For each repetition, in this order:
#   1. the raw fdatasync floor: the peers' run_fsync.sh (4 KiB append / overwrite + fdatasync);
#   2. the load generator's own ceiling: `redb-limiter bench --sink` (a built-in no-op server)
#      at 1 and 64 connections;
#   3. for each variant and client count, the systems one after the other (in the order of
#      SYSTEMS), the order reversed in every other repetition. Redis and PostgreSQL run through the peers' own run_redis.sh and
#      run_pg.sh (CLIENTS/SECS/VARIANTS set to the one cell); our side starts a fresh server on
#      a fresh file and runs `redb-limiter bench` with the same shape: 1000 keys, cost 1,
#      granted = calls 1000000 per 1000 ms from empty windows, refused = calls 10 per 60000 ms
#      with every window filled first.
# Every figure goes to $OUT/compare-<UTC>.jsonl (one JSON object per measurement) and the raw
# output to $OUT/compare-<UTC>.log; the ratio table is printed and written to
# $OUT/compare-<UTC>.md. BENCHMARKS.md explains every column.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS:-$ROOT/../shared/bench/peers}
SECS=${SECS:-8}
CLIENTS=${CLIENTS:-"1 16 64"}
VARIANTS=${VARIANTS:-"granted refused"}
REPS=${REPS:-3}
SYSTEMS=${SYSTEMS:-"ours redis pg ourspg ourspg2 sqlite"}
FSYNC_SECS=${FSYNC_SECS:-3}
SINK_SECS=${SINK_SECS:-3}
KEYS=1000
DATA_DIR=${DATA_DIR:-/tmp/compare-ours}
OUT=${OUT:-$ROOT/bench/results}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
LOG="$OUT/compare-$STAMP.log"
JSONL="$OUT/compare-$STAMP.jsonl"
TABLE="$OUT/compare-$STAMP.md"
: >"$JSONL"

PEERS=$(cd "$PEERS" && pwd) || { echo "no peers folder at $PEERS" >&2; exit 1; }
for system in $SYSTEMS; do
  case "$system" in
    ours | redis | pg | ourspg | ourspg2 | sqlite) ;;
    *) echo "unknown system $system (SYSTEMS: ours redis pg ourspg ourspg2 sqlite)" >&2; exit 2 ;;
  esac
done
has() { [[ " $SYSTEMS " == *" $1 "* ]]; }

# ---- packages ----------------------------------------------------------------------------
missing=()
for cmd in redis-server redis-cli redis-benchmark pgbench psql fio gcc bc python3 findmnt; do
  command -v "$cmd" >/dev/null || missing+=("$cmd")
done
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(initdb)
[[ -f /usr/include/sqlite3.h ]] || missing+=(libsqlite3-dev)
if ((${#missing[@]})); then
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "# installing (missing: ${missing[*]})"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      redis-server redis-tools postgresql postgresql-contrib fio gcc bc python3 util-linux libsqlite3-dev >/dev/null
  else
    echo "missing: ${missing[*]}; as root: apt-get install -y redis-server redis-tools postgresql postgresql-contrib fio gcc bc libsqlite3-dev" >&2
    exit 1
  fi
fi
if [[ $EUID -ne 0 ]]; then
  echo "the peers' scripts run postgres as the postgres user: run this as root" >&2
  exit 1
fi

# ---- one disk for everyone -----------------------------------------------------------------
# The peers keep their data under /tmp (/tmp/peers-redis, /tmp/peers-pg, /tmp/peers-fsync).
mkdir -p "$DATA_DIR"
peer_fs=$(findmnt -no SOURCE,FSTYPE -T /tmp)
ours_fs=$(findmnt -no SOURCE,FSTYPE -T "$DATA_DIR")
if [[ "$peer_fs" != "$ours_fs" ]]; then
  echo "our data ($DATA_DIR: $ours_fs) and the peers' (/tmp: $peer_fs) are on different filesystems" >&2
  exit 1
fi
if [[ "$peer_fs" == *tmpfs* ]]; then
  echo "/tmp is $peer_fs: fsync would cost nothing there; mount a disk on /tmp first" >&2
  exit 1
fi

# ---- our binary ----------------------------------------------------------------------------
(cd "$ROOT" && cargo build --release --quiet)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/redb-limiter
[[ -x "$BIN" ]] || { echo "no binary at $BIN" >&2; exit 1; }

SPID=""
SPID2=""
PG_PID=""
stop_ours() {
  local pid
  for pid in $SPID $SPID2; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    fi
  done
  SPID=""
  SPID2=""
}
stop_all() {
  stop_ours
  if [[ -n "$PG_PID" ]] && kill -0 "$PG_PID" 2>/dev/null; then
    kill -INT "$PG_PID"    # fast shutdown; the postmaster is not our child, so poll
    for _ in $(seq 200); do kill -0 "$PG_PID" 2>/dev/null || break; sleep 0.05; done
  fi
  PG_PID=""
}
trap stop_all EXIT INT TERM

# ---- PostgreSQL for our PostgreSQL mode -----------------------------------------------------
PG_URL=""
if has ourspg || has ourspg2; then
  rm -rf "$DATA_DIR/pg"; mkdir -p "$DATA_DIR/pg"
  eval "$("$ROOT/.ci/start-postgres.sh" "$DATA_DIR/pg/data")"
  PSQL_OURS=(psql -X -q -A -t -v ON_ERROR_STOP=1 "$PG_URL")
fi
SCHEMA_N=0

record() { # JSON object on stdin -> the JSONL file
  cat >>"$JSONL"
}

run_ours() { # $1 rep $2 variant $3 clients
  local rep=$1 v=$2 c=$3 dir="$DATA_DIR/run" calls per_ms conn url json
  case "$v" in
    granted) calls=1000000; per_ms=1000 ;;
    refused) calls=10; per_ms=60000 ;;
  esac
  conn=(--connections "$c")
  ((c == 1)) && conn=(--one-at-a-time)
  rm -rf "$dir"; mkdir -p "$dir"
  start_server "$dir" --path "$dir/limiter.redb"
  SPID=$STARTED_PID
  url=$STARTED_URL
  "$BIN" bench --url "$url" "${conn[@]}" --keys "$KEYS" --cost 1 --mix "$v" --calls "$calls" \
    --per-ms "$per_ms" --seconds "$SECS" --warmup-seconds 1 >"$dir/bench.txt"
  stop_ours
  cat "$dir/bench.txt"
  json=$(tail -1 "$dir/bench.txt")
  python3 - "$rep" "$v" "$c" "$json" <<'PY' | record
import json, sys
rep, v, c, j = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
print(json.dumps({"rep": rep, "system": "ours", "variant": v, "c": c, "rps": j["rps"],
                  "p50_ms": j["p50_us"] / 1000, "p99_ms": j["p99_us"] / 1000,
                  "granted": j["granted"], "refused": j["refused"], "errors": j["errors"],
                  "gen_cpu_us": j.get("cpu_us_per_request"), "gen_cpu_share": j.get("cpu_share")}))
PY
}

start_server() { # $1 dir, then serve's flags; sets STARTED_PID and STARTED_URL
  local dir=$1; shift
  "$BIN" serve --listen 127.0.0.1:0 "$@" >"$dir/ready" 2>"$dir/serve.log" &
  STARTED_PID=$!
  for _ in $(seq 200); do grep -q '"url"' "$dir/ready" 2>/dev/null && break; sleep 0.05; done
  STARTED_URL=$(sed -n 's/.*"url":"\([^"]*\)".*/\1/p' "$dir/ready")
  [[ -n "$STARTED_URL" ]] || { echo "our server did not start; see $dir/serve.log" >&2; exit 1; }
}

# A fresh schema for one cell, with the cluster checkpointed first (as run_pg.sh does).
fresh_schema() {
  SCHEMA_N=$((SCHEMA_N + 1))
  SCHEMA="bench_$SCHEMA_N"
  "${PSQL_OURS[@]}" -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE" -c "CHECKPOINT"
}

drop_schema() {
  "${PSQL_OURS[@]}" -c "SET client_min_messages = warning" -c "DROP SCHEMA IF EXISTS $SCHEMA CASCADE"
}

# Our server(s) in PostgreSQL mode: one, or two on the same schema with c split between them.
run_ourspg_n() { # $1 servers (1 or 2) $2 rep $3 variant $4 clients
  local n=$1 rep=$2 v=$3 c=$4 calls per_ms dir="$DATA_DIR/runpg" urls=() conns=() pids=() i args json system
  case "$v" in
    granted) calls=1000000; per_ms=1000 ;;
    refused) calls=10; per_ms=60000 ;;
  esac
  system=ourspg; ((n == 2)) && system=ourspg2
  rm -rf "$dir"; mkdir -p "$dir"
  fresh_schema
  for i in $(seq "$n"); do
    mkdir -p "$dir/$i"
    start_server "$dir/$i" --postgres "$PG_URL" --pg-schema "$SCHEMA" ${PG_POOL:+--pg-pool "$PG_POOL"}
    if ((i == 1)); then SPID=$STARTED_PID; else SPID2=$STARTED_PID; fi
    urls+=("$STARTED_URL")
  done
  if ((n == 2 && c > 1)); then conns=($((c / 2)) $((c - c / 2))); else conns=("$c"); fi
  if [[ "$v" == refused ]]; then
    # Fill every window first, over 64 connections (one at a time, 11,000 durable grants take
    # a minute): the measured generators' own prefills then cost one refused request per key,
    # and with two of them neither measures while the other still fills.
    "$BIN" bench --url "${urls[0]}" --connections 64 --keys "$KEYS" --cost 1 --mix refused \
      --calls "$calls" --per-ms "$per_ms" --seconds 0.2 >"$dir/prefill.txt"
  fi
  pids=()
  for i in "${!conns[@]}"; do
    args=(--connections "${conns[$i]}")
    ((conns[i] == 1)) && args=(--one-at-a-time)
    "$BIN" bench --url "${urls[$i]}" "${args[@]}" --keys "$KEYS" --cost 1 --mix "$v" --calls "$calls" \
      --per-ms "$per_ms" --seconds "$SECS" --warmup-seconds 1 --seed $((i + 1)) >"$dir/bench$i.txt" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  stop_ours
  drop_schema
  for i in "${!conns[@]}"; do cat "$dir/bench$i.txt"; done
  json=$(for i in "${!conns[@]}"; do tail -1 "$dir/bench$i.txt"; done)
  python3 - "$rep" "$system" "$v" "$c" "$json" <<'PY' | record
import json, sys
rep, system, v, c = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
js = [json.loads(l) for l in sys.argv[5].splitlines() if l.strip()]
rps = sum(j["rps"] for j in js)
# latency: the generators' medians weighted by their answered acquires; the worse p99
w = [j["rps"] or 1e-9 for j in js]
p50 = sum(j["p50_us"] * x for j, x in zip(js, w)) / sum(w)
cpu = [j.get("cpu_share") for j in js]
print(json.dumps({"rep": rep, "system": system, "variant": v, "c": c, "rps": rps, "generators": len(js),
                  "p50_ms": p50 / 1000, "p99_ms": max(j["p99_us"] for j in js) / 1000,
                  "granted": sum(j["granted"] for j in js), "refused": sum(j["refused"] for j in js),
                  "errors": sum(j["errors"] for j in js),
                  "gen_cpu_share": None if None in cpu else sum(cpu)}))
PY
}

run_ourspg() { run_ourspg_n 1 "$@"; }
run_ourspg2() { run_ourspg_n 2 "$@"; }

# Records a peer's summary line ("<prefix> <variant> ... key=value ...") as one JSON object.
record_peer() { # $1 system $2 throughput field $3 rep $4 variant $5 clients $6 line
  python3 - "$@" <<'PY' | record
import json, re, sys
system, field, rep, v, c, line = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6]
f = dict(re.findall(r"(\w+)=([^\s]+)", line))
print(json.dumps({"rep": rep, "system": system, "variant": v, "c": c, "rps": float(f[field]),
                  "p50_ms": float(f["p50_ms"]), "p99_ms": float(f["p99_ms"]),
                  "granted_fraction": float(f["granted"])}))
PY
}

run_redis() { # $1 rep $2 variant $3 clients
  local out
  out=$(CLIENTS=$3 SECS=$SECS KEYS=$KEYS VARIANTS=$2 "$PEERS/run_redis.sh" always 2>&1) \
    || { echo "$out" >&2; exit 1; }
  echo "$out"
  record_peer redis rps "$1" "$2" "$3" "$(grep "^redis $2 " <<<"$out" | tail -1)"
}

run_pg() { # $1 rep $2 variant $3 clients
  local out
  out=$(CLIENTS=$3 SECS=$SECS NBUCKETS=$KEYS VARIANTS=$2 "$PEERS/run_pg.sh" 2>&1) \
    || { echo "$out" >&2; exit 1; }
  echo "$out"
  record_peer pg tps "$1" "$2" "$3" "$(grep "^pg $2 " <<<"$out" | tail -1)"
}

run_sqlite() { # $1 rep $2 variant $3 clients (granted only: the peer has no refused shape)
  local out line
  [[ "$2" == granted ]] || { echo "(sqlite: granted only)"; return; }
  out=$(CLIENTS=$3 SECS=$SECS NBUCKETS=$KEYS "$PEERS/run_sqlite.sh" 2>&1) || { echo "$out" >&2; exit 1; }
  echo "$out"
  line=$(grep "^sqlite threads=" <<<"$out" | tail -1)
  python3 - "$1" "$2" "$3" "$line" <<'PY' | record
import json, re, sys
rep, v, c, line = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
f = dict(re.findall(r"(\w+)=([^\s]+)", line))
print(json.dumps({"rep": rep, "system": "sqlite", "variant": v, "c": c, "rps": float(f["rps"]),
                  "p50_ms": int(f["p50_us"]) / 1000, "p99_ms": int(f["p99_us"]) / 1000,
                  "granted": int(f["granted"])}))
PY
}

run_fsync() { # $1 rep
  local out
  out=$("$PEERS/run_fsync.sh" "$FSYNC_SECS" 2>&1) || { echo "$out" >&2; exit 1; }
  echo "$out"
  python3 - "$1" "$out" <<'PY' | record
import json, re, sys
rep, out = int(sys.argv[1]), sys.argv[2]
for mode in ("append", "overwrite"):
    m = re.search(r"mode=%s\s.*?ops/s=(\d+) p50_us=(\d+) p99_us=(\d+)" % mode, out)
    if m:
        print(json.dumps({"rep": rep, "system": "fsync", "variant": mode, "c": 1, "rps": float(m.group(1)),
                          "p50_ms": int(m.group(2)) / 1000, "p99_ms": int(m.group(3)) / 1000}))
PY
}

run_sink() { # $1 rep
  local c conn json
  for c in 1 64; do
    conn=(--connections "$c")
    ((c == 1)) && conn=(--one-at-a-time)
    json=$("$BIN" bench --sink "${conn[@]}" --keys "$KEYS" --seconds "$SINK_SECS" --warmup-seconds 0.5 | tail -1)
    python3 - "$1" "$c" "$json" <<'PY' | record
import json, sys
rep, c, j = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps({"rep": rep, "system": "sink", "variant": "granted", "c": c, "rps": j["rps"],
                  "p50_ms": j["p50_us"] / 1000, "p99_ms": j["p99_us"] / 1000,
                  "gen_cpu_us": j.get("cpu_us_per_request"), "gen_cpu_share": j.get("cpu_share")}))
PY
    echo "sink c=$c rps=$(python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print("%.0f generator_cpu_us=%.1f share=%.2f" % (j["rps"], j["cpu_us_per_request"] or 0, j["cpu_share"] or 0))' "$json")"
  done
}

{
  trap stop_ours EXIT INT TERM   # this block runs in a subshell (it feeds tee); the parent stops PostgreSQL
  echo "# compare $STAMP: $(nproc) cpus,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), kernel $(uname -r)"
  echo "# filesystem of every data dir: $peer_fs ($(findmnt -no OPTIONS -T /tmp | cut -c1-60))"
  echo "# $("$BIN" --version), $(redis-server --version | awk '{print $3}'), $(psql --version)"
  echo "# SECS=$SECS CLIENTS=\"$CLIENTS\" VARIANTS=\"$VARIANTS\" REPS=$REPS KEYS=$KEYS SYSTEMS=\"$SYSTEMS\""
  [[ -z "$PG_URL" ]] || echo "# PostgreSQL mode against $(psql -X -A -t "$PG_URL" -c 'SHOW server_version') in $DATA_DIR/pg/data, --pg-pool ${PG_POOL:-default}"
  started=$(date +%s)
  for rep in $(seq "$REPS"); do
    echo "## rep $rep"
    run_fsync "$rep"
    run_sink "$rep"
    for v in $VARIANTS; do
      for c in $CLIENTS; do
        if ((rep % 2)); then order=$SYSTEMS; else order=$(tr ' ' '\n' <<<"$SYSTEMS" | tac | tr '\n' ' '); fi
        for system in $order; do
          echo "### $system $v c=$c"
          "run_$system" "$rep" "$v" "$c"
        done
      done
    done
  done
  echo "# took $(( $(date +%s) - started )) s"
} 2>&1 | tee "$LOG"

python3 - "$JSONL" "$STAMP" "$REPS" <<'PY' | tee "$TABLE"
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
stamp, reps = sys.argv[2], int(sys.argv[3])
by = defaultdict(dict)  # (system, variant, c) -> rep -> row
for r in rows:
    by[(r["system"], r["variant"], r["c"])][r["rep"]] = r
SYSTEMS = ["ours", "redis", "pg", "ourspg", "ourspg2", "sqlite"]
present = [s for s in SYSTEMS if any(k[0] == s for k in by)]
NAME = {"ours": "ours", "redis": "Redis", "pg": "PostgreSQL", "ourspg": "ours-pg", "ourspg2": "ours-pg2",
        "sqlite": "SQLite"}
UNIT = {"pg": "tps"}

def vals(key, field="rps"):
    runs = by.get(key, {})  # (never by[key]: that would add the key to by)
    return [runs[rep].get(field) if rep in runs else None for rep in range(1, reps + 1)]

def ratio(a, b):
    return [None if x is None or y in (None, 0) else x / y for x, y in zip(a, b)]

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None

def num(x, f="{:,.0f}"):
    return "–" if x is None else f.format(x)

def spread(xs, f="{:.2f}"):
    """median (min–max) of the per-repetition values"""
    got = [x for x in xs if x is not None]
    if not got:
        return "–"
    if len(got) == 1:
        return f.format(got[0])
    return f"{f.format(statistics.median(got))} ({f.format(min(got))}–{f.format(max(got))})"

cs = sorted({k[2] for k in by if k[0] in SYSTEMS})
cells = [(v, c) for v in ("granted", "refused") for c in cs if any((s, v, c) in by for s in SYSTEMS)]
fs = vals(("fsync", "overwrite", 1))
# columns: (title, function of (v, c) -> text), kept when the systems they need ran
cols = []
for s in present:
    cols.append((f"{NAME[s]} {UNIT.get(s, 'acq/s')}", lambda v, c, s=s: num(med(vals((s, v, c))))))
pairs = [("ours", "redis"), ("ours", "pg"), ("ourspg", "pg"), ("ourspg2", "pg"), ("ours", "sqlite")]
for a, b in pairs:
    if a in present and b in present:
        cols.append((f"{NAME[a]} / {NAME[b]}", lambda v, c, a=a, b=b: spread(ratio(vals((a, v, c)), vals((b, v, c))))
                     if (b, v, c) in by else "n/a"))
# The c = 1 ceiling over HTTP: a server whose only work were the probe's write + fdatasync, reached
# through the generator's round trip to its no-op server (both in series at c = 1).
sink1 = vals(("sink", "granted", 1))
ceiling = [None if f is None or k is None else 1 / (1 / f + 1 / k) for f, k in zip(fs, sink1)]
if "ours" in present and fs[0] is not None:
    cols.append(("ours / raw fsync", lambda v, c: spread(ratio(vals(("ours", v, c)), fs)) if v == "granted" else "n/a"))
    if ceiling[0] is not None:
        cols.append(("ours / c=1 ceiling", lambda v, c: spread(ratio(vals(("ours", v, c)), ceiling))
                     if (v, c) == ("granted", 1) else "n/a"))
for s in ("ours", "ourspg", "ourspg2"):
    if s in present:
        cols.append((f"{NAME[s]} p50 / p99 ms", lambda v, c, s=s: f"{num(med(vals((s, v, c), 'p50_ms')), '{:.2f}')} / "
                                                                  f"{num(med(vals((s, v, c), 'p99_ms')), '{:.2f}')}"))

print(f"Run {stamp}: {reps} repetition(s), systems {', '.join(NAME[s] for s in present)}. Throughputs are")
print("medians over the repetitions; a ratio is taken within each repetition (the systems ran back to")
print("back) and shown as median (min–max).\n")
print("| mix | c | " + " | ".join(t for t, _ in cols) + " |")
print("|---|---:|" + "---:|" * len(cols))
for v, c in cells:
    print(f"| {v} | {c} | " + " | ".join(f(v, c) for _, f in cols) + " |")
print()
if fs[0] is not None:
    fa = vals(("fsync", "append", 1))
    print(f"- Raw fdatasync probe, c = 1 (ops/s per repetition): overwrite {' / '.join(num(x) for x in fs)}; "
          f"append {' / '.join(num(x) for x in fa)}.")
if ceiling[0] is not None:
    print(f"- Ceiling at c = 1 over HTTP (the probe's overwrite and the generator's no-op round trip in series): "
          f"{' / '.join(num(x) for x in ceiling)} req/s, that is {' / '.join(num(x, '{:.2f}') for x in ratio(ceiling, fs))} "
          f"× the probe.")
for c in (1, 64):
    key = ("sink", "granted", c)
    if key in by:
        print(f"- Generator against its built-in no-op server, c = {c}: {num(med(vals(key)))} req/s, generator CPU "
              f"{num(med(vals(key, 'gen_cpu_us')), '{:.1f}')} µs per request, "
              f"{num(100 * (med(vals(key, 'gen_cpu_share')) or 0), '{:.0f}')}% of the machine.")
for s in ("ours", "ourspg", "ourspg2"):
    for v, c in cells:
        key = (s, v, c)
        if med(vals(key, "gen_cpu_share")) is not None:
            per = med(vals(key, "gen_cpu_us"))
            per = f"{num(per, '{:.1f}')} µs CPU per request, " if per is not None else ""
            print(f"- Generator(s) against {NAME[s]}, {v}, c = {c}: {per}"
                  f"{num(100 * (med(vals(key, 'gen_cpu_share')) or 0), '{:.0f}')}% of the machine.")
print()
print("Per repetition (acquires/s):\n")
who = " / ".join(NAME[s] for s in present)
print("| mix | c | " + " | ".join(f"rep {r}: {who}" for r in range(1, reps + 1)) + " |")
print("|---|---:|" + "---:|" * reps)
for v, c in cells:
    per = [vals((s, v, c)) for s in present]
    print(f"| {v} | {c} | " + " | ".join(" / ".join(num(p[r]) for p in per) for r in range(reps)) + " |")
print()
targets = [("ours", "granted", 64, "redis", 1.6), ("ours", "granted", 64, "redis", 2.0), ("ours", "granted", 64, "pg", 5.0),
           ("ours", "granted", 1, "redis", 1.1), ("ours", "refused", 64, "redis", 1.0)]
for s in ("ourspg", "ourspg2"):  # PostgreSQL mode against the pgbench peer
    for v, want in (("granted", 0.8), ("refused", 2.0)):
        for c in cs:
            targets.append((s, v, c, "pg", want))
targets = [t for t in targets if (t[0], t[1], t[2]) in by and (t[3], t[1], t[2]) in by]
if targets:
    print("| target | ratio, median (min–max) | met in |")
    print("|---|---:|---|")
def target_row(title, r, want):
    got = [x for x in r if x is not None]
    print(f"| {title} ≥ {want} | {spread(r)} | {sum(x >= want for x in got)} of {len(got)} repetitions |")
for s, v, c, peer, want in targets:
    target_row(f"{v}, c = {c}: {NAME[s]} / {NAME[peer]}", ratio(vals((s, v, c)), vals((peer, v, c))), want)
if ("ours", "granted", 1) in by and fs[0] is not None:
    if not targets:
        print("| target | ratio, median (min–max) | met in |")
        print("|---|---:|---|")
    target_row("granted, c = 1: ours / raw fsync overwrite", ratio(vals(("ours", "granted", 1)), fs), 0.6)
PY
echo "wrote $TABLE, $JSONL and $LOG"
