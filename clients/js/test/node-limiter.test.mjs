// node `limiter`'s own README examples and documented rules, run against our `RateLimiter` and
// `TokenBucket` over the real server: the numbers its examples print and the rules its tests
// state. Where the server's semantics differ from node `limiter`'s (a rolling window, not its
// fixed interval), the test says so. Durations are read on the limiter's clock (the `now` of a
// peek) wherever a rule bounds them from below; bounds from above are loose, for a loaded machine.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { InvalidArgumentError, LimiterClient, LimiterError, RateLimiter, TokenBucket, UNITS_PER_TOKEN } from '../dist/index.mjs';
import { fresh, startServer } from './server.mjs';

let server;
let client;
before(async () => {
  server = await startServer();
  client = new LimiterClient({ url: server.url });
});
after(() => server?.stop());

/** The limiter's clock, in ms: a peek that names no limit changes nothing and says `now`. */
const limiterNow = async () => (await client.peek({ key: 'clock', limits: [] })).now.getTime();
/** A client that can reach nothing: a call through it proves the server was asked. */
const unreachable = () => new LimiterClient({ url: 'http://127.0.0.1:9', timeoutMs: 500 });
/** A test that hangs fails, rather than holding up the run. */
const LIMIT = { timeout: 30_000 };
const isRangeError = (field) => (e) => e instanceof RangeError && e instanceof InvalidArgumentError && e instanceof LimiterError && e.field === field;

describe("node limiter's README, RateLimiter", () => {
  test('"A simple example allowing 150 requests per hour": one removal leaves 149', LIMIT, async () => {
    const limiter = new RateLimiter({ client, key: fresh('readme150'), tokensPerInterval: 150, interval: 'hour' });
    assert.equal(await limiter.removeTokens(1), 149);
  });

  test('"one message to be sent every 250ms": the second waits for the first to leave the window', LIMIT, async () => {
    // node `limiter` waits for its next fixed interval; here the window rolls, and the second
    // message waits until the first is 250 ms old: the same 250 ms for these two.
    const limiter = new RateLimiter({ client, key: fresh('readme250'), tokensPerInterval: 1, interval: 250 });
    assert.equal(await limiter.removeTokens(1), 0);
    const started = await limiterNow();
    assert.ok((await limiter.getWaitTime(1)) > 0, 'the second has to wait');
    assert.equal(await limiter.removeTokens(1), 0);
    const waited = (await limiterNow()) - started;
    assert.ok(waited >= 150 && waited < 2_000, `waited ${waited} ms`);
  });

  test('"fireImmediately: true": resolves to -1 at once while limited, never waiting an hour', LIMIT, async () => {
    const limiter = new RateLimiter({ client, key: fresh('readmefire'), tokensPerInterval: 150, interval: 'hour', fireImmediately: true });
    let remaining;
    for (let i = 0; i < 150; i++) remaining = await limiter.removeTokens(1);
    assert.equal(remaining, 0);
    const started = Date.now();
    assert.equal(await limiter.removeTokens(1), -1);
    assert.ok(Date.now() - started < 5_000, 'it did not wait for the window');
    assert.equal(await limiter.getTokensRemaining(), 0, 'the -1 removed nothing');
  });

  test('"tryRemoveTokens(5)" on 10 a second: removed, removed, then not', LIMIT, async () => {
    const limiter = new RateLimiter({ client, key: fresh('readmetry'), tokensPerInterval: 10, interval: 'second' });
    assert.equal(await limiter.tryRemoveTokens(5), true, 'Tokens removed');
    assert.equal(await limiter.tryRemoveTokens(5), true, 'Tokens removed');
    assert.equal(await limiter.tryRemoveTokens(5), false, 'No tokens removed');
  });

  test('"getTokensRemaining" prints 1 for 1 per 250 ms with nothing removed', LIMIT, async () => {
    const limiter = new RateLimiter({ client, key: fresh('readmeleft'), tokensPerInterval: 1, interval: 250 });
    assert.equal(await limiter.getTokensRemaining(), 1);
  });

  test('its tests: a junk interval throws synchronously, every named interval is valid', LIMIT, () => {
    assert.throws(() => new RateLimiter({ client, key: 'k', tokensPerInterval: 1, interval: 'junk' }), isRangeError('interval'));
    for (const interval of ['sec', 'second', 'min', 'minute', 'hr', 'hour', 'day']) {
      assert.doesNotThrow(() => new RateLimiter({ client, key: 'k', tokensPerInterval: 1, interval }));
    }
  });

  test('a count above tokensPerInterval rejects with a RangeError; tryRemoveTokens resolves to false', LIMIT, async () => {
    const limiter = new RateLimiter({ client: unreachable(), key: fresh('over'), tokensPerInterval: 2, interval: 'minute' });
    await assert.rejects(limiter.removeTokens(3), isRangeError('count'));
    assert.equal(await limiter.tryRemoveTokens(3), false, 'answered without asking the server');
    await assert.rejects(limiter.tryRemoveTokens(-1), isRangeError('count'));
    await assert.rejects(limiter.removeTokens(Number.NaN), isRangeError('count'));
  });

  test('fractional counts: half a token twice fills a limit of one', LIMIT, async () => {
    const limiter = new RateLimiter({ client, key: fresh('half'), tokensPerInterval: 1, interval: 'hour' });
    assert.equal(limiter.unitsPerToken, UNITS_PER_TOKEN);
    assert.equal(await limiter.tryRemoveTokens(0.5), true);
    assert.equal(await limiter.getTokensRemaining(), 0.5);
    assert.equal(await limiter.removeTokens(0.25), 0.25);
    assert.equal(await limiter.tryRemoveTokens(0.5), false);
    assert.equal(await limiter.tryRemoveTokens(0.25), true);
    assert.equal(await limiter.getTokensRemaining(), 0);
  });
});

describe("node limiter's README and tests, TokenBucket", () => {
  const tenPerSecond = (key, extra = {}) => new TokenBucket({ client, key, bucketSize: 10, tokensPerInterval: 1, interval: 100, ...extra });

  test('"Using the token bucket directly to throttle at the byte level": 150 KB burst, 50 KB/s', LIMIT, async () => {
    const BURST_RATE = 1024 * 1024 * 150;
    const FILL_RATE = 1024 * 1024 * 50;
    const bucket = new TokenBucket({ client, key: fresh('bytes'), bucketSize: BURST_RATE, tokensPerInterval: FILL_RATE, interval: 'second' });
    assert.equal(bucket.unitsPerToken, 1, 'a bucket of bytes counts whole bytes on the wire');
    // It starts empty, as node's does: a kilobyte is there within a millisecond or two.
    const remaining = await bucket.removeTokens(1024);
    assert.ok(remaining >= 0 && remaining < FILL_RATE, `remaining ${remaining}`);
    await assert.rejects(bucket.removeTokens(BURST_RATE + 1), isRangeError('count'));
    assert.equal(await bucket.tryRemoveTokens(BURST_RATE + 1), false);
  });

  test('"is initialized empty"', LIMIT, async () => {
    const bucket = tenPerSecond(fresh('empty'));
    assert.equal(bucket.bucketSize, 10);
    assert.equal(bucket.tokensPerInterval, 1);
    assert.equal(await bucket.getTokensRemaining(), 0);
  });

  test('"removing 10 tokens takes 1 second", and "removing another 10 tokens takes 1 second"', LIMIT, async () => {
    const bucket = tenPerSecond(fresh('ten'));
    let started = await limiterNow();
    assert.equal(await bucket.removeTokens(10), 0);
    let took = (await limiterNow()) - started;
    assert.ok(took >= 1_000 && took < 3_000, `the first 10 took ${took} ms`);
    started = await limiterNow();
    assert.equal(await bucket.removeTokens(10), 0);
    took = (await limiterNow()) - started;
    assert.ok(took >= 900 && took < 3_000, `another 10 took ${took} ms`);
  });

  test('"waiting 2 seconds gives us only 10 tokens" (here: a bucket already full, as after any wait)', LIMIT, async () => {
    // `initial: 10` stands for the two seconds node's test sleeps: the level a wait would bring.
    const bucket = tenPerSecond(fresh('full'), { interval: 'day', initial: 10 });
    const started = await limiterNow();
    assert.equal(await bucket.removeTokens(10), 0, 'the ten are there at once and leave nothing: it held 10, never more');
    assert.ok((await limiterNow()) - started < 1_000, 'without waiting');
    assert.equal(await bucket.tryRemoveTokens(1), false);
  });

  test('"removing 1 token takes 100ms"', LIMIT, async () => {
    const bucket = tenPerSecond(fresh('one'));
    const started = await limiterNow();
    const remaining = await bucket.removeTokens(1);
    const took = (await limiterNow()) - started;
    assert.ok(took >= 100 && took < 2_000, `took ${took} ms`);
    assert.ok(remaining < 1, `remaining ${remaining}`);
  });

  test('bucketSize 0 is a bucket without limit: Infinity and true, and the server is never asked', LIMIT, async () => {
    const parent = new TokenBucket({ client: unreachable(), key: fresh('p'), bucketSize: 1, tokensPerInterval: 1, interval: 'day' });
    const bucket = new TokenBucket({ client: unreachable(), key: fresh('inf'), bucketSize: 0, tokensPerInterval: 0, interval: 'second', parentBucket: parent });
    assert.equal(await bucket.removeTokens(1e9), Number.POSITIVE_INFINITY);
    assert.equal(await bucket.tryRemoveTokens(1e9), true);
    assert.equal(await bucket.getTokensRemaining(), Number.POSITIVE_INFINITY);
  });

  test('tokensPerInterval 0 is full before every removal; a count above bucketSize is refused', LIMIT, async () => {
    const bucket = new TokenBucket({ client: unreachable(), key: fresh('tpi0'), bucketSize: 10, tokensPerInterval: 0, interval: 'second' });
    for (let i = 0; i < 3; i++) assert.equal(await bucket.removeTokens(10), 0);
    assert.equal(await bucket.removeTokens(4), 6);
    assert.equal(await bucket.tryRemoveTokens(10), true);
    assert.equal(await bucket.tryRemoveTokens(11), false);
    await assert.rejects(bucket.removeTokens(11), isRangeError('count'));
    assert.equal(await bucket.getTokensRemaining(), 10);
  });

  test('a child and its parent are charged together in one acquire, or neither is', LIMIT, async () => {
    const daily = { tokensPerInterval: 1, interval: 'day' };
    const parent = new TokenBucket({ client, key: fresh('parent'), bucketSize: 5, initial: 5, ...daily });
    const a = new TokenBucket({ client, key: fresh('a'), bucketSize: 10, initial: 10, parentBucket: parent, ...daily });
    const b = new TokenBucket({ client, key: fresh('b'), bucketSize: 10, initial: 10, parentBucket: parent, ...daily });
    assert.equal(await a.tryRemoveTokens(3), true);
    assert.equal(await parent.getTokensRemaining(), 2);
    assert.equal(await a.getTokensRemaining(), 7);
    assert.equal(await b.tryRemoveTokens(3), false, 'the parent has 2');
    assert.equal(await b.getTokensRemaining(), 10, 'a refused child is not charged');
    assert.equal(await b.removeTokens(2), 0, 'the fewest left in the chain: the parent has 0, b has 8');
    assert.equal(await b.getTokensRemaining(), 8);
    assert.equal(await a.tryRemoveTokens(6), false, 'a count above the parent\'s size');
    await assert.rejects(a.removeTokens(6), isRangeError('count'));
  });

  test('every process naming the key shares one bucket', LIMIT, async () => {
    const key = fresh('shared');
    const other = new LimiterClient({ url: server.url });
    const here = new TokenBucket({ client, key, bucketSize: 4, initial: 4, tokensPerInterval: 1, interval: 'day' });
    const there = new TokenBucket({ client: other, key, bucketSize: 4, initial: 4, tokensPerInterval: 1, interval: 'day' });
    assert.equal(await here.removeTokens(3), 1);
    assert.equal(await there.getTokensRemaining(), 1);
    assert.equal(await there.tryRemoveTokens(2), false);
    assert.equal(await there.tryRemoveTokens(1), true);
    assert.equal(await here.getTokensRemaining(), 0);
  });

  test('fractional counts are thousandths of a token on the wire', LIMIT, async () => {
    const bucket = new TokenBucket({ client, key: fresh('frac'), bucketSize: 1, initial: 1, tokensPerInterval: 1, interval: 'day' });
    assert.equal(bucket.unitsPerToken, UNITS_PER_TOKEN);
    assert.equal(await bucket.removeTokens(0.25), 0.75);
    assert.equal(await bucket.removeTokens(0.5), 0.25);
    assert.equal(await bucket.tryRemoveTokens(0.3), false);
    assert.equal(await bucket.tryRemoveTokens(0.001), true);
    assert.equal(await bucket.getTokensRemaining(), 0.249);
  });

  test('invalid options throw a RangeError synchronously, naming the option', LIMIT, () => {
    const base = { client, key: 'k', bucketSize: 10, tokensPerInterval: 1, interval: 'second' };
    const cases = [
      [{ interval: 'junk' }, 'interval'],
      [{ interval: 0 }, 'interval'],
      [{ bucketSize: -1 }, 'bucketSize'],
      [{ bucketSize: Number.POSITIVE_INFINITY }, 'bucketSize'],
      [{ tokensPerInterval: Number.NaN }, 'tokensPerInterval'],
      [{ key: '' }, 'key'],
      [{ initial: 11 }, 'initial'],
      [{ parentBucket: {} }, 'parentBucket'],
    ];
    for (const [options, field] of cases) assert.throws(() => new TokenBucket({ ...base, ...options }), isRangeError(field), field);
    const parent = new TokenBucket(base);
    assert.throws(() => new TokenBucket({ ...base, parentBucket: parent }), isRangeError('parentBucket'), 'a key twice in the chain');
  });
});
