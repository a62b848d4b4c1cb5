// The client's own transport (node:http with kept-alive connections, used when no `fetch` is
// passed): requests to the real server share one connection, and an answer cut short or a
// connection dropped is a ConnectionError, never a hang or a half-read body taken for an answer.
import assert from 'node:assert/strict';
import { createServer as createHttpServer } from 'node:http';
import { createServer as createTcpServer, connect } from 'node:net';
import { after, before, test } from 'node:test';
import { ConnectionError, LimiterClient } from '../dist/index.mjs';
import { fresh, startServer } from './server.mjs';

let server;
before(async () => {
  server = await startServer();
});
after(() => server?.stop());

/** A TCP relay to the real server that counts the connections made through it. */
async function countingRelay(t, upstream) {
  const { hostname, port } = new URL(upstream);
  let connections = 0;
  const relay = createTcpServer((down) => {
    connections += 1;
    const up = connect(Number(port), hostname);
    down.pipe(up).pipe(down);
    down.on('error', () => up.destroy());
    up.on('error', () => down.destroy());
  });
  await new Promise((r) => relay.listen(0, '127.0.0.1', r));
  t.after(() => new Promise((r) => relay.close(r)));
  return { url: `http://127.0.0.1:${relay.address().port}`, connections: () => connections };
}

/** An HTTP server of the test's own whose every answer is `answer(req, res)`. */
async function misbehaving(t, answer) {
  const s = createHttpServer(answer);
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  t.after(() => {
    s.closeAllConnections();
    return new Promise((r) => s.close(r));
  });
  return `http://127.0.0.1:${s.address().port}`;
}

test('sequential requests through the default transport share one connection', async (t) => {
  const relay = await countingRelay(t, server.url);
  const client = new LimiterClient({ url: relay.url });
  const req = { key: fresh('tp'), limits: [{ key: fresh('tp/w'), calls: 100, perMs: 60_000 }] };
  for (let i = 0; i < 20; i++) assert.equal((await client.tryAcquire(req)).granted, true);
  assert.equal(relay.connections(), 1);
});

test('an answer cut short is a ConnectionError', async (t) => {
  const url = await misbehaving(t, (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
    res.write('{"granted": tr');
    setTimeout(() => res.socket.destroy(), 20);
  });
  const client = new LimiterClient({ url, timeoutMs: 5_000 });
  const started = performance.now();
  const err = await client.peek({ key: 'k', limits: [{ key: 'w', calls: 1, perMs: 1000 }] }).catch((e) => e);
  assert.ok(err instanceof ConnectionError, String(err));
  assert.ok(performance.now() - started < 2_000, 'not held until the timeout');
});

test('a connection dropped unanswered is a ConnectionError; one never answered ends at timeoutMs', async (t) => {
  const dropped = await misbehaving(t, (req) => req.socket.destroy());
  await assert.rejects(new LimiterClient({ url: dropped }).health(), ConnectionError);
  const silent = await misbehaving(t, () => {});
  const started = performance.now();
  const err = await new LimiterClient({ url: silent, timeoutMs: 100 }).health().catch((e) => e);
  assert.ok(err instanceof ConnectionError, String(err));
  assert.match(err.message, /no answer within 100 ms/);
  assert.ok(performance.now() - started < 2_000);
});
