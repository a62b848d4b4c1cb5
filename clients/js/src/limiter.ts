// node `limiter`'s `RateLimiter` shape over the limiter: `tokensPerInterval` calls (counting each
// removal's count) in any `interval`, shared by every process that names the same `key`. Every
// method asks the server, so each returns a Promise (node `limiter`'s `tryRemoveTokens` and
// `getTokensRemaining` answer synchronously: await them here).

import type { AcquireRequest, LimiterClient } from './client.js';
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

export interface RateLimiterOptions {
  client: LimiterClient;
  /** The bucket (and the caller key throttles land on). */
  key: string;
  tokensPerInterval: number;
  interval: Interval;
}

export class RateLimiter {
  readonly tokensPerInterval: number;
  readonly intervalMs: number;
  readonly #client: LimiterClient;
  readonly #key: string;

  constructor(options: RateLimiterOptions) {
    const { client, key, tokensPerInterval, interval } = options;
    if (typeof key !== 'string' || key === '') throw new InvalidArgumentError('key', 'must be a non-empty string');
    if (!Number.isInteger(tokensPerInterval) || tokensPerInterval < 1) {
      throw new InvalidArgumentError('tokensPerInterval', `must be a positive integer, got ${String(tokensPerInterval)}`);
    }
    const ms = typeof interval === 'number' ? interval : INTERVALS[interval];
    if (ms === undefined || !Number.isInteger(ms) || ms < 1) {
      throw new InvalidArgumentError('interval', `must be a positive integer of ms or one of ${Object.keys(INTERVALS).join(', ')}`);
    }
    this.#client = client;
    this.#key = key;
    this.tokensPerInterval = tokensPerInterval;
    this.intervalMs = ms;
  }

  #request(count: number): AcquireRequest {
    if (!Number.isInteger(count) || count < 0) throw new InvalidArgumentError('count', `must be a non-negative integer, got ${String(count)}`);
    if (count > this.tokensPerInterval) {
      throw new InvalidArgumentError('count', `(${count}) exceeds tokensPerInterval (${this.tokensPerInterval})`);
    }
    return { key: this.#key, cost: count, limits: [{ key: this.#key, calls: this.tokensPerInterval, perMs: this.intervalMs }] };
  }

  /** Waits until `count` tokens can be removed, removes them, and resolves to the tokens left. */
  async removeTokens(count: number, options: { signal?: AbortSignal; maxWaitMs?: number } = {}): Promise<number> {
    const permit = await this.#client.acquire({ ...this.#request(count), report: true }, options);
    return permit.limits?.[0]?.remaining ?? 0;
  }

  /** Removes `count` tokens if they are there now: `true` when removed. Never waits. */
  async tryRemoveTokens(count: number): Promise<boolean> {
    return (await this.#client.tryAcquire(this.#request(count))).granted;
  }

  /** The tokens that could be removed now. */
  async getTokensRemaining(): Promise<number> {
    const peeked = await this.#client.peek(this.#request(0));
    return peeked.limits[0]?.remaining ?? 0;
  }

  /** How long, in ms, until `count` tokens could be removed (0 when they can now). */
  async getWaitTime(count = 1): Promise<number> {
    const peeked = await this.#client.peek(this.#request(count));
    if (peeked.fits || !peeked.retryAt) return 0;
    return Math.max(0, peeked.retryAt.getTime() - peeked.now.getTime());
  }
}
