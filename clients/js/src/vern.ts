// VernLLM's `RateLimiterAdapter` over the limiter: `rateLimit: vernRateLimit({...})` makes every
// process of a VernLLM app count in one set of windows. Thin on purpose: the waiting, the line
// and the settle are the client's; this file owns what VernLLM's own limiter would say — its
// queue's count, its errors and codes, the reason a call waited — and reading a provider's 429
// off the LLM client it wraps.

import type { AcquireRequest, LimiterClient, Limit } from './client.js';
import { estimateTokens } from './estimate.js';
import {
  BadRequestError,
  InvalidArgumentError,
  LimitedError,
  QueueFullError,
  UnauthorizedError,
  type Reason,
} from './errors.js';
import { MAX_WAIT_MS, vendorWaitMs, type HeadersLike } from './vendor.js';

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

/**
 * VernLLM's `RateLimitAcquireResult`. A call that waited on a throttle (a provider's 429 closed
 * the caller) reports `reason: 'throttle'`, a value VernLLM's own type has no member for; the
 * field keeps VernLLM's type so that the adapter stays assignable to its `RateLimiterAdapter`.
 */
export interface VernAcquireResult {
  release: (actualTokens?: number, success?: boolean) => void;
  waitedMs: number;
  reason?: 'concurrency' | 'rpm' | 'tpm';
}

/** What held a call back: one of VernLLM's reasons, or a throttle on the caller. */
export type VernWaitReason = 'concurrency' | 'rpm' | 'tpm' | 'throttle';

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

/**
 * VernLLM's `AimdOptions`, kept by the limiter (wire section 14) as one ceiling of the requests
 * window that every process adapts: `minCapacity` and `maxCapacity` bound it (rounded inwards to
 * whole calls), `decreaseFactor` is the share a cut keeps (as a whole percent, 1-99),
 * `increaseBy` what a clean call adds (rounded up to a whole call), at most once per window, and
 * a hint of `remainingRequests` at or below `proactiveFloor` (when above 0) counts as a 429.
 */
export interface VernAimdOptions {
  increaseBy: number;
  decreaseFactor: number;
  minCapacity: number;
  maxCapacity: number;
  proactiveFloor?: number;
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
  /** Give up after this long in the queue, in ms (default 30000; 0 waits as long as it takes). */
  maxQueueMs?: number;
  /** Reject at once when this many calls of this adapter already wait (default 0: unbounded). */
  maxQueueSize?: number;
  /** The pre-flight estimate (default: characters / 4 plus `max_tokens`, as VernLLM's). */
  estimateTokens?: (request: VernWireRequest) => number;
  /** Scales the estimate down (0 < f <= 1), as VernLLM's option does. */
  estimateFraction?: number;
  /**
   * VernLLM's additive-increase, multiplicative-decrease ceiling on `requestsPerMinute`, kept by
   * the limiter for every process (see `VernAimdOptions`). Needs `requestsPerMinute`, which is
   * where the ceiling starts (brought within `[minCapacity, maxCapacity]`).
   */
  aimd?: VernAimdOptions;
  /** The window's length (default 60000: "per minute"); shorter for tests. */
  windowMs?: number;
  /** When a place never released lapses (default 600000). */
  holdMs?: number;
  /** How long a 429 that names no wait closes the caller, in ms (default 5000). */
  throttleAfterMs?: number;
  /**
   * vern-llm's `LLMError`. Without it the adapter loads vern-llm's own (the copy this package
   * resolves, in the module format it was loaded in); pass it when the app loads vern-llm in the
   * other format, or from another copy.
   */
  LLMError?: VernLLMErrorClass;
}

/** VernLLM's codes for a call its rate limiter gave up on. */
export type VernRateLimitCode = 'rate_limit_queue_full' | 'rate_limit_queue_timeout' | 'rate_limit_capacity_exceeded';

/** The `type`s of VernLLM's `LLMError` the adapter throws. */
export type VernErrorType = 'rate_limited' | 'invalid_params';

/** vern-llm's `LLMError` constructor, as the adapter calls it. */
export type VernLLMErrorClass = new (
  message: string,
  type: VernErrorType,
  options: { code?: VernRateLimitCode; cause?: unknown },
) => Error;

/** The LLM client shape VernLLM takes (`LLMClient`), as far as `wrapClient` reads it. */
export interface VernLLMClientLike {
  chat: {
    completions: {
      create(request: never, options: never): Promise<unknown>;
      createStream?(request: never, options: never): AsyncIterable<unknown>;
    };
  };
}

/** The adapter, plus `wrapClient` for the provider's 429s and `flush()` for what it sent in the background. */
export interface VernRateLimit {
  estimate(request: VernWireRequest): number;
  acquire(estimatedTokens: number, signal?: AbortSignal): Promise<VernAcquireResult>;
  signalRateLimit(): void;
  reactToRateLimitHint(hint: VernRateLimitHint | undefined): void;
  readState(): Promise<VernRateLimitState>;
  setLogger(logger: VernLogger): void;
  /**
   * The same LLM client, reading each 429 it throws: the caller is closed, for every process,
   * for the wait the provider asked (`Retry-After` and the providers' own headers), where
   * `signalRateLimit()` alone knows of no wait. Pass the wrapped client to VernLLM.
   */
  wrapClient<C extends VernLLMClientLike>(llmClient: C): C;
  /** Resolves once every release and throttle sent so far has been answered. */
  flush(): Promise<void>;
}

/**
 * A call the adapter gave up on, or a limiter that failed, with VernLLM's `type` and `code`:
 * thrown only where vern-llm's `LLMError` could be neither loaded nor was passed.
 */
export class VernRateLimitError extends Error {
  readonly type: VernErrorType;
  readonly code: VernRateLimitCode | undefined;
  constructor(code: VernRateLimitCode | undefined, message: string, cause?: unknown, type: VernErrorType = 'rate_limited') {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'VernRateLimitError';
    this.type = type;
    this.code = code;
  }
}

/** Every option `vernRateLimit` takes: anything else is an error, never silently ignored. */
const OPTIONS: ReadonlySet<string> = new Set([
  'client',
  'key',
  'callerKey',
  'requestsPerMinute',
  'tokensPerMinute',
  'maxConcurrent',
  'maxQueueMs',
  'maxQueueSize',
  'estimateTokens',
  'estimateFraction',
  'aimd',
  'windowMs',
  'holdMs',
  'throttleAfterMs',
  'LLMError',
]);

/** Set by the build: true in the CommonJS build, where `require` is the module's own. */
declare const __CJS__: boolean;
declare const require: (id: string) => unknown;

let vernLLMError: Promise<VernLLMErrorClass | undefined> | undefined;

/**
 * vern-llm's own `LLMError`, loaded once, in this package's module format (the CommonJS build
 * requires vern-llm's CommonJS build, the ES module build imports its ES module), as an app that
 * loads both packages alike gets them; undefined where vern-llm is not installed.
 */
function loadLLMError(): Promise<VernLLMErrorClass | undefined> {
  if (vernLLMError === undefined) {
    const loading: Promise<unknown> = __CJS__
      ? new Promise((resolve) => resolve(require('vern-llm')))
      : import('vern-llm');
    vernLLMError = loading.then(
      (m) => (m as { LLMError?: VernLLMErrorClass }).LLMError,
      () => undefined,
    );
  }
  return vernLLMError;
}

/** The status of an error an LLM client threw, read as VernLLM reads it. */
function statusOf(e: unknown): number | undefined {
  if (typeof e !== 'object' || e === null) return undefined;
  const { status, statusCode, $metadata } = e as { status?: unknown; statusCode?: unknown; $metadata?: { httpStatusCode?: unknown } };
  for (const s of [status, statusCode, $metadata?.httpStatusCode]) if (typeof s === 'number') return s;
  return undefined;
}

/** The headers, and the body when the error carries one, of a provider's failed response. */
function responseOf(e: object): { headers: HeadersLike; body?: string } {
  const { headers, response, error } = e as { headers?: unknown; response?: { headers?: unknown }; error?: unknown };
  const found = headers ?? response?.headers;
  const out: { headers: HeadersLike; body?: string } = {
    headers: typeof found === 'object' && found !== null ? (found as HeadersLike) : {},
  };
  if (typeof error === 'object' && error !== null) out.body = JSON.stringify(error);
  return out;
}

/** A finite number of `aimd`, named as VernLLM names it. */
function aimdNumber(v: unknown, field: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v)) throw new InvalidArgumentError(`aimd.${field}`, `must be a finite number, got ${String(v)}`);
  return v;
}

/**
 * VernLLM's `aimd` as the rpm window's `adapt` (section 14): checked as VernLLM checks it, with
 * the requests window declared at `requestsPerMinute` brought within the ceiling's bounds.
 */
function aimdOf(
  a: VernAimdOptions,
  rpm: number | undefined,
): { calls: number; adapt: NonNullable<Limit['adapt']>; proactiveFloor: number } {
  if (typeof a !== 'object' || a === null) throw new InvalidArgumentError('aimd', 'must be an object');
  const known = new Set(['increaseBy', 'decreaseFactor', 'minCapacity', 'maxCapacity', 'proactiveFloor']);
  for (const name of Object.keys(a)) {
    if (!known.has(name)) throw new InvalidArgumentError(`aimd.${name}`, `is not an option of aimd (it takes ${[...known].join(', ')})`);
  }
  if (rpm === undefined) {
    throw new InvalidArgumentError('aimd', 'adapts the requests ceiling, so it needs requestsPerMinute (where the ceiling starts)');
  }
  const increaseBy = aimdNumber(a.increaseBy, 'increaseBy');
  const decreaseFactor = aimdNumber(a.decreaseFactor, 'decreaseFactor');
  const minCapacity = aimdNumber(a.minCapacity, 'minCapacity');
  const maxCapacity = aimdNumber(a.maxCapacity, 'maxCapacity');
  if (minCapacity < 1 || maxCapacity < 1) {
    throw new InvalidArgumentError('aimd.minCapacity', `and aimd.maxCapacity must both be at least 1, got ${minCapacity} and ${maxCapacity}`);
  }
  if (minCapacity > maxCapacity) {
    throw new InvalidArgumentError('aimd.minCapacity', `must not exceed aimd.maxCapacity, got ${minCapacity} > ${maxCapacity}`);
  }
  const proactiveFloor = a.proactiveFloor === undefined ? 0 : aimdNumber(a.proactiveFloor, 'proactiveFloor');
  const min = Math.ceil(minCapacity);
  const max = Math.min(Math.max(min, Math.floor(maxCapacity)), 1_000_000_000);
  const calls = Math.min(Math.max(rpm, min), max);
  const adapt = {
    min,
    max,
    increase: Math.min(Math.ceil(Math.max(0, increaseBy)), 1_000_000),
    keepPct: Math.min(Math.max(Math.round(decreaseFactor * 100), 1), 99),
  };
  return { calls, adapt, proactiveFloor };
}

function limitOption(v: number | undefined, field: string): number | undefined {
  if (v === undefined || v === 0) return undefined;
  if (!Number.isInteger(v) || v < 0) throw new InvalidArgumentError(field, `must be a non-negative integer, got ${String(v)}`);
  return v;
}

/** A VernLLM `RateLimiterAdapter` whose buckets live in the limiter, shared by every process. */
export function vernRateLimit(options: VernRateLimitOptions): VernRateLimit {
  if (typeof options !== 'object' || options === null) throw new InvalidArgumentError('options', 'must be an object');
  for (const name of Object.keys(options)) {
    if (!OPTIONS.has(name)) {
      throw new InvalidArgumentError(name, `is not an option of vernRateLimit (it takes ${[...OPTIONS].join(', ')})`);
    }
  }
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
  const aimd = options.aimd === undefined ? undefined : aimdOf(options.aimd, rpm);

  /** VernLLM's own error, so that VernLLM reads its type and code (and never retries these codes). */
  const vernError = async (type: VernErrorType, code: VernRateLimitCode | undefined, message: string, cause?: unknown) => {
    const LLMError = options.LLMError ?? (await loadLLMError());
    const opts: { code?: VernRateLimitCode; cause?: unknown } = {};
    if (code !== undefined) opts.code = code;
    if (cause !== undefined) opts.cause = cause;
    return LLMError ? new LLMError(message, type, opts) : new VernRateLimitError(code, message, cause, type);
  };
  /** A failure of the limiter itself, named as such (not as the provider's). */
  const limiterFailed = (e: unknown) => {
    const misuse = e instanceof BadRequestError || e instanceof UnauthorizedError || e instanceof InvalidArgumentError;
    const why = e instanceof Error ? e.message : String(e);
    return vernError(misuse ? 'invalid_params' : 'rate_limited', undefined, `rate limiter (redb-limiter at ${client.url}) failed: ${why}`, e);
  };

  let logger: VernLogger | undefined;
  const pending = new Set<Promise<unknown>>();
  /** Calls of this adapter that wait, as VernLLM counts its queue: from their first refusal on. */
  let queued = 0;
  /** What held back the latest call that had to wait: the reason of a call queued behind it. */
  let heldBy: VernWaitReason | undefined;
  /** 429s read through `wrapClient` whose `signalRateLimit()` (VernLLM's, right after) is not to throttle again. */
  const readFromClient = new Set<object>();
  /** Settles once the latest call has been decided (granted at once, or queued): calls are decided in the order they came. */
  let decided: Promise<void> = Promise.resolve();

  /** Runs `work` in the background; a failure is logged, never thrown at VernLLM. */
  const background = (what: string, work: Promise<unknown>) => {
    const p = work.catch((e: unknown) =>
      logger?.error(`[redb-limiter] ${what} failed`, { message: e instanceof Error ? e.message : String(e) }),
    );
    pending.add(p);
    void p.finally(() => pending.delete(p));
  };

  /**
   * A 429 or a low hint VernLLM signalled for the call whose release comes next: VernLLM signals
   * and then releases the same call in one turn, so it is kept until the end of that turn only.
   */
  let limitedSignals = 0;
  const signalLimited = () => {
    if (aimd === undefined) return;
    limitedSignals++;
    setTimeout(() => (limitedSignals = Math.max(0, limitedSignals - 1)), 0);
  };

  const limits = (tokens: number): Limit[] => {
    const out: Limit[] = [];
    if (rpm !== undefined) out.push({ key: keys.rpm, calls: aimd?.calls ?? rpm, perMs: windowMs, ...(aimd ? { adapt: aimd.adapt } : {}) });
    if (tpm !== undefined) out.push({ key: keys.tpm, calls: tpm, perMs: windowMs, cost: tokens });
    if (concurrent !== undefined) out.push({ key: keys.conc, concurrent });
    return out;
  };

  const reasonOf = (reason: Reason, limit: string): VernWaitReason =>
    reason === 'throttle' ? 'throttle' : reason === 'concurrency' || limit === keys.conc ? 'concurrency' : limit === keys.tpm ? 'tpm' : 'rpm';

  const throttleFor = (ms: number) => {
    background('throttle', client.throttle(callerKey, client.serverNow() + ms));
  };

  /** The grant as VernLLM takes it: a `release` that settles the tokens window and frees the place. */
  const granted = (permit: string | undefined, waitedMs: number, reason: VernWaitReason | undefined): VernAcquireResult => {
    let done = false;
    const result: VernAcquireResult = {
      release: (actualTokens?: number, success?: boolean) => {
        if (done || permit === undefined) return;
        done = true;
        const real = tpm !== undefined && actualTokens !== undefined && Number.isFinite(actualTokens);
        // The ceiling hears every call (section 14): `limited` after VernLLM signalled a 429 or a
        // low hint for it, `clean` on its success, nothing for a call that failed otherwise.
        let outcome: 'clean' | 'limited' | undefined;
        if (aimd !== undefined) {
          if (limitedSignals > 0) {
            limitedSignals--;
            outcome = 'limited';
          } else if (success === true) {
            outcome = 'clean';
          }
        }
        const costs = real ? { [keys.tpm]: Math.max(0, Math.round(actualTokens)) } : undefined;
        background('release', client.release(permit, costs, outcome === undefined ? {} : { outcome }));
      },
      waitedMs,
    };
    // VernLLM's type has no throttle; the value says what held the call (see `VernAcquireResult`).
    if (waitedMs > 0 && reason !== undefined) result.reason = reason as VernAcquireResult['reason'];
    return result;
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
        throw await vernError(
          'rate_limited',
          'rate_limit_capacity_exceeded',
          `estimatedTokens (${tokens}) exceeds tokensPerMinute (${tpm}); this call could never acquire capacity`,
        );
      }
      if (signal?.aborted) throw new LimitedError('aborted', undefined, 0, signal.reason);
      const arrived = performance.now();
      const request: AcquireRequest = { key: callerKey, limits: limits(tokens), cost: 1, holdMs, permit: tpm !== undefined || aimd !== undefined };
      const full = () => vernError('rate_limited', 'rate_limit_queue_full', 'Rate limit queue is full', new QueueFullError(queued));
      // As VernLLM's limiter, in the order the calls came: with nobody waiting, one ask goes
      // straight through when there is room; a call that finds others waiting, or is refused,
      // queues (and counts) behind them.
      const before = decided;
      let decide!: () => void;
      decided = new Promise((resolve) => (decide = resolve));
      let reason: VernWaitReason | undefined;
      try {
        await before;
        if (queued === 0) {
          let reply;
          try {
            reply = await client.tryAcquire(request);
          } catch (e) {
            throw await limiterFailed(e);
          }
          if (reply.granted) return granted(reply.permit, 0, undefined);
          reason = heldBy = reasonOf(reply.reason, reply.limit);
        } else {
          reason = heldBy;
        }
        if (maxQueueSize !== undefined && queued >= maxQueueSize) throw await full();
        queued++;
      } finally {
        decide();
      }
      try {
        const permit = await client.acquire(request, {
          ...(signal ? { signal } : {}),
          ...(maxQueueMs > 0 ? { maxWaitMs: maxQueueMs } : {}),
        });
        if (permit.waitedFor) reason = heldBy = reasonOf(permit.waitedFor.reason, permit.waitedFor.limit);
        return granted(permit.id, Math.max(1, Math.round(performance.now() - arrived)), reason);
      } catch (e) {
        if (e instanceof LimitedError && e.trigger === 'maxWait') {
          throw await vernError('rate_limited', 'rate_limit_queue_timeout', `Rate limit queue timed out before capacity was available: ${e.message}`, e);
        }
        if (e instanceof LimitedError) throw e;
        throw await limiterFailed(e);
      } finally {
        queued--;
      }
    },

    signalRateLimit() {
      signalLimited();
      // Right after a 429 that `wrapClient` read, VernLLM calls this too: that 429's own wait stands.
      const read = readFromClient.values().next();
      if (!read.done) {
        readFromClient.delete(read.value);
        return;
      }
      // With aimd the cut of the shared ceiling answers a 429 that names no wait, as VernLLM's
      // own limiter answers it (it closes nothing); without, the caller closes for throttleAfterMs.
      if (aimd !== undefined) return;
      throttleFor(vendorWaitMs({}, null, { defaultMs: throttleAfterMs }));
    },

    reactToRateLimitHint(hint) {
      const floor = aimd?.proactiveFloor ?? 0;
      if (hint?.remainingRequests !== undefined && floor > 0 && hint.remainingRequests <= floor) signalLimited();
      if (!hint || hint.remainingRequests !== 0) return;
      const reset = hint.resetAfterMs;
      if (reset === undefined || !Number.isFinite(reset) || reset <= 0) return;
      throttleFor(Math.min(Math.ceil(reset), MAX_WAIT_MS));
    },

    async readState() {
      let peeked;
      try {
        peeked = await client.peek({ key: callerKey, limits: limits(0) });
      } catch (e) {
        throw await limiterFailed(e);
      }
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

    wrapClient(llmClient) {
      const completions = llmClient.chat.completions as {
        create(request: unknown, options: unknown): Promise<unknown>;
        createStream?(request: unknown, options: unknown): AsyncIterable<unknown>;
      };
      const read = (e: unknown) => {
        if (statusOf(e) !== 429) return;
        const { headers, body } = responseOf(e as object);
        throttleFor(vendorWaitMs(headers, body, { now: client.serverNow(), defaultMs: throttleAfterMs }));
        // VernLLM signals within the same turn, if at all; a 429 it never signals (its own
        // timeout came first) must not swallow a later one's.
        const token = {};
        readFromClient.add(token);
        setTimeout(() => readFromClient.delete(token), 0);
      };
      const wrapped: Record<string, unknown> = {
        ...completions,
        async create(request: unknown, opts: unknown) {
          try {
            return await completions.create(request, opts);
          } catch (e) {
            read(e);
            throw e;
          }
        },
      };
      const stream = completions.createStream;
      if (stream) {
        wrapped.createStream = async function* (request: unknown, opts: unknown) {
          try {
            yield* stream.call(completions, request, opts);
          } catch (e) {
            read(e);
            throw e;
          }
        };
      }
      return { ...llmClient, chat: { ...llmClient.chat, completions: wrapped } } as typeof llmClient;
    },

    async flush() {
      while (pending.size > 0) await Promise.all([...pending]);
    },
  };
}
