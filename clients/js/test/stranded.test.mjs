// Nothing stranded: however a caller stops waiting (its own timeout, maxWaitMs, an abort, a lost
// connection), the client leaves nothing it may have been granted or filed behind, and no caller
// waits on another's hung request. Against the real server, through a proxy of the test's own
// that delays, hangs, drops or replaces replies and records what passes (test/proxy.mjs). Every
// ask carries a request id (section 16 of the wire) and an abandoned one is undone by it; a
// server without section 16 answers that undo with a 400, which the client swallows.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { ConnectionError, LimitedError, LimiterClient } from '../dist/index.mjs';
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
const queued = (s) => s.buckets.reduce((n, b) => n + (b.queued ?? 0), 0);

/** A proxy to the server, closed after the test. */
async function proxied(t, rule) {
  const proxy = await startProxy(server.url, rule);
  t.after(() => proxy.close());
  return proxy;
}

const acquires = (proxy) => proxy.log.filter((e) => e.path === '/acquire');
const releases = (proxy) => proxy.log.filter((e) => e.path === '/release');

/** The `release {id}` that undid `ask` (an /acquire entry of the log), once it passes the proxy. */
async function undoOf(proxy, ask) {
  assert.equal(typeof ask?.body.id, 'string', 'the ask carried an id');
  const undo = await proxy.waitFor((e) => e.path === '/release' && e.body?.id === ask.body.id);
  assert.ok(undo, `no release {id: ${ask.body.id}} was sent`);
  return undo;
}

describe('request ids (section 16)', () => {
  test('every ask carries an id of its own, 1 to 128 bytes: an ask again at a new retryAt is a new id', async (t) => {
    const proxy = await proxied(t);
    const client = new LimiterClient({ url: proxy.url });
    const req = { key: fresh('ids'), limits: [{ key: fresh('ids/w'), calls: 1, perMs: 300 }] };
    await client.acquire(req);
    await client.acquire(req);
    await client.tryAcquire(req);
    const ids = acquires(proxy).map((e) => e.body.id);
    assert.ok(ids.length >= 4, `asks: ${ids.length}`);
    for (const id of ids) assert.ok(typeof id === 'string' && id.length >= 1 && Buffer.byteLength(id) <= 128, JSON.stringify(id));
    assert.equal(new Set(ids).size, ids.length, `ids repeat: ${JSON.stringify(ids)}`);
  });

  test('ids come from the requestId option when one is given', async (t) => {
    const proxy = await proxied(t);
    let n = 0;
    const client = new LimiterClient({ url: proxy.url, requestId: () => `ask-${++n}` });
    const req = { key: fresh('idf'), limits: [{ key: fresh('idf/w'), calls: 5, perMs: 60_000 }] };
    await client.tryAcquire(req);
    await client.acquire(req);
    assert.deepEqual(acquires(proxy).map((e) => e.body.id), ['ask-1', 'ask-2']);
  });

  test('a client timeout while an acquire is in flight sends release {id} with a zero cost per window limit, in the background', async (t) => {
    // The reply comes 400 ms late; the undo itself is never answered, which the caller must not wait for.
    const proxy = await proxied(t, ({ path }) => (path === '/acquire' ? { delayMs: 400 } : path === '/release' ? { hang: true } : undefined));
    let undoSentAt;
    const spy = (url, init) => {
      if (String(url).endsWith('/release')) undoSentAt ??= performance.now();
      return fetch(url, init);
    };
    const client = new LimiterClient({ url: proxy.url, timeoutMs: 150, fetch: spy });
    const window = fresh('to/w');
    const conc = fresh('to/conc');
    const req = { key: fresh('to'), limits: [{ key: window, calls: 10, perMs: 60_000 }, { key: conc, concurrent: 2 }] };
    const started = performance.now();
    const err = await client.acquire(req).catch((e) => e);
    const rejectedAt = performance.now();
    const took = rejectedAt - started;
    assert.ok(err instanceof ConnectionError, String(err));
    assert.ok(took < 1_000, `rejected after ${took} ms`);
    assert.ok(undoSentAt !== undefined && undoSentAt <= rejectedAt, 'the undo was sent before the caller was told');
    const [ask] = acquires(proxy);
    const undo = await undoOf(proxy, ask);
    assert.deepEqual(undo.body, { id: ask.body.id, costs: [{ key: window, cost: 0 }] });
    console.log(`timeout: rejected after ${Math.round(took)} ms (timeoutMs 150, reply 400 ms late); release {id} sent ${Math.round(undoSentAt - started)} ms after the start`);
  });

  test('after a client timeout, no place outlives the late grant by a second', async (t) => {
    // A server with section 16 frees it by id; one without answers the undo 400, and the client,
    // still listening for the late answer, releases the permit it names.
    const proxy = await proxied(t, ({ path }) => (path === '/acquire' ? { delayMs: 400 } : undefined));
    const client = new LimiterClient({ url: proxy.url, timeoutMs: 150 });
    const conc = fresh('to-held/conc');
    const req = { key: fresh('to-held'), limits: [{ key: conc, concurrent: 1 }] };
    const started = performance.now();
    await assert.rejects(client.acquire(req), ConnectionError);
    const s = await settled(conc, (x) => placesHeld(x) === 0 && x.permits.length === 0, 2_500);
    assert.equal(placesHeld(s), 0, JSON.stringify(s));
    assert.deepEqual(s.permits, []);
    console.log(`timeout, late grant: no place held ${Math.round(performance.now() - started)} ms after the ask (reply 400 ms late)`);
    assert.ok((await new LimiterClient({ url: server.url }).tryAcquire(req)).granted, 'the next caller is served at once');
  });

  test('a tryAcquire that times out is undone by id too; with no window limit the undo carries no costs', async (t) => {
    const proxy = await proxied(t, ({ path }) => (path === '/acquire' ? { delayMs: 400 } : undefined));
    const client = new LimiterClient({ url: proxy.url, timeoutMs: 150 });
    const req = { key: fresh('try-to'), limits: [{ key: fresh('try-to/conc'), concurrent: 1 }] };
    await assert.rejects(client.tryAcquire(req), ConnectionError);
    const undo = await undoOf(proxy, acquires(proxy)[0]);
    assert.deepEqual(undo.body, { id: acquires(proxy)[0].body.id });
  });

  test('an answer that is not the limiter\'s is undone by id; an error the limiter answered is not', async (t) => {
    const proxy = await proxied(t, ({ path, seen }) => {
      if (path !== '/acquire') return undefined;
      if (seen === 0) return { status: 200, body: { granted: 'maybe' } };
      if (seen === 1) return { status: 502, body: 'bad gateway' };
      return { status: 503, body: { error: { code: 'unavailable', message: 'the store cannot commit' } } };
    });
    const client = new LimiterClient({ url: proxy.url });
    const req = { key: fresh('odd'), limits: [{ key: fresh('odd/w'), calls: 5, perMs: 60_000 }] };
    await assert.rejects(client.tryAcquire(req), (e) => e.name === 'ProtocolError');
    await assert.rejects(client.tryAcquire(req), (e) => e.name === 'ApiError' && e.status === 502);
    await assert.rejects(client.tryAcquire(req), (e) => e.name === 'UnavailableError');
    const [garbled, gateway, unavailable] = acquires(proxy);
    await undoOf(proxy, garbled);
    await undoOf(proxy, gateway);
    await sleep(200);
    assert.equal(releases(proxy).filter((e) => e.body.id === unavailable.body.id).length, 0, 'a 503 to an acquire granted nothing');
  });

  test('an abort while a request is in flight rejects at once, undoes it by id, and the late grant is given back', async (t) => {
    const proxy = await proxied(t, ({ path }) => (path === '/acquire' ? { delayMs: 1_000 } : undefined));
    const client = new LimiterClient({ url: proxy.url });
    const conc = fresh('abort-flight/conc');
    const req = { key: fresh('abort-flight'), limits: [{ key: conc, concurrent: 1 }] };
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error('caller gave up')), 100);
    const started = performance.now();
    const err = await client.acquire(req, { signal: ac.signal }).catch((e) => e);
    const took = performance.now() - started;
    assert.ok(err instanceof LimitedError && err.trigger === 'aborted', String(err));
    assert.ok(took < 600, `rejected ${took} ms after the start, the abort at 100 ms, the reply due at 1000 ms`);
    const undo = await undoOf(proxy, acquires(proxy)[0]);
    assert.deepEqual(undo.body, { id: acquires(proxy)[0].body.id });
    // A server without section 16 answers the undo 400 and the client gives the grant back when it
    // comes; one with it frees the place by id. Either way no place outlives the reply by a second.
    const s = await settled(conc, (x) => placesHeld(x) === 0 && x.permits.length === 0, 2_500);
    assert.equal(placesHeld(s), 0, JSON.stringify(s));
    console.log(`abort in flight: rejected ${Math.round(took - 100)} ms after the abort (reply due 900 ms later); undo answered ${undo.status}`);
  });

  test('maxWaitMs ends a wait while a request is in flight, and undoes it by id', async (t) => {
    const proxy = await proxied(t, ({ path }) => (path === '/acquire' ? { hang: true } : undefined));
    const client = new LimiterClient({ url: proxy.url, timeoutMs: 5_000 });
    const req = { key: fresh('mw-flight'), limits: [{ key: fresh('mw-flight/w'), calls: 5, perMs: 60_000 }] };
    const started = performance.now();
    const err = await client.acquire(req, { maxWaitMs: 300 }).catch((e) => e);
    const took = performance.now() - started;
    assert.ok(err instanceof LimitedError && err.trigger === 'maxWait', String(err));
    assert.ok(took >= 290 && took < 1_000, `gave up after ${took} ms`);
    await undoOf(proxy, acquires(proxy)[0]);
    console.log(`maxWaitMs 300 against a hung server: rejected after ${Math.round(took)} ms (timeoutMs 5000)`);
  });

  test('a re-ask with a ticket that times out leaves the line and is undone by id: /state holds no ticket', async (t) => {
    // The first ask files a ticket; the second (with it) is never answered.
    const proxy = await proxied(t, ({ path, seen }) => (path === '/acquire' && seen >= 1 ? { hang: true } : undefined));
    const window = fresh('tk-to/w');
    const req = { key: fresh('tk-to'), limits: [{ key: window, calls: 1, perMs: 400 }] };
    assert.equal((await new LimiterClient({ url: server.url }).tryAcquire(req)).granted, true);
    const client = new LimiterClient({ url: proxy.url, timeoutMs: 600 });
    const err = await client.acquire(req).catch((e) => e);
    assert.ok(err instanceof ConnectionError, String(err));
    const [first, second] = acquires(proxy);
    const ticket = JSON.parse(first.reply).ticket;
    assert.equal(typeof ticket, 'string');
    assert.equal(second.body.ticket, ticket);
    assert.ok(await proxy.waitFor((e) => e.path === '/release' && e.body.ticket === ticket), 'left the line');
    await undoOf(proxy, second);
    const s = await settled(window, (x) => queued(x) === 0);
    assert.equal(queued(s), 0, JSON.stringify(s));
  });

  test('an abort while queued with a ticket leaves the line at once', async (t) => {
    const proxy = await proxied(t);
    const window = fresh('tk-ab/w');
    const req = { key: fresh('tk-ab'), limits: [{ key: window, calls: 1, perMs: 60_000 }] };
    assert.equal((await new LimiterClient({ url: server.url }).tryAcquire(req)).granted, true);
    const ac = new AbortController();
    const pending = new LimiterClient({ url: proxy.url }).acquire(req, { signal: ac.signal, maxWaitMs: 120_000 }).catch((e) => e);
    assert.ok(await proxy.waitFor((e) => e.path === '/acquire' && e.status === 200));
    assert.equal(queued(await state(window)), 1);
    ac.abort();
    assert.ok((await pending) instanceof LimitedError);
    const s = await settled(window, (x) => queued(x) === 0);
    assert.equal(queued(s), 0, JSON.stringify(s));
  });
});

describe('the waits', () => {
  test('5 callers of one shape against a hung server all fail at about one timeout, not 1, 2, 3, 4, 5', async (t) => {
    const proxy = await proxied(t, ({ path }) => (path === '/acquire' ? { hang: true } : undefined));
    const timeoutMs = 1_000;
    const client = new LimiterClient({ url: proxy.url, timeoutMs });
    const req = { key: fresh('hung'), limits: [{ key: fresh('hung/w'), calls: 100, perMs: 60_000 }] };
    const started = performance.now();
    const outcomes = await Promise.all(
      Array.from({ length: 5 }, () => client.acquire(req).then(() => 'granted', (e) => ({ e, at: performance.now() - started }))),
    );
    const times = outcomes.map((o) => Math.round(o.at));
    console.log(`5 waiters of one shape, hung server, timeoutMs ${timeoutMs}: failed at ${times.join(', ')} ms`);
    for (const o of outcomes) assert.ok(o.e instanceof ConnectionError, String(o.e ?? o));
    assert.ok(Math.max(...times) < 1.5 * timeoutMs, `failed at ${times.join(', ')} ms`);
    assert.ok(Math.min(...times) >= timeoutMs - 50, `failed at ${times.join(', ')} ms`);
  });

  test('a head whose connection drops at once does not fail the callers behind it: each asks on its own deadline', async (t) => {
    const proxy = await proxied(t, ({ path, seen }) => (path === '/acquire' && seen === 0 ? { drop: true } : undefined));
    const client = new LimiterClient({ url: proxy.url, timeoutMs: 2_000 });
    const req = { key: fresh('drop'), limits: [{ key: fresh('drop/w'), calls: 100, perMs: 60_000 }] };
    const outcomes = await Promise.all(Array.from({ length: 3 }, () => client.acquire(req).then((p) => p, (e) => e)));
    assert.ok(outcomes[0] instanceof ConnectionError, String(outcomes[0]));
    assert.ok(outcomes.slice(1).every((p) => p.at instanceof Date), String(outcomes.slice(1)));
  });

  test('a caller behind a hung head gives up at its own maxWaitMs, or at once on its abort', async (t) => {
    const proxy = await proxied(t, ({ path }) => (path === '/acquire' ? { hang: true } : undefined));
    const client = new LimiterClient({ url: proxy.url, timeoutMs: 5_000 });
    const req = { key: fresh('behind'), limits: [{ key: fresh('behind/w'), calls: 100, perMs: 60_000 }] };
    const ac = new AbortController();
    const head = client.acquire(req, { signal: ac.signal }).catch((e) => e);
    const started = performance.now();
    const timedOut = await client.acquire(req, { maxWaitMs: 300 }).catch((e) => e);
    const took = performance.now() - started;
    assert.ok(timedOut instanceof LimitedError && timedOut.trigger === 'maxWait', String(timedOut));
    assert.ok(took >= 290 && took < 1_000, `gave up after ${took} ms`);
    const ac2 = new AbortController();
    const behind = client.acquire(req, { signal: ac2.signal }).catch((e) => e);
    await sleep(50);
    const aborted = performance.now();
    ac2.abort();
    assert.ok((await behind) instanceof LimitedError);
    assert.ok(performance.now() - aborted < 300);
    ac.abort();
    assert.ok((await head) instanceof LimitedError);
  });
});

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
