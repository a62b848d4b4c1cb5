// Providers' signals: the wait a 429 asks for and the instant an exhausted budget resets, read
// from a response's headers (and a Google error body). Pure: no network, no clock reads (`now`
// is a parameter with the host's clock as its default). The same rules as the Rust client's
// `vendor` module, checked against the same vectors: strict parsers, a value that does not parse
// is no signal (ignored, never guessed at), every wait clamped to 1-120 s.

/** The shortest wait a 429 yields, whatever the provider says. */
export const MIN_WAIT_MS = 1_000;
/** The longest wait a provider can impose, through a 429 or an exhausted budget. */
export const MAX_WAIT_MS = 120_000;
/** Bodies longer than this are not read for `RetryInfo`. */
const MAX_BODY_BYTES = 64 * 1024;
const RETRY_INFO_TYPE = 'type.googleapis.com/google.rpc.RetryInfo';
const U64_MAX = (1n << 64n) - 1n;
const I64_MAX = (1n << 63n) - 1n;

/** A `Headers` object or a plain record (names in any case; arrays are joined as `Headers` does). */
export type HeadersLike = Headers | Record<string, string | readonly string[] | undefined>;

/** When `now` is: a `Date` or epoch milliseconds. */
export type Instant = Date | number;

const INSTANT_BUDGETS: readonly (readonly [string, string])[] = [
  ['anthropic-ratelimit-requests-remaining', 'anthropic-ratelimit-requests-reset'],
  ['anthropic-ratelimit-tokens-remaining', 'anthropic-ratelimit-tokens-reset'],
  ['anthropic-ratelimit-input-tokens-remaining', 'anthropic-ratelimit-input-tokens-reset'],
  ['anthropic-ratelimit-output-tokens-remaining', 'anthropic-ratelimit-output-tokens-reset'],
];
const DURATION_BUDGETS: readonly (readonly [string, string])[] = [
  ['x-ratelimit-remaining-requests', 'x-ratelimit-reset-requests'],
  ['x-ratelimit-remaining-tokens', 'x-ratelimit-reset-tokens'],
];

function toMs(now: Instant | undefined): bigint {
  const ms = now === undefined ? Date.now() : typeof now === 'number' ? now : now.getTime();
  return BigInt(Math.max(0, Math.floor(ms)));
}

/**
 * The wait a 429 asked for, in milliseconds, clamped to 1-120 s. Reads, in order,
 * `retry-after-ms`, `Retry-After` (seconds or an HTTP date, against `now`) and a
 * `google.rpc.RetryInfo` detail of a JSON error body; the first that parses wins. With none,
 * `defaultMs` (5000 unless given), clamped the same way.
 */
export function vendorWaitMs(
  headers: HeadersLike,
  body?: string | Uint8Array | null,
  options: { now?: Instant; defaultMs?: number } = {},
): number {
  const now = toMs(options.now);
  const defaultMs = options.defaultMs ?? 5_000;
  const fromHeader = (name: string, parse: (v: string) => bigint | undefined) => {
    const v = header(headers, name);
    return v === undefined ? undefined : parse(v);
  };
  const asked =
    fromHeader('retry-after-ms', parseDecimalMs) ??
    fromHeader('retry-after', (v) => parseRetryAfter(v, now)) ??
    retryInfoMs(body);
  if (asked === undefined) {
    if (!Number.isFinite(defaultMs)) return defaultMs > 0 ? MAX_WAIT_MS : MIN_WAIT_MS;
    return Math.min(MAX_WAIT_MS, Math.max(MIN_WAIT_MS, Math.ceil(defaultMs)));
  }
  return Number(asked < BigInt(MIN_WAIT_MS) ? BigInt(MIN_WAIT_MS) : asked > BigInt(MAX_WAIT_MS) ? BigInt(MAX_WAIT_MS) : asked);
}

/**
 * When a response reports an exhausted budget (a `remaining` header of exactly `0`: Anthropic's
 * `anthropic-ratelimit-*`, OpenAI's `x-ratelimit-*`), the instant it resets, at most `now + 120 s`;
 * of several, the one resetting last binds. `undefined` when nothing is exhausted (a count above
 * zero does nothing), or no exhausted budget names a reset after `now`.
 */
export function vendorBudget(headers: HeadersLike, options: { now?: Instant } = {}): Date | undefined {
  const now = toMs(options.now);
  const exhausted = (name: string) => {
    const v = header(headers, name);
    return v !== undefined && parseCount(v) === 0n;
  };
  const seconds = (v: string) => {
    const ms = parseSeconds(v);
    return ms === undefined ? undefined : now + ms;
  };
  const resets: bigint[] = [];
  for (const [remaining, reset] of INSTANT_BUDGETS) {
    if (!exhausted(remaining)) continue;
    const v = header(headers, reset);
    if (v === undefined) continue;
    const at = parseInstant(v) ?? seconds(v);
    if (at !== undefined) resets.push(at);
  }
  for (const [remaining, reset] of DURATION_BUDGETS) {
    if (!exhausted(remaining)) continue;
    const v = header(headers, reset);
    if (v === undefined) continue;
    const d = parseGoDuration(v);
    const at = d !== undefined ? now + d : seconds(v);
    if (at !== undefined) resets.push(at);
  }
  let latest: bigint | undefined;
  for (const r of resets) if (r > now && (latest === undefined || r > latest)) latest = r;
  if (latest === undefined) return undefined;
  const cap = now + BigInt(MAX_WAIT_MS);
  return new Date(Number(latest < cap ? latest : cap));
}

/** The providers' headers of remaining requests (Anthropic's, OpenAI's), as VernLLM reads its hint. */
const REMAINING_REQUESTS: readonly string[] = ['anthropic-ratelimit-requests-remaining', 'x-ratelimit-remaining-requests'];

/**
 * What a provider's response says of the call for an adaptive ceiling (wire section 14):
 * `limited` on a 429, or on a success whose remaining requests (the lowest the response reports)
 * are at or below `floor` (VernLLM's `proactiveFloor`; without one, only a 429 counts); `clean`
 * on any other success; `undefined` on any other failure, which says nothing of the limit.
 */
export function vendorOutcome(
  response: { status: number; headers: HeadersLike },
  options: { floor?: number } = {},
): 'clean' | 'limited' | undefined {
  const { floor } = options;
  if (floor !== undefined && (!Number.isInteger(floor) || floor < 0)) {
    throw new RangeError(`floor must be a non-negative integer, got ${String(floor)}`);
  }
  if (response.status === 429) return 'limited';
  if (response.status < 200 || response.status >= 300) return undefined;
  if (floor !== undefined) {
    for (const name of REMAINING_REQUESTS) {
      const v = header(response.headers, name);
      const n = v === undefined ? undefined : parseCount(v);
      if (n !== undefined && n <= BigInt(floor)) return 'limited';
    }
  }
  return 'clean';
}

/** A header's text without surrounding spaces and tabs; undefined when absent or empty. */
function header(headers: HeadersLike, name: string): string | undefined {
  let raw: string | null | undefined;
  if (typeof (headers as Headers).get === 'function' && typeof (headers as Headers).has === 'function') {
    raw = (headers as Headers).get(name);
  } else {
    const record = headers as Record<string, string | readonly string[] | undefined>;
    const parts: string[] = [];
    for (const [k, v] of Object.entries(record)) {
      if (k.toLowerCase() !== name || v === undefined) continue;
      if (typeof v === 'string') parts.push(v);
      else if (v.length > 0) parts.push(v[0]!);
    }
    // As an HTTP header map reads a repeated name: its first value.
    raw = parts[0];
  }
  if (raw === null || raw === undefined) return undefined;
  const text = raw.replace(/^[ \t]+|[ \t]+$/g, '');
  return text === '' ? undefined : text;
}

/** A leading run of ASCII digits and the rest; undefined when none, or above u64. */
function digits(s: string): [bigint, string] | undefined {
  let len = 0;
  while (len < s.length && isDigit(s.charCodeAt(len))) len++;
  if (len === 0) return undefined;
  const n = BigInt(s.slice(0, len));
  return n > U64_MAX ? undefined : [n, s.slice(len)];
}

function isDigit(c: number): boolean {
  return c >= 48 && c <= 57;
}

/** `floor(0.frac * unit)`, from at most 18 fractional digits. */
function scaled(frac: string, unit: bigint): bigint {
  const kept = frac.slice(0, 18);
  if (kept === '') return 0n;
  return (BigInt(kept) * unit) / 10n ** BigInt(kept.length);
}

/**
 * A decimal at the start of `s`: the whole part, the fraction's digits, the rest. `strict`: digits
 * on both sides of a dot; otherwise Go's rule (digits on at least one side).
 */
function number(s: string, strict: boolean, maxFrac: number): [bigint, string, string] | undefined {
  let whole = 0n;
  let rest = s;
  const d = digits(s);
  if (d) [whole, rest] = d;
  else if (s.length > 0 && isDigit(s.charCodeAt(0))) return undefined; // overflowed
  const hadWhole = rest.length < s.length;
  if (!rest.startsWith('.')) return hadWhole ? [whole, '', rest] : undefined;
  const afterDot = rest.slice(1);
  let len = 0;
  while (len < afterDot.length && isDigit(afterDot.charCodeAt(len))) len++;
  const sidesOk = strict ? hadWhole && len > 0 : hadWhole || len > 0;
  if (!sidesOk || len > maxFrac) return undefined;
  return [whole, afterDot.slice(0, len), afterDot.slice(len)];
}

function checked(n: bigint): bigint | undefined {
  return n > U64_MAX ? undefined : n;
}

/** A budget's remaining count: unsigned decimal digits only. */
function parseCount(s: string): bigint | undefined {
  const d = digits(s);
  return d && d[1] === '' ? d[0] : undefined;
}

/** `retry-after-ms`: `digits[.digits]` milliseconds, rounded up. */
function parseDecimalMs(s: string): bigint | undefined {
  const n = number(s, true, Number.MAX_SAFE_INTEGER);
  if (!n || n[2] !== '') return undefined;
  return checked(n[0] + (/[1-9]/.test(n[1]) ? 1n : 0n));
}

/** Plain decimal seconds (`30`, `0.5`) into milliseconds, rounded up; at most 9 fraction digits. */
export function parseSeconds(s: string): bigint | undefined {
  const n = number(s, true, 9);
  if (!n || n[2] !== '') return undefined;
  const ms = checked(n[0] * 1000n);
  if (ms === undefined) return undefined;
  return checked(ms + ceilDiv(scaled(n[1], 1_000_000_000n), 1_000_000n));
}

function ceilDiv(a: bigint, b: bigint): bigint {
  return (a + b - 1n) / b;
}

/**
 * A Go duration (OpenAI's resets: `6m0s`, `20ms`, `1.5h`) into milliseconds, rounded up. Units
 * h, m, s, ms, us/µs/μs, ns, each at most once, largest first; or a bare `0`.
 */
export function parseGoDuration(s: string): bigint | undefined {
  const UNITS: readonly (readonly [string, bigint])[] = [
    ['h', 3_600_000_000_000n],
    ['m', 60_000_000_000n],
    ['s', 1_000_000_000n],
    ['ms', 1_000_000n],
    ['us', 1_000n],
    ['\u00b5s', 1_000n],
    ['\u03bcs', 1_000n],
    ['ns', 1n],
  ];
  if (s === '0') return 0n;
  if (s === '') return undefined;
  let rest = s;
  let total = 0n;
  let nextUnit = 0;
  while (rest !== '') {
    const n = number(rest, false, Number.MAX_SAFE_INTEGER);
    if (!n) return undefined;
    const [whole, frac, after] = n;
    let unitLen = 0;
    while (unitLen < after.length && !isDigit(after.charCodeAt(unitLen)) && after[unitLen] !== '.') unitLen++;
    const unit = after.slice(0, unitLen);
    const index = UNITS.findIndex(([name]) => name === unit);
    if (index < 0 || index < nextUnit) return undefined;
    nextUnit = index >= 4 && index <= 6 ? 7 : index + 1;
    const unitNs = UNITS[index]![1];
    const part = checked(whole * unitNs);
    if (part === undefined) return undefined;
    const withFrac = checked(part + scaled(frac, unitNs));
    if (withFrac === undefined) return undefined;
    total = total + withFrac;
    if (total > U64_MAX) return undefined;
    rest = after.slice(unitLen);
  }
  if (total > I64_MAX) return undefined;
  return ceilDiv(total, 1_000_000n);
}

/** protobuf's JSON Duration (`38s`, `1.5s`) into milliseconds, rounded up. */
export function parseProtoDuration(s: string): bigint | undefined {
  if (!s.endsWith('s')) return undefined;
  const n = number(s.slice(0, -1), true, 9);
  if (!n || n[2] !== '' || n[0] > 315_576_000_000n) return undefined;
  return checked(n[0] * 1000n + ceilDiv(scaled(n[1], 1_000_000_000n), 1_000_000n));
}

/**
 * `Retry-After`: delay-seconds, or an HTTP date in any of RFC 9110's three forms (a date at or
 * before `now` gives 0). Surrounding whitespace is refused.
 */
export function parseRetryAfter(value: string, now: bigint): bigint | undefined {
  if (value.trim() !== value) return undefined;
  if (value.length > 0 && isDigit(value.charCodeAt(0))) {
    const d = digits(value);
    if (!d || d[1] !== '') return undefined;
    return checked(d[0] * 1000n);
  }
  const at = parseHttpDate(value);
  if (at === undefined) return undefined;
  return at > now ? at - now : 0n;
}

const DAYS = ['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'];
const LONG_DAYS = ['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday'];
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];

function fixed(s: string, len: number): number | undefined {
  if (s.length !== len) return undefined;
  for (let i = 0; i < len; i++) if (!isDigit(s.charCodeAt(i))) return undefined;
  return Number(s);
}

/** An HTTP date (IMF-fixdate, RFC 850, asctime) as epoch ms; the weekday must be right. */
export function parseHttpDate(s: string): bigint | undefined {
  let wday: number;
  let day: number | undefined;
  let mon: number;
  let year: number | undefined;
  let time: string;
  let m: RegExpExecArray | null;
  if ((m = /^([A-Za-z]{3}), (\d\d) ([A-Za-z]{3}) (\d{4}) (\d\d:\d\d:\d\d) GMT$/.exec(s))) {
    wday = DAYS.indexOf(m[1]!);
    day = fixed(m[2]!, 2);
    mon = MONTHS.indexOf(m[3]!);
    year = fixed(m[4]!, 4);
    time = m[5]!;
  } else if ((m = /^([A-Za-z]+), (\d\d)-([A-Za-z]{3})-(\d\d) (\d\d:\d\d:\d\d) GMT$/.exec(s))) {
    wday = LONG_DAYS.indexOf(m[1]!);
    day = fixed(m[2]!, 2);
    mon = MONTHS.indexOf(m[3]!);
    const yy = fixed(m[4]!, 2);
    year = yy === undefined ? undefined : yy < 70 ? 2000 + yy : 1900 + yy;
    time = m[5]!;
  } else if ((m = /^([A-Za-z]{3}) ([A-Za-z]{3}) ([ \d]\d) (\d\d:\d\d:\d\d) (\d{4})$/.exec(s))) {
    wday = DAYS.indexOf(m[1]!);
    mon = MONTHS.indexOf(m[2]!);
    const dd = m[3]!;
    day = dd.startsWith(' ') ? fixed(dd.slice(1), 1) : fixed(dd, 2);
    time = m[4]!;
    year = fixed(m[5]!, 4);
  } else {
    return undefined;
  }
  if (wday < 0 || mon < 0 || day === undefined || year === undefined) return undefined;
  const [hh, mm, ss] = time.split(':').map(Number) as [number, number, number];
  if (year < 1970 || year > 9999 || day < 1 || hh > 23 || mm > 59 || ss > 59) return undefined;
  const daysInMonth = new Date(Date.UTC(year, mon + 1, 0)).getUTCDate();
  if (day > daysInMonth) return undefined;
  const ms = Date.UTC(year, mon, day, hh, mm, ss);
  // Weekday: Date's Sunday is 0; ours is Monday = 0.
  if ((new Date(ms).getUTCDay() + 6) % 7 !== wday) return undefined;
  return BigInt(ms);
}

/**
 * An RFC 3339 instant (`2026-11-30T03:11:09.123Z`, an offset, or no fraction) as epoch ms
 * (the epoch for anything before it); undefined when it is not one.
 */
export function parseInstant(s: string): bigint | undefined {
  const m = /^(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(?:([Zz])|([+-])(\d\d):(\d\d))$/.exec(s);
  if (!m || s.length < 20 || s.length > 64) return undefined;
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [number, number, number, number, number, number];
  const frac = m[7] ?? '';
  const millis = frac === '' ? 0 : Number(frac.slice(0, 3).padEnd(3, '0'));
  let offset = 0;
  if (m[9] !== undefined) {
    const oh = Number(m[10]);
    const om = Number(m[11]);
    if (oh > 23 || om > 59) return undefined;
    offset = (oh * 3600 + om * 60) * (m[9] === '-' ? -1 : 1);
  }
  if (hour > 23 || minute > 59 || second > 59 || month < 1 || month > 12 || day < 1) return undefined;
  const d = new Date(0);
  d.setUTCFullYear(year, month - 1, day);
  if (d.getUTCMonth() !== month - 1 || d.getUTCDate() !== day) return undefined;
  d.setUTCHours(hour, minute, second, 0);
  const ms = d.getTime() - offset * 1000 + millis;
  return BigInt(Math.max(0, ms));
}

/** The delay of the first `google.rpc.RetryInfo` detail of a Google JSON error body. */
function retryInfoMs(body: string | Uint8Array | null | undefined): bigint | undefined {
  if (body === undefined || body === null) return undefined;
  let text: string;
  if (typeof body === 'string') {
    if (new TextEncoder().encode(body).length > MAX_BODY_BYTES) return undefined;
    text = body;
  } else {
    if (body.length > MAX_BODY_BYTES) return undefined;
    try {
      text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(body);
    } catch {
      return undefined;
    }
  }
  if (tooDeep(text)) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  const errors = Array.isArray(value) ? value : [value];
  for (const item of errors) {
    if (!isObject(item) || !isObject(item.error)) continue;
    const details = item.error.details;
    if (!Array.isArray(details)) continue;
    for (const detail of details) {
      if (!isObject(detail) || detail['@type'] !== RETRY_INFO_TYPE) continue;
      if (typeof detail.retryDelay !== 'string') continue;
      const ms = parseProtoDuration(detail.retryDelay);
      if (ms !== undefined) return ms;
    }
  }
  return undefined;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Nesting beyond 127 levels, which the Rust client's JSON parser refuses (its recursion limit). */
function tooDeep(text: string): boolean {
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 92) i++; // a backslash escapes the next character
      else if (c === 34) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 91 || c === 123) {
      if (++depth > 127) return true;
    } else if (c === 93 || c === 125) depth--;
  }
  return false;
}
