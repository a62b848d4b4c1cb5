import { defineConfig } from 'tsup';

export default defineConfig({
  entry: ['src/index.ts'],
  format: ['esm', 'cjs'],
  dts: true,
  sourcemap: true,
  clean: true,
  // `import.meta.url` in the CommonJS build (src/server.ts resolves the platform's package from it).
  shims: true,
  target: 'node20',
  // Each build loads vern-llm (for the VernLLM adapter's errors) in its own module format.
  esbuildOptions(options, { format }) {
    options.define = { ...options.define, __CJS__: String(format === 'cjs') };
  },
  outExtension: ({ format }) =>
    format === 'cjs' ? { js: '.cjs', dts: '.d.cts' } : { js: '.mjs', dts: '.d.mts' },
});
