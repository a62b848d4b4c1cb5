// The line holds no host hostage (section 12.9 of the wire): every ask in the line carries what
// remains of the caller's `maxWaitMs`, and a refusal that files no ticket says why (`noTicket`).
// First against a scripted `fetch` (no server): the bodies sent and the replies read. Then against
// the real server, in the "12.9" block.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LimitedError, LimiterClient } from '../dist/index.mjs';
import { fresh, startServer } from './server.mjs';

const LIMITS = [{ key: 'k/rpm', calls: 1, perMs: 60_000 }];
const REQUEST = { key: 'k', limits: LIMITS };

/**
 * A `fetch` that answers each `/acquire` with the next of `replies` (a function of the limiter's
 * `now`, in epoch ms), `/release` with `released`, and `/wait` with 404 (a server without waits,
 * so the client sleeps to each `retryAt`); `sent` records every body by path.
 */
function scripted(replies) {
  const sent = { acquire: [], release: [], wait: [] };
  let next = 0;
  const fetch = async (url, init) => {
    const path = new URL(url).pathname.slice(1);
    sent[path].push(JSON.parse(init.body));
    if (path === 'wait') return new Response('{"error":{"code":"not_found","message":"no such path"}}', { status: 404 });
    const now = Date.now();
    const body = path === 'release' ? { released: true } : { now: new Date(now).toISOString(), ...replies[next++](now) };
    return new Response(JSON.stringify(body), { status: 200, headers: { 'content-type': 'application/json' } });
  };
  return { fetch, sent };
}

const at = (ms) => new Date(ms).toISOString();
const granted = (now) => ({ granted: true, at: at(now) });
const refused = (inMs, extra = {}) => (now) => ({ granted: false, retryAt: at(now + inMs), reason: 'rate', limit: 'k/rpm', ...extra });
const ticketed = (inMs, ticket) => refused(inMs, { ticket, lapseAt: at(Date.now() + inMs + 2000), ahead: 0 });

describe('maxWaitMs and noTicket on the wire (no server)', () => {
  test('every ask in the line carries the remaining maxWaitMs, in whole ms rounded up', async () => {
    const { fetch, sent } = scripted([ticketed(60, 't-1'), ticketed(60, 't-1'), granted]);
    await new LimiterClient({ url: 'http://limiter.test', fetch }).acquire(REQUEST, { maxWaitMs: 5_000 });
    const waits = sent.acquire.map((b) => b.maxWaitMs);
    assert.equal(waits.length, 3);
    assert.ok(waits.every((w) => Number.isInteger(w)), JSON.stringify(waits));
    assert.ok(waits[0] <= 5_000 && waits[0] > 4_900, JSON.stringify(waits));
    assert.ok(waits[1] <= waits[0] - 50 && waits[2] <= waits[1] - 50, `it counts down: ${JSON.stringify(waits)}`);
    assert.equal(sent.acquire[0].queue, true);
    assert.equal(sent.acquire[1].ticket, 't-1');
  });

  test('maxWaitMs is clamped to the wire\'s 1 to 86400000', async () => {
    const { fetch, sent } = scripted([granted, granted]);
    const client = new LimiterClient({ url: 'http://limiter.test', fetch });
    await client.acquire(REQUEST, { maxWaitMs: 0 });
    await client.acquire(REQUEST, { maxWaitMs: 7 * 86_400_000 });
    assert.deepEqual(sent.acquire.map((b) => b.maxWaitMs), [1, 86_400_000]);
  });

  test('no maxWaitMs without a maximum wait, without the line, or from tryAcquire', async () => {
    const { fetch, sent } = scripted([granted, granted, granted]);
    const client = new LimiterClient({ url: 'http://limiter.test', fetch });
    await client.acquire(REQUEST);
    await client.acquire(REQUEST, { maxWaitMs: 5_000, queue: false });
    await client.tryAcquire(REQUEST);
    assert.deepEqual(sent.acquire.map((b) => 'maxWaitMs' in b), [false, false, false]);
  });

  test('a refusal\'s noTicket is read as \'horizon\' or \'full\'; absent, or a cause this client does not know, is undefined', async () => {
    const { fetch } = scripted([refused(100, { noTicket: 'horizon' }), refused(100, { noTicket: 'full' }), refused(100), refused(100, { noTicket: 'weather' })]);
    const client = new LimiterClient({ url: 'http://limiter.test', fetch });
    const replies = [];
    for (let i = 0; i < 4; i++) replies.push(await client.tryAcquire(REQUEST));
    assert.deepEqual(replies.map((r) => r.noTicket), ['horizon', 'full', undefined, undefined]);
    assert.ok(replies.every((r) => r.ticket === undefined));
  });

  test('noTicket \'horizon\' with a retryAt beyond maxWaitMs rejects at once with LimitedError naming it', async () => {
    const { fetch, sent } = scripted([refused(60_000, { noTicket: 'horizon' })]);
    const started = performance.now();
    const err = await new LimiterClient({ url: 'http://limiter.test', fetch }).acquire(REQUEST, { maxWaitMs: 5_000 }).catch((e) => e);
    assert.ok(performance.now() - started < 500, 'it did not sleep towards the retryAt');
    assert.ok(err instanceof LimitedError, String(err));
    assert.equal(err.trigger, 'maxWait');
    assert.equal(err.noTicket, 'horizon');
    assert.equal(err.reason, 'rate');
    assert.match(err.message, /no ticket \(horizon\)/);
    assert.equal(sent.release.length, 0, 'no ticket was filed, so there is none to leave');
  });

  test('after a noTicket refusal the client presents no stale ticket: it asks again with queue: true alone', async () => {
    const { fetch, sent } = scripted([ticketed(30, 't-1'), refused(30, { noTicket: 'full' }), ticketed(30, 't-2'), granted]);
    const waits = [];
    const permit = await new LimiterClient({ url: 'http://limiter.test', fetch, onWait: (w) => waits.push(w) }).acquire(REQUEST, { maxWaitMs: 5_000 });
    const asks = sent.acquire.map(({ queue, ticket }) => ({ queue, ticket }));
    assert.deepEqual(asks, [
      { queue: true, ticket: undefined },
      { queue: true, ticket: 't-1' },
      { queue: true, ticket: undefined },
      { queue: true, ticket: 't-2' },
    ]);
    assert.equal(waits[1].ahead, undefined, 'holding no ticket, it reports no place in line');
    assert.equal(permit.waitedFor.reason, 'rate');
  });

  test('a noTicket refusal that comes after the caller gave up leaves nothing to release', async () => {
    const { fetch, sent } = scripted([refused(60_000, { noTicket: 'horizon' })]);
    const ac = new AbortController();
    const pending = new LimiterClient({ url: 'http://limiter.test', fetch }).acquire(REQUEST, { signal: ac.signal });
    await new Promise((r) => setTimeout(r, 50));
    ac.abort();
    const err = await pending.catch((e) => e);
    assert.ok(err instanceof LimitedError && err.trigger === 'aborted', String(err));
    assert.equal(err.noTicket, 'horizon');
    assert.equal(sent.release.length, 0);
  });
});

describe('12.9: the line files no ticket beyond a host\'s horizon (real server)', () => {
  let server;
  before(async () => {
    server = await startServer();
  });
  after(() => server?.stop());

  /** A client whose every `/acquire` and `/release` is recorded, with the reply. */
  function spied() {
    const seen = [];
    const fetch = async (url, init) => {
      const res = await globalThis.fetch(url, init);
      const path = new URL(url).pathname.slice(1);
      if (path === 'acquire' || path === 'release') seen.push({ path, sent: JSON.parse(init.body), got: await res.clone().json() });
      return res;
    };
    return { client: new LimiterClient({ url: server.url, fetch }), seen };
  }

  async function usedUp(perMs) {
    const req = { key: fresh('h'), limits: [{ key: fresh('h/w'), calls: 1, perMs }] };
    assert.equal((await new LimiterClient({ url: server.url }).tryAcquire(req)).granted, true);
    return req;
  }

  async function queued(req) {
    const figures = (await new LimiterClient({ url: server.url }).peek(req)).limits[0];
    return figures.queued ?? 0;
  }

  test('a call its maxWaitMs cannot cover files no ticket (noTicket horizon) and rejects at once', async () => {
    const req = await usedUp(60_000);
    const { client, seen } = spied();
    const started = performance.now();
    const err = await client.acquire(req, { maxWaitMs: 1_000 }).catch((e) => e);
    const took = performance.now() - started;
    assert.ok(err instanceof LimitedError && err.trigger === 'maxWait', String(err));
    assert.ok(took < 500, `gave up after ${took} ms`);
    assert.equal(err.noTicket, 'horizon');
    assert.equal(err.reason, 'rate');
    const asks = seen.filter((x) => x.path === 'acquire');
    assert.equal(asks.length, 1, JSON.stringify(seen));
    assert.equal(asks[0].sent.queue, true);
    assert.ok(asks[0].sent.maxWaitMs >= 1 && asks[0].sent.maxWaitMs <= 1_000, JSON.stringify(asks[0].sent));
    assert.equal(asks[0].got.noTicket, 'horizon');
    assert.equal(asks[0].got.ticket, undefined);
    assert.equal(seen.filter((x) => x.path === 'release').length, 0, 'no ticket to leave');
    assert.equal(await queued(req), 0);
  });

  test('without a maxWaitMs the server\'s horizon (300 s by default) stands: a call 10 minutes out files no ticket', async () => {
    const req = await usedUp(600_000);
    const { client, seen } = spied();
    const ac = new AbortController();
    const pending = client.acquire(req, { signal: ac.signal }).catch((e) => e);
    for (let i = 0; i < 200 && !seen.some((x) => x.path === 'acquire'); i++) await new Promise((r) => setTimeout(r, 10));
    ac.abort();
    const err = await pending;
    assert.ok(err instanceof LimitedError && err.trigger === 'aborted', String(err));
    const [ask] = seen.filter((x) => x.path === 'acquire');
    assert.equal(ask.sent.queue, true);
    assert.equal('maxWaitMs' in ask.sent, false, 'no maximum wait: none sent');
    assert.equal(ask.got.noTicket, 'horizon');
    assert.equal(ask.got.ticket, undefined);
    assert.equal(err.noTicket, 'horizon');
    assert.equal(await queued(req), 0);
  });

  test('a call within its maxWaitMs still takes a ticket and is served with it', async () => {
    const req = await usedUp(500);
    const { client, seen } = spied();
    const permit = await client.acquire(req, { maxWaitMs: 5_000 });
    assert.ok(permit.waitedMs > 0);
    const asks = seen.filter((x) => x.path === 'acquire');
    assert.ok(asks.length >= 2, JSON.stringify(asks));
    const ticket = asks[0].got.ticket;
    assert.equal(typeof ticket, 'string');
    assert.equal(asks[0].got.noTicket, undefined);
    for (const ask of asks.slice(1)) assert.equal(ask.sent.ticket, ticket, 'asked again with its ticket');
    const waits = asks.map((x) => x.sent.maxWaitMs);
    assert.ok(waits[0] <= 5_000 && waits.every((w, i) => i === 0 || w < waits[i - 1]), JSON.stringify(waits));
    assert.equal(asks.at(-1).got.granted, true);
  });
});
