/**
 * The data-parallel trainer on 3 real worker-thread ranks (one pool for the whole file): every
 * mode's exact sequence of forward weights and updated weights against a step-by-step reference
 * (test/reference/optimizer.ts applied to the all-reduced average with the mode's staleness),
 * checkpoint/resume, overlap of the all-reduce with the next step's computation, and rejected
 * configurations.
 */
import t from 'tap';

import {
  BusyError,
  DataParallelTrainer,
  DisposedError,
  InvalidArgumentError,
  LocalCommunicator,
  ParamSet,
  SizeMismatchError,
  type DataParallelTrainerOptions,
} from '../../dist/index.js';
import type { MISMATCHED, Scenario } from '../fixtures/dataparallel/rank.js';
import { gradientOf, initialWeights, SPEC } from '../fixtures/dataparallel/problem.js';
import { scenarioPool } from '../helpers/scenario-pool.js';
import { ReferenceOptimizer, type RefConfig } from '../reference/optimizer.js';

const N = 3;
const FIXTURE = new URL('../fixtures/dataparallel/rank.ts', import.meta.url);
type Msg = Record<string, unknown>;
type Config = Omit<DataParallelTrainerOptions, 'comm' | 'params'>;

const pool = scenarioPool<Omit<Scenario, 'id' | 'group'>>(FIXTURE, N, 'dp-test');
t.teardown(() => pool.terminate());
const runScenario = (s: Omit<Scenario, 'id' | 'group'>): Promise<Msg[]> => pool.run(s);

const LENGTH = new ParamSet(SPEC).length;
const LR = 0.1;

function refConfig(c: Config): RefConfig {
  const o = c.optimizer as { kind: 'sgd' | 'adam' | 'adamw'; momentum?: number; weightDecay?: number; betas?: [number, number] };
  const dc = c.compensation;
  return {
    optimizer: o.kind,
    lr: LR,
    weightDecay: o.weightDecay ?? 0,
    momentum: o.momentum ?? 0,
    dampening: 0,
    nesterov: false,
    beta1: o.betas?.[0] ?? 0.9,
    beta2: o.betas?.[1] ?? 0.999,
    eps: 1e-8,
    gradScale: 1,
    ...(c.mode === 'sapipe-dc' || (c.mode === 'sapipe-wp' && dc) ? { compensation: { kind: 'elementwise' as const, lambda: dc?.lambda ?? 0.2, eps: 1e-7 } } : {}),
    ...(c.mode === 'sapipe-wp' ? { prediction: { kind: 'shadow' as const, estimate: c.estimate!, compensate: dc !== undefined, n: N, localScale: 1 } } : {}),
  };
}

/**
 * The reference run of the training loop: one reference optimizer per rank (real weights agree on
 * every rank; predicted weights differ when the estimate reads the local gradient). The average is
 * formed in fp32 like the all-reduce; `staleness` delays its application by one step, and the
 * first pipelined step only stores it.
 */
function reference(c: Config, steps: number, staleness: 0 | 1, flush: boolean): { forward: Float32Array[][]; weights: Float32Array[]; final: Float32Array } {
  const w0 = initialWeights(LENGTH, 0);
  const refs = Array.from({ length: N }, () => new ReferenceOptimizer(refConfig(c), w0));
  const forward: Float32Array[][] = Array.from({ length: N }, () => []);
  const weights: Float32Array[] = [];
  let pending: Float32Array | undefined;
  let lastLocal: Float32Array[] = [];
  for (let step = 0; step < steps; step++) {
    const fwd = refs.map((ref) => (c.mode === 'sapipe-wp' ? ref.predicted : ref.w).slice());
    fwd.forEach((f, r) => forward[r]!.push(f));
    const local = fwd.map((f, r) => gradientOf(f, r, step));
    const avg = new Float32Array(LENGTH);
    for (let i = 0; i < LENGTH; i++) {
      let s = 0;
      for (let r = 0; r < N; r++) s = Math.fround(s + local[r]![i]!);
      avg[i] = Math.fround(s * Math.fround(1 / N));
    }
    if (staleness === 0) refs.forEach((ref) => ref.step(avg));
    else {
      if (pending) refs.forEach((ref, r) => ref.step(pending!, local[r]));
      pending = avg;
    }
    lastLocal = local;
    weights.push(refs[0]!.w.slice());
  }
  if (flush && pending) refs.forEach((ref, r) => ref.step(pending!, lastLocal[r]));
  return { forward, weights, final: refs[0]!.w.slice() };
}

// fp32 kernels against a double-precision reference over a few steps: rounding only.
const ATOL = 1e-5;
const RTOL = 1e-5;
function worst(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let w = 0;
  for (let i = 0; i < want.length; i++) w = Math.max(w, Math.abs(got[i]! - want[i]!) / (ATOL + RTOL * Math.abs(want[i]!)));
  return w;
}
function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

const sgd = { kind: 'sgd', lr: LR, momentum: 0.9 } as const;
const CASES: [string, Config][] = [
  ['sync', { mode: 'sync', optimizer: sgd }],
  ['pipe-sgd', { mode: 'pipe-sgd', optimizer: sgd }],
  ['sapipe-dc', { mode: 'sapipe-dc', optimizer: sgd, compensation: { lambda: 0.5 } }],
  ['sapipe-wp local', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'local' }],
  ['sapipe-wp prev-sync', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'prev-sync' }],
  ['sapipe-wp local-prev-sync', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'local-prev-sync' }],
  ['sapipe-wp local + DC', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'local', compensation: { lambda: 0.5 } }],
  ['sapipe-wp prev-sync + DC', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'prev-sync', compensation: { lambda: 0.5 } }],
  ['sapipe-wp local-prev-sync + DC', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'local-prev-sync', compensation: { lambda: 0.5 } }],
  ['sapipe-wp local-prev-sync + DC, Adam', { mode: 'sapipe-wp', optimizer: { kind: 'adam', lr: LR }, estimate: 'local-prev-sync', compensation: { lambda: 0.5 } }],
  ['sync, sharded update', { mode: 'sync', optimizer: sgd, update: 'sharded' }],
];
const STEPS = 6;

t.test(`every mode's forward and updated weights match the reference on ${N} ranks (|err| <= ${ATOL} + ${RTOL}*|ref|)`, async (t) => {
  const syncRef = reference(CASES[0]![1], STEPS, 0, true);
  for (const [name, config] of CASES) {
    const staleness = config.mode === 'sync' ? 0 : 1;
    const results = await runScenario({ kind: 'trace', config, steps: STEPS });
    const ref = reference(config, STEPS, staleness, true);
    for (let r = 0; r < N; r++) {
      const m = results[r]!;
      if (!t.notOk(m.error, `${name} rank ${r} ran: ${m.error}`)) continue;
      const forward = m.forward as number[][];
      const weights = m.weights as number[][];
      t.same(m.updated, Array.from({ length: STEPS }, (_, k) => staleness === 0 || k > 0), `${name}: ${staleness ? 'the first step only starts its reduction' : 'every step updates'}`);
      let wf = 0;
      let ww = 0;
      for (let k = 0; k < STEPS; k++) {
        wf = Math.max(wf, worst(forward[k]!, ref.forward[r]![k]!));
        ww = Math.max(ww, worst(weights[k]!, ref.weights[k]!));
      }
      t.ok(wf <= 1, `${name} rank ${r}: forward weights of every step (worst ${wf.toFixed(3)})`);
      t.ok(ww <= 1, `${name} rank ${r}: weights after every step (worst ${ww.toFixed(3)})`);
      t.ok(worst(m.final as number[], ref.final) <= 1, `${name} rank ${r}: flush() applies the gradient in flight`);
    }
    // The comparison can tell the modes apart: a staleness-1 run is far from the sync run.
    if (staleness === 1) t.ok(maxDiff(ref.weights[STEPS - 1]!, syncRef.weights[STEPS - 1]!) > 1e-3, `${name} differs from sync by more than the tolerance`);
  }
  t.ok(maxDiff(reference(CASES[3]![1], STEPS, 1, false).forward[0]![STEPS - 1]!, reference(CASES[3]![1], STEPS, 1, false).forward[1]![STEPS - 1]!) > 1e-4, "the 'local' estimate makes the ranks' forward weights differ");
});

t.test('a checkpoint taken mid-pipeline resumes exactly (gradient in flight included)', async (t) => {
  const config = CASES[8]![1];
  const results = await runScenario({ kind: 'checkpoint', config, steps: STEPS });
  const ref = reference(config, STEPS, 1, false);
  for (let r = 0; r < N; r++) {
    const m = results[r]!;
    if (!t.notOk(m.error, `rank ${r} ran`)) continue;
    t.equal(m.pendingSaved, true, 'the averaged gradient in flight is part of the checkpoint');
    const w = worst(m.weights as number[], ref.weights[STEPS - 1]!);
    t.ok(w <= 1, `rank ${r}: weights after resume equal the uninterrupted reference (worst ${w.toFixed(3)})`);
  }
});

t.test('a sync trainer with the sharded update checkpoints its whole state: resuming with replicated steps continues exactly', async (t) => {
  const config = CASES[CASES.length - 1]![1];
  const results = await runScenario({ kind: 'checkpoint', config, steps: STEPS });
  const ref = reference(config, STEPS, 0, false);
  for (let r = 0; r < N; r++) {
    const m = results[r]!;
    if (!t.notOk(m.error, `rank ${r} ran`)) continue;
    const w = worst(m.weights as number[], ref.weights[STEPS - 1]!);
    t.ok(w <= 1, `rank ${r}: weights after resume equal the uninterrupted reference (worst ${w.toFixed(3)})`);
  }
});

t.test('pipelined modes overlap the all-reduce of step t with the computation of step t+1', async (t) => {
  // Emulated all-reduce of 4 x 40 ms latency on 3 ranks = 160 ms; 200 ms of computation per step.
  // (At 40 ms a loaded machine could deschedule a rank that long between starting the reduction
  // and step() returning, and the reduction would land before the structural check looked.)
  const emulate = { gbps: 100, latencyUs: 40_000 };
  const steps = 8;
  const sync = await runScenario({ kind: 'timing', config: { mode: 'sync', optimizer: sgd, guard: 'deferred' }, steps, computeMs: 200, emulate });
  const pipe = await runScenario({ kind: 'timing', config: { mode: 'sapipe-wp', optimizer: sgd, estimate: 'local-prev-sync', compensation: {} }, steps, computeMs: 200, emulate });
  for (let r = 0; r < N; r++) {
    t.notOk(sync[r]!.error ?? pipe[r]!.error, `rank ${r} ran`);
    const inFlight = pipe[r]!.inFlightAfterStep as boolean[];
    t.ok(inFlight.every(Boolean), 'structurally: every pipelined step() returns with its all-reduce still in flight');
    t.ok((sync[r]!.inFlightAfterStep as boolean[]).every((x) => !x), 'sync steps return with nothing in flight');
    const waited = (pipe[r]!.waitedMs as number[]).slice(1).sort((a, b) => a - b);
    t.ok(waited[Math.floor(waited.length / 2)]! < 80, `the median wait for the previous all-reduce (${waited.map((x) => x.toFixed(1)).join(', ')} ms) is well below its 160 ms: it completed during the computation`);
  }
  const syncMs = Math.max(...sync.map((m) => m.totalMs as number));
  const pipeMs = Math.max(...pipe.map((m) => m.totalMs as number));
  // Ideal: sync 8 x (200 + 160) = 2880 ms, pipelined about 8 x 200 + 160 = 1760 ms.
  t.ok(pipeMs < 0.85 * syncMs, `${steps} pipelined steps took ${pipeMs.toFixed(0)} ms, sync ${syncMs.toFixed(0)} ms`);
});

t.test('a NaN in one rank\'s gradient skips the same update on every rank, and the replicas stay equal', async (t) => {
  for (const config of [CASES[1]![1], CASES[6]![1], CASES[8]![1]]) {
    const results = await runScenario({ kind: 'trace', config, steps: STEPS, nanAt: { rank: 1, step: 2 } });
    const name = `${config.mode} ${config.estimate ?? ''}`;
    for (const m of results) t.notOk(m.error, `${name} ran`);
    // Step 2's gradient is applied at step 3: skipped there, applied everywhere else.
    for (const m of results) t.same(m.updated, [false, true, true, false, true, true], `${name}: only the update applying the NaN gradient is skipped`);
    const w0 = (results[0]!.weights as number[][]).flat();
    t.ok(w0.every(Number.isFinite), `${name}: the weights stay finite`);
    for (let r = 1; r < N; r++) t.same((results[r]!.weights as number[][]).flat(), w0, `${name}: rank ${r} has rank 0's weights after every step`);
    const f = results.map((m) => (m.forward as number[][]).flat());
    t.ok(f.every((x) => x.every(Number.isFinite)), `${name}: forward weights stay finite on every rank`);
  }
});

t.test('ranks whose models differ are ERR_SIZE_MISMATCH on every rank, naming the first tensor that differs', async (t) => {
  // Rank 1's model against SPEC { a: [3, 5], b: [7] }; all but 'extra' and 'fewer' have SPEC's length.
  const expected: Record<Exclude<keyof typeof MISMATCHED, 'renamed'>, RegExp> = {
    extra: /tensor #2 is nothing .* on rank 0 but "extra" \[20\] on rank 1/,
    transposed: /tensor #0 is "a" \[3, 5\] on rank 0 but "a" \[5, 3\] on rank 1/,
    resized: /tensor #1 is "b" \[7\] on rank 0 but "b" \[9\] on rank 1/,
    reordered: /tensor #0 is "a" \[3, 5\] on rank 0 but "b" \[7\] on rank 1/,
    fewer: /tensor #1 is "b" \[7\] on rank 0 but nothing \(its model has 1 tensors\) on rank 1/,
  };
  for (const mismatch of Object.keys(expected) as (keyof typeof expected)[]) {
    for (const mode of ['sync', 'sapipe-wp'] as const) {
      const config: Config = mode === 'sync' ? { mode, optimizer: sgd } : { mode, optimizer: sgd, estimate: 'prev-sync' };
      const results = await runScenario({ kind: 'mismatch', mismatch, config, steps: 0 });
      t.equal(results.length, N, `${mismatch}, ${mode}: every rank answered`);
      for (const m of results) {
        t.equal(m.code, 'ERR_SIZE_MISMATCH', `${mismatch}, ${mode}: ${String(m.message)}`);
        t.match(String(m.message), expected[mismatch], `${mismatch}, ${mode}: the message names the first difference`);
      }
    }
  }
});

t.test('ranks whose tensors are named differently but laid out alike train together (TensorFlow.js names layers per instance)', async (t) => {
  const results = await runScenario({ kind: 'mismatch', mismatch: 'renamed', config: { mode: 'sync', optimizer: sgd }, steps: 0 });
  for (const m of results) t.equal(m.code, 'none', `created: ${String(m.message ?? '')}`);
});

t.test('bad configurations and misuse are rejected with typed errors', async (t) => {
  const comm = await LocalCommunicator.create({ group: `dp-solo-${process.pid}`, rank: 0, size: 1 });
  const params = new ParamSet(SPEC);
  const make = (extra: Record<string, unknown>): Promise<DataParallelTrainer> =>
    DataParallelTrainer.create({ comm, params, mode: 'pipe-sgd', optimizer: sgd, ...extra } as DataParallelTrainerOptions);
  await t.rejects(make({ mode: 'async' }), InvalidArgumentError, 'unknown mode');
  await t.rejects(make({ staleness: 2 }), InvalidArgumentError, 'staleness 2');
  await t.rejects(make({ staleness: 0.5 }), InvalidArgumentError, 'staleness 0.5');
  await t.rejects(make({ mode: 'sync', staleness: 1 }), InvalidArgumentError, 'sync with staleness 1');
  await t.rejects(make({ mode: 'pipe-sgd', update: 'sharded' }), InvalidArgumentError, 'a sharded update in a pipelined mode');
  await t.rejects(make({ mode: 'sync', update: 'halved' as 'sharded' }), InvalidArgumentError, 'an unknown update');
  await t.rejects(make({ staleness: 0 }), InvalidArgumentError, 'a pipelined mode with staleness 0');
  await t.rejects(make({ mode: 'sapipe-dc', compensation: { lambda: -0.1 } }), InvalidArgumentError, 'negative lambda');
  await t.rejects(make({ mode: 'sapipe-dc', compensation: { lambda: Number.NaN } }), InvalidArgumentError, 'NaN lambda');
  await t.rejects(make({ mode: 'sapipe-dc', compensation: { lambda: 1e9 } }), InvalidArgumentError, 'huge lambda');
  await t.rejects(make({ compensation: {} }), InvalidArgumentError, 'compensation in pipe-sgd');
  await t.rejects(make({ mode: 'sapipe-wp', estimate: 'psychic' }), InvalidArgumentError, 'unknown estimate');
  await t.rejects(make({ mode: 'sapipe-wp', estimate: 'local', compensateEstimate: true }), InvalidArgumentError, 'compensateEstimate without compensation');
  await t.rejects(make({ estimate: 'local' }), InvalidArgumentError, 'an estimate outside sapipe-wp');
  await t.rejects(make({ model: { numParams: params.numParams + 1 } }), SizeMismatchError, 'model/ParamSet size mismatch');
  await t.rejects(make({ optimizer: { kind: 'rmsprop', lr: 0.1 } }), InvalidArgumentError, 'unknown optimizer');
  await t.rejects(make({ optimizer: { kind: 'sgd', lr: -1 } }), InvalidArgumentError, 'bad learning rate');
  await t.rejects(make({ comm: {} }), InvalidArgumentError, 'not a communicator');
  await t.rejects(make({ params: {} }), InvalidArgumentError, 'not a ParamSet');

  const trainer = await make({ mode: 'sapipe-wp', estimate: 'prev-sync' });
  t.equal(trainer.staleness, 1);
  const first = trainer.grads;
  trainer.grads.array.set(gradientOf(trainer.forwardWeights.array, 0, 0));
  t.equal((await trainer.step()).updated, false, 'the first pipelined step does not update');
  t.not(trainer.grads, first, 'the next gradient goes to the other buffer while the first is reduced');
  await t.rejects(trainer.exportState().then((s) => trainer.importState(s)), BusyError, 'importing into a trainer with a gradient in flight');
  const second = trainer.step();
  await t.rejects(trainer.step(), BusyError, 'one step at a time');
  t.equal((await second).updated, true, 'the second step updates');
  t.equal(trainer.grads, first, 'and the buffers alternate');
  await trainer.dispose();
  await t.rejects(trainer.step(), DisposedError);
  t.throws(() => trainer.grads, DisposedError);
  params.dispose();
  comm.destroy();
});
