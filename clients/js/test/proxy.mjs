// A small HTTP proxy between a client and the real server that can delay, hang, drop or replace
// replies, and records every request that passes through it (with the answer it gave), so a test
// can see what a client sends when it gives up. The server itself is never mocked: every request
// not replaced reaches it.
import { createServer } from 'node:http';

/**
 * Starts a proxy to `upstream` (the server's URL). `rule({ method, path, body, seen })` decides
 * each request: `undefined` forwards it; `{ delayMs }` forwards it and holds the reply that long
 * (the server has acted: a grant is made, its answer late); `{ hang: true }` forwards nothing and
 * never answers; `{ drop: true }` closes the connection unanswered; `{ status, body }` answers
 * that instead. `seen` counts the earlier requests to the same path. Resolves to { url, log,
 * setRule(rule), waitFor(predicate, ms), close() }; `log` holds { method, path, body, at, status }
 * entries in arrival order (`at` in performance.now() ms; `status` once answered; `hungUp` when
 * the client closed the connection before its answer, which the proxy then passes on upstream).
 */
export async function startProxy(upstream, rule = () => undefined) {
  const log = [];
  const seen = new Map();
  let decide = rule;
  const server = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const text = Buffer.concat(chunks).toString('utf8');
    let body;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      body = text;
    }
    const path = req.url.split('?')[0];
    const n = seen.get(path) ?? 0;
    seen.set(path, n + 1);
    const entry = { method: req.method, path, url: req.url, body, at: performance.now(), status: undefined };
    log.push(entry);
    const upstreamStop = new AbortController();
    res.on('close', () => {
      if (res.writableFinished) return;
      entry.hungUp = true;
      upstreamStop.abort();
    });
    const action = decide({ method: req.method, path, body, seen: n }) ?? {};
    if (action.hang) return; // held until the client (or close) drops the connection
    if (action.drop) {
      req.socket.destroy();
      return;
    }
    if (action.status !== undefined) {
      entry.status = action.status;
      res.writeHead(action.status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(action.body ?? {}));
      return;
    }
    let status;
    let reply;
    try {
      const up = await fetch(`${upstream}${req.url}`, {
        method: req.method,
        headers: { 'content-type': 'application/json', ...(req.headers.authorization ? { authorization: req.headers.authorization } : {}) },
        body: req.method === 'GET' ? undefined : text,
        signal: upstreamStop.signal,
      });
      status = up.status;
      reply = await up.text();
    } catch {
      req.socket.destroy();
      return;
    }
    entry.reply = reply;
    if (action.delayMs) await new Promise((r) => setTimeout(r, action.delayMs));
    entry.status = status;
    if (res.destroyed || res.socket?.destroyed) return; // the client stopped waiting
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(reply);
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    log,
    setRule(next) {
      decide = next;
    },
    /** Resolves to the first entry matching `predicate` within `ms`, else undefined. */
    async waitFor(predicate, ms = 3_000) {
      const until = performance.now() + ms;
      for (;;) {
        const hit = log.find(predicate);
        if (hit || performance.now() > until) return hit;
        await new Promise((r) => setTimeout(r, 10));
      }
    },
    close() {
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    },
  };
}
