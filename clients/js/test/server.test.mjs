// The server from npm: the platform's package name, findServerBinary (the override, the missing
// package's error), startServer against the real binary, and the package's `redb-limiter` command
// (bin/redb-limiter.cjs: arguments, exit code, SIGTERM forwarded). tests/packages/run.sh installs
// the packed tarballs themselves, offline, into an empty folder.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  currentPlatform,
  findServerBinary,
  LimiterClient,
  SERVER_PLATFORMS,
  ServerNotFoundError,
  serverBinaryName,
  serverPackage,
  startServer,
} from '../dist/index.mjs';
import { binary, fresh } from './server.mjs';

const shim = join(dirname(fileURLToPath(import.meta.url)), '..', 'bin', 'redb-limiter.cjs');
const scratch = mkdtempSync(join(tmpdir(), 'redb-limiter-pkg-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

/** Runs `fn` with REDB_LIMITER_BIN set to `value` (or unset), then restores it. */
function withBinEnv(value, fn) {
  const saved = process.env.REDB_LIMITER_BIN;
  if (value === undefined) delete process.env.REDB_LIMITER_BIN;
  else process.env.REDB_LIMITER_BIN = value;
  try {
    return fn();
  } finally {
    if (saved === undefined) delete process.env.REDB_LIMITER_BIN;
    else process.env.REDB_LIMITER_BIN = saved;
  }
}

test('one package per platform, named as npm selects them (os, cpu, libc)', () => {
  assert.deepEqual(SERVER_PLATFORMS.map(serverPackage), [
    '@redb-limiter/linux-x64-gnu',
    '@redb-limiter/linux-x64-musl',
    '@redb-limiter/linux-arm64-gnu',
    '@redb-limiter/linux-arm64-musl',
    '@redb-limiter/darwin-x64',
    '@redb-limiter/darwin-arm64',
    '@redb-limiter/win32-x64',
  ]);
  assert.equal(serverBinaryName({ platform: 'win32', arch: 'x64' }), 'redb-limiter.exe');
  assert.equal(serverBinaryName({ platform: 'linux', arch: 'x64', libc: 'musl' }), 'redb-limiter');
});

test('the C library detected at run time agrees with ldd', () => {
  const here = currentPlatform();
  assert.equal(here.platform, process.platform);
  assert.equal(here.arch, process.arch);
  if (process.platform !== 'linux') return;
  const ldd = spawnSync('ldd', ['--version'], { encoding: 'utf8' });
  const musl = `${ldd.stdout}${ldd.stderr}`.toLowerCase().includes('musl');
  assert.equal(here.libc, musl ? 'musl' : 'glibc');
});

test('REDB_LIMITER_BIN overrides the package, and a wrong one is an error naming it', () => {
  const real = binary();
  assert.equal(withBinEnv(real, () => findServerBinary()), real);
  const missing = join(scratch, 'no-such-binary');
  assert.throws(() => withBinEnv(missing, () => findServerBinary()), (e) => {
    assert.match(e.message, /REDB_LIMITER_BIN/);
    assert.ok(e.message.includes(missing));
    return true;
  });
});

test('without its package, the error names the package to install and the platform detected', () => {
  // This checkout installs no platform package (only the packed tarballs carry them).
  const expected = serverPackage(currentPlatform());
  assert.throws(() => withBinEnv(undefined, () => findServerBinary()), (e) => {
    assert.ok(e instanceof ServerNotFoundError);
    assert.equal(e.packageName, expected);
    assert.ok(e.message.includes(`npm install ${expected}@`), e.message);
    assert.ok(e.message.includes(`${process.platform} ${process.arch}`), e.message);
    return true;
  });
  const arm = { platform: 'linux', arch: 'arm64', libc: 'musl' };
  assert.throws(() => withBinEnv(undefined, () => findServerBinary(arm)), (e) => {
    assert.equal(e.packageName, '@redb-limiter/linux-arm64-musl');
    assert.ok(e.message.includes('linux arm64 (musl)'), e.message);
    return true;
  });
  assert.throws(() => withBinEnv(undefined, () => findServerBinary({ platform: 'freebsd', arch: 'x64' })), (e) => {
    assert.ok(e instanceof ServerNotFoundError);
    assert.equal(e.packageName, undefined);
    assert.match(e.message, /no package of the server is published for freebsd x64/);
    return true;
  });
});

test('startServer({ path, listen }) serves that file at that address until stop(), which drains to exit 0', async () => {
  const path = join(scratch, 'given.redb');
  const server = await startServer({ binary: binary(), path, listen: '127.0.0.1:0', stderr: 'ignore' });
  assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  assert.equal(server.path, path);
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
  const client = new LimiterClient({ url: server.url });
  const reply = await client.tryAcquire({ key: fresh(), limits: [{ key: fresh('b'), calls: 1, perMs: 60_000 }] });
  assert.equal(reply.granted, true);
  assert.equal(await server.stop(), 0);
  assert.equal(await server.stop(), 0, 'a second stop answers the same');
  assert.ok(existsSync(path), 'a file the caller named is kept');
  await assert.rejects(fetch(`${server.url}/health`));
});

test('startServer without a path serves a temporary file that stop() removes', async () => {
  const server = await startServer({ binary: binary(), stderr: 'ignore' });
  assert.ok(existsSync(server.path));
  assert.equal((await fetch(`${server.url}/health`)).status, 200);
  assert.equal(await server.stop(), 0);
  assert.ok(!existsSync(dirname(server.path)), 'the temporary folder is removed');
});

test('startServer rejects when the server exits before its ready line, or cannot run', async () => {
  // A listen address that is not one: the server names it and exits 1 before listening.
  await assert.rejects(
    startServer({ binary: binary(), listen: 'not-an-address', stderr: 'ignore' }),
    /exited \(1\) before its ready line/,
  );
  await assert.rejects(startServer({ binary: join(scratch, 'missing') }), /cannot run/);
});

/** Starts the package's command with `args`; resolves to { child, ready } once a line is printed. */
async function runShim(args, env) {
  const child = spawn(process.execPath, [shim, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = createInterface({ input: child.stdout });
  const exit = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  return { child, lines, exit };
}

test('the redb-limiter command runs the binary, forwards SIGTERM (the server drains, exit 0)', async () => {
  const env = { ...process.env, REDB_LIMITER_BIN: binary(), RUST_LOG: 'warn' };
  delete env.REDB_LIMITER_TOKEN;
  const { child, lines, exit } = await runShim(['serve', '--path', join(scratch, 'shim.redb'), '--listen', '127.0.0.1:0'], env);
  const ready = JSON.parse(await new Promise((resolve) => lines.once('line', resolve)));
  assert.equal(ready.ready, true);
  assert.equal((await fetch(`${ready.url}/health`)).status, 200);
  child.kill('SIGTERM');
  assert.deepEqual(await exit, { code: 0, signal: null });
  await assert.rejects(fetch(`${ready.url}/health`), 'the server itself stopped');
});

test('the redb-limiter command passes the exit code on, and says which package is missing', () => {
  const env = { ...process.env, REDB_LIMITER_BIN: binary() };
  const bad = spawnSync(process.execPath, [shim, 'serve', '--no-such-flag'], { env, encoding: 'utf8' });
  assert.equal(bad.status, 2, 'clap exits 2 on an unknown flag');
  assert.match(bad.stderr, /--no-such-flag/);
  delete env.REDB_LIMITER_BIN;
  const missing = spawnSync(process.execPath, [shim, 'serve'], { env, encoding: 'utf8' });
  assert.equal(missing.status, 1);
  assert.ok(missing.stderr.includes(serverPackage(currentPlatform())), missing.stderr);
});
