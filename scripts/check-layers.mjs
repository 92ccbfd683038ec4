#!/usr/bin/env node
// The layering rule of docs/DESIGN.md, checked: lib -> addon -> core -> backends, with
//  - a backend (native/cpu, native/cuda, native/comm) including only its own files, native/core
//    and native/include (the C ABI), never another backend;
//  - native/core including only itself and native/include;
//  - no import cycle among the TypeScript modules of lib/;
//  - the library is the library: lib/ imports nothing outside lib/, and the applications in apps/
//    (CLI, demos, benchmarks, experiment models) reach the library only through its package name
//    ('sapipe', or a subpath the package exports), never a relative path into lib/.
// Prints every violation and exits 1 if there is one; `--json` prints them as JSON.
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const walk = (dir, keep) =>
  readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    return e.isDirectory() ? walk(path, keep) : keep(path) ? [path] : [];
  });

const BACKENDS = ['cpu', 'cuda', 'comm'];
// What each native component may include. native/addon (the Node-API bindings) sits above core: it
// reaches the kernels through native/include (the C ABI) and core (host_kernels.h), and the
// communicators through native/comm's protocols; never native/cpu or native/cuda directly (the
// CUDA plugin is a separate library the addon opens through the C ABI). Only native/addon may
// include Node-API headers: everything below it builds and is checked without Node.
const allowed = {
  cpu: ['cpu', 'core', 'include'],
  cuda: ['cuda', 'core', 'include'],
  comm: ['comm', 'core', 'include'],
  core: ['core', 'include'],
  addon: ['addon', 'core', 'include', 'comm'],
};
const NODE_API_HEADERS = /^(napi|napi-inl|node_api|node_api_types|js_native_api|node|uv)\.h$/;
const nativeDir = join(root, 'native');
// A file's component is its first folder under native/: native/core/device/x.h is core, native/addon/device/y.cpp the addon.
const componentOf = (file) => relative(nativeDir, file).split(sep)[0];

/** Where `#include "x"` in `file` lands: beside the file, else under native/ or native/include/. */
function resolveInclude(file, name) {
  for (const base of [dirname(file), nativeDir, join(nativeDir, 'include')]) {
    const candidate = join(base, name);
    if (existsSync(candidate)) return candidate;
  }
  return undefined;
}

export function nativeViolations() {
  const out = [];
  for (const file of walk(nativeDir, (p) => /\.(h|hpp|c|cc|cpp|cu|cuh|inc)$/.test(p))) {
    const from = componentOf(file);
    readFileSync(file, 'utf8')
      .split('\n')
      .forEach((line, i) => {
        const node = /^\s*#\s*include\s+[<"]([^>"]+)[>"]/.exec(line);
        if (node && from !== 'addon' && NODE_API_HEADERS.test(node[1]))
          out.push(`${relative(root, file)}:${i + 1} includes ${node[1]}: only native/addon may use Node-API`);
        if (!(from in allowed)) return;
        const m = /^\s*#\s*include\s+"([^"]+)"/.exec(line);
        if (!m) return;
        const target = resolveInclude(file, m[1]);
        if (!target) return;
        const to = componentOf(target);
        if (!allowed[from].includes(to))
          out.push(`${relative(root, file)}:${i + 1} includes ${relative(root, target)}: native/${from} may include only ${allowed[from].map((c) => `native/${c}`).join(', ')}`);
      });
  }
  return out;
}

export function libCycles() {
  const libDir = join(root, 'lib');
  const files = walk(libDir, (p) => p.endsWith('.ts') && !p.endsWith('.d.ts'));
  const edges = new Map(files.map((f) => [f, []]));
  for (const file of files) {
    const text = readFileSync(file, 'utf8');
    for (const m of text.matchAll(/^\s*(?:import|export)\s[^;]*?from\s+'(\.{1,2}\/[^']+)'/gms)) {
      const target = resolve(dirname(file), m[1].replace(/\.js$/, '.ts'));
      if (edges.has(target)) edges.get(file).push(target);
    }
  }
  // Tarjan's strongly connected components: every component of more than one module is a cycle.
  let index = 0;
  const stack = [];
  const info = new Map();
  const cycles = [];
  const visit = (v) => {
    info.set(v, { index, low: index, on: true });
    index++;
    stack.push(v);
    for (const w of edges.get(v)) {
      if (!info.has(w)) {
        visit(w);
        info.get(v).low = Math.min(info.get(v).low, info.get(w).low);
      } else if (info.get(w).on) info.get(v).low = Math.min(info.get(v).low, info.get(w).index);
    }
    if (info.get(v).low === info.get(v).index) {
      const component = [];
      let w;
      do {
        w = stack.pop();
        info.get(w).on = false;
        component.push(relative(root, w));
      } while (w !== v);
      if (component.length > 1) cycles.push(component.sort());
    }
  };
  for (const f of files) if (!info.has(f)) visit(f);
  return cycles.map((c) => `import cycle among ${c.join(', ')}`);
}

/** Every import specifier of a TypeScript file (static, re-export and dynamic), with its line. */
function importsOf(file) {
  const text = readFileSync(file, 'utf8');
  const lineAt = (offset) => text.slice(0, offset).split('\n').length;
  const found = [];
  for (const m of text.matchAll(/^\s*(?:import|export)\s[^;]*?from\s+'([^']+)'/gms)) found.push({ spec: m[1], line: lineAt(m.index + m[0].indexOf(`'${m[1]}'`)) });
  for (const m of text.matchAll(/\bimport\(\s*'([^']+)'\s*\)/g)) found.push({ spec: m[1], line: lineAt(m.index) });
  return found;
}

export function boundaryViolations() {
  const out = [];
  const libDir = join(root, 'lib');
  const appsDir = join(root, 'apps');
  const inside = (dir, path) => path === dir || path.startsWith(dir + sep);
  const ts = (dir) => (existsSync(dir) ? walk(dir, (p) => p.endsWith('.ts') && !p.endsWith('.d.ts')) : []);
  for (const file of ts(libDir))
    for (const { spec, line } of importsOf(file))
      if (spec.startsWith('.') && !inside(libDir, resolve(dirname(file), spec)))
        out.push(`${relative(root, file)}:${line} imports ${spec}: lib/ is the library and imports nothing outside it`);
  let exported = [];
  try {
    exported = Object.keys(JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).exports ?? {});
  } catch {
    // no package.json (the checker's own test tree): only relative imports are checked
  }
  for (const file of ts(appsDir))
    for (const { spec, line } of importsOf(file)) {
      if (spec.startsWith('.') && !inside(appsDir, resolve(dirname(file), spec)))
        out.push(`${relative(root, file)}:${line} imports ${spec}: apps/ reach the library through its public API only ('sapipe' or an exported subpath)`);
      else if ((spec === 'sapipe' || spec.startsWith('sapipe/')) && !exported.includes(spec === 'sapipe' ? '.' : `.${spec.slice('sapipe'.length)}`))
        out.push(`${relative(root, file)}:${line} imports ${spec}: not a subpath the package exports (package.json "exports")`);
    }
  return out;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const violations = [...nativeViolations(), ...libCycles(), ...boundaryViolations()];
  if (process.argv.includes('--json')) console.log(JSON.stringify(violations));
  else for (const v of violations) console.log(v);
  if (!process.argv.includes('--json')) console.log(violations.length === 0 ? 'layers: no violation' : `layers: ${violations.length} violation(s)`);
  process.exit(violations.length === 0 ? 0 : 1);
}
