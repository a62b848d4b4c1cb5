// Type-checked by `npm test` (tsc --noEmit -p test): the VernLLM adapter satisfies vern-llm's own
// `RateLimiterAdapter`, method by method in both directions of each parameter, and the package's
// types resolve through both of its `exports` conditions.
import type { RateLimiterAdapter } from 'vern-llm';
import { LLMError, VernLLM, fromFetch } from 'vern-llm';
import { LimiterClient, vernRateLimit, type Permit, type VernRateLimit } from 'redb-limiter';

type Vern = RateLimiterAdapter;
type Ours = VernRateLimit;
type Assert<T extends true> = T;
type Extends<A, B> = [A] extends [B] ? true : false;

const client = new LimiterClient({ url: 'http://127.0.0.1:7411' });
const adapter = vernRateLimit({ client, key: 'openai', requestsPerMinute: 60, tokensPerMinute: 90_000, maxConcurrent: 4 });
// vern-llm's own error class is what the adapter builds its errors with.
vernRateLimit({ client, key: 'openai', requestsPerMinute: 60, LLMError });
// The value satisfies the adapter type as VernLLM declares it, and VernLLM takes it.
adapter satisfies Vern;
new VernLLM({ client: fromFetch({ url: 'http://127.0.0.1:1/v1', mapRequest: (r) => r, mapResponse: () => ({ content: '' }) }), model: 'm', rateLimit: adapter });
// The client it wraps (to read a provider's 429s) is still the LLM client VernLLM takes.
new VernLLM({ client: adapter.wrapClient(fromFetch({ url: 'http://127.0.0.1:1/v1', mapRequest: (r) => r, mapResponse: () => ({ content: '' }) })), model: 'm', rateLimit: adapter });

// Methods are checked bivariantly by TypeScript, so check each side exactly: every argument
// VernLLM passes is one we take, and everything we return is what VernLLM expects.
export type Checks = [
  Assert<Extends<Parameters<Vern['estimate']>, Parameters<Ours['estimate']>>>,
  Assert<Extends<ReturnType<Ours['estimate']>, ReturnType<Vern['estimate']>>>,
  Assert<Extends<Parameters<Vern['acquire']>, Parameters<Ours['acquire']>>>,
  Assert<Extends<ReturnType<Ours['acquire']>, ReturnType<Vern['acquire']>>>,
  Assert<Extends<Parameters<Awaited<ReturnType<Vern['acquire']>>['release']>, Parameters<Awaited<ReturnType<Ours['acquire']>>['release']>>>,
  Assert<Extends<Parameters<Vern['signalRateLimit']>, Parameters<Ours['signalRateLimit']>>>,
  Assert<Extends<Parameters<Vern['reactToRateLimitHint']>, Parameters<Ours['reactToRateLimitHint']>>>,
  Assert<Extends<ReturnType<Ours['readState']>, ReturnType<NonNullable<Vern['readState']>>>>,
  Assert<Extends<Parameters<NonNullable<Vern['setLogger']>>, Parameters<Ours['setLogger']>>>,
  // And the reverse of each argument: nothing we accept is outside what VernLLM sends.
  Assert<Extends<Parameters<Ours['acquire']>, Parameters<Vern['acquire']>>>,
  Assert<Extends<Parameters<Ours['reactToRateLimitHint']>, Parameters<Vern['reactToRateLimitHint']>>>,
  Assert<Extends<Awaited<ReturnType<Ours['acquire']>>, Awaited<ReturnType<Vern['acquire']>>>>,
  Assert<Extends<Awaited<ReturnType<Vern['acquire']>>, Awaited<ReturnType<Ours['acquire']>>>>,
];

// A permit is disposable: `await using` releases it.
export async function scoped(): Promise<void> {
  await using permit = await client.acquire({ key: 'k', limits: [{ key: 'b', concurrent: 1 }] });
  const p: Permit = permit;
  await p.settle({ b: 1 });
}
