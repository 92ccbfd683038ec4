/**
 * The API reference builds from the TypeScript (TypeDoc, as `npm run docs` runs it, into a
 * temporary folder) and covers the public entry points; the guide's relative links resolve.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import t from 'tap';

import { root } from './install-helpers.js';

const run = promisify(execFile);

t.test('typedoc builds the reference with no errors, covering the public API', async (t) => {
  const out = mkdtempSync(path.join(tmpdir(), 'sapipe-docs-'));
  t.teardown(() => rmSync(out, { recursive: true, force: true }));
  const typedoc = path.join(root, 'node_modules', 'typedoc', 'bin', 'typedoc');
  const { stdout, stderr } = await run(process.execPath, [typedoc, '--out', out], { cwd: root, timeout: 180_000, maxBuffer: 1 << 24 });
  const log = `${stdout}${stderr}`.replace(/\x1b\[[0-9;]*m/g, '');
  t.notMatch(log, /\[error\]/, 'no errors');
  const warnings = log.split('\n').filter((line) => line.includes('[warning]'));
  if (warnings.length > 0) t.comment(`typedoc warnings:\n${warnings.join('\n')}`);
  for (const page of [
    'index.html',
    'modules/index.html',
    'modules/backends.html',
    'classes/index.ParamSet.html',
    'classes/index.SGD.html',
    'classes/index.BackendUnavailableError.html',
    'functions/backends.selectBackend.html',
    'functions/backends.selectCommBackend.html',
  ])
    t.ok(existsSync(path.join(out, page)), `${page} is generated`);
  const select = readFileSync(path.join(out, 'functions', 'backends.selectBackend.html'), 'utf8');
  t.match(select, /picks CUDA when its plugin/, 'doc comments are carried into the pages');
});

t.test("the guide's relative links point at files that exist", async (t) => {
  const guide = readFileSync(path.join(root, 'docs', 'guide.md'), 'utf8');
  const links = [...guide.matchAll(/\]\(([^)#\s]+)(#[^)]*)?\)/g)].map((m) => m[1]!).filter((link) => !/^[a-z]+:/.test(link));
  t.ok(links.length >= 3, `${links.length} relative links`);
  for (const link of links) t.ok(existsSync(path.join(root, 'docs', link)), `docs/${link} exists`);
});

t.test('every export of the public API is filed under an area of the reference', async (t) => {
  // The reference groups the API by area (tensors, optimizers, communication, ...) through
  // @category tags (typedoc.json's categoryOrder); an export without one would land in the default
  // area unnoticed. (The CLI, benchmarks, demos and experiment models live in apps/: not API.)
  const { readdirSync } = await import('node:fs');
  const files: string[] = [];
  const walk = (dir: string): void => {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      const file = path.join(dir, entry.name);
      if (entry.isDirectory()) {
        walk(file);
      } else if (file.endsWith('.ts')) files.push(file);
    }
  };
  walk(path.join(root, 'lib'));
  const missing: string[] = [];
  for (const file of files) {
    const text = readFileSync(file, 'utf8');
    const seen = new Set<string>();
    for (const m of text.matchAll(/(?:\/\*\*((?:(?!\*\/)[\s\S])*)\*\/\s*)?\nexport (?:declare )?(?:abstract )?(?:async )?(?:class|function|interface|type|const|enum) (\w+)/g)) {
      if (seen.has(m[2]!)) continue; // overloads: the first carries the doc
      seen.add(m[2]!);
      if (!m[1]?.includes('@category') && !m[1]?.includes('@internal')) missing.push(`${path.relative(root, file)}: ${m[2]}`);
    }
  }
  t.same(missing, [], 'every exported declaration has a @category (or is marked @internal)');
});
