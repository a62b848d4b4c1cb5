// The README's examples run as written: every ```js block, as its own ES module in this package,
// against a server of its own (and, for VernLLM, the test's OpenAI-compatible provider).
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { binary, startServer } from './server.mjs';
import { startFakeProvider } from './vern-fake.mjs';

const packageDir = join(dirname(fileURLToPath(import.meta.url)), '..');
const readme = readFileSync(join(packageDir, 'README.md'), 'utf8');
const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);

let server;
let provider;
before(async () => {
  server = await startServer();
  provider = await startFakeProvider(() => 42);
});
after(async () => {
  await provider?.close();
  await server?.stop();
});

test('the README has examples', () => assert.ok(blocks.length >= 5, `${blocks.length} js blocks`));

for (const [i, code] of blocks.entries()) {
  const title = code.split('\n').find((l) => l.includes('redb-limiter')) ?? '';
  test(`README example ${i + 1} runs as written ${title.trim()}`, async () => {
    const env = {
      ...process.env,
      REDB_LIMITER_URL: server.url,
      // The example that starts a server of its own finds the binary through it.
      REDB_LIMITER_BIN: binary(),
      OPENAI_BASE_URL: provider.url.replace(/\/chat\/completions$/, ''),
      OPENAI_API_KEY: 'test-key',
    };
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', code], { cwd: packageDir, env, timeout: 30_000 });
    assert.ok(stdout.trim().length > 0, 'it printed what it shows');
  });
}
