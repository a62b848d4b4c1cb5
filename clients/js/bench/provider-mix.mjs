// Provider mix: how close hosts that do not know a provider's limit come to it (wire section 14).
// A fake provider with a hidden true limit (TRUE calls in any WINDOW_MS, rolling; above it a 429
// with `retry-after-ms` to the instant it has room, and `retry-after` in whole seconds) is called
// by PROCESSES node processes of a VernLLM app, WORKERS calls at once each, every call CALL_MS
// long, in a closed loop for SECONDS; the true limit halves at HALVE_AT seconds. Every process
// declares twice the true limit. Three modes, one after another in one run:
//
//   static     VernLLM + vernRateLimit: one shared window declared at 2 × TRUE, no adaptation;
//   vern-aimd  VernLLM's own in-process limiter with its `aimd`, in each process alone;
//   shared     VernLLM + vernRateLimit with the same `aimd`: one ceiling the limiter keeps for all.
//
// Each process calls with a credential of its own (`callerKey`), as the hosts of one
// organisation do. In `static`, a 429 read through `wrapClient` closes that credential for the
// wait the provider asked (at least 1 s, the client's floor); in `shared`, the cut of the
// ceiling answers it, as VernLLM's own `aimd` does (`--wrap-shared` reads 429s there too). VernLLM retries nothing (maxRetries 0), so
// every 429 is counted once. VernLLM's own limiter counts per minute: its figures are scaled by
// 60000 / WINDOW_MS (requestsPerMinute, minCapacity, maxCapacity, increaseBy), so that its
// ceiling and steps are the same share of the true limit as the adapter's per window.
//
// With `--headers` the provider also reports its budget on every 200 as OpenAI does
// (`x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`, and
// `x-ratelimit-reset-requests` as the time until its window has room again), which VernLLM's
// `fromFetch` reads as its hint; `--floor N` then passes `proactiveFloor: N` in every `aimd`.
//
// Reported per mode, from the provider's own log, per phase after convergence (from CONVERGE
// seconds after the start, and after the halving): goodput (calls answered 200 a second, as a
// share of the true limit) and 429s (as a share of all calls the provider saw); and how long
// after the halving the 429s fell back under 2% over a window of 3 s. Not part of `npm test`:
//
//   node bench/provider-mix.mjs                                  # all three modes
//   node bench/provider-mix.mjs --modes shared --seconds 30
//   node bench/provider-mix.mjs --true 40 --workers 4             # a small limit
//   node bench/provider-mix.mjs --headers --floor 1               # with the provider's budget
//
// The server: $REDB_LIMITER_BIN, else the repository's release build (see test/server.mjs).
import { fork } from 'node:child_process';
import http from 'node:http';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { dirname, join } from 'node:path';
import { parseArgs } from 'node:util';

const here = dirname(fileURLToPath(import.meta.url));
const { values: opts } = parseArgs({
  options: {
    modes: { type: 'string', default: 'static,vern-aimd,shared' },
    seconds: { type: 'string', default: '40' },
    true: { type: 'string', default: '300' },
    'window-ms': { type: 'string', default: '1000' },
    'halve-at': { type: 'string', default: '20' },
    converge: { type: 'string', default: '8' },
    processes: { type: 'string', default: '3' },
    workers: { type: 'string', default: '8' },
    'call-ms': { type: 'string', default: '20' },
    increase: { type: 'string', default: '1' },
    factor: { type: 'string', default: '0.9' },
    floor: { type: 'string', default: '0' },
    headers: { type: 'boolean', default: false },
    'wrap-shared': { type: 'boolean', default: false },
    child: { type: 'boolean', default: false },
  },
});

if (opts.child) await child();
else await parent();

/** One process of the app: VernLLM in `mode`, its workers calling until the deadline. */
async function child() {
  const job = JSON.parse(process.env.PROVIDER_MIX);
  const { VernLLM, fromFetch } = await import('vern-llm');
  const { LimiterClient, vernRateLimit } = await import(pathToFileURL(join(here, '..', 'dist', 'index.mjs')).href);
  const llmClient = fromFetch({
    url: job.providerUrl,
    headers: { 'x-process': String(job.index) },
    mapRequest: (request) => request,
    mapResponse: (json) => ({ content: json.choices[0].message.content, usage: { promptTokens: 1, completionTokens: 1, totalTokens: 2 } }),
  });
  const perMinute = 60_000 / job.windowMs;
  let rateLimit;
  let llm;
  if (job.mode === 'vern-aimd') {
    rateLimit = {
      requestsPerMinute: job.declared * perMinute,
      aimd: {
        increaseBy: job.increase * perMinute,
        decreaseFactor: job.factor,
        minCapacity: perMinute,
        maxCapacity: 2 * job.declared * perMinute,
        ...(job.floor > 0 ? { proactiveFloor: job.floor } : {}),
      },
    };
    llm = new VernLLM({ client: llmClient, model: 'fake', maxRetries: 0, rateLimit, logger: 'silent' });
  } else {
    const client = new LimiterClient({ url: job.limiterUrl });
    rateLimit = vernRateLimit({
      client,
      key: job.key,
      callerKey: `${job.key}/cred:${job.index}`,
      requestsPerMinute: job.declared,
      windowMs: job.windowMs,
      maxQueueMs: 0,
      ...(job.mode === 'shared'
        ? {
            aimd: {
              increaseBy: job.increase,
              decreaseFactor: job.factor,
              minCapacity: 1,
              maxCapacity: 2 * job.declared,
              ...(job.floor > 0 ? { proactiveFloor: job.floor } : {}),
            },
          }
        : {}),
    });
    // Static limits need the provider's wait read off each 429 (wrapClient); with aimd the cut
    // answers it, as VernLLM's own limiter does, and a credential closed for the client's floor of
    // 1 s per 429 would idle the processes for nothing.
    const wrapped = job.mode === 'shared' && !job.wrapShared ? llmClient : rateLimit.wrapClient(llmClient);
    llm = new VernLLM({ client: wrapped, model: 'fake', maxRetries: 0, rateLimit, logger: 'silent' });
  }
  process.send({ ready: true });
  const { deadline } = await new Promise((r) => process.once('message', r));
  const counts = { ok: 0, limited: 0, other: 0 };
  const worker = async () => {
    while (Date.now() < deadline) {
      try {
        await llm.call({ userContent: 'x', jsonMode: false, maxTokens: 1 });
        counts.ok++;
      } catch (e) {
        if (e?.status === 429) counts.limited++;
        else counts.other++;
      }
    }
  };
  await Promise.all(Array.from({ length: job.workers }, worker));
  await rateLimit.flush?.();
  process.send({ counts });
  process.disconnect();
}

/** The provider: TRUE calls in any WINDOW_MS (halved at `halveAt`), a 429 above, every answer logged. */
async function startProvider(windowMs, callMs, headers) {
  const log = [];
  const granted = []; // instants of the calls answered 200, oldest first
  let limit = 0;
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const now = Date.now();
      while (granted.length > 0 && granted[0] <= now - windowMs) granted.shift();
      if (granted.length >= limit) {
        const waitMs = Math.max(1, granted[granted.length - limit] + windowMs - now);
        log.push({ at: now, ok: false });
        res.writeHead(429, { 'content-type': 'application/json', 'retry-after-ms': String(waitMs), 'retry-after': String(Math.ceil(waitMs / 1000)) });
        res.end('{"error":{"message":"rate limited"}}');
        return;
      }
      granted.push(now);
      log.push({ at: now, ok: true });
      // What OpenAI reports on every answer, which VernLLM's `fromFetch` reads as its hint.
      const budget = headers
        ? {
            'x-ratelimit-limit-requests': String(limit),
            'x-ratelimit-remaining-requests': String(limit - granted.length),
            'x-ratelimit-reset-requests': `${granted[0] + windowMs - now}ms`,
          }
        : {};
      setTimeout(() => {
        res.writeHead(200, { 'content-type': 'application/json', ...budget });
        res.end('{"choices":[{"message":{"content":"ok"}}]}');
      }, callMs);
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}/v1/chat/completions`,
    log,
    setLimit: (n) => (limit = n),
    reset: () => {
      log.length = 0;
      granted.length = 0;
    },
    close: () => new Promise((r) => server.close(r)),
  };
}

async function parent() {
  const { startServer } = await import('../test/server.mjs');
  const n = (k) => Number(opts[k]);
  const [seconds, trueLimit, windowMs, halveAt, converge, processes, workers, callMs] = [
    'seconds', 'true', 'window-ms', 'halve-at', 'converge', 'processes', 'workers', 'call-ms',
  ].map(n);
  const modes = opts.modes.split(',');
  const declared = 2 * trueLimit;
  const server = await startServer();
  const provider = await startProvider(windowMs, callMs, opts.headers);
  console.log(
    `provider mix: true limit ${trueLimit} calls per ${windowMs} ms (rolling), halved to ${Math.floor(trueLimit / 2)} at ${halveAt} s; ` +
      `${processes} processes × ${workers} workers, calls of ${callMs} ms, ${seconds} s per mode; each process declares ${declared}; ` +
      `aimd increaseBy ${n('increase')}, decreaseFactor ${n('factor')}` +
      (n('floor') > 0 ? `, proactiveFloor ${n('floor')}` : '') +
      (opts.headers ? '; the provider reports its remaining requests as OpenAI does' : ''),
  );
  const rows = [];
  try {
    for (const mode of modes) {
      provider.reset();
      provider.setLimit(trueLimit);
      const key = `mix/${process.pid}/${mode}`;
      const children = Array.from({ length: processes }, (_, index) => {
        const job = {
          mode, index, key, workers, declared, windowMs, increase: n('increase'), factor: n('factor'), floor: n('floor'),
          providerUrl: provider.url, limiterUrl: server.url, wrapShared: opts['wrap-shared'],
        };
        return fork(fileURLToPath(import.meta.url), ['--child'], { env: { ...process.env, PROVIDER_MIX: JSON.stringify(job) } });
      });
      const message = (c) =>
        new Promise((r, reject) => {
          c.once('message', r);
          c.once('exit', (code) => reject(new Error(`a ${mode} process exited (${code}) before its answer`)));
        });
      await Promise.all(children.map(message));
      const start = Date.now();
      const answers = children.map(message);
      for (const c of children) c.send({ deadline: start + seconds * 1000 });
      const halving = setTimeout(() => provider.setLimit(Math.floor(trueLimit / 2)), halveAt * 1000);
      const trace = [];
      let tracing;
      if (process.env.MIX_TRACE && mode === 'shared') {
        const { LimiterClient } = await import('../dist/index.mjs');
        const c = new LimiterClient({ url: server.url });
        const adapt = { min: 1, max: 2 * declared, increase: n('increase'), keepPct: Math.round(n('factor') * 100) };
        tracing = setInterval(async () => {
          const p = await c.peek({ key: 'trace', limits: [{ key: `${key}/rpm`, calls: declared, perMs: windowMs, adapt }] });
          const t = Date.now() - start;
          const okLast = provider.log.filter((x) => x.ok && x.at > Date.now() - windowMs).length;
          const badLast = provider.log.filter((x) => !x.ok && x.at > Date.now() - windowMs).length;
          trace.push(`${(t / 1000).toFixed(1)}s C=${p.limits[0].ceiling} used=${p.limits[0].used} prov200=${okLast} prov429=${badLast}`);
        }, 500);
      }
      await Promise.all(answers);
      if (tracing) {
        clearInterval(tracing);
        console.log(trace.join('\n'));
      }
      clearTimeout(halving);
      rows.push(summarize(mode, provider.log, start, { seconds, trueLimit, windowMs, halveAt, converge }));
    }
  } finally {
    await provider.close();
    await server.stop();
  }
  console.log('');
  console.log('| mode | goodput before / after halving | 429s before / after | 429s under 2% again (3 s) after the halving |');
  console.log('| --- | --- | --- | --- |');
  for (const r of rows) console.log(`| ${r.mode} | ${r.goodput} | ${r.limited} | ${r.settled} |`);
}

/** The figures of one mode from the provider's log (instants relative to `start`). */
function summarize(mode, log, start, { seconds, trueLimit, windowMs, halveAt, converge }) {
  const phase = (from, to, limit) => {
    const calls = log.filter((c) => c.at - start >= from * 1000 && c.at - start < to * 1000);
    const ok = calls.filter((c) => c.ok).length;
    const perWindow = (ok / (to - from)) * (windowMs / 1000);
    return { goodput: perWindow / limit, limited: calls.length === 0 ? 0 : (calls.length - ok) / calls.length };
  };
  const half = Math.floor(trueLimit / 2);
  const before = phase(converge, halveAt, trueLimit);
  const after = phase(halveAt + 10, seconds, half);
  // How soon after the halving the hosts follow it: the end of the first 3 s stretch from
  // which the 429s are under 2% of the calls again.
  let settled = 'never';
  for (let t = halveAt; t + 3 <= seconds; t += 0.5) {
    if (phase(t, t + 3, half).limited < 0.02) {
      settled = `${(t + 3 - halveAt).toFixed(1)} s`;
      break;
    }
  }
  const pct = (x) => `${(100 * x).toFixed(1)}%`;
  const row = {
    mode,
    goodput: `${pct(before.goodput)} / ${pct(after.goodput)}`,
    limited: `${pct(before.limited)} / ${pct(after.limited)}`,
    settled,
  };
  console.log(`${mode}: goodput ${row.goodput} of the true limit, 429s ${row.limited} of the provider's calls, under 2% again within ${settled} of the halving`);
  return row;
}
