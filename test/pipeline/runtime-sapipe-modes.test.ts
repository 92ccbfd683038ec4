/**
 * The sapipe runtime schedule against the DataParallelTrainer (runtime-sapipe-helpers.ts; tolerance
 * 1e-6 absolute, measured 0) in the combinations runtime-sapipe.test.ts leaves out: SGD-momentum
 * on 3 workers in sapipe-wp, Adam on 2 in sapipe-wp, sapipe-dc (SGD-momentum and Adam, 2 and 3
 * workers, adaptive and elementwise compensation), pipe-sgd (no compensation, no prediction); and
 * that the staleness-1 modes end elsewhere than sync, so the comparison is not vacuous.
 */
import t from 'tap';

import type { PipelineOptimizerSpec } from '../../dist/index.js';
import { caseName, checkCase, maxAbsDiff, reference, type SapipeCase } from './runtime-sapipe-helpers.js';

const cases: SapipeCase[] = [
  { workers: 3, optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 }, dataParallel: { mode: 'sapipe-wp' } },
  { workers: 2, optimizer: { kind: 'adam', lr: 0.01 }, dataParallel: { mode: 'sapipe-wp' } },
  { workers: 3, optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 }, dataParallel: { mode: 'sapipe-dc', compensation: { kind: 'elementwise' } } },
  { workers: 3, optimizer: { kind: 'adam', lr: 0.01 }, dataParallel: { mode: 'sapipe-dc' } },
  { workers: 2, optimizer: { kind: 'adam', lr: 0.01 }, dataParallel: { mode: 'sapipe-dc' } },
  { workers: 2, optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 }, dataParallel: { mode: 'pipe-sgd' } },
];
for (const c of cases) t.test(caseName(c), (t) => checkCase(t, c));

// The reference is not vacuous: staleness 1 changes where training ends.
t.test('the staleness is real: sapipe-wp and pipe-sgd end elsewhere than sync', async (t) => {
  const optimizer: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.1, momentum: 0.9 };
  const [sync, wp, pipe] = await Promise.all([reference(2, optimizer, { mode: 'sync' }), reference(2, optimizer, { mode: 'sapipe-wp' }), reference(2, optimizer, { mode: 'pipe-sgd' })]);
  t.ok(maxAbsDiff(wp!, sync!) > 1e-4, 'sapipe-wp');
  t.ok(maxAbsDiff(pipe!, sync!) > 1e-4, 'pipe-sgd');
});
