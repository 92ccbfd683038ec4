// Random schedules from a seeded generator: every one validates, runs each micro-batch's forward
// and backward exactly once per part, and simulates to a finite end.
import t, { type Test } from 'tap';

import { type Schedule, type ScheduleName, generateSchedule, scheduleNames, simulateSchedule } from '../../lib/pipeline/index.js';

/** mulberry32: small, seeded, good enough to pick test sizes. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

const CASES_PER_SCHEDULE = 4;

function checkOnce(t: Test, schedule: Schedule, label: string): void {
  const counts = new Map<string, number>();
  let weightGrads = 0;
  for (const row of schedule.actions) {
    for (const a of row) {
      if (a.kind === 'weightGrad') weightGrads++;
      if (a.kind !== 'forward' && a.kind !== 'backward') continue;
      const key = `${a.kind}:${a.pipeline}:${a.microBatch}:${a.part}`;
      counts.set(key, (counts.get(key) ?? 0) + 1);
    }
  }
  const expected = 2 * schedule.pipelines * schedule.microBatches * schedule.parts;
  const units = schedule.pipelines * schedule.microBatches * schedule.parts;
  const once = counts.size === expected && [...counts.values()].every((c) => c === 1);
  t.ok(once, `${label}: every micro-batch forwarded and backwarded exactly once per part`);
  t.ok(weightGrads === 0 || weightGrads === units, `${label}: weight gradients none or one per unit`);
}

t.test('random schedules validate, cover every micro-batch once and simulate to the end', async (t) => {
  const random = prng(20240607);
  const int = (lo: number, hi: number): number => lo + Math.floor(random() * (hi - lo + 1));
  for (const name of scheduleNames) {
    for (let i = 0; i < CASES_PER_SCHEDULE; i++) {
      const stages = int(1, 16);
      let microBatches = int(1, 64);
      const options: Record<string, unknown> = { stages, microBatches };
      if (name === 'interleaved-1f1b') {
        microBatches = stages * int(1, Math.max(1, Math.floor(32 / stages)));
        options.microBatches = microBatches;
        options.virtualStages = int(1, 3);
      }
      if (name === 'avgpipe') {
        options.pipelines = int(1, 3);
        options.advance = int(0, stages + microBatches);
        if (stages * microBatches > 256) options.microBatches = microBatches = Math.max(1, Math.floor(256 / stages));
      }
      if (name === 'pipedream-2bw') {
        options.iterations = int(1, 3);
        options.microBatches = microBatches = Math.max(1, Math.floor(microBatches / 3));
      }
      if (name === 'wavelet') options.form = random() < 0.5 ? 'data-parallel' : 'model-parallel';
      const label = `${name} ${JSON.stringify(options)}`;
      const schedule = generateSchedule(name as ScheduleName, options as never);
      checkOnce(t, schedule, label);
      const costs = {
        forward: 0.5 + random(),
        backward: 1 + 2 * random(),
        p2pLatency: random() < 0.5 ? 0 : random(),
        allReduce: random() * 3,
        optimizerStep: random() * 0.2,
      };
      const result = simulateSchedule(schedule, costs);
      t.ok(Number.isFinite(result.makespan) && result.makespan > 0, `${label}: finite makespan ${result.makespan}`);
      t.ok(result.bubbleFraction >= -1e-9 && result.bubbleFraction < 1, `${label}: bubble fraction ${result.bubbleFraction}`);
      t.equal(result.analysis.staleness.length, schedule.pipelines * schedule.microBatches * schedule.parts, `${label}: a staleness for every gradient`);
      t.equal(result.analysis.unappliedGradients, 0, `${label}: every gradient applied`);
    }
  }
});
