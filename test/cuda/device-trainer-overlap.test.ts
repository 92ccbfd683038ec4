/**
 * DataParallelTrainer with device gradients reducing each bucket behind the model's backward pass
 * (`overlapBackward`): the MLP reports each layer's gradients as it enqueues them, the trainer
 * records each bucket's event once all of it is enqueued, and the NCCL step's reduction of the
 * bucket waits for that event on the GPU. Against the path that waits for the whole backward
 * (`overlapBackward: false`) and against the trainer over `local` on the host, every mode, several
 * buckets, many steps: what runs when changes, not what is computed. On the CUDA plugin over host
 * memory (test/cuda/emulated.test.ts) the arithmetic is the CPU's and the results are equal; that
 * plugin also refuses a step whose bucket events were not all recorded, which is the order a GPU
 * cannot check (a wait on an event never recorded returns at once). The argument checks run everywhere.
 */
import t from 'tap';

import { LocalCommunicator } from '../../dist/comm/local.js';
import { bucketRanges } from '../../dist/comm/buckets.js';
import { DataParallelTrainer } from '../../dist/dataparallel/trainer.js';
import { cudaStatus, DeviceEvents, DeviceParamSet } from '../../dist/device/index.js';
import { MLP } from '../../dist/nn/mlp.js';
import { Sequential, mlpLayers } from '../../dist/nn/sequential.js';
import type { GradientListener } from '../../dist/nn/gradient-listener.js';
import { SGD } from '../../dist/optim/sgd.js';
import { FlatBuffer, ParamSet } from '../../dist/tensor.js';
import { failure, gpuTest, oneRankNccl, mlpData, MLP_ADAM, MLP_BATCH, MLP_BUCKETS, MLP_SGD, MLP_SIZES, ncclTrainerCases, runDevice as runDeviceTrace, runHost as runHostTrace, worstOf, type Trace } from '../helpers/nccl-trainer.js';
import { fillUniform, rng } from '../helpers/random.js';

type Options = Parameters<typeof DataParallelTrainer.create>[0];
type Trainer = Awaited<ReturnType<typeof DataParallelTrainer.create>>;

// The host-memory plugin computes with the CPU's kernels: there the device paths equal the host's.
const emulated = cudaStatus().available && (cudaStatus().architectures ?? '').includes('host-memory');

// ---- Argument checks: refused before any device or collective is touched.

t.test('overlapBackward and the gradient listener are checked, with messages that say what to do', async (t) => {
  const local = await LocalCommunicator.create({ group: `overlap-args-${process.pid}`, rank: 0, size: 1 });
  const sgd = { kind: 'sgd', lr: 0.1 } as const;
  try {
    const model = new MLP([3, 2]);
    t.match(
      await failure(() => DataParallelTrainer.create({ comm: local, params: model.params, model, mode: 'sync', optimizer: sgd, overlapBackward: 'yes' as unknown as boolean })),
      /ERR_INVALID_ARGUMENT: .*overlapBackward must be a boolean, got/,
      'overlapBackward must be a boolean',
    );
    t.match(
      await failure(() => DataParallelTrainer.create({ comm: local, params: model.params, model, mode: 'sync', optimizer: sgd, overlapBackward: true })),
      /ERR_INVALID_ARGUMENT: .*overlapBackward is for device gradients/,
      'overlapBackward with host gradients is refused',
    );
    const trainer = await DataParallelTrainer.create({ comm: local, params: model.params, model, mode: 'sync', optimizer: sgd, overlapBackward: false });
    t.equal(trainer.overlapsBackward, false, 'a host trainer does not follow the backward');
    await trainer.dispose();
    for (const m of [model, new Sequential(mlpLayers([3, 2]))]) {
      t.match(await failure(() => m.setGradientListener(42 as unknown as GradientListener)), /ERR_INVALID_ARGUMENT: .*setGradientListener: listener must be a function or undefined, got 42/, `${m.constructor.name}: the listener must be a function`);
      m.setGradientListener(undefined);
    }
    model.dispose();
  } finally {
    local.destroy();
  }
});

t.test('the backward passes report every layer, from the last to the first, with exact ranges (CPU)', async (t) => {
  const mlp = new MLP([5, 6, 4, 3], { seed: 1 });
  const heard: Array<[number, number]> = [];
  mlp.setGradientListener((grads, offset, count) => {
    t.equal(grads, mlp.params.grads, 'the buffer the backward writes');
    heard.push([offset, count]);
  });
  mlp.forward(new Float32Array(2 * 5).fill(0.5), 2);
  mlp.loss([0, 2]);
  mlp.backward();
  const expect = (names: string[]): Array<[number, number]> => names.map((n) => [mlp.params.layout(n).offset, mlp.params.layout(n).size]);
  t.same(heard, expect(['layer2.weight', 'layer2.bias', 'layer1.weight', 'layer1.bias', 'layer0.weight', 'layer0.bias']), 'MLP: each tensor once, last layer first');
  mlp.setGradientListener(undefined);
  heard.length = 0;
  mlp.forward(new Float32Array(2 * 5).fill(0.5), 2);
  mlp.loss([0, 2]);
  mlp.backward();
  t.same(heard, [], 'no listener, no reports');
  mlp.dispose();

  const seq = new Sequential(mlpLayers([5, 6, 3]), { seed: 1 });
  const seqHeard: string[] = [];
  const names = new Map(seq.params.names.map((n) => [seq.params.layout(n).offset, n]));
  seq.setGradientListener((_grads, offset, count) => {
    t.equal(count, seq.params.layout(names.get(offset)!).size, 'a whole tensor');
    seqHeard.push(names.get(offset)!);
  });
  const input = FlatBuffer.allocate(2 * 5);
  input.array.fill(0.5);
  const gradOut = FlatBuffer.allocate(2 * 3);
  gradOut.array.fill(0.1);
  seq.forward(0, input, 2, seq.params.weights);
  seq.backward(0, gradOut, { grads: seq.params.grads, inputGrad: false });
  t.same(seqHeard, ['layer2.weight', 'layer2.bias', 'layer0.weight', 'layer0.bias'], 'Sequential: each tensor once, last layer first');
  // A split backward reports when weightGrad writes the gradients.
  seqHeard.length = 0;
  seq.forward(1, input, 2, seq.params.weights);
  seq.backward(1, gradOut, { grads: seq.params.grads, inputGrad: false, weightGrad: false });
  t.same(seqHeard, [], 'a split backward reports nothing before weightGrad');
  seq.weightGrad(1, { grads: seq.params.grads });
  t.same(seqHeard.sort(), ['layer0.bias', 'layer0.weight', 'layer2.bias', 'layer2.weight'], 'weightGrad reports every tensor it writes');
  for (const b of [input, gradOut]) b.dispose();
  seq.dispose();
  t.end();
});

// ---- The device path.

const sizes = [...MLP_SIZES];
const batch = MLP_BATCH;
const [sgd, adam, buckets] = [MLP_SGD, MLP_ADAM, MLP_BUCKETS];
const cases = ncclTrainerCases<Options['optimizer']>(sgd, adam, buckets);
const STEPS = 40;
const NAN_AT = 15;
// Against the host: cuBLAS and the device kernels round differently from the CPU (a few ulps per
// operation); on the host-memory plugin the arithmetic is the CPU's and the results are equal.
const [REL, ABS] = [1e-4, 1e-5];
const data = mlpData(NAN_AT);
const batches = data.batches;
const runHost = (model: MLP, trainer: Trainer, steps: number): Promise<Trace> => runHostTrace(model, trainer, data, 0, steps);
const runDevice = (model: MLP, trainer: Trainer, steps: number, after?: (step: number) => void): Promise<Trace> => runDeviceTrace(model, trainer, data, 0, steps, after);

gpuTest(`every mode, ${STEPS} steps: each bucket reduced behind the backward equals one wait for the whole backward, and the trainer over local`, async (t) => {
  const { comm, close } = await oneRankNccl();
  const local = await LocalCommunicator.create({ group: `overlap-${process.pid}`, rank: 0, size: 1 });
  try {
    t.ok(bucketRanges(new MLP(sizes).params.length, buckets.bucketBytes, buckets.firstBucketBytes).length >= 4, 'several buckets');
    for (const [name, config] of cases) {
      const hostModel = new MLP(sizes, { seed: 3 });
      const host = await DataParallelTrainer.create({ ...config, comm: local, params: hostModel.params, model: hostModel } as Options);
      const follow = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      const following = await DataParallelTrainer.create({ ...config, comm, params: follow.params, model: follow, device: 'cuda:0' } as Options);
      const wait = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      const waiting = await DataParallelTrainer.create({ ...config, comm, params: wait.params, model: wait, device: 'cuda:0', overlapBackward: false } as Options);
      t.equal(following.overlapsBackward, true, `${name}: an MLP's backward is followed by default`);
      t.equal(waiting.overlapsBackward, false, `${name}: overlapBackward: false waits for the whole backward`);
      const f = await runDevice(follow, following, STEPS);
      const w = await runDevice(wait, waiting, STEPS);
      const h = await runHost(hostModel, host, STEPS);
      t.same(f.results, w.results, `${name}: the same steps applied, skipped (the NaN of step ${NAN_AT}) and counted`);
      t.ok(f.results.some((r) => !(r as { applied: boolean }).applied && (r as { nonFiniteCount: number }).nonFiniteCount === 1), `${name}: the NaN step was skipped`);
      t.same(f.losses, w.losses, `${name}: the same loss every step, bit for bit`);
      t.same(f.forward, w.forward, `${name}: the same forward weights every step, bit for bit`);
      t.same(f.weights, w.weights, `${name}: the same weights after every step, bit for bit`);
      t.same(f.results, h.results, `${name}: the same steps as the trainer over local`);
      if (emulated) {
        t.same(f.weights, h.weights, `${name}: on the host-memory plugin, the weights of the trainer over local, bit for bit`);
        t.same(f.losses, h.losses, `${name}: and its losses`);
      } else {
        const worst = worstOf(f.weights, h.weights, ABS, REL);
        t.ok(worst <= 1, `${name}: the weights of the trainer over local within ${REL} relative + ${ABS} (worst ${worst.toFixed(3)} of it)`);
      }
      for (const [model, trainer] of [[follow, following], [wait, waiting], [hostModel, host]] as const) {
        await trainer.flush();
        await trainer.dispose();
        model.dispose();
      }
    }
  } finally {
    local.destroy();
    await close();
  }
});

/** An MLP whose reports go through `filter` (to plant a backward that reports wrongly). */
function reporting(model: MLP, filter: (report: GradientListener, grads: unknown, offset: number, count: number) => void): MLP {
  return new Proxy(model, {
    get(target, key) {
      if (key === 'setGradientListener')
        return (listener: GradientListener | undefined) => target.setGradientListener(listener && ((g, o, c) => filter(listener, g, o, c)));
      const v = Reflect.get(target, key) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

gpuTest('a backward reported in another order, twice, or after zeroGrad gives the same results; an incomplete one is refused, not reduced early', async (t) => {
  const { comm, close } = await oneRankNccl();
  const STEPS_HERE = 8;
  try {
    for (const mode of ['sync', 'sapipe-dc'] as const) {
      const config = { mode, optimizer: sgd, ...buckets };
      const wait = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      const waiting = await DataParallelTrainer.create({ ...config, comm, params: wait.params, model: wait, device: 'cuda:0', overlapBackward: false });
      const expected = await runDevice(wait, waiting, STEPS_HERE);

      // Reports held back and replayed first layer first: each bucket still complete before its step.
      const base = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      const tensors = base.params.names.length;
      let held: Array<[GradientListener, unknown, number, number]> = [];
      const reversed = reporting(base, (report, g, o, c) => {
        held.push([report, g, o, c]);
        if (held.length < tensors) return;
        for (const [r, gg, oo, cc] of held.reverse()) r(gg as never, oo, cc);
        held = [];
      });
      const trainer = await DataParallelTrainer.create({ ...config, comm, params: base.params, model: reversed, device: 'cuda:0' });
      t.equal(trainer.overlapsBackward, true, `${mode}: follows the backward`);
      t.same((await runDevice(reversed, trainer, STEPS_HERE)).weights, expected.weights, `${mode}: reports in reverse order, the same weights`);
      await trainer.dispose();
      base.dispose();

      // One report of the whole gradient, padding included, once the last tensor is enqueued.
      const whole = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      let seen = 0;
      const once = reporting(whole, (report, g, _o, _c) => {
        if (++seen % tensors === 0) report(g as never, 0, whole.params.length);
      });
      const onceTrainer = await DataParallelTrainer.create({ ...config, comm, params: whole.params, model: once, device: 'cuda:0' });
      t.same((await runDevice(once, onceTrainer, STEPS_HERE)).weights, expected.weights, `${mode}: one report spanning every bucket and the padding, the same weights`);
      await onceTrainer.dispose();
      whole.dispose();

      // A second backward before the step (a new pass: every bucket reported again), and zeroGrad then backward.
      for (const [what, zero] of [
        ['twice', false],
        ['after zeroGrad', true],
      ] as const) {
        const m = new MLP(sizes, { seed: 3, device: 'cuda:0' });
        const tr = await DataParallelTrainer.create({ ...config, comm, params: m.params, model: m, device: 'cuda:0' });
        const again = (step: number): void => {
          const { x, labels } = batches[step % batches.length]!;
          if (zero) tr.zeroGrad();
          m.forwardLogits(x, batch, tr.deviceForwardWeights);
          m.loss(labels, { read: false });
          m.backward(tr.deviceGrads);
        };
        t.same((await runDevice(m, tr, STEPS_HERE, again)).weights, expected.weights, `${mode}: a backward ${what}, the same weights`);
        await tr.dispose();
        m.dispose();
      }

      // A second trainer of the same model, the first disposed after it was made: the second
      // keeps its listener.
      const shared = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      const first = await DataParallelTrainer.create({ ...config, comm, params: shared.params, model: shared, device: 'cuda:0' });
      const second = await DataParallelTrainer.create({ ...config, comm, params: shared.params, model: shared, device: 'cuda:0' });
      await first.dispose();
      t.same((await runDevice(shared, second, STEPS_HERE)).weights, expected.weights, `${mode}: a model's second trainer keeps following its backward once the first is disposed`);
      await second.dispose();
      shared.dispose();

      // One layer's weight never reported: the step is refused before anything is reduced.
      const partial = new MLP(sizes, { seed: 3, device: 'cuda:0' });
      const skipped = partial.params.layout('layer0.weight').offset;
      const dropping = reporting(partial, (report, g, o, c) => {
        if (o !== skipped) report(g as never, o, c);
      });
      const refusing = await DataParallelTrainer.create({ ...config, comm, params: partial.params, model: dropping, device: 'cuda:0' });
      const before = refusing.deviceWeights.copyToHost(new Float32Array(partial.params.length));
      dropping.forwardLogits(batches[0]!.x, batch, refusing.deviceForwardWeights);
      dropping.loss(batches[0]!.labels);
      dropping.backward(refusing.deviceGrads);
      t.match(
        await failure(() => refusing.step()),
        /ERR_INVALID_ARGUMENT: DataParallelTrainer\.step: the model's backward pass has not reported every gradient of bucket 0 \(\[0, 32\) of the device gradient\).*overlapBackward: false/,
        `${mode}: a bucket never reported is refused with a typed error naming it`,
      );
      t.same(refusing.deviceWeights.copyToHost(new Float32Array(partial.params.length)), before, `${mode}: and nothing was updated`);
      await refusing.dispose();
      partial.dispose();
      await waiting.dispose();
      wait.dispose();
    }
  } finally {
    await close();
  }
});

gpuTest('the NCCL step refuses events that do not cover every bucket; the host-memory plugin refuses events not recorded', async (t) => {
  const { comm, close } = await oneRankNccl();
  const params = new ParamSet({ w: [37, 11], b: [11] });
  const optimizer = new SGD(params, { lr: 0.1 });
  const set = DeviceParamSet.create(params, { device: 'cuda:0', optimizer });
  try {
    const counts = bucketRanges(set.length, buckets.bucketBytes, buckets.firstBucketBytes);
    const grad = fillUniform(new Float32Array(set.length), rng(5));
    set.grads.copyFromHost(grad);
    const events = DeviceEvents.create(counts.length, { device: 'cuda:0' });
    const few = DeviceEvents.create(counts.length - 1, { device: 'cuda:0' });
    t.match(await failure(() => DeviceEvents.create(0, { device: 'cuda:0' })), /ERR_INVALID_ARGUMENT/, 'at least one event');
    t.match(await failure(() => DeviceEvents.create(2, { device: 'gpu:0' as 'cuda:0' })), /ERR_INVALID_ARGUMENT/, 'a cuda:N device');
    t.match(await failure(() => events.record(counts.length)), /ERR_INVALID_ARGUMENT/, 'an event index past the last');
    for (let i = 0; i < few.count; i++) few.record(i);
    t.match(await failure(() => comm.allreduceAndStepAfter(set, buckets, few)), /ERR_SIZE_MISMATCH: allreduceAndStep: \d+ events for \d+ buckets/, 'one event per bucket');
    for (let i = 0; i < counts.length; i++) if (i !== 1) events.record(i);
    t.match(
      await failure(() => comm.allreduceAndStepAfter(set, buckets, events)),
      /ERR_INVALID_ARGUMENT: allreduceAndStep: the event of bucket 1 was not recorded since the last step/,
      'an event not recorded is refused before anything is queued',
    );
    t.match(await failure(() => comm.allreduceAndStepAfter(set, { ...buckets, update: 'sharded' }, events)), /ERR_INVALID_ARGUMENT: allreduceAndStep: a backward pass's events are for update 'replicated'/, 'no events for the sharded step');
    events.record(1);
    const r = await comm.allreduceAndStepAfter(set, buckets, events);
    t.equal(r.applied, true, 'every event recorded: the step runs');
    t.equal(events.firstUnrecorded(), 0, 'and the events count as waited on');
    t.match(await failure(() => comm.allreduceAndStepAfter(set, buckets, events)), /ERR_INVALID_ARGUMENT: .*bucket 0 was not recorded/, 'so the next step needs them recorded again');
    if (emulated) {
      // A caller whose own bookkeeping is wrong (planted here): the plugin itself refuses to
      // reduce a bucket whose event was not recorded since the last step waited on it.
      (events as unknown as { recorded: boolean[] }).recorded.fill(true);
      const weights = set.weights.copyToHost(new Float32Array(set.length));
      t.match(
        await failure(() => comm.allreduceAndStepAfter(set, buckets, events)),
        /ERR_INVALID_ARGUMENT: allreduceAndStep: fused step after events: the event of bucket 0 was not recorded since the last step waited on it/,
        'the host-memory plugin refuses a bucket whose event was not recorded, with a typed error',
      );
      t.same(set.weights.copyToHost(new Float32Array(set.length)), weights, 'and updates nothing');
    }
    // (On a GPU a wait on an unrecorded event returns at once: only the bookkeeping checked above
    // can refuse it, so the planted case runs on the host-memory plugin alone.)
    for (const e of [events, few]) e.dispose();
    t.match(await failure(() => events.record(0)), /ERR_DISPOSED/, 'disposed events refuse');
  } finally {
    set.dispose();
    optimizer.dispose();
    params.dispose();
    await close();
  }
});
