// The server binary from npm: which package carries it for this platform (`serverPackage`), where
// it is (`findServerBinary`: REDB_LIMITER_BIN, else that package), and a local server for a test
// or a laptop (`startServer`: starts it, reads its ready line, stops it with SIGTERM). Node-only
// (child processes and the file system); the client itself needs none of it. The `redb-limiter`
// command of this package (bin/redb-limiter.cjs) runs the binary this module finds. Its public
// types name nothing of Node's, so the package's types still need no @types/node.
/// <reference types="node" />

import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';

/** The environment variable that names a server binary to use instead of the platform's package. */
export const SERVER_BIN_ENV = 'REDB_LIMITER_BIN';

/** A platform as Node names it (`process.platform`, `process.arch`), with the C library on Linux. */
export interface ServerPlatform {
  platform: string;
  arch: string;
  /** Linux only: the C library the system runs on. */
  libc?: 'glibc' | 'musl';
}

/** The platforms a package of the server is published for (`optionalDependencies` of this package). */
export const SERVER_PLATFORMS: readonly ServerPlatform[] = [
  { platform: 'linux', arch: 'x64', libc: 'glibc' },
  { platform: 'linux', arch: 'x64', libc: 'musl' },
  { platform: 'linux', arch: 'arm64', libc: 'glibc' },
  { platform: 'linux', arch: 'arm64', libc: 'musl' },
  { platform: 'darwin', arch: 'x64' },
  { platform: 'darwin', arch: 'arm64' },
  { platform: 'win32', arch: 'x64' },
];

/** The npm package that carries the server for `target`: `@redb-limiter/linux-x64-gnu` and so on. */
export function serverPackage(target: ServerPlatform): string {
  const libc = target.platform === 'linux' ? (target.libc === 'musl' ? '-musl' : '-gnu') : '';
  return `@redb-limiter/${target.platform}-${target.arch}${libc}`;
}

/** The file name of the binary inside its package (`bin/redb-limiter`, `.exe` on Windows). */
export function serverBinaryName(target: ServerPlatform): string {
  return target.platform === 'win32' ? 'redb-limiter.exe' : 'redb-limiter';
}

/**
 * This process's platform; on Linux, musl or glibc as the runtime's own report says (Node names
 * `glibcVersionRuntime` when it runs on glibc), else as `ldd` (a script on glibc) says.
 */
export function currentPlatform(): ServerPlatform {
  const { platform, arch } = process;
  if (platform !== 'linux') return { platform, arch };
  const report = process.report?.getReport?.() as { header?: { glibcVersionRuntime?: string } } | undefined;
  if (report?.header) return { platform, arch, libc: report.header.glibcVersionRuntime ? 'glibc' : 'musl' };
  let ldd = '';
  try {
    ldd = readFileSync('/usr/bin/ldd', 'latin1');
  } catch {
    // No ldd: nothing says musl.
  }
  return { platform, arch, libc: ldd.includes('musl') ? 'musl' : 'glibc' };
}

/** How a platform reads in an error: `linux x64 (glibc)`. */
export function describePlatform(target: ServerPlatform): string {
  return `${target.platform} ${target.arch}${target.libc ? ` (${target.libc})` : ''}`;
}

/** No server binary for this platform: the package to install, or that none is published. */
export class ServerNotFoundError extends Error {
  override name = 'ServerNotFoundError';
  constructor(
    message: string,
    /** The platform detected. */
    readonly platform: ServerPlatform,
    /** The package that would carry it (undefined when none is published for this platform). */
    readonly packageName: string | undefined,
  ) {
    super(message);
  }
}

/** `require` from this module (made at the call, so that importing the client runs nothing). */
const here = () => createRequire(import.meta.url);

/** This package's version (the platform packages are pinned to it). */
function ownVersion(): string {
  return (here()('../package.json') as { version: string }).version;
}

/**
 * The path of the server binary: `$REDB_LIMITER_BIN` when set, else the binary in this platform's
 * package (an optional dependency that npm installs on this platform only). Throws
 * `ServerNotFoundError` naming the package and the platform detected when it is not installed.
 */
export function findServerBinary(target: ServerPlatform = currentPlatform()): string {
  const named = process.env[SERVER_BIN_ENV];
  if (named) {
    if (!existsSync(named)) throw new Error(`${SERVER_BIN_ENV} names ${named}, which does not exist`);
    return named;
  }
  const platform = describePlatform(target);
  const published = SERVER_PLATFORMS.some(
    (p) => p.platform === target.platform && p.arch === target.arch && (p.libc ?? undefined) === target.libc,
  );
  if (!published) {
    throw new ServerNotFoundError(
      `redb-limiter: no package of the server is published for ${platform}. Build it from the repository ` +
        `(cargo build --release) and set ${SERVER_BIN_ENV} to target/release/redb-limiter.`,
      target,
      undefined,
    );
  }
  const name = serverPackage(target);
  let folder: string;
  try {
    folder = dirname(here().resolve(`${name}/package.json`));
  } catch {
    throw new ServerNotFoundError(
      `redb-limiter: the server's package for ${platform}, ${name}, is not installed. It is an optional ` +
        `dependency of redb-limiter that npm installs on ${platform} only; it is left out by ` +
        `--no-optional, --omit=optional or a lockfile made on another platform. Install it: ` +
        `npm install ${name}@${ownVersion()} (or set ${SERVER_BIN_ENV} to a server binary).`,
      target,
      name,
    );
  }
  const binary = join(folder, 'bin', serverBinaryName(target));
  if (!existsSync(binary)) {
    throw new ServerNotFoundError(`redb-limiter: ${name} is installed but holds no ${binary}`, target, name);
  }
  return binary;
}

export interface StartServerOptions {
  /** The redb file; by default one in a new temporary folder, removed by `stop()`. */
  path?: string;
  /** The address to listen on; `127.0.0.1:0` (a free port, the default) names it in `url`. */
  listen?: string;
  /** The binary; by default `findServerBinary()`. */
  binary?: string;
  /** More arguments of `serve` (`['--recheck-ms', '100']`). */
  args?: readonly string[];
  /** The server's whole environment; by default this process's. */
  env?: Record<string, string | undefined>;
  /** Where the server's log (stderr) goes: `inherit` (the default) or `ignore`. */
  stderr?: 'inherit' | 'ignore';
  /** How long to wait for the ready line (default 30 s). */
  readyTimeoutMs?: number;
}

/** A running server started by `startServer`. */
export interface LocalServer {
  /** Its base URL, from its ready line (`http://127.0.0.1:PORT`). */
  readonly url: string;
  /** Its redb file (undefined in PostgreSQL mode). */
  readonly path: string | undefined;
  readonly pid: number;
  /**
   * Sends SIGTERM (the server drains, commits and closes its file), waits for the exit, removes
   * the temporary folder if it made one, and resolves to the exit code (0 after a clean drain).
   * Calling it again resolves to the same code.
   */
  stop(): Promise<number | null>;
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * Starts `redb-limiter serve` and resolves once it prints its ready line (the file is open and
 * the socket listens). Rejects when the server exits before it, or after `readyTimeoutMs`.
 */
/** How long `stop()` waits after SIGTERM before it kills the server (it drains within 10 s). */
const STOP_KILL_AFTER_MS = 15_000;

export async function startServer(options: StartServerOptions = {}): Promise<LocalServer> {
  const binary = options.binary ?? findServerBinary();
  const scratch = options.path === undefined ? mkdtempSync(join(tmpdir(), 'redb-limiter-')) : undefined;
  const path = options.path ?? join(scratch as string, 'limiter.redb');
  const args = ['serve', '--path', path, '--listen', options.listen ?? '127.0.0.1:0', ...(options.args ?? [])];
  const child = spawn(binary, args, {
    env: options.env ?? process.env,
    stdio: ['ignore', 'pipe', options.stderr ?? 'inherit'],
  });
  const exited = new Promise<number | null>((resolve) => {
    child.once('exit', (code) => resolve(code));
    child.once('error', () => resolve(null));
  });
  const cleanup = () => {
    if (scratch !== undefined) rmSync(scratch, { recursive: true, force: true });
  };
  const lines = createInterface({ input: child.stdout });
  let ready: { ready?: unknown; url?: unknown; path?: unknown };
  try {
    ready = await new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`redb-limiter printed no ready line within ${options.readyTimeoutMs ?? 30_000} ms`)),
        options.readyTimeoutMs ?? 30_000,
      );
      child.once('error', (e) => {
        clearTimeout(timer);
        reject(new Error(`cannot run ${binary}: ${e.message}`));
      });
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`redb-limiter exited (${signal ?? code}) before its ready line`));
      });
      lines.once('line', (line) => {
        clearTimeout(timer);
        try {
          resolve(JSON.parse(line));
        } catch {
          reject(new Error(`redb-limiter printed ${JSON.stringify(line)} instead of its ready line`));
        }
      });
    });
    if (ready.ready !== true || typeof ready.url !== 'string') {
      throw new Error(`redb-limiter printed an unexpected ready line ${JSON.stringify(ready)}`);
    }
  } catch (e) {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await exited;
    cleanup();
    throw e;
  }
  // Anything the server prints after its ready line is read and dropped, so its pipe never fills.
  lines.on('line', () => {});
  // A process that exits without stopping it (process.exit, an uncaught error) still takes its
  // server down with it: SIGTERM drains and closes the file.
  const orphaned = () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  };
  process.once('exit', orphaned);
  let stopped: Promise<number | null> | undefined;
  const stop = () => {
    stopped ??= (async () => {
      process.removeListener('exit', orphaned);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
      // The server exits within 10 s of SIGTERM; one that does not is killed.
      const killer = setTimeout(() => child.kill('SIGKILL'), STOP_KILL_AFTER_MS);
      const code = await exited;
      clearTimeout(killer);
      cleanup();
      return code;
    })();
    return stopped;
  };
  return {
    url: ready.url,
    path: typeof ready.path === 'string' ? ready.path : undefined,
    pid: child.pid as number,
    stop,
    async [Symbol.asyncDispose]() {
      await stop();
    },
  };
}
