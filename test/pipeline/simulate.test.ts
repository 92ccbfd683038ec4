// The simulator's timing and the pictures drawn from it.
import t from 'tap';

import {
  avgpipe,
  gpipe,
  oneFOneB,
  renderAscii,
  renderHtml,
  renderSvg,
  sapipe,
  simulateSchedule,
  summarize,
  zbH1,
} from '../../lib/pipeline/index.js';

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

t.test('text timeline: one row per stage, passes labelled, idle dotted, figures below', async (t) => {
  const r = simulateSchedule(oneFOneB({ stages: 4, microBatches: 8 }), { forward: 1, backward: 2 });
  const text = renderAscii(r);
  const lines = text.split('\n');
  t.equal(lines[0], '1f1b (S=4 M=8)');
  t.match(lines[1]!, /^stage  0 \|F0 F1 F2 F3 \.+B0=+F4 /);
  t.match(lines[4]!, /^stage  3 \|\.{9}F0 B0=+F1 /);
  t.match(text, /makespan:\s+33/);
  t.match(text, /bubble fraction: 0\.2727/);
  t.match(text, /legend: F forward, B backward/);
  // every row spans the makespan at 3 characters per unit
  for (const line of lines.slice(1, 5)) t.equal(line.length, 'stage  0 |'.length + 33 * 3 + 1);
  const multi = renderAscii(simulateSchedule(avgpipe({ stages: 2, microBatches: 2, pipelines: 2 })));
  t.match(multi, /F1\.0/, 'pipelines are told apart');
  t.throws(() => renderAscii(r, { cellWidth: 1 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => renderAscii({} as never), /simulateSchedule/);
});

t.test('SVG: a rectangle per pass, hatched bubbles, legend and figures', async (t) => {
  const r = simulateSchedule(zbH1({ stages: 3, microBatches: 4 }));
  const svg = renderSvg(r);
  t.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/);
  t.match(svg, /<\/svg>$/);
  t.equal((svg.match(/<title>\dF\d/g) ?? []).length, 12, 'one forward rectangle per stage and micro-batch');
  t.equal((svg.match(/<title>\dB\d/g) ?? []).length, 12);
  t.equal((svg.match(/<title>\dW\d/g) ?? []).length, 12);
  t.match(svg, /fill="url\(#idle\)"/);
  for (const word of ['forward', 'backward', 'weight gradient', 'optimizer step', 'idle (bubble)', 'micro-batch:']) t.match(svg, word);
  t.match(svg, /bubble fraction 0\.\d+/);
  t.notMatch(svg, /NaN|undefined/);
  const reduce = renderSvg(simulateSchedule(sapipe({ stages: 2, microBatches: 3 }), { allReduce: 1 }));
  t.match(reduce, /#2b6cb0/, 'all-reduces are drawn');
  t.throws(() => renderSvg(r, { scale: -1 }), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('HTML wraps the SVG in a page', async (t) => {
  const html = renderHtml(simulateSchedule(oneFOneB({ stages: 2, microBatches: 2 })), { title: 'a <small> one' });
  t.match(html, /^<!doctype html>/);
  t.match(html, /<title>a &lt;small&gt; one<\/title>/);
  t.match(html, /<svg /);
});

t.test('summarize lists the per-stage analysis', async (t) => {
  const lines = summarize(simulateSchedule(oneFOneB({ stages: 2, microBatches: 3 }), { weightBytes: 8 }));
  t.match(lines.join('\n'), /peak-memory-bytes/);
  t.equal(lines.length, 4 + 2);
});
