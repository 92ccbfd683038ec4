/**
 * The overlapped staleness-1 update (overlapUpdate, the default) against the update applied at the
 * next step(), on 1 to 4 worker-thread ranks over `local`: every staleness-1 mode and estimate,
 * 50 steps in buckets of 16 floats, the forward weights of every step, the weights after every
 * step and after flush() identical bit for bit (both run the same fused kernel on the same
 * all-reduced average; only when and into which buffer differ). A NaN in the second bucket of one
 * rank's gradient skips that update on every rank and leaves every buffer as it was. With
 * clipGradNorm the norm and the clip factor are taken where the update runs (natively, behind the
 * last bucket) and must equal those of the update at step(), norms reported included. The reference
 * comparison of the overlapped path is test/dataparallel/trainer.test.ts (its default). With
 * `guard: 'prescan'` each bucket is updated as it lands (gated by the queued guard's verdict): the
 * same weights bit for bit, the same all-or-nothing skip, and a finite gradient large enough that
 * a sum could overflow is applied through the reductions' counts, as at step().
 */
import t from 'tap';

import type { DataParallelTrainerOptions } from '../../dist/index.js';
import type { Scenario } from '../fixtures/dataparallel/rank.js';
import { scenarioPool, type ScenarioPool } from '../helpers/scenario-pool.js';

const FIXTURE = new URL('../fixtures/dataparallel/rank.ts', import.meta.url);
type Msg = Record<string, unknown>;
type Config = Omit<DataParallelTrainerOptions, 'comm' | 'params'>;
const STEPS = 50;
const BUCKETS = { bucketBytes: 64, firstBucketBytes: 64 } as const;

const pools = new Map<number, ScenarioPool<Omit<Scenario, 'id' | 'group'>>>();
t.teardown(() => Promise.all([...pools.values()].map((p) => p.terminate())));
function runScenario(n: number, s: Omit<Scenario, 'id' | 'group'>): Promise<Msg[]> {
  let pool = pools.get(n);
  if (!pool) pools.set(n, (pool = scenarioPool(FIXTURE, n, 'overlap-test')));
  return pool.run(s);
}

const sgd = { kind: 'sgd', lr: 0.05, momentum: 0.9 } as const;
const adam = { kind: 'adam', lr: 0.01 } as const;
const CASES: [string, Config, boolean][] = [
  // name, configuration, whether the overlap applies
  ['pipe-sgd', { mode: 'pipe-sgd', optimizer: sgd }, true],
  ['pipe-sgd, AdamW', { mode: 'pipe-sgd', optimizer: { kind: 'adamw', lr: 0.01, weightDecay: 0.01 } }, true],
  ['sapipe-dc (adaptive)', { mode: 'sapipe-dc', optimizer: sgd }, true],
  ['sapipe-dc (elementwise)', { mode: 'sapipe-dc', optimizer: sgd, compensation: { kind: 'elementwise', lambda: 0.5 } }, true],
  ['sapipe-wp prev-sync', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'prev-sync' }, true],
  ['sapipe-wp prev-sync + DC, Adam', { mode: 'sapipe-wp', optimizer: adam, estimate: 'prev-sync', compensation: {} }, true],
  // The clip is taken where the update runs: active in the first steps (norms about 4), not later.
  ['pipe-sgd + clipGradNorm', { mode: 'pipe-sgd', optimizer: sgd, clipGradNorm: 1 }, true],
  ['sapipe-wp prev-sync + DC + clipGradNorm, Adam', { mode: 'sapipe-wp', optimizer: adam, estimate: 'prev-sync', compensation: {}, clipGradNorm: 1.5 }, true],
  // Each bucket updated as soon as it lands, behind the queued guard of every rank's gradient.
  ['pipe-sgd, per bucket (prescan)', { mode: 'pipe-sgd', optimizer: sgd, guard: 'prescan' }, true],
  ['sapipe-dc (adaptive), per bucket', { mode: 'sapipe-dc', optimizer: sgd, guard: 'prescan' }, true],
  ['sapipe-wp prev-sync + DC, Adam, per bucket', { mode: 'sapipe-wp', optimizer: adam, estimate: 'prev-sync', compensation: {}, guard: 'prescan' }, true],
  ['sapipe-wp local', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'local' }, false],
  ['sapipe-wp local-prev-sync + DC', { mode: 'sapipe-wp', optimizer: sgd, estimate: 'local-prev-sync', compensation: {} }, false],
];

for (const n of [1, 2, 3, 4]) {
  t.test(`${n} rank(s): the overlapped update equals the update at step(), bit for bit, over ${STEPS} steps`, async (t) => {
    for (const [name, config, applies] of CASES) {
      const [over, at] = await Promise.all([true, false].map((overlap) => runScenario(n, { kind: 'trace', config: { ...config, ...BUCKETS, ...(overlap ? {} : { overlapUpdate: false }) }, steps: STEPS })));
      for (let r = 0; r < n; r++) {
        const a = over![r]!;
        const b = at![r]!;
        if (!t.notOk(a.error ?? b.error, `${name} rank ${r} ran`)) continue;
        t.equal(a.overlapped, applies, `${name}: overlapped = ${applies}`);
        t.same(a.forward, b.forward, `${name} rank ${r}: the forward weights of every step`);
        t.same(a.weights, b.weights, `${name} rank ${r}: the weights after every step`);
        t.same(a.final, b.final, `${name} rank ${r}: the weights after flush()`);
        t.same(a.updated, b.updated, `${name} rank ${r}: the same steps applied`);
        t.same(a.norms, b.norms, `${name} rank ${r}: the same gradient norms reported`);
        if (config.clipGradNorm !== undefined) {
          // SGD converges within the 50 steps, so its clip is active early and idle later; Adam's
          // norms fall slowly (more so with more ranks), so there the clip must at least engage.
          const norms = (a.norms as (number | null)[]).filter((x): x is number => x !== null);
          const active = norms.some((x) => x > config.clipGradNorm!);
          const idle = norms.some((x) => x < config.clipGradNorm!);
          t.ok(active && (idle || config.optimizer.kind === 'adam'), `${name}: the clip was active on some steps${config.optimizer.kind === 'adam' ? '' : ' and not on others'}`);
        }
      }
    }
  });
}

t.test('the forward weights do not depend on when the caller reads them (an update finished in the background is not yet in place)', async (t) => {
  for (const [name, config, applies] of CASES.filter((c) => c[2])) {
    const [late, at] = await Promise.all(
      [{ yieldMs: 5 }, { overlapUpdate: false as const }].map((o) =>
        runScenario(2, { kind: 'trace', config: { ...config, ...BUCKETS, ...('overlapUpdate' in o ? { overlapUpdate: false } : {}) }, steps: 12, ...('yieldMs' in o ? { yieldMs: o.yieldMs } : {}) }),
      ),
    );
    for (let r = 0; r < 2; r++) {
      if (!t.notOk(late![r]!.error ?? at![r]!.error, `${name} rank ${r} ran`)) continue;
      t.equal(late![r]!.overlapped, applies);
      t.same(late![r]!.forward, at![r]!.forward, `${name} rank ${r}: read 5 ms after step(), the forward weights of every step as at step()`);
      t.same(late![r]!.weights, at![r]!.weights, `${name} rank ${r}: and the weights`);
    }
  }
});

t.test('a NaN in one bucket of one rank skips that update on every rank, every buffer unchanged', async (t) => {
  for (const [name, config] of CASES.filter((c) => c[2])) {
    const nanAt = { rank: 1, step: 20, index: 20 }; // element 20: the second bucket
    const [over, at] = await Promise.all([true, false].map((overlap) => runScenario(3, { kind: 'trace', config: { ...config, ...BUCKETS, overlapUpdate: overlap }, steps: 30, nanAt })));
    for (let r = 0; r < 3; r++) {
      const a = over![r]!;
      if (!t.notOk(a.error ?? at![r]!.error, `${name} rank ${r} ran`)) continue;
      const updated = a.updated as boolean[];
      const weights = a.weights as number[][];
      const forward = a.forward as number[][];
      // The gradient of step 20 is applied (or skipped) at step 21.
      t.same(updated.map((u, k) => (u ? -1 : k)).filter((k) => k >= 0), [0, 21], `${name} rank ${r}: only the first call and the NaN's update did not apply`);
      t.same(weights[21], weights[20], `${name} rank ${r}: the skipped update left the weights as they were`);
      t.same(forward[22], forward[21], `${name} rank ${r}: and the weights the next forward reads`);
      t.same(a.weights, at![r]!.weights, `${name} rank ${r}: as the update at step() does`);
    }
  }
});

t.test("guard 'prescan': a gradient whose sum could overflow skips every bucket, then the whole update runs once the sums prove finite", async (t) => {
  for (const [name, config] of CASES.filter((c) => c[2] && c[1].guard === 'prescan')) {
    // 3e38 on one rank of three: a sum bound of 9e38 trips the guard, the actual sums are finite.
    const hugeAt = { rank: 2, step: 10, index: 20, value: 3e38 };
    const [over, at] = await Promise.all([true, false].map((overlap) => runScenario(3, { kind: 'trace', config: { ...config, ...BUCKETS, overlapUpdate: overlap }, steps: 16, nanAt: hugeAt })));
    for (let r = 0; r < 3; r++) {
      const a = over![r]!;
      if (!t.notOk(a.error ?? at![r]!.error, `${name} rank ${r} ran`)) continue;
      t.same(a.updated, at![r]!.updated, `${name} rank ${r}: the same updates applied`);
      // Step 10's gradient is applied at step 11. (Later steps may skip: a delay-compensation term
      // or Adam's second moment of 3e38 squared overflows the state, alike on both paths.)
      t.equal((a.updated as boolean[])[11], true, `${name} rank ${r}: the huge gradient's update applied`);
      t.same(a.weights, at![r]!.weights, `${name} rank ${r}: the weights after every step, as at step()`);
    }
  }
});
