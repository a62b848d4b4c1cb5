// node `limiter`'s shapes over the limiter, shared by every process that names the same key:
// `RateLimiter` (at most `tokensPerInterval` in any `interval`: a rolling window) and
// `TokenBucket` (`bucketSize`, refilled by `tokensPerInterval` every `interval`, continuously: a
// token bucket of wire section 13, with its parents charged in the same acquire). Every method
// that asks the server returns a Promise (node `limiter`'s `tryRemoveTokens` and
// `getTokensRemaining` answer synchronously: await them here). Counts may be fractional: on the
// wire a token is `UNITS_PER_TOKEN` whole units while the figures allow it (see `unitsFor`).
// Invalid options throw a `RangeError` (an `InvalidArgumentError`) synchronously, as node
// `limiter`'s constructor does; an invalid count rejects, as its async `removeTokens` does.

import type { AcquireOptions, AcquireRequest, Limit, LimitFigures, LimiterClient } from './client.js';
import { InvalidArgumentError } from './errors.js';

/** node `limiter`'s interval names, or milliseconds. */
export type Interval = number | 'second' | 'sec' | 'minute' | 'min' | 'hour' | 'hr' | 'day';

const INTERVALS: Record<string, number> = {
  second: 1_000,
  sec: 1_000,
  minute: 60_000,
  min: 60_000,
  hour: 3_600_000,
  hr: 3_600_000,
  day: 86_400_000,
};

/** The wire's bounds: a window's `calls` or a bucket's `refill` and `burst`, and `perMs` (31 days). */
const MAX_UNITS = 1_000_000_000;
const MAX_INTERVAL_MS = 2_678_400_000;

/**
 * Whole units a token counts for on the wire: a thousandth of a token is the smallest count that
 * is not rounded. A limiter whose figures (in tokens) would pass the wire's 10^9 at that scale
 * (above 10^6 tokens, say a bucket of bytes) counts whole tokens, and rounds a fractional count up.
 */
export const UNITS_PER_TOKEN = 1_000;

/** `UNITS_PER_TOKEN`, or 1 for figures too large for it. */
function unitsFor(...figures: number[]): number {
  return figures.every((f) => f * UNITS_PER_TOKEN <= MAX_UNITS) ? UNITS_PER_TOKEN : 1;
}

/** A count in whole units, rounded up (past a float's last bits: 0.1 token is exactly 100). */
function toUnits(count: number, units: number): number {
  return Math.max(0, Math.ceil(count * units - 1e-6));
}

function intervalMs(interval: unknown): number {
  const ms = typeof interval === 'number' ? interval : typeof interval === 'string' ? INTERVALS[interval] : undefined;
  if (ms === undefined || !Number.isInteger(ms) || ms < 1 || ms > MAX_INTERVAL_MS) {
    throw new InvalidArgumentError(
      'interval',
      `must be a whole number of ms from 1 to ${MAX_INTERVAL_MS} or one of ${Object.keys(INTERVALS).join(', ')}, got ${String(interval)}`,
    );
  }
  return ms;
}

function key(v: unknown): string {
  if (typeof v !== 'string' || v === '') throw new InvalidArgumentError('key', 'must be a non-empty string');
  return v;
}

/** A figure in tokens: finite, from `low` to the wire's bound at one unit a token. */
function tokens(v: unknown, field: string, low: number): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < low || v > MAX_UNITS) {
    throw new InvalidArgumentError(field, `must be a number from ${low} to ${MAX_UNITS}, got ${String(v)}`);
  }
  return v;
}

/** A count to remove: a finite number of tokens, 0 or more (fractions allowed). */
function checkCount(count: unknown): number {
  if (typeof count !== 'number' || !Number.isFinite(count) || count < 0) {
    throw new InvalidArgumentError('count', `must be a finite number of tokens, 0 or more, got ${String(count)}`);
  }
  return count;
}

type WaitOptions = Pick<AcquireOptions, 'signal' | 'maxWaitMs'>;

export interface RateLimiterOptions {
  client: LimiterClient;
  /** The bucket (and the caller key throttles land on). */
  key: string;
  /** At most this many tokens in any `interval` (fractions allowed). */
  tokensPerInterval: number;
  interval: Interval;
  /** Resolve `removeTokens` to -1 at once instead of waiting when the tokens are not there. */
  fireImmediately?: boolean;
}

export class RateLimiter {
  readonly tokensPerInterval: number;
  readonly intervalMs: number;
  readonly fireImmediately: boolean;
  /** Whole units a token counts for on the wire (`UNITS_PER_TOKEN`, or 1 above 10^6 tokens). */
  readonly unitsPerToken: number;
  readonly #client: LimiterClient;
  readonly #key: string;

  constructor(options: RateLimiterOptions) {
    const { client, tokensPerInterval, interval, fireImmediately = false } = options;
    this.#key = key(options.key);
    this.tokensPerInterval = tokens(tokensPerInterval, 'tokensPerInterval', 0);
    if (tokensPerInterval === 0) throw new InvalidArgumentError('tokensPerInterval', 'must be above 0');
    this.intervalMs = intervalMs(interval);
    if (typeof fireImmediately !== 'boolean') throw new InvalidArgumentError('fireImmediately', 'must be a boolean');
    this.fireImmediately = fireImmediately;
    this.unitsPerToken = unitsFor(tokensPerInterval);
    this.#client = client;
  }

  #request(count: number): AcquireRequest {
    const units = this.unitsPerToken;
    const calls = Math.max(1, toUnits(this.tokensPerInterval, units));
    return { key: this.#key, cost: toUnits(count, units), limits: [{ key: this.#key, calls, perMs: this.intervalMs }] };
  }

  #tokensLeft(figures: LimitFigures[] | undefined): number {
    return (figures?.[0]?.remaining ?? 0) / this.unitsPerToken;
  }

  /**
   * Waits until `count` tokens can be removed, removes them, and resolves to the tokens left.
   * With `fireImmediately`, resolves to -1 at once instead of waiting. Rejects with a
   * `RangeError` for a count above `tokensPerInterval`, as node `limiter` does.
   */
  async removeTokens(count: number, options: WaitOptions = {}): Promise<number> {
    if (checkCount(count) > this.tokensPerInterval) {
      throw new InvalidArgumentError('count', `(${count}) exceeds tokensPerInterval (${this.tokensPerInterval})`);
    }
    const request = { ...this.#request(count), report: true };
    if (this.fireImmediately) {
      const reply = await this.#client.tryAcquire(request);
      return reply.granted ? this.#tokensLeft(reply.limits) : -1;
    }
    return this.#tokensLeft((await this.#client.acquire(request, options)).limits);
  }

  /** Removes `count` tokens if they are there now: `true` when removed. Never waits. */
  async tryRemoveTokens(count: number): Promise<boolean> {
    if (checkCount(count) > this.tokensPerInterval) return false;
    return (await this.#client.tryAcquire(this.#request(count))).granted;
  }

  /** The tokens that could be removed now. */
  async getTokensRemaining(): Promise<number> {
    return this.#tokensLeft((await this.#client.peek(this.#request(0))).limits);
  }

  /** How long, in ms, until `count` tokens could be removed (0 when they can now). */
  async getWaitTime(count = 1): Promise<number> {
    const peeked = await this.#client.peek(this.#request(Math.min(checkCount(count), this.tokensPerInterval)));
    if (peeked.fits || !peeked.retryAt) return 0;
    return Math.max(0, peeked.retryAt.getTime() - peeked.now.getTime());
  }
}

export interface TokenBucketOptions {
  client: LimiterClient;
  /** The bucket (and, for the bucket a removal is asked of, the caller key throttles land on). */
  key: string;
  /** The most tokens the bucket holds (its burst); 0 for a bucket without limit. */
  bucketSize: number;
  /** Tokens added every `interval`, continuously; 0 for a bucket that is full before every removal. */
  tokensPerInterval: number;
  interval: Interval;
  /** A bucket charged with this one, in the same acquire (and its own parents, in turn). */
  parentBucket?: TokenBucket;
  /**
   * Tokens in the bucket the first time any process names it (or names it again after the
   * limiter forgot it, full and idle). Default 0: it starts empty, as node `limiter`'s does.
   */
  initial?: number;
}

/**
 * node `limiter`'s `TokenBucket` over a token bucket of the limiter: every process naming `key`
 * shares one bucket. A removal asks for this bucket and all its parents in one acquire, so they
 * are charged together or not at all.
 */
export class TokenBucket {
  readonly bucketSize: number;
  readonly tokensPerInterval: number;
  /** The interval in ms. */
  readonly interval: number;
  readonly parentBucket: TokenBucket | undefined;
  readonly initial: number;
  /** Whole units a token counts for on the wire (`UNITS_PER_TOKEN`, or 1 above 10^6 tokens). */
  readonly unitsPerToken: number;
  readonly key: string;
  readonly #client: LimiterClient;

  constructor(options: TokenBucketOptions) {
    const { client, bucketSize, tokensPerInterval, interval, parentBucket, initial = 0 } = options;
    this.key = key(options.key);
    this.bucketSize = tokens(bucketSize, 'bucketSize', 0);
    this.tokensPerInterval = tokens(tokensPerInterval, 'tokensPerInterval', 0);
    this.interval = intervalMs(interval);
    if (parentBucket !== undefined && !(parentBucket instanceof TokenBucket)) {
      throw new InvalidArgumentError('parentBucket', 'must be a TokenBucket');
    }
    for (let p = parentBucket; p; p = p.parentBucket) {
      if (p.key === this.key) throw new InvalidArgumentError('parentBucket', `names the key ${JSON.stringify(this.key)} again`);
    }
    this.parentBucket = parentBucket;
    this.initial = tokens(initial, 'initial', 0);
    if (bucketSize > 0 && initial > bucketSize) {
      throw new InvalidArgumentError('initial', `(${initial}) exceeds bucketSize (${bucketSize})`);
    }
    this.unitsPerToken = unitsFor(bucketSize, tokensPerInterval);
    this.#client = client;
  }

  /** This bucket and its parents, up to the first without limit (node `limiter` asks no further). */
  #chain(): TokenBucket[] {
    const chain: TokenBucket[] = [];
    for (let b: TokenBucket | undefined = this; b && b.bucketSize > 0; b = b.parentBucket) chain.push(b);
    return chain;
  }

  /** The first bucket of the chain that `count` will never fit, if any. */
  static #tooSmall(chain: TokenBucket[], count: number): TokenBucket | undefined {
    return chain.find((b) => count > b.bucketSize);
  }

  /** The wire's limit of each bucket that refills (one with `tokensPerInterval: 0` is always full). */
  static #limits(chain: TokenBucket[], count: number): Limit[] {
    return chain
      .filter((b) => b.tokensPerInterval > 0)
      .map((b) => {
        const u = b.unitsPerToken;
        return {
          key: b.key,
          refill: Math.max(1, toUnits(b.tokensPerInterval, u)),
          perMs: b.interval,
          burst: toUnits(b.bucketSize, u),
          initial: toUnits(b.initial, u),
          cost: toUnits(count, u),
        };
      });
  }

  /** The fewest tokens left in any bucket of the chain, from the figures of a grant or a peek. */
  static #least(chain: TokenBucket[], figures: LimitFigures[] | undefined, count: number): number {
    const levels = chain.map((b) => {
      if (b.tokensPerInterval === 0) return b.bucketSize - count;
      const level = figures?.find((f) => f.key === b.key)?.level;
      return level === undefined ? 0 : level / b.unitsPerToken;
    });
    return Math.min(...levels);
  }

  /** Each limit carries its own cost (in its own units), so the request names none. */
  #request(limits: Limit[]): AcquireRequest {
    return { key: this.key, limits };
  }

  /**
   * Waits until `count` tokens are in this bucket and every parent, removes them from all at
   * once, and resolves to the fewest left in any of them. A bucket of size 0 resolves to
   * `Infinity` at once. Rejects with a `RangeError` for a count above any bucket's size.
   */
  async removeTokens(count: number, options: WaitOptions = {}): Promise<number> {
    checkCount(count);
    const chain = this.#chain();
    if (chain.length === 0) return Number.POSITIVE_INFINITY;
    const small = TokenBucket.#tooSmall(chain, count);
    if (small) throw new InvalidArgumentError('count', `(${count}) exceeds the size of bucket ${JSON.stringify(small.key)} (${small.bucketSize})`);
    const limits = TokenBucket.#limits(chain, count);
    if (limits.length === 0) return TokenBucket.#least(chain, undefined, count);
    const permit = await this.#client.acquire({ ...this.#request(limits), report: true }, options);
    return TokenBucket.#least(chain, permit.limits, count);
  }

  /**
   * Removes `count` tokens from this bucket and every parent if all have them now: `true` when
   * removed, `false` (charging none) when any has too few, or the count is above any one's size.
   */
  async tryRemoveTokens(count: number): Promise<boolean> {
    checkCount(count);
    const chain = this.#chain();
    if (TokenBucket.#tooSmall(chain, count)) return false;
    const limits = TokenBucket.#limits(chain, count);
    if (limits.length === 0) return true;
    return (await this.#client.tryAcquire(this.#request(limits))).granted;
  }

  /**
   * The tokens in this bucket now (node `limiter`'s `content`, read from the limiter): a
   * fraction of a token counts down to the unit, and it is negative while a settle left the
   * bucket in debt. `Infinity` for a bucket of size 0; `bucketSize` for one that is always full.
   */
  async getTokensRemaining(): Promise<number> {
    if (this.bucketSize === 0) return Number.POSITIVE_INFINITY;
    if (this.tokensPerInterval === 0) return this.bucketSize;
    const peeked = await this.#client.peek(this.#request(TokenBucket.#limits([this], 0)));
    return TokenBucket.#least([this], peeked.limits, 0);
  }
}
