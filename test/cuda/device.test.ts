/**
 * Device buffers, device ParamSets and the nccl backend, in process.
 *
 * Everywhere: every entry checks its arguments (bad device strings, lengths, disposed buffers,
 * options) and throws the documented code before touching a device; without a usable device the
 * entries throw BackendUnavailableError carrying the plugin's reason.
 *
 * On a GPU (cudaStatus().available), the `GPU:` tests run the real paths: copies, the device
 * step against the host step, a one-rank NCCL communicator (every collective and the fused
 * step, replicated and sharded, the device exchange) and DataParallelTrainer over it against the
 * trainer over `local`. Where no GPU is usable those tests assert the unavailability reason
 * instead of passing silently; test/cuda/emulated.test.ts runs them again on a CUDA plugin over
 * host memory. The two-rank and peer-loss tests need two GPUs (test/cuda/nccl-ranks.test.ts).
 */
import t, { type Test } from 'tap';

import { selectCommBackend } from '../../dist/backends/index.js';
import { createRendezvous } from '../../dist/comm/rendezvous/rendezvous.js';
import { NcclCommunicator } from '../../dist/comm/nccl.js';
import { cudaDeviceIndex, cudaStatus, DeviceBuffer, DeviceParamSet, probeNccl, type CudaDevice } from '../../dist/device/index.js';
import { BackendUnavailableError, SapipeError } from '../../dist/errors.js';
import { Adam, SGD } from '../../dist/optim/index.js';
import { FlatBuffer, ParamSet } from '../../dist/tensor.js';
import { ncclTrainerCases } from '../helpers/nccl-trainer.js';
import { fillUniform, rng, worstError } from '../helpers/random.js';

const status = cudaStatus();
const gpu = status.available;
const nccl = probeNccl();

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (error) {
    return error instanceof SapipeError ? error.code : `not a SapipeError: ${String(error)}`;
  }
  return undefined;
}

async function rejectionOf(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  return undefined;
}

/** Where no GPU can be used, the entry must say why: the plugin's reason, never a crash or a pass. */
function assertUnavailable(t: Test, fn: () => unknown): void {
  let error: unknown;
  try {
    fn();
  } catch (e) {
    error = e;
  }
  t.ok(error instanceof BackendUnavailableError, `BackendUnavailableError (got ${String(error)})`);
  t.equal((error as SapipeError).code, 'ERR_BACKEND_UNAVAILABLE');
  t.match((error as Error).message, /plugin|libcuda\.so\.1|no CUDA device|cuda:0/);
  if (status.reason) t.ok((error as Error).message.includes(status.reason.replace(/^the CUDA plugin loaded, but /, '')), 'the message carries the reason sapipe info gives');
}

t.test('device strings: only cuda:N, N in [0, 1023]', async (t) => {
  t.equal(cudaDeviceIndex('cuda'), 0);
  t.equal(cudaDeviceIndex('cuda:7'), 7);
  for (const bad of ['cuda:-1', 'cuda:x', 'gpu:0', 'cpu', 'CUDA:0', 'cuda:', '', 'cuda:1024', ' cuda:0', 3, null, undefined])
    t.equal(codeOf(() => cudaDeviceIndex(bad)), 'ERR_INVALID_ARGUMENT', JSON.stringify(bad));
});

t.test('DeviceBuffer: arguments are checked before the device is touched', async (t) => {
  for (const device of ['cuda:-1', 'cuda:x', 'gpu:0', 'cpu'])
    t.equal(codeOf(() => DeviceBuffer.allocate(4, { device: device as CudaDevice })), 'ERR_INVALID_ARGUMENT', device);
  t.equal(codeOf(() => DeviceBuffer.allocate(4, null as never)), 'ERR_INVALID_ARGUMENT', 'no options');
  t.equal(codeOf(() => DeviceBuffer.allocate(4, {} as never)), 'ERR_INVALID_ARGUMENT', 'no device');
  for (const length of [-1, 1.5, 2 ** 32, Number.NaN, '4'])
    t.equal(codeOf(() => DeviceBuffer.allocate(length as number, { device: 'cuda:0' })), 'ERR_INVALID_ARGUMENT', `length ${String(length)}`);
  t.equal(codeOf(() => DeviceBuffer.from([1, 2] as never, { device: 'cuda:0' })), 'ERR_INVALID_ARGUMENT', 'from a plain array');
  const disposed = FlatBuffer.allocate(4);
  disposed.dispose();
  t.equal(codeOf(() => DeviceBuffer.from(disposed, { device: 'cuda:0' })), 'ERR_DISPOSED', 'from a disposed FlatBuffer');
  t.equal(codeOf(() => DeviceBuffer.from(new Float32Array(2), { device: 'gpu:0' as CudaDevice })), 'ERR_INVALID_ARGUMENT', 'from with a bad device');
});

t.test('DeviceParamSet.create: arguments are checked before the device is touched', async (t) => {
  const params = new ParamSet({ w: [3, 5], b: [5] });
  const other = new ParamSet({ w: [2] });
  const sgd = new SGD(other, { lr: 0.1 });
  t.equal(codeOf(() => DeviceParamSet.create({} as never, { device: 'cuda:0' })), 'ERR_INVALID_ARGUMENT', 'not a ParamSet');
  t.equal(codeOf(() => DeviceParamSet.create(params, { device: 'cuda:x' as CudaDevice })), 'ERR_INVALID_ARGUMENT', 'bad device');
  t.equal(codeOf(() => DeviceParamSet.create(params, { device: 'cuda:0', optimizer: sgd })), 'ERR_INVALID_ARGUMENT', "another ParamSet's optimizer");
  t.equal(codeOf(() => DeviceParamSet.create(params, { device: 'cuda:0', optimizer: {} as never })), 'ERR_INVALID_ARGUMENT', 'not an optimizer');
  for (const shards of [0, -1, 1.5, 70000])
    t.equal(codeOf(() => DeviceParamSet.create(params, { device: 'cuda:0', shards })), 'ERR_INVALID_ARGUMENT', `shards ${shards}`);
  const gone = new ParamSet({ w: [4] });
  gone.dispose();
  t.equal(codeOf(() => DeviceParamSet.create(gone, { device: 'cuda:0' })), 'ERR_DISPOSED', 'a disposed ParamSet');
  sgd.dispose();
  params.dispose();
  other.dispose();
});

t.test('NcclCommunicator.create: options are checked before NCCL, the device or the store', async (t) => {
  const base = { rank: 0, size: 1, device: 'cuda:0' as CudaDevice, env: { RANK: '0', WORLD_SIZE: '1' } };
  const cases: [string, Record<string, unknown>][] = [
    ['no options', { rank: undefined, size: undefined }],
    ['size 0', { size: 0 }],
    ['rank = size', { rank: 1 }],
    ['rank -1', { rank: -1 }],
    ['cuda:-1', { device: 'cuda:-1' }],
    ['cuda:x', { device: 'cuda:x' }],
    ['gpu:0', { device: 'gpu:0' }],
    ['timeout 0', { timeoutMs: 0 }],
    ['empty key', { key: '' }],
    ['no store and no env', { env: undefined }],
    ['a store that is not one', { env: undefined, store: { set() {} } }],
  ];
  for (const [what, change] of cases) {
    const error = await rejectionOf(NcclCommunicator.create({ ...base, ...change } as never));
    t.equal((error as SapipeError | undefined)?.code, 'ERR_INVALID_ARGUMENT', what);
  }
  t.equal((await rejectionOf(NcclCommunicator.create(null as never)) as SapipeError).code, 'ERR_INVALID_ARGUMENT', 'null');
});

t.test('sapipe info and selectCommBackend know nccl', async (t) => {
  t.equal(nccl.name, 'nccl');
  t.equal(nccl.kind, 'comm');
  if (!nccl.available) {
    t.match(nccl.reason, /NCCL|CUDA|cuda/, `unavailable with a reason: ${nccl.reason ?? ''}`);
    const error = (() => {
      try {
        selectCommBackend('nccl');
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    t.ok(error instanceof BackendUnavailableError);
    t.match((error as Error).message, /^the nccl backend is unavailable: [\s\S]*To use it: it needs the cuda backend/);
  } else {
    t.equal(selectCommBackend('nccl').name, 'nccl');
  }
  t.not(selectCommBackend('auto').name, 'nccl', 'auto never picks nccl: it moves device buffers');
});

t.test(gpu ? 'no GPU here: skipped (a GPU is present)' : 'no usable GPU: every device entry says why', async (t) => {
  if (gpu) return;
  assertUnavailable(t, () => DeviceBuffer.allocate(16, { device: 'cuda:0' }));
  assertUnavailable(t, () => DeviceBuffer.from(new Float32Array([1, 2, 3]), { device: 'cuda:0' }));
  const params = new ParamSet({ w: [4] });
  assertUnavailable(t, () => DeviceParamSet.create(params, { device: 'cuda:0' }));
  params.dispose();
  const error = await rejectionOf(NcclCommunicator.create({ rank: 0, size: 1, device: 'cuda:0', env: { RANK: '0', WORLD_SIZE: '1' } }));
  t.ok(error instanceof BackendUnavailableError, `NcclCommunicator.create rejects with BackendUnavailableError: ${String(error)}`);
  t.ok((error as Error).message.length > 20, 'with the reason');
});

// ---- The real paths: need a GPU. Without one each test asserts the reason instead.

function gpuTest(name: string, fn: (t: Test) => Promise<void>, needsNccl = false): void {
  t.test(`GPU: ${name}`, async (t) => {
    if (!gpu) {
      assertUnavailable(t, () => DeviceBuffer.allocate(1, { device: 'cuda:0' }));
      return;
    }
    if (needsNccl && !nccl.available) {
      t.match(nccl.reason, /NCCL/, `NCCL is unavailable: ${nccl.reason ?? ''}`);
      return;
    }
    await fn(t);
  });
}

const random = (n: number, seed: number): Float32Array => fillUniform(new Float32Array(n), rng(seed));

// The GPU contracts multiply-adds into FMAs: a few ulps from the host per step.
function close(t: Test, got: Float32Array, want: Float32Array, what: string): void {
  const { ratio } = worstError(got, want, 1e-6, 1e-5);
  t.ok(got.length === want.length && ratio <= 1, `${what} (worst ${ratio.toFixed(3)} of tolerance)`);
}

gpuTest('DeviceBuffer copies to and from the host, partial ranges, dispose', async (t) => {
  for (const n of [0, 1, 17, 4099]) {
    const values = random(n, n + 1);
    const d = DeviceBuffer.from(values, { device: 'cuda:0' });
    t.equal(d.length, n);
    t.equal(d.device, 'cuda:0');
    t.same(d.copyToHost(), values, `round trip of ${n}`);
    d.dispose();
  }
  const d = DeviceBuffer.allocate(8, { device: 'cuda:0' });
  t.same(d.copyToHost(), new Float32Array(8), 'zero-filled');
  d.copyFromHost(new Float32Array([1, 2, 3]), 4);
  t.same(d.copyToHost(new Float32Array(4), 3), new Float32Array([0, 1, 2, 3]));
  const host = FlatBuffer.allocate(8);
  d.copyToHost(host);
  t.same(host.array, new Float32Array([0, 0, 0, 0, 1, 2, 3, 0]));
  t.equal(codeOf(() => d.copyFromHost(new Float32Array(5), 4)), 'ERR_SIZE_MISMATCH');
  t.equal(codeOf(() => d.copyToHost(new Float32Array(9))), 'ERR_SIZE_MISMATCH');
  t.equal(codeOf(() => d.copyFromHost(new Float32Array(1), -1)), 'ERR_INVALID_ARGUMENT');
  const e = DeviceBuffer.allocate(8, { device: 'cuda:0' });
  e.copyFrom(d);
  t.same(e.copyToHost(), host.array, 'device to device');
  t.equal(codeOf(() => e.copyFrom(DeviceBuffer.allocate(9, { device: 'cuda:0' }))), 'ERR_SIZE_MISMATCH');
  e.copyFromHost(new Float32Array([Number.NaN, Infinity, 1]));
  t.equal(e.countNonFinite(), 2);
  d.dispose();
  d.dispose();
  t.equal(d.disposed, true);
  t.equal(codeOf(() => d.copyToHost()), 'ERR_DISPOSED');
  t.equal(codeOf(() => d.copyFromHost(new Float32Array(1))), 'ERR_DISPOSED');
  t.equal(codeOf(() => e.copyFrom(d)), 'ERR_DISPOSED');
  t.equal(codeOf(() => DeviceBuffer.allocate(4, { device: 'cuda:1023' })), 'ERR_BACKEND_UNAVAILABLE', 'a device that does not exist');
  e.dispose();
  host.dispose();
});

gpuTest('DeviceParamSet.step equals the host step (SGD with momentum and prediction, Adam), and the guard skips NaN', async (t) => {
  const makers = [
    (p: ParamSet) => new SGD(p, { lr: 0.05, momentum: 0.9, prediction: { kind: 'linear', steps: 1 } }),
    (p: ParamSet) => new Adam(p, { lr: 0.01, weightDecay: 0.01 }),
  ];
  for (const make of makers) {
    const host = new ParamSet({ w: [37, 11], b: [11] });
    const onDevice = new ParamSet({ w: [37, 11], b: [11] });
    host.weights.array.set(random(host.length, 3));
    onDevice.weights.array.set(host.weights.array);
    const hostOpt = make(host);
    const devOpt = make(onDevice);
    const dev = DeviceParamSet.create(onDevice, { device: 'cuda:0', optimizer: devOpt });
    for (let step = 1; step <= 3; ++step) {
      const g = random(host.length, 100 + step);
      host.grads.array.set(g);
      onDevice.grads.array.set(g);
      dev.copyGradsFromHost();
      const a = hostOpt.stepSync();
      const b = dev.step();
      t.same(b, a, `step ${step}: same result`);
    }
    dev.copyToHost();
    close(t, onDevice.weights.array, host.weights.array, `${hostOpt.kind}: weights after 3 steps`);
    for (const name of hostOpt.stateNames) close(t, devOpt.stateBuffer(name)!.array, hostOpt.stateBuffer(name)!.array, `${hostOpt.kind}: ${name}`);
    const before = dev.weights.copyToHost();
    dev.grads.copyFromHost(new Float32Array([Number.NaN]), 5);
    const skipped = dev.step();
    t.equal(skipped.applied, false, 'a NaN gradient skips the step');
    t.same(dev.weights.copyToHost(), before, 'and writes nothing');
    dev.dispose();
    t.equal(codeOf(() => dev.step()), 'ERR_DISPOSED');
    hostOpt.dispose();
    devOpt.dispose();
    host.dispose();
    onDevice.dispose();
  }
});

gpuTest(
  'one-rank NcclCommunicator: collectives, barrier, fused replicated and sharded steps equal the host step',
  async (t) => {
    const store = await createRendezvous({ rank: 0, worldSize: 1, port: 0, timeoutMs: 10_000 });
    const comm = await NcclCommunicator.create({ rank: 0, size: 1, device: 'cuda:0', store, timeoutMs: 10_000 });
    try {
      t.equal(comm.backend, 'nccl');
      const x = DeviceBuffer.from(new Float32Array([1, 2, Number.NaN, 4]), { device: 'cuda:0' });
      t.same(await comm.allreduce(x, { op: 'avg' }), { nonFiniteCount: 1 });
      const out = DeviceBuffer.allocate(4, { device: 'cuda:0' });
      await comm.allgather(x, out);
      const gathered = out.copyToHost();
      t.same([gathered[0], gathered[1], gathered[3]], [1, 2, 4], 'allgather of one rank is a copy');
      t.ok(Number.isNaN(gathered[2]), 'NaN included');
      await comm.broadcast(out, 0);
      await comm.barrier();
      t.equal(((await rejectionOf(comm.allreduce(FlatBuffer.allocate(4) as never))) as SapipeError).code, 'ERR_INVALID_ARGUMENT', 'a host buffer is refused');
      t.equal(((await rejectionOf(comm.allgather(x, DeviceBuffer.allocate(3, { device: 'cuda:0' })))) as SapipeError).code, 'ERR_SIZE_MISMATCH');
      for (const update of ['replicated', 'sharded'] as const) {
        const host = new ParamSet({ w: [64, 33], b: [33] });
        const onDevice = new ParamSet({ w: [64, 33], b: [33] });
        host.weights.array.set(random(host.length, 9));
        onDevice.weights.array.set(host.weights.array);
        const hostOpt = new Adam(host, { lr: 0.01, prediction: { kind: 'linear', steps: 1 } });
        const devOpt = new Adam(onDevice, { lr: 0.01, prediction: { kind: 'linear', steps: 1 } });
        const dev = DeviceParamSet.create(onDevice, { device: 'cuda:0', optimizer: devOpt, shards: 1 });
        for (let step = 1; step <= 3; ++step) {
          const g = random(host.length, 7 + step);
          host.grads.array.set(g);
          onDevice.grads.array.set(g);
          dev.copyGradsFromHost();
          hostOpt.stepSync();
          const r = await comm.allreduceAndStep(dev, { update, bucketBytes: 4096, firstBucketBytes: 1024 });
          t.equal(r.applied, true, `${update} step ${step} applied`);
          t.equal(r.update, update);
        }
        if (update === 'sharded') await comm.gatherShardedState(dev);
        dev.copyToHost();
        close(t, onDevice.weights.array, host.weights.array, `${update}: weights equal the host's`);
        dev.grads.copyFromHost(new Float32Array([Infinity]), 3);
        const skipped = await comm.allreduceAndStep(dev, { update });
        t.equal(skipped.applied, false, `${update}: a non-finite gradient skips the step`);
        t.equal(skipped.nonFiniteCount, 1);
        dev.grads.copyFromHost(new Float32Array(dev.length).fill(3e38));
        const risky = await comm.allreduceAndStep(dev, { update });
        t.equal(risky.rechecked, true, `${update}: huge finite gradients take the recheck`);
        t.equal(risky.applied, true, 'and are applied, as the reduced gradient is finite');
        dev.dispose();
        hostOpt.dispose();
        devOpt.dispose();
        host.dispose();
        onDevice.dispose();
      }
    } finally {
      comm.destroy();
      await store.close();
    }
    t.equal(((await rejectionOf(comm.barrier())) as SapipeError).code, 'ERR_DISPOSED', 'use after destroy');
  },
  true,
);

gpuTest(
  'one-rank NcclCommunicator: sparseAllreduce on device buffers equals the host exchange (MSTopK on the GPU, error feedback, NaN)',
  async (t) => {
    const { LocalCommunicator } = await import('../../dist/comm/local.js');
    const { sparseAllreduce } = await import('../../dist/compress/sparse-allreduce.js');
    const store = await createRendezvous({ rank: 0, worldSize: 1, port: 0, timeoutMs: 10_000 });
    const comm = await NcclCommunicator.create({ rank: 0, size: 1, device: 'cuda:0', store, timeoutMs: 10_000 });
    const local = await LocalCommunicator.create({ group: `sparse-gpu-${process.pid}`, rank: 0, size: 1 });
    try {
      const n = 100_003;
      const g = random(n, 21);
      const hostGrad = FlatBuffer.allocate(n);
      const hostResidual = FlatBuffer.allocate(n);
      const devGrad = DeviceBuffer.allocate(n, { device: 'cuda:0' });
      const devResidual = DeviceBuffer.allocate(n, { device: 'cuda:0' });
      for (let step = 0; step < 5; step++) {
        hostGrad.array.set(g.map((v, i) => v * Math.cos(step + i * 1e-3)));
        devGrad.copyFromHost(hostGrad.array);
        const h = await sparseAllreduce(local, hostGrad, { density: 0.01, residual: hostResidual });
        const d = await sparseAllreduce(comm, devGrad, { density: 0.01, residual: devResidual });
        t.same(d, h, `step ${step}: the same k, bytes and count`);
        // One rank: the average is this rank's selection. The search's mean|x| is summed in another
        // order on the GPU, so a few elements at the band's edge may differ; the masses agree.
        const [hg, dg] = [hostGrad.array, devGrad.copyToHost()];
        const sent = (a: Float32Array): number => a.reduce((s, v) => s + (v !== 0 ? 1 : 0), 0);
        t.equal(sent(dg), sent(hg), `step ${step}: exactly k elements sent on both`);
        const dr = devResidual.copyToHost();
        t.ok(worstError(Float32Array.from(dg, (v, i) => v + dr[i]!), Float32Array.from(hg, (v, i) => v + hostResidual.array[i]!), 1e-6, 1e-7).ratio <= 1, `step ${step}: sent + residual agree`);
      }
      devGrad.copyFromHost(new Float32Array([Number.NaN]), 7);
      const before = devResidual.copyToHost();
      const r = await sparseAllreduce(comm, devGrad, { density: 0.01, residual: devResidual });
      t.equal(r.nonFiniteCount, 1, 'a NaN is counted, the step is to be skipped');
      t.ok(Number.isNaN(devGrad.copyToHost()[7]!), 'and travels where a dense sum would put it');
      t.same([...devResidual.copyToHost()], [...before], 'the rank with the NaN selected nothing: its residual is unchanged');
      t.equal(((await rejectionOf(sparseAllreduce(comm, hostGrad as never, { density: 0.01 }))) as SapipeError).code, 'ERR_INVALID_ARGUMENT', 'a host buffer is refused');
      for (const b of [devGrad, devResidual]) b.dispose();
      for (const b of [hostGrad, hostResidual]) b.dispose();
    } finally {
      comm.destroy();
      local.destroy();
      await store.close();
    }
  },
  true,
);

gpuTest(
  'DataParallelTrainer over a one-rank nccl communicator: equals the trainer over local in every mode for 50 steps, skips a NaN on the device, resumes exactly, refuses what it cannot run',
  async (t) => {
    const { LocalCommunicator } = await import('../../dist/comm/local.js');
    const { DataParallelTrainer } = await import('../../dist/dataparallel/trainer.js');
    type Options = Parameters<typeof DataParallelTrainer.create>[0];
    const store = await createRendezvous({ rank: 0, worldSize: 1, port: 0, timeoutMs: 10_000 });
    const comm = await NcclCommunicator.create({ rank: 0, size: 1, device: 'cuda:0', store, timeoutMs: 10_000 });
    const local = await LocalCommunicator.create({ group: `trainer-gpu-${process.pid}`, rank: 0, size: 1 });
    const spec = { w: [37, 11], b: [11] };
    const probe = new ParamSet(spec);
    const length = probe.length; // the tensors' elements and their alignment padding
    probe.dispose();
    const init = random(length, 31);
    const target = random(init.length, 32);
    // A gradient that depends on the weights the forward pass read and on the step, so that a
    // wrong forward buffer or a late update shows as a different trajectory.
    const gradient = (w: Float32Array, step: number): Float32Array => Float32Array.from(w, (x, i) => (x - target[i]!) * (1 + 0.25 * Math.sin(step + i)));
    const run = async (trainer: Awaited<ReturnType<typeof DataParallelTrainer.create>>, from: number, steps: number, nanAt = -1) => {
      const trace = { forward: [] as Float32Array[], weights: [] as Float32Array[], results: [] as unknown[] };
      for (let step = from; step < from + steps; step++) {
        const forward = trainer.forwardWeights.array.slice();
        const g = gradient(forward, step).map((x) => x * trainer.lossScale);
        if (step === nanAt) g[5] = Number.NaN;
        trainer.grads.array.set(g);
        const r = await trainer.step();
        trace.forward.push(forward);
        trace.weights.push(trainer.params.weights.array.slice());
        trace.results.push({ applied: r.applied, updated: r.updated, nonFiniteCount: r.nonFiniteCount, step: r.step });
      }
      return trace;
    };
    const sgd = { kind: 'sgd', lr: 0.05, momentum: 0.9 } as const;
    const adam = { kind: 'adam', lr: 0.01 } as const;
    const buckets = { bucketBytes: 512, firstBucketBytes: 128 };
    const cases = ncclTrainerCases<Options['optimizer']>(sgd, adam, buckets, { name: ', loss scaling', options: { lossScaling: { initScale: 1024 } } });
    try {
      for (const [name, config] of cases) {
        const make = async (c: typeof comm | typeof local) => {
          const params = new ParamSet(spec);
          params.weights.array.set(init);
          return DataParallelTrainer.create({ ...config, comm: c, params } as Options);
        };
        const [onDevice, onHost] = [await make(comm), await make(local)];
        t.equal(onDevice.overlapped, onHost.overlapped, `${name}: overlapped alike (${onHost.overlapped})`);
        // A NaN in step 20's gradient: the update that applies it is skipped on both.
        const [d, h] = [await run(onDevice, 0, 50, 20), await run(onHost, 0, 50, 20)];
        t.same(d.results, h.results, `${name}: the same steps applied, skipped and counted`);
        t.ok(h.results.some((r) => !(r as { applied: boolean }).applied && (r as { nonFiniteCount: number }).nonFiniteCount === 1), `${name}: the NaN step was skipped`);
        // The device contracts multiply-adds into FMAs: a few ulps per step apart from the host,
        // which the contracting objective keeps from growing over the 50 steps.
        let worstForward = 0;
        let worstWeights = 0;
        for (let s = 0; s < 50; s++) {
          worstForward = Math.max(worstForward, worstError(d.forward[s]!, h.forward[s]!, 1e-6, 1e-4).ratio);
          worstWeights = Math.max(worstWeights, worstError(d.weights[s]!, h.weights[s]!, 1e-6, 1e-4).ratio);
        }
        t.ok(worstForward <= 1, `${name}: the forward weights of every step agree (worst ${worstForward.toFixed(3)} of tolerance)`);
        t.ok(worstWeights <= 1, `${name}: the weights after every step agree (worst ${worstWeights.toFixed(3)} of tolerance)`);
        // Export mid-flight (an update ahead on the device), resume in a fresh trainer: the two
        // continue bit for bit alike.
        const state = await onDevice.exportState();
        const resumed = await make(comm);
        resumed.importState(state);
        const [a, b] = [await run(onDevice, 50, 10), await run(resumed, 50, 10)];
        t.same(b.weights, a.weights, `${name}: the resumed trainer continues bit for bit`);
        t.same(b.forward, a.forward, `${name}: with the same forward weights`);
        for (const trainer of [onDevice, onHost, resumed]) {
          await trainer.flush();
          const params = trainer.params;
          await trainer.dispose();
          params.dispose();
        }
      }
      // A finite gradient large enough that a sum could overflow fp32: the device guard skips the
      // step for the risk alone, the recheck finds the reduced gradient finite and applies it,
      // and the new weights are copied out again; the host trainer applies it at once.
      for (const mode of ['sync', 'pipe-sgd', 'sapipe-wp'] as const) {
        const make = async (c: typeof comm | typeof local) => {
          const params = new ParamSet(spec);
          params.weights.array.set(init);
          return DataParallelTrainer.create({ mode, optimizer: { kind: 'sgd', lr: 1e-30 }, comm: c, params, ...buckets } as Options);
        };
        const [onDevice, onHost] = [await make(comm), await make(local)];
        const huge = async (trainer: typeof onDevice) => {
          const results: unknown[] = [];
          for (let step = 0; step < 4; step++) {
            trainer.grads.array.set(gradient(trainer.forwardWeights.array, step));
            if (step === 1) trainer.grads.array[7] = 3e38;
            const r = await trainer.step();
            results.push({ applied: r.applied, updated: r.updated, nonFiniteCount: r.nonFiniteCount });
          }
          await trainer.flush();
          return results;
        };
        const [d, h] = [await huge(onDevice), await huge(onHost)];
        t.same(d, h, `${mode}: a gradient of 3e38 is applied through the recheck, as on the host`);
        t.ok(h.every((r) => (r as { applied: boolean; updated: boolean }).applied || !(r as { updated: boolean }).updated), `${mode}: every update applied`);
        const { ratio } = worstError(onDevice.params.weights.array, onHost.params.weights.array, 1e-6, 1e-4);
        t.ok(ratio <= 1, `${mode}: the same weights after it (worst ${ratio.toFixed(3)} of tolerance)`);
        for (const trainer of [onDevice, onHost]) {
          const params = trainer.params;
          await trainer.dispose();
          params.dispose();
        }
      }
      const refused: [string, Partial<Options>][] = [
        ['clipGradNorm', { mode: 'pipe-sgd', clipGradNorm: 1 }],
        ["the 'local' estimate", { mode: 'sapipe-wp', estimate: 'local' }],
        ['overlapUpdate: false', { mode: 'pipe-sgd', overlapUpdate: false }],
        ['compression', { mode: 'sync', compression: { kind: 'topk', density: 0.1 } }],
        ["update 'sharded'", { mode: 'sync', update: 'sharded' }],
        ['a guard', { mode: 'sync', guard: 'deferred' }],
      ];
      for (const [what, config] of refused) {
        const params = new ParamSet(spec);
        const error = await rejectionOf(DataParallelTrainer.create({ optimizer: sgd, ...config, comm, params } as Options));
        t.equal((error as SapipeError).code, 'ERR_BACKEND_UNAVAILABLE', `over nccl, ${what} is refused: ${String(error)}`);
        params.dispose();
      }
    } finally {
      comm.destroy();
      local.destroy();
      await store.close();
    }
  },
  true,
);
