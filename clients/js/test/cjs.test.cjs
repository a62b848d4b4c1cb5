// The package through its `require` condition: the CommonJS build, same classes and rules.
const assert = require('node:assert/strict');
const { test } = require('node:test');

test('require("redb-limiter") loads the CommonJS build with every export', async () => {
  const cjs = require('redb-limiter');
  assert.match(require.resolve('redb-limiter'), /dist[\\/]index\.cjs$/);
  for (const name of ['LimiterClient', 'Permit', 'LimitedError', 'QueueFullError', 'vendorWaitMs', 'vendorBudget', 'estimateTokens', 'vernRateLimit', 'RateLimiter']) {
    assert.ok(cjs[name], name);
  }
  assert.equal(cjs.vendorWaitMs({ 'retry-after': '3' }), 3_000);
  assert.throws(() => new cjs.LimiterClient({ url: 'nope' }), cjs.InvalidArgumentError);
  const esm = await import('redb-limiter');
  assert.notEqual(esm.LimiterClient, cjs.LimiterClient, 'two builds, one per condition');
  assert.equal(esm.vendorWaitMs({ 'retry-after-ms': '2500.1' }), cjs.vendorWaitMs({ 'retry-after-ms': '2500.1' }));
});
