// The cost model that knows the machine: fixed + per-sample fits, stages sharing cores in the
// simulator, the measured costs with the sharing taken out, and the tuner's use of them.
import t from 'tap';

import {
  type PipelineProfile,
  type TimedAction,
  avgpipe,
  costsAt,
  fitPassCost,
  generateSchedule,
  gpipe,
  measuredP2pLatency,
  sharedCoresCosts,
  simulateSchedule,
  simulateSetting,
} from '../../lib/pipeline/index.js';

t.test('fitPassCost recovers fixed + per-sample cost from timings at several micro-batch sizes', async (t) => {
  const exact = fitPassCost([4, 8, 16, 32].map((b) => ({ microBatchSize: b, ms: 0.3 + 0.02 * b })));
  t.ok(Math.abs(exact.fixedMs - 0.3) < 1e-12 && Math.abs(exact.perSampleMs - 0.02) < 1e-12, `exact line: ${JSON.stringify(exact)}`);
  // noise of +-0.01 ms around the same line: least squares stays close
  const noisy = fitPassCost([4, 8, 16, 32].map((b, i) => ({ microBatchSize: b, ms: 0.3 + 0.02 * b + (i % 2 ? 0.01 : -0.01) })));
  t.ok(Math.abs(noisy.fixedMs - 0.3) < 0.02 && Math.abs(noisy.perSampleMs - 0.02) < 0.001, `noisy line: ${JSON.stringify(noisy)}`);
  // two sizes: the line through them
  t.same(fitPassCost([{ microBatchSize: 1, ms: 2 }, { microBatchSize: 3, ms: 4 }]), { fixedMs: 1, perSampleMs: 1 });
  // never negative: a falling line is flat at the mean, a negative intercept goes through the origin
  t.same(fitPassCost([{ microBatchSize: 1, ms: 3 }, { microBatchSize: 2, ms: 1 }]), { fixedMs: 2, perSampleMs: 0 });
  const origin = fitPassCost([{ microBatchSize: 1, ms: 0 }, { microBatchSize: 2, ms: 2 }]);
  t.equal(origin.fixedMs, 0);
  t.ok(Math.abs(origin.perSampleMs - 0.8) < 1e-12, 'sum(b t) / sum(b^2) = 4/5');
  t.throws(() => fitPassCost([{ microBatchSize: 4, ms: 1 }, { microBatchSize: 4, ms: 2 }]), { code: 'ERR_INVALID_ARGUMENT', message: /two or more different/ });
  t.throws(() => fitPassCost([{ microBatchSize: 0, ms: 1 }, { microBatchSize: 4, ms: 2 }]), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => fitPassCost([{ microBatchSize: 2, ms: -1 }, { microBatchSize: 4, ms: 2 }]), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('stages sharing cores: GPipe, 2 stages, 2 micro-batches, by hand', async (t) => {
  const schedule = gpipe({ stages: 2, microBatches: 2 });
  const costs = { forward: 1, backward: 2 };
  // One core. Stage 0's F0 runs alone [0, 1]; then its F1 and stage 1's F0 share the core, each at
  // half speed, [1, 3]; stage 1's F1 alone [3, 4] and B1 alone [4, 6]; then its B0 and stage 0's
  // B1 share [6, 10]; stage 0's B0 alone [10, 12]. 12 = all the work, one core.
  const one = simulateSchedule(schedule, { ...costs, sharedCores: { cores: 1 } });
  t.equal(one.makespan, 12);
  const spans = (s: number): string[] =>
    one.timeline[s]!.filter((x) => x.action.kind === 'forward' || x.action.kind === 'backward').map((x) => `${x.action.kind[0]!.toUpperCase()}${x.action.microBatch}[${x.start},${x.end}]`);
  t.same(spans(0), ['F0[0,1]', 'F1[1,3]', 'B1[6,10]', 'B0[10,12]']);
  t.same(spans(1), ['F0[1,3]', 'F1[3,4]', 'B1[4,6]', 'B0[6,10]']);
  t.same(one.busy, [9, 9], 'busy counts the slowed passes at their length');
  t.ok(Math.abs(one.bubbleFraction - (1 - 18 / 24)) < 1e-12);
  // Two cores, a core per pass: nothing slows, the idealised timeline (makespan 9).
  t.equal(simulateSchedule(schedule, { ...costs, sharedCores: { cores: 2 } }).makespan, 9);
  t.equal(simulateSchedule(schedule, costs).makespan, 9);
  // Two cores, but a pass alone uses both (the kernels' pool): as one core.
  t.equal(simulateSchedule(schedule, { ...costs, sharedCores: { cores: 2, passCores: 2 } }).makespan, 12);
  // 1.5 cores: a lone pass at full speed, two at once each at 3/4: F1 and F0 [1, 1+4/3], B1 and B0 [.., +8/3].
  const partial = simulateSchedule(schedule, { ...costs, sharedCores: { cores: 1.5 } });
  t.ok(Math.abs(partial.makespan - (1 + 4 / 3 + 1 + 2 + 8 / 3 + 2)) < 1e-12, `makespan ${partial.makespan}`);
});

t.test('with a core per thread the shared-cores simulation is the idealised one', async (t) => {
  const costs = { forward: [1, 1.5, 0.7, 2], backward: [2, 2.5, 1.1, 3], p2pLatency: 0.3, optimizerStep: 0.4, allReduce: 1.5 };
  for (const [name, options] of [
    ['gpipe', { stages: 4, microBatches: 8 }],
    ['1f1b', { stages: 4, microBatches: 8 }],
    ['zb-h1', { stages: 4, microBatches: 8 }],
    ['pipedream', { stages: 4, microBatches: 8 }],
    ['avgpipe', { stages: 4, microBatches: 8, pipelines: 2, advance: 3 }],
    ['sapipe', { stages: 4, microBatches: 4 }],
  ] as const) {
    const schedule = generateSchedule(name, options);
    const ideal = simulateSchedule(schedule, name === 'sapipe' ? { ...costs, forward: 1, backward: 2, optimizerStep: 0.4, allReduce: 1.5 } : costs);
    const shared = simulateSchedule(schedule, { ...(name === 'sapipe' ? { ...costs, forward: 1, backward: 2 } : costs), sharedCores: { cores: Infinity } });
    t.ok(Math.abs(ideal.makespan - shared.makespan) < 1e-9, `${name}: ${ideal.makespan} against ${shared.makespan}`);
    const flatIdeal = ideal.timeline.flat();
    const flatShared = shared.timeline.flat();
    t.ok(flatIdeal.every((x, i) => Math.abs(x.start - flatShared[i]!.start) < 1e-9 && Math.abs(x.end - flatShared[i]!.end) < 1e-9), `${name}: every action at the same time`);
  }
});

t.test('parallel pipelines as threads of their own share the cores and conserve work', async (t) => {
  const schedule = avgpipe({ stages: 2, microBatches: 1, pipelines: 2, advance: 0 });
  const costs = { forward: 1, backward: 2 };
  // a core per thread: each pipeline runs alone, F F B B = 6
  t.equal(simulateSchedule(schedule, { ...costs, sharedCores: { cores: Infinity, threads: 'per-pipeline' } }).makespan, 6);
  // one core: some thread can always run, so the makespan is all the work, 2 x 2 x 3
  const one = simulateSchedule(schedule, { ...costs, sharedCores: { cores: 1, threads: 'per-pipeline' } });
  t.ok(Math.abs(one.makespan - 12) < 1e-12);
  t.ok(one.bubbleFraction >= 0 && one.bubbleFraction < 1, 'the idle share counts every thread');
  // the replicas' averaging is one exchange: with a core per thread it adds its cost once
  t.equal(simulateSchedule(schedule, { ...costs, elastic: 0.5, sharedCores: { cores: Infinity, threads: 'per-pipeline' } }).makespan, 6.5);
  // the merged rows (the paper's N pipelines sharing S devices) are one thread per stage
  t.ok(simulateSchedule(schedule, { ...costs, sharedCores: { cores: Infinity } }).makespan > 6);
});

t.test('a message between stages costs the shared cores its CPU time, beside the passes', async (t) => {
  // GPipe, 2 stages, 1 micro-batch, F = B = 1, each message 0.5 of CPU on one core:
  // stage 0's F [0, 1]; stage 1's F starts at 1 beside the activation's 0.5 (each at half speed
  // until the message's work ends at 2), then alone: ends at 2.5; its B [2.5, 3.5]; stage 0's B
  // from 3.5 beside the gradient's 0.5: ends at 5.
  const schedule = gpipe({ stages: 2, microBatches: 1 });
  const costs = { forward: 1, backward: 1 };
  t.equal(simulateSchedule(schedule, { ...costs, sharedCores: { cores: 1 } }).makespan, 4, 'free messages: the passes one after another');
  t.equal(simulateSchedule(schedule, { ...costs, sharedCores: { cores: 1, messageCpu: 0.5 } }).makespan, 5);
  t.equal(simulateSchedule(schedule, { ...costs, sharedCores: { cores: 1, messageCpu: [0.5, 7] } }).makespan, 5, 'part j\'s entry is the message carrying its output (the last part\'s is never sent)');
  t.equal(simulateSchedule(schedule, { ...costs, sharedCores: { cores: 2, messageCpu: 0.5 } }).makespan, 4, 'a core to spare: the message\'s work delays nothing');
  // The message's work delays no one by itself: its travel time is p2pLatency's.
  t.equal(simulateSchedule(schedule, { ...costs, p2pLatency: 0.25, sharedCores: { cores: 2, messageCpu: 0.5 } }).makespan, 4.5);
  // Messages within a stage (every part on one row) are not sent.
  const oneRow = generateSchedule('gpipe', { stages: 1, microBatches: 2 });
  t.equal(simulateSchedule(oneRow, { ...costs, sharedCores: { cores: 1, messageCpu: 0.5 } }).makespan, simulateSchedule(oneRow, { ...costs, sharedCores: { cores: 1 } }).makespan);
  t.throws(() => simulateSchedule(schedule, { sharedCores: { cores: 1, messageCpu: -1 } }), { code: 'ERR_INVALID_ARGUMENT', message: /sharedCores\.messageCpu must be a finite number >= 0/ });
  t.throws(() => simulateSchedule(schedule, { sharedCores: { cores: 1, messageCpu: [1] } }), { code: 'ERR_INVALID_ARGUMENT', message: /one per part/ });
});

t.test('bad sharedCores are refused', async (t) => {
  const schedule = gpipe({ stages: 2, microBatches: 2 });
  t.throws(() => simulateSchedule(schedule, { sharedCores: { cores: 0 } }), { code: 'ERR_INVALID_ARGUMENT', message: /cores must be a number > 0/ });
  t.throws(() => simulateSchedule(schedule, { sharedCores: { cores: 2, passCores: [1] } }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => simulateSchedule(schedule, { sharedCores: { cores: 2, core: 1 } as never }), { code: 'ERR_INVALID_ARGUMENT', message: /core/ });
  t.throws(() => simulateSchedule(schedule, { sharedCores: { cores: 2, threads: 'many' as never } }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => simulateSchedule(schedule, { sharedCores: 2 as never }), { code: 'ERR_INVALID_ARGUMENT' });
});

const timed = (kind: string, stage: number, part: number, microBatch: number, start: number, end: number): TimedAction =>
  ({ action: { kind, stage, part, microBatch, pipeline: 0, version: -1, ...(kind.startsWith('send') || kind.startsWith('recv') ? { peer: kind === 'recvActivation' ? stage - 1 : stage + 1 } : {}) }, start, end, index: 0 }) as unknown as TimedAction;

t.test('measured costs with the sharing taken out, and the latency a waiting receive saw', async (t) => {
  const schedule = gpipe({ stages: 2, microBatches: 1 });
  // stage 0: F0 [0, 1]; stage 1 waits in its receive from 0.5 to 1.2, F0 [1.2, 2.2], B0 [2.2, 4.2] while
  // stage 0's step runs [2.2, 3.2] beside it (two passes at once on one core: each at half speed)
  const timeline = [
    [timed('forward', 0, 0, 0, 0, 1), timed('sendActivation', 0, 0, 0, 1, 1), timed('recvGradient', 0, 0, 0, 1, 4.3), timed('backward', 0, 0, 0, 4.3, 5.3)],
    [timed('recvActivation', 1, 1, 0, 0.5, 1.2), timed('forward', 1, 1, 0, 1.2, 2.2), timed('backward', 1, 1, 0, 2.2, 4.2), timed('sendGradient', 1, 1, 0, 4.2, 4.2)],
  ];
  t.ok(Math.abs(measuredP2pLatency([timeline]) - 0.15) < 1e-12, 'the median of 0.2 (the activation) and 0.1 (the gradient)');
  const stepLine = [[...timeline[0]!, timed('optimizerStep', 0, 0, -1, 2.2, 3.2)], timeline[1]!];
  const costs = sharedCoresCosts(schedule, [stepLine], { cores: 1 });
  const near = (x: unknown, y: number[]): boolean => Array.isArray(x) && x.every((v, i) => Math.abs(v - y[i]!) < 1e-12);
  t.ok(near(costs.forward, [1, 1]));
  t.ok(near(costs.backward, [1, 1.5]), 'stage 1\'s backward shared [2.2, 3.2] with the step: 0.5 + 1');
  t.ok(near(costs.optimizerStep, [0.5, 0]));
  t.same(costs.sharedCores, { cores: 1, passCores: 1 });
  t.same(sharedCoresCosts(schedule, [stepLine], { cores: 1, messageCpu: [0.05, 0] }).sharedCores, { cores: 1, passCores: 1, messageCpu: [0.05, 0] }, 'the messages\' CPU passes through to the simulation');
  // Each message's CPU (0.5) runs from its producer's end and is not the passes' work: the
  // activation's [1, 1.5] shares the core with stage 1's F0 over [1.2, 1.5] (0.15 + 0.7), the
  // gradient's [4.2, 4.7] with stage 0's B0 over [4.3, 4.7] (0.2 + 0.6).
  const messaged = sharedCoresCosts(schedule, [stepLine], { cores: 1, messageCpu: 0.5 });
  t.ok(near(messaged.forward, [1, 0.85]) && near(messaged.backward, [0.8, 1.5]) && near(messaged.optimizerStep, [0.5, 0]), `the messages' CPU taken out of the passes: ${JSON.stringify([messaged.forward, messaged.backward])}`);
  t.throws(() => sharedCoresCosts(schedule, [stepLine], { cores: 1, messageCpu: [0.5] }), { code: 'ERR_INVALID_ARGUMENT', message: /messageCpu has 1 entries/ });
  t.throws(() => sharedCoresCosts(schedule, [stepLine], { cores: 1, messageCpu: -1 }), { code: 'ERR_INVALID_ARGUMENT', message: /messageCpu\[0\] must be a finite number >= 0/ });
  t.throws(() => sharedCoresCosts(schedule, [timeline], { cores: 0 }), { code: 'ERR_INVALID_ARGUMENT' });
  // The same timeline as one of two alike thread sets (a worker per replica, pipeline 0 shown): on
  // 2 cores each stretch had twice the passes shown, so the one-pass stretches ran at full speed
  // and the two-pass one at half.
  const twice = sharedCoresCosts(schedule, [stepLine], { cores: 2, copies: 2 });
  t.ok(near(twice.forward, [1, 1]) && near(twice.backward, [1, 1.5]) && near(twice.optimizerStep, [0.5, 0]), 'copies 2 on 2 cores: as 1 on 1 core');
  const alone = sharedCoresCosts(schedule, [stepLine], { cores: 2 });
  t.ok(near(alone.backward, [1, 2]), 'copies 1 on 2 cores: the two passes at once did not share');
  t.throws(() => sharedCoresCosts(schedule, [stepLine], { cores: 2, copies: 0 }), { code: 'ERR_INVALID_ARGUMENT', message: /copies/ });
});

t.test('the tuner simulates a machine-aware profile with its fits, steps and shared cores', async (t) => {
  const fit = { forward: { fixedMs: 0.5, perSampleMs: 0.1 }, backward: { fixedMs: 1, perSampleMs: 0.2 } };
  const base: PipelineProfile = {
    stages: [0, 1].map(() => ({ forwardMs: 2.1, backwardMs: 4.2, optimizerStepMs: 0.3, fit })),
    microBatchSize: 16,
    batchSize: 64,
  };
  const costs = costsAt(base, 4);
  t.same(costs.forward, [0.9, 0.9], 'fixed + per-sample at 4, not the linear scaling of forwardMs');
  t.same(costs.backward, [1.8, 1.8]);
  t.same(costs.optimizerStep, [0.3, 0.3]);
  t.equal(costs.sharedCores, undefined, 'no machine: a device per stage');
  const machine = { ...base, machine: { cores: 1, passCores: 1 }, roundOverheadMs: 2 };
  t.same(costsAt(machine, 4).sharedCores, { cores: 1, passCores: 1, threads: 'per-stage' }, "the runtime's default layout: a thread per stage, running its row for every pipeline");
  t.same(costsAt(machine, 4, 'worker-per-replica').sharedCores, { cores: 1, passCores: 1, threads: 'per-pipeline' }, 'a worker per replica: a thread per stage and pipeline');
  const linked = { ...machine, p2pLatencyMs: 0.05, stages: base.stages.map((s) => ({ ...s, weightBytes: 1e6 })), p2pBandwidthGBps: 1 };
  t.same(costsAt(linked, 4).elastic, [0.3, 0.3], 'shared stages: the averaging is a pass on the worker, as costly as the step');
  const elastic = costsAt(linked, 4, 'worker-per-replica').elastic as number[];
  t.ok(elastic.length === 2 && elastic.every((ms) => Math.abs(ms - (0.3 + 2 * 0.05 + 1)) < 1e-12), `a worker per replica: the step plus an all-reduce of the weights over the link (${elastic.join(', ')})`);
  t.throws(() => costsAt(machine, 4, 'shared' as never), { code: 'ERR_INVALID_ARGUMENT', message: /layout must be one of 'shared-stages', 'worker-per-replica'/ });
  const one = simulateSetting(machine, { pipelines: 2, microBatches: 2, advance: 0, microBatchSize: 4 });
  // one core, work conserved: 2 pipelines x 2 stages x (2 x (0.9 + 1.8) + a step 0.3 + an averaging
  // 0.3, a step's pass over free links), plus the round's overhead
  t.ok(Math.abs(one.makespanMs - (2 * 2 * (2 * 2.7 + 0.3 + 0.3) + 2)) < 1e-9, `makespan ${one.makespanMs}`);
  t.ok(Math.abs(one.samplesPerSecond - (2 * 2 * 4 * 1000) / one.makespanMs) < 1e-9);
  const separate = simulateSetting(machine, { pipelines: 2, microBatches: 2, advance: 0, microBatchSize: 4, layout: 'worker-per-replica' });
  t.ok(Math.abs(separate.makespanMs - one.makespanMs) < 1e-9, `a worker per replica on one core, work conserved too: ${separate.makespanMs}`);
  t.throws(() => costsAt({ ...base, machine: { cores: 0 } }, 4), { code: 'ERR_INVALID_ARGUMENT', message: /machine\.cores/ });
  // What a message costs the cores: fixed + per byte of the stage's output activation at the size asked.
  const messaging = { ...machine, stages: base.stages.map((s) => ({ ...s, activationBytes: 16_000 })), machine: { cores: 1, messageCpu: { fixedMs: 0.05, perByteMs: 1e-6 } } };
  const mc = costsAt(messaging, 4).sharedCores!.messageCpu as number[];
  t.ok(mc.length === 2 && mc.every((ms) => Math.abs(ms - (0.05 + 1e-6 * 4000)) < 1e-12), `a stage's output at micro-batch 4 is 4 000 bytes: ${mc.join(', ')}`);
  t.ok(simulateSetting(messaging, { pipelines: 1, microBatches: 2, advance: 0, microBatchSize: 4 }).makespanMs > simulateSetting({ ...messaging, machine: { cores: 1 } }, { pipelines: 1, microBatches: 2, advance: 0, microBatchSize: 4 }).makespanMs, 'on one core the messages\' CPU lengthens the round');
  t.throws(() => costsAt({ ...base, machine: { cores: 1, messageCpu: { fixedMs: -1, perByteMs: 0 } } }, 4), { code: 'ERR_INVALID_ARGUMENT', message: /machine\.messageCpu\.fixedMs/ });
  t.throws(() => costsAt({ ...base, machine: { cores: 1, messageCpu: 0.05 as never } }, 4), { code: 'ERR_INVALID_ARGUMENT', message: /machine\.messageCpu must be \{ fixedMs, perByteMs \}/ });
  t.throws(() => costsAt({ ...base, stages: [{ forwardMs: 1, backwardMs: 1, fit: { forward: { fixedMs: -1, perSampleMs: 0 }, backward: fit.backward } }] }, 4), { code: 'ERR_INVALID_ARGUMENT' });
});
