// The test's own OpenAI-compatible provider and the two-process VernLLM run around it.
import { spawn } from 'node:child_process';
import http from 'node:http';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/**
 * A chat-completions endpoint that records every request (arrival instant, worker, phase) and
 * reports `usage(request, n, headers)` tokens as the real usage of the n-th request; where that
 * returns `{ status, headers }` instead of a number, it answers that status (a 429, say) with
 * those headers, and `{ total, headers }` a success with those headers. `delayMs` in either
 * holds the answer that long.
 */
export async function startFakeProvider(usage) {
  const requests = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const parsed = JSON.parse(body);
      const said = usage(parsed, requests.length, req.headers);
      if (typeof said === 'object' && said.delayMs) {
        setTimeout(() => answer(parsed, said), said.delayMs);
      } else {
        answer(parsed, said);
      }
    });
    const answer = (parsed, said) => {
      let total = said;
      let extra = {};
      if (typeof said === 'object' && said.status === undefined) {
        total = said.total;
        extra = said.headers ?? {};
      }
      if (typeof total === 'object') {
        requests.push({ at: Date.now(), worker: req.headers['x-worker'], phase: req.headers['x-phase'], status: total.status });
        res.writeHead(total.status, { 'content-type': 'application/json', ...total.headers });
        res.end(JSON.stringify({ error: { message: `status ${total.status}` } }));
        return;
      }
      const completion = Math.min(total, 5);
      requests.push({ at: Date.now(), worker: req.headers['x-worker'], phase: req.headers['x-phase'], total, maxTokens: parsed.max_tokens });
      res.writeHead(200, { 'content-type': 'application/json', ...extra });
      res.end(JSON.stringify({
        id: `c-${requests.length}`,
        choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }],
        usage: { prompt_tokens: total - completion, completion_tokens: completion, total_tokens: total },
      }));
    };
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}/v1/chat/completions`,
    requests,
    close: () => new Promise((r) => server.close(r)),
  };
}

const workerPath = join(dirname(fileURLToPath(import.meta.url)), 'vern-worker.mjs');

/** Runs one worker process to its end; resolves to its calls. */
export function runWorker(env) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [workerPath], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
    const calls = [];
    let done = false;
    createInterface({ input: child.stdout }).on('line', (line) => {
      const msg = JSON.parse(line);
      if (msg.done) done = true;
      else calls.push(msg);
    });
    child.on('error', reject);
    child.on('exit', (code) => (code === 0 && done ? resolve(calls) : reject(new Error(`worker ${env.WORKER} exited ${code}`))));
  });
}

/** The most requests, and tokens, that arrived within any span of `spanMs`. */
export function busiest(requests, spanMs) {
  const sorted = [...requests].sort((a, b) => a.at - b.at);
  let calls = 0;
  let tokens = 0;
  for (let i = 0; i < sorted.length; i++) {
    let c = 0;
    let t = 0;
    for (let j = i; j < sorted.length && sorted[j].at < sorted[i].at + spanMs; j++) {
      c += 1;
      t += sorted[j].total;
    }
    calls = Math.max(calls, c);
    tokens = Math.max(tokens, t);
  }
  return { calls, tokens };
}
