// Starts the real `redb-limiter` binary on a temporary file and a free port, and stops it by its
// PID. The binary: $REDB_LIMITER_BIN, else <repo root>/target/release/redb-limiter, built with
// cargo when neither exists.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

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

/** Starts a server (`args`: more flags of `serve`); resolves to { url, path, pid, stop() }. */
export async function startServer({ token, recheckMs, args: extra = [] } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'redb-limiter-js-'));
  const path = join(dir, 'limiter.redb');
  const args = ['serve', '--path', path, '--listen', '127.0.0.1:0'];
  if (recheckMs !== undefined) args.push('--recheck-ms', String(recheckMs));
  args.push(...extra);
  const env = { ...process.env, RUST_LOG: 'warn' };
  delete env.REDB_LIMITER_TOKEN;
  if (token !== undefined) env.REDB_LIMITER_TOKEN = token;
  const child = spawn(binary(), args, { env, stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout });
  const ready = await new Promise((resolveReady, reject) => {
    const timer = setTimeout(() => reject(new Error('no ready line from the server within 30 s')), 30_000);
    child.once('exit', (code) => reject(new Error(`the server exited (${code}) before its ready line`)));
    lines.once('line', (line) => {
      clearTimeout(timer);
      resolveReady(JSON.parse(line));
    });
  });
  if (ready.ready !== true) throw new Error(`unexpected ready line ${JSON.stringify(ready)}`);
  return {
    url: ready.url,
    path: ready.path,
    pid: child.pid,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once('exit', r));
        process.kill(child.pid, 'SIGTERM');
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

let counter = 0;
/** A key no other test uses. */
export function fresh(prefix = 'k') {
  counter += 1;
  return `${prefix}-${process.pid}-${Date.now()}-${counter}`;
}
