// Nothing stranded: however a caller stops waiting, the client leaves nothing it was granted
// behind. Against the real server, through a proxy of the test's own that delays, hangs, drops or
// replaces replies and records what passes (test/proxy.mjs).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LimiterClient } from '../dist/index.mjs';
import { startProxy } from './proxy.mjs';
import { fresh, startServer } from './server.mjs';

const unhandled = [];
process.on('unhandledRejection', (e) => unhandled.push(e));

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The server's `/state` for the buckets and permits whose keys start with `prefix`. */
async function state(prefix) {
  return (await fetch(`${server.url}/state?prefix=${encodeURIComponent(prefix)}`)).json();
}

/** Polls `/state` until `done(state)` holds or `ms` passes; resolves to the last state. */
async function settled(prefix, done, ms = 1_500) {
  const until = performance.now() + ms;
  for (;;) {
    const s = await state(prefix);
    if (done(s) || performance.now() > until) return s;
    await sleep(25);
  }
}

const placesHeld = (s) => s.buckets.reduce((n, b) => n + b.placesHeld, 0);

/** A proxy to the server, closed after the test. */
async function proxied(t, rule) {
  const proxy = await startProxy(server.url, rule);
  t.after(() => proxy.close());
  return proxy;
}

const releases = (proxy) => proxy.log.filter((e) => e.path === '/release');

describe('withPermit', () => {
  test('withPermit whose body throws and whose release fails (503) rethrows the body\'s error, and the place is freed after', async (t) => {
    const proxy = await proxied(t, ({ path, seen }) =>
      path === '/release' && seen === 0 ? { status: 503, body: { error: { code: 'unavailable', message: 'the store cannot commit' } } } : undefined,
    );
    const client = new LimiterClient({ url: proxy.url });
    const conc = fresh('wp503/conc');
    const req = { key: fresh('wp503'), limits: [{ key: conc, concurrent: 1 }] };
    const err = await client.withPermit(req, async () => { throw new Error('the provider call failed'); }).catch((e) => e);
    assert.equal(err?.message, 'the provider call failed');
    const s = await settled(conc, (x) => placesHeld(x) === 0, 5_000);
    assert.equal(placesHeld(s), 0, 'the release was tried again in the background');
    assert.ok(releases(proxy).length >= 2);
  });

  test('withPermit whose body succeeds and whose release fails rejects with the release\'s error', async (t) => {
    const proxy = await proxied(t, ({ path }) => (path === '/release' ? { status: 503, body: { error: { code: 'unavailable', message: 'down' } } } : undefined));
    const client = new LimiterClient({ url: proxy.url });
    const req = { key: fresh('wp-ok'), limits: [{ key: fresh('wp-ok/conc'), concurrent: 1, holdMs: 1_000 }] };
    await assert.rejects(client.withPermit(req, () => 'fine'), (e) => e.name === 'UnavailableError');
  });
});

test('nothing was rejected unhandled', async () => {
  await sleep(100);
  assert.deepEqual(unhandled.map(String), []);
});
