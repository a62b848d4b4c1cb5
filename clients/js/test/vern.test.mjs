// A real VernLLM (the published package) against the test's own OpenAI-compatible provider,
// with our adapter: in two Node processes, one requestsPerMinute and tokensPerMinute shared by
// both, and in this process, each of VernLLM's own behaviours as VernLLM's limiter has it (its
// options, a provider's wait, its error codes, its queue's count, its events, a limiter outage).
// Short windows stand in for the minute so it runs in seconds.
import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { LLMError, RateLimiter, VernLLM, fromFetch } from 'vern-llm';
import { InvalidArgumentError, LimiterClient, vernRateLimit } from '../dist/index.mjs';
import { fresh, startServer } from './server.mjs';
import { busiest, runWorker, startFakeProvider } from './vern-fake.mjs';

let server;
let provider;
let client;
before(async () => {
  server = await startServer();
  client = new LimiterClient({ url: server.url });
  // Phase "limits": 150 real tokens a call (the estimate is 200); phase "usage": 10, 17, 24, ...;
  // phase "429-N": a 429 with `Retry-After: N`.
  provider = await startFakeProvider((_req, n, headers) => {
    const phase = headers['x-phase'] ?? '';
    const retryAfter = /^429-(\d+)$/.exec(phase);
    if (retryAfter) return { status: 429, headers: { 'retry-after': retryAfter[1] } };
    // "slow-429": a 429 (asking 1 s) held 1.5 s, so that calls granted together meet it together.
    if (phase === 'slow-429') return { status: 429, headers: { 'retry-after': '1' }, delayMs: 1_500 };
    // "remaining-N": a success saying N requests remain in the provider's window.
    const remaining = /^remaining-(\d+)$/.exec(phase);
    if (remaining) return { total: 150, headers: { 'x-ratelimit-remaining-requests': remaining[1], 'x-ratelimit-limit-requests': '100' } };
    return phase === 'usage' ? 10 + 7 * n : 150;
  });
});
after(async () => {
  await provider?.close();
  await server?.stop();
});

/** VernLLM's client of the test's provider, in `phase`; `delayMs` before each request. */
function providerClient(phase, delayMs = 0) {
  return fromFetch({
    url: provider.url,
    headers: { 'x-phase': phase },
    request: async (url, init) => {
      if (delayMs > 0) await sleep(delayMs);
      return fetch(url, init);
    },
    mapRequest: (request) => request,
    mapResponse: (json) => ({
      content: json.choices[0].message.content,
      usage: { promptTokens: json.usage.prompt_tokens, completionTokens: json.usage.completion_tokens, totalTokens: json.usage.total_tokens },
    }),
  });
}

/** A VernLLM over `llmClient` limited by `rateLimit`; `events` collects its `rate_limited` events. */
function vern(llmClient, rateLimit, { maxRetries = 0, events } = {}) {
  return new VernLLM({
    client: llmClient,
    model: 'fake-model',
    maxRetries,
    baseDelayMs: 10,
    rateLimit,
    ...(events ? { onEvent: (e) => e.kind === 'rate_limited' && events.push(e) } : {}),
  });
}

const ask = (llm, chars = 400, maxTokens = 100) => llm.call({ userContent: 'x'.repeat(chars), jsonMode: false, maxTokens });

test('two processes together never exceed the shared requests or tokens per window', async () => {
  const key = fresh('vern-limits');
  const [rpm, tpm, windowMs] = [5, 700, 1000];
  const common = { LIMITER_URL: server.url, PROVIDER_URL: provider.url, KEY: key, RPM: rpm, TPM: tpm, WINDOW_MS: windowMs, PHASE: 'limits', CALLS: 8, CONTENT_CHARS: 400, MAX_TOKENS: 100 };
  const started = Date.now();
  const [a, b] = await Promise.all([runWorker({ ...common, WORKER: 'a' }), runWorker({ ...common, WORKER: 'b' })]);
  const calls = [...a, ...b];
  assert.equal(calls.length, 16);
  assert.deepEqual(calls.filter((c) => !c.ok), []);
  const seen = provider.requests.filter((r) => r.phase === 'limits');
  assert.equal(seen.length, 16);
  assert.deepEqual(new Set(seen.map((r) => r.worker)), new Set(['a', 'b']));
  // Grants are judged on the limiter's clock; arrivals here lag them, by more on a loaded
  // machine (a worker's event loop stalls), so the span checked is the window less a margin for
  // that lag. Calls let through unlimited would all arrive within it.
  const most = busiest(seen, windowMs - 300);
  assert.ok(most.calls <= rpm, `${most.calls} requests arrived within one window (limit ${rpm})`);
  assert.ok(most.tokens <= tpm, `${most.tokens} tokens arrived within one window (limit ${tpm})`);
  const span = Math.max(...seen.map((r) => r.at)) - Math.min(...seen.map((r) => r.at));
  assert.ok(span >= 3 * windowMs - 300, `16 calls at most ${rpm} a window took only ${span} ms`);
  console.log(`limits: 16 calls over ${span} ms (${Date.now() - started} ms in all); busiest window: ${most.calls}/${rpm} requests, ${most.tokens}/${tpm} tokens`);
});

test('the window holds the real usage the provider reported, not the estimates', async () => {
  const key = fresh('vern-usage');
  const common = { LIMITER_URL: server.url, PROVIDER_URL: provider.url, KEY: key, RPM: 100, TPM: 10_000, WINDOW_MS: 30_000, PHASE: 'usage', CALLS: 3, CONTENT_CHARS: 400, MAX_TOKENS: 100 };
  const [a, b] = await Promise.all([runWorker({ ...common, WORKER: 'a' }), runWorker({ ...common, WORKER: 'b' })]);
  assert.deepEqual([...a, ...b].filter((c) => !c.ok), []);
  const reported = provider.requests.filter((r) => r.phase === 'usage').reduce((sum, r) => sum + r.total, 0);
  const client = new LimiterClient({ url: server.url });
  const peek = await client.peek({ key, limits: [{ key: `${key}/rpm`, calls: 100, perMs: 30_000 }, { key: `${key}/tpm`, calls: 10_000, perMs: 30_000 }] });
  assert.equal(peek.limits[0].used, 6);
  assert.equal(peek.limits[1].used, reported, `the window holds ${peek.limits[1].used}; the provider reported ${reported} (the estimates were ${6 * 200})`);
  assert.notEqual(reported, 6 * 200);
});

describe('as VernLLM has it', () => {
  test("a VernLLM config with aimd is taken unchanged, checked as VernLLM checks it; an option it cannot honour is named", () => {
    const config = { requestsPerMinute: 60, aimd: { increaseBy: 1, decreaseFactor: 0.5, minCapacity: 5, maxCapacity: 60, proactiveFloor: 2 } };
    // VernLLM's own limiter takes it, and so does the adapter.
    vern(providerClient('limits'), config);
    vern(providerClient('limits'), vernRateLimit({ client, key: fresh('vern-aimd'), ...config }));
    const refused = (options, field, pattern) =>
      assert.throws(
        () => vernRateLimit({ client, key: 'k', ...options }),
        (e) => e instanceof InvalidArgumentError && e.field === field && pattern.test(e.message),
      );
    // VernLLM's own limiter ignores aimd without requestsPerMinute; the adapter says so instead.
    refused({ aimd: config.aimd }, 'aimd', /needs requestsPerMinute/);
    refused({ requestsPerMinute: 60, aimd: { ...config.aimd, minCapacity: 0 } }, 'aimd.minCapacity', /at least 1/);
    refused({ requestsPerMinute: 60, aimd: { ...config.aimd, minCapacity: 70 } }, 'aimd.minCapacity', /must not exceed aimd.maxCapacity/);
    refused({ requestsPerMinute: 60, aimd: { ...config.aimd, increaseBy: Number.NaN } }, 'aimd.increaseBy', /finite/);
    refused({ requestsPerMinute: 60, aimd: { ...config.aimd, increaseBy: undefined } }, 'aimd.increaseBy', /finite/);
    refused({ requestsPerMinute: 60, aimd: { ...config.aimd, step: 2 } }, 'aimd.step', /not an option of aimd/);
    refused({ requestPerMinute: 60 }, 'requestPerMinute', /not an option/);
  });

  /** The adapted rpm ceiling of `key` as a request declaring `calls` is judged (wire section 14). */
  const ceilingOf = async (key, calls, windowMs, adapt) => {
    const p = await client.peek({ key, limits: [{ key: `${key}/rpm`, calls, perMs: windowMs, adapt }] });
    return p.limits[0].ceiling;
  };

  test('aimd in two processes adapts one ceiling: calls granted before a cut that meet 429s together cut it once', async () => {
    const key = fresh('vern-aimd-shared');
    const aimd = { increaseBy: 1, decreaseFactor: 0.5, minCapacity: 2, maxCapacity: 40 };
    const adapt = { min: 2, max: 40, increase: 1, keepPct: 50 };
    const windowMs = 60_000;
    assert.equal(await ceilingOf(key, 20, windowMs, adapt), 20, 'the ceiling starts at requestsPerMinute');
    const common = { LIMITER_URL: server.url, PROVIDER_URL: provider.url, KEY: key, RPM: 20, WINDOW_MS: windowMs, PHASE: 'slow-429', CALLS: 1, AIMD: JSON.stringify(aimd) };
    const [a, b] = await Promise.all([runWorker({ ...common, WORKER: 'a' }), runWorker({ ...common, WORKER: 'b' })]);
    assert.deepEqual([...a, ...b].map((c) => c.ok), [false, false]);
    // Both calls were granted before either 429 came back: one overload, one cut (20 -> 10), in
    // the one ceiling both processes adapt. VernLLM in each process alone would cut its own.
    assert.equal(await ceilingOf(key, 20, windowMs, adapt), 10);
    // The ceiling binds every process: 10 calls fit in the window now, and the 11th does not.
    const third = vernRateLimit({ client: new LimiterClient({ url: server.url }), key, requestsPerMinute: 20, windowMs, aimd, maxQueueMs: 1 });
    await client.lift(key);
    const granted = [];
    for (let i = 0; i < 8; i++) granted.push(await third.acquire(1));
    await assert.rejects(third.acquire(1), (e) => e instanceof Error && /queue|timed out/i.test(e.message));
    for (const g of granted) g.release(undefined, false);
    await third.flush();
  });

  test("aimd: a clean call grows the ceiling once a window while it binds; a hint at or below proactiveFloor cuts it", async () => {
    const key = fresh('vern-aimd-grow');
    const windowMs = 2_000;
    const aimd = { increaseBy: 2, decreaseFactor: 0.5, minCapacity: 2, maxCapacity: 20, proactiveFloor: 3 };
    const adapt = { min: 2, max: 20, increase: 2, keepPct: 50 };
    const a = vernRateLimit({ client, key, requestsPerMinute: 4, windowMs, aimd });
    const llm = vern(providerClient('limits'), a);
    // Four clean calls in one window: the window holds at least half the ceiling from the second
    // on, so the ceiling grows, but once only in the window (4 -> 6, not 4 -> 10).
    for (let i = 0; i < 4; i++) await ask(llm);
    await a.flush();
    assert.equal(await ceilingOf(key, 4, windowMs, adapt), 6);
    // A success saying 1 request remains (at or below proactiveFloor 3) counts as a 429: cut to 3.
    await ask(vern(providerClient('remaining-1'), a));
    await a.flush();
    assert.equal(await ceilingOf(key, 4, windowMs, adapt), 3);
  });

  /** Calls the provider through `a`'s wrapped client in `phase`, meeting its 429: how long the caller `key` is closed then, in ms. */
  const closedAfter429 = async (a, key, phase) => {
    const err = await ask(vern(a.wrapClient(providerClient(phase)), a)).catch((e) => e);
    assert.ok(err instanceof LLMError && err.status === 429, String(err));
    await a.flush();
    const p = await client.peek({ key, limits: [] });
    assert.equal(p.reason, 'throttle');
    return p.retryAt - p.now;
  };

  test("a provider's 429 with Retry-After: 20 closes the caller for 20 s, and another process calls the provider no sooner", async () => {
    const key = fresh('vern-retry-after');
    const closed = await closedAfter429(vernRateLimit({ client, key, requestsPerMinute: 100 }), key, '429-20');
    assert.ok(Math.abs(closed - 20_000) < 1_000, `closed for ${closed} ms`);
    // Another process's VernLLM on the same limits gives up at once (its queue cannot outlast
    // the throttle) without calling the provider.
    const b = vernRateLimit({ client: new LimiterClient({ url: server.url }), key, requestsPerMinute: 100, maxQueueMs: 1_000 });
    const calls = provider.requests.length;
    const later = await ask(vern(b.wrapClient(providerClient('429-20')), b)).catch((e) => e);
    assert.ok(later instanceof LLMError && later.code === 'rate_limit_queue_timeout', String(later));
    assert.equal(provider.requests.length, calls);
  });

  test("a 429 asking for 2 s closes the caller for 2 s: VernLLM's signalRateLimit() after it adds no default wait", async () => {
    const key = fresh('vern-retry-short');
    const closed = await closedAfter429(vernRateLimit({ client, key, requestsPerMinute: 100, throttleAfterMs: 5_000 }), key, '429-2');
    assert.ok(Math.abs(closed - 2_000) < 800, `closed for ${closed} ms`);
  });

  test("without LLMError, a timeout in the queue and a full queue are VernLLM's own errors with its codes, never retried", async () => {
    const key = fresh('vern-codes');
    const a = vernRateLimit({ client, key, maxConcurrent: 1, maxQueueMs: 1_000, maxQueueSize: 1 });
    const llm = vern(providerClient('limits'), a, { maxRetries: 3 });
    const holder = await a.acquire(1);
    const calls = provider.requests.length;
    const started = Date.now();
    const queued = ask(llm).catch((e) => e);
    // Once that call waits in the limiter's line, the queue holds one.
    const line = { key, limits: [{ key: `${key}/conc`, concurrent: 1 }] };
    while (((await client.peek(line)).limits[0].queued ?? 0) === 0) await sleep(10);
    const full = await ask(llm).catch((e) => e);
    const timedOut = await queued;
    const took = Date.now() - started;
    for (const [e, code] of [[full, 'rate_limit_queue_full'], [timedOut, 'rate_limit_queue_timeout']]) {
      assert.ok(e instanceof LLMError, String(e));
      assert.equal(e.code, code);
      assert.equal(e.type, 'rate_limited');
      assert.equal(e.retryable, false);
    }
    assert.ok(took >= 500 && took < 2_500, `one wait of at most maxQueueMs, not one per retry: ${took} ms`);
    assert.equal(provider.requests.length, calls);
    holder.release();
    await a.flush();
  });

  test("maxQueueSize counts as VernLLM's own limiter does: three calls at once with size 1 are ok, ok, full", async () => {
    const threeAtOnce = async (limiter) => {
      const calls = [1, 1, 1].map((t) => limiter.acquire(t).then((ok) => ({ ok }), (e) => ({ code: e.code ?? String(e) })));
      const first = await calls[0];
      const third = await calls[2];
      first.ok?.release();
      const second = await calls[1];
      second.ok?.release();
      return [first, second, third].map((c) => (c.ok ? 'ok' : c.code));
    };
    const theirs = await threeAtOnce(new RateLimiter({ maxConcurrent: 1, maxQueueSize: 1 }));
    assert.deepEqual(theirs, ['ok', 'ok', 'rate_limit_queue_full']);
    const a = vernRateLimit({ client, key: fresh('vern-size'), maxConcurrent: 1, maxQueueSize: 1 });
    assert.deepEqual(await threeAtOnce(a), theirs);
    await a.flush();
  });

  test('rate_limited events come only for real waits, with the reason that held the call', async () => {
    // Room for all: five calls at once wait for nothing, so VernLLM reports nothing.
    let events = [];
    const roomy = vernRateLimit({ client, key: fresh('vern-roomy'), requestsPerMinute: 100, maxConcurrent: 10 });
    await Promise.all([1, 2, 3, 4, 5].map(() => ask(vern(providerClient('limits'), roomy, { events }))));
    assert.deepEqual(events, []);
    await roomy.flush();

    // A place held by a slow call: the second waits for concurrency.
    events = [];
    const conc = vernRateLimit({ client, key: fresh('vern-conc'), maxConcurrent: 1 });
    const slow = vern(providerClient('limits', 300), conc, { events });
    await Promise.all([ask(slow), ask(slow)]);
    assert.deepEqual(events.map((e) => e.reason), ['concurrency']);
    assert.ok(events[0].waitedMs >= 150, `waited ${events[0].waitedMs} ms`);
    await conc.flush();

    // A full tokens window: the second waits for tpm (150 tokens each, 200 a window).
    events = [];
    const tokens = vernRateLimit({ client, key: fresh('vern-tpm'), tokensPerMinute: 200, windowMs: 700 });
    const llm = vern(providerClient('limits'), tokens, { events });
    await ask(llm, 200, 100);
    await tokens.flush();
    await ask(llm, 200, 100);
    assert.deepEqual(events.map((e) => e.reason), ['tpm']);
    await tokens.flush();

    // A throttle on the caller (a provider's 429 elsewhere): the wait is the throttle's.
    events = [];
    const key = fresh('vern-throttled');
    const throttled = vernRateLimit({ client, key, requestsPerMinute: 100 });
    await client.throttle(key, client.serverNow() + 500);
    await ask(vern(providerClient('limits'), throttled, { events }));
    assert.deepEqual(events.map((e) => e.reason), ['throttle']);
    assert.ok(events[0].waitedMs >= 250, `waited ${events[0].waitedMs} ms`);
    await throttled.flush();
  });

  test("a limiter outage is an error that names the limiter, not the provider's server_error or an unknown failure", async () => {
    // One limiter that cannot commit (503), one that cannot be reached.
    const unavailable = http.createServer((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'unavailable', message: 'the store cannot commit: disk full' } }));
    });
    await new Promise((r) => unavailable.listen(0, '127.0.0.1', r));
    const gone = await startServer();
    await gone.stop();
    try {
      for (const url of [`http://127.0.0.1:${unavailable.address().port}`, gone.url]) {
        const a = vernRateLimit({ client: new LimiterClient({ url, timeoutMs: 2_000 }), key: fresh('vern-outage'), requestsPerMinute: 10 });
        const calls = provider.requests.length;
        const err = await ask(vern(providerClient('limits'), a)).catch((e) => e);
        assert.ok(err instanceof LLMError, String(err));
        assert.match(err.message, /rate limiter \(redb-limiter at http:\/\/127\.0\.0\.1:\d+\) failed/);
        assert.equal(err.type, 'rate_limited');
        assert.notEqual(err.code, 'server_error');
        assert.equal(provider.requests.length, calls);
        await assert.rejects(a.readState(), (e) => e instanceof LLMError && /rate limiter/.test(e.message));
      }
    } finally {
      await new Promise((r) => unavailable.close(r));
    }
  });
});
