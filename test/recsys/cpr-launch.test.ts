/**
 * The CPR experiment's machinery with real processes (`sapipe bench cpr`, small): 3 ucx ranks
 * under `sapipe launch --max-restarts`, one rank SIGKILLed mid-run. Full recovery ends exactly
 * where the run without failures ends (same loss and AUC to the last bit: resume is exact through
 * a kill and a restart); partial recovery and mfu finish after one restart, reloading one shard
 * and continuing from where the survivors were (no step recomputed), losing the updates of the
 * shard that no save held (fewer with mfu's priority saves). Imports the build: the ranks
 * are processes of dist/.
 */
import t from 'tap';

import { benchCpr } from '../../dist/apps/bench/cpr.js';
import { ucxStatus } from '../../dist/backends/index.js';

t.test('bench cpr: a SIGKILLed rank under full, partial and mfu recovery', { timeout: 240_000 }, async (t) => {
  const status = ucxStatus();
  if (!status.available) {
    // The ucx plugin is built wherever the README's test command runs; say so where it is not.
    t.fail(`the ucx backend is unavailable: ${status.reason}`);
    return;
  }
  const r = await benchCpr({ ranks: 3, steps: 240, failures: 1, policies: ['full', 'partial', 'mfu'], seed: 3 });
  t.same(r.failAt, [Math.floor((240 * 0.6) / 1.2)]);
  t.equal(r.rows[0]!.spread[0], r.rows[0]!.trainingSeconds, 'one run: no spread');
  const [none, full, partial, mfu] = r.rows;
  t.same(r.rows.map((x) => x.policy), ['none', 'full', 'partial', 'mfu']);
  t.equal(full!.restarts, 1);
  t.same(full!.metrics, none!.metrics, 'full recovery: the same final loss and AUC as the run never killed');
  t.ok(full!.recomputedSteps >= 0 && full!.recomputedSteps <= full!.saveEvery, `full recovery recomputed ${full!.recomputedSteps} steps (at most one interval, ${full!.saveEvery})`);
  for (const row of [partial!, mfu!]) {
    t.equal(row.restarts, 1, `${row.policy}: one restart`);
    t.equal(row.recomputedSteps, 0, `${row.policy}: no step recomputed`);
    t.equal(row.lostUpdates.length, 1, `${row.policy}: one failure`);
    t.ok(row.lostUpdates[0]! >= 0, `${row.policy}: the reloaded shard lost ${row.lostUpdates[0]} row updates no save held`);
    t.ok(row.metrics.auc > 0.7 && Math.abs(row.metrics.auc - none!.metrics.auc) < 0.02, `${row.policy}: AUC ${row.metrics.auc.toFixed(4)} against ${none!.metrics.auc.toFixed(4)}`);
  }
  t.ok(mfu!.saves!.priority > 0, 'mfu wrote priority saves');
  t.ok(partial!.lostUpdates[0]! > 0, 'partial recovery loses the updates since the last full save');
  t.ok(mfu!.lostUpdates[0]! <= partial!.lostUpdates[0]!, `mfu's priority saves leave no more updates unsaved (${mfu!.lostUpdates[0]} against ${partial!.lostUpdates[0]})`);
  t.same(full!.lostUpdates, [0], 'full recovery loses no update (it recomputes)');
  for (const row of r.rows.slice(1)) t.ok(row.restartSeconds.length === 1 && row.restartSeconds[0]! > 0 && row.restartSeconds[0]! < 60, `${row.policy}: restarted in ${row.restartSeconds[0]?.toFixed(2)} s`);
});
