// A granted call: it holds its places until released (`await using` releases it on scope exit).
// `release(costs?)` is idempotent: the first call does it, later calls get the same answer.

import type { LimiterClient, LimitFigures, Outcome, ResponseLike } from './client.js';
import type { Reason } from './errors.js';
import { vendorOutcome } from './vendor.js';

/** Bucket key → the real cost the call had there, e.g. `{ 'openai/tpm': 1874 }`. */
export type Costs = Record<string, number>;

export class Permit implements AsyncDisposable {
  /** The permit id; undefined when the grant holds no place and was not asked with `permit: true`. */
  readonly id: string | undefined;
  /** When the call was granted (the limiter's clock). */
  readonly at: Date;
  /** Each limit's figures after the grant, when the server reported them. */
  readonly limits: LimitFigures[] | undefined;
  /** How long `acquire` waited for it. */
  readonly waitedMs: number;
  /** The last refusal `acquire` slept on, if it waited. */
  readonly waitedFor: { reason: Reason; limit: string; retryAt: Date } | undefined;
  readonly #client: LimiterClient;
  #release: Promise<boolean> | undefined;
  #outcome: Outcome | undefined;

  /** @internal */
  constructor(
    client: LimiterClient,
    at: Date,
    id: string | undefined,
    limits: LimitFigures[] | undefined,
    waitedMs = 0,
    waitedFor?: { reason: Reason; limit: string; retryAt: Date },
  ) {
    this.#client = client;
    this.at = at;
    this.id = id;
    this.limits = limits;
    this.waitedMs = waitedMs;
    this.waitedFor = waitedFor;
  }

  /** Whether `release` has been called (and did not fail). */
  get released(): boolean {
    return this.#release !== undefined;
  }

  /**
   * Whether one of the grant's limits adapts a ceiling (wire section 14): its release then reports
   * an outcome, `clean` unless the call was seen `limited`.
   */
  get adapted(): boolean {
    return this.limits?.some((f) => f.ceiling !== undefined) ?? false;
  }

  /** The outcome this permit reports when it is settled or released (section 14), if any yet. */
  get outcome(): Outcome | undefined {
    return this.#outcome;
  }

  /**
   * Reads the provider's response to this call for the adaptive ceilings (section 14): a 429, or
   * a success whose remaining requests are at or below `floor`, makes it `limited` (which stays);
   * any other success `clean`; another failure says nothing. The outcome goes with the release
   * (or settle). Returns the outcome read from this response.
   */
  observe(response: ResponseLike, options: { floor?: number } = {}): Outcome | undefined {
    const seen = vendorOutcome(response, options);
    if (seen === 'limited' || (seen === 'clean' && this.#outcome === undefined)) this.#outcome = seen;
    return seen;
  }

  /**
   * Sets the grant's real cost in each named window bucket (the latest settle stands); the permit
   * keeps its places. `false` when it is no longer live, or has no id (ask with `permit: true`).
   * An adapted grant's outcome goes with it: `options.outcome`, else what `observe` saw.
   */
  async settle(costs: Costs, options: { outcome?: Outcome } = {}): Promise<boolean> {
    if (this.id === undefined || this.#release !== undefined) return false;
    const outcome = options.outcome ?? this.#outcome;
    return this.#client.settle(this.id, costs, outcome === undefined ? {} : { outcome });
  }

  /**
   * Frees the places, settling `costs` first in the same step when given. Idempotent: only the
   * first call acts, later calls resolve to its answer (`true` when the permit was live). A call
   * that failed (the limiter unreachable) may be tried again. An adapted grant reports its
   * outcome (section 14): `options.outcome`, else what `observe` saw, else `clean`.
   */
  release(costs?: Costs, options: { outcome?: Outcome } = {}): Promise<boolean> {
    return this.#releaseWith(costs, options.outcome ?? this.#outcome ?? (this.adapted ? 'clean' : undefined));
  }

  /**
   * Releases after the call failed: only an outcome that was seen (or given) is reported, never
   * a `clean` one for a call that did not get through.
   * @internal
   */
  releaseAfterFailure(): Promise<boolean> {
    return this.#releaseWith(undefined, this.#outcome);
  }

  #releaseWith(costs: Costs | undefined, outcome: Outcome | undefined): Promise<boolean> {
    if (this.#release === undefined) {
      const id = this.id;
      const done = id === undefined ? Promise.resolve(false) : this.#client.release(id, costs, outcome === undefined ? {} : { outcome });
      this.#release = done;
      done.catch(() => {
        if (this.#release === done) this.#release = undefined;
      });
    }
    return this.#release;
  }

  /** `await using permit = await client.acquire(...)` releases it when the scope ends. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }
}
