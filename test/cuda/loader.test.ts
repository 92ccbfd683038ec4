/**
 * The CUDA backend's failure paths, on any machine: a missing plugin, a plugin without its entry
 * point or of another ABI, a plugin that sees no device, a missing driver, a missing NCCL and an
 * NCCL without a needed symbol. Each must leave the package loadable, report the backend as
 * unavailable with a reason naming what was looked for, and fail `bench kernels --device cuda:0`
 * with ERR_BACKEND_UNAVAILABLE (never a crash). Each case runs in its own process because the
 * addon loads the plugin once per process. The fake libraries come from CMake (test-fakes/).
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';

import { parseDevice, requireCudaDevice } from '../../dist/device/index.js';
import { BackendUnavailableError, InvalidArgumentError } from '../../dist/errors.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const bin = `${root}/bin/sapipe.js`;
const release = `${root}/build/Release`;
const fakes = `${release}/test-fakes`;
const realPlugin = `${release}/sapipe_cuda.so`;
const pluginBuilt = existsSync(realPlugin);

interface Backend {
  name: string;
  available: boolean;
  reason?: string;
  details?: Record<string, string | number | boolean>;
}

function sapipe(args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [bin, ...args], { env: { ...process.env, ...env }, maxBuffer: 1 << 22 }, (error, stdout, stderr) => {
      const code = error ? (typeof error.code === 'number' ? error.code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

async function backends(env: Record<string, string>): Promise<Record<string, Backend>> {
  const r = await sapipe(['info', '--json'], env);
  if (r.code !== 0) throw new Error(`sapipe info failed (${r.code}): ${r.stderr}`);
  const info = JSON.parse(r.stdout) as { backends: Backend[] };
  return Object.fromEntries(info.backends.map((b) => [b.name, b]));
}

interface EntryOutcome {
  ok: boolean;
  name?: string;
  code?: string;
  message?: string;
}

/** Runs a device entry point (test/fixtures/cuda/device-entry.mjs) in its own process. */
function deviceEntry(scenario: 'buffer' | 'paramset' | 'nccl', env: Record<string, string>): Promise<EntryOutcome> {
  const fixture = `${root}/test/fixtures/cuda/device-entry.mjs`;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [fixture, scenario], { env: { ...process.env, ...env }, maxBuffer: 1 << 22 }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`${scenario} crashed (${String(error.code)}): ${stderr}`));
      resolve(JSON.parse(stdout.trim().split('\n').pop() ?? '{}') as EntryOutcome);
    });
  });
}

/** The entry failed cleanly with ERR_BACKEND_UNAVAILABLE and a message matching `reason`. */
function unavailable(t: Test, outcome: EntryOutcome, reason: RegExp | string): void {
  t.equal(outcome.ok, false, 'it fails');
  t.equal(outcome.name, 'BackendUnavailableError');
  t.equal(outcome.code, 'ERR_BACKEND_UNAVAILABLE');
  t.match(outcome.message, reason);
}

async function benchFails(t: Test, env: Record<string, string>, reason: RegExp): Promise<void> {
  const r = await sapipe(['bench', 'kernels', '--device', 'cuda:0', '--size', '1K', '--reps', '1', '--warmup', '1'], env);
  t.equal(r.code, 1, 'bench exits with status 1, not a signal');
  t.match(r.stderr, /^ERR_BACKEND_UNAVAILABLE: cuda:0 is unavailable: /);
  t.match(r.stderr, reason);
}

t.test('no plugin at the path looked at', async (t) => {
  const missing = `${root}/no/such/dir/sapipe_cuda.so`;
  const b = await backends({ SAPIPE_CUDA_PLUGIN: missing });
  t.equal(b.cpu?.available, true, 'the package still loads and the CPU backend works');
  t.equal(b.cuda?.available, false);
  t.match(b.cuda?.reason, `the cuda plugin was not found: looked for ${missing}`);
  t.equal(b.nccl?.available, false);
  t.match(b.nccl?.reason, /NCCL is used through the CUDA plugin, which is unavailable/);
  await benchFails(t, { SAPIPE_CUDA_PLUGIN: missing }, /looked for .*no\/such\/dir\/sapipe_cuda\.so/);
});

t.test('a plugin without the entry point symbol', async (t) => {
  const env = { SAPIPE_CUDA_PLUGIN: `${fakes}/sapipe_test_plugin_without_entry.so` };
  const b = await backends(env);
  t.equal(b.cuda?.available, false);
  t.match(b.cuda?.reason, /sapipe_test_plugin_without_entry\.so does not export the symbol sapipe_plugin_entry/);
  await benchFails(t, env, /sapipe_plugin_entry/);
});

t.test('a plugin of another ABI version', async (t) => {
  const b = await backends({ SAPIPE_CUDA_PLUGIN: `${fakes}/sapipe_test_plugin_other_abi.so` });
  t.equal(b.cuda?.available, false);
  t.match(b.cuda?.reason, /does not serve plugin ABI version 2 \(it offers 999\)/);
});

t.test('a file that is not a shared library', async (t) => {
  const b = await backends({ SAPIPE_CUDA_PLUGIN: bin });
  t.equal(b.cuda?.available, false);
  t.match(b.cuda?.reason, /could not be opened/);
});

t.test('a plugin that sees no device', async (t) => {
  const env = { SAPIPE_CUDA_PLUGIN: `${fakes}/sapipe_test_plugin_without_device.so` };
  const b = await backends(env);
  t.equal(b.cuda?.available, false);
  t.match(b.cuda?.reason, /the CUDA plugin loaded, but no CUDA device is visible/);
  await benchFails(t, env, /no CUDA device is visible/);
});

t.test('choosing between plugins: the first whose device can run it', async (t) => {
  // SAPIPE_CUDA_PLUGIN lists candidates in order, as sapipe_cuda.so (CUDA 13) and sapipe_cuda11.so
  // (CUDA 11.8) are tried beside the addon. device_without_code is the CUDA 13 plugin on a V100;
  // the host-memory plugin stands in for one whose device can run it.
  const noCode = `${fakes}/sapipe_test_plugin_device_without_code.so`;
  const usable = `${fakes}/sapipe_test_plugin_host_memory.so`;
  const noDevice = `${fakes}/sapipe_test_plugin_without_device.so`;

  const first = await backends({ SAPIPE_CUDA_PLUGIN: `${usable}:${noCode}` });
  t.equal(first.cuda?.available, true);
  t.equal(first.cuda?.details?.plugin, usable);
  t.match(first.cuda?.details?.pluginChoice, /a visible device can run its code$/);

  const fallback = await backends({ SAPIPE_CUDA_PLUGIN: `${noCode}:${usable}` });
  t.equal(fallback.cuda?.available, true, 'the second candidate serves');
  t.equal(fallback.cuda?.details?.plugin, usable);
  t.match(fallback.cuda?.details?.pluginChoice, `passed over ${noCode} (CUDA 13.0, built for sm_75`);
  t.match(fallback.cuda?.details?.pluginChoice, /no visible device can run this plugin's code/);

  const neither = await backends({ SAPIPE_CUDA_PLUGIN: `${noCode}:${noDevice}` });
  t.equal(neither.cuda?.available, false);
  t.match(neither.cuda?.reason, /^no CUDA plugin can run here \(SAPIPE_CUDA_PLUGIN\): /);
  t.match(neither.cuda?.reason, `${noCode} (CUDA 13.0, built for sm_75`);
  t.match(neither.cuda?.reason, `${noDevice} (CUDA 13.0, built for sm_80 compute_80): the CUDA plugin loaded, but no CUDA device is visible`);
  t.equal(neither.cuda?.details?.['cuda:0'], 'Tesla V100-SXM2-32GB (fake) (sm 7.0, no code for it)', 'the kept plugin still lists its devices');
  await benchFails(t, { SAPIPE_CUDA_PLUGIN: `${noCode}:${noDevice}` }, /no CUDA plugin can run here/);
});

t.test('the built plugins beside the addon: each one\'s reason where none can run', { skip: !(pluginBuilt && existsSync(`${release}/sapipe_cuda11.so`)) && 'sapipe_cuda.so and sapipe_cuda11.so are not both built' }, async (t) => {
  const b = await backends({ SAPIPE_CUDA_PLUGIN: '' });
  if (b.cuda?.available) {
    t.match(b.cuda.details?.pluginChoice, /a visible device can run its code/, `picked: ${String(b.cuda.details?.pluginChoice)}`);
    return;
  }
  t.match(b.cuda?.reason, /^no CUDA plugin can run here \(beside the addon\): /);
  t.match(b.cuda?.reason, /build\/Release\/sapipe_cuda\.so \(CUDA 13\.\d, built for /);
  t.match(b.cuda?.reason, 'build/Release/sapipe_cuda11.so (CUDA 11.8, built for sm_70 sm_80 sm_90 compute_90)');
});

t.test('the real plugin: unavailable here with the driver or device named', { skip: !pluginBuilt && 'the CUDA plugin is not built (no CUDA toolkit)' }, async (t) => {
  const b = await backends({ SAPIPE_CUDA_PLUGIN: realPlugin });
  if (b.cuda?.available) {
    // A machine with a usable GPU: the plugin reports the device it found.
    t.ok(b.cuda.details?.['cuda:0'], `cuda:0 is described: ${String(b.cuda.details?.['cuda:0'])}`);
    return;
  }
  t.match(b.cuda?.reason, /libcuda\.so\.1|no CUDA device|cannot run/);
});

t.test('NCCL missing from SAPIPE_NCCL_PATH and the system path', { skip: !pluginBuilt && 'the CUDA plugin is not built' }, async (t) => {
  const b = await backends({ SAPIPE_CUDA_PLUGIN: realPlugin, SAPIPE_NCCL_PATH: `${root}/no-nccl-here` });
  if (b.nccl?.available) {
    // A machine with a system NCCL (and a GPU): that one is loaded, not the missing path.
    t.notMatch(String(b.nccl.details?.library), 'no-nccl-here', `the system NCCL is used: ${String(b.nccl.details?.library)}`);
    return;
  }
  t.match(b.nccl?.reason, /NCCL was not found: looked for libnccl\.so\.2 in SAPIPE_NCCL_PATH and the system library path/);
  t.match(b.nccl?.reason, `${root}/no-nccl-here/libnccl.so.2`);
  t.match(b.nccl?.reason, /set SAPIPE_NCCL_PATH/);
});

t.test('an NCCL without ncclAllReduce', { skip: !pluginBuilt && 'the CUDA plugin is not built' }, async (t) => {
  const dir = `${fakes}/nccl-without-allreduce`;
  const b = await backends({ SAPIPE_CUDA_PLUGIN: realPlugin, SAPIPE_NCCL_PATH: dir });
  t.equal(b.nccl?.available, false);
  t.match(b.nccl?.reason, `NCCL at ${dir}/libnccl.so.2 lacks the symbol ncclAllReduce`);
});

t.test('in process: device specs are checked, unavailable devices throw BackendUnavailableError', async (t) => {
  t.same(parseDevice('cpu'), { kind: 'cpu' });
  t.same(parseDevice('cuda'), { kind: 'cuda', index: 0 });
  t.same(parseDevice('cuda:3'), { kind: 'cuda', index: 3 });
  for (const bad of ['gpu', 'cuda:', 'cuda:-1', 'cuda:x', 'CUDA:0', ''])
    t.throws(() => parseDevice(bad), InvalidArgumentError, bad);
  t.throws(() => requireCudaDevice(-1), InvalidArgumentError);
  let unavailable: unknown;
  try {
    requireCudaDevice(1000);
  } catch (error) {
    unavailable = error;
  }
  t.ok(unavailable instanceof BackendUnavailableError, 'a device that cannot be used is ERR_BACKEND_UNAVAILABLE');
  t.equal((unavailable as BackendUnavailableError).code, 'ERR_BACKEND_UNAVAILABLE');
  t.match((unavailable as Error).message, /^cuda:1000 (is unavailable|does not exist)/);
});

t.test('bench kernels rejects a malformed --device', async (t) => {
  const r = await sapipe(['bench', 'kernels', '--device', 'gpu0', '--size', '1K'], {});
  t.equal(r.code, 1);
  t.match(r.stderr, /^ERR_INVALID_ARGUMENT: device must be "cpu" or "cuda:N"/);
});

// ---- Device buffers and the nccl backend without a usable GPU: every entry fails with
// ERR_BACKEND_UNAVAILABLE naming the reason, in a process that stays alive.

t.test('device entries without a plugin name the path looked at', async (t) => {
  const missing = `${root}/no/such/dir/sapipe_cuda.so`;
  for (const scenario of ['buffer', 'paramset', 'nccl'] as const)
    unavailable(t, await deviceEntry(scenario, { SAPIPE_CUDA_PLUGIN: missing }), `the cuda plugin was not found: looked for ${missing}`);
  const b = await backends({ SAPIPE_CUDA_PLUGIN: missing });
  t.equal(b.nccl?.available, false, 'sapipe info: nccl unavailable');
});

t.test('device entries with a plugin that sees no device', async (t) => {
  const env = { SAPIPE_CUDA_PLUGIN: `${fakes}/sapipe_test_plugin_without_device.so` };
  unavailable(t, await deviceEntry('buffer', env), /^cuda:0 is unavailable: no CUDA device is visible/);
  unavailable(t, await deviceEntry('paramset', env), /^cuda:0 is unavailable: no CUDA device is visible/);
  // NCCL is probed first: the fake plugin answers every entry with "unavailable".
  unavailable(t, await deviceEntry('nccl', env), /no CUDA device is visible/);
});

t.test('device entries with a plugin built before the appended entries', async (t) => {
  const env = { SAPIPE_CUDA_PLUGIN: `${fakes}/sapipe_test_plugin_v1_base.so` };
  const b = await backends(env);
  t.match(b.cuda?.reason, /no CUDA device is visible/, 'the loader still accepts the base v1 table');
  for (const scenario of ['buffer', 'nccl'] as const)
    unavailable(t, await deviceEntry(scenario, env), /sapipe_test_plugin_v1_base\.so predates device buffers and NCCL communicators .*rebuild it/);
});

t.test('the real plugin: device entries unavailable here with the reason', { skip: !pluginBuilt && 'the CUDA plugin is not built (no CUDA toolkit)' }, async (t) => {
  const b = await backends({ SAPIPE_CUDA_PLUGIN: realPlugin });
  if (b.cuda?.available) {
    // A usable GPU (test/cuda/device.test.ts runs the device paths): the entry succeeds.
    t.equal((await deviceEntry('buffer', { SAPIPE_CUDA_PLUGIN: realPlugin })).ok, true, 'a device buffer is allocated on cuda:0');
    return;
  }
  const outcome = await deviceEntry('buffer', { SAPIPE_CUDA_PLUGIN: realPlugin });
  unavailable(t, outcome, /^cuda:0 is unavailable: .*(libcuda\.so\.1|no CUDA device|no such device)/);
});

t.test('NcclCommunicator.create: NCCL missing lists every place looked at', { skip: !pluginBuilt && 'the CUDA plugin is not built' }, async (t) => {
  const env = { SAPIPE_CUDA_PLUGIN: realPlugin, SAPIPE_NCCL_PATH: `${root}/no-nccl-here` };
  const b = await backends(env);
  if (b.nccl?.available) {
    // A machine with a system NCCL and a GPU: that NCCL is loaded, not the missing path.
    t.notMatch(String(b.nccl.details?.library), 'no-nccl-here', `the system NCCL is used: ${String(b.nccl.details?.library)}`);
    return;
  }
  const outcome = await deviceEntry('nccl', env);
  if ((b.nccl?.reason ?? '').startsWith('NCCL was not found')) {
    unavailable(t, outcome, /NCCL was not found: looked for libnccl\.so\.2 in SAPIPE_NCCL_PATH and the system library path/);
    t.match(outcome.message, `${root}/no-nccl-here/libnccl.so.2`);
    t.match(outcome.message, /set SAPIPE_NCCL_PATH/);
  } else {
    unavailable(t, outcome, /cuda:0 is unavailable/);  // a system NCCL, but no GPU
  }
});

t.test('NcclCommunicator.create: an NCCL without ncclAllReduce names the symbol and file', { skip: !pluginBuilt && 'the CUDA plugin is not built' }, async (t) => {
  const dir = `${fakes}/nccl-without-allreduce`;
  unavailable(t, await deviceEntry('nccl', { SAPIPE_CUDA_PLUGIN: realPlugin, SAPIPE_NCCL_PATH: dir }), `NCCL at ${dir}/libnccl.so.2 lacks the symbol ncclAllReduce`);
});

t.test('NCCL present but no GPU: info and NcclCommunicator.create say the device is missing', { skip: !pluginBuilt && 'the CUDA plugin is not built' }, async (t) => {
  const dir = `${fakes}/nccl-complete`;
  const env = { SAPIPE_CUDA_PLUGIN: realPlugin, SAPIPE_NCCL_PATH: dir };
  const b = await backends(env);
  if (b.cuda?.available) {
    // A usable GPU: the fake NCCL (which only answers the probe) is reported available.
    t.equal(b.nccl?.available, true);
    t.same(b.nccl?.details, { version: 22703, library: `${dir}/libnccl.so.2` });
    return;
  }
  t.equal(b.nccl?.available, false);
  t.match(b.nccl?.reason, `NCCL 22703 loaded (${dir}/libnccl.so.2), but it needs a CUDA device: `);
  unavailable(t, await deviceEntry('nccl', env), /^cuda:0 is unavailable: /);
});
