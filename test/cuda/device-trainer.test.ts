/**
 * DataParallelTrainer with device gradients (`device: 'cuda:N'` over the nccl communicator): an
 * MLP built on the device writes its gradient into `trainer.deviceGrads`, reads
 * `trainer.deviceForwardWeights`, and the trainer averages and applies each bucket on the device.
 * Against the CPU path (the same MLP on the host, DataParallelTrainer over `local`) in every mode
 * the nccl path runs, with the host ParamSet untouched until copyToHost(). The `GPU:` tests run on
 * a GPU with NCCL, and on the CUDA plugin over host memory through test/cuda/emulated.test.ts;
 * without either they assert why no device is usable. The argument checks run everywhere.
 */
import t from 'tap';

import { LocalCommunicator } from '../../dist/comm/local.js';
import { DataParallelTrainer } from '../../dist/dataparallel/trainer.js';
import { MLP } from '../../dist/nn/mlp.js';
import { ParamSet } from '../../dist/tensor.js';
import { failure, gpuTest, oneRankNccl, mlpData, MLP_ADAM, MLP_BATCH, MLP_BUCKETS, MLP_SGD, MLP_SIZES, ncclTrainerCases, runDevice as runDeviceTrace, runHost as runHostTrace, worstOf as worstOfSteps, type Trace } from '../helpers/nccl-trainer.js';
import { fillUniform, rng, worstError } from '../helpers/random.js';
import { refBackward, refForward, refLoss, type RefPartWeights } from '../reference/pipeline.js';
import { ReferenceOptimizer } from '../reference/optimizer.js';

type Options = Parameters<typeof DataParallelTrainer.create>[0];
type Trainer = Awaited<ReturnType<typeof DataParallelTrainer.create>>;

// ---- Argument checks: refused before any device or collective is touched.

t.test('the device option is checked against the communicator, with messages that say what to do', async (t) => {
  const local = await LocalCommunicator.create({ group: `device-trainer-args-${process.pid}`, rank: 0, size: 1 });
  const sgd = { kind: 'sgd', lr: 0.1 } as const;
  try {
    for (const [device, pattern] of [
      ['cuda:0', /ERR_INVALID_ARGUMENT: .*only the nccl backend reduces; create the communicator with NcclCommunicator\.create\(\{ rank, size, device: 'cuda:0'/],
      ['gpu:0', /ERR_INVALID_ARGUMENT: .*device must be 'cpu' or 'cuda:N', got/],
      [42, /ERR_INVALID_ARGUMENT: .*device must be 'cpu' or the nccl communicator's 'cuda:N', got 42/],
      ['cuda:-1', /ERR_INVALID_ARGUMENT: .*device must be 'cpu' or 'cuda:N'/],
    ] as const) {
      const params = new ParamSet({ w: [3, 2] });
      t.match(await failure(() => DataParallelTrainer.create({ comm: local, params, mode: 'sync', optimizer: sgd, device: device as 'cuda:0' })), pattern, `device ${String(device)}`);
      params.dispose();
    }
    // A model that computes on a GPU with a trainer that expects host gradients, and the reverse.
    const params = new ParamSet({ w: [3, 2] });
    const onGpu = { numParams: params.numParams, params, device: 'cuda:0' };
    t.match(
      await failure(() => DataParallelTrainer.create({ comm: local, params, model: onGpu, mode: 'sync', optimizer: sgd })),
      /ERR_INVALID_ARGUMENT: .*options\.model computes on cuda:0, but the trainer's device is 'cpu'; pass device: 'cuda:0'/,
      'a model on a GPU needs device: its GPU',
    );
    // The host trainer's device accessors say what to use instead.
    const trainer = await DataParallelTrainer.create({ comm: local, params, mode: 'pipe-sgd', optimizer: sgd });
    t.equal(trainer.device, 'cpu');
    t.match(await failure(() => trainer.deviceGrads), /ERR_INVALID_ARGUMENT: DataParallelTrainer\.deviceGrads: .*computes on the host .*use trainer\.grads/);
    t.match(await failure(() => trainer.deviceForwardWeights), /ERR_INVALID_ARGUMENT: .*use trainer\.forwardWeights/);
    t.match(await failure(() => trainer.deviceWeights), /ERR_INVALID_ARGUMENT: .*use trainer\.params\.weights/);
    await trainer.copyToHost(); // nothing to copy over a host backend
    await trainer.dispose();
    params.dispose();
  } finally {
    local.destroy();
  }
});

// ---- The device path: an MLP trained through the trainer on the device against the CPU path.

const sizes = [...MLP_SIZES];
const batch = MLP_BATCH;
const [sgd, adam, buckets] = [MLP_SGD, MLP_ADAM, MLP_BUCKETS];
const cases = ncclTrainerCases<Options['optimizer']>(sgd, adam, buckets);
const STEPS = 50;
const NAN_AT = 20;
// cuBLAS and the device kernels contract multiply-adds into FMAs and sum in another order than the
// CPU: a few ulps per operation (the model-operation test's 1e-4 relative, plus 1e-5 absolute for
// weights near zero). On the CUDA plugin over host memory the arithmetic is the CPU's.
const REL = 1e-4;
const ABS = 1e-5;

const data = mlpData(NAN_AT);
const batches = data.batches;
const runHost = (model: MLP, trainer: Trainer, from: number, steps: number): Promise<Trace> => runHostTrace(model, trainer, data, from, steps);
const runDevice = (model: MLP, trainer: Trainer, from: number, steps: number): Promise<Trace> => runDeviceTrace(model, trainer, data, from, steps);
const worstOf = (a: Float32Array[], b: Float32Array[]): number => worstOfSteps(a, b, ABS, REL);

gpuTest(`an MLP trained ${STEPS} steps through device gradients equals the CPU path (trainer over local) in every mode`, async (t) => {
  const { comm, close } = await oneRankNccl();
  const local = await LocalCommunicator.create({ group: `device-trainer-${process.pid}`, rank: 0, size: 1 });
  try {
    for (const [name, config] of cases) {
      const hostModel = new MLP(sizes, { seed: 3 });
      const host = await DataParallelTrainer.create({ ...config, comm: local, params: hostModel.params, model: hostModel } as Options);
      const makeDevice = async (): Promise<{ model: MLP; trainer: Trainer; init: Float32Array }> => {
        const model = new MLP(sizes, { seed: 3, device: 'cuda:0' });
        const trainer = await DataParallelTrainer.create({ ...config, comm, params: model.params, model, device: 'cuda:0' } as Options);
        return { model, trainer, init: model.params.weights.array.slice() };
      };
      const dev = await makeDevice();
      t.equal(dev.trainer.device, 'cuda:0', `${name}: the trainer reports its device`);
      t.equal(dev.trainer.overlapped, host.overlapped, `${name}: overlapped alike (${host.overlapped})`);
      t.match(await failure(() => dev.trainer.grads), /ERR_INVALID_ARGUMENT: .*live on cuda:0; the backward pass writes trainer\.deviceGrads/, `${name}: trainer.grads says to use deviceGrads`);
      t.match(await failure(() => dev.trainer.forwardWeights), /ERR_INVALID_ARGUMENT: .*reads trainer\.deviceForwardWeights/, `${name}: trainer.forwardWeights says to use deviceForwardWeights`);

      const [d, h] = [await runDevice(dev.model, dev.trainer, 0, STEPS), await runHost(hostModel, host, 0, STEPS)];
      t.same(d.results, h.results, `${name}: the same steps applied, skipped (the NaN of step ${NAN_AT}) and counted`);
      t.ok(h.results.some((r) => !(r as { applied: boolean }).applied && (r as { nonFiniteCount: number }).nonFiniteCount === 1), `${name}: the NaN step was skipped`);
      let worstLoss = 0;
      for (let s = 0; s < STEPS; s++) worstLoss = Math.max(worstLoss, Math.abs(d.losses[s]! - h.losses[s]!) / (ABS + REL * Math.abs(h.losses[s]!)));
      t.ok(worstLoss <= 1, `${name}: the losses of every step agree (worst ${worstLoss.toFixed(3)} of ${REL} relative)`);
      const worstForward = worstOf(d.forward, h.forward);
      t.ok(worstForward <= 1, `${name}: the weights every forward pass read agree (worst ${worstForward.toFixed(3)} of ${REL} relative + ${ABS})`);
      const worstWeights = worstOf(d.weights, h.weights);
      t.ok(worstWeights <= 1, `${name}: the weights after every step agree (worst ${worstWeights.toFixed(3)} of tolerance)`);
      t.same(dev.model.params.weights.array, dev.init, `${name}: the host ParamSet was not written during ${STEPS} steps (nothing staged through the host)`);

      // Export with an update in flight, resume in a fresh device trainer: the two continue alike, bit for bit.
      const state = await dev.trainer.exportState();
      t.same(state.weights, d.weights[STEPS - 1], `${name}: exportState holds the device weights`);
      const resumed = await makeDevice();
      resumed.trainer.importState(state);
      const [a, b] = [await runDevice(dev.model, dev.trainer, STEPS, 10), await runDevice(resumed.model, resumed.trainer, STEPS, 10)];
      t.same(b.weights, a.weights, `${name}: the resumed trainer continues bit for bit`);
      t.same(b.forward, a.forward, `${name}: with the same forward weights`);
      const h2 = await runHost(hostModel, host, STEPS, 10);

      // flush() applies what is in flight; copyToHost() brings the weights and state to the host ParamSet.
      for (const trainer of [dev.trainer, resumed.trainer, host]) await trainer.flush();
      await dev.trainer.copyToHost();
      const copied = worstError(dev.model.params.weights.array, hostModel.params.weights.array, ABS, REL).ratio;
      t.ok(copied <= 1, `${name}: the weights copied back equal the CPU path's after ${STEPS + 10} steps and flush (worst ${copied.toFixed(3)} of tolerance)`);
      t.ok(worstOf(a.weights, h2.weights) <= 1, `${name}: and so did every step after the export`);
      const firstState = dev.trainer.optimizer.stateNames[0]!;
      const stateWorst = worstError(dev.trainer.optimizer.stateBuffer(firstState)!.array, host.optimizer.stateBuffer(firstState)!.array, ABS, REL).ratio;
      t.ok(stateWorst <= 1, `${name}: the optimizer's ${firstState} copied back agrees (worst ${stateWorst.toFixed(3)} of tolerance)`);

      for (const [model, trainer] of [[dev.model, dev.trainer], [resumed.model, resumed.trainer], [hostModel, host]] as const) {
        await trainer.dispose();
        model.dispose();
      }
    }
  } finally {
    local.destroy();
    await close();
  }
});

/**
 * The gradient of the mean softmax cross-entropy of batch `s` at the flat weights `w` (the
 * ParamSet's layout), in double by the plain references (test/reference/pipeline.ts), independent
 * of the model operations; with the NaN the runs inject at flat element 5 on step NAN_AT.
 */
function referenceGradient(params: ParamSet, w: Float32Array, s: number): Float32Array {
  const layers = sizes.slice(1).flatMap((out, i) => {
    const linear = { kind: 'linear' as const, in: sizes[i]!, out };
    return i + 2 < sizes.length ? [linear, { kind: 'relu' as const }] : [linear];
  });
  const slice = (name: string): Float32Array => {
    const l = params.layout(name);
    return w.slice(l.offset, l.offset + l.size);
  };
  let linear = 0;
  const weights: RefPartWeights = layers.map((l) => (l.kind === 'relu' ? null : { w: slice(`layer${linear}.weight`), b: slice(`layer${linear++}.bias`) }));
  const { x, labels } = batches[s % batches.length]!;
  const fwd = refForward(layers, weights, Float64Array.from(x), batch);
  const { grad } = refLoss(fwd.outputs[layers.length - 1]!, labels, batch, sizes[sizes.length - 1]!);
  const { grads } = refBackward(layers, weights, fwd, grad, batch);
  const flat = new Float32Array(params.length);
  linear = 0;
  for (const g of grads) {
    if (!g) continue;
    flat.set(g.w, params.layout(`layer${linear}.weight`).offset);
    flat.set(g.b, params.layout(`layer${linear++}.bias`).offset);
  }
  if (s === NAN_AT) flat[5] = Number.NaN;
  return flat;
}

gpuTest('device gradients against the float64 references: sync applies each gradient at once, pipe-sgd one update late', async (t) => {
  const { comm, close } = await oneRankNccl();
  try {
    for (const mode of ['sync', 'pipe-sgd'] as const) {
      const model = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      const reference = new ReferenceOptimizer(
        { optimizer: 'sgd', lr: sgd.lr, momentum: sgd.momentum, weightDecay: 0, dampening: 0, nesterov: false, beta1: 0.9, beta2: 0.999, eps: 1e-8, gradScale: 1 },
        model.params.weights.array,
      );
      const trainer = await DataParallelTrainer.create({ mode, optimizer: sgd, comm, params: model.params, model, device: 'cuda:0', ...buckets });
      const d = await runDevice(model, trainer, 0, STEPS);
      let worst = 0;
      const applied: boolean[] = [];
      for (let s = 0; s < STEPS; s++) {
        // The gradient applied at step s: computed at the weights step s's forward read (sync), or step s-1's (pipe-sgd).
        const from = mode === 'sync' ? s : s - 1;
        if (from >= 0) applied.push(reference.step(referenceGradient(model.params, d.forward[from]!, from)));
        worst = Math.max(worst, worstError(d.weights[s]!, reference.w, ABS, REL).ratio);
      }
      t.same(d.results.map((r) => (r as { applied: boolean }).applied), mode === 'sync' ? applied : [false, ...applied], `${mode}: the same updates applied (the NaN one skipped)`);
      t.ok(worst <= 1, `${mode}: the weights after every step equal the reference's (worst ${worst.toFixed(3)} of ${REL} relative + ${ABS})`);
      await trainer.dispose();
      model.dispose();
    }
  } finally {
    await close();
  }
});

// Loss scaling and the overflow recheck, with a gradient written into the device buffer from the
// host (a stand-in for a backward pass that depends on the weights read and on the step).
gpuTest('device gradients written directly: loss scaling and the overflow recheck as the trainer over local', async (t) => {
  const { comm, close } = await oneRankNccl();
  const local = await LocalCommunicator.create({ group: `device-trainer-direct-${process.pid}`, rank: 0, size: 1 });
  const spec = { w: [37, 11], b: [11] };
  const probe = new ParamSet(spec);
  const n = probe.length;
  probe.dispose();
  const init = fillUniform(new Float32Array(n), rng(31));
  const target = fillUniform(new Float32Array(n), rng(32));
  const gradient = (w: Float32Array, step: number): Float32Array => Float32Array.from(w, (x, i) => (x - target[i]!) * (1 + 0.25 * Math.sin(step + i)));
  const run = async (trainer: Trainer, steps: number, edit: (g: Float32Array, step: number) => void) => {
    const trace = { weights: [] as Float32Array[], results: [] as unknown[] };
    const onDevice = trainer.device !== 'cpu';
    for (let step = 0; step < steps; step++) {
      const forward = onDevice ? trainer.deviceForwardWeights.copyToHost(new Float32Array(n)) : trainer.forwardWeights.array.slice();
      const g = gradient(forward, step).map((x) => x * trainer.lossScale);
      edit(g, step);
      if (onDevice) trainer.deviceGrads.copyFromHost(g);
      else trainer.grads.array.set(g);
      const r = await trainer.step();
      trace.results.push({ applied: r.applied, updated: r.updated, nonFiniteCount: r.nonFiniteCount });
      trace.weights.push(onDevice ? trainer.deviceWeights.copyToHost(new Float32Array(n)) : trainer.params.weights.array.slice());
    }
    await trainer.flush();
    return trace;
  };
  const make = async (config: Omit<Options, 'comm' | 'params'>, onDevice: boolean): Promise<Trainer> => {
    const params = new ParamSet(spec);
    params.weights.array.set(init);
    return DataParallelTrainer.create({ ...config, params, ...(onDevice ? { comm, device: 'cuda:0' } : { comm: local }) } as Options);
  };
  try {
    const scenarios: [string, Omit<Options, 'comm' | 'params'>, number, (g: Float32Array, step: number) => void][] = [
      // A NaN backs the scale off; growthInterval 5 grows it again.
      ['sapipe-wp + DC, Adam, loss scaling', { mode: 'sapipe-wp', optimizer: adam, compensation: {}, lossScaling: { initScale: 1024, growthInterval: 5 }, ...buckets }, 30, (g, s) => s === 12 && (g[3] = Number.NaN)],
      // A finite 3e38: skipped for the overflow risk, rechecked and applied, as the host applies it.
      ...(['sync', 'pipe-sgd', 'sapipe-wp'] as const).map((mode): [string, Omit<Options, 'comm' | 'params'>, number, (g: Float32Array, step: number) => void] => [
        `${mode}, a gradient of 3e38`,
        { mode, optimizer: { kind: 'sgd', lr: 1e-30 }, ...buckets },
        4,
        (g, s) => s === 1 && (g[7] = 3e38),
      ]),
    ];
    for (const [name, config, steps, edit] of scenarios) {
      const [onDevice, onHost] = [await make(config, true), await make(config, false)];
      const [d, h] = [await run(onDevice, steps, edit), await run(onHost, steps, edit)];
      t.same(d.results, h.results, `${name}: the same steps applied, skipped and counted`);
      const skipped = h.results.filter((r) => (r as { updated: boolean }).updated && !(r as { applied: boolean }).applied).length;
      t.equal(skipped, config.lossScaling ? 1 : 0, `${name}: ${config.lossScaling ? 'the NaN step was skipped' : 'every update applied'}`);
      t.equal(onDevice.lossScale, onHost.lossScale, `${name}: the same loss scale after (${onHost.lossScale})`);
      t.ok(worstOf(d.weights, h.weights) <= 1, `${name}: the weights after every step agree`);
      for (const trainer of [onDevice, onHost]) {
        await trainer.dispose();
        trainer.params.dispose();
      }
    }
  } finally {
    local.destroy();
    await close();
  }
});

gpuTest('device gradients: what cannot run is refused with a typed error that says what to do', async (t) => {
  const { comm, close } = await oneRankNccl();
  try {
    const refused: [string, Partial<Options>, RegExp][] = [
      ['another GPU than the communicator', { device: 'cuda:1' }, /ERR_INVALID_ARGUMENT: .*device 'cuda:1' is not the nccl communicator's \(cuda:0\); pass device: comm\.device/],
      ['accumulationSteps', { device: 'cuda:0', accumulationSteps: 2 }, /ERR_INVALID_ARGUMENT: .*accumulationSteps is not offered with device gradients/],
      ['clipGradNorm', { device: 'cuda:0', mode: 'pipe-sgd', clipGradNorm: 1 }, /ERR_BACKEND_UNAVAILABLE: .*clipGradNorm/],
      ["the 'local' estimate", { device: 'cuda:0', mode: 'sapipe-wp', estimate: 'local' }, /ERR_BACKEND_UNAVAILABLE: .*staleness-1 modes run only with the overlapped update/],
      ["update 'sharded'", { device: 'cuda:0', update: 'sharded' }, /ERR_BACKEND_UNAVAILABLE: .*sharded/],
    ];
    for (const [what, config, pattern] of refused) {
      const params = new ParamSet({ w: [5, 3] });
      t.match(await failure(() => DataParallelTrainer.create({ mode: 'sync', optimizer: sgd, ...config, comm, params } as Options)), pattern, `${what} is refused`);
      params.dispose();
    }
    // A host model with device gradients, and a device model without them.
    const hostModel = new MLP([5, 3]);
    t.match(
      await failure(() => DataParallelTrainer.create({ mode: 'sync', optimizer: sgd, comm, params: hostModel.params, model: hostModel, device: 'cuda:0' })),
      /ERR_INVALID_ARGUMENT: .*options\.model computes on the host, but device is 'cuda:0'; build the model with \{ device: 'cuda:0' \}/,
      'a host model with device gradients',
    );
    hostModel.dispose();
    const deviceModel = new MLP([5, 3], { device: 'cuda:0' });
    t.match(
      await failure(() => DataParallelTrainer.create({ mode: 'sync', optimizer: sgd, comm, params: deviceModel.params, model: deviceModel })),
      /ERR_INVALID_ARGUMENT: .*options\.model computes on cuda:0, but the trainer's device is 'cpu'; pass device: 'cuda:0'/,
      'a device model without device gradients',
    );
    // zeroGrad() zeroes the device gradient; a disposed trainer refuses its accessors.
    const trainer = await DataParallelTrainer.create({ mode: 'pipe-sgd', optimizer: sgd, comm, params: deviceModel.params, model: deviceModel, device: 'cuda:0' });
    trainer.deviceGrads.copyFromHost(new Float32Array(trainer.params.length).fill(1));
    trainer.zeroGrad();
    t.equal(trainer.deviceGrads.copyToHost().reduce((a, x) => a + Math.abs(x), 0), 0, 'zeroGrad zeroes the device gradient');
    await trainer.dispose();
    t.match(await failure(() => trainer.deviceGrads), /ERR_DISPOSED: .*create a new one/, 'a disposed trainer refuses deviceGrads');
    t.match(await failure(() => trainer.copyToHost()), /ERR_DISPOSED/, 'and copyToHost');
    deviceModel.dispose();
  } finally {
    await close();
  }
});
