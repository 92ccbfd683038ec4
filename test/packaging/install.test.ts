/**
 * The package as users get it: `npm run prebuild`, `npm pack`, then `npm install --offline` of the
 * tarball into a fresh project,
 *   1. with no build tools on PATH (only node, npm, npx): the prebuilt addon must serve a training
 *      step and `npx sapipe info`, and nothing may be compiled;
 *   2. with the prebuilt addon replaced by a corrupt file: the install must say so, build the addon
 *      from source (the compiler is on PATH here) and the training step must run on that build.
 * One file, run in order, because both scenarios pack from the same prebuilds/ folder.
 */
import { execFile } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t, { type Test } from 'tap';

import {
  installEnv,
  makeProject,
  npm,
  packRuntimeDependencies,
  packSapipe,
  toolFreeBin,
  which,
  type PackResult,
  type TrainOutput,
} from './install-helpers.js';
import { referenceUserLoop } from '../reference/user-loop.js';

const run = promisify(execFile);
const work = mkdtempSync(path.join(tmpdir(), 'sapipe-install-'));
t.teardown(() => rmSync(work, { recursive: true, force: true }));

const EXPECTED_WEIGHT = [1 - 0.05, 2 + 0.05, 3 - 0.1, 4 + 0.1];
const EXPECTED_BIAS = [-0.1, -0.1];

let packed: PackResult;
let dependencies: string[];
/** The project of the offline install, once it has installed (for the user-loop test after it). */
let installedProject: { dir: string; env: NodeJS.ProcessEnv } | undefined;

t.before(async () => {
  mkdirSync(path.join(work, 'pkgs'));
  packed = await packSapipe(path.join(work, 'pkgs'));
  dependencies = await packRuntimeDependencies(path.join(work, 'pkgs'));
});

async function train(project: string, env: NodeJS.ProcessEnv): Promise<TrainOutput> {
  const { stdout } = await run(process.execPath, ['train.mjs'], { cwd: project, env, timeout: 60_000 });
  return JSON.parse(stdout) as TrainOutput;
}

function checkStep(t: Test, out: TrainOutput): void {
  t.equal(out.applied, true, 'the step was applied');
  for (const [i, w] of EXPECTED_WEIGHT.entries()) t.ok(Math.abs(out.weight[i]! - w) < 1e-6, `weight[${i}] = ${out.weight[i]} (expected ${w})`);
  for (const [i, b] of EXPECTED_BIAS.entries()) t.ok(Math.abs(out.bias[i]! - b) < 1e-6, `bias[${i}] = ${out.bias[i]} (expected ${b})`);
}

t.test('the tarball: its size, and the prebuilt addon in it', async (t) => {
  t.comment(`packed tarball ${path.basename(packed.tarball)}: ${packed.size} bytes (${(packed.size / 1024).toFixed(0)} KiB), ${packed.unpackedSize} bytes unpacked, ${packed.files.length} files`);
  t.ok(packed.files.includes('prebuilds/linux-x64/node.napi.glibc.node'), 'npm run prebuild put the addon where node-gyp-build looks');
  t.ok(packed.size < 4 << 20, 'the tarball stays small (under 4 MiB)');
});

t.test('installs offline with no compiler, make or python on PATH, and trains', async (t) => {
  const bin = toolFreeBin(path.join(work, 'tool-free-bin'));
  for (const tool of ['g++', 'c++', 'cc', 'gcc', 'clang++', 'make', 'python3', 'python', 'sh'])
    t.equal(which(tool, bin), undefined, `${tool} is not on the install's PATH`);
  const project = path.join(work, 'tool-free');
  await makeProject(project, [packed.tarball, ...dependencies]);
  const env = installEnv(bin, path.join(work, 'cache-tool-free'));

  const install = await npm(['install', '--offline', '--no-audit', '--no-fund', '--foreground-scripts'], { cwd: project, env, timeoutMs: 120_000 });
  t.match(install.stdout, /\[sapipe install\] using prebuilds\/linux-x64\/node\.napi\.glibc\.node \(prebuilt: no compiler needed\)/);
  const installed = path.join(project, 'node_modules', 'sapipe');
  t.notOk(existsSync(path.join(installed, 'build')), 'nothing was compiled');

  const out = await train(project, env);
  checkStep(t, out);
  installedProject = { dir: project, env };
  t.equal(out.addon, path.join(installed, 'prebuilds', 'linux-x64', 'node.napi.glibc.node'), 'the prebuilt binary served the step');

  const text = await npm(['exec', '--offline', '--', 'sapipe', 'info'], { cwd: project, env });
  t.match(text.stdout, /sapipe \d+\.\d+\.\d+ \(node v/);
  t.match(text.stdout, /cpu\s+compute available/);
  t.match(text.stdout, /auto selects:\n\s+compute (cpu|cuda) /);
  const json = await run(path.join(bin, 'npx'), ['--offline', 'sapipe', 'info', '--json'], { cwd: project, env });
  const info = JSON.parse(json.stdout) as { simd: string; backends: { name: string; available: boolean; reason?: string }[]; selected: { compute: { name: string } } };
  t.ok(['baseline', 'avx2', 'avx512'].includes(info.simd), `simd ${info.simd}`);
  t.equal(info.backends.find((b) => b.name === 'cpu')?.available, true);
  for (const b of info.backends) if (!b.available) t.ok(b.reason, `${b.name} says why it is unavailable`);
  t.ok(['cpu', 'cuda'].includes(info.selected.compute.name));
});

t.test('a user loop from the README: createCommunicator, a schedule, clipping after the all-reduce, accumulation', async (t) => {
  if (!installedProject) return t.fail('the offline install above did not finish');
  const script = path.join(installedProject.dir, 'user-loop.mjs');
  copyFileSync(fileURLToPath(new URL('../fixtures/packaging/user-loop.mjs', import.meta.url)), script);
  const { stdout } = await run(process.execPath, [script], { cwd: installedProject.dir, env: installedProject.env, timeout: 120_000 });
  const got = JSON.parse(stdout) as Record<'sync' | 'sapipe-wp', number[]>;
  for (const mode of ['sync', 'sapipe-wp'] as const) {
    const want = referenceUserLoop(mode);
    const worst = got[mode].reduce((w, x, i) => Math.max(w, Math.abs(x - want[i]!)), 0);
    t.ok(worst < 1e-5, `${mode}: weights match the plain-TypeScript reference (worst difference ${worst.toExponential(2)}, tolerance 1e-5)`);
  }
});

t.test("require('sapipe') says the package is ESM and how to import it", async (t) => {
  if (!installedProject) return t.fail('the offline install above did not finish');
  const probe = "try { require('sapipe'); console.log('loaded') } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })) }";
  const { stdout } = await run(process.execPath, ['-e', probe], { cwd: installedProject.dir, env: installedProject.env });
  const error = JSON.parse(stdout) as { code: string; message: string };
  t.equal(error.code, 'ERR_REQUIRE_ESM');
  t.match(error.message, /import \{ ParamSet, SGD \} from 'sapipe'/);
  t.match(error.message, /await import\('sapipe'\)/);
  const esm = await run(process.execPath, ['--input-type=module', '-e', "import { ParamSet } from 'sapipe'; console.log(typeof ParamSet)"], { cwd: installedProject.dir, env: installedProject.env });
  t.equal(esm.stdout.trim(), 'function', 'import still works');
});

/** The same tarball with its addon overwritten by bytes that are not a shared library. */
async function corruptTarball(): Promise<string> {
  const tarball = path.join(work, 'sapipe-corrupt-prebuilt.tgz');
  if (existsSync(tarball)) return tarball;
  const unpacked = path.join(work, 'corrupt');
  mkdirSync(unpacked);
  await run('tar', ['-xzf', packed.tarball, '-C', unpacked]);
  writeFileSync(path.join(unpacked, 'package', 'prebuilds', 'linux-x64', 'node.napi.glibc.node'), 'not a shared library\n');
  await run('tar', ['-czf', tarball, '-C', unpacked, 'package']);
  return tarball;
}

t.test('a corrupt prebuilt binary and no compiler: the install fails and says what to install', async (t) => {
  const project = path.join(work, 'no-way');
  await makeProject(project, [await corruptTarball(), ...dependencies]);
  const env = installEnv(toolFreeBin(path.join(work, 'no-way-bin')), path.join(work, 'cache-no-way'));
  const failed = await npm(['install', '--offline', '--no-audit', '--no-fund', '--foreground-scripts'], { cwd: project, env }).then(
    () => undefined,
    (error: { stdout: string; stderr: string }) => error,
  );
  t.ok(failed, 'npm install fails');
  const output = `${failed?.stdout ?? ''}${failed?.stderr ?? ''}`;
  t.match(output, /no usable prebuilt binary for linux-x64/);
  t.match(output, /it needs python3, make and a C\+\+17 compiler \(g\+\+ >= 9 or clang\+\+ >= 10\)/);
  t.match(output, /not found on PATH: python3, make, a C\+\+17 compiler/);
});

t.test('a corrupt prebuilt binary: the install says so, builds from source, and trains', async (t) => {
  for (const tool of ['make', 'python3']) if (!which(tool)) t.fail(`${tool} is needed on PATH for the source build`);
  if (!which('g++') && !which('c++')) t.fail('a C++ compiler is needed on PATH for the source build');

  const project = path.join(work, 'from-source');
  await makeProject(project, [await corruptTarball(), ...dependencies]);
  const env = installEnv(process.env.PATH ?? '', path.join(work, 'cache-from-source'));
  const install = await npm(['install', '--offline', '--no-audit', '--no-fund', '--foreground-scripts'], { cwd: project, env, timeoutMs: 300_000 });
  t.match(install.stdout, /no usable prebuilt binary for linux-x64, Node\.js v[\d.]+: .*(invalid ELF header|too short|not a shared library)/);
  t.match(install.stdout, /building the CPU addon from source: node-gyp rebuild/);
  t.match(install.stdout, /built and loaded build\/Release\/sapipe\.node/);

  const installed = path.join(project, 'node_modules', 'sapipe');
  const out = await train(project, env);
  checkStep(t, out);
  t.equal(out.addon, path.join(installed, 'build', 'Release', 'sapipe.node'), 'the source build served the step');
});
