// Starts `<command...> serve` on a temporary file and a free port, as a user would run the
// installed server, and checks it: the ready line, GET /health 200, a grant, then SIGTERM to the
// command: exit 0, the server drained (its log says so) and no longer answers. Used by run.sh for
// the npm package's command, `npx redb-limiter`, the wheel's `redb-limiter` and lf-launch.sh;
// needs nothing but Node.
//
// `--npx` first: the command is `npx`, whose own exit on SIGTERM is npm's: npm runs the command
// through `sh -c`, and where sh is dash (Debian, Ubuntu) the shell dies of the signal npm
// forwards and npm re-raises it (exit by SIGTERM, 143); elsewhere (sh is bash) the command's 0.
// The server behind it must drain and stop all the same.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const npx = process.argv[2] === '--npx';
const command = process.argv.slice(npx ? 3 : 2);
if (command.length === 0) throw new Error('usage: serve-check.mjs COMMAND [ARGS...]');
const folder = mkdtempSync(join(tmpdir(), 'redb-limiter-serve-check-'));
const path = join(folder, 'limiter.redb');
const child = spawn(command[0], [...command.slice(1), 'serve', '--path', path, '--listen', '127.0.0.1:0'], {
  stdio: ['ignore', 'pipe', 'pipe'],
});
// The server's log, shown as it comes, and kept to see it drain.
let log = '';
const drained = new Promise((resolve) => {
  child.stderr.on('data', (chunk) => {
    process.stderr.write(chunk);
    log += chunk;
    if (log.includes('drained')) resolve();
  });
});
const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
try {
  const lines = createInterface({ input: child.stdout });
  const line = await Promise.race([
    new Promise((resolve) => lines.once('line', resolve)),
    exited.then((e) => Promise.reject(new Error(`${command.join(' ')} exited (${e.code ?? e.signal}) before its ready line`))),
    new Promise((_, reject) => setTimeout(() => reject(new Error('no ready line within 30 s')), 30_000).unref()),
  ]);
  const ready = JSON.parse(line);
  assert.equal(ready.ready, true, line);
  assert.equal(ready.path, path, line);
  const health = await fetch(`${ready.url}/health`);
  assert.equal(health.status, 200);
  const acquire = await fetch(`${ready.url}/acquire`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ key: 'serve-check', limits: [{ key: 'serve-check/rpm', calls: 1, perMs: 60_000 }] }),
  });
  const granted = await acquire.json();
  assert.equal(acquire.status, 200);
  assert.equal(granted.granted, true, JSON.stringify(granted));
  child.kill('SIGTERM');
  const exit = await exited;
  if (npx && exit.signal === 'SIGTERM') {
    console.log('npx itself exited by SIGTERM (npm re-raises the signal its dash shell died of)');
  } else {
    assert.deepEqual(exit, { code: 0, signal: null }, 'SIGTERM drains and exits 0');
  }
  await Promise.race([
    drained,
    new Promise((_, reject) => setTimeout(() => reject(new Error(`the server did not drain:\n${log}`)), 15_000).unref()),
  ]);
  for (let i = 0; ; i += 1) {
    const up = await fetch(`${ready.url}/health`).then(() => true, () => false);
    if (!up) break;
    assert.ok(i < 100, 'the server still answers 10 s after draining');
    await new Promise((r) => setTimeout(r, 100));
  }
  console.log(`ok: ${command.join(' ')} serve: ready at ${ready.url}, /health 200, granted, SIGTERM -> exit ${exit.code ?? exit.signal}, drained and stopped`);
} finally {
  if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  rmSync(folder, { recursive: true, force: true });
}
