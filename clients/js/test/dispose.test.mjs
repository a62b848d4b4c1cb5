// `await using` releases a permit when its scope ends, normally or by a throw. Node 20 cannot
// parse the syntax, so the TypeScript below is lowered by esbuild (as a TypeScript or bundler
// build would) and run against the real server.
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { transform } from 'esbuild';
import { fresh, startServer } from './server.mjs';

const source = `
import { LimiterClient } from 'redb-limiter';

export async function scoped(url: string, request: any, fail: boolean): Promise<number> {
  const client = new LimiterClient({ url });
  await using permit = await client.acquire(request);
  const held = (await client.peek(request)).limits[0]!.held!;
  if (fail) throw new Error('the call failed');
  return held;
}
`;

let server;
let generated;
before(async () => {
  server = await startServer();
  const { code } = await transform(source, { loader: 'ts', format: 'esm', target: 'node20' });
  generated = join(dirname(fileURLToPath(import.meta.url)), `.dispose-${process.pid}.mjs`);
  writeFileSync(generated, code);
});
after(async () => {
  if (generated) rmSync(generated, { force: true });
  await server?.stop();
});

test('await using holds the permit in its scope and releases it on the way out, a throw included', async () => {
  const { scoped } = await import(pathToFileURL(generated).href);
  const { LimiterClient } = await import('redb-limiter');
  const client = new LimiterClient({ url: server.url });
  const request = { key: fresh('using'), limits: [{ key: fresh('using/conc'), concurrent: 1 }] };
  assert.equal(await scoped(server.url, request, false), 1, 'held inside the scope');
  assert.equal((await client.peek(request)).limits[0].held, 0, 'released after it');
  await assert.rejects(scoped(server.url, request, true), /the call failed/);
  assert.equal((await client.peek(request)).limits[0].held, 0, 'released after a throw too');
});
