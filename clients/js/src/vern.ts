// VernLLM's `RateLimiterAdapter` over the limiter: `rateLimit: vernRateLimit({...})` makes every
// process of a VernLLM app count in one set of windows. Thin on purpose: the waiting, the line
// and the settle are the client's.

import type { LimiterClient, Limit } from './client.js';
import { estimateTokens } from './estimate.js';
import { InvalidArgumentError, type Reason } from './errors.js';
import type { Permit } from './permit.js';
import { MAX_WAIT_MS, vendorWaitMs } from './vendor.js';

/** The request VernLLM estimates from (its `WireRequest`; only these fields are read). */
export interface VernWireRequest {
  messages: readonly { content?: unknown }[];
  max_tokens?: number;
}

/** VernLLM's `ProviderRateLimitHint`. */
export interface VernRateLimitHint {
  remainingRequests?: number;
  limitRequests?: number;
  resetAfterMs?: number;
}

/** VernLLM's `RateLimitAcquireResult`. */
export interface VernAcquireResult {
  release: (actualTokens?: number, success?: boolean) => void;
  waitedMs: number;
  reason?: 'concurrency' | 'rpm' | 'tpm';
}

/** VernLLM's `RateLimitState`. */
export interface VernRateLimitState {
  requestsRemaining?: number;
  tokensRemaining?: number;
  concurrentInFlight?: number;
}

/** VernLLM's `Logger`. */
export interface VernLogger {
  debug(message: string): void;
  warn(message: string): void;
  error(message: string, meta?: Record<string, unknown>): void;
}

export interface VernRateLimitOptions {
  client: LimiterClient;
  /** Names the buckets (`KEY/rpm`, `KEY/tpm`, `KEY/conc`) every process shares. */
  key: string;
  /** The caller key throttles land on (default: `key`); one per provider credential. */
  callerKey?: string;
  requestsPerMinute?: number;
  tokensPerMinute?: number;
  maxConcurrent?: number;
  /** Give up after this long in line, in ms (default 30000; 0 waits as long as it takes). */
  maxQueueMs?: number;
  /** Reject at once when this many calls of this process already wait (default 0: unbounded). */
  maxQueueSize?: number;
  /** The pre-flight estimate (default: characters / 4 plus `max_tokens`, as VernLLM's). */
  estimateTokens?: (request: VernWireRequest) => number;
  /** Scales the estimate down (0 < f <= 1), as VernLLM's option does. */
  estimateFraction?: number;
  /** The window's length (default 60000: "per minute"); shorter for tests. */
  windowMs?: number;
  /** When a place never released lapses (default 600000). */
  holdMs?: number;
  /** How long a 429 closes the caller, in ms (VernLLM names no wait; default 5000). */
  throttleAfterMs?: number;
  /**
   * vern-llm's `LLMError`: pass it and a full line, a timeout in it, or a call that could never
   * fit throw VernLLM's own error with its code, which VernLLM does not retry (this package
   * imports nothing at run time, so it cannot construct one by itself).
   */
  LLMError?: new (message: string, type: 'rate_limited', options: { code: VernRateLimitCode; cause?: unknown }) => Error;
}

/** VernLLM's codes for a call its rate limiter gave up on. */
export type VernRateLimitCode = 'rate_limit_queue_full' | 'rate_limit_queue_timeout' | 'rate_limit_capacity_exceeded';

/** The adapter, plus `flush()` to wait for the releases and throttles it sent in the background. */
export interface VernRateLimit {
  estimate(request: VernWireRequest): number;
  acquire(estimatedTokens: number, signal?: AbortSignal): Promise<VernAcquireResult>;
  signalRateLimit(): void;
  reactToRateLimitHint(hint: VernRateLimitHint | undefined): void;
  readState(): Promise<VernRateLimitState>;
  setLogger(logger: VernLogger): void;
  /** Resolves once every release and throttle sent so far has been answered. */
  flush(): Promise<void>;
}

/** A call the adapter gave up on, with VernLLM's `type` and `code` (when no `LLMError` is given). */
export class VernRateLimitError extends Error {
  readonly type = 'rate_limited';
  readonly code: VernRateLimitCode;
  constructor(code: VernRateLimitCode, message: string, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'VernRateLimitError';
    this.code = code;
  }
}

function limitOption(v: number | undefined, field: string): number | undefined {
  if (v === undefined || v === 0) return undefined;
  if (!Number.isInteger(v) || v < 0) throw new InvalidArgumentError(field, `must be a non-negative integer, got ${String(v)}`);
  return v;
}

/** A VernLLM `RateLimiterAdapter` whose buckets live in the limiter, shared by every process. */
export function vernRateLimit(options: VernRateLimitOptions): VernRateLimit {
  const { client, key } = options;
  if (typeof key !== 'string' || key === '') throw new InvalidArgumentError('key', 'must be a non-empty string');
  const callerKey = options.callerKey ?? key;
  const rpm = limitOption(options.requestsPerMinute, 'requestsPerMinute');
  const tpm = limitOption(options.tokensPerMinute, 'tokensPerMinute');
  const concurrent = limitOption(options.maxConcurrent, 'maxConcurrent');
  const windowMs = limitOption(options.windowMs, 'windowMs') ?? 60_000;
  const holdMs = limitOption(options.holdMs, 'holdMs') ?? 600_000;
  const maxQueueMs = options.maxQueueMs ?? 30_000;
  if (!Number.isInteger(maxQueueMs) || maxQueueMs < 0) throw new InvalidArgumentError('maxQueueMs', 'must be a non-negative integer');
  const maxQueueSize = limitOption(options.maxQueueSize, 'maxQueueSize');
  const fraction = options.estimateFraction ?? 1;
  if (!Number.isFinite(fraction) || fraction <= 0) throw new InvalidArgumentError('estimateFraction', 'must be a finite number above 0');
  const throttleAfterMs = options.throttleAfterMs ?? 5_000;
  const keys = { rpm: `${key}/rpm`, tpm: `${key}/tpm`, conc: `${key}/conc` };
  const gaveUp = (code: VernRateLimitCode, message: string, cause?: unknown): Error =>
    options.LLMError
      ? new options.LLMError(message, 'rate_limited', cause === undefined ? { code } : { code, cause })
      : new VernRateLimitError(code, message, cause);
  let logger: VernLogger | undefined;
  const pending = new Set<Promise<unknown>>();

  /** Runs `work` in the background; a failure is logged, never thrown at VernLLM. */
  const background = (what: string, work: Promise<unknown>) => {
    const p = work.catch((e: unknown) =>
      logger?.error(`[redb-limiter] ${what} failed`, { message: e instanceof Error ? e.message : String(e) }),
    );
    pending.add(p);
    void p.finally(() => pending.delete(p));
  };

  const limits = (tokens: number): Limit[] => {
    const out: Limit[] = [];
    if (rpm !== undefined) out.push({ key: keys.rpm, calls: rpm, perMs: windowMs });
    if (tpm !== undefined) out.push({ key: keys.tpm, calls: tpm, perMs: windowMs, cost: tokens });
    if (concurrent !== undefined) out.push({ key: keys.conc, concurrent });
    return out;
  };

  const reasonOf = (reason: Reason, limit: string): VernAcquireResult['reason'] =>
    reason === 'concurrency' || limit === keys.conc ? 'concurrency' : limit === keys.tpm ? 'tpm' : 'rpm';

  const throttleFor = (ms: number) => {
    background('throttle', client.throttle(callerKey, client.serverNow() + ms));
  };

  return {
    estimate(request) {
      const guess = options.estimateTokens
        ? options.estimateTokens(request)
        : estimateTokens(request.messages, request.max_tokens ?? 0);
      return Math.ceil(guess * Math.min(fraction, 1));
    },

    async acquire(estimatedTokens, signal) {
      if (!Number.isFinite(estimatedTokens) || estimatedTokens < 0) {
        throw new InvalidArgumentError('estimatedTokens', `must be a finite, non-negative number, got ${String(estimatedTokens)}`);
      }
      const tokens = Math.ceil(estimatedTokens);
      if (tpm !== undefined && tokens > tpm) {
        throw gaveUp(
          'rate_limit_capacity_exceeded',
          `estimatedTokens (${tokens}) exceeds tokensPerMinute (${tpm}); this call could never acquire capacity`,
        );
      }
      let permit: Permit;
      try {
        permit = await client.acquire(
          { key: callerKey, limits: limits(tokens), cost: 1, holdMs, permit: tpm !== undefined },
          {
            ...(signal ? { signal } : {}),
            ...(maxQueueMs > 0 ? { maxWaitMs: maxQueueMs } : {}),
            ...(maxQueueSize !== undefined ? { maxWaiters: maxQueueSize } : {}),
          },
        );
      } catch (e) {
        if (e instanceof Error && e.name === 'QueueFullError') {
          throw gaveUp('rate_limit_queue_full', 'Rate limit queue is full', e);
        }
        if (e instanceof Error && e.name === 'LimitedError' && (e as { trigger?: string }).trigger === 'maxWait') {
          throw gaveUp('rate_limit_queue_timeout', e.message, e);
        }
        throw e;
      }
      let done = false;
      const result: VernAcquireResult = {
        release: (actualTokens?: number) => {
          if (done) return;
          done = true;
          const real = tpm !== undefined && actualTokens !== undefined && Number.isFinite(actualTokens);
          background('release', real ? permit.release({ [keys.tpm]: Math.max(0, Math.round(actualTokens)) }) : permit.release());
        },
        waitedMs: permit.waitedMs,
      };
      if (permit.waitedFor) result.reason = reasonOf(permit.waitedFor.reason, permit.waitedFor.limit);
      return result;
    },

    signalRateLimit() {
      throttleFor(vendorWaitMs({}, null, { defaultMs: throttleAfterMs }));
    },

    reactToRateLimitHint(hint) {
      if (!hint || hint.remainingRequests !== 0) return;
      const reset = hint.resetAfterMs;
      if (reset === undefined || !Number.isFinite(reset) || reset <= 0) return;
      throttleFor(Math.min(Math.ceil(reset), MAX_WAIT_MS));
    },

    async readState() {
      const peeked = await client.peek({ key: callerKey, limits: limits(0) });
      const state: VernRateLimitState = {};
      for (const f of peeked.limits) {
        if (f.key === keys.rpm) state.requestsRemaining = f.remaining;
        if (f.key === keys.tpm) state.tokensRemaining = f.remaining;
        if (f.key === keys.conc) state.concurrentInFlight = f.held;
      }
      return state;
    },

    setLogger(l) {
      logger = l;
    },

    async flush() {
      while (pending.size > 0) await Promise.all([...pending]);
    },
  };
}
