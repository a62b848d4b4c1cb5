#!/usr/bin/env bash
# Our server against the peer baselines, side by side, in one invocation.
#
# usage: bench/compare.sh            (from anywhere; as root it installs what is missing)
# env:   SECS=8  CLIENTS="1 16 64"  VARIANTS="granted refused"  REPS=3  FSYNC_SECS=3  SINK_SECS=3
#        PEERS=<repo>/../shared/bench/peers  DATA_DIR=/tmp/compare-ours  OUT=<repo>/bench/results
#
# For each repetition, in this order:
#   1. the raw fdatasync floor: the peers' run_fsync.sh (4 KiB append / overwrite + fdatasync);
#   2. the load generator's own ceiling: `redb-limiter bench --sink` (a built-in no-op server)
#      at 1 and 64 connections;
#   3. for each variant and client count, the three systems one after the other (our server,
#      Redis with appendfsync always, PostgreSQL function style), the order reversed in every
#      other repetition. Redis and PostgreSQL run through the peers' own run_redis.sh and
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

# ---- packages ----------------------------------------------------------------------------
missing=()
for cmd in redis-server redis-cli redis-benchmark pgbench psql fio gcc bc python3 findmnt; do
  command -v "$cmd" >/dev/null || missing+=("$cmd")
done
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(initdb)
if ((${#missing[@]})); then
  if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "# installing (missing: ${missing[*]})"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      redis-server redis-tools postgresql postgresql-contrib fio gcc bc python3 util-linux >/dev/null
  else
    echo "missing: ${missing[*]}; as root: apt-get install -y redis-server redis-tools postgresql postgresql-contrib fio gcc bc" >&2
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
stop_ours() {
  if [[ -n "$SPID" ]] && kill -0 "$SPID" 2>/dev/null; then
    kill -TERM "$SPID"; wait "$SPID" 2>/dev/null || true
  fi
  SPID=""
}
trap stop_ours EXIT INT TERM

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
  "$BIN" serve --path "$dir/limiter.redb" --listen 127.0.0.1:0 >"$dir/ready" 2>"$dir/serve.log" &
  SPID=$!
  for _ in $(seq 100); do grep -q '"url"' "$dir/ready" 2>/dev/null && break; sleep 0.05; done
  url=$(sed -n 's/.*"url":"\([^"]*\)".*/\1/p' "$dir/ready")
  [[ -n "$url" ]] || { echo "our server did not start; see $dir/serve.log" >&2; exit 1; }
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

run_redis() { # $1 rep $2 variant $3 clients
  local out line
  out=$(CLIENTS=$3 SECS=$SECS KEYS=$KEYS VARIANTS=$2 "$PEERS/run_redis.sh" always 2>&1) \
    || { echo "$out" >&2; exit 1; }
  echo "$out"
  line=$(grep "^redis $2 " <<<"$out" | tail -1)
  python3 - "$1" "$2" "$3" "$line" <<'PY' | record
import json, re, sys
rep, v, c, line = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
f = dict(re.findall(r"(\w+)=([^\s]+)", line))
print(json.dumps({"rep": rep, "system": "redis", "variant": v, "c": c, "rps": float(f["rps"]),
                  "p50_ms": float(f["p50_ms"]), "p99_ms": float(f["p99_ms"]),
                  "granted_fraction": float(f["granted"])}))
PY
}

run_pg() { # $1 rep $2 variant $3 clients
  local out line
  out=$(CLIENTS=$3 SECS=$SECS NBUCKETS=$KEYS VARIANTS=$2 "$PEERS/run_pg.sh" 2>&1) \
    || { echo "$out" >&2; exit 1; }
  echo "$out"
  line=$(grep "^pg $2 " <<<"$out" | tail -1)
  python3 - "$1" "$2" "$3" "$line" <<'PY' | record
import json, re, sys
rep, v, c, line = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
f = dict(re.findall(r"(\w+)=([^\s]+)", line))
print(json.dumps({"rep": rep, "system": "pg", "variant": v, "c": c, "rps": float(f["tps"]),
                  "p50_ms": float(f["p50_ms"]), "p99_ms": float(f["p99_ms"]),
                  "granted_fraction": float(f["granted"])}))
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
  trap stop_ours EXIT INT TERM   # this block runs in a subshell (it feeds tee)
  echo "# compare $STAMP: $(nproc) cpus,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), kernel $(uname -r)"
  echo "# filesystem of every data dir: $peer_fs ($(findmnt -no OPTIONS -T /tmp | cut -c1-60))"
  echo "# $("$BIN" --version), $(redis-server --version | awk '{print $3}'), $(psql --version)"
  echo "# SECS=$SECS CLIENTS=\"$CLIENTS\" VARIANTS=\"$VARIANTS\" REPS=$REPS KEYS=$KEYS"
  started=$(date +%s)
  for rep in $(seq "$REPS"); do
    echo "## rep $rep"
    run_fsync "$rep"
    run_sink "$rep"
    for v in $VARIANTS; do
      for c in $CLIENTS; do
        if ((rep % 2)); then order="ours redis pg"; else order="pg redis ours"; fi
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

def vals(key, field="rps"):
    return [by[key][rep].get(field) if rep in by[key] else None for rep in range(1, reps + 1)]

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

cells = [(v, c) for v in ("granted", "refused") for c in sorted({k[2] for k in by if k[0] == "ours" and k[1] == v})]
fs = vals(("fsync", "overwrite", 1))
print(f"Run {stamp}: {reps} repetition(s). Throughputs are medians over the repetitions; a ratio is")
print("taken within each repetition (the systems ran back to back) and shown as median (min–max).\n")
print("| mix | c | ours acq/s | Redis acq/s | PostgreSQL tps | ours / Redis | ours / PostgreSQL | ours / raw fsync | ours p50 / p99 ms |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for v, c in cells:
    ours, redis, pg = vals(("ours", v, c)), vals(("redis", v, c)), vals(("pg", v, c))
    p50, p99 = med(vals(("ours", v, c), "p50_ms")), med(vals(("ours", v, c), "p99_ms"))
    raw = spread(ratio(ours, fs)) if v == "granted" else "n/a"
    print(f"| {v} | {c} | {num(med(ours))} | {num(med(redis))} | {num(med(pg))} | {spread(ratio(ours, redis))} | "
          f"{spread(ratio(ours, pg))} | {raw} | {num(p50, '{:.2f}')} / {num(p99, '{:.2f}')} |")
print()
fa = vals(("fsync", "append", 1))
print(f"- Raw fdatasync probe, c = 1 (ops/s per repetition): overwrite {' / '.join(num(x) for x in fs)}; "
      f"append {' / '.join(num(x) for x in fa)}.")
for c in (1, 64):
    key = ("sink", "granted", c)
    print(f"- Generator against its built-in no-op server, c = {c}: {num(med(vals(key)))} req/s, generator CPU "
          f"{num(med(vals(key, 'gen_cpu_us')), '{:.1f}')} µs per request, "
          f"{num(100 * (med(vals(key, 'gen_cpu_share')) or 0), '{:.0f}')}% of the machine.")
for v, c in cells:
    key = ("ours", v, c)
    if med(vals(key, "gen_cpu_us")) is not None:
        print(f"- Generator against our server, {v}, c = {c}: {num(med(vals(key, 'gen_cpu_us')), '{:.1f}')} µs CPU per "
              f"request, {num(100 * (med(vals(key, 'gen_cpu_share')) or 0), '{:.0f}')}% of the machine.")
print()
print("Per repetition (acquires/s):\n")
print("| mix | c | " + " | ".join(f"rep {r}: ours / Redis / PostgreSQL" for r in range(1, reps + 1)) + " |")
print("|---|---:|" + "---:|" * reps)
for v, c in cells:
    ours, redis, pg = vals(("ours", v, c)), vals(("redis", v, c)), vals(("pg", v, c))
    print(f"| {v} | {c} | " + " | ".join(f"{num(o)} / {num(r)} / {num(p)}" for o, r, p in zip(ours, redis, pg)) + " |")
print()
targets = [("granted", 64, "redis", 2.0), ("granted", 64, "pg", 5.0), ("granted", 1, "redis", 0.9), ("refused", 64, "redis", 1.0)]
print("| target | ratio, median (min–max) | met in |")
print("|---|---:|---|")
for v, c, peer, want in targets:
    r = ratio(vals(("ours", v, c)), vals((peer, v, c)))
    got = [x for x in r if x is not None]
    name = {"redis": "Redis", "pg": "PostgreSQL"}[peer]
    print(f"| {v}, c = {c}: ours / {name} ≥ {want} | {spread(r)} | {sum(x >= want for x in got)} of {len(got)} repetitions |")
PY
echo "wrote $TABLE, $JSONL and $LOG"
