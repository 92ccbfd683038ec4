/**
 * What the packaging tests share: packing sapipe (and its runtime dependencies, so that an install
 * needs no network and no npm cache), a fresh project that depends on the tarballs, a PATH with no
 * build tools, and `npm install --offline` into that project.
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, existsSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

export const root = fileURLToPath(new URL('../..', import.meta.url));
const run = promisify(execFile);

export interface PackResult {
  tarball: string;
  size: number;
  unpackedSize: number;
  files: string[];
}

interface NpmPackJson {
  filename: string;
  size: number;
  unpackedSize: number;
  files: { path: string }[];
}

/** The first executable called `tool` on `PATH`, or undefined. */
export function which(tool: string, PATH = process.env.PATH ?? ''): string | undefined {
  for (const dir of PATH.split(path.delimiter)) {
    if (!dir) continue;
    const file = path.join(dir, tool);
    try {
      accessSync(file, constants.X_OK);
      return file;
    } catch {
      // not here
    }
  }
  return undefined;
}

function npmBin(): string {
  // npm normally sits beside node; fall back to the PATH's.
  const beside = path.join(path.dirname(process.execPath), 'npm');
  const npm = existsSync(beside) ? beside : which('npm');
  if (!npm) throw new Error('npm not found beside node or on PATH');
  return npm;
}

export async function npm(args: string[], options: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<{ stdout: string; stderr: string }> {
  return run(npmBin(), args, { cwd: options.cwd, env: options.env ?? process.env, timeout: options.timeoutMs ?? 120_000, maxBuffer: 1 << 24 });
}

/**
 * `npm run prebuild` (the binaries into prebuilds/), then packs sapipe into `dest`. Scripts are
 * skipped for the pack itself: `npm test` has just compiled dist/, and `prepare` would rewrite it
 * under the feet of tests running beside this one.
 */
export async function packSapipe(dest: string): Promise<PackResult> {
  if (!existsSync(path.join(root, 'dist', 'index.js'))) throw new Error('dist/ is not built: run `npm run build` first');
  await npm(['run', 'prebuild'], { cwd: root, timeoutMs: 300_000 });
  const { stdout } = await npm(['pack', '--ignore-scripts', '--json', '--pack-destination', dest], { cwd: root });
  const [result] = JSON.parse(stdout) as NpmPackJson[];
  if (!result) throw new Error(`npm pack printed no result: ${stdout}`);
  return { tarball: path.join(dest, result.filename), size: result.size, unpackedSize: result.unpackedSize, files: result.files.map((f) => f.path) };
}

/** The file list `npm pack --dry-run` reports, without writing anything. */
export async function dryRunFiles(): Promise<PackResult> {
  const { stdout } = await npm(['pack', '--dry-run', '--ignore-scripts', '--json'], { cwd: root });
  const [result] = JSON.parse(stdout) as NpmPackJson[];
  if (!result) throw new Error(`npm pack --dry-run printed no result: ${stdout}`);
  return { tarball: result.filename, size: result.size, unpackedSize: result.unpackedSize, files: result.files.map((f) => f.path) };
}

/**
 * Packs every package sapipe needs at run time, from this repository's node_modules (where
 * `npm install` has just put them), into `dest`. The closure follows Node's resolution from each
 * package, so it is exactly what is installed here; two versions of one package would need a
 * nested install, which a flat project of tarballs cannot express, and are reported.
 */
export async function packRuntimeDependencies(dest: string): Promise<string[]> {
  const found = new Map<string, { dir: string; version: string }>();
  const visit = (name: string, from: string, optional: boolean): void => {
    let dir = from;
    for (;;) {
      const candidate = path.join(dir, 'node_modules', name);
      if (existsSync(path.join(candidate, 'package.json'))) {
        dir = candidate;
        break;
      }
      const up = path.dirname(dir);
      if (up === dir) {
        if (optional) return;
        throw new Error(`runtime dependency ${name} is not installed: run \`npm install\` first`);
      }
      dir = up;
    }
    const manifest = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8')) as {
      version: string;
      dependencies?: Record<string, string>;
      optionalDependencies?: Record<string, string>;
    };
    const seen = found.get(name);
    if (seen) {
      if (seen.version !== manifest.version) throw new Error(`${name} is installed in two versions (${seen.version}, ${manifest.version})`);
      return;
    }
    found.set(name, { dir, version: manifest.version });
    for (const dep of Object.keys(manifest.dependencies ?? {})) visit(dep, dir, false);
    for (const dep of Object.keys(manifest.optionalDependencies ?? {})) visit(dep, dir, true);
  };
  const own = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
  for (const dep of Object.keys(own.dependencies)) visit(dep, root, false);
  const dirs = [...found.values()].map((p) => p.dir);
  const { stdout } = await npm(['pack', '--ignore-scripts', '--json', '--pack-destination', dest, ...dirs], { cwd: dest });
  return (JSON.parse(stdout) as NpmPackJson[]).map((r) => path.join(dest, r.filename));
}

/** A fresh ESM project that depends on each tarball by file, so npm resolves everything offline. */
export async function makeProject(dir: string, tarballs: string[]): Promise<void> {
  mkdirSync(dir, { recursive: true });
  const dependencies: Record<string, string> = {};
  for (const tarball of tarballs) {
    const { stdout } = await run('tar', ['-xOzf', tarball, 'package/package.json'], { maxBuffer: 1 << 22 });
    dependencies[(JSON.parse(stdout) as { name: string }).name] = `file:${tarball}`;
  }
  writeFileSync(path.join(dir, 'package.json'), `${JSON.stringify({ name: 'sapipe-install-check', private: true, type: 'module', dependencies }, null, 2)}\n`);
  // One training step, as a user's script would write it, and which addon file served it.
  writeFileSync(
    path.join(dir, 'train.mjs'),
    `import { createRequire } from 'node:module';
import { ParamSet, SGD } from 'sapipe';

const params = new ParamSet({ 'fc.weight': [2, 2], 'fc.bias': [2] });
params.get('fc.weight').data.set([1, 2, 3, 4]);
params.get('fc.bias').grad.fill(1);
params.get('fc.weight').grad.set([0.5, -0.5, 1, -1]);
const optimizer = new SGD(params, { lr: 0.1 });
const result = optimizer.stepSync();
const addon = createRequire(import.meta.url)('node-gyp-build').resolve('node_modules/sapipe');
console.log(JSON.stringify({
  applied: result.applied,
  weight: Array.from(params.get('fc.weight').data),
  bias: Array.from(params.get('fc.bias').data),
  addon,
}));
`,
  );
}

/** A directory holding only `node`, `npm` and `npx`, to be the whole PATH of an install. */
export function toolFreeBin(dir: string): string {
  mkdirSync(dir, { recursive: true });
  const npmPath = npmBin();
  symlinkSync(process.execPath, path.join(dir, 'node'));
  symlinkSync(npmPath, path.join(dir, 'npm'));
  const npx = path.join(path.dirname(npmPath), 'npx');
  if (existsSync(npx)) symlinkSync(npx, path.join(dir, 'npx'));
  return dir;
}

/**
 * The environment of an install: a private npm cache (so nothing comes from this machine's cache:
 * every package is one of the tarballs) and, since PATH may hold no shell, npm's script shell by
 * absolute path. HOME stays, as a user's npm configuration would.
 */
export function installEnv(PATH: string, cache: string): NodeJS.ProcessEnv {
  return { HOME: process.env.HOME ?? '/root', PATH, npm_config_cache: cache, npm_config_script_shell: '/bin/sh', npm_config_update_notifier: 'false' };
}

export interface TrainOutput {
  applied: boolean;
  weight: number[];
  bias: number[];
  addon: string;
}
