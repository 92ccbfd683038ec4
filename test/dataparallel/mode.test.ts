/**
 * The defaults a data-parallel mode resolves to: sapipe-wp's estimate and the delay-compensation
 * strength, chosen by the accuracy experiment in bench/RESULTS.md ("Staleness-1 accuracy on
 * MNIST"). Pinned here so a change to any of them is deliberate.
 */
import t from 'tap';

import { InvalidArgumentError } from '../../dist/errors.js';
import { DEFAULT_ADAPTIVE_DC_LAMBDA, DEFAULT_DC_KIND, DEFAULT_ELEMENTWISE_DC_LAMBDA, DEFAULT_WP_ESTIMATE, resolveMode } from '../../dist/dataparallel/mode.js';

t.test('the chosen defaults', (t) => {
  t.equal(DEFAULT_WP_ESTIMATE, 'prev-sync');
  t.equal(DEFAULT_DC_KIND, 'adaptive');
  t.equal(DEFAULT_ADAPTIVE_DC_LAMBDA, 10);
  t.equal(DEFAULT_ELEMENTWISE_DC_LAMBDA, 0.2);
  t.end();
});

t.test('sapipe-wp without an estimate uses the default, without a local gradient copy', (t) => {
  const r = resolveMode({ mode: 'sapipe-wp' }, 4);
  t.same(r.prediction, { kind: 'sapipe', estimate: DEFAULT_WP_ESTIMATE, compensate: false, worldSize: 4 });
  t.equal(r.compensation, undefined);
  t.equal(r.needsLocalGrad, false, 'prev-sync reads only the averaged gradient');
  const local = resolveMode({ mode: 'sapipe-wp', estimate: 'local' }, 4);
  t.equal(local.needsLocalGrad, true);
  t.end();
});

t.test('delay compensation: adaptive by default; a kind or a lambda given alone keeps its meaning', (t) => {
  const adaptive = { kind: 'adaptive', lambda: DEFAULT_ADAPTIVE_DC_LAMBDA };
  t.same(resolveMode({ mode: 'sapipe-dc' }, 2).compensation, adaptive, 'omitted');
  t.same(resolveMode({ mode: 'sapipe-dc', compensation: {} }, 2).compensation, adaptive, '{}');
  t.same(resolveMode({ mode: 'sapipe-dc', compensation: { kind: 'adaptive', eps: 1e-6 } }, 2).compensation, { ...adaptive, eps: 1e-6 });
  t.same(resolveMode({ mode: 'sapipe-dc', compensation: { kind: 'elementwise' } }, 2).compensation, { kind: 'elementwise', lambda: DEFAULT_ELEMENTWISE_DC_LAMBDA });
  t.same(resolveMode({ mode: 'sapipe-dc', compensation: { lambda: 0.5 } }, 2).compensation, { lambda: 0.5 }, 'a lambda alone stays elementwise (the optimizers\' kind)');
  t.same(resolveMode({ mode: 'sapipe-dc', compensation: { lambda: 0 } }, 2).compensation, { lambda: 0 }, 'an explicit 0 turns it off');
  const wp = resolveMode({ mode: 'sapipe-wp', compensation: {} }, 2);
  t.same(wp.compensation, adaptive);
  t.equal(wp.prediction?.kind === 'sapipe' && wp.prediction.compensate, true, 'the estimate is compensated too by default');
  t.end();
});

t.test('bad estimates are still rejected', (t) => {
  t.throws(() => resolveMode({ mode: 'sapipe-wp', estimate: 'psychic' as 'local' }, 2), InvalidArgumentError);
  t.throws(() => resolveMode({ mode: 'sapipe-dc', estimate: 'local' }, 2), InvalidArgumentError);
  t.end();
});
