#!/usr/bin/env bash
# Builds every fuzz target and runs each, one after another, for SECONDS (default 60) from the
# committed seeds; fails on the first crash (its input is left in fuzz/artifacts/<target>/).
#
# Usage: fuzz/smoke.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"

# No sanitizer: the crate has no unsafe code, and ASan makes the store target eight times slower.
# Debug assertions and overflow checks stay on.
flags=(--sanitizer none --debug-assertions)

cargo +nightly fuzz build "${flags[@]}"

# New inputs go to a scratch corpus, so the committed seeds stay as they are.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

for target in $(cargo +nightly fuzz list); do
  echo "== $target: ${seconds} s"
  mkdir -p "$scratch/$target" "corpus/$target"
  cargo +nightly fuzz run "${flags[@]}" "$target" "$scratch/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -timeout=60 -print_final_stats=1
done
