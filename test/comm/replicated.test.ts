/**
 * The replicated fused step on the local backend in two passes (guard 'deferred', the default: a
 * reduce-scatter in place that counts non-finite sums, then every rank's update from the parts
 * their owners reduced; ReduceUpdateJob in native/comm/collective.h), and with guard 'prescan'
 * (bucket by bucket, the overflow risk falling back to the two passes), against
 * the unfused sequence (all-reduce, then the optimizer's own step), on 1-4 ranks and lengths that
 * leave some ranks an empty part: weights, predicted weights and every state buffer bit for bit
 * after every step, for every optimizer, compensation and prediction (the local estimates too).
 * A NaN on one rank skips the step on every rank and changes no weight; a sum that overflows
 * skips it too. The fused side's gradient ends with this rank's part averaged and the rest as the
 * rank computed it (two passes) or whole averaged (prescan), which shows which path ran. The
 * unfused sequence is itself checked against the plain-TypeScript reference optimizer in
 * test/comm/sharded.test.ts and the optimizer tests.
 */
import t from 'tap';

import { runRanks } from '../helpers/local-ranks.js';

interface ConfigResult {
  name: string;
  mismatches: string[];
  applied: boolean[];
  partsAsExpected: boolean;
}

for (const [n, lengths, guard] of [
  [1, [37, 1000, 3], 'deferred'],
  [2, [37, 1000, 3], 'deferred'],
  [3, [4099], 'deferred'],
  [4, [5], 'deferred'],
  [1, [37, 1000, 3], 'prescan'],
  [2, [37, 1000, 3], 'prescan'],
  [3, [4099, 17], 'prescan'],
  [4, [5], 'prescan'],
] as const) {
  const how = guard === 'deferred' ? 'two-pass' : 'prescan, bucketed';
  t.test(`${how} replicated step = all-reduce then step, bit for bit, on ${n} rank(s), lengths ${lengths.join(', ')}`, async (t) => {
    const steps = 12;
    const results = await runRanks(n, { scenario: 'replicated', lengths, steps, nanRank: n - 1, guard });
    for (let rank = 0; rank < n; rank++) {
      const m = results[rank]!.find((x) => 'configs' in x);
      t.ok(m, `rank ${rank} finished: ${JSON.stringify(results[rank]!.find((x) => x.error))}`);
      if (!m) continue;
      const configs = m.configs as ConfigResult[];
      t.equal(configs.length, 6, 'every optimizer configuration ran');
      for (const c of configs) {
        t.same(c.mismatches, [], `rank ${rank} ${c.name}: weights, predicted weights and state equal the unfused sequence's`);
        t.equal(c.applied[steps - 3], false, `rank ${rank} ${c.name}: the step with a NaN on rank ${n - 1} is skipped`);
        // One rank's "sum" is its own finite gradient; from two ranks on, some sum of 3e38s overflows.
        if (n > 1) t.equal(c.applied[steps - 2], false, `rank ${rank} ${c.name}: a sum that overflows is skipped`);
        t.ok(c.applied.slice(0, steps - 3).every(Boolean), `rank ${rank} ${c.name}: the ordinary steps are applied`);
        t.ok(
          c.partsAsExpected,
          guard === 'deferred'
            ? `rank ${rank} ${c.name}: the gradient holds the own part averaged, the rest as computed`
            : `rank ${rank} ${c.name}: the gradient is the average (reduced in place, bucket by bucket)`,
        );
      }
    }
  });
}
