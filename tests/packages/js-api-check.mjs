// Run from a folder where the packed `redb-limiter` is installed (run.sh copies it there): the
// library finds the binary of its platform package and starts a server with it, from ESM and
// from CommonJS.
import assert from 'node:assert/strict';
import { realpathSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { currentPlatform, findServerBinary, LimiterClient, serverPackage, startServer } from 'redb-limiter';

const expected = join(process.cwd(), 'node_modules', serverPackage(currentPlatform()), 'bin', 'redb-limiter');
assert.equal(realpathSync(findServerBinary()), realpathSync(expected));
assert.equal(createRequire(import.meta.url)('redb-limiter').findServerBinary(), findServerBinary());

const server = await startServer({ path: join(process.cwd(), 'api-check.redb'), listen: '127.0.0.1:0' });
const client = new LimiterClient({ url: server.url });
const reply = await client.tryAcquire({ key: 'api-check', limits: [{ key: 'api-check/rpm', calls: 1, perMs: 60_000 }] });
assert.equal(reply.granted, true);
assert.equal(await server.stop(), 0);
console.log(`ok: findServerBinary() -> ${findServerBinary()}; startServer() served ${server.url} and stopped with 0`);
