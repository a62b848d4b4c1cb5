// Token estimates, node limiter's RateLimiter shape and the VernLLM adapter, one method at a time
// against the real server (the two-process VernLLM run is vern.test.mjs).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LLMError, VernLLM, defaultEstimateTokens, fromFetch } from 'vern-llm';
import {
  InvalidArgumentError,
  LimiterClient,
  RateLimiter,
  estimateTokens,
  usageTokens,
  vernRateLimit,
} from '../dist/index.mjs';
import { fresh, startServer } from './server.mjs';

let server;
let client;
before(async () => {
  server = await startServer();
  client = new LimiterClient({ url: server.url });
});
after(() => server?.stop());

describe('estimateTokens', () => {
  test('characters / 4 plus the requested maximum, exactly as VernLLM estimates', () => {
    const requests = [
      { messages: [{ role: 'user', content: 'Hello there!' }], max_tokens: 100 },
      { messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'x'.repeat(401) }] },
      { messages: [{ role: 'user', content: [{ type: 'text', text: 'blocks count as their JSON' }] }], max_tokens: 7 },
      { messages: [{ role: 'assistant', content: null }], max_tokens: 3 },
    ];
    for (const r of requests) {
      assert.equal(estimateTokens(r.messages, r.max_tokens ?? 0), defaultEstimateTokens(r), JSON.stringify(r));
    }
    assert.equal(estimateTokens([{ content: 'Hello there!' }], 100), 3 + 100);
  });

  test('a tokenizer hook replaces the division', () => {
    const words = (text) => text.split(/\s+/).filter(Boolean).length;
    assert.equal(estimateTokens([{ content: 'one two three' }, { content: 'four' }], 10, { tokenizer: words }), 14);
    assert.throws(() => estimateTokens([{ content: 'x' }], 0, { tokenizer: () => -1 }), (e) => e instanceof InvalidArgumentError && /tokenizer/.test(e.field));
    assert.throws(() => estimateTokens([], 1.5), (e) => e.field === 'maxTokens');
    assert.throws(() => estimateTokens('hello', 1), (e) => e.field === 'messages');
  });

  test('usageTokens reads each provider\'s real usage, strictly', () => {
    assert.equal(usageTokens('openai', { usage: { prompt_tokens: 9, completion_tokens: 41, total_tokens: 50 } }), 50);
    assert.equal(usageTokens('openai', { usage: { input_tokens: 9, output_tokens: 1, total_tokens: 10 } }), 10);
    assert.equal(usageTokens('anthropic', { usage: { input_tokens: 9, output_tokens: 41, cache_read_input_tokens: 2 } }), 52);
    assert.equal(usageTokens('google', { usageMetadata: { totalTokenCount: 77 } }), 77);
    assert.throws(() => usageTokens('openai', { usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 3 } }), (e) => e.field === 'usage.total_tokens');
    assert.throws(() => usageTokens('anthropic', { usage: { output_tokens: 5 } }), (e) => e.field === 'usage.input_tokens');
    assert.throws(() => usageTokens('google', {}), (e) => e.field === 'usageMetadata');
    assert.throws(() => usageTokens('openai', { usage: { total_tokens: 1.5 } }), (e) => e.field === 'usage.total_tokens');
  });
});

describe('RateLimiter (node limiter\'s shape)', () => {
  test('removeTokens, tryRemoveTokens, getTokensRemaining, getWaitTime over one shared bucket', async () => {
    const key = fresh('nl');
    const limiter = new RateLimiter({ client, key, tokensPerInterval: 5, interval: 2_000 });
    const other = new RateLimiter({ client, key, tokensPerInterval: 5, interval: 2_000 });
    assert.equal(await limiter.getTokensRemaining(), 5);
    assert.equal(await limiter.removeTokens(3), 2);
    assert.equal(await other.getTokensRemaining(), 2, 'every limiter naming the key shares it');
    assert.equal(await other.tryRemoveTokens(3), false);
    // The 2 are taken well after the 3, so the 3 leave the window a second before the 2 do,
    // however slowly a loaded machine answers.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    assert.equal(await other.tryRemoveTokens(2), true);
    const waitMs = await limiter.getWaitTime(1);
    assert.ok(waitMs > 0 && waitMs <= 1_000, `getWaitTime ${waitMs}`);
    assert.equal(await limiter.getWaitTime(0), 0);
    const started = Date.now();
    assert.equal(await limiter.removeTokens(1), 2, 'the 3 left the window, the 2 still count');
    assert.ok(Date.now() - started >= waitMs - 50, 'removeTokens waited for the window');
  });

  test('bad options and counts name the field', async () => {
    assert.throws(() => new RateLimiter({ client, key: 'k', tokensPerInterval: 0, interval: 'second' }), (e) => e.field === 'tokensPerInterval');
    assert.throws(() => new RateLimiter({ client, key: 'k', tokensPerInterval: 1, interval: 'fortnight' }), (e) => e.field === 'interval');
    const l = new RateLimiter({ client, key: fresh('nl'), tokensPerInterval: 2, interval: 'minute' });
    assert.equal(l.intervalMs, 60_000);
    await assert.rejects(l.removeTokens(3), (e) => e instanceof InvalidArgumentError && e.field === 'count');
  });
});

describe('vernRateLimit', () => {
  const adapter = (extra = {}) => vernRateLimit({ client, key: fresh('vern'), requestsPerMinute: 3, tokensPerMinute: 1000, maxConcurrent: 2, windowMs: 60_000, ...extra });

  test('acquire counts in rpm, tpm and a place; release(actualTokens) settles the window to the real usage', async () => {
    const a = adapter();
    assert.deepEqual(await a.readState(), { requestsRemaining: 3, tokensRemaining: 1000, concurrentInFlight: 0 });
    const estimate = a.estimate({ messages: [{ role: 'user', content: 'x'.repeat(400) }], max_tokens: 300 });
    assert.equal(estimate, 400);
    const got = await a.acquire(estimate);
    assert.equal(got.waitedMs, 0);
    assert.equal(got.reason, undefined);
    assert.deepEqual(await a.readState(), { requestsRemaining: 2, tokensRemaining: 600, concurrentInFlight: 1 });
    got.release(123, true);
    got.release(999, true);
    await a.flush();
    assert.deepEqual(await a.readState(), { requestsRemaining: 2, tokensRemaining: 877, concurrentInFlight: 0 });
  });

  test('a call that could never fit, a full queue and a queue timeout reject with VernLLM\'s codes', async () => {
    const a = adapter({ maxQueueMs: 200, maxQueueSize: 1, maxConcurrent: 1 });
    await assert.rejects(a.acquire(1001), (e) => e.code === 'rate_limit_capacity_exceeded' && e.type === 'rate_limited');
    await assert.rejects(a.acquire(-1), (e) => e instanceof InvalidArgumentError);
    const holder = await a.acquire(10);
    const waiting = a.acquire(10).catch((e) => e);
    await assert.rejects(a.acquire(10), (e) => e.code === 'rate_limit_queue_full');
    const timedOut = await waiting;
    assert.equal(timedOut.code, 'rate_limit_queue_timeout');
    assert.equal(timedOut.cause.reason, 'concurrency');
    holder.release();
    await a.flush();
  });

  test('a waited call reports its reason; an aborted signal stops the wait', async () => {
    const a = adapter({ requestsPerMinute: 1, windowMs: 300 });
    (await a.acquire(1)).release(1);
    const second = await a.acquire(1);
    assert.ok(second.waitedMs >= 50, `waited ${second.waitedMs}`);
    assert.equal(second.reason, 'rpm');
    second.release();
    const ac = new AbortController();
    const third = a.acquire(1, ac.signal).catch((e) => e);
    ac.abort();
    assert.equal((await third).trigger, 'aborted');
    await a.flush();
  });

  test('a 429 throttles the caller for the default wait; an exhausted-budget hint until its reset; a count above zero does nothing', async () => {
    const key = fresh('vern-429');
    const a = vernRateLimit({ client, key, requestsPerMinute: 100, throttleAfterMs: 2_000 });
    const peekReq = { key, limits: [] };
    a.reactToRateLimitHint({ remainingRequests: 3, resetAfterMs: 10_000 });
    a.reactToRateLimitHint(undefined);
    await a.flush();
    assert.equal((await client.peek(peekReq)).fits, true);
    a.signalRateLimit();
    await a.flush();
    let p = await client.peek(peekReq);
    assert.equal(p.reason, 'throttle');
    assert.ok(Math.abs(p.retryAt - p.now - 2_000) < 500, `throttled for ${p.retryAt - p.now} ms`);
    assert.equal(await client.lift(key), true);
    a.reactToRateLimitHint({ remainingRequests: 0, limitRequests: 60, resetAfterMs: 7_000 });
    await a.flush();
    p = await client.peek(peekReq);
    assert.equal(p.reason, 'throttle');
    assert.ok(Math.abs(p.retryAt - p.now - 7_000) < 500, `throttled for ${p.retryAt - p.now} ms`);
  });

  test('with vern-llm\'s LLMError, a timeout in the line is VernLLM\'s own error, which it does not retry', async () => {
    const key = fresh('vern-llmerror');
    const a = vernRateLimit({ client, key, maxConcurrent: 1, maxQueueMs: 300, LLMError });
    let providerCalls = 0;
    const llm = new VernLLM({
      client: fromFetch({ url: 'http://127.0.0.1:9/never', request: async () => { providerCalls += 1; throw new Error('unreachable'); }, mapRequest: (r) => r, mapResponse: () => ({ content: '' }) }),
      model: 'm',
      maxRetries: 2,
      rateLimit: a,
    });
    const holder = await a.acquire(1);
    const started = Date.now();
    const err = await llm.call({ userContent: 'hi', jsonMode: false, maxTokens: 5 }).catch((e) => e);
    const took = Date.now() - started;
    assert.ok(err instanceof LLMError, String(err));
    assert.equal(err.code, 'rate_limit_queue_timeout');
    assert.equal(err.retryable, false);
    assert.equal(providerCalls, 0);
    assert.ok(took >= 200 && took < 900, `one wait of at most maxQueueMs, not one per retry: ${took} ms`);
    await assert.rejects(a.acquire(1), (e) => e instanceof LLMError && e.code === 'rate_limit_queue_timeout');
    holder.release();
    await a.flush();
  });
});
