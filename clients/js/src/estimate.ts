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
    const usage = member(body, 'usage');
    return (
      required(usage, 'input_tokens', 'usage.input_tokens') +
      required(usage, 'output_tokens', 'usage.output_tokens') +
      (count(usage, 'cache_creation_input_tokens', 'usage.cache_creation_input_tokens') ?? 0) +
      (count(usage, 'cache_read_input_tokens', 'usage.cache_read_input_tokens') ?? 0)
    );
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
