// Tokens of an LLM call: a guess before it (to acquire with) and the provider's real usage after
// it (to settle with). No HTTP, no limiter.

import { InvalidArgumentError } from './errors.js';

/** A chat message as OpenAI-style APIs carry it; only `content` is read. */
export interface MessageLike {
  content?: unknown;
}

/** Counts the tokens of one piece of text, e.g. a real tokenizer's `encode(text).length`. */
export type Tokenizer = (text: string) => number;

/** The text a message's content stands for: a string as is, anything else as its JSON. */
function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (content === undefined || content === null) return '';
  try {
    return JSON.stringify(content) ?? '';
  } catch {
    return '';
  }
}

/**
 * The guess before a call, as VernLLM makes it: the characters of every message's content
 * divided by 4 (rounded up), plus the most the reply may hold (`maxTokens`). With a `tokenizer`,
 * the sum of its counts for each message's text replaces the division.
 */
export function estimateTokens(
  messages: readonly MessageLike[],
  maxTokens = 0,
  options: { tokenizer?: Tokenizer } = {},
): number {
  if (!Array.isArray(messages)) throw new InvalidArgumentError('messages', 'must be an array');
  if (!Number.isInteger(maxTokens) || maxTokens < 0) {
    throw new InvalidArgumentError('maxTokens', 'must be a non-negative integer');
  }
  const { tokenizer } = options;
  let prompt = 0;
  if (tokenizer) {
    messages.forEach((m, i) => {
      const n = tokenizer(contentText(m?.content));
      if (!Number.isInteger(n) || n < 0) {
        throw new InvalidArgumentError(`tokenizer(messages[${i}].content)`, 'must return a non-negative integer');
      }
      prompt += n;
    });
  } else {
    let chars = 0;
    for (const m of messages) chars += contentText(m?.content).length;
    prompt = Math.ceil(chars / 4);
  }
  return prompt + maxTokens;
}

function count(obj: Record<string, unknown>, name: string, field: string): number | undefined {
  const v = obj[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) {
    throw new InvalidArgumentError(field, 'must be a non-negative integer');
  }
  return v;
}

function required(obj: Record<string, unknown>, name: string, field: string): number {
  const n = count(obj, name, field);
  if (n === undefined) throw new InvalidArgumentError(field, 'is required');
  return n;
}

function member(obj: Record<string, unknown>, name: string): Record<string, unknown> {
  const v = obj[name];
  if (v === undefined) throw new InvalidArgumentError(name, 'is required');
  if (typeof v !== 'object' || v === null || Array.isArray(v)) {
    throw new InvalidArgumentError(name, 'must be a JSON object');
  }
  return v as Record<string, unknown>;
}

/**
 * The tokens a provider reports for a call, from its parsed reply body, strictly (a missing or
 * malformed figure throws an `InvalidArgumentError` naming it). `openai`: `usage.total_tokens`,
 * checked against its parts when given; `anthropic`: `usage.input_tokens + output_tokens` plus
 * its cache tokens; `google`: `usageMetadata.totalTokenCount`.
 */
export function usageTokens(provider: 'openai' | 'anthropic' | 'google', reply: unknown): number {
  if (typeof reply !== 'object' || reply === null || Array.isArray(reply)) {
    throw new InvalidArgumentError('body', 'must be a JSON object');
  }
  const body = reply as Record<string, unknown>;
  if (provider === 'anthropic') {
    const { input, output, cacheRead, cacheWrite } = tokenUsage(provider, body);
    return input + output + cacheRead + cacheWrite;
  }
  if (provider === 'openai') {
    const usage = member(body, 'usage');
    const total = required(usage, 'total_tokens', 'usage.total_tokens');
    for (const [a, b] of [
      ['prompt_tokens', 'completion_tokens'],
      ['input_tokens', 'output_tokens'],
    ] as const) {
      const pa = count(usage, a, `usage.${a}`);
      const pb = count(usage, b, `usage.${b}`);
      if (pa !== undefined && pb !== undefined && pa + pb !== total) {
        throw new InvalidArgumentError('usage.total_tokens', `is not usage.${a} + usage.${b}`);
      }
    }
    return total;
  }
  return required(member(body, 'usageMetadata'), 'totalTokenCount', 'usageMetadata.totalTokenCount');
}

/** The providers whose bodies these functions read. */
export type Provider = 'openai' | 'anthropic' | 'google';

/**
 * A call's tokens per kind, as its provider counts them. `input` holds no cached tokens: the
 * prompt is `input + cacheRead + cacheWrite`.
 */
export interface Usage {
  /** Prompt tokens read neither from nor into a cache. */
  input: number;
  /** Reply tokens (reasoning included). */
  output: number;
  /** Prompt tokens read from a cache. */
  cacheRead: number;
  /** Prompt tokens written into a cache (Anthropic's `cache_creation_input_tokens`). */
  cacheWrite: number;
}

/**
 * The buckets a host declares for a provider's tokens, by key: `input` counts the input the
 * provider counts (Anthropic's ITPM), `output` the output (OTPM), `tokens` both (OpenAI's TPM).
 */
export interface UsageBuckets {
  input?: string;
  output?: string;
  tokens?: string;
}

const PROVIDERS: readonly string[] = ['anthropic', 'openai', 'google'];
const PROMPT_FIELDS: Record<Provider, readonly string[]> = {
  anthropic: ['system', 'messages', 'tools'],
  openai: ['messages', 'input', 'instructions', 'tools'],
  google: ['contents', 'systemInstruction', 'tools'],
};

function provider(p: unknown): Provider {
  if (typeof p !== 'string' || !PROVIDERS.includes(p)) {
    throw new InvalidArgumentError('provider', 'must be one of anthropic, openai, google');
  }
  return p as Provider;
}

function object(v: unknown, field: string): Record<string, unknown> {
  const parsed = typeof v === 'string' ? parseJson(v, field) : v;
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw new InvalidArgumentError(field, 'must be a JSON object');
  }
  return parsed as Record<string, unknown>;
}

function parseJson(text: string, field: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new InvalidArgumentError(field, `is not valid JSON: ${(e as Error).message}`);
  }
}

/** The characters (code points, not UTF-16 units) of every string inside `v`. */
function chars(v: unknown): number {
  if (typeof v === 'string') return [...v].length;
  if (Array.isArray(v)) return v.reduce((n: number, x) => n + chars(x), 0);
  if (typeof v === 'object' && v !== null) return Object.values(v).reduce((n: number, x) => n + chars(x), 0);
  return 0;
}

/** `part` out of `whole`: what is left of `whole`, or an error when `part` is larger. */
function partOf(part: number, whole: number, partField: string, wholeField: string): number {
  if (part > whole) throw new InvalidArgumentError(partField, `exceeds ${wholeField}`);
  return whole - part;
}

/**
 * The provider's usage of a call, per kind, from its reply (parsed, or its JSON text), strictly:
 * a missing or malformed figure throws an `InvalidArgumentError` naming it. `anthropic`:
 * `usage.input_tokens` and `output_tokens`, `cache_read_input_tokens` and
 * `cache_creation_input_tokens` (0 when absent). `openai`: `prompt_tokens` and
 * `completion_tokens` (Chat Completions) or `input_tokens` and `output_tokens` (the Responses
 * API), their `*_tokens_details.cached_tokens` as cache reads, and `total_tokens`, when given,
 * checked against the two. `google`: `usageMetadata.promptTokenCount` (its
 * `cachedContentTokenCount` as cache reads) and the rest of `totalTokenCount` (the reply and
 * its thoughts) as output.
 */
export function tokenUsage(providerName: Provider, reply: unknown): Usage {
  const name = provider(providerName);
  const body = object(reply, 'body');
  if (name === 'anthropic') {
    const usage = member(body, 'usage');
    return {
      input: required(usage, 'input_tokens', 'usage.input_tokens'),
      output: required(usage, 'output_tokens', 'usage.output_tokens'),
      cacheRead: count(usage, 'cache_read_input_tokens', 'usage.cache_read_input_tokens') ?? 0,
      cacheWrite: count(usage, 'cache_creation_input_tokens', 'usage.cache_creation_input_tokens') ?? 0,
    };
  }
  if (name === 'openai') {
    const usage = member(body, 'usage');
    const [a, b] = 'input_tokens' in usage || 'output_tokens' in usage ? ['input', 'output'] : ['prompt', 'completion'];
    const prompt = required(usage, `${a}_tokens`, `usage.${a}_tokens`);
    const output = required(usage, `${b}_tokens`, `usage.${b}_tokens`);
    const details = usage[`${a}_tokens_details`];
    const cached =
      details === undefined || details === null
        ? 0
        : (count(object(details, `usage.${a}_tokens_details`), 'cached_tokens', `usage.${a}_tokens_details.cached_tokens`) ?? 0);
    const input = partOf(cached, prompt, `usage.${a}_tokens_details.cached_tokens`, `usage.${a}_tokens`);
    const total = count(usage, 'total_tokens', 'usage.total_tokens');
    if (total !== undefined && prompt + output !== total) {
      throw new InvalidArgumentError('usage.total_tokens', `is not usage.${a}_tokens + usage.${b}_tokens`);
    }
    return { input, output, cacheRead: cached, cacheWrite: 0 };
  }
  const meta = member(body, 'usageMetadata');
  const prompt = required(meta, 'promptTokenCount', 'usageMetadata.promptTokenCount');
  const total = required(meta, 'totalTokenCount', 'usageMetadata.totalTokenCount');
  const cached = count(meta, 'cachedContentTokenCount', 'usageMetadata.cachedContentTokenCount') ?? 0;
  const input = partOf(cached, prompt, 'usageMetadata.cachedContentTokenCount', 'usageMetadata.promptTokenCount');
  if (total < prompt) throw new InvalidArgumentError('usageMetadata.totalTokenCount', 'is below usageMetadata.promptTokenCount');
  return { input, output: total - prompt, cacheRead: cached, cacheWrite: 0 };
}

/**
 * The guess before a call, per kind, from its request body (parsed, or its JSON text): the
 * prompt fields' characters / `charsPerToken` (rounded up) as input, and as output the most the
 * reply may hold (`max_tokens`, `max_completion_tokens`, `max_output_tokens`,
 * `generationConfig.maxOutputTokens`, else `defaultMaxOutput`). Acquire with it, then settle to
 * the reply's `tokenUsage`, which brings the output down to what was spent.
 */
export function requestUsage(
  providerName: Provider,
  request: unknown,
  options: { defaultMaxOutput?: number; charsPerToken?: number } = {},
): Usage {
  const name = provider(providerName);
  const { defaultMaxOutput = 4096, charsPerToken = 4 } = options;
  if (!Number.isSafeInteger(defaultMaxOutput) || defaultMaxOutput < 0) {
    throw new InvalidArgumentError('defaultMaxOutput', 'must be a non-negative integer');
  }
  if (!Number.isSafeInteger(charsPerToken) || charsPerToken < 1) {
    throw new InvalidArgumentError('charsPerToken', 'must be a positive integer');
  }
  const body = object(request, 'body');
  const prompt = PROMPT_FIELDS[name].reduce((n, f) => n + chars(body[f]), 0);
  let maxOutput: number | undefined;
  if (name === 'anthropic') maxOutput = count(body, 'max_tokens', 'max_tokens');
  else if (name === 'openai') {
    maxOutput =
      count(body, 'max_completion_tokens', 'max_completion_tokens') ??
      count(body, 'max_output_tokens', 'max_output_tokens') ??
      count(body, 'max_tokens', 'max_tokens');
  } else if (body.generationConfig !== undefined) {
    maxOutput = count(object(body.generationConfig, 'generationConfig'), 'maxOutputTokens', 'generationConfig.maxOutputTokens');
  }
  return { input: Math.ceil(prompt / charsPerToken), output: maxOutput ?? defaultMaxOutput, cacheRead: 0, cacheWrite: 0 };
}

const MAX_BUCKET_KEY_BYTES = 512;

/**
 * A usage as the costs of the buckets a host declares, for `settle` (or a limit's `cost` when
 * acquiring with a `requestUsage`): the input the provider counts to `input`, the output to
 * `output`, both to `tokens`. Anthropic counts no cache reads towards its input limits; OpenAI
 * and Google count cached prompt tokens like any other. Throws naming the bucket at fault.
 */
export function usageCosts(providerName: Provider, usage: Usage, buckets: UsageBuckets): Record<string, number> {
  const name = provider(providerName);
  const input = usage.input + usage.cacheWrite + (name === 'anthropic' ? 0 : usage.cacheRead);
  const named = [
    ['input', buckets?.input, input],
    ['output', buckets?.output, usage.output],
    ['tokens', buckets?.tokens, input + usage.output],
  ] as const;
  const costs: Record<string, number> = {};
  named.forEach(([kind, key, cost], i) => {
    if (key === undefined) return;
    const bytes = typeof key === 'string' ? new TextEncoder().encode(key).length : -1;
    if (bytes < 1 || bytes > MAX_BUCKET_KEY_BYTES) {
      throw new InvalidArgumentError(`buckets.${kind}`, `must be 1 to ${MAX_BUCKET_KEY_BYTES} bytes of UTF-8, got ${bytes < 0 ? typeof key : bytes}`);
    }
    const earlier = named.slice(0, i).find(([, k]) => k === key);
    if (earlier) throw new InvalidArgumentError(`buckets.${kind}`, `repeats buckets.${earlier[0]}`);
    costs[key] = cost;
  });
  if (Object.keys(costs).length === 0) throw new InvalidArgumentError('buckets', 'must name input, output or tokens');
  return costs;
}
