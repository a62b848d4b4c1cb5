#!/usr/bin/env bash
# Builds the server binary that the npm and PyPI packages carry, for this machine (or the Rust
# target in REDB_LIMITER_TARGET), and prints its path on stdout (cargo's output goes to stderr).
#
# Release profile, stripped, without debug info. On Linux with glibc it is linked statically
# (`crt-static`): no shared library is needed at run time, so the same file runs on any Linux of
# its architecture, old glibc (Debian 11, Ubuntu 20.04, RHEL 8) or none (Alpine) alike. The
# target is always named explicitly so that RUSTFLAGS reach the binary and not the build scripts
# and proc-macros, and the build has a target folder of its own (target/static) so that the
# ordinary `cargo build --release` is not invalidated.
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
target=${REDB_LIMITER_TARGET:-$host}
flags=""
case "$target" in
  *-linux-gnu* | *-windows-msvc) flags="-C target-feature=+crt-static" ;;
esac
exe=""
case "$target" in
  *-windows-*) exe=".exe" ;;
esac

RUSTFLAGS="${RUSTFLAGS:-} $flags" \
  CARGO_PROFILE_RELEASE_DEBUG=false \
  CARGO_PROFILE_RELEASE_STRIP=symbols \
  cargo build --release --locked --bin redb-limiter --target "$target" --target-dir target/static >&2
echo "$PWD/target/static/$target/release/redb-limiter$exe"
