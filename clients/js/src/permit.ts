// A granted call: it holds its places until released (`await using` releases it on scope exit).
// `release(costs?)` is idempotent: the first call does it, later calls get the same answer.

import type { LimiterClient, LimitFigures } from './client.js';
import type { Reason } from './errors.js';

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
   * Sets the grant's real cost in each named window bucket (the latest settle stands); the permit
   * keeps its places. `false` when it is no longer live, or has no id (ask with `permit: true`).
   */
  async settle(costs: Costs): Promise<boolean> {
    if (this.id === undefined || this.#release !== undefined) return false;
    return this.#client.settle(this.id, costs);
  }

  /**
   * Frees the places, settling `costs` first in the same step when given. Idempotent: only the
   * first call acts, later calls resolve to its answer (`true` when the permit was live). A call
   * that failed (the limiter unreachable) may be tried again.
   */
  release(costs?: Costs): Promise<boolean> {
    if (this.#release === undefined) {
      const id = this.id;
      const done = id === undefined ? Promise.resolve(false) : this.#client.release(id, costs);
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
