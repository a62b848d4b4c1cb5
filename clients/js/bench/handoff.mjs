// Hand-off: how soon a freed concurrency place is used again. CALLS calls of CALL_MS each through
// one `concurrent: PLACES` limit, split between PROCESSES node processes (each with one
// LimiterClient, all of its calls waiting at once), against a real server with its default
// recheck (250 ms). The ideal wall time is CALLS × CALL_MS / PLACES; a client that waits for each
// refusal's `retryAt` idles up to a recheck per hand-off, one that is woken uses the place within
// a round trip. For reference it also measures the floor of this machine: the same calls made by
// PLACES workers in all, each calling in turn, so that no call is ever refused and none waits (what
// remains is each call's acquire, release and timer). Not part of `npm test`:
//
//   node bench/handoff.mjs                      # this build (dist/), 5 runs
//   node bench/handoff.mjs --client <index.mjs> # another build of the client, e.g. an earlier one
//   node bench/handoff.mjs --runs 3 --calls 200 --call-ms 10 --places 4 --processes 2
//
// The server: $REDB_LIMITER_BIN, else the repository's release build (see test/server.mjs).
import { fork } from 'node:child_process';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const here = dirname(fileURLToPath(import.meta.url));
const { values: opts } = parseArgs({
  options: {
    client: { type: 'string', default: join(here, '..', 'dist', 'index.mjs') },
    runs: { type: 'string', default: '5' },
    calls: { type: 'string', default: '200' },
    'call-ms': { type: 'string', default: '10' },
    places: { type: 'string', default: '4' },
    processes: { type: 'string', default: '2' },
    child: { type: 'boolean', default: false },
  },
});

if (opts.child) await child();
else await parent();

/** One process: its share of the calls, all waiting at once, each holding a place for CALL_MS. */
async function child() {
  const { LimiterClient } = await import(pathToFileURL(resolve(opts.client)).href);
  const { url, key, bucket, calls, callMs, places, workers } = JSON.parse(process.env.HANDOFF);
  const sent = { acquire: 0, wait: 0, release: 0 };
  const counting = (input, init) => {
    const path = new URL(String(input)).pathname.slice(1);
    if (path in sent) sent[path] += 1;
    return fetch(input, init);
  };
  const client = new LimiterClient({ url, fetch: counting });
  // Opens the connection first, so that the run measures hand-offs, not the first connect.
  await client.health();
  const request = { key, limits: [{ key: bucket, concurrent: places }] };
  process.send({ ready: true });
  await new Promise((r) => process.once('message', r));
  const call = () => client.withPermit(request, () => new Promise((r) => setTimeout(r, callMs)));
  const started = performance.now();
  if (workers === undefined) {
    await Promise.all(Array.from({ length: calls }, call));
  } else {
    // The floor: each worker calls in turn, and the workers of all processes never outnumber the places.
    let left = calls;
    await Promise.all(Array.from({ length: workers }, async () => {
      while (left-- > 0) await call();
    }));
  }
  process.send({ tookMs: performance.now() - started, sent });
  process.disconnect();
}

async function parent() {
  const { startServer } = await import('../test/server.mjs');
  const [runs, calls, callMs, places, processes] = ['runs', 'calls', 'call-ms', 'places', 'processes'].map((k) => Number(opts[k]));
  const idealMs = (calls * callMs) / places;
  const server = await startServer();
  console.log(`hand-off: ${calls} calls of ${callMs} ms through concurrent: ${places}, from ${processes} processes; ideal ${idealMs} ms`);
  console.log(`client: ${resolve(opts.client)}`);
  const walls = [];
  const floors = [];
  /** One run: the wall time of `calls` calls split between the processes. */
  const measure = async (bucket, floor) => {
    const share = (n, i, of) => Math.floor(n / of) + (i < n % of ? 1 : 0);
    const children = Array.from({ length: processes }, (_, i) => {
      const job = { url: server.url, key: `${bucket}/p${i}`, bucket, calls: share(calls, i, processes), callMs, places };
      if (floor) job.workers = share(places, i, processes);
      const env = { ...process.env, HANDOFF: JSON.stringify(job) };
      return fork(fileURLToPath(import.meta.url), ['--child', '--client', opts.client], { env });
    });
    const message = (c) =>
      new Promise((r, reject) => {
        c.once('message', r);
        c.once('exit', (code) => reject(new Error(`a child exited (${code}) before its answer`)));
      });
    await Promise.all(children.map(message));
    const started = performance.now();
    const answers = children.map(message);
    for (const c of children) c.send('go');
    const done = await Promise.all(answers);
    const wallMs = performance.now() - started;
    await Promise.all(children.map((c) => (c.exitCode === null ? new Promise((r) => c.once('exit', r)) : undefined)));
    const sent = done.reduce((n, d) => ({ acquire: n.acquire + d.sent.acquire, wait: n.wait + d.sent.wait }), { acquire: 0, wait: 0 });
    return { wallMs, done, sent };
  };
  try {
    for (let run = 1; run <= runs; run++) {
      const { wallMs, done, sent } = await measure(`handoff/${process.pid}/${run}`, false);
      walls.push(wallMs);
      const floor = await measure(`handoff/${process.pid}/${run}/floor`, true);
      floors.push(floor.wallMs);
      console.log(
        `run ${run}: ${Math.round(wallMs)} ms (${(wallMs / idealMs).toFixed(2)}× the ideal); ` +
          `per process ${done.map((d) => Math.round(d.tookMs)).join(' / ')} ms; ` +
          `${sent.acquire} acquires and ${sent.wait} waits sent for ${calls} calls; ` +
          `floor ${Math.round(floor.wallMs)} ms (${(floor.wallMs / idealMs).toFixed(2)}×)`,
      );
    }
  } finally {
    await server.stop();
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const [m, f] = [median(walls), median(floors)];
  console.log(
    `median ${Math.round(m)} ms = ${(m / idealMs).toFixed(2)}× the ideal (best ${Math.round(Math.min(...walls))} ms, ` +
      `worst ${Math.round(Math.max(...walls))} ms); floor ${Math.round(f)} ms = ${(f / idealMs).toFixed(2)}×, ` +
      `so waiting costs ${(m / f).toFixed(2)}× the floor`,
  );
}
