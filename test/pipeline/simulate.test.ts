import t from 'tap';

import { avgpipe, gpipe, oneFOneB, sapipe, simulateSchedule, zbH1 } from '../../lib/pipeline/index.js';

t.test('AFP (A=3) at S=4, M=8 with a one-slot latency: earlier than 1F1B, no later than all-forward-first, fewer activations', async (t) => {
  const costs = { forward: 1, backward: 1, p2pLatency: 1 };
  const run = (advance: number) => simulateSchedule(avgpipe({ stages: 4, microBatches: 8, pipelines: 1, advance }), costs);
  const afp = run(3);
  const oneF = simulateSchedule(oneFOneB({ stages: 4, microBatches: 8 }), costs);
  // A >= M + S - 2 makes every stage run all its forwards first
  const allForwardFirst = run(8 + 4);
  t.same(allForwardFirst.analysis.forwardsBeforeFirstBackward, [8, 8, 8, 8]);
  t.equal(oneF.makespan, run(0).makespan, 'A = 0 is 1F1B');
  t.ok(afp.makespan < oneF.makespan, `AFP ${afp.makespan} < 1F1B ${oneF.makespan}`);
  t.ok(afp.makespan <= allForwardFirst.makespan, `AFP ${afp.makespan} <= all-forward-first ${allForwardFirst.makespan}`);
  const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);
  t.ok(sum(afp.analysis.peakActivations) < sum(allForwardFirst.analysis.peakActivations));
  t.ok(afp.analysis.peakActivations.every((p, k) => p <= allForwardFirst.analysis.peakActivations[k]!));
  t.same([afp.makespan, oneF.makespan, allForwardFirst.makespan], [28, 38, 28], 'the figures quoted in docs/pipeline.md');
  // the same ordering holds when the backward costs twice the forward
  const costs2 = { forward: 1, backward: 2, p2pLatency: 1 };
  const afp2 = simulateSchedule(avgpipe({ stages: 4, microBatches: 8, pipelines: 1, advance: 3 }), costs2);
  const oneF2 = simulateSchedule(oneFOneB({ stages: 4, microBatches: 8 }), costs2);
  const aff2 = simulateSchedule(avgpipe({ stages: 4, microBatches: 8, pipelines: 1, advance: 12 }), costs2);
  t.ok(afp2.makespan < oneF2.makespan && afp2.makespan <= aff2.makespan);
});

t.test('makespan of GPipe with latency and bandwidth', async (t) => {
  const S = 3;
  const M = 4;
  // forward fill (S-1)(F+L) + M*F, then M*B and the drain (S-1)(B+L)
  const r = simulateSchedule(gpipe({ stages: S, microBatches: M }), { forward: 1, backward: 2, p2pLatency: 0.5, activationBytes: 100, p2pBandwidth: 200 });
  const L = 0.5 + 100 / 200;
  t.equal(r.makespan, (S - 1) * (1 + L) + M * 1 + M * 2 + (S - 1) * (2 + L));
  t.equal(r.throughput, M / r.makespan);
});

t.test('per-part costs, memory and optimizer steps', async (t) => {
  const r = simulateSchedule(oneFOneB({ stages: 2, microBatches: 4 }), {
    forward: [1, 3],
    backward: [2, 6],
    optimizerStep: 0.5,
    storedActivationBytes: [10, 20],
    weightBytes: [1000, 2000],
    optimizerStateBytes: [7, 7],
  });
  t.same(r.peakActivationBytes, [20, 20]);
  t.same(r.peakMemoryBytes, [20 + 1000 + 7, 20 + 2000 + 7]);
  t.equal(r.busy[1], 4 * (3 + 6) + 0.5);
  t.ok(r.bubbleFraction > 0 && r.bubbleFraction < 1);
});

t.test('SAPipe overlaps the all-reduce of one iteration with the next', async (t) => {
  const M = 6;
  const overlapped = simulateSchedule(sapipe({ stages: 4, microBatches: M }), { forward: 1, backward: 2, allReduce: 2.5 });
  // every iteration waits only for the previous reduction: 3 per iteration plus the last reduction
  t.equal(overlapped.makespan, M * 3 + 2.5);
  const reductions = overlapped.timeline[0]!.filter((x) => x.action.kind === 'allReduce');
  t.equal(reductions.length, M);
  t.ok(reductions.every((x) => x.end - x.start === 2.5));
});

t.test('zero-bubble splits the backward cost between B and W', async (t) => {
  const r = simulateSchedule(zbH1({ stages: 2, microBatches: 2 }), { forward: 1, backward: 3, weightGrad: 1 });
  const b = r.timeline[0]!.find((x) => x.action.kind === 'backward')!;
  const w = r.timeline[0]!.find((x) => x.action.kind === 'weightGrad')!;
  t.equal(b.end - b.start, 2);
  t.equal(w.end - w.start, 1);
});

t.test('bad costs are refused with the field named', async (t) => {
  const s = oneFOneB({ stages: 2, microBatches: 2 });
  t.throws(() => simulateSchedule(s, { forward: -1 }), /costs.forward must be a finite number >= 0/);
  t.throws(() => simulateSchedule(s, { backward: [1] }), /one per part \(2\)/);
  t.throws(() => simulateSchedule(s, { backward: 1, weightGrad: 2 }), /exceeds costs.backward/);
  t.throws(() => simulateSchedule(s, { p2pBandwidth: 0 }), /p2pBandwidth/);
  t.throws(() => simulateSchedule(s, { p2pLatency: Number.NaN }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => simulateSchedule(s, null as never), { code: 'ERR_INVALID_ARGUMENT' });
});
