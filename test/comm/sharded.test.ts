/**
 * The sharded update (allreduceAndStep with update: 'sharded') on the local backend: on 1-4 ranks
 * and lengths that leave some ranks an empty part, its weights and predicted weights equal the
 * replicated update's bit for bit after every step, its gathered state equals the replicated
 * state, a NaN on one rank skips the step everywhere, a possible overflow falls back to the
 * replicated path, and the estimates that cannot be sharded are refused. Independently of the
 * replicated path, the sharded weights are checked against the reference optimizer.
 */
import t from 'tap';

import { ReferenceOptimizer } from '../reference/optimizer.js';
import { runRanks } from '../helpers/local-ranks.js';

interface ConfigResult {
  name: string;
  mismatches?: string[];
  results?: { applied: boolean; update: string }[];
  weights?: number[];
  refused?: string;
}

for (const [n, lengths] of [
  [1, [37, 1000, 3]],
  [2, [37, 1000, 3]],
  [3, [4099]],
  [4, [5]],
] as const) {
  t.test(`sharded = replicated bit for bit on ${n} rank(s), ParamSet lengths ${lengths.join(', ')}`, async (t) => {
    const steps = 12;
    const results = await runRanks(n, { scenario: 'sharded', lengths, steps, nanRank: n - 1 });
    for (let rank = 0; rank < n; rank++) {
      const m = results[rank]!.find((x) => 'configs' in x);
      t.ok(m, `rank ${rank} finished: ${JSON.stringify(results[rank]!.find((x) => x.error))}`);
      if (!m) continue;
      for (const c of m.configs as ConfigResult[]) {
        if (c.name === 'local-estimate') {
          t.equal(c.refused, 'ERR_INVALID_ARGUMENT', `rank ${rank}: the local estimate is refused in sharded mode`);
          continue;
        }
        t.same(c.mismatches, [], `rank ${rank} ${c.name}: weights, predicted weights and gathered state equal the replicated update's`);
        const applied = c.results!.map((r) => r.applied);
        t.equal(applied[steps - 3], false, `rank ${rank} ${c.name}: the step with a NaN on rank ${n - 1} is skipped`);
        t.equal(c.results![steps - 2]!.update, 'replicated', `rank ${rank} ${c.name}: a sum that could overflow falls back to the replicated path`);
        t.equal(c.results![0]!.update, 'sharded');
        t.ok(applied.slice(0, steps - 3).every(Boolean), `rank ${rank} ${c.name}: the ordinary steps are applied`);
      }
    }
  });
}

t.test('the sharded SGD with momentum, DC and prev-sync prediction matches the reference optimizer', async (t) => {
  // Independent of the replicated path: ordinary steps only, final weights against the reference.
  const n = 3;
  const steps = 10;
  const lengths = [37, 1000, 3];
  const results = await runRanks(n, { scenario: 'sharded', lengths, steps, anomalies: false });
  const offsets = [0, 48, 1056];
  const length = 1072;
  const ref = new ReferenceOptimizer(
    { optimizer: 'sgd', lr: 0.01, weightDecay: 0, momentum: 0.9, dampening: 0, nesterov: false, beta1: 0.9, beta2: 0.999, eps: 1e-8, gradScale: 1, compensation: { kind: 'elementwise', lambda: 0.3, eps: 1e-7 }, prediction: { kind: 'shadow', estimate: 'prev-sync', compensate: true, n: 1, localScale: 1 } },
    new Float32Array(length).map((_, i) => Math.sin(i)),
  );
  for (let step = 0; step < steps; step++) {
    const avg = new Float32Array(length);
    for (let i = 0; i < length; i++) {
      let s = 0;
      for (let r = 0; r < n; r++) s = Math.fround(s + Math.fround(Math.cos(i * (r + 1) + step)));
      avg[i] = Math.fround(s * Math.fround(1 / n));
    }
    ref.step(avg);
  }
  const inTensor = (i: number): boolean => lengths.some((len, k) => i >= offsets[k]! && i < offsets[k]! + len);
  for (let rank = 0; rank < n; rank++) {
    const m = results[rank]!.find((x) => 'configs' in x);
    t.ok(m, `rank ${rank} finished: ${JSON.stringify(results[rank]!.find((x) => x.error))}`);
    if (!m) continue;
    const c = (m.configs as ConfigResult[])[0]!;
    t.equal(c.name, 'sgd-momentum+dc+wp-prev-sync');
    t.ok(c.results!.every((r) => r.applied && r.update === 'sharded'), 'every step ran sharded');
    let worst = 0;
    for (let i = 0; i < length; i++) if (inTensor(i)) worst = Math.max(worst, Math.abs(c.weights![i]! - ref.w[i]!) / (1e-6 + 1e-5 * Math.abs(ref.w[i]!)));
    t.ok(worst <= 1, `rank ${rank}: weights within 1e-5 relative (+1e-6 absolute) of the reference after ${steps} steps (worst ratio ${worst.toFixed(3)})`);
  }
});
