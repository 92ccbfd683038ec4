/**
 * A run of steps the non-finite guard skips is said once, through process.emitWarning with code
 * SAPIPE_NON_FINITE_STEPS, naming the first tensor whose gradient holds NaN: a training loop that
 * feeds NaN (a wrong property read) no longer skips every step in silence.
 */
import t from 'tap';

import { NON_FINITE_WARNING_STEPS, ParamSet, SGD } from '../../dist/index.js';

t.test('ten skipped steps in a row warn once, naming the tensor; an applied step starts the count again', async (t) => {
  const warnings: Error[] = [];
  const listener = (w: Error): void => {
    if ((w as { code?: string }).code === 'SAPIPE_NON_FINITE_STEPS') warnings.push(w);
  };
  process.on('warning', listener);
  t.teardown(() => process.off('warning', listener));
  const tick = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

  const params = new ParamSet({ 'fc.weight': [3, 4], 'fc.bias': [3] });
  const sgd = new SGD(params, { lr: 0.1 });
  params.view(params.grads, 'fc.bias')[1] = Number.NaN;
  for (let i = 0; i < NON_FINITE_WARNING_STEPS - 1; i++) t.equal(sgd.stepSync().applied, false);
  await tick();
  t.equal(warnings.length, 0, `no warning after ${NON_FINITE_WARNING_STEPS - 1} skipped steps: one overflow now and then is the guard's job`);
  sgd.stepSync();
  await tick();
  t.equal(warnings.length, 1, `a warning at the ${NON_FINITE_WARNING_STEPS}th skipped step in a row`);
  t.match(warnings[0]!.message, /10 optimizer steps in a row were skipped/);
  t.match(warnings[0]!.message, /first in tensor "fc.bias"/, 'it names the tensor');
  t.match(warnings[0]!.message, /Check the loss and the gradients/, 'and says what to check');
  for (let i = 0; i < 15; i++) sgd.stepSync();
  await tick();
  t.equal(warnings.length, 1, 'once per run of skips');

  params.grads.array.fill(0);
  t.equal(sgd.stepSync().applied, true);
  params.view(params.grads, 'fc.weight')[5] = Number.POSITIVE_INFINITY;
  for (let i = 0; i < NON_FINITE_WARNING_STEPS; i++) await sgd.step();
  await tick();
  t.equal(warnings.length, 2, 'a new run after an applied step warns again (the queued step() too)');
  t.match(warnings[1]!.message, /first in tensor "fc.weight"/);
  t.equal(sgd.skippedSteps, 2 * NON_FINITE_WARNING_STEPS + 15, 'every skip counted');
  params.dispose();
});
