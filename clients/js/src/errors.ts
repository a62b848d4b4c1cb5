// The errors a caller can branch on: one base class, one subclass per way a call can fail.
// A refusal from `tryAcquire` is an outcome, not an error; only the waiting `acquire` turns a
// refusal it gave up on into a `LimitedError`.

/** Why a limit refused: a rolling window, concurrency places, or a throttle on the caller. */
export type Reason = 'rate' | 'concurrency' | 'throttle';

/**
 * Why a queued refusal filed no ticket (section 12.9 of the wire): `horizon` when the request's
 * own `retryAt` lies beyond its `maxWaitMs` (or the server's horizon, 300 s by default), `full`
 * when the line already holds 10,000 tickets. The caller then waits on `retryAt` alone.
 */
export type NoTicket = 'horizon' | 'full';

/** The base of every error this package throws. */
export class LimiterError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
  }

  /** `InvalidArgumentError` is a `RangeError`, as node's own bad input is, and a `LimiterError` too. */
  static [Symbol.hasInstance](value: unknown): boolean {
    if (this === LimiterError && value instanceof InvalidArgumentError) return true;
    return Function.prototype[Symbol.hasInstance].call(this, value);
  }
}

/** The limiter answered with an error status; `code` is the wire's error code. */
export class ApiError extends LimiterError {
  readonly status: number;
  readonly code: string;
  constructor(status: number, code: string, message: string) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

/** 400: a missing or wrong field, or a number out of range; the message names the field. */
export class BadRequestError extends ApiError {}
/** 401: the server has a token and the request carried none, or another. */
export class UnauthorizedError extends ApiError {}
/** 404: an unknown path or method (an older server without this method). */
export class NotFoundError extends ApiError {}
/** 503: the limiter cannot commit now (storage fault, shutting down); nothing was granted. */
export class UnavailableError extends ApiError {}

/** The limiter could not be reached, or did not answer within `timeoutMs`. */
export class ConnectionError extends LimiterError {}

/** The limiter answered something the wire does not allow. */
export class ProtocolError extends LimiterError {}

/**
 * Bad input caught before anything was sent; `field` names it. A `RangeError` (as node throws for
 * an argument out of range) that is also `instanceof LimiterError`.
 */
export class InvalidArgumentError extends RangeError {
  readonly field: string;
  constructor(field: string, message: string) {
    super(`${field} ${message}`);
    this.name = 'InvalidArgumentError';
    this.field = field;
  }
}

/**
 * A waiting `acquire` gave up: its `maxWaitMs` ran out (or the next `retryAt` lies beyond it),
 * or its signal was aborted. It has left the line. `reason`, `limit`, `retryAt` and `noTicket`
 * are those of the refusal that stood then (undefined only when it gave up before any answer
 * came; `noTicket` only when the limiter said why it filed no ticket).
 */
export class LimitedError extends LimiterError {
  /** `maxWaitMs` for a deadline, `aborted` for a signal. */
  readonly trigger: 'maxWait' | 'aborted';
  readonly reason: Reason | undefined;
  readonly limit: string | undefined;
  readonly retryAt: Date | undefined;
  /** Why the last refusal filed no ticket, when it said (`horizon`: it could not be served in time). */
  readonly noTicket: NoTicket | undefined;
  readonly waitedMs: number;
  constructor(
    trigger: 'maxWait' | 'aborted',
    refusal: { reason: Reason; limit: string; retryAt: Date; noTicket?: NoTicket } | undefined,
    waitedMs: number,
    cause?: unknown,
  ) {
    const why = trigger === 'maxWait' ? 'no grant within maxWaitMs' : 'the wait was aborted';
    const last = refusal
      ? `: refused (${refusal.reason}) by ${refusal.limit} until ${refusal.retryAt.toISOString()}` +
        (refusal.noTicket ? `, no ticket (${refusal.noTicket})` : '')
      : '';
    super(`${why} after ${waitedMs} ms${last}`, cause === undefined ? undefined : { cause });
    this.trigger = trigger;
    this.reason = refusal?.reason;
    this.limit = refusal?.limit;
    this.retryAt = refusal?.retryAt;
    this.noTicket = refusal?.noTicket;
    this.waitedMs = waitedMs;
  }
}

/** `maxWaiters` callers of the same request shape already wait in this process. */
export class QueueFullError extends LimiterError {
  readonly waiting: number;
  constructor(waiting: number) {
    super(`${waiting} callers already wait for this request shape`);
    this.waiting = waiting;
  }
}
