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
//   node bench/handoff.mjs --client <a.mjs> --client <b.mjs>   # side by side, runs interleaved
//   node bench/handoff.mjs --runs 3 --calls 200 --call-ms 10 --places 4 --processes 2
//
// Where the time goes, per run (every request is timed by a `fetch` of the bench's own, so any
// build of the client can be measured): the hand-off gap, from each release's answer to the next
// grant's answer in any process that no earlier release claimed (median and 90th percentile),
// how many acquires and waits each call took, and the CPU time of the server and the clients per
// call (on a shared machine the wall time follows it).
//
// With `--own-transport` the clients send through their own default transport instead of the
// bench's timing `fetch` (so a change of transport shows; the counts and gaps are then not read).
//
// The server: $REDB_LIMITER_BIN, else the repository's release build (see test/server.mjs).
import { fork } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

const here = dirname(fileURLToPath(import.meta.url));
const { values: opts } = parseArgs({
  options: {
    client: { type: 'string', multiple: true, default: [join(here, '..', 'dist', 'index.mjs')] },
    runs: { type: 'string', default: '5' },
    calls: { type: 'string', default: '200' },
    'call-ms': { type: 'string', default: '10' },
    places: { type: 'string', default: '4' },
    processes: { type: 'string', default: '2' },
    child: { type: 'boolean', default: false },
    'own-transport': { type: 'boolean', default: false },
  },
});

if (opts.child) await child();
else await parent();

/** One process: its share of the calls, all waiting at once, each holding a place for CALL_MS. */
async function child() {
  const { LimiterClient } = await import(pathToFileURL(resolve(opts.client[0])).href);
  const { url, key, bucket, calls, callMs, places, workers } = JSON.parse(process.env.HANDOFF);
  const sent = { acquire: 0, wait: 0, release: 0 };
  // Answers, on a clock all processes share: grants and releases (for the gaps).
  const events = { grants: [], releases: [] };
  const clock = () => performance.timeOrigin + performance.now();
  const counting = async (input, init) => {
    const path = new URL(String(input)).pathname.slice(1);
    if (path in sent) sent[path] += 1;
    const res = await fetch(input, init);
    if (path === 'acquire' || path === 'release') {
      const text = await res.text();
      const at = clock();
      if (res.ok && path === 'release') events.releases.push(at);
      if (res.ok && path === 'acquire' && JSON.parse(text).granted === true) events.grants.push(at);
      return new Response(text, { status: res.status, statusText: res.statusText, headers: res.headers });
    }
    return res;
  };
  const client = new LimiterClient(opts['own-transport'] ? { url } : { url, fetch: counting });
  // Opens the connection first, so that the run measures hand-offs, not the first connect.
  await client.health();
  const request = { key, limits: [{ key: bucket, concurrent: places }] };
  process.send({ ready: true });
  await new Promise((r) => process.once('message', r));
  const call = () => client.withPermit(request, () => new Promise((r) => setTimeout(r, callMs)));
  const started = performance.now();
  const cpu = process.cpuUsage();
  if (workers === undefined) {
    await Promise.all(Array.from({ length: calls }, call));
  } else {
    // The floor: each worker calls in turn, and the workers of all processes never outnumber the places.
    let left = calls;
    await Promise.all(Array.from({ length: workers }, async () => {
      while (left-- > 0) await call();
    }));
  }
  const { user, system } = process.cpuUsage(cpu);
  process.send({ tookMs: performance.now() - started, cpuMs: (user + system) / 1000, sent, events });
  process.disconnect();
}

async function parent() {
  const { startServer } = await import('../test/server.mjs');
  const [runs, calls, callMs, places, processes] = ['runs', 'calls', 'call-ms', 'places', 'processes'].map((k) => Number(opts[k]));
  const idealMs = (calls * callMs) / places;
  const server = await startServer();
  // The server's CPU time so far (utime + stime in /proc, Linux), in ms; 0 elsewhere.
  const serverCpuMs = () => {
    try {
      const fields = readFileSync(`/proc/${server.pid}/stat`, 'utf8').split(') ')[1].split(' ');
      return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
    } catch {
      return 0;
    }
  };
  const clients = opts.client.map((c) => resolve(c));
  console.log(`hand-off: ${calls} calls of ${callMs} ms through concurrent: ${places}, from ${processes} processes; ideal ${idealMs} ms`);
  clients.forEach((c, i) => console.log(`client ${i + 1}: ${c}`));
  /** One run: the wall time of `calls` calls split between the processes. */
  const measure = async (client, bucket, floor) => {
    const share = (n, i, of) => Math.floor(n / of) + (i < n % of ? 1 : 0);
    const children = Array.from({ length: processes }, (_, i) => {
      const job = { url: server.url, key: `${bucket}/p${i}`, bucket, calls: share(calls, i, processes), callMs, places };
      if (floor) job.workers = share(places, i, processes);
      const env = { ...process.env, HANDOFF: JSON.stringify(job) };
      const own = opts['own-transport'] ? ['--own-transport'] : [];
      return fork(fileURLToPath(import.meta.url), ['--child', '--client', client, ...own], { env });
    });
    const message = (c) =>
      new Promise((r, reject) => {
        c.once('message', r);
        c.once('exit', (code) => reject(new Error(`a child exited (${code}) before its answer`)));
      });
    await Promise.all(children.map(message));
    const serverCpu = serverCpuMs();
    const started = performance.now();
    const answers = children.map(message);
    for (const c of children) c.send('go');
    const done = await Promise.all(answers);
    const wallMs = performance.now() - started;
    const serverMs = serverCpuMs() - serverCpu;
    const cpuMs = serverMs + done.reduce((n, d) => n + d.cpuMs, 0);
    await Promise.all(children.map((c) => (c.exitCode === null ? new Promise((r) => c.once('exit', r)) : undefined)));
    const sent = done.reduce((n, d) => ({ acquire: n.acquire + d.sent.acquire, wait: n.wait + d.sent.wait }), { acquire: 0, wait: 0 });
    const gaps = handoffGaps(done.flatMap((d) => d.events.grants), done.flatMap((d) => d.events.releases));
    return { wallMs, done, sent, gaps, cpuMs, serverMs };
  };
  const results = clients.map(() => ({ walls: [], floors: [], gaps50: [], gaps90: [], cpus: [], floorCpus: [] }));
  try {
    for (let run = 1; run <= runs; run++) {
      // Side by side: each run measures every client, in turn, on the same server.
      for (const [i, client] of clients.entries()) {
        const bucket = `handoff/${process.pid}/${run}/${i}`;
        const { wallMs, done, sent, gaps, cpuMs, serverMs } = await measure(client, bucket, false);
        const floor = await measure(client, `${bucket}/floor`, true);
        const r = results[i];
        r.walls.push(wallMs);
        r.floors.push(floor.wallMs);
        r.gaps50.push(quantile(gaps, 0.5));
        r.gaps90.push(quantile(gaps, 0.9));
        r.cpus.push(cpuMs / calls);
        r.floorCpus.push(floor.cpuMs / calls);
        console.log(
          `run ${run}, client ${i + 1}: ${Math.round(wallMs)} ms (${(wallMs / idealMs).toFixed(2)}× the ideal); ` +
            `per process ${done.map((d) => Math.round(d.tookMs)).join(' / ')} ms; ` +
            `${(sent.acquire / calls).toFixed(2)} acquires and ${(sent.wait / calls).toFixed(2)} waits per call; ` +
            `release-to-grant p50 ${quantile(gaps, 0.5).toFixed(1)} ms, p90 ${quantile(gaps, 0.9).toFixed(1)} ms; ` +
            `CPU ${(cpuMs / calls).toFixed(2)} ms per call (server ${(serverMs / calls).toFixed(2)}, clients the rest); ` +
            `floor ${Math.round(floor.wallMs)} ms (${(floor.wallMs / idealMs).toFixed(2)}×, gap p50 ${quantile(floor.gaps, 0.5).toFixed(1)} ms, ` +
            `CPU ${(floor.cpuMs / calls).toFixed(2)} ms per call)`,
        );
      }
    }
  } finally {
    await server.stop();
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  for (const [i, r] of results.entries()) {
    const [m, f] = [median(r.walls), median(r.floors)];
    console.log(
      `client ${i + 1}: median ${Math.round(m)} ms = ${(m / idealMs).toFixed(2)}× the ideal (best ${Math.round(Math.min(...r.walls))} ms, ` +
        `worst ${Math.round(Math.max(...r.walls))} ms); release-to-grant p50 ${median(r.gaps50).toFixed(1)} ms, p90 ${median(r.gaps90).toFixed(1)} ms; ` +
        `CPU ${median(r.cpus).toFixed(2)} ms per call (floor ${median(r.floorCpus).toFixed(2)}); ` +
        `floor ${Math.round(f)} ms = ${(f / idealMs).toFixed(2)}×, so waiting costs ${(m / f).toFixed(2)}× the floor`,
    );
  }
}

/**
 * For each release's answer, the time to the first grant's answer at or after it (less 1 ms) that
 * no earlier release claimed (one grant per freed place), in ms, sorted.
 */
function handoffGaps(grants, releases) {
  const g = [...grants].sort((a, b) => a - b);
  const gaps = [];
  let next = 0;
  for (const release of [...releases].sort((a, b) => a - b)) {
    // Another process's grant can be answered a moment before this release's answer arrives.
    while (next < g.length && g[next] < release - 1) next++;
    if (next < g.length) gaps.push(Math.max(0, g[next++] - release));
  }
  return gaps.sort((a, b) => a - b);
}

function quantile(sorted, q) {
  return sorted.length === 0 ? NaN : sorted[Math.round((sorted.length - 1) * q)];
}
