// `npm run pack:server`: the npm packages that carry the server. Writes to packs/:
// - redb-limiter-VERSION.tgz: this package, whose package.json gains `optionalDependencies` on
//   every platform's package (SERVER_PLATFORMS in src/server.ts), pinned to VERSION;
// - redb-limiter-PLATFORM-VERSION.tgz: @redb-limiter/PLATFORM (`os`, `cpu`, on Linux `libc`),
//   holding only bin/redb-limiter (bin/redb-limiter.exe on Windows).
//
// The binary: `--binary PATH` (one built already), else packaging/build-server.sh builds it for
// this machine (static on Linux with glibc). The platform: this machine's, or `--platform NAME`
// for a binary built for another (`linux-arm64-gnu`, `darwin-arm64`, ...). Each platform's package
// is packed where its binary is built; `--manifests` also writes every platform's package folder
// (package.json and README, no binary) under packs/stage/ to review them.
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const repo = resolve(root, '..', '..');
const { values: opts } = parseArgs({
  options: {
    binary: { type: 'string' },
    platform: { type: 'string' },
    manifests: { type: 'boolean', default: false },
  },
});

const run = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, stdio: ['ignore', 'pipe', 'inherit'], encoding: 'utf8' });

// The client's build: the platform table and the package's own `redb-limiter` command use it.
run('npm', ['run', '--silent', 'build'], root);
const { SERVER_PLATFORMS, currentPlatform, serverBinaryName, serverPackage } = await import(join(root, 'dist', 'index.mjs'));
const main = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const { version } = main;
const packs = join(root, 'packs');
const stage = join(packs, 'stage');
rmSync(packs, { recursive: true, force: true });
mkdirSync(stage, { recursive: true });

const nameOf = (platform) => serverPackage(platform).replace('@redb-limiter/', '');
const platform = opts.platform
  ? SERVER_PLATFORMS.find((p) => nameOf(p) === opts.platform)
  : currentPlatform();
if (!platform) {
  throw new Error(`--platform ${opts.platform}: not one of ${SERVER_PLATFORMS.map(nameOf).join(', ')}`);
}
if (!SERVER_PLATFORMS.some((p) => serverPackage(p) === serverPackage(platform))) {
  throw new Error(`this machine (${serverPackage(platform)}) is not a platform redb-limiter publishes a package for`);
}

/** Writes @redb-limiter/NAME's folder under packs/stage/, with its binary when one is given. */
function stagePlatform(target, binary) {
  const name = serverPackage(target);
  const folder = join(stage, name);
  const os = { darwin: 'macOS', linux: 'Linux', win32: 'Windows' }[target.platform] ?? target.platform;
  const which = `${os} ${target.arch}${target.libc ? ` (${target.libc})` : ''}`;
  mkdirSync(join(folder, 'bin'), { recursive: true });
  const manifest = {
    name,
    version,
    description: `The redb-limiter server binary for ${which}. Installed by the redb-limiter package; not used on its own.`,
    license: main.license,
    os: [target.platform],
    cpu: [target.arch],
    ...(target.libc ? { libc: [target.libc] } : {}),
    files: ['bin'],
    preferUnplugged: true,
  };
  writeFileSync(join(folder, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  writeFileSync(
    join(folder, 'README.md'),
    `# ${name}\n\nThe \`redb-limiter\` server for ${which}, as one binary. Install \`redb-limiter\` instead: it\n` +
      `depends on this package on ${which} only, and its \`redb-limiter\` command and \`findServerBinary()\`\nrun this binary.\n`,
  );
  if (binary !== undefined) {
    const into = join(folder, 'bin', serverBinaryName(target));
    copyFileSync(binary, into);
    chmodSync(into, 0o755);
  }
  return folder;
}

if (opts.manifests) for (const p of SERVER_PLATFORMS) stagePlatform(p);

const binary = opts.binary
  ? resolve(opts.binary)
  : run('bash', [join(repo, 'packaging', 'build-server.sh')], repo).trim();
if (!existsSync(binary)) throw new Error(`no server binary at ${binary}`);
const folder = stagePlatform(platform, binary);
run('npm', ['pack', '--silent', '--pack-destination', packs], folder);

// This package as published: its package.json with the platform packages, pinned to this version.
const staged = join(stage, 'redb-limiter');
for (const entry of main.files) cpSync(join(root, entry), join(staged, entry), { recursive: true });
const published = { ...main, optionalDependencies: Object.fromEntries(SERVER_PLATFORMS.map((p) => [serverPackage(p), version])) };
delete published.scripts;
delete published.devDependencies;
writeFileSync(join(staged, 'package.json'), `${JSON.stringify(published, null, 2)}\n`);
run('npm', ['pack', '--silent', '--pack-destination', packs], staged);

for (const tgz of [`redb-limiter-${version}.tgz`, `redb-limiter-${nameOf(platform)}-${version}.tgz`]) {
  if (!existsSync(join(packs, tgz))) throw new Error(`npm pack wrote no ${tgz}`);
  console.log(join(packs, tgz));
}
