#!/usr/bin/env bash
# The server from the registry, as a new user gets it: no `cargo` or `rustc` on PATH, a fresh
# HOME (an empty npm cache), nothing but Node or Python.
#
# 1. The binary, built once for both (packaging/build-server.sh, or REDB_LIMITER_STATIC_BIN):
#    statically linked (or needing glibc 2.28 at most) and stripped, checked with file, ldd and
#    objdump.
# 2. npm: `npm run pack:server` writes the main and this platform's tarballs; installed offline
#    into an empty folder, `npx redb-limiter serve` starts (ready line, /health 200, a grant,
#    SIGTERM -> exit 0), and findServerBinary() / startServer() work from ESM and CommonJS; the
#    main package without its platform package fails naming the package and the platform.
# 3. PyPI: clients/python/build-wheel.sh writes the wheel; installed into a fresh virtual
#    environment (offline, its dependencies from a local folder), `redb-limiter serve` starts
#    the same way, and find_server() / start_server() work.
# 4. listen-fire: lf-launch.sh runs a binary beside it or on PATH, and without either (and
#    without cargo) says what to install.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
checks=$repo/tests/packages
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "the binary"
binary=${REDB_LIMITER_STATIC_BIN:-$(packaging/build-server.sh)}
described=$(file -b "$binary")
echo "$described"
case "$described" in
  *"statically linked"* | *"static-pie linked"*) linkage=static ;;
  *) linkage=dynamic ;;
esac
case "$described" in
  *"not stripped"*) echo "FAIL: $binary is not stripped" >&2; exit 1 ;;
  *stripped*) ;;
  *) echo "FAIL: file does not say $binary is stripped" >&2; exit 1 ;;
esac
# The newest glibc symbol version it needs (none when static).
newest=$( (objdump -T "$binary" 2>/dev/null || true) | { grep -o 'GLIBC_[0-9.]*' || true; } | sed 's/GLIBC_//' | sort -V | tail -n1)
if [ "$linkage" = static ]; then
  if objdump -p "$binary" | grep -E '^\s*(NEEDED|INTERP)'; then
    echo "FAIL: file says static, but objdump shows the dynamic entries above" >&2
    exit 1
  fi
  ldd_says=$(ldd "$binary" 2>&1 || true)
  case "$ldd_says" in
    *"not a dynamic executable"* | *"statically linked"*) ;;
    *) echo "FAIL: ldd lists libraries for a static binary: $ldd_says" >&2; exit 1 ;;
  esac
  [ -z "$newest" ] || { echo "FAIL: a static binary that names GLIBC_$newest" >&2; exit 1; }
  echo "static: no shared library, no interpreter (ldd: $ldd_says)"
elif [ -n "$newest" ] && [ "$(printf '%s\n2.28\n' "$newest" | sort -V | tail -n1)" != 2.28 ]; then
  echo "FAIL: $binary needs GLIBC_$newest; Debian 11, Ubuntu 20.04 and RHEL 8 have at most 2.28-2.31 (2.28 for RHEL 8)" >&2
  exit 1
else
  echo "dynamic, needs glibc ${newest:-(none)} at most"
fi
echo "size: $(stat -c %s "$binary") bytes ($(du -h "$binary" | cut -f1))"

# A new user: a fresh HOME, and a PATH with Node (and the virtual environment's bin, below) but
# no Rust toolchain.
mkdir -p "$work/home" "$work/bin" "$work/tmp"
for tool in node npm npx; do ln -s "$(command -v "$tool")" "$work/bin/$tool"; done
user_path="$work/bin:/usr/bin:/bin"
as_user() {
  env -i HOME="$work/home" PATH="$user_path" TMPDIR="$work/tmp" LANG=C.UTF-8 \
    npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false "$@"
}
if as_user sh -c 'command -v cargo || command -v rustc'; then
  echo "FAIL: the new user's PATH ($user_path) still has the Rust toolchain above" >&2
  exit 1
fi

step "npm: pack"
[ -x clients/js/node_modules/.bin/tsup ] || (cd clients/js && npm ci --no-audit --no-fund)
(cd clients/js && npm run --silent pack:server -- --binary "$binary")
version=$(node -p "require('./clients/js/package.json').version")
platform=$(cd clients/js && node -e "const m = require('./dist/index.cjs'); console.log(m.serverPackage(m.currentPlatform()).replace('@redb-limiter/', ''))")
main_tgz=$repo/clients/js/packs/redb-limiter-$version.tgz
platform_tgz=$repo/clients/js/packs/redb-limiter-$platform-$version.tgz
ls -l "$main_tgz" "$platform_tgz"

step "npm: install offline into an empty folder, npx redb-limiter serve"
mkdir "$work/app"
echo '{ "name": "app", "private": true }' >"$work/app/package.json"
(cd "$work/app" && as_user npm install --offline "$main_tgz" "$platform_tgz")
cmp "$binary" "$work/app/node_modules/@redb-limiter/$platform/bin/redb-limiter"
(cd "$work/app" && as_user node "$checks/serve-check.mjs" node_modules/.bin/redb-limiter)
(cd "$work/app" && as_user node "$checks/serve-check.mjs" --npx npx --no redb-limiter)
cp "$checks/js-api-check.mjs" "$work/app/"
(cd "$work/app" && as_user node js-api-check.mjs)

step "npm: the main package without its platform package"
mkdir "$work/bare"
echo '{ "name": "bare", "private": true }' >"$work/bare/package.json"
(cd "$work/bare" && as_user npm install --offline "$main_tgz")
status=0
(cd "$work/bare" && as_user npx --no redb-limiter serve) 2>"$work/bare.err" || status=$?
cat "$work/bare.err"
[ "$status" -ne 0 ] || { echo "FAIL: it served without its platform package" >&2; exit 1; }
grep -q "@redb-limiter/$platform" "$work/bare.err" || { echo "FAIL: the error does not name @redb-limiter/$platform" >&2; exit 1; }
grep -q "$(node -p 'process.platform + " " + process.arch')" "$work/bare.err" || { echo "FAIL: the error does not name the platform" >&2; exit 1; }

step "PyPI: the wheel"
# packaging/build-server.sh writes target/static/<rust target>/release/redb-limiter.
target=${REDB_LIMITER_STATIC_TARGET:-$(basename "$(dirname "$(dirname "$binary")")")}
wheel=$(clients/python/build-wheel.sh --binary "$binary" --target "$target")
ls -l "$wheel"
python=$(python3 -c 'import sys; print(sys.executable)')
# The wheel's dependencies (httpx) in a local folder, so that the install itself is offline.
"$python" -m pip download --quiet --disable-pip-version-check -d "$work/wheelhouse" httpx
"$python" -m venv "$work/venv"

step "PyPI: install into a fresh virtual environment, redb-limiter serve"
as_user "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index \
  --find-links "$work/wheelhouse" "$wheel"
cmp "$binary" "$work/venv/bin/redb-limiter"
user_path="$work/venv/bin:$user_path"
(cd "$work" && as_user node "$checks/serve-check.mjs" redb-limiter)
(cd "$work" && as_user python "$checks/py-api-check.py")

step "listen-fire: lf-launch.sh runs a binary beside it, else one a package installed"
mkdir "$work/lf-beside" "$work/lf-path" "$work/lf-none"
cp lf-launch.sh "$work/lf-beside/" && cp "$binary" "$work/lf-beside/redb-limiter"
cp lf-launch.sh "$work/lf-path/"
cp lf-launch.sh "$work/lf-none/"
as_user node "$checks/serve-check.mjs" sh "$work/lf-beside/lf-launch.sh"
as_user node "$checks/serve-check.mjs" sh "$work/lf-path/lf-launch.sh"
user_path=${user_path#"$work/venv/bin:"}
status=0
as_user sh "$work/lf-none/lf-launch.sh" serve 2>"$work/lf-none.err" || status=$?
cat "$work/lf-none.err"
[ "$status" -eq 127 ] && grep -q "no server binary here and no Rust toolchain" "$work/lf-none.err" \
  || { echo "FAIL: without a binary or cargo, lf-launch.sh should say so and exit 127 (it exited $status)" >&2; exit 1; }

step "ok: the packages serve with no Rust toolchain"
