// The client: every method of the wire over HTTP (`transport.ts`), and the waiting `acquire`. The limiter never
// waits; the host does. `acquire` waits for each refusal's `retryAt` (sized on the limiter's
// clock), holds a ticket in the limiter's line (section 12 of the wire) when the server gives one,
// tells the line how much of its `maxWaitMs` remains (`maxWaitMs`, section 12.9), and keeps its
// own first-in-first-out line per request shape in front of it, so only the head of each shape
// asks and a large call is never overtaken by smaller ones behind it. A head holding a ticket
// waits on `/wait` (section 15), which answers the moment its turn has come, and a release through
// this client wakes at once the heads of its shapes on the same buckets that wait without one.
// Every ask carries a request id (section 16), and an ask whose answer the caller stops waiting
// for (a timeout, `maxWaitMs`, an abort, a lost connection) is undone by that id in the
// background, so nothing it may have been granted or filed stays behind.

import {
  ApiError,
  BadRequestError,
  ConnectionError,
  InvalidArgumentError,
  LimitedError,
  type NoTicket,
  NotFoundError,
  ProtocolError,
  QueueFullError,
  type Reason,
  UnauthorizedError,
  UnavailableError,
} from './errors.js';
import { Permit, type Costs } from './permit.js';
import { type LocalServer, type StartServerOptions, startServer } from './server.js';
import { type Answer, type Send, viaFetch, viaNodeHttp } from './transport.js';
import { type HeadersLike, vendorBudget, vendorWaitMs } from './vendor.js';

/**
 * One bucket a call counts in: a rolling window (`calls` per `perMs`) or a token bucket (`refill`
 * per `perMs`, up to `burst`), concurrency, or a window or token bucket with concurrency.
 */
export interface Limit {
  key: string;
  calls?: number;
  perMs?: number;
  /** A token bucket (wire section 13): `refill` tokens every `perMs`, continuously. Never with `calls`. */
  refill?: number;
  /** The most a token bucket holds (default: `refill`). */
  burst?: number;
  /** A token bucket's level the first time it is named (default: `burst`, full). */
  initial?: number;
  concurrent?: number;
  /** What this call counts in this limit's window or takes from its token bucket (default: the request's `cost`). */
  cost?: number;
  /** When a place never released lapses (default: the request's `holdMs`). */
  holdMs?: number;
  /**
   * An adaptive ceiling (wire section 14) on this window or token bucket, kept by the limiter and
   * shared by every host that names the bucket so: the limit is judged with the ceiling in place of
   * `calls` (`refill`), cut on a `limited` outcome and grown on `clean` ones. `{}` takes the
   * defaults. A request with one asks for a permit (`permit: true`) unless it says otherwise.
   */
  adapt?: Adapt;
}

/**
 * The bounds and steps of an adaptive ceiling (wire section 14); every field has the wire's default.
 */
export interface Adapt {
  /** The lowest the ceiling goes: 1 to `calls` (default a tenth of `calls`, at least 1). */
  min?: number;
  /** The highest the ceiling goes: `calls` to 10^9 (default `calls`). */
  max?: number;
  /** What a clean outcome adds, at most once per window: 0 to 10^6 (default 1). */
  increase?: number;
  /** The percent of the ceiling a cut keeps: 1 to 99 (default 50). */
  keepPct?: number;
}

/**
 * What a granted call met at the provider, for an adaptive ceiling (wire section 14): `limited`
 * (a 429, or a remaining count at or below the host's floor) cuts it, `clean` may grow it.
 */
export type Outcome = 'clean' | 'limited';

/** The params of `acquire` and `peek`, as the wire takes them. */
export interface AcquireRequest {
  /** The caller the call is made as; where a throttle lands. */
  key: string;
  limits: readonly Limit[];
  cost?: number;
  holdMs?: number;
  /** Ask for a permit even without a concurrency place, so the grant can be settled. */
  permit?: boolean;
  /** Ask for `now` and each limit's figures on the reply. */
  report?: boolean;
  /** How long a ticket in the line outlives its `retryAt` unless asked again (100-60000). */
  graceMs?: number;
}

/**
 * One limit's figures (`report`, `peek`): window `used`/`remaining`, token bucket `level`/`burst`,
 * places `held`/`free`.
 */
export interface LimitFigures {
  key: string;
  used?: number;
  remaining?: number;
  /** A token bucket's whole tokens, rounded down; negative while a settle left it in debt. */
  level?: number;
  /** A token bucket's most. */
  burst?: number;
  held?: number;
  free?: number;
  /** Live tickets in the bucket's line (servers of wire version 3). */
  queued?: number;
  /** An adapted limit's ceiling, as this request is judged (wire section 14). */
  ceiling?: number;
}

export interface Granted {
  granted: true;
  at: Date;
  /** Present exactly when the grant holds a place or was asked with `permit: true`. */
  permit?: string;
  now?: Date;
  limits?: LimitFigures[];
}

export interface Refused {
  granted: false;
  retryAt: Date;
  reason: Reason;
  /** The bucket key (for a throttle, the caller key) whose `retryAt` stands. */
  limit: string;
  now?: Date;
  limits?: LimitFigures[];
  /** A queued refusal's place in the line (wire version 3). */
  ticket?: string;
  lapseAt?: Date;
  ahead?: number;
  /** Why a queued refusal filed no ticket (wire version 4); absent when the server did not say. */
  noTicket?: NoTicket;
}

/** The wire's answer to one `acquire`, with instants as `Date`s. */
export type AcquireReply = Granted | Refused;

export interface PeekReply {
  fits: boolean;
  retryAt?: Date;
  reason?: Reason;
  limit?: string;
  now: Date;
  limits: LimitFigures[];
}

export interface AcquireOptions {
  /**
   * Stop waiting when aborted, at once, also while a request is in flight (leaving the line and
   * undoing that ask by its id); rejects with a `LimitedError`.
   */
  signal?: AbortSignal;
  /**
   * Give up after this long, or at once when the next `retryAt` lies beyond it. Each ask in the
   * line carries what remains of it as `maxWaitMs`, so the limiter files no ticket for a call it
   * could not serve in time (it answers `noTicket: 'horizon'`, and this rejects at once).
   */
  maxWaitMs?: number;
  /** Hold a ticket in the limiter's line while waiting (default true). */
  queue?: boolean;
  /** Reject with `QueueFullError` when this many already wait for the same shape here. */
  maxWaiters?: number;
}

/** One wait of `acquire`, as the `onWait` hook sees it. */
export interface WaitReport {
  /** How long it waited before asking again. */
  waitedMs: number;
  reason: Reason;
  /** The limit key (for a throttle, the caller key) whose `retryAt` it waited for. */
  limit: string;
  /** With a ticket in the limiter's line: the most tickets ahead of it in any of its lines. */
  ahead?: number;
  /**
   * What ended the wait before its `retryAt`, if anything: the limiter said its ticket is `ready`
   * or `gone` (`/wait`), or a `release` through this client freed room in one of its buckets.
   */
  woken?: Woken;
}

/** What woke a waiting `acquire` before its `retryAt` (see `WaitReport.woken`). */
export type Woken = 'ready' | 'gone' | 'release';

/** The answer of `/wait` (section 15 of the wire): the tickets ready or gone, each list possibly empty. */
export interface WaitReply {
  /** Tickets whose request, asked with the ticket, would be granted now. */
  ready: string[];
  /** Tickets unknown to the limiter, ended or lapsed. */
  gone: string[];
  now: Date;
}

export interface LimiterClientOptions {
  /** The server, e.g. `http://127.0.0.1:7411`. */
  url: string;
  /** The bearer token, when the server has one. */
  token?: string;
  /**
   * A `fetch` to send every request through (a proxy, instrumentation, a test). Without one the
   * client uses Node's `http`/`https` with connections kept open, which costs about a third of
   * the CPU per request that the global `fetch` does.
   */
  fetch?: typeof fetch;
  /** Per HTTP request (default 30000); an acquire not answered in time is undone by its id. */
  timeoutMs?: number;
  /** The default `maxWaiters` of `acquire` (default: unbounded). */
  maxWaiters?: number;
  /** The throttle a 429 that names no wait stands for, in ms (default 5000). */
  throttleAfterMs?: number;
  /** Called after every wait of `acquire`. */
  onWait?: (report: WaitReport) => void;
  /**
   * Makes the id each ask to `/acquire` carries (section 16 of the wire): a new string of 1-128
   * bytes on every call (default: a random UUID).
   */
  requestId?: () => string;
}

/** A provider's response, as `throttleFrom` reads it. */
export type ResponseLike = Response | { status: number; headers: HeadersLike; body?: string | Uint8Array | null };

interface Refusal {
  reason: Reason;
  limit: string;
  retryAt: Date;
  noTicket?: NoTicket;
}

/** The local first-in-first-out line of one request shape: a fair lock its head holds. */
class Line {
  waiting = 0;
  held = false;
  queue: (() => void)[] = [];
  last: Refusal | undefined;
  /** The buckets the shape names: a release through this client in one of them wakes the head (unless it waits on `/wait`). */
  readonly buckets: ReadonlySet<string>;
  /** A wake that came while the head was not pausing (its ask in flight): its next pause ends at once. */
  #woken = false;
  #onWake: (() => void) | undefined;
  /**
   * Since when (a `performance.now()` instant) the asks of this shape have had no answer: set by
   * the first ask of a streak, cleared by any answer. A caller behind a head whose ask got none
   * has waited on the limiter since then too, so its own timeout counts from it.
   */
  unansweredSince: number | undefined;
  /** The error of the latest ask that got no answer. */
  lost: ConnectionError | undefined;

  constructor(buckets: Iterable<string>) {
    this.buckets = new Set(buckets);
  }

  /** Room was freed in one of the shape's buckets: the head's pause ends now, or its next one at once. */
  wake(): void {
    const onWake = this.#onWake;
    this.#onWake = undefined;
    if (onWake) onWake();
    else this.#woken = true;
  }

  /** Whether a wake came since this was last asked (the head's last ask, or its last pause); it is taken. */
  takeWake(): boolean {
    const woken = this.#woken;
    this.#woken = false;
    return woken;
  }

  /** Calls `fn` at the next wake, instead of keeping it; the function returned stops listening. */
  onWake(fn: () => void): () => void {
    this.#onWake = fn;
    return () => {
      if (this.#onWake === fn) this.#onWake = undefined;
    };
  }

  /** Resolves when this caller is at the head; `cancel` withdraws before that. */
  take(): { turn: Promise<void>; cancel: () => boolean; queued: boolean } {
    if (!this.held) {
      this.held = true;
      return { turn: Promise.resolve(), cancel: () => false, queued: false };
    }
    let wake!: () => void;
    const turn = new Promise<void>((resolve) => (wake = resolve));
    this.queue.push(wake);
    return {
      turn,
      queued: true,
      cancel: () => {
        const i = this.queue.indexOf(wake);
        if (i < 0) return false; // already woken: the caller holds the turn
        this.queue.splice(i, 1);
        return true;
      },
    };
  }

  give(): void {
    const next = this.queue.shift();
    if (next) next();
    else this.held = false;
  }
}

const REASONS: readonly string[] = ['rate', 'concurrency', 'throttle'];
const NO_TICKETS: readonly string[] = ['horizon', 'full'];
/** The wire's bound on `maxWaitMs` (24 hours). */
const LINE_MAX_WAIT_MS = 86_400_000;
/** The wire's bounds (sections 3, 9.3, 12.8 and 16). */
const MAX_KEY_BYTES = 512;
const MAX_ID_BYTES = 128;
const MAX_LIMITS = 64;
const MAX_CALLS = 1_000_000_000;
const MAX_PER_MS = 2_678_400_000;
const MAX_CONCURRENT = 1_000_000;
const MAX_COST = 1_000_000_000;
const MAX_HOLD_MS = 86_400_000;
const MIN_GRACE_MS = 100;
const MAX_GRACE_MS = 60_000;
/** How long a request sent in the background (an undo, a release, leaving the line) may take. */
const BACKGROUND_TIMEOUT_MS = 2_000;
/** How long past its timeout an abandoned ask still listens for its answer, to give it back. */
const LATE_ANSWER_MS = 2_000;
/** The pauses between the tries of a release that `withPermit` retries in the background. */
const RELEASE_RETRY_MS: readonly number[] = [250, 500, 1_000, 2_000];
/** The wire's bounds on a `/wait`'s `timeoutMs`, and its bound on the tickets it names (section 15). */
const MIN_WAIT_TIMEOUT_MS = 1_000;
const MAX_WAIT_TIMEOUT_MS = 60_000;
const MAX_WAIT_TICKETS = 64;
/** The longest one `/wait` of a waiting `acquire` lasts before it is asked again. */
const WAIT_ROUND_MS = 25_000;
/** How long past its own time a `/wait` may take to be answered (its request has no other bound). */
const WAIT_MARGIN_MS = 5_000;
/** A `/wait` answered empty this much before its time did not run its time: the server's bound, or its shutdown. */
const WAIT_EARLY_MS = 100;
/** How many permits this client remembers the buckets of, for the wake their release sends (the oldest forgotten first). */
const MAX_KNOWN_PERMITS = 10_000;

/** What remains of a caller's wait, as the wire's `maxWaitMs`: whole ms rounded up, 1 to 24 h. */
function lineWaitMs(remainingMs: number): number {
  return Math.min(Math.max(Math.ceil(remainingMs), 1), LINE_MAX_WAIT_MS);
}

/** Waiters queue per shape: the caller key and the buckets named, whatever the costs. */
function shapeOf(req: AcquireRequest): string {
  return [req.key, ...req.limits.map((l) => l.key)].join('\u0000');
}

function shown(v: unknown): string {
  return typeof v === 'string' ? JSON.stringify(v) : String(v);
}

function integer(v: unknown, field: string, low: number, high: number): void {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < low || v > high) {
    throw new InvalidArgumentError(field, `must be an integer from ${low} to ${high}, got ${shown(v)}`);
  }
}

function optionalInteger(v: unknown, field: string, low: number, high: number): void {
  if (v !== undefined) integer(v, field, low, high);
}

const LONE_SURROGATE = /\p{Cs}/u;
const utf8 = new TextEncoder();

/** A key or id as the wire takes it: well-formed text of 1 to `maxBytes` bytes of UTF-8. */
function text(v: unknown, field: string, maxBytes: number): void {
  if (typeof v !== 'string') throw new InvalidArgumentError(field, `must be a string, got ${shown(v)}`);
  if (LONE_SURROGATE.test(v)) throw new InvalidArgumentError(field, 'must be well-formed text, not a lone surrogate');
  const bytes = utf8.encode(v).length;
  if (bytes < 1 || bytes > maxBytes) throw new InvalidArgumentError(field, `must be 1 to ${maxBytes} bytes of UTF-8, got ${bytes}`);
}

function optionalFlag(v: unknown, field: string): void {
  if (v !== undefined && typeof v !== 'boolean') throw new InvalidArgumentError(field, `must be a boolean, got ${shown(v)}`);
}

/** Checks a request against the wire's bounds, naming the field at fault, before it is sent. */
function checkRequest(req: AcquireRequest): void {
  if (typeof req !== 'object' || req === null) throw new InvalidArgumentError('request', 'must be an object');
  text(req.key, 'key', MAX_KEY_BYTES);
  if (!Array.isArray(req.limits)) throw new InvalidArgumentError('limits', 'must be an array');
  if (req.limits.length > MAX_LIMITS) {
    throw new InvalidArgumentError('limits', `must have at most ${MAX_LIMITS} entries, got ${req.limits.length}`);
  }
  const seen = new Map<string, number>();
  req.limits.forEach((limit: unknown, i) => {
    const at = `limits[${i}]`;
    if (typeof limit !== 'object' || limit === null || Array.isArray(limit)) {
      throw new InvalidArgumentError(at, `must be an object with a key, got ${shown(limit)}`);
    }
    const l = limit as Limit;
    text(l.key, `${at}.key`, MAX_KEY_BYTES);
    const earlier = seen.get(l.key);
    if (earlier !== undefined) throw new InvalidArgumentError(`${at}.key`, `repeats limits[${earlier}].key`);
    seen.set(l.key, i);
    if (l.calls !== undefined && l.refill !== undefined) {
      throw new InvalidArgumentError(`${at}.refill`, `and ${at}.calls never go together: a limit is a window or a token bucket`);
    }
    const rate = l.refill === undefined ? l.calls : l.refill;
    if (rate !== undefined && l.perMs === undefined) {
      throw new InvalidArgumentError(`${at}.perMs`, `is required with ${l.refill === undefined ? 'calls' : 'refill'}`);
    }
    if (rate === undefined && l.perMs !== undefined) throw new InvalidArgumentError(`${at}.calls`, 'or refill is required with perMs');
    optionalInteger(l.calls, `${at}.calls`, 1, MAX_CALLS);
    optionalInteger(l.refill, `${at}.refill`, 1, MAX_CALLS);
    optionalInteger(l.perMs, `${at}.perMs`, 1, MAX_PER_MS);
    for (const name of ['burst', 'initial'] as const) {
      if (l[name] !== undefined && l.refill === undefined) throw new InvalidArgumentError(`${at}.${name}`, 'needs refill (a token bucket)');
    }
    optionalInteger(l.burst, `${at}.burst`, 1, MAX_CALLS);
    optionalInteger(l.initial, `${at}.initial`, 0, l.burst ?? l.refill ?? MAX_CALLS);
    optionalInteger(l.concurrent, `${at}.concurrent`, 1, MAX_CONCURRENT);
    if (l.perMs === undefined && l.concurrent === undefined) {
      throw new InvalidArgumentError(at, 'needs a window (calls and perMs), a token bucket (refill and perMs), a concurrent, or one of the first two with a concurrent');
    }
    optionalInteger(l.cost, `${at}.cost`, 0, MAX_COST);
    optionalInteger(l.holdMs, `${at}.holdMs`, 1, MAX_HOLD_MS);
    if (l.adapt !== undefined) checkAdapt(l.adapt, `${at}.adapt`, rate);
  });
  optionalInteger(req.cost, 'cost', 0, MAX_COST);
  optionalInteger(req.holdMs, 'holdMs', 1, MAX_HOLD_MS);
  optionalInteger(req.graceMs, 'graceMs', MIN_GRACE_MS, MAX_GRACE_MS);
  optionalFlag(req.permit, 'permit');
  optionalFlag(req.report, 'report');
}

const ADAPT_FIELDS: ReadonlySet<string> = new Set(['min', 'max', 'increase', 'keepPct']);
const MAX_CEILING = 1_000_000_000;
const MAX_INCREASE = 1_000_000;

/** An `adapt` against the wire's bounds (section 14); `rate` is the limit's `calls` or `refill`. */
function checkAdapt(adapt: unknown, at: string, rate: number | undefined): void {
  if (typeof adapt !== 'object' || adapt === null || Array.isArray(adapt)) {
    throw new InvalidArgumentError(at, `must be an object (min, max, increase, keepPct; {} for the defaults), got ${shown(adapt)}`);
  }
  if (rate === undefined) throw new InvalidArgumentError(at, 'needs a window (calls and perMs) or a token bucket (refill and perMs)');
  for (const name of Object.keys(adapt)) {
    if (!ADAPT_FIELDS.has(name)) throw new InvalidArgumentError(`${at}.${name}`, 'is not a field of adapt (min, max, increase, keepPct)');
  }
  const a = adapt as Adapt;
  optionalInteger(a.min, `${at}.min`, 1, rate);
  optionalInteger(a.max, `${at}.max`, rate, MAX_CEILING);
  optionalInteger(a.increase, `${at}.increase`, 0, MAX_INCREASE);
  optionalInteger(a.keepPct, `${at}.keepPct`, 1, 99);
}

function checkOutcome(outcome: unknown): void {
  if (outcome !== undefined && outcome !== 'clean' && outcome !== 'limited') {
    throw new InvalidArgumentError('outcome', `must be 'clean' or 'limited', got ${shown(outcome)}`);
  }
}

function costsToWire(costs: Costs, field: string): { key: string; cost: number }[] {
  if (typeof costs !== 'object' || costs === null || Array.isArray(costs)) {
    throw new InvalidArgumentError(field, 'must be an object of bucket key to cost');
  }
  const entries = Object.entries(costs);
  if (entries.length < 1 || entries.length > MAX_LIMITS) {
    throw new InvalidArgumentError(field, `must have 1 to ${MAX_LIMITS} entries, got ${entries.length}`);
  }
  return entries.map(([key, cost]) => {
    const at = `${field}[${JSON.stringify(key)}]`;
    text(key, at, MAX_KEY_BYTES);
    integer(cost, at, 0, MAX_COST);
    return { key, cost };
  });
}

/** A new request id: a random UUID (from `getRandomValues` where `randomUUID` is missing). */
function randomId(): string {
  const c = globalThis.crypto;
  if (typeof c?.randomUUID === 'function') return c.randomUUID();
  const bytes = c.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * Whether an ask that failed with `e` may still have been granted or filed: its answer was lost
 * (no answer, or one that is not the limiter's). An error the limiter answered changed nothing.
 */
function mayHaveActed(e: unknown): boolean {
  if (e instanceof ConnectionError || e instanceof ProtocolError) return true;
  return e instanceof ApiError && e.code === 'unknown';
}

interface Watch {
  callbacks: Set<() => void>;
  fire: () => void;
}

/** One `abort` listener per signal, however many waits share it. */
const watches = new WeakMap<AbortSignal, Watch>();

/** Calls `fn` when `signal` aborts; the function returned stops watching. */
function onAbort(signal: AbortSignal, fn: () => void): () => void {
  let watch = watches.get(signal);
  if (!watch) {
    const callbacks = new Set<() => void>();
    const fire = () => {
      watches.delete(signal);
      for (const f of callbacks) f();
    };
    watch = { callbacks, fire };
    watches.set(signal, watch);
    signal.addEventListener('abort', fire, { once: true });
  }
  const w = watch;
  const entry = () => fn();
  w.callbacks.add(entry);
  return () => {
    w.callbacks.delete(entry);
    if (w.callbacks.size === 0 && watches.get(signal) === w) {
      watches.delete(signal);
      signal.removeEventListener('abort', w.fire);
    }
  };
}

/** One ask to `/acquire` in flight: the answer to come, and how to stop waiting for it. */
interface Ask {
  readonly reply: Promise<AcquireReply>;
  /** The caller stops waiting: undo the ask by its id, and give back whatever answer still comes. */
  abandon(): void;
}

function instant(v: unknown, field: string): Date {
  if (typeof v !== 'string') throw new ProtocolError(`${field} must be an instant string, got ${JSON.stringify(v)}`);
  const d = new Date(v);
  if (Number.isNaN(d.getTime())) throw new ProtocolError(`${field} is not an instant: ${v}`);
  return d;
}

function optionalInstant(v: unknown, field: string): Date | undefined {
  return v === undefined || v === null ? undefined : instant(v, field);
}

function reasonOf(v: unknown, field: string): Reason {
  if (typeof v !== 'string' || !REASONS.includes(v)) throw new ProtocolError(`${field} is not a reason: ${String(v)}`);
  return v as Reason;
}

function sleep(ms: number): { done: Promise<void>; cancel: () => void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const done = new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)));
  return { done, cancel: () => clearTimeout(timer) };
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function delay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted || ms <= 0) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

function ticketList(v: unknown, field: string): string[] {
  if (!Array.isArray(v) || !v.every((t) => typeof t === 'string')) throw new ProtocolError(`${field} must be an array of tickets`);
  return v;
}

/** A client of one limiter server. Cheap to keep; share one per process. */
export class LimiterClient {
  /**
   * Starts a local server for a test or a laptop (the `redb-limiter` binary this package
   * carries, or `REDB_LIMITER_BIN`) and resolves once its ready line is read: `{ url, stop() }`.
   * The same as the package's `startServer`.
   */
  static startServer(options?: StartServerOptions): Promise<LocalServer> {
    return startServer(options);
  }

  readonly url: string;
  readonly #token: string | undefined;
  readonly #send: Send;
  readonly #timeoutMs: number;
  readonly #maxWaiters: number | undefined;
  readonly #throttleAfterMs: number;
  readonly #onWait: ((report: WaitReport) => void) | undefined;
  readonly #requestId: () => string;
  readonly #lines = new Map<string, Line>();
  /**
   * The buckets of each permit granted through this client and not yet released, so that its
   * release wakes this client's waiters on them. Past `MAX_KNOWN_PERMITS`, the oldest are forgotten.
   */
  readonly #permitBuckets = new Map<string, readonly string[]>();
  /** The server answered `/wait` with 404 (it keeps no waits, section 15): waits sleep to `retryAt`. */
  #noWaits = false;
  /** The limiter's clock minus ours, from the latest reply. */
  #offsetMs = 0;

  constructor(options: LimiterClientOptions) {
    if (typeof options !== 'object' || options === null) throw new InvalidArgumentError('options', 'must be an object');
    let parsed: URL;
    try {
      parsed = new URL(options.url);
    } catch {
      throw new InvalidArgumentError('url', `must be an http(s) URL, got ${JSON.stringify(options.url)}`);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new InvalidArgumentError('url', `must be an http(s) URL, got ${JSON.stringify(options.url)}`);
    }
    // The wire's paths go after the path given; a query, a fragment or a trailing slash would
    // turn `/acquire` into something else.
    this.url = `${parsed.origin}${parsed.pathname.replace(/\/+$/, '')}`;
    if (options.token !== undefined && (typeof options.token !== 'string' || options.token === '')) {
      throw new InvalidArgumentError('token', 'must be a non-empty string');
    }
    this.#token = options.token;
    if (options.fetch !== undefined && typeof options.fetch !== 'function') {
      throw new InvalidArgumentError('fetch', 'must be a function like the global fetch');
    }
    this.#send = options.fetch ? viaFetch(options.fetch) : viaNodeHttp(parsed.protocol === 'https:');
    this.#timeoutMs = positive(options.timeoutMs, 'timeoutMs') ?? 30_000;
    this.#maxWaiters = count(options.maxWaiters, 'maxWaiters');
    this.#throttleAfterMs = count(options.throttleAfterMs, 'throttleAfterMs') ?? 5_000;
    this.#onWait = options.onWait;
    if (options.requestId !== undefined && typeof options.requestId !== 'function') {
      throw new InvalidArgumentError('requestId', 'must be a function returning a new id');
    }
    this.#requestId = options.requestId ?? randomId;
  }

  /** The limiter's clock as this client last saw it (epoch ms), for sizing waits and throttles. */
  serverNow(): number {
    return Date.now() + this.#offsetMs;
  }

  /** `GET /health`: liveness and what the server serves. */
  async health(): Promise<Record<string, unknown>> {
    return (await this.#request('GET', '/health')).body;
  }

  /** Asks once: never waits and never joins the line; a refusal is an answer, not an error. */
  async tryAcquire(request: AcquireRequest): Promise<AcquireReply> {
    checkRequest(request);
    const { queue: _q, ticket: _t, ...body } = request as AcquireRequest & { queue?: unknown; ticket?: unknown };
    return this.#ask(body, request.limits).reply;
  }

  /**
   * Waits until granted and resolves to a `Permit`: waits for each refusal's `retryAt`, holding a
   * ticket in the limiter's line when it gives one, first in first out among this process's
   * callers of the same shape. Holding a ticket, it waits on `/wait` instead, asking again as soon
   * as the limiter says its turn has come (a release through this client answers that wait too);
   * waiting without one, a release through this client in one of its buckets has it ask again at
   * once. Rejects with `LimitedError` when `maxWaitMs` runs out or
   * `signal` aborts (leaving the line, and undoing an ask in flight), `QueueFullError` past
   * `maxWaiters`, and the wire's errors. A caller behind one whose ask got no answer waits
   * `timeoutMs` in all for an answer, counted from when it joined or that ask was sent, whichever
   * is later.
   */
  async acquire(request: AcquireRequest, options: AcquireOptions = {}): Promise<Permit> {
    checkRequest(request);
    const { signal } = options;
    const maxWaitMs = count(options.maxWaitMs, 'maxWaitMs');
    const maxWaiters = count(options.maxWaiters, 'maxWaiters') ?? this.#maxWaiters;
    const queue = options.queue ?? true;
    const started = performance.now();
    const deadline = maxWaitMs === undefined ? undefined : started + maxWaitMs;
    const waited = () => Math.round(performance.now() - started);
    if (signal?.aborted) throw new LimitedError('aborted', undefined, 0, signal.reason);

    const shape = shapeOf(request);
    let line = this.#lines.get(shape);
    if (!line) {
      line = new Line(request.limits.map((l) => l.key));
      this.#lines.set(shape, line);
    }
    if (maxWaiters !== undefined && line.waiting >= maxWaiters) throw new QueueFullError(line.waiting);
    line.waiting++;
    try {
      const { turn, cancel, queued } = line.take();
      const gotTurn = await this.#until(turn, signal, deadline);
      if (gotTurn !== 'done') {
        if (!cancel()) line.give(); // woken at the same moment: pass the turn on
        throw new LimitedError(gotTurn, line.last, waited(), gotTurn === 'aborted' ? signal?.reason : undefined);
      }
      try {
        return await this.#waitForGrant(line, request, queue, signal, deadline, started, waited, queued);
      } finally {
        line.give();
      }
    } finally {
      line.waiting--;
      if (line.waiting === 0 && this.#lines.get(shape) === line) this.#lines.delete(shape);
    }
  }

  async #waitForGrant(
    line: Line,
    request: AcquireRequest,
    queue: boolean,
    signal: AbortSignal | undefined,
    deadline: number | undefined,
    joined: number,
    waited: () => number,
    queued: boolean,
  ): Promise<Permit> {
    let ticket: string | undefined;
    let last: Refusal | undefined;
    for (;;) {
      const body: Record<string, unknown> = { ...request, report: true };
      if (queue) body.queue = true;
      if (ticket !== undefined) body.ticket = ticket;
      // In the line, the limiter files a ticket only for a call it can serve within this wait.
      if (queue && deadline !== undefined) body.maxWaitMs = lineWaitMs(deadline - performance.now());
      // Behind an ask of this shape that got no answer, this caller's own timeout has been running.
      const now = performance.now();
      const timeoutMs =
        line.unansweredSince === undefined ? this.#timeoutMs : this.#timeoutMs - (now - Math.max(joined, line.unansweredSince));
      if (timeoutMs <= 0) {
        throw new ConnectionError(
          `POST ${this.url}/acquire: no answer within ${this.#timeoutMs} ms to the caller ahead of this one with the same request shape`,
          { cause: line.lost },
        );
      }
      // A wake from before this ask is seen by it; one that comes while it is in flight is kept.
      line.takeWake();
      const ask = this.#ask(body, request.limits, timeoutMs);
      line.unansweredSince ??= now;
      const outcome = await this.#until(ask.reply, signal, deadline);
      if (outcome !== 'done') {
        ask.abandon();
        if (ticket !== undefined) this.#leaveSoon(ticket);
        throw new LimitedError(outcome, last ?? line.last, waited(), outcome === 'aborted' ? signal?.reason : undefined);
      }
      let reply: AcquireReply;
      try {
        reply = await ask.reply;
      } catch (e) {
        if (e instanceof ConnectionError) line.lost = e;
        else line.unansweredSince = undefined;
        if (ticket !== undefined) this.#leaveSoon(ticket);
        throw e;
      }
      line.unansweredSince = undefined;
      if (reply.granted) {
        // Granted at the first ask, with nobody ahead here: it did not wait.
        const waitedMs = queued || last ? waited() : 0;
        return new Permit(this, reply.at, reply.permit, reply.limits, waitedMs, last);
      }
      last = { reason: reply.reason, limit: reply.limit, retryAt: reply.retryAt };
      if (reply.noTicket !== undefined) last.noTicket = reply.noTicket;
      line.last = last;
      // A refusal that names no ticket (a throttle, `noTicket`, a lapsed one) leaves none standing:
      // the next ask joins the line afresh, presenting nothing stale.
      ticket = queue ? reply.ticket : undefined;
      const serverNow = reply.now ? reply.now.getTime() : this.serverNow();
      const waitMs = Math.max(1, reply.retryAt.getTime() - serverNow);
      if (deadline !== undefined && performance.now() + waitMs > deadline) {
        if (ticket !== undefined) this.#leaveSoon(ticket);
        throw new LimitedError('maxWait', last, waited());
      }
      const paused = performance.now();
      const woken = await this.#pause(line, ticket, waitMs, signal, deadline);
      if (woken === 'aborted' || woken === 'maxWait') {
        if (ticket !== undefined) this.#leaveSoon(ticket);
        throw new LimitedError(woken, last, waited(), woken === 'aborted' ? signal?.reason : undefined);
      }
      const report: WaitReport = { waitedMs: Math.round(performance.now() - paused), reason: last.reason, limit: last.limit };
      if (ticket !== undefined && reply.ahead !== undefined) report.ahead = reply.ahead;
      if (woken !== undefined) report.woken = woken;
      this.#onWait?.(report);
    }
  }

  /**
   * Waits `waitMs` (to a refusal's `retryAt`), or less. Holding `ticket` on a server that keeps
   * waits, until the limiter says the ticket is ready or gone (`/wait`, section 15: a release by
   * any host, this one's included, wakes it within a round trip). A release through this client
   * does not cut that wait: the limiter answers it at the same change, and only when this ticket
   * is the one the room goes to, where an ask at the release would be refused whenever another
   * host's ticket stands first, and a cut wait costs its connection. Otherwise (no ticket, or a
   * server without waits) until a release through this client frees room in one of the line's
   * buckets. Resolves to what woke it early, if anything. `signal` and `deadline` end it at once,
   * and the `/wait` in flight is cut, so no wait stays pending on the server.
   */
  async #pause(
    line: Line,
    ticket: string | undefined,
    waitMs: number,
    signal: AbortSignal | undefined,
    deadline: number | undefined,
  ): Promise<Woken | 'aborted' | 'maxWait' | undefined> {
    const wakeAt = performance.now() + waitMs;
    const stop = new AbortController();
    let woken: Woken | 'maxWait' | undefined;
    let unlisten: (() => void) | undefined;
    const rounds = async (): Promise<void> => {
      while (ticket !== undefined && !this.#noWaits && !stop.signal.aborted) {
        const leftMs = deadline === undefined ? Infinity : deadline - performance.now();
        const roundMs = Math.floor(Math.min(WAIT_ROUND_MS, leftMs));
        if (roundMs < MIN_WAIT_TIMEOUT_MS) break;
        // A release here while the ask was in flight is seen by this wait: answered at once if ready.
        line.takeWake();
        const sent = performance.now();
        const answer = await this.#waitRound(ticket, roundMs, stop.signal);
        // It failed, or the server keeps no waits: on to retryAt.
        if (answer === undefined) break;
        if (answer.ready.length > 0 || answer.gone.length > 0) {
          woken ??= answer.ready.length > 0 ? 'ready' : 'gone';
          return;
        }
        // Answered empty before its time: the server's bound on waits, or its shutdown.
        if (performance.now() - sent < roundMs - WAIT_EARLY_MS) break;
        // It ran its time. Up to the caller's deadline, that ends the caller's wait too.
        if (roundMs < WAIT_ROUND_MS) {
          woken ??= 'maxWait';
          return;
        }
        // Past retryAt, ask again (that renews the ticket); before it, wait again.
        if (performance.now() >= wakeAt) return;
      }
      // A release came while the head's ask was in flight: the room it freed may be this one's.
      if (line.takeWake()) {
        woken ??= 'release';
        return;
      }
      unlisten = line.onWake(() => {
        woken ??= 'release';
        stop.abort();
      });
      await delay(wakeAt - performance.now(), stop.signal);
    };
    try {
      const ended = await this.#until(rounds(), signal, deadline);
      return ended === 'done' ? woken : ended;
    } finally {
      unlisten?.();
      stop.abort();
    }
  }

  /** One `/wait` of a waiting acquire; undefined when it failed or the server keeps no waits (a 404, remembered). */
  async #waitRound(ticket: string, timeoutMs: number, signal: AbortSignal): Promise<WaitReply | undefined> {
    try {
      return await this.wait([ticket], { timeoutMs, signal });
    } catch (e) {
      if (e instanceof NotFoundError) this.#noWaits = true;
      return undefined;
    }
  }

  /**
   * Sends one ask to `/acquire` with an id of its own. When its answer is lost (no answer within
   * `timeoutMs`, a broken connection, a reply that is not the limiter's) or its caller abandons it,
   * it is undone by that id in the background (section 16): its places freed, its ticket out of
   * the line, a zero cost in each of its windows. A server without section 16 answers that undo
   * with a 400; then an abandoned ask is left to finish, and what its answer holds is given back.
   */
  #ask(body: Record<string, unknown>, limits: readonly Limit[], timeoutMs = this.#timeoutMs): Ask {
    const id = this.#requestId();
    text(id, 'requestId', MAX_ID_BYTES);
    const controller = new AbortController();
    // An adapted limit's signals travel on a permit (section 14): asked for unless the caller said.
    const permit = body.permit === undefined && limits.some((l) => l.adapt !== undefined) ? { permit: true } : {};
    const answer = this.#acquireOnce({ ...body, ...permit, id }, controller.signal, timeoutMs + LATE_ANSWER_MS);
    answer.then(
      (r) => {
        if (r.granted && r.permit !== undefined) this.#remember(r.permit, limits);
      },
      () => {},
    );
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new ConnectionError(`POST ${this.url}/acquire: no answer within ${Math.ceil(timeoutMs)} ms`)),
        timeoutMs,
      );
    });
    const reply = Promise.race([answer, timedOut]);
    void reply.then(
      () => clearTimeout(timer),
      () => clearTimeout(timer),
    );
    let abandoned = false;
    const abandon = () => {
      if (abandoned) return;
      abandoned = true;
      answer.then(
        (r) => this.#giveBack(r),
        () => {},
      );
      // Once the limiter has taken the undo, the answer no longer matters: stop waiting for it.
      void this.#undo(id, limits).then((undone) => undone && controller.abort());
    };
    reply.catch((e: unknown) => {
      if (mayHaveActed(e)) abandon();
    });
    return { reply, abandon };
  }

  /**
   * `release {id}` in the background, with a zero cost in each window and token bucket so that a
   * grant the caller never saw counts nowhere. Resolves to whether the limiter answered it (never
   * rejects).
   */
  #undo(id: string, limits: readonly Limit[]): Promise<boolean> {
    const body: Record<string, unknown> = { id };
    const costs = limits.filter((l) => l.perMs !== undefined).map((l) => ({ key: l.key, cost: 0 }));
    if (costs.length > 0) body.costs = costs;
    return this.#background('/release', body).then((undone) => {
      // Whatever it got is given back: its room may be a waiter's here.
      if (undone) this.#wake(limits.map((l) => l.key));
      return undone;
    });
  }

  /** Leaves the line in the background. */
  #leaveSoon(ticket: string): void {
    void this.#background('/release', { ticket });
  }

  /** A request nobody waits for, bounded in time: whether it was answered; never rejects. */
  #background(path: string, body: Record<string, unknown>): Promise<boolean> {
    const timeoutMs = Math.min(this.#timeoutMs, BACKGROUND_TIMEOUT_MS);
    return this.#request('POST', path, body, undefined, timeoutMs).then(
      () => true,
      () => false,
    );
  }

  /** Releases what a reply that came after its caller gave up holds: a permit, a ticket. */
  #giveBack(reply: AcquireReply): void {
    const permit = reply.granted ? reply.permit : undefined;
    if (permit !== undefined) {
      void this.#background('/release', { permit }).then((answered) => {
        if (answered) this.#freed(permit, true);
      });
    }
    if (!reply.granted && reply.ticket !== undefined) this.#leaveSoon(reply.ticket);
  }

  /** Keeps the buckets of a permit granted through this client, for the wake its release sends. */
  #remember(permit: string, limits: readonly Limit[]): void {
    this.#permitBuckets.set(permit, limits.map((l) => l.key));
    if (this.#permitBuckets.size > MAX_KNOWN_PERMITS) {
      for (const oldest of this.#permitBuckets.keys()) {
        this.#permitBuckets.delete(oldest);
        break;
      }
    }
  }

  /** A release (or settle) of `permit` was answered: wakes this client's waiters on its buckets. */
  #freed(permit: string, released: boolean): void {
    const buckets = this.#permitBuckets.get(permit);
    if (buckets === undefined) return;
    if (released) this.#permitBuckets.delete(permit);
    this.#wake(buckets);
  }

  /** Wakes the head of each of this client's lines that names one of `buckets`: it asks again at once. */
  #wake(buckets: readonly string[]): void {
    for (const line of this.#lines.values()) {
      if (buckets.some((b) => line.buckets.has(b))) line.wake();
    }
  }

  /** Races `p` against `signal` and `deadline` (a `performance.now()` instant). */
  async #until(p: Promise<unknown>, signal: AbortSignal | undefined, deadline: number | undefined) {
    if (!signal && deadline === undefined) {
      await p.catch(() => {});
      return 'done' as const;
    }
    let unwatch: (() => void) | undefined;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const stops: Promise<'aborted' | 'maxWait'>[] = [];
    if (signal) {
      stops.push(
        new Promise((resolve) => {
          if (signal.aborted) resolve('aborted');
          else unwatch = onAbort(signal, () => resolve('aborted'));
        }),
      );
    }
    if (deadline !== undefined) {
      stops.push(new Promise((resolve) => (timer = setTimeout(() => resolve('maxWait'), Math.max(0, deadline - performance.now())))));
    }
    try {
      return await Promise.race([p.then(() => 'done' as const, () => 'done' as const), ...stops]);
    } finally {
      unwatch?.();
      clearTimeout(timer);
    }
  }

  /** Would `request` be granted now, and how full is each limit? Changes nothing. */
  async peek(request: AcquireRequest): Promise<PeekReply> {
    checkRequest(request);
    const { body } = await this.#request('POST', '/peek', request);
    if (typeof body.fits !== 'boolean') throw new ProtocolError('peek: fits must be a boolean');
    const reply: PeekReply = {
      fits: body.fits,
      now: instant(body.now, 'peek: now'),
      limits: figures(body.limits),
    };
    this.#sawNow(reply.now);
    if (!body.fits) {
      reply.retryAt = instant(body.retryAt, 'peek: retryAt');
      reply.reason = reasonOf(body.reason, 'peek: reason');
      reply.limit = String(body.limit);
    }
    return reply;
  }

  /**
   * Frees a permit's places (settling `costs` first, in one step): `true` when it was live. An
   * `outcome` tells the adaptive ceilings of the grant's buckets what the call met (section 14).
   */
  async release(permit: string, costs?: Costs, options: { outcome?: Outcome } = {}): Promise<boolean> {
    text(permit, 'permit', MAX_ID_BYTES);
    checkOutcome(options.outcome);
    const body: Record<string, unknown> = { permit };
    if (costs !== undefined) body.costs = costsToWire(costs, 'costs');
    if (options.outcome !== undefined) body.outcome = options.outcome;
    const released = flag((await this.#request('POST', '/release', body)).body, 'released');
    this.#freed(permit, true);
    return released;
  }

  /** Leaves the limiter's line: `true` when the ticket was live (wire version 3). */
  async leave(ticket: string): Promise<boolean> {
    text(ticket, 'ticket', MAX_ID_BYTES);
    return flag((await this.#request('POST', '/release', { ticket })).body, 'released');
  }

  /**
   * Sets a permit's grant's real cost per window bucket: `true` when the permit was live. An
   * `outcome` tells the adaptive ceilings of the grant's buckets what the call met (section 14).
   */
  async settle(permit: string, costs: Costs, options: { outcome?: Outcome } = {}): Promise<boolean> {
    text(permit, 'permit', MAX_ID_BYTES);
    checkOutcome(options.outcome);
    const body: Record<string, unknown> = { permit, costs: costsToWire(costs, 'costs') };
    if (options.outcome !== undefined) body.outcome = options.outcome;
    const settled = flag((await this.#request('POST', '/settle', body)).body, 'settled');
    this.#freed(permit, false);
    return settled;
  }

  /**
   * Waits until one of `tickets` is ready (its request, asked again with it, would be granted now)
   * or gone, or `timeoutMs` (1000-60000, default 25000) passes: `POST /wait` (section 15 of the
   * wire). It counts nowhere and grants nothing, and keeps its tickets from lapsing. Its HTTP
   * request is bounded by `timeoutMs` and a margin, not by the client's `timeoutMs`. A server that
   * keeps no waits answers `NotFoundError`.
   */
  async wait(tickets: readonly string[], options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<WaitReply> {
    if (!Array.isArray(tickets) || tickets.length < 1 || tickets.length > MAX_WAIT_TICKETS) {
      throw new InvalidArgumentError('tickets', `must be an array of 1 to ${MAX_WAIT_TICKETS} tickets`);
    }
    tickets.forEach((t, i) => text(t, `tickets[${i}]`, MAX_ID_BYTES));
    const timeoutMs = options.timeoutMs ?? WAIT_ROUND_MS;
    integer(timeoutMs, 'timeoutMs', MIN_WAIT_TIMEOUT_MS, MAX_WAIT_TIMEOUT_MS);
    const { body } = await this.#request('POST', '/wait', { tickets, timeoutMs }, options.signal, timeoutMs + WAIT_MARGIN_MS);
    const reply: WaitReply = {
      ready: ticketList(body.ready, 'wait: ready'),
      gone: ticketList(body.gone, 'wait: gone'),
      now: instant(body.now, 'wait: now'),
    };
    this.#sawNow(reply.now);
    return reply;
  }

  /**
   * Closes the caller `key` until `until` (throttles only extend); the throttle now in force. With
   * the `permit` of the call the provider refused, it also counts as a `limited` outcome for that
   * permit's adaptive ceilings (section 14).
   */
  async throttle(key: string, until: Date | number, options: { permit?: string } = {}): Promise<Date | undefined> {
    const at = typeof until === 'number' ? new Date(until) : until;
    if (!(at instanceof Date) || Number.isNaN(at.getTime())) {
      throw new InvalidArgumentError('until', 'must be a valid Date or epoch milliseconds');
    }
    const sent: Record<string, unknown> = { key, until: at.toISOString() };
    if (options.permit !== undefined) {
      text(options.permit, 'permit', MAX_ID_BYTES);
      sent.permit = options.permit;
    }
    const { body } = await this.#request('POST', '/throttle', sent);
    return optionalInstant(body.until, 'throttle: until');
  }

  /** Ends the throttle on `key` early: `true` when one was in force. */
  async lift(key: string): Promise<boolean> {
    return flag((await this.#request('POST', '/lift', { key })).body, 'lifted');
  }

  /**
   * Acquires (waiting), runs `fn` with the permit, and releases it however `fn` ends. When `fn`
   * throws, its error is what this rejects with: a release that fails then is tried again in the
   * background, never thrown in its place.
   */
  async withPermit<T>(request: AcquireRequest, fn: (permit: Permit) => T | Promise<T>, options?: AcquireOptions): Promise<T> {
    const permit = await this.acquire(request, options);
    let result: T;
    try {
      result = await fn(permit);
    } catch (e) {
      await permit.releaseAfterFailure().catch(() => this.#releaseLater(permit));
      throw e;
    }
    await permit.release();
    return result;
  }

  /** Tries a failed release (after a failed call) again in the background, a few times, further apart each time. */
  #releaseLater(permit: Permit): void {
    const retry = async () => {
      for (const pauseMs of RELEASE_RETRY_MS) {
        await sleep(pauseMs).done;
        if (await permit.releaseAfterFailure().then(() => true, () => false)) return;
      }
    };
    void retry();
  }

  /**
   * Reads a provider's response for the caller `callerKey`: a 429 throttles it for the wait the
   * provider asked (clamped to 1-120 s; `throttleAfterMs` when it names none), a success that
   * reports an exhausted budget until the reset. Resolves to the throttle in force when this
   * response set one, else `undefined`. Given the call's `permit`, the response is also its
   * outcome for adaptive ceilings (section 14): a throttle set here carries the permit, and a
   * `Permit` keeps what `observe` reads of the response (`floor`: see there) for its release.
   */
  async throttleFrom(
    callerKey: string,
    response: ResponseLike,
    options: { defaultMs?: number; permit?: Permit | string; floor?: number } = {},
  ): Promise<Date | undefined> {
    if (typeof response !== 'object' || response === null || typeof response.status !== 'number') {
      throw new InvalidArgumentError('response', 'must have a numeric status and headers');
    }
    const { permit } = options;
    if (permit instanceof Permit) permit.observe(response, options.floor === undefined ? {} : { floor: options.floor });
    const permitId = permit instanceof Permit ? permit.id : permit;
    const now = this.serverNow();
    let until: number | undefined;
    if (response.status === 429) {
      let body: string | Uint8Array | null | undefined;
      if (typeof Response !== 'undefined' && response instanceof Response) {
        body = response.bodyUsed ? undefined : await response.clone().text().catch(() => undefined);
      } else {
        body = (response as { body?: string | Uint8Array | null }).body;
      }
      until = now + vendorWaitMs(response.headers, body, { now, defaultMs: options.defaultMs ?? this.#throttleAfterMs });
    } else if (response.status >= 200 && response.status < 300) {
      until = vendorBudget(response.headers, { now })?.getTime();
    }
    if (until === undefined) return undefined;
    return this.throttle(callerKey, until, permitId === undefined ? {} : { permit: permitId });
  }

  async #acquireOnce(body: object, signal: AbortSignal, timeoutMs: number): Promise<AcquireReply> {
    const { body: r } = await this.#request('POST', '/acquire', body, signal, timeoutMs);
    const now = optionalInstant(r.now, 'acquire: now');
    if (now) this.#sawNow(now);
    const limits = r.limits === undefined ? undefined : figures(r.limits);
    if (r.granted === true) {
      const reply: Granted = { granted: true, at: instant(r.at, 'acquire: at') };
      if (typeof r.permit === 'string') reply.permit = r.permit;
      if (now) reply.now = now;
      if (limits) reply.limits = limits;
      return reply;
    }
    if (r.granted !== false) throw new ProtocolError('acquire: granted must be a boolean');
    const reply: Refused = {
      granted: false,
      retryAt: instant(r.retryAt, 'acquire: retryAt'),
      reason: reasonOf(r.reason, 'acquire: reason'),
      limit: String(r.limit),
    };
    if (now) reply.now = now;
    if (limits) reply.limits = limits;
    if (typeof r.ticket === 'string') reply.ticket = r.ticket;
    const lapseAt = optionalInstant(r.lapseAt, 'acquire: lapseAt');
    if (lapseAt) reply.lapseAt = lapseAt;
    if (typeof r.ahead === 'number') reply.ahead = r.ahead;
    // A cause this client does not know (a later wire) reads as unsaid: no ticket is no ticket.
    if (typeof r.noTicket === 'string' && NO_TICKETS.includes(r.noTicket)) reply.noTicket = r.noTicket as NoTicket;
    return reply;
  }

  #sawNow(now: Date): void {
    this.#offsetMs = now.getTime() - Date.now();
  }

  /** The `Date` header says the limiter's second; keep our estimate inside it. */
  #sawDate(date: string | null): void {
    if (!date) return;
    const d = Date.parse(date);
    if (Number.isNaN(d)) return;
    const ours = this.serverNow();
    if (ours < d || ours > d + 999) this.#offsetMs = Math.min(Math.max(ours, d), d + 999) - Date.now();
  }

  /** One HTTP request, abandoned after `timeoutMs` or when `signal` aborts. */
  async #request(
    method: 'GET' | 'POST',
    path: string,
    payload?: unknown,
    signal?: AbortSignal,
    timeoutMs = this.#timeoutMs,
  ): Promise<{ status: number; body: Record<string, unknown> }> {
    const headers: Record<string, string> = { accept: 'application/json' };
    if (payload !== undefined) headers['content-type'] = 'application/json';
    if (this.#token !== undefined) headers.authorization = `Bearer ${this.#token}`;
    const stop = new AbortController();
    const timer = setTimeout(() => stop.abort(new DOMException(`no answer within ${Math.ceil(timeoutMs)} ms`, 'TimeoutError')), timeoutMs);
    const unwatch = signal ? onAbort(signal, () => stop.abort(signal.reason)) : undefined;
    let res: Answer;
    try {
      if (signal?.aborted) stop.abort(signal.reason);
      const payloadText = payload === undefined ? undefined : JSON.stringify(payload);
      res = await this.#send(method, `${this.url}${path}`, headers, payloadText, stop.signal);
    } catch (e) {
      const why = stop.signal.aborted && stop.signal.reason instanceof Error ? stop.signal.reason : e;
      throw new ConnectionError(`${method} ${this.url}${path}: ${why instanceof Error ? why.message : String(why)}`, { cause: e });
    } finally {
      clearTimeout(timer);
      unwatch?.();
    }
    const { text } = res;
    this.#sawDate(res.date);
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch {
      body = undefined;
    }
    if (res.status >= 200 && res.status < 300) {
      if (typeof body !== 'object' || body === null || Array.isArray(body)) {
        throw new ProtocolError(`${method} ${path} answered ${res.status} without a JSON object: ${text.slice(0, 200)}`);
      }
      return { status: res.status, body: body as Record<string, unknown> };
    }
    const error = (body as { error?: { code?: unknown; message?: unknown } } | undefined)?.error;
    const code = typeof error?.code === 'string' ? error.code : 'unknown';
    const message = typeof error?.message === 'string' ? error.message : text.slice(0, 200);
    const Kind =
      res.status === 400
        ? BadRequestError
        : res.status === 401
          ? UnauthorizedError
          : res.status === 404
            ? NotFoundError
            : res.status === 503
              ? UnavailableError
              : ApiError;
    throw new Kind(res.status, code, message);
  }
}

function flag(body: Record<string, unknown>, name: string): boolean {
  const v = body[name];
  if (typeof v !== 'boolean') throw new ProtocolError(`${name} must be a boolean, got ${JSON.stringify(v)}`);
  return v;
}

function figures(v: unknown): LimitFigures[] {
  if (!Array.isArray(v)) throw new ProtocolError('limits must be an array');
  return v.map((f, i) => {
    if (typeof f !== 'object' || f === null || typeof f.key !== 'string') {
      throw new ProtocolError(`limits[${i}] must be an object with a key`);
    }
    return f as LimitFigures;
  });
}

function count(v: number | undefined, field: string): number | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
    throw new InvalidArgumentError(field, `must be a non-negative integer, got ${String(v)}`);
  }
  return v;
}

function positive(v: number | undefined, field: string): number | undefined {
  const n = count(v, field);
  if (n === 0) throw new InvalidArgumentError(field, 'must be above 0');
  return n;
}
