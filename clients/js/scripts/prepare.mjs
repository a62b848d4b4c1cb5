// npm's `prepare`: builds dist/ where the build tools are installed (`npm ci` in this folder).
// Installed from another project without them, it keeps a dist/ already built, or says what to run.
import { execSync } from 'node:child_process';
import { existsSync } from 'node:fs';

if (existsSync('node_modules/.bin/tsup')) {
  execSync('npm run build', { stdio: 'inherit' });
} else if (!existsSync('dist/index.mjs')) {
  console.error('redb-limiter: dist/ is not built yet: run `npm ci` in clients/js first (it builds the package), then install it again');
  process.exit(1);
}
