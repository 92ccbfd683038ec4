/**
 * Learning-rate schedules against PyTorch's recurrences (test/reference/lr-schedule.ts), applied to
 * a real optimizer between steps, and composed.
 */
import t from 'tap';

import { cosineDecay, linearWarmup, LrScheduler, ParamSet, product, SGD, sequential, stepDecay } from '../../dist/index.js';
import { cosineLr, linearLr, stepLr } from '../reference/lr-schedule.js';

const close = (a: number, b: number): boolean => Math.abs(a - b) <= 1e-12 + 1e-9 * Math.abs(b);

function run(schedule: ReturnType<typeof linearWarmup>, steps: number, base = 0.1): number[] {
  const p = new ParamSet({ w: [4] });
  const optimizer = new SGD(p, { lr: base });
  const scheduler = new LrScheduler(optimizer, schedule);
  const lrs = [optimizer.lr];
  for (let i = 0; i < steps; i++) {
    p.get('w').grad.fill(1);
    optimizer.stepSync();
    lrs.push(scheduler.step());
    if (optimizer.lr !== lrs[lrs.length - 1]) throw new Error('the optimizer did not get the scheduled lr');
  }
  p.dispose();
  return lrs;
}

t.test('warm-up, cosine and step decay match PyTorch over many steps (tolerance 1e-9 relative)', async (t) => {
  const cases: [string, number[], number[]][] = [
    ['linearWarmup(20, 0.25)', run(linearWarmup(20, 0.25), 60), linearLr(0.1, 0.25, 20, 60)],
    ['cosineDecay(50, 0.01)', run(cosineDecay(50, 0.01), 50), cosineLr(0.1, 50, 0.001, 50)],
    ['stepDecay(7, 0.5)', run(stepDecay(7, 0.5), 40), stepLr(0.1, 7, 0.5, 40)],
  ];
  for (const [what, got, want] of cases) {
    t.equal(got.length, want.length, what);
    const bad = got.findIndex((x, i) => !close(x, want[i]!));
    t.equal(bad, -1, `${what}: first difference at step ${bad}: ${got[bad]} vs ${want[bad]}`);
  }
});

t.test('sequential: warm-up then cosine, counted from the milestone', async (t) => {
  const got = run(sequential([linearWarmup(10, 0.1), cosineDecay(30)], [10]), 45);
  const warm = linearLr(0.1, 0.1, 10, 10);
  const cos = cosineLr(0.1, 30, 0, 35);
  const want = [...warm.slice(0, 10), ...cos];
  const bad = got.findIndex((x, i) => !close(x, want[i]!));
  t.equal(bad, -1, `first difference at ${bad}`);
  t.ok(close(got[10]!, 0.1), 'the cosine starts at the base lr at the milestone');
});

t.test('product, a trainer-like target, and bad input', async (t) => {
  const holder = { optimizer: { lr: 1 } };
  const s = new LrScheduler(holder, product(stepDecay(2, 0.5), linearWarmup(4, 0.5)));
  t.equal(holder.optimizer.lr, 0.5);
  s.step();
  t.ok(close(holder.optimizer.lr, 0.625));
  s.step();
  t.ok(close(holder.optimizer.lr, 0.5 * 0.75));
  t.throws(() => new LrScheduler({} as never, linearWarmup(2)), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => new LrScheduler(holder, 3 as never), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => linearWarmup(0), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => sequential([linearWarmup(2)], [3]), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => new LrScheduler(holder, () => NaN), { code: 'ERR_INVALID_ARGUMENT' }, 'a schedule that yields NaN');
  t.throws(() => new LrScheduler(holder, linearWarmup(2), { base: 1 } as never), { code: 'ERR_INVALID_ARGUMENT', message: /did you mean 'baseLr'/ });
});
