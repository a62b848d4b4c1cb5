// A real VernLLM (the published package) in two Node processes, each with our adapter, against
// the test's own OpenAI-compatible provider: one requestsPerMinute and tokensPerMinute shared by
// both. Short windows stand in for the minute so it runs in seconds.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { LimiterClient } from '../dist/index.mjs';
import { fresh, startServer } from './server.mjs';
import { busiest, runWorker, startFakeProvider } from './vern-fake.mjs';

let server;
let provider;
before(async () => {
  server = await startServer();
  // Phase "limits": 150 real tokens a call (the estimate is 200); phase "usage": 10, 17, 24, ...
  provider = await startFakeProvider((_req, n, headers) => (headers['x-phase'] === 'usage' ? 10 + 7 * n : 150));
});
after(async () => {
  await provider?.close();
  await server?.stop();
});

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
  // Grants are judged on the limiter's clock; arrivals here lag them by a little, so the span
  // checked is the window less a margin for that lag.
  const most = busiest(seen, windowMs - 150);
  assert.ok(most.calls <= rpm, `${most.calls} requests arrived within one window (limit ${rpm})`);
  assert.ok(most.tokens <= tpm, `${most.tokens} tokens arrived within one window (limit ${tpm})`);
  const span = Math.max(...seen.map((r) => r.at)) - Math.min(...seen.map((r) => r.at));
  assert.ok(span >= 3 * windowMs - 150, `16 calls at most ${rpm} a window took only ${span} ms`);
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
