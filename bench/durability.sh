#!/usr/bin/env bash
# Durable grants next to the raw fdatasync floor of the same disk, taken in one run.
#
# usage: bench/durability.sh [runs=2] [probe seconds=5]
#
# Builds the fsync probe from ../shared/bench/peers/fsync_probe.c and the SQLite peer from
# ../shared/bench/peers/sqlite_window.c (relative to the project root; WAL, synchronous=FULL, one
# IMMEDIATE transaction per acquire on a grants table, in-process, 1,000 buckets, cost 1, as ours),
# then interleaves the probe (append, then overwrite), SQLite at 1, 16 and 64 threads, and the
# criterion bench `benches/durability.rs` (ours behind the journal and on the file alone, at 1,
# 16 and 64 requesters), `runs` times, with one more probe at the end (A B A B A): every bench
# run has a probe just before and just after it. This disk's flush latency can change several
# fold from one second to the next, so read each ratio with both of its probes. The probe's
# file and the redb files share one directory under the project (DURABILITY_BENCH_DIR, default
# target/durability-bench), which must not be in memory. Prints a table of figures and ratios.
# About 1 minute a run, plus the first compile.
set -euo pipefail

RUNS=${1:-2}
PROBE_SECS=${2:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PROBE_SRC=$ROOT/../shared/bench/peers/fsync_probe.c
SQLITE_SRC=$ROOT/../shared/bench/peers/sqlite_window.c
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
export DURABILITY_BENCH_DIR=${DURABILITY_BENCH_DIR:-$ROOT/target/durability-bench}

die() { echo "durability.sh: $*" >&2; exit 1; }
[ -f "$PROBE_SRC" ] || die "the fsync probe is missing: expected ../shared/bench/peers/fsync_probe.c next to the project ($PROBE_SRC)"
command -v gcc >/dev/null || die "gcc is needed to build the fsync probe"
[ -f "$SQLITE_SRC" ] || die "the SQLite peer is missing: expected ../shared/bench/peers/sqlite_window.c ($SQLITE_SRC)"
[ -f /usr/include/sqlite3.h ] || die "libsqlite3-dev is needed to build the SQLite peer (apt-get install -y libsqlite3-dev)"
command -v python3 >/dev/null || die "python3 is needed to read criterion's estimates"

mkdir -p "$DURABILITY_BENCH_DIR"
FSTYPE=$(stat -f -c %T "$DURABILITY_BENCH_DIR")
case $FSTYPE in
  tmpfs|ramfs) die "$DURABILITY_BENCH_DIR is on $FSTYPE: fsync there costs nothing; set DURABILITY_BENCH_DIR to a directory on disk" ;;
esac
echo "# files in ${DURABILITY_BENCH_DIR#"$ROOT"/} ($FSTYPE; $(findmnt -no SOURCE,FSTYPE,OPTIONS -T "$DURABILITY_BENCH_DIR" 2>/dev/null | cut -c1-70))"

PROBE=$DURABILITY_BENCH_DIR/fsync_probe
gcc -O2 -Wall -o "$PROBE" "$PROBE_SRC"
SQLITE=$DURABILITY_BENCH_DIR/sqlite_window
gcc -O2 -Wall -o "$SQLITE" "$SQLITE_SRC" -lsqlite3 -lpthread
# cargo's progress lines name the project's absolute folder: they stay out of the output.
CARGO_NOISE='^\s*(Compiling|Finished|Executable) '
built=$(cd "$ROOT" && cargo bench --bench durability --no-run 2>&1) || { echo "$built" >&2; die "the durability bench does not build"; }
grep -v -E "$CARGO_NOISE" <<<"$built" || true

# Criterion's time per iteration (ns) for one benchmark of the last run: the slope of its
# linear sampling where it has one (the figure criterion prints), else the mean.
per_iter_ns() {
  python3 -c 'import json, sys; e = json.load(open(sys.argv[1])); print((e.get("slope") or e["mean"])["point_estimate"])' \
    "$TARGET/criterion/$1/new/estimates.json"
}
per_s() { python3 -c "print(round(1e9 / $(per_iter_ns "$1")))"; }
secs() { if [ -f "$TARGET/criterion/$1/new/estimates.json" ]; then python3 -c "print('%.3f' % ($(per_iter_ns "$1") / 1e9))"; else echo -; fi; }
probe_ops() { sed -n 's/.* ops\/s=\([0-9]*\).*/\1/p'; }
probe_p50() { sed -n 's/.* p50_us=\([0-9]*\).*/\1/p'; }
ratio() { python3 -c "print('%.2f' % ($1 / $2))"; }

probe() { # run: both modes, into APPEND[run] and OVERWRITE[run]
  local out
  out=$("$PROBE" "$DURABILITY_BENCH_DIR/probe.dat" append "$PROBE_SECS"); echo "$out"
  APPEND[$1]=$(probe_ops <<<"$out"); APPEND_P50[$1]=$(probe_p50 <<<"$out")
  out=$("$PROBE" "$DURABILITY_BENCH_DIR/probe.dat" overwrite "$PROBE_SECS"); echo "$out"
  OVERWRITE[$1]=$(probe_ops <<<"$out"); OVERWRITE_P50[$1]=$(probe_p50 <<<"$out")
}

# A B A B ... A: every bench run has a probe just before it and one just after it.
sqlite() { # run threads: rps of SQLite at that many threads into SQ<threads>[run]
  local out
  out=$("$SQLITE" "$DURABILITY_BENCH_DIR/sqlite.db" "$2" "$PROBE_SECS" 1000000 1000 1000); echo "$out"
  rm -f "$DURABILITY_BENCH_DIR"/sqlite.db*
  printf -v "SQ$2[$1]" '%s' "$(sed -n 's/.* rps=\([0-9]*\).*/\1/p' <<<"$out")"
}

declare -a APPEND APPEND_P50 OVERWRITE OVERWRITE_P50 G1 G1C G16 G64 P1 P16 P64 SQ1 SQ16 SQ64 RL RC RS
for run in $(seq 1 "$RUNS"); do
  echo "## probe $run"
  probe "$run"
  echo "## SQLite run $run"
  for t in 1 16 64; do sqlite "$run" "$t"; done
  echo "## bench run $run: cargo bench --bench durability"
  rm -rf "$TARGET/criterion/durability" "$TARGET/criterion/reopen_1m"
  (cd "$ROOT" && cargo bench --bench durability 2>&1) | { grep -v -E "^\s*\$|$CARGO_NOISE|Benchmarking .*: (Warming|Collecting|Analyzing)" || true; }
  G1[run]=$(per_s durability/grant_1)
  G1C[run]=$(per_s durability/grant_1_caller)
  G16[run]=$(per_s durability/grant_16)
  G64[run]=$(per_s durability/grant_64)
  P1[run]=$(per_s durability/grant_1_plain)
  P16[run]=$(per_s durability/grant_16_plain)
  P64[run]=$(per_s durability/grant_64_plain)
  RL[run]=$(secs reopen_1m/limiter)
  RC[run]=$(secs reopen_1m/limiter_cold)
  RS[run]=$(secs reopen_1m/store)
done
echo "## probe $((RUNS + 1))"
probe $((RUNS + 1))
rm -f "$DURABILITY_BENCH_DIR/probe.dat"

echo
echo "## probe (4 KiB write + fdatasync; probe n runs just before bench run n)"
printf '%-6s %10s %12s %13s %15s\n' probe append/s overwrite/s append_p50_us overwrite_p50_us
for run in $(seq 1 $((RUNS + 1))); do
  printf '%-6s %10s %12s %13s %15s\n' "$run" "${APPEND[run]}" "${OVERWRITE[run]}" "${APPEND_P50[run]}" "${OVERWRITE_P50[run]}"
done
echo "## bench (grants/s: ours behind the journal, ours on the file alone, SQLite; reopen in s with 1,000,000 live window entries)"
printf '%-6s %22s %22s %22s %12s %12s %13s\n' run 'c=1 ours/plain/sqlite' 'c=16 ours/plain/sqlite' \
  'c=64 ours/plain/sqlite' reopen_warm reopen_cold reopen_store
for run in $(seq 1 "$RUNS"); do
  printf '%-6s %22s %22s %22s %12s %12s %13s\n' "$run" "${G1[run]}/${P1[run]}/${SQ1[run]}" \
    "${G16[run]}/${P16[run]}/${SQ16[run]}" "${G64[run]}/${P64[run]}/${SQ64[run]}" "${RL[run]}" "${RC[run]}" "${RS[run]}"
done
echo "## ratios within each run: ours over SQLite (target at c=1 >= 1.0) and ours over the file alone"
printf '%-6s %20s %20s %20s\n' run 'c=1 /sqlite /plain' 'c=16 /sqlite /plain' 'c=64 /sqlite /plain'
for run in $(seq 1 "$RUNS"); do
  printf '%-6s %20s %20s %20s\n' "$run" \
    "$(ratio "${G1[run]}" "${SQ1[run]}") $(ratio "${G1[run]}" "${P1[run]}")" \
    "$(ratio "${G16[run]}" "${SQ16[run]}") $(ratio "${G16[run]}" "${P16[run]}")" \
    "$(ratio "${G64[run]}" "${SQ64[run]}") $(ratio "${G64[run]}" "${P64[run]}")"
done
echo "## one requester committing its own grants (caller_commits, as the server runs): grants/s and over SQLite"
printf '%-6s %14s %12s %12s\n' run grant_1_caller /sqlite /grant_1
for run in $(seq 1 "$RUNS"); do
  printf '%-6s %14s %12s %12s\n' "$run" "${G1C[run]}" "$(ratio "${G1C[run]}" "${SQ1[run]}")" "$(ratio "${G1C[run]}" "${G1[run]}")"
done
echo "## ratios: grant_1 over the probe before / after it (target >= 0.45), grant_64 over grant_1 (target >= 10)"
printf '%-6s %22s %22s %17s\n' run 'grant_1/append b/a' 'grant_1/overwrite b/a' grant_64/grant_1
for run in $(seq 1 "$RUNS"); do
  next=$((run + 1))
  printf '%-6s %22s %22s %17s\n' "$run" \
    "$(ratio "${G1[run]}" "${APPEND[run]}") / $(ratio "${G1[run]}" "${APPEND[next]}")" \
    "$(ratio "${G1[run]}" "${OVERWRITE[run]}") / $(ratio "${G1[run]}" "${OVERWRITE[next]}")" \
    "$(ratio "${G64[run]}" "${G1[run]}")"
done
