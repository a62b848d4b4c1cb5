#!/usr/bin/env node
// The `redb-limiter` command of this package: runs the server binary that findServerBinary()
// finds ($REDB_LIMITER_BIN, else this platform's package @redb-limiter/<platform>-<arch>[-gnu|-musl])
// with the same arguments. The server runs as a child so that this process can forward the
// signals it receives (SIGTERM still drains the server and exits 0), stop it when this process
// is orphaned, and pass its exit on.
'use strict';
const { spawn } = require('node:child_process');
const { findServerBinary } = require('../dist/index.cjs');

let binary;
try {
  binary = findServerBinary();
} catch (e) {
  console.error(e.message);
  process.exit(1);
}

const child = spawn(binary, process.argv.slice(2), { stdio: 'inherit' });
const forwarded = ['SIGTERM', 'SIGINT', 'SIGHUP', 'SIGQUIT'];
for (const signal of forwarded) {
  try {
    process.on(signal, () => child.kill(signal));
  } catch {
    // A signal this platform does not have (Windows).
  }
}
// Run through `npx`, this process is the child of npm's `sh -c`; a shell that is not bash (dash
// on Debian and Ubuntu) dies of the SIGTERM npm forwards to it without passing it on. Once our
// parent is gone, stop the server as that signal would have (it drains, then we exit with it).
const parent = process.ppid;
const watch = setInterval(() => {
  if (process.ppid === parent) return;
  clearInterval(watch);
  child.kill('SIGTERM');
}, 250).unref();
child.on('error', (e) => {
  console.error(`redb-limiter: cannot run ${binary}: ${e.message}`);
  process.exit(1);
});
child.on('exit', (code, signal) => {
  if (signal === null) process.exit(code ?? 1);
  // Killed by a signal: die of the same one, so that our parent sees what the server's would.
  for (const s of forwarded) process.removeAllListeners(s);
  process.kill(process.pid, signal);
});
