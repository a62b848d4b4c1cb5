// Starts the real `redb-limiter` binary on a temporary file and a free port (the package's own
// `LimiterClient.startServer`), and stops it with SIGTERM. The binary: $REDB_LIMITER_BIN, else
// <repo root>/target/release/redb-limiter, built with cargo when neither exists.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { LimiterClient } from '../dist/index.mjs';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

let built;
export function binary() {
  if (process.env.REDB_LIMITER_BIN) return process.env.REDB_LIMITER_BIN;
  const bin = join(repoRoot, 'target', 'release', 'redb-limiter');
  if (!existsSync(bin) && !built) {
    console.log('building the server: cargo build --release --bin redb-limiter');
    const r = spawnSync('cargo', ['build', '--release', '--bin', 'redb-limiter'], { cwd: repoRoot, stdio: 'inherit' });
    if (r.status !== 0) throw new Error('cargo build --release --bin redb-limiter failed');
    built = true;
  }
  return bin;
}

/**
 * Starts a server through the package's own `LimiterClient.startServer` (on a temporary file and a free port;
 * `args`: more flags of `serve`); resolves to { url, path, pid, stop() }.
 */
export async function startServer({ token, recheckMs, args: extra = [] } = {}) {
  const args = [...(recheckMs === undefined ? [] : ['--recheck-ms', String(recheckMs)]), ...extra];
  const env = { ...process.env, RUST_LOG: 'warn' };
  delete env.REDB_LIMITER_TOKEN;
  if (token !== undefined) env.REDB_LIMITER_TOKEN = token;
  return LimiterClient.startServer({ binary: binary(), args, env });
}

let counter = 0;
/** A key no other test uses. */
export function fresh(prefix = 'k') {
  counter += 1;
  return `${prefix}-${process.pid}-${Date.now()}-${counter}`;
}
