// Wake-ups (section 15 of the wire): a waiting head holding a ticket waits on `/wait`, which answers
// the moment its turn has come, and a release through the same client wakes it at once, with or
// without `/wait`. The server is started with `--recheck-ms 60000`, so a caller refused for
// concurrency is told to ask again a minute on: only a wake can serve it within the few seconds
// these tests allow. A proxy of the test's own (test/proxy.mjs) stands in for a server without
// waits (it answers `/wait` with 404), for the server's bound on waits, and records what passes.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { InvalidArgumentError, LimitedError, LimiterClient, NotFoundError } from '../dist/index.mjs';
import { startProxy } from './proxy.mjs';
import { fresh, startServer } from './server.mjs';

const RECHECK_MS = 60_000;

let server;
before(async () => {
  server = await startServer({ args: ['--recheck-ms', String(RECHECK_MS)] });
});
after(() => server?.stop());

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** `promise`, or a rejection naming `what` once `ms` passes. */
async function within(promise, ms, what) {
  let timer;
  const late = new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)));
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** The live tickets in the lines of the buckets whose keys start with `prefix`. */
async function queued(prefix) {
  const s = await (await fetch(`${server.url}/state?prefix=${encodeURIComponent(prefix)}`)).json();
  return s.buckets.reduce((n, b) => n + (b.queued ?? 0), 0);
}

/** Polls until `done()` holds, or fails after `ms`. */
async function until(done, what, ms = 5_000) {
  const stop = performance.now() + ms;
  while (!(await done())) {
    if (performance.now() > stop) assert.fail(`${what}: not within ${ms} ms`);
    await sleep(20);
  }
}

/** A proxy to the server, closed after the test. */
async function proxied(t, rule) {
  const proxy = await startProxy(server.url, rule);
  t.after(() => proxy.close());
  return proxy;
}

const NOT_FOUND = { status: 404, body: { error: { code: 'not_found', message: 'no such path' } } };
/** A server without waits (section 15): `/wait` answers 404, everything else reaches the server. */
const withoutWaits = ({ path }) => (path === '/wait' ? NOT_FOUND : undefined);
const waitsOf = (proxy) => proxy.log.filter((e) => e.path === '/wait');

/** One concurrency place, in a bucket no other test uses; `key` makes a shape of its own. */
function placeOf(name) {
  const bucket = fresh(`${name}/conc`);
  return { bucket, req: (key = fresh(name)) => ({ key, limits: [{ key: bucket, concurrent: 1 }] }) };
}

/** An acquire cancelled after the test, whatever happened (its rejection then is nobody's). */
function waiting(t, client, req, options = {}) {
  const ac = new AbortController();
  t.after(() => ac.abort());
  const pending = client.acquire(req, { signal: ac.signal, ...options });
  pending.catch(() => {});
  return pending;
}

describe('/wait: woken by the limiter', () => {
  test('client.wait is the wire\'s /wait: its arguments checked, an unknown ticket gone, NotFoundError where the server keeps no waits', async (t) => {
    const client = new LimiterClient({ url: server.url });
    await assert.rejects(client.wait([]), (e) => e instanceof InvalidArgumentError && e.field === 'tickets');
    await assert.rejects(client.wait(['t-1'], { timeoutMs: 999 }), (e) => e instanceof InvalidArgumentError && e.field === 'timeoutMs');
    await assert.rejects(client.wait(['t-1'], { timeoutMs: 60_001 }), (e) => e instanceof InvalidArgumentError && e.field === 'timeoutMs');
    const reply = await client.wait(['t-unknown'], { timeoutMs: 1_000 });
    assert.deepEqual({ ready: reply.ready, gone: reply.gone }, { ready: [], gone: ['t-unknown'] });
    assert.ok(reply.now instanceof Date);
    const proxy = await proxied(t, withoutWaits);
    await assert.rejects(new LimiterClient({ url: proxy.url }).wait(['t-unknown']), NotFoundError);
  });

  test('a release through another client wakes a waiting head within a round trip, long before its retryAt', async (t) => {
    const { bucket, req } = placeOf('other');
    const holder = await new LimiterClient({ url: server.url }).acquire(req());
    const waits = [];
    const pending = waiting(t, new LimiterClient({ url: server.url, onWait: (w) => waits.push(w) }), req());
    await until(async () => (await queued(bucket)) === 1, 'the waiter holds a ticket');
    await sleep(200);
    const released = performance.now();
    await holder.release();
    const permit = await within(pending, 10_000, 'the waiter woken by a release in another process');
    const took = performance.now() - released;
    assert.ok(took < 3_000, `granted ${Math.round(took)} ms after the release`);
    assert.equal(permit.waitedFor.reason, 'concurrency');
    assert.ok(permit.waitedFor.retryAt.getTime() - Date.now() > RECHECK_MS / 2, 'granted long before the retryAt it was told');
    assert.equal(waits.length, 1, JSON.stringify(waits));
    assert.equal(waits[0].woken, 'ready');
    assert.ok(waits[0].waitedMs < 5_000, JSON.stringify(waits));
    await permit.release();
  });

  test('the wait is not cut by the client\'s timeoutMs: it takes its own time', async (t) => {
    const { bucket, req } = placeOf('long');
    const holder = await new LimiterClient({ url: server.url }).acquire(req());
    const proxy = await proxied(t);
    const pending = waiting(t, new LimiterClient({ url: proxy.url, timeoutMs: 300 }), req());
    await until(async () => (await queued(bucket)) === 1, 'the waiter holds a ticket');
    await sleep(1_000);
    await holder.release();
    const permit = await within(pending, 10_000, 'the waiter woken after more than its timeoutMs');
    const [wait] = waitsOf(proxy);
    assert.ok(wait, 'it waited on /wait');
    assert.ok(wait.body.timeoutMs >= 1_000 && wait.body.timeoutMs <= 25_000, JSON.stringify(wait.body));
    assert.notEqual(wait.hungUp, true, 'the client did not hang up on its wait');
    assert.match(wait.reply, /"ready":\["t-/);
    await permit.release();
  });

  test('a ticket gone from the line (left by someone else) is asked again at once, and waits on afresh', async (t) => {
    const { bucket, req } = placeOf('gone');
    const other = new LimiterClient({ url: server.url });
    const holder = await other.acquire(req());
    const waits = [];
    const pending = waiting(t, new LimiterClient({ url: server.url, onWait: (w) => waits.push(w) }), req());
    await until(async () => (await queued(bucket)) === 1, 'the waiter holds a ticket');
    const state = await (await fetch(`${server.url}/state?prefix=${encodeURIComponent(bucket)}`)).json();
    assert.equal(await other.leave(state.buckets[0].firstTicket), true);
    await until(async () => waits.length === 1, 'the waiter woken by its ticket\'s end');
    assert.equal(waits[0].woken, 'gone');
    await until(async () => (await queued(bucket)) === 1, 'the waiter filed a new ticket');
    await holder.release();
    const permit = await within(pending, 10_000, 'the waiter woken by the release');
    assert.equal(waits[1].woken, 'ready');
    await permit.release();
  });

  test('a wait answered empty at once (the server\'s bound on waits, or its shutdown) falls back to retryAt', async (t) => {
    const empty = { status: 200, body: { ready: [], gone: [], now: new Date().toISOString() } };
    const proxy = await proxied(t, ({ path }) => (path === '/wait' ? empty : undefined));
    const waits = [];
    const client = new LimiterClient({ url: proxy.url, onWait: (w) => waits.push(w) });
    const req = { key: fresh('bound'), limits: [{ key: fresh('bound/w'), calls: 1, perMs: 1_500 }] };
    await client.acquire(req);
    const started = performance.now();
    await within(client.acquire(req), 10_000, 'the second call');
    const took = performance.now() - started;
    assert.ok(took >= 1_000 && took < 4_000, `took ${Math.round(took)} ms`);
    assert.equal(waitsOf(proxy).length, 1, 'one wait, then a sleep to retryAt, not a loop of waits');
    assert.equal(waits.length, 1);
    assert.equal(waits[0].woken, undefined);
  });

  test('a server without waits (404) is asked once: from then on the client waits to each retryAt', async (t) => {
    const proxy = await proxied(t, withoutWaits);
    const client = new LimiterClient({ url: proxy.url });
    const req = { key: fresh('nowait'), limits: [{ key: fresh('nowait/w'), calls: 1, perMs: 1_000 }] };
    await client.acquire(req);
    const started = performance.now();
    await within(client.acquire(req), 10_000, 'the second call');
    await within(client.acquire(req), 10_000, 'the third call');
    const took = performance.now() - started;
    assert.ok(took >= 1_500 && took < 5_000, `took ${Math.round(took)} ms`);
    assert.equal(waitsOf(proxy).length, 1, 'one /wait in all: its 404 is remembered');
  });

  test('a wait that fails (its connection dropped) falls back to retryAt', async (t) => {
    const proxy = await proxied(t, ({ path }) => (path === '/wait' ? { drop: true } : undefined));
    const client = new LimiterClient({ url: proxy.url });
    const req = { key: fresh('dropped'), limits: [{ key: fresh('dropped/w'), calls: 1, perMs: 1_500 }] };
    await client.acquire(req);
    const started = performance.now();
    await within(client.acquire(req), 10_000, 'the second call');
    const took = performance.now() - started;
    assert.ok(took >= 1_000 && took < 4_000, `took ${Math.round(took)} ms`);
    assert.equal(waitsOf(proxy).length, 1);
  });
});

describe('local wakes: a release through this client', () => {
  test('wakes its waiter on the same bucket at once, though the server keeps no waits', async (t) => {
    const proxy = await proxied(t, withoutWaits);
    const waits = [];
    const client = new LimiterClient({ url: proxy.url, onWait: (w) => waits.push(w) });
    const { bucket, req } = placeOf('local');
    const first = await client.tryAcquire(req());
    assert.equal(first.granted, true);
    // Another shape (another caller key) on the same bucket.
    const second = waiting(t, client, req());
    await until(async () => (await queued(bucket)) === 1, 'the second holds a ticket');
    await proxy.waitFor((e) => e.path === '/wait' && e.status === 404);
    await sleep(200);
    const released = performance.now();
    assert.equal(await client.release(first.permit), true);
    const permit = await within(second, 10_000, 'the second woken by the release');
    assert.ok(performance.now() - released < 3_000);
    assert.equal(waits.at(-1).woken, 'release');

    // The 404 is remembered: the next waiter sleeps without asking /wait, and is woken the same way.
    const third = waiting(t, client, req());
    await until(async () => (await queued(bucket)) === 1, 'the third holds a ticket');
    await sleep(200);
    await permit.release();
    await (await within(third, 10_000, 'the third woken by the release')).release();
    assert.equal(waitsOf(proxy).length, 1, 'one /wait in all: its 404 is remembered');
  });

  test('leaves a head\'s pending /wait to the limiter, which answers it: the wait is not cut and no ask is refused', async (t) => {
    const proxy = await proxied(t);
    const waits = [];
    const client = new LimiterClient({ url: proxy.url, onWait: (w) => waits.push(w) });
    const { req } = placeOf('kept');
    const first = await client.acquire(req());
    // Another shape (another caller key) on the same bucket, waiting on its ticket.
    const second = waiting(t, client, req());
    await proxy.waitFor((e) => e.path === '/wait');
    await sleep(200);
    const released = performance.now();
    assert.equal(await first.release(), true);
    const permit = await within(second, 10_000, 'the second served through its /wait');
    assert.ok(performance.now() - released < 3_000);
    const [wait, ...more] = waitsOf(proxy);
    assert.equal(more.length, 0, 'one /wait in all');
    assert.notEqual(wait.hungUp, true, 'the release did not cut the wait');
    assert.match(wait.reply, /"ready":\["t-/);
    assert.equal(waits.at(-1).woken, 'ready');
    // The first grant, the second's refusal (its ticket), and its grant: no ask that the line refused.
    assert.equal(proxy.log.filter((e) => e.path === '/acquire').length, 3);
    await permit.release();
  });

  test('withPermit\'s end wakes the caller waiting behind it in the same shape', async (t) => {
    const proxy = await proxied(t, withoutWaits);
    const client = new LimiterClient({ url: proxy.url });
    const { req } = placeOf('with');
    const shape = req();
    let finish;
    const gate = new Promise((r) => (finish = r));
    const first = client.withPermit(shape, () => gate);
    await sleep(100);
    const second = waiting(t, client, shape);
    await proxy.waitFor((e) => e.path === '/wait');
    await sleep(200);
    const ended = performance.now();
    finish('done');
    assert.equal(await first, 'done');
    await (await within(second, 10_000, 'the caller behind withPermit')).release();
    assert.ok(performance.now() - ended < 3_000);
  });

  test('a settle that frees room in a window wakes the waiter it now fits', async (t) => {
    const proxy = await proxied(t, withoutWaits);
    const waits = [];
    const client = new LimiterClient({ url: proxy.url, onWait: (w) => waits.push(w) });
    const bucket = fresh('settle/w');
    const window = { key: bucket, calls: 10, perMs: 60_000 };
    const estimate = await client.acquire({ key: fresh('settle'), permit: true, limits: [{ ...window, cost: 10 }] });
    const pending = waiting(t, client, { key: fresh('settle'), limits: [{ ...window, cost: 5 }] });
    await until(async () => (await queued(bucket)) === 1, 'the waiter holds a ticket');
    await sleep(200);
    const settled = performance.now();
    assert.equal(await estimate.settle({ [bucket]: 2 }), true);
    await within(pending, 10_000, 'the waiter woken by the settle');
    assert.ok(performance.now() - settled < 3_000);
    assert.equal(waits.at(-1).woken, 'release');
    await estimate.release();
  });
});

describe('a caller that stops waiting during a /wait', () => {
  test('an abort rejects at once, hangs up the wait, and leaves no ticket', async (t) => {
    const { bucket, req } = placeOf('abort');
    const holder = await new LimiterClient({ url: server.url }).acquire(req());
    t.after(() => holder.release());
    const proxy = await proxied(t);
    const ac = new AbortController();
    const pending = new LimiterClient({ url: proxy.url }).acquire(req(), { signal: ac.signal }).catch((e) => e);
    await proxy.waitFor((e) => e.path === '/wait');
    await sleep(200);
    const aborted = performance.now();
    ac.abort();
    const err = await pending;
    assert.ok(performance.now() - aborted < 500, `rejected ${Math.round(performance.now() - aborted)} ms after the abort`);
    assert.ok(err instanceof LimitedError, String(err));
    assert.equal(err.trigger, 'aborted');
    const [wait] = waitsOf(proxy);
    await until(async () => wait.hungUp === true, 'the client hung up its /wait');
    await until(async () => (await queued(bucket)) === 0, 'the ticket left the line');
  });

  test('maxWaitMs ends a pending wait at its deadline, and leaves no ticket', async (t) => {
    // A recheck within the wait, so that the refusal files a ticket (section 12.9) and no /wait is ready.
    const short = await startServer({ recheckMs: 1_500 });
    const proxy = await startProxy(short.url);
    t.after(async () => {
      await proxy.close();
      await short.stop();
    });
    const bucket = fresh('deadline/conc');
    const req = { key: fresh('deadline'), limits: [{ key: bucket, concurrent: 1 }] };
    await new LimiterClient({ url: short.url }).acquire(req);
    const started = performance.now();
    const err = await new LimiterClient({ url: proxy.url }).acquire(req, { maxWaitMs: 2_500 }).catch((e) => e);
    const took = performance.now() - started;
    assert.ok(err instanceof LimitedError, String(err));
    assert.equal(err.trigger, 'maxWait');
    assert.ok(took >= 2_400 && took < 4_000, `gave up after ${Math.round(took)} ms`);
    const asks = proxy.log.filter((e) => e.path === '/acquire');
    assert.equal(asks.length, 1, 'no ask after the wait ran to the deadline');
    assert.equal(typeof JSON.parse(asks[0].reply).ticket, 'string');
    assert.equal(waitsOf(proxy).length, 1);
    const lineOf = async () => (await (await fetch(`${short.url}/state?prefix=${encodeURIComponent(bucket)}`)).json()).buckets[0];
    await until(async () => ((await lineOf()).queued ?? 0) === 0, 'the ticket left the line');
  });
});
