// Providers' signals: the Rust client's cases, and the shared vectors every client reads.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { MAX_WAIT_MS, requestUsage, tokenUsage, usageCosts, vendorBudget, vendorWaitMs } from '../dist/index.mjs';

const NOW = Date.parse('2026-01-01T00:00:00Z');
const RFC_DATE = Date.parse('2015-10-21T07:28:00Z');
const RETRY_INFO_38S = `{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED","details":[
  {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaId":"PerMinute"}]},
  {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"38s"}]}}`;
const retryInfo = (delay) => `{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":${JSON.stringify(delay)}}]}}`;
const wait = (headers, body, now = NOW, defaultMs = 5_000) => vendorWaitMs(headers, body, { now, defaultMs });
const budget = (headers, now = NOW) => vendorBudget(headers, { now })?.getTime();

test('wait: each source in order, the first that parses wins', () => {
  const cases = [
    [{ 'retry-after-ms': '1500' }, '', 1_500],
    [{ 'retry-after-ms': '2500.1' }, '', 2_501],
    [{ 'retry-after-ms': '1500', 'retry-after': '60' }, '', 1_500],
    [{ 'retry-after': '120' }, '', 120_000],
    [{ 'Retry-After': '20' }, RETRY_INFO_38S, 20_000],
    [{ 'retry-after': 'Wed, 21 Oct 2015 07:28:45 GMT' }, '', 45_000],
    [{ 'retry-after': 'Wednesday, 21-Oct-15 07:28:30 GMT' }, '', 30_000],
    [{ 'retry-after': 'Wed Oct 21 07:28:10 2015' }, '', 10_000],
    [{}, RETRY_INFO_38S, 38_000],
    [{}, retryInfo('1.5s'), 1_500],
    [{}, `[${RETRY_INFO_38S}]`, 38_000],
    [{ 'retry-after-ms': 'soon', 'retry-after': '7' }, '', 7_000],
    [{ 'retry-after': '-1' }, RETRY_INFO_38S, 38_000],
    [{ 'retry-after': ' 9\t' }, '', 9_000],
  ];
  for (const [headers, body, ms] of cases) {
    assert.equal(wait(headers, body, RFC_DATE), ms, JSON.stringify([headers, body]));
    assert.equal(wait(new Headers(headers), new TextEncoder().encode(body), RFC_DATE), ms, 'as Headers and bytes');
  }
});

test('wait: clamped to 1-120 s at both ends, and the default when nothing names a wait', () => {
  assert.equal(wait({}, ''), 5_000);
  assert.equal(wait({}, null, NOW, 0), 1_000);
  assert.equal(wait({}, undefined, NOW, Number.MAX_SAFE_INTEGER), MAX_WAIT_MS);
  assert.equal(wait({ 'retry-after-ms': '5' }, ''), 1_000);
  assert.equal(wait({ 'retry-after': '0' }, ''), 1_000);
  assert.equal(wait({ 'retry-after': '3600' }, ''), 120_000);
  assert.equal(wait({ 'retry-after': 'Wed, 21 Oct 2015 07:28:00 GMT' }, ''), 1_000, 'a past date');
  assert.equal(wait({}, retryInfo('86400s')), 120_000);
  assert.equal(wait({ 'retry-after-ms': '99999999999999999999', 'retry-after': '3' }, ''), 3_000, 'an overflow is no signal');
});

test('wait: a body nested as deep as the Rust client reads is read', () => {
  assert.equal(wait({}, `[${RETRY_INFO_38S}, ${'['.repeat(126)}"[{]}"${']'.repeat(126)}]`), 38_000);
});

test('wait: what is not a signal is ignored', () => {
  for (const body of [
    'not json', '{', '[]', '{}', '{"error":"quota"}', '{"error":{"details":"x"}}', '{"error":{"details":[1,"x",null]}}',
    '{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","retryDelay":"38s"}]}}',
    '{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":{"seconds":38}}]}}',
    retryInfo('-38s'), retryInfo('.5s'), retryInfo('1m'),
    '{"details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"38s"}]}',
    RETRY_INFO_38S + ' '.repeat(64 * 1024), '['.repeat(10_000),
    `[${RETRY_INFO_38S}, ${'['.repeat(127)}${']'.repeat(127)}]`,
  ]) {
    assert.equal(wait({}, body), 5_000, body.slice(0, 80));
  }
  for (const value of ['', ' ', '1.5', '120s', 'junk', 'Wed, 21 Oct 2015 07:28:00 UTC', 'Thu, 21 Oct 2015 07:28:00 GMT', 'Wed, 21 Oct 1969 07:28:00 GMT', '18446744073709552', 'Wed, 21 Oct 2015 07:28:60 GMT', 'Wed, 31 Sep 2015 07:28:00 GMT', 'wed, 21 Oct 2015 07:28:00 GMT']) {
    assert.equal(wait({ 'retry-after': value }, ''), 5_000, value);
  }
});

test('wait: a body with a byte order mark is not JSON', () => {
  assert.equal(wait({}, new Uint8Array([0xef, 0xbb, 0xbf, ...new TextEncoder().encode(RETRY_INFO_38S)])), 5_000);
  assert.equal(wait({}, new Uint8Array([0xff, 0xfe])), 5_000, 'nor are bytes that are not UTF-8');
});

test('budget: Anthropic instants, the latest exhausted reset binds, capped at 120 s', () => {
  assert.equal(budget({
    'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': '2026-01-01T00:00:30Z',
    'anthropic-ratelimit-tokens-remaining': '39000', 'anthropic-ratelimit-tokens-reset': '2026-01-01T00:01:30Z',
  }), NOW + 30_000);
  assert.equal(budget({
    'anthropic-ratelimit-input-tokens-remaining': '0', 'anthropic-ratelimit-input-tokens-reset': '2026-01-01T00:00:12.5Z',
    'anthropic-ratelimit-output-tokens-remaining': '0', 'anthropic-ratelimit-output-tokens-reset': '2026-01-01T01:00:40+01:00',
  }), NOW + 40_000);
  assert.equal(budget({ 'anthropic-ratelimit-tokens-remaining': '0', 'anthropic-ratelimit-tokens-reset': '2026-01-01T00:10:00Z' }), NOW + MAX_WAIT_MS);
});

test('budget: OpenAI durations, plain seconds for either family', () => {
  assert.equal(budget({
    'x-ratelimit-limit-requests': '60', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1s',
    'x-ratelimit-remaining-tokens': '149984', 'x-ratelimit-reset-tokens': '6m0s',
  }), NOW + 1_000);
  assert.equal(budget({
    'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '20ms',
    'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '52.8s',
  }), NOW + 52_800);
  assert.equal(budget({ 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '2m52.8s' }), NOW + MAX_WAIT_MS);
  assert.equal(budget({
    'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '5s',
    'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': '2026-01-01T00:00:03Z',
  }), NOW + 5_000);
  assert.equal(budget({ 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '30' }), NOW + 30_000);
  assert.equal(budget({ 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '0.5' }), NOW + 500);
  assert.equal(budget({ 'anthropic-ratelimit-tokens-remaining': '0', 'anthropic-ratelimit-tokens-reset': '30' }), NOW + 30_000);
  assert.equal(budget({ 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1h2m3.5s' }), NOW + MAX_WAIT_MS);
  assert.equal(budget({ 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '1500\u00b5s' }), NOW + 2);
});

test('budget: nothing unless a count is exactly 0 with a reset after now', () => {
  for (const headers of [
    {},
    { 'x-ratelimit-remaining-requests': '1', 'x-ratelimit-reset-requests': '1s' },
    { 'x-ratelimit-remaining-requests': '0' },
    { 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '0s' },
    { 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': 'soon' },
    { 'x-ratelimit-remaining-requests': '-0', 'x-ratelimit-reset-requests': '1s' },
    { 'x-ratelimit-remaining-tokens': '0.0', 'x-ratelimit-reset-tokens': '1s' },
    { 'x-ratelimit-remaining-tokens': '', 'x-ratelimit-reset-tokens': '1s' },
    { 'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '1s1m' },
    { 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': '2026-01-01T00:00:00Z' },
    { 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': '2025-12-31T23:59:59Z' },
    { 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': 'in 30 seconds' },
    { 'anthropic-ratelimit-tokens-remaining': '5', 'anthropic-ratelimit-tokens-reset': '2026-01-01T00:00:30Z' },
    { 'anthropic-ratelimit-requests-remaining': '0', 'anthropic-ratelimit-requests-reset': '30s' },
  ]) {
    assert.equal(budget(headers), undefined, JSON.stringify(headers));
  }
  assert.equal(budget({
    'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': 'junk',
    'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '2s',
  }), NOW + 2_000, 'one junk pair does not hide a good one');
  assert.equal(budget({ 'X-RateLimit-Remaining-Tokens': '0', 'X-RateLimit-Reset-Tokens': '2s' }), NOW + 2_000, 'names in any case');
});

// The one file of vectors the Rust, JavaScript and Python tests all read.
const vectorsPath = process.env.REDB_LIMITER_VECTORS ??
  join(resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..'), 'tests', 'vectors', 'vendor-signals.json');

test('the shared provider-signal vectors', (t) => {
  if (!existsSync(vectorsPath)) {
    // The file lives at the repository root, shared with the Rust and Python tests.
    const why = `the shared vectors are missing (${vectorsPath})`;
    if (process.env.CI) assert.fail(why);
    console.log(`\n!!! provider-signal vectors DID NOT RUN: ${why}\n`);
    t.skip(why);
    return;
  }
  const vectors = JSON.parse(readFileSync(vectorsPath, 'utf8'));
  assert.ok(vectors.wait.length > 0 && vectors.budget.length > 0);
  const instant = (v) => (typeof v === 'number' ? v : Date.parse(v));
  // Headers as an object, or as [name, value] pairs (a repeated name keeps its first value).
  const headersOf = (h) => (Array.isArray(h) ? h.reduce((o, [k, v]) => (k.toLowerCase() in o ? o : { ...o, [k.toLowerCase()]: v }), {}) : h);
  for (const c of vectors.wait) {
    const got = vendorWaitMs(headersOf(c.headers), c.body, { now: instant(c.now), defaultMs: c.defaultMs });
    assert.equal(got, c.expectMs, `wait vector ${c.name}`);
  }
  console.log(`vectors: ${vectors.wait.length} wait and ${vectors.budget.length} budget cases`);
  for (const c of vectors.budget) {
    const got = vendorBudget(headersOf(c.headers), { now: instant(c.now) });
    assert.equal(got?.toISOString() ?? null, c.expect === null ? null : new Date(Date.parse(c.expect)).toISOString(), `budget vector ${c.name}`);
  }
});

// The usage cases: a reply's (or a request's) usage per kind, and its costs in the buckets the
// case declares; or the error, by its exact message, that the Rust and Python clients give too.
test('the shared usage and estimate vectors', (t) => {
  if (!existsSync(vectorsPath)) {
    const why = `the shared vectors are missing (${vectorsPath})`;
    if (process.env.CI) assert.fail(why);
    console.log(`\n!!! usage vectors DID NOT RUN: ${why}\n`);
    t.skip(why);
    return;
  }
  const vectors = JSON.parse(readFileSync(vectorsPath, 'utf8'));
  assert.ok(vectors.usage.length >= 20 && vectors.estimate.length >= 5);
  const check = (c, read, body) => {
    let got;
    try {
      const usage = read(c.provider, body);
      got = { usage, costs: usageCosts(c.provider, usage, c.buckets) };
    } catch (e) {
      if (c.error === null) throw new Error(`${c.name}: ${e.message}`);
      assert.equal(e.message, c.error, c.name);
      assert.equal(e.name, 'InvalidArgumentError', c.name);
      return;
    }
    assert.equal(c.error, null, `${c.name}: expected the error ${c.error}, got ${JSON.stringify(got)}`);
    assert.deepEqual(got, { usage: c.usage, costs: c.costs }, c.name);
  };
  for (const c of vectors.usage) check(c, tokenUsage, c.body);
  for (const c of vectors.estimate) check(c, requestUsage, c.request);
  console.log(`vectors: ${vectors.usage.length} usage and ${vectors.estimate.length} estimate cases`);
});
