// One process of a VernLLM app: its own VernLLM, its provider a local OpenAI-compatible server,
// its limits the shared ones through vernRateLimit. Configured by environment variables; prints
// one JSON line per call and then {"done":true}.
import { VernLLM, fromFetch } from 'vern-llm';
import { LimiterClient, vernRateLimit } from '../dist/index.mjs';

const env = (name, fallback) => process.env[name] ?? fallback;
const num = (name, fallback) => Number(env(name, fallback));
const worker = env('WORKER', 'w');
const client = new LimiterClient({ url: env('LIMITER_URL') });
const rateLimit = vernRateLimit({
  client,
  key: env('KEY'),
  requestsPerMinute: num('RPM', 0) || undefined,
  tokensPerMinute: num('TPM', 0) || undefined,
  windowMs: num('WINDOW_MS', 60_000),
  maxQueueMs: num('MAX_QUEUE_MS', 0),
  ...(process.env.AIMD ? { aimd: JSON.parse(process.env.AIMD) } : {}),
});
const llm = new VernLLM({
  client: fromFetch({
    url: env('PROVIDER_URL'),
    headers: { 'x-worker': worker, 'x-phase': env('PHASE', '') },
    mapRequest: (request) => request,
    mapResponse: (json) => ({
      content: json.choices[0].message.content,
      usage: { promptTokens: json.usage.prompt_tokens, completionTokens: json.usage.completion_tokens, totalTokens: json.usage.total_tokens },
    }),
  }),
  model: 'fake-model',
  maxRetries: 0,
  rateLimit,
});

const calls = num('CALLS', 1);
const concurrency = num('CONCURRENCY', calls);
const chars = num('CONTENT_CHARS', 400);
const maxTokens = num('MAX_TOKENS', 100);
let next = 0;
async function lane() {
  while (next < calls) {
    const i = next++;
    const startedAt = Date.now();
    try {
      await llm.call({ userContent: 'x'.repeat(chars), jsonMode: false, maxTokens, temperature: null });
      console.log(JSON.stringify({ worker, i, ok: true, startedAt, doneAt: Date.now() }));
    } catch (e) {
      console.log(JSON.stringify({ worker, i, ok: false, error: String(e?.message ?? e), startedAt, doneAt: Date.now() }));
    }
  }
}
await Promise.all(Array.from({ length: concurrency }, lane));
await rateLimit.flush();
console.log(JSON.stringify({ worker, done: true }));
