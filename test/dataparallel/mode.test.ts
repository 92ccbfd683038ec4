/**
 * The defaults a data-parallel mode resolves to: sapipe-wp's estimate and the delay-compensation
 * strength, chosen by the accuracy experiment in bench/RESULTS.md ("Staleness-1 accuracy on
 * MNIST"). Pinned here so a change to either is deliberate.
 */
import t from 'tap';

import { InvalidArgumentError } from '../../lib/errors.js';
import { DEFAULT_DC_LAMBDA, DEFAULT_WP_ESTIMATE, resolveMode } from '../../lib/dataparallel/mode.js';

t.test('the chosen defaults', (t) => {
  t.equal(DEFAULT_WP_ESTIMATE, 'prev-sync');
  t.equal(DEFAULT_DC_LAMBDA, 0.2);
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

t.test('delay compensation gets the default lambda unless one is given', (t) => {
  t.same(resolveMode({ mode: 'sapipe-dc' }, 2).compensation, { lambda: DEFAULT_DC_LAMBDA });
  t.same(resolveMode({ mode: 'sapipe-dc', compensation: { kind: 'adaptive' } }, 2).compensation, { kind: 'adaptive', lambda: DEFAULT_DC_LAMBDA });
  t.same(resolveMode({ mode: 'sapipe-dc', compensation: { lambda: 0 } }, 2).compensation, { lambda: 0 }, 'an explicit 0 turns it off');
  const wp = resolveMode({ mode: 'sapipe-wp', compensation: {} }, 2);
  t.same(wp.compensation, { lambda: DEFAULT_DC_LAMBDA });
  t.equal(wp.prediction?.kind === 'sapipe' && wp.prediction.compensate, true, 'the estimate is compensated too by default');
  t.end();
});

t.test('bad estimates are still rejected', (t) => {
  t.throws(() => resolveMode({ mode: 'sapipe-wp', estimate: 'psychic' as 'local' }, 2), InvalidArgumentError);
  t.throws(() => resolveMode({ mode: 'sapipe-dc', estimate: 'local' }, 2), InvalidArgumentError);
  t.end();
});
