/**
 * What `npm pack` ships: everything a user needs (compiled JS with types, the CLI, the install
 * step, the prebuilt addon, the sources a fallback source build compiles, and the documents,
 * pictures and examples the README links to), and nothing that is only for tests or for building
 * the package here.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import t from 'tap';

import { dryRunFiles, root } from './install-helpers.js';

interface Manifest {
  main: string;
  types: string;
  bin: Record<string, string>;
  exports: Record<string, string | { types: string; import: string }>;
  scripts: Record<string, string>;
  files: string[];
}

const manifest = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as Manifest;
const strip = (p: string) => p.replace(/^\.\//, '');

t.test('the pack holds what users need', async (t) => {
  const { files, size } = await dryRunFiles();
  const shipped = new Set(files);
  t.comment(`npm pack --dry-run: ${files.length} files, ${size} bytes packed`);

  const entries = [manifest.main, manifest.types, ...Object.values(manifest.bin)];
  for (const target of Object.values(manifest.exports))
    entries.push(...(typeof target === 'string' ? [target] : [target.types, target.import]));
  t.same(entries.map(strip).filter((entry) => !shipped.has(entry)), [], 'every file package.json names (main, types, bin, exports) is packed');

  const install = /^node (\S+)$/.exec(manifest.scripts.install ?? '');
  t.ok(install, 'the install script is a node script of ours');
  if (install) t.ok(shipped.has(install[1]!), `${install[1]} (the install step) is packed`);
  t.ok(shipped.has('prebuilds/linux-x64/node.napi.glibc.node'), 'the prebuilt addon is packed (npm run build runs npm run prebuild first)');
  t.ok(shipped.has('README.md') && shipped.has('LICENSE'), 'README.md and LICENSE are packed');

  // The fallback source build: binding.gyp, every source it lists, the headers beside those
  // sources and everything under its include directories.
  const gyp = JSON.parse(readFileSync(path.join(root, 'binding.gyp'), 'utf8')) as { targets: { sources: string[]; include_dirs: string[] }[] };
  t.ok(shipped.has('binding.gyp'), 'binding.gyp is packed');
  const needed = new Set<string>();
  const list = (dir: string, recursive: boolean): string[] =>
    readdirSync(path.join(root, dir), { withFileTypes: true }).flatMap((e) =>
      e.isDirectory() ? (recursive ? list(`${dir}/${e.name}`, true) : []) : [`${dir}/${e.name}`],
    );
  for (const target of gyp.targets) {
    for (const source of target.sources) {
      needed.add(source);
      for (const file of list(path.dirname(source), false)) if (/\.(h|hpp)$/.test(file)) needed.add(file);
    }
    for (const dir of target.include_dirs) if (!dir.startsWith('<!')) for (const file of list(dir, true)) needed.add(file);
  }
  t.ok(needed.size > 10, `${needed.size} files for the source build`);
  t.same([...needed].filter((file) => !shipped.has(file)), [], 'every file the source build compiles or includes is packed (add its folder to `files`)');
});

t.test('nothing test-only or build-only is packed', async (t) => {
  const { files } = await dryRunFiles();
  const forbidden: [RegExp, string][] = [
    [/^test\//, 'tests'],
    [/(^|\/)fixtures?\//, 'test fixtures'],
    [/\.test\.[cm]?[jt]s$/, 'test files'],
    [/^native\/(tests|bench|cuda)\//, 'C++ harnesses and CUDA sources (only the full CMake build uses them)'],
    [/^native\/comm\/ucx\/ucx_transport\.cpp$/, 'the UCX plugin source (built by CMake only; the group protocol beside it is part of the addon)'],
    [/^(lib|\.ci|\.github|build)\//, 'sources and build output'],
    // What the README links to is shipped (its page on the registry must not have dead links):
    // the documents, their pictures, the examples and the recorded results; nothing else there.
    [/^bench\/(?!RESULTS\.md$)/, 'benchmark sources'],
    [/^docs\/(?!([^/]+\.md|demo-report\.png|api\/README\.md|schedules\/[^/]+\.(svg|png|json))$)/, 'generated or build-only documentation'],
    [/^examples\/(?![^/]+\.mjs$)/, 'anything in examples/ but the examples'],
    [/^scripts\/(?!install\.js$)/, 'scripts other than the install step'],
    [/^(CMakeLists\.txt|tsconfig.*\.json|typedoc\.json|package-lock\.json|\.gitignore|\.npmignore)$/, 'build configuration'],
    [/\.(map|tsbuildinfo|o|tgz)$/, 'source maps and build leftovers'],
    [/^prebuilds\/.*\.(md|tmp.*)$/, 'notes and half-written files beside the prebuilt binaries'],
  ];
  const offenders = files.flatMap((file) => {
    const hit = forbidden.find(([pattern]) => pattern.test(file));
    return hit ? [`${file}: ${hit[1]}`] : [];
  });
  t.same(offenders, [], 'nothing packed is test-only or build-only');
  t.ok(files.every((f) => !f.startsWith('dist/') || /\.(js|d\.ts)$/.test(f)), 'dist/ ships only JavaScript and declarations');
});

t.test('the prebuilt addon is where node-gyp-build looks and loads in this Node.js', async (t) => {
  const prebuilt = path.join(root, 'prebuilds', 'linux-x64', 'node.napi.glibc.node');
  t.ok(existsSync(prebuilt), 'npm run prebuild has run');
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  // Resolve as an installed package does: without build/Release, only prebuilds/ counts.
  const previous = process.env.PREBUILDS_ONLY;
  const nodeGypBuild = require('node-gyp-build') as { resolve(dir: string): string };
  try {
    process.env.PREBUILDS_ONLY = '1';
    // node-gyp-build reads PREBUILDS_ONLY at load; a fresh copy of the module sees it.
    delete require.cache[require.resolve('node-gyp-build')];
    delete require.cache[require.resolve('node-gyp-build/node-gyp-build.js')];
    const fresh = require('node-gyp-build') as { resolve(dir: string): string };
    t.equal(fresh.resolve(root), prebuilt);
  } finally {
    if (previous === undefined) delete process.env.PREBUILDS_ONLY;
    else process.env.PREBUILDS_ONLY = previous;
  }
  t.ok(nodeGypBuild.resolve(root), 'the default resolution still finds an addon');
  const addon = require(prebuilt) as { info(): { simd: string } };
  t.ok(['baseline', 'avx2', 'avx512'].includes(addon.info().simd), 'the prebuilt binary loads and reports its SIMD level');
});

t.test('every relative link of the packed README, and of the documents it ships, resolves in the pack', async (t) => {
  // The README is the package's page on the registry: a link there to a file the tarball lacks is
  // a dead link for every user. Absolute links (http, mailto) and anchors are not checked here.
  const { files } = await dryRunFiles();
  const shipped = new Set(files);
  const markdown = files.filter((f) => f.endsWith('.md'));
  t.ok(markdown.includes('README.md'), 'the README is packed');
  let links = 0;
  const dead: string[] = [];
  for (const file of markdown) {
    const text = readFileSync(path.join(root, file), 'utf8');
    for (const match of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      const target = match[1]!.split('#')[0]!;
      if (target === '' || /^[a-z]+:/i.test(target)) continue;
      links++;
      const resolved = path.posix.normalize(path.posix.join(path.posix.dirname(file), target));
      if (!shipped.has(resolved)) dead.push(`${file} -> ${target}`);
    }
  }
  t.ok(links > 10, `${links} relative links checked`);
  t.same(dead, [], 'no relative link points outside the pack');
});
