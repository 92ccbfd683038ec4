// The values ALGORITHMS.md section 5 states, pinned.
import t from 'tap';

import {
  avgpipe,
  generateSchedule,
  gpipe,
  oneFOneB,
  pipedream,
  pipedream2BW,
  pipelinedBackprop,
  pipeoptim,
  sapipe,
  simulateSchedule,
  stalenessOf,
  validateSchedule,
  zbH1,
} from '../../lib/pipeline/index.js';

const sizes: [number, number][] = [
  [1, 1],
  [2, 3],
  [4, 8],
  [4, 2],
  [5, 16],
  [8, 8],
];

t.test('GPipe bubble fraction is (S-1)/(M+S-1)', async (t) => {
  for (const [S, M] of sizes) {
    for (const backward of [1, 2, 3]) {
      const r = simulateSchedule(gpipe({ stages: S, microBatches: M }), { forward: 1, backward });
      t.ok(Math.abs(r.bubbleFraction - (S - 1) / (M + S - 1)) < 1e-12, `S=${S} M=${M} backward=${backward}: ${r.bubbleFraction}`);
    }
  }
});

t.test('peak stored activations: M for GPipe, min(M, S-k) for 1F1B', async (t) => {
  for (const [S, M] of sizes) {
    t.same(validateSchedule(gpipe({ stages: S, microBatches: M })).peakActivations, Array(S).fill(M), `gpipe S=${S} M=${M}`);
    t.same(
      validateSchedule(oneFOneB({ stages: S, microBatches: M })).peakActivations,
      Array.from({ length: S }, (_, k) => Math.min(M, S - k)),
      `1f1b S=${S} M=${M}`,
    );
  }
});

t.test('staleness is 0 for GPipe and 1F1B', async (t) => {
  for (const [S, M] of sizes) {
    for (const make of [gpipe, oneFOneB]) {
      const a = validateSchedule(make({ stages: S, microBatches: M }));
      t.ok(a.staleness.length === S * M && a.staleness.every((e) => e.staleness === 0), `${make.name} S=${S} M=${M}`);
    }
  }
});

t.test('staleness is S-k-1 for PipeDream and PipeOptim, once the pipeline is full', async (t) => {
  for (const [S, M] of sizes) {
    for (const make of [pipedream, pipeoptim]) {
      const a = validateSchedule(make({ stages: S, microBatches: M }));
      for (let k = 0; k < S; k++) {
        const per = stalenessOf(a, { stage: k }, M);
        // micro-batch m is the (m+1)-th through a stage, so it cannot be staler than m
        t.same(per, per.map((_, m) => Math.min(m, S - k - 1)), `${make.name} S=${S} M=${M} stage ${k}`);
      }
    }
  }
});

t.test('PipeDream keeps S-k weight versions, PipeOptim and 2BW two', async (t) => {
  t.same(validateSchedule(pipedream({ stages: 4, microBatches: 8 })).weightVersions, [4, 3, 2, 1]);
  t.same(validateSchedule(pipedream({ stages: 6, microBatches: 12 })).weightVersions, [6, 5, 4, 3, 2, 1]);
  t.same(validateSchedule(pipeoptim({ stages: 4, microBatches: 8 })).weightVersions, [2, 2, 2, 2]);
  t.same(validateSchedule(pipedream2BW({ stages: 4, microBatches: 8 })).weightVersions, [2, 2, 2, 2]);
  t.same(validateSchedule(gpipe({ stages: 4, microBatches: 8 })).weightVersions, [1, 1, 1, 1]);
});

t.test('staleness is 1 for PipeDream-2BW after the first batch, on every stage', async (t) => {
  for (const [S, M] of [[4, 8], [4, 4], [4, 2], [3, 1], [6, 5]] as [number, number][]) {
    const I = 3;
    const a = validateSchedule(pipedream2BW({ stages: S, microBatches: M, iterations: I }));
    for (let k = 0; k < S; k++) {
      t.same(stalenessOf(a, { stage: k }, M * I), Array.from({ length: M * I }, (_, g) => (g < M ? 0 : 1)), `S=${S} M=${M} stage ${k}`);
    }
  }
});

t.test('staleness is 2(S-k)-1 for Pipelined Backpropagation, and 1 for SAPipe', async (t) => {
  for (const [S, M] of [[4, 16], [3, 12], [2, 5]] as [number, number][]) {
    const a = validateSchedule(pipelinedBackprop({ stages: S, microBatches: M }));
    for (let k = 0; k < S; k++) {
      const D = 2 * (S - k) - 1;
      t.same(stalenessOf(a, { stage: k }, M), Array.from({ length: M }, (_, m) => Math.min(m, D)), `PB S=${S} M=${M} stage ${k}`);
    }
    t.same(a.maxStaleness, Array.from({ length: S }, (_, k) => Math.min(M - 1, 2 * (S - k) - 1)));
  }
  const s = validateSchedule(sapipe({ stages: 3, microBatches: 6 }));
  for (let x = 0; x < 3; x++) t.same(stalenessOf(s, { stage: x, part: 0, pipeline: x }, 6), [0, 1, 1, 1, 1, 1], `SAPipe worker ${x}`);
});

t.test('forwards before the first backward: AFP 7, 5, 3, 1 at S=4, A=3; 1F1B 4, 3, 2, 1', async (t) => {
  t.same(validateSchedule(avgpipe({ stages: 4, microBatches: 8, pipelines: 1, advance: 3 })).forwardsBeforeFirstBackward, [7, 5, 3, 1]);
  t.same(validateSchedule(oneFOneB({ stages: 4, microBatches: 8 })).forwardsBeforeFirstBackward, [4, 3, 2, 1]);
  t.same(validateSchedule(avgpipe({ stages: 4, microBatches: 8, pipelines: 1, advance: 0 })).forwardsBeforeFirstBackward, [4, 3, 2, 1]);
  // A = S-1 gives 2(S-k)-1 at any S
  t.same(validateSchedule(avgpipe({ stages: 6, microBatches: 12, pipelines: 1, advance: 5 })).forwardsBeforeFirstBackward, [11, 9, 7, 5, 3, 1]);
  t.same(validateSchedule(avgpipe({ stages: 4, microBatches: 5, pipelines: 1, advance: 3 })).forwardsBeforeFirstBackward, [5, 5, 3, 1], 'capped at M');
});

t.test("ZB-H1 has a smaller bubble than 1F1B at equal peak activation memory", async (t) => {
  for (const [S, M] of [[4, 8], [4, 16], [8, 16], [6, 24]] as [number, number][]) {
    const costs = { forward: 1, backward: 2, weightGrad: 1 };
    const zb = simulateSchedule(zbH1({ stages: S, microBatches: M }), costs);
    const ob = simulateSchedule(oneFOneB({ stages: S, microBatches: M }), costs);
    t.ok(zb.bubbleFraction < ob.bubbleFraction, `S=${S} M=${M}: zb-h1 ${zb.bubbleFraction.toFixed(4)} < 1f1b ${ob.bubbleFraction.toFixed(4)}`);
    t.equal(Math.max(...zb.analysis.peakActivations), Math.max(...ob.analysis.peakActivations), `S=${S} M=${M}: same peak activations`);
    t.ok(zb.analysis.peakActivations.every((p) => p <= Math.min(M, S)), `S=${S} M=${M}: no stage above 1F1B's peak`);
  }
});

t.test('every schedule name works through generateSchedule', async (t) => {
  t.equal(generateSchedule('1f1b', { stages: 2, microBatches: 2 }).name, '1f1b');
  t.throws(() => generateSchedule('2f2b' as never, { stages: 2, microBatches: 2 }), /unknown schedule "2f2b"; use one of/);
  t.throws(() => gpipe({ stages: 0, microBatches: 2 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => gpipe({ stages: 2, microBatches: 1.5 }), /microBatches must be an integer/);
  t.throws(() => gpipe(null as never), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => generateSchedule('interleaved-1f1b', { stages: 4, microBatches: 6 }), /multiple of stages/);
  t.throws(() => generateSchedule('wavelet', { stages: 4, microBatches: 6, form: 'diagonal' as never }), /form/);
  t.throws(() => generateSchedule('avgpipe', { stages: 4, microBatches: 6, pipelines: 0 }), /pipelines/);
});

t.test('Wavelet data-parallel: one wave at a time in memory, each all-reduce hidden behind the other wave\'s passes', async (t) => {
  for (const [S, M] of sizes) {
    const schedule = generateSchedule('wavelet', { stages: S, microBatches: M });
    t.same(validateSchedule(schedule).peakActivations, Array(S).fill(1), `S=${S} M=${M}: each worker holds one micro-batch at a time`);
    // A wave's reduction has the other wave's forward and backward (1 + 2) to finish before the
    // wave's step: the worker waits only for the round's last one.
    for (const allReduce of [1, 3]) {
      for (const sharedCores of [undefined, { cores: S }]) {
        const r = simulateSchedule(schedule, { forward: 1, backward: 2, allReduce, ...(sharedCores ? { sharedCores } : {}) });
        t.equal(r.makespan, 2 * M * 3 + allReduce, `S=${S} M=${M} allReduce=${allReduce}${sharedCores ? ', a core per worker' : ''}: 2M (F + B) + the last reduction`);
      }
    }
  }
});

t.test('interleaved 1F1B divides the bubble by V: ((S-1)/V) / (M + (S-1)/V)', async (t) => {
  for (const [S, M, V] of [[4, 8, 2], [4, 8, 4], [2, 4, 3], [4, 16, 1]] as [number, number, number][]) {
    const s = generateSchedule('interleaved-1f1b', { stages: S, microBatches: M, virtualStages: V });
    // a stage's cost is split evenly over its V chunks
    const r = simulateSchedule(s, { forward: 1 / V, backward: 2 / V });
    const expected = (S - 1) / V / (M + (S - 1) / V);
    t.ok(Math.abs(r.bubbleFraction - expected) < 1e-9, `S=${S} M=${M} V=${V}: ${r.bubbleFraction} vs ${expected}`);
  }
});
