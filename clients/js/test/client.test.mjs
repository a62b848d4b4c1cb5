// Every method of the wire, every typed error, the waiting acquire (its wait, FIFO, maxWaiters,
// maxWaitMs, abort, a late grant given back, a signal shared by many), permits and their disposal,
// the checks made before anything is sent, against the real server.
import assert from 'node:assert/strict';
import { unlinkSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import {
  ApiError,
  BadRequestError,
  NotFoundError,
  ConnectionError,
  InvalidArgumentError,
  LimitedError,
  LimiterClient,
  Permit,
  ProtocolError,
  QueueFullError,
  UnauthorizedError,
  UnavailableError,
} from '../dist/index.mjs';
import { fresh, startServer } from './server.mjs';

let server;
let client;
before(async () => {
  server = await startServer();
  client = new LimiterClient({ url: server.url });
});
after(() => server?.stop());

const pause = (ms) => new Promise((r) => setTimeout(r, ms));
const warnings = [];
process.on('warning', (w) => warnings.push(w));

const windowOf = (key, calls, perMs, extra = {}) => ({ key: fresh(key), limits: [{ key: fresh(`${key}/w`), calls, perMs, ...extra }] });
const held = async (req) => (await client.peek(req)).limits[0].held;

test('health names what the server serves; serverNow follows its clock', async () => {
  const health = await client.health();
  assert.equal(health.ok, true);
  await client.peek({ key: fresh('h'), limits: [] });
  assert.ok(Math.abs(client.serverNow() - Date.now()) < 1_000);
});

describe('tryAcquire', () => {
  test('resolves to the wire reply: a grant, then a refusal it does not throw', async () => {
    const req = windowOf('try', 1, 60_000);
    const granted = await client.tryAcquire(req);
    assert.equal(granted.granted, true);
    assert.ok(granted.at instanceof Date);
    assert.equal(granted.permit, undefined);
    const refused = await client.tryAcquire(req);
    assert.equal(refused.granted, false);
    assert.equal(refused.reason, 'rate');
    assert.equal(refused.limit, req.limits[0].key);
    assert.ok(refused.retryAt instanceof Date);
    assert.equal(refused.retryAt.getTime(), granted.at.getTime() + 60_000);
    assert.equal(refused.ticket, undefined, 'tryAcquire never joins the line');
  });

  test('a concurrency grant carries a permit; release frees it once', async () => {
    const req = { key: fresh('c'), limits: [{ key: fresh('c/conc'), concurrent: 1 }] };
    const granted = await client.tryAcquire(req);
    assert.equal(typeof granted.permit, 'string');
    assert.equal((await client.tryAcquire(req)).reason, 'concurrency');
    assert.equal(await client.release(granted.permit), true);
    assert.equal(await client.release(granted.permit), false);
    assert.equal((await client.tryAcquire(req)).granted, true);
  });
});

describe('peek', () => {
  test('decides as acquire would and changes nothing', async () => {
    const req = windowOf('peek', 2, 60_000, { concurrent: 5 });
    const before = await client.peek(req);
    assert.equal(before.fits, true);
    assert.deepEqual(before.limits[0], { key: req.limits[0].key, used: 0, remaining: 2, held: 0, free: 5 });
    await client.tryAcquire(req);
    await client.tryAcquire(req);
    const full = await client.peek(req);
    assert.equal(full.fits, false);
    assert.equal(full.reason, 'rate');
    assert.equal(full.limit, req.limits[0].key);
    assert.ok(full.retryAt > full.now);
    assert.equal(full.limits[0].used, 2);
    assert.equal((await client.peek(req)).limits[0].used, 2, 'peek counts nowhere');
  });
});

describe('settle and release with costs', () => {
  test('settle replaces the estimate in the window; release(costs) settles and frees in one step', async () => {
    const tpm = fresh('tpm');
    const conc = fresh('conc');
    const req = { key: fresh('s'), permit: true, limits: [{ key: tpm, calls: 1000, perMs: 60_000, cost: 800 }, { key: conc, concurrent: 2 }] };
    const permit = await client.acquire(req);
    assert.ok(permit instanceof Permit);
    assert.equal(typeof permit.id, 'string');
    assert.equal((await client.peek({ ...req, limits: [{ key: tpm, calls: 1000, perMs: 60_000, cost: 0 }] })).limits[0].used, 800);
    assert.equal(await permit.settle({ [tpm]: 120 }), true);
    const peekReq = { key: req.key, limits: [{ key: tpm, calls: 1000, perMs: 60_000, cost: 0 }, { key: conc, concurrent: 2 }] };
    assert.equal((await client.peek(peekReq)).limits[0].used, 120);
    assert.equal(await permit.release({ [tpm]: 75 }), true);
    const after = await client.peek(peekReq);
    assert.equal(after.limits[0].used, 75);
    assert.equal(after.limits[1].held, 0);
    assert.equal(await permit.settle({ [tpm]: 1 }), false, 'a released permit settles nothing');
  });

  test('a settle naming a bucket the grant is not in is a BadRequestError naming it', async () => {
    const req = { ...windowOf('bad-settle', 10, 60_000), permit: true };
    const permit = await client.acquire(req);
    await assert.rejects(permit.settle({ 'not-a-bucket': 1 }), (e) => e instanceof BadRequestError && e.status === 400 && /costs/.test(e.message));
    assert.equal(await permit.release(), true);
  });
});

describe('throttle and lift', () => {
  test('a throttle closes the caller until its instant; lift opens it', async () => {
    const req = windowOf('thr', 100, 60_000);
    const until = new Date(Date.now() + 30_000);
    const inForce = await client.throttle(req.key, until);
    assert.ok(inForce instanceof Date);
    assert.ok(Math.abs(inForce.getTime() - until.getTime()) <= 1);
    const refused = await client.tryAcquire(req);
    assert.equal(refused.reason, 'throttle');
    assert.equal(refused.limit, req.key);
    assert.equal(await client.lift(req.key), true);
    assert.equal(await client.lift(req.key), false);
    assert.equal((await client.tryAcquire(req)).granted, true);
    assert.equal(await client.throttle(req.key, Date.now() - 1000), undefined, 'a past until closes nothing');
  });
});

describe('acquire', () => {
  test('waits to the retryAt and is granted', async () => {
    const waits = [];
    const c = new LimiterClient({ url: server.url, onWait: (w) => waits.push(w) });
    const req = windowOf('wait', 1, 400);
    const first = await c.acquire(req);
    const started = Date.now();
    const second = await c.acquire(req);
    const waited = Date.now() - started;
    assert.ok(waited >= 300 && waited < 1500, `waited ${waited} ms`);
    assert.ok(second.at.getTime() >= first.at.getTime() + 400);
    assert.equal(waits.length, 1);
    assert.equal(waits[0].reason, 'rate');
    assert.equal(waits[0].limit, req.limits[0].key);
    assert.equal(second.waitedFor.reason, 'rate');
  });

  test('a waiting acquire asks to join the line (queue: true) and reports; tryAcquire and queue: false never join', async () => {
    const bodies = [];
    const spy = async (url, init) => {
      if (String(url).endsWith('/acquire')) bodies.push(JSON.parse(init.body));
      return fetch(url, init);
    };
    const c = new LimiterClient({ url: server.url, fetch: spy });
    const req = windowOf('spy', 1, 300);
    await c.tryAcquire({ ...req, queue: true, ticket: 't-x' });
    assert.equal(bodies.length, 1);
    assert.equal(bodies[0].queue, undefined);
    assert.equal(bodies[0].ticket, undefined);
    await c.acquire(req);
    const waiting = bodies.splice(0).slice(1);
    assert.ok(waiting.length >= 2, 'the acquire was refused first');
    assert.ok(waiting.every((b) => b.queue === true && b.report === true), JSON.stringify(waiting));
    await c.acquire(req, { queue: false });
    assert.ok(bodies.length >= 2 && bodies.every((b) => b.queue === undefined), JSON.stringify(bodies));
  });

  test('maxWaitMs: rejects with LimitedError naming reason, limit and retryAt, at once when the retryAt lies beyond it', async () => {
    const req = windowOf('max', 1, 60_000);
    await client.acquire(req);
    const started = Date.now();
    const err = await client.acquire(req, { maxWaitMs: 500 }).catch((e) => e);
    assert.ok(err instanceof LimitedError, String(err));
    assert.equal(err.trigger, 'maxWait');
    assert.equal(err.reason, 'rate');
    assert.equal(err.limit, req.limits[0].key);
    assert.ok(err.retryAt instanceof Date && err.retryAt.getTime() > Date.now() + 50_000);
    assert.ok(Date.now() - started < 400, 'it did not sleep towards a retryAt it could not reach');
  });

  test('maxWaitMs: a waiter behind the head of its line gives up at its deadline with the line\'s refusal', async () => {
    const req = { key: fresh('q'), limits: [{ key: fresh('q/conc'), concurrent: 1, holdMs: 60_000 }] };
    const holder = await client.acquire(req);
    const head = client.acquire(req); // waits on concurrency, rechecking
    const started = Date.now();
    const err = await client.acquire(req, { maxWaitMs: 300 }).catch((e) => e);
    const took = Date.now() - started;
    assert.ok(err instanceof LimitedError && err.trigger === 'maxWait', String(err));
    assert.ok(took >= 280 && took < 1000, `gave up after ${took} ms`);
    assert.equal(err.reason, 'concurrency');
    assert.equal(err.limit, req.limits[0].key);
    await holder.release();
    const p = await head;
    await p.release();
  });

  test('an aborted signal stops the wait with LimitedError carrying the refusal and the signal reason', async () => {
    const req = windowOf('abort', 1, 60_000);
    await client.acquire(req);
    const ac = new AbortController();
    const pending = client.acquire(req, { signal: ac.signal });
    setTimeout(() => ac.abort(new Error('caller gave up')), 100);
    const err = await pending.catch((e) => e);
    assert.ok(err instanceof LimitedError, String(err));
    assert.equal(err.trigger, 'aborted');
    assert.equal(err.reason, 'rate');
    assert.equal(err.limit, req.limits[0].key);
    assert.equal(err.cause.message, 'caller gave up');
    const already = await client.acquire(req, { signal: AbortSignal.abort() }).catch((e) => e);
    assert.ok(already instanceof LimitedError && already.trigger === 'aborted');
  });

  test('a grant that arrives after the caller aborted is released, never leaked', async () => {
    let delayed = 0;
    const slowFetch = async (url, init) => {
      const res = await fetch(url, init);
      if (String(url).endsWith('/acquire')) {
        delayed += 1;
        await new Promise((r) => setTimeout(r, 300));
      }
      return res;
    };
    const c = new LimiterClient({ url: server.url, fetch: slowFetch });
    const req = { key: fresh('late'), limits: [{ key: fresh('late/conc'), concurrent: 1 }] };
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    const err = await c.acquire(req, { signal: ac.signal }).catch((e) => e);
    assert.ok(err instanceof LimitedError && err.trigger === 'aborted');
    assert.equal(err.reason, undefined, 'no answer had come');
    assert.equal(delayed, 1);
    for (let i = 0; i < 50 && (await held(req)) !== 0; i++) await new Promise((r) => setTimeout(r, 50));
    assert.equal(await held(req), 0);
  });

  test('callers of one shape are served first in, first out: a large call is not overtaken by small ones', async () => {
    const bucket = fresh('fifo/tpm');
    const key = fresh('fifo');
    const req = (cost) => ({ key, limits: [{ key: bucket, calls: 10, perMs: 500, cost }] });
    await client.acquire(req(8));
    const order = [];
    const large = client.acquire(req(10)).then(() => order.push('large'));
    await new Promise((r) => setTimeout(r, 20));
    const smalls = [1, 2, 3].map((i) => client.acquire(req(1)).then(() => order.push(`small${i}`)));
    await Promise.all([large, ...smalls]);
    assert.equal(order[0], 'large');
  });

  test('maxWaiters: QueueFullError when that many already wait for the shape', async () => {
    const req = { key: fresh('full'), limits: [{ key: fresh('full/conc'), concurrent: 1 }] };
    const holder = await client.acquire(req);
    const ac = new AbortController();
    const waiting = client.acquire(req, { signal: ac.signal, maxWaiters: 1 }).catch((e) => e);
    const err = await client.acquire(req, { maxWaiters: 1 }).catch((e) => e);
    assert.ok(err instanceof QueueFullError, String(err));
    assert.equal(err.waiting, 1);
    ac.abort();
    assert.ok((await waiting) instanceof LimitedError);
    await holder.release();
  });

  test('sleeps on the server clock: a host clock an hour ahead still waits once, the right time', async () => {
    const realNow = Date.now;
    const waits = [];
    const c = new LimiterClient({ url: server.url, onWait: (w) => waits.push(w) });
    const req = windowOf('skew', 1, 500);
    await c.acquire(req);
    Date.now = () => realNow() + 3_600_000;
    try {
      await c.acquire(req);
    } finally {
      Date.now = realNow;
    }
    assert.equal(waits.length, 1, JSON.stringify(waits));
    // The time it waited, as measured: about the 500 ms window, nowhere near the hour its clock is off.
    assert.ok(waits[0].waitedMs > 50 && waits[0].waitedMs < 900, JSON.stringify(waits));
  });

  test('without a now on the reply, the HTTP Date header sizes the wait (to within its second)', async () => {
    const realNow = Date.now;
    const stripNow = async (url, init) => {
      const res = await fetch(url, init);
      const body = await res.json();
      delete body.now;
      return new Response(JSON.stringify(body), { status: res.status, headers: res.headers });
    };
    const waits = [];
    const c = new LimiterClient({ url: server.url, fetch: stripNow, onWait: (w) => waits.push(w) });
    const req = windowOf('date', 1, 1500);
    await c.acquire(req);
    Date.now = () => realNow() - 3_600_000;
    const started = performance.now();
    try {
      await c.acquire(req);
    } finally {
      Date.now = realNow;
    }
    const took = performance.now() - started;
    assert.ok(waits.length >= 1 && waits.length <= 3, JSON.stringify(waits));
    assert.ok(took >= 1000 && took < 3000, `took ${took} ms`);
  });

  test('more than 10 acquires sharing one AbortSignal print no EventTarget memory-leak warning', async () => {
    const client = new LimiterClient({ url: server.url });
    const conc = fresh('shared-signal/conc');
    const req = { key: fresh('shared-signal'), limits: [{ key: conc, concurrent: 1 }] };
    const holder = await client.acquire(req);
    const ac = new AbortController();
    const before = warnings.length;
    const shared = [
      ...Array.from({ length: 12 }, () => client.acquire(req, { signal: ac.signal }).catch((e) => e)),
      ...Array.from({ length: 12 }, (_, i) => client.acquire({ key: fresh('ss'), limits: [{ key: `${conc}-${i}`, concurrent: 1 }] }, { signal: ac.signal }).then((p) => p.release())),
    ];
    await pause(400);
    ac.abort();
    const outcomes = await Promise.all(shared);
    assert.ok(outcomes.slice(0, 12).every((e) => e instanceof LimitedError));
    await holder.release();
    await pause(50);
    const leaks = warnings.slice(before).filter((w) => w.name === 'MaxListenersExceededWarning' || /memory leak/.test(w.message));
    assert.deepEqual(leaks.map((w) => w.message), []);
  });
});

describe('permits', () => {
  test('release(costs?) is idempotent: one request, the same answer', async () => {
    const req = { key: fresh('idem'), limits: [{ key: fresh('idem/conc'), concurrent: 3 }] };
    const permit = await client.acquire(req);
    assert.equal(await held(req), 1);
    const [a, b] = await Promise.all([permit.release(), permit.release()]);
    assert.equal(a, true);
    assert.equal(b, true);
    assert.equal(await permit.release(), true);
    assert.equal(permit.released, true);
    assert.equal(await held(req), 0);
  });

  test('Symbol.asyncDispose releases (what await using calls)', async () => {
    const req = { key: fresh('disp'), limits: [{ key: fresh('disp/conc'), concurrent: 1 }] };
    {
      const permit = await client.acquire(req);
      assert.equal(await held(req), 1);
      await permit[Symbol.asyncDispose]();
    }
    assert.equal(await held(req), 0);
  });

  test('withPermit releases after fn, when it throws too, and keeps a release(costs) made inside', async () => {
    const tpm = fresh('wp/tpm');
    const conc = fresh('wp/conc');
    const req = { key: fresh('wp'), permit: true, limits: [{ key: tpm, calls: 100, perMs: 60_000, cost: 50 }, { key: conc, concurrent: 1 }] };
    const peekReq = { key: req.key, limits: [{ key: tpm, calls: 100, perMs: 60_000, cost: 0 }, { key: conc, concurrent: 1 }] };
    const out = await client.withPermit(req, async (p) => {
      assert.equal((await client.peek(peekReq)).limits[1].held, 1);
      await p.release({ [tpm]: 7 });
      return 'done';
    });
    assert.equal(out, 'done');
    assert.equal((await client.peek(peekReq)).limits[0].used, 7);
    await assert.rejects(client.withPermit(req, async () => { throw new Error('boom'); }), /boom/);
    assert.equal((await client.peek(peekReq)).limits[1].held, 0);
  });
});

describe('errors', () => {
  test('a bad field is a BadRequestError whose message names it, and changes nothing', async () => {
    const err = await client.throttle(fresh('t'), Date.now() + 2 * 86_400_000).catch((e) => e);
    assert.ok(err instanceof BadRequestError, String(err));
    assert.equal(err.code, 'bad_request');
    assert.match(err.message, /until/);
    // A limit out of the wire's bounds is caught before sending, in the words the server uses.
    const req = { key: fresh('bad'), limits: [{ key: fresh('bad/w'), calls: 1, perMs: 0 }] };
    const res = await fetch(`${server.url}/acquire`, { method: 'POST', body: JSON.stringify(req) });
    assert.equal(res.status, 400);
    const { error } = await res.json();
    const local = await client.tryAcquire(req).catch((e) => e);
    assert.ok(local instanceof InvalidArgumentError && local.field === 'limits[0].perMs', String(local));
    assert.ok(local.message.startsWith(error.message), `${local.message} / ${error.message}`);
    await assert.rejects(client.acquire(req), InvalidArgumentError);
  });

  test('bad arguments are InvalidArgumentErrors naming the field, before anything is sent', async () => {
    assert.throws(() => new LimiterClient({ url: 'not a url' }), (e) => e instanceof InvalidArgumentError && e.field === 'url');
    assert.throws(() => new LimiterClient({ url: server.url, timeoutMs: -1 }), (e) => e.field === 'timeoutMs');
    await assert.rejects(client.acquire(windowOf('arg', 1, 1000), { maxWaitMs: -5 }), (e) => e instanceof InvalidArgumentError && e.field === 'maxWaitMs');
    await assert.rejects(client.throttle('k', new Date(NaN)), (e) => e.field === 'until');
    await assert.rejects(client.settle('p-x', null), (e) => e.field === 'costs');
  });

  test('a server with a token: UnauthorizedError without it, every method with it', async () => {
    const locked = await startServer({ token: 'sesame' });
    try {
      const req = windowOf('auth', 5, 60_000);
      const anon = new LimiterClient({ url: locked.url });
      const err = await anon.tryAcquire(req).catch((e) => e);
      assert.ok(err instanceof UnauthorizedError && err.status === 401, String(err));
      const authed = new LimiterClient({ url: locked.url, token: 'sesame' });
      assert.equal((await authed.tryAcquire(req)).granted, true);
      assert.equal((await authed.peek(req)).limits[0].used, 1);
    } finally {
      await locked.stop();
    }
  });

  test('an unknown path is a NotFoundError; a body over 64 KiB an ApiError 413', async () => {
    const wrongPath = new LimiterClient({ url: `${server.url}/not-the-wire` });
    const notFound = await wrongPath.tryAcquire(windowOf('nf', 1, 1000)).catch((e) => e);
    assert.ok(notFound instanceof NotFoundError && notFound.status === 404 && notFound.code === 'not_found', String(notFound));
    // Unknown fields go as they are (the wire ignores them), so they can make a body too large.
    const huge = { key: fresh('huge'), limits: [{ key: fresh('huge/w'), calls: 1, perMs: 1000 }], padding: 'x'.repeat(70 * 1024) };
    const tooLarge = await client.tryAcquire(huge).catch((e) => e);
    assert.ok(tooLarge instanceof ApiError && tooLarge.status === 413 && tooLarge.code === 'payload_too_large', String(tooLarge));
  });

  test('unreachable: ConnectionError; a reply the wire does not allow: ProtocolError', async () => {
    const gone = await startServer();
    const url = gone.url;
    await gone.stop();
    await assert.rejects(new LimiterClient({ url }).tryAcquire(windowOf('gone', 1, 1000)), ConnectionError);
    const garbage = async () => new Response('{"granted":"maybe"}', { status: 200 });
    await assert.rejects(new LimiterClient({ url, fetch: garbage }).tryAcquire(windowOf('g', 1, 1000)), ProtocolError);
  });

  test('a server whose file is gone answers UnavailableError, and grants nothing', async () => {
    const doomed = await startServer();
    try {
      const c = new LimiterClient({ url: doomed.url });
      const req = windowOf('gone', 100, 60_000);
      assert.equal((await c.tryAcquire(req)).granted, true);
      unlinkSync(doomed.path);
      let err;
      for (let i = 0; i < 60 && !err; i++) {
        err = await c.tryAcquire(req).then(() => undefined, (e) => e);
        if (!err) await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok(err instanceof UnavailableError, String(err));
      assert.equal(err.status, 503);
      assert.equal(err.code, 'unavailable');
    } finally {
      await doomed.stop();
    }
  });

  test('limits are checked before anything is sent: InvalidArgumentError naming limits[i].field', async () => {
    let sent = 0;
    const counting = async (url, init) => {
      sent += 1;
      return fetch(url, init);
    };
    const client = new LimiterClient({ url: server.url, fetch: counting });
    const w = (extra) => ({ key: 'b', calls: 5, perMs: 1_000, ...extra });
    const surrogate = 'a\uD800b';
    const cases = [
      [{ limits: [w({ calls: -1 })] }, 'limits[0].calls'],
      [{ limits: [w({ calls: Number.NaN })] }, 'limits[0].calls'],
      [{ limits: [w({ calls: 1.5 })] }, 'limits[0].calls'],
      [{ limits: [w({ calls: '5' })] }, 'limits[0].calls'],
      [{ limits: [w({ calls: 1e10 })] }, 'limits[0].calls'],
      [{ limits: [w({ perMs: 0 })] }, 'limits[0].perMs'],
      [{ limits: [{ key: 'b', calls: 5 }] }, 'limits[0].perMs'],
      [{ limits: [{ key: 'b', perMs: 5 }] }, 'limits[0].calls'],
      [{ limits: [{ key: 'b', concurrent: 0 }] }, 'limits[0].concurrent'],
      [{ limits: [{ key: 'b', concurrent: 2, holdMs: -5 }] }, 'limits[0].holdMs'],
      [{ limits: [w(), { key: 'c', calls: 1, perMs: 1, cost: -1 }] }, 'limits[1].cost'],
      [{ limits: [{ key: 'b' }] }, 'limits[0]'],
      [{ limits: [null] }, 'limits[0]'],
      [{ limits: ['b'] }, 'limits[0]'],
      [{ limits: [w(), w()] }, 'limits[1].key'],
      [{ limits: Array.from({ length: 65 }, (_, i) => w({ key: `b${i}` })) }, 'limits'],
      [{ limits: [w({ key: surrogate })] }, 'limits[0].key'],
      [{ limits: [w({ key: '' })] }, 'limits[0].key'],
      [{ limits: [w({ key: 'x'.repeat(513) })] }, 'limits[0].key'],
      [{ key: surrogate, limits: [w()] }, 'key'],
      [{ key: '', limits: [w()] }, 'key'],
      [{ cost: 1.5, limits: [w()] }, 'cost'],
      [{ cost: -1, limits: [w()] }, 'cost'],
      [{ holdMs: 0, limits: [w()] }, 'holdMs'],
      [{ graceMs: 50, limits: [w()] }, 'graceMs'],
      [{ permit: 'yes', limits: [w()] }, 'permit'],
      // Token buckets (wire section 13).
      [{ limits: [{ key: 'b', refill: 0, perMs: 1_000 }] }, 'limits[0].refill'],
      [{ limits: [{ key: 'b', refill: 1e9 + 1, perMs: 1_000 }] }, 'limits[0].refill'],
      [{ limits: [{ key: 'b', refill: 2.5, perMs: 1_000 }] }, 'limits[0].refill'],
      [{ limits: [{ key: 'b', refill: 5 }] }, 'limits[0].perMs'],
      [{ limits: [w({ refill: 5 })] }, 'limits[0].refill'],
      [{ limits: [{ key: 'b', refill: 5, perMs: 1_000, burst: 0 }] }, 'limits[0].burst'],
      [{ limits: [{ key: 'b', refill: 5, perMs: 1_000, initial: 6 }] }, 'limits[0].initial'],
      [{ limits: [{ key: 'b', refill: 5, perMs: 1_000, burst: 9, initial: 10 }] }, 'limits[0].initial'],
      [{ limits: [{ key: 'b', refill: 5, perMs: 1_000, initial: -1 }] }, 'limits[0].initial'],
      [{ limits: [w({ burst: 5 })] }, 'limits[0].burst'],
      [{ limits: [w({ initial: 0 })] }, 'limits[0].initial'],
      [{ limits: [{ key: 'b', concurrent: 1, burst: 5 }] }, 'limits[0].burst'],
    ];
    for (const [overrides, field] of cases) {
      const req = { key: 'k', ...overrides };
      for (const call of [() => client.tryAcquire(req), () => client.acquire(req), () => client.peek(req)]) {
        const err = await call().catch((e) => e);
        assert.ok(err instanceof InvalidArgumentError, `${JSON.stringify(overrides).slice(0, 80)}: ${err}`);
        assert.equal(err.field, field, err.message);
        assert.ok(err.message.startsWith(field), err.message);
      }
    }
    assert.equal(sent, 0, 'nothing reached the server');
    // The bounds themselves are accepted.
    const edge = { key: fresh('edge'), cost: 0, holdMs: 86_400_000, limits: [{ key: fresh('edge/w'), calls: 1e9, perMs: 2_678_400_000, cost: 1e9, concurrent: 1e6, holdMs: 1 }] };
    assert.equal((await client.tryAcquire(edge)).granted, true);
    const sixtyFour = { key: fresh('64'), limits: Array.from({ length: 64 }, (_, i) => ({ key: fresh(`64/${i}`), calls: 1, perMs: 1_000 })) };
    assert.equal((await client.peek(sixtyFour)).limits.length, 64);
  });

  test('a URL with a trailing slash, a query or a fragment still reaches the wire\'s paths', async () => {
    for (const suffix of ['/', '/?x=1', '?x=1', '//', '#top', '/?x=1#top']) {
      const client = new LimiterClient({ url: `${server.url}${suffix}` });
      const reply = await client.tryAcquire({ key: fresh('url'), limits: [{ key: fresh('url/w'), calls: 1, perMs: 1_000 }] });
      assert.equal(reply.granted, true, suffix);
      assert.equal(client.url, server.url, suffix);
    }
  });
});

describe('adaptive ceilings (wire section 14)', () => {
  const limitsOf = (key, adapt = {}) => [{ key: `${key}/rpm`, calls: 10, perMs: 60_000, adapt }];

  test('adapt is checked before anything is sent, naming limits[i].adapt.field', async () => {
    const bad = async (adapt, field, pattern, extra = {}) => {
      await assert.rejects(
        client.acquire({ key: 'a', limits: [{ key: 'b', calls: 10, perMs: 1000, ...extra, adapt }] }),
        (e) => e instanceof InvalidArgumentError && e.field === field && pattern.test(e.message),
      );
    };
    await bad({ min: 0 }, 'limits[0].adapt.min', /1 to 10/);
    await bad({ min: 11 }, 'limits[0].adapt.min', /1 to 10/);
    await bad({ max: 9 }, 'limits[0].adapt.max', /10 to 1000000000/);
    await bad({ increase: -1 }, 'limits[0].adapt.increase', /0 to 1000000/);
    await bad({ keepPct: 100 }, 'limits[0].adapt.keepPct', /1 to 99/);
    await bad({ keepPct: 50.5 }, 'limits[0].adapt.keepPct', /integer/);
    await bad({ step: 1 }, 'limits[0].adapt.step', /not a field of adapt/);
    await bad(true, 'limits[0].adapt', /must be an object/);
    await assert.rejects(
      client.acquire({ key: 'a', limits: [{ key: 'b', concurrent: 2, adapt: {} }] }),
      (e) => e instanceof InvalidArgumentError && e.field === 'limits[0].adapt' && /window .* or a token bucket/.test(e.message),
    );
    await assert.rejects(client.release('p', undefined, { outcome: 'fine' }), (e) => e instanceof InvalidArgumentError && e.field === 'outcome');
  });

  test('the ceiling starts at calls, is reported, and a limited release cuts it once for every grant before the cut', async () => {
    const key = fresh('adapt-cut');
    const limits = limitsOf(key, { min: 2, keepPct: 50 });
    const a = await client.acquire({ key, limits });
    const b = await client.acquire({ key, limits });
    assert.ok(a.id && b.id, 'an adapted request asks for a permit by itself');
    assert.equal(a.adapted, true);
    assert.equal(a.limits[0].ceiling, 10);
    assert.equal(await a.release(undefined, { outcome: 'limited' }), true);
    assert.equal((await client.peek({ key, limits })).limits[0].ceiling, 5);
    // b was granted before that cut: its 429 belongs to the same overload.
    await b.release(undefined, { outcome: 'limited' });
    assert.equal((await client.peek({ key, limits })).limits[0].ceiling, 5);
    // A grant after the cut cuts again, down to min.
    const c = await client.acquire({ key, limits });
    await c.settle({ [`${key}/rpm`]: 1 }, { outcome: 'limited' });
    assert.equal((await client.peek({ key, limits })).limits[0].ceiling, 2);
    // A later outcome of the same permit changes nothing; c's release is clean by default.
    await c.release();
    assert.equal((await client.peek({ key, limits })).limits[0].ceiling, 2);
  });

  test('throttleFrom with the permit: a 429 closes the caller and cuts; observe reads a low remaining count as limited', async () => {
    const key = fresh('adapt-throttle');
    const limits = limitsOf(key, { keepPct: 40 });
    const p = await client.acquire({ key, limits });
    const response = new Response('{}', { status: 429, headers: { 'retry-after': '1' } });
    assert.ok(await client.throttleFrom(key, response, { permit: p }));
    assert.equal(p.outcome, 'limited');
    const peek = await client.peek({ key, limits });
    assert.equal(peek.reason, 'throttle');
    assert.equal(peek.limits[0].ceiling, 4);
    await p.release();
    await client.lift(key);

    const q = await client.acquire({ key, limits });
    assert.equal(q.observe({ status: 200, headers: { 'x-ratelimit-remaining-requests': '12' } }, { floor: 3 }), 'clean');
    assert.equal(q.observe({ status: 200, headers: { 'anthropic-ratelimit-requests-remaining': '3' } }, { floor: 3 }), 'limited');
    assert.equal(q.observe({ status: 200, headers: {} }), 'clean');
    assert.equal(q.outcome, 'limited', 'limited stays');
    assert.equal(q.observe({ status: 500, headers: {} }), undefined);
    await q.release();
    assert.equal((await client.peek({ key, limits })).limits[0].ceiling, 1);
  });

  test('withPermit: a call that throws reports no clean outcome; one that returns does', async () => {
    const key = fresh('adapt-with');
    const sent = [];
    const spy = new LimiterClient({
      url: server.url,
      fetch: (url, init) => {
        if (String(url).endsWith('/release')) sent.push(JSON.parse(init.body));
        return fetch(url, init);
      },
    });
    const limits = limitsOf(key);
    await assert.rejects(spy.withPermit({ key, limits }, () => Promise.reject(new Error('provider down'))), /provider down/);
    await spy.withPermit({ key, limits }, () => 'ok');
    assert.deepEqual(sent.map((b) => b.outcome), [undefined, 'clean']);
  });
});
