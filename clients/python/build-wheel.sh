#!/usr/bin/env bash
# Writes the wheel that carries the server to dist/: the client package and the `redb-limiter`
# binary, tagged for this platform (scripts/build_wheel.py says how it is assembled).
#   ./build-wheel.sh                            builds the binary (packaging/build-server.sh)
#   ./build-wheel.sh --binary PATH --target T   one built already for Rust target T
# Prints the wheel's path. `pip install ./clients/python` still installs the client alone.
set -euo pipefail
cd "$(dirname "$0")"

binary="" target=""
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    *) echo "build-wheel.sh: unknown argument $1 (--binary PATH, --target RUST_TARGET)" >&2; exit 2 ;;
  esac
done
if [ -z "$binary" ]; then
  binary=$(../../packaging/build-server.sh)
fi
if [ -z "$target" ]; then
  # packaging/build-server.sh writes target/static/<target>/release/redb-limiter.
  target=$(basename "$(dirname "$(dirname "$binary")")")
fi
"${PYTHON:-python3}" scripts/build_wheel.py --binary "$binary" --target "$target"
