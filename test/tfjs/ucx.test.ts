/**
 * sapipe/tfjs over the ucx backend: two real processes (`sapipe launch --nproc 2`), the model's
 * ParamSet in the communicator's shared memory. `sync` with momentum SGD equals tfjs's own
 * momentum optimizer on the whole batch (computed here, independently of sapipe) to 1e-5
 * relative; `sapipe-wp` with Adam and delay compensation trains (the loss falls) and both ranks end
 * with the same weights bit for bit.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import * as tf from '@tensorflow/tfjs';
import t from 'tap';

import { ucxStatus } from '../../dist/comm/ucx-native.js';
import { TfjsParams } from '../../dist/tfjs/index.js';

const run = promisify(execFile);
const root = fileURLToPath(new URL('../..', import.meta.url));
const fixture = new URL('../fixtures/tfjs/ucx-rank.mjs', import.meta.url);

interface RankResult {
  rank: number;
  mode: string;
  backend: string;
  weights: number[];
  losses: number[];
}

t.test('TfjsParams with DataParallelTrainer on ucx: 2 processes', async (t) => {
  const status = ucxStatus();
  if (!status.available) {
    // CI installs UCX, so there a missing plugin is a failure; elsewhere say why it cannot run.
    if (process.env.CI) t.fail(`the ucx plugin is not available in CI: ${status.reason ?? 'unknown'}`);
    else t.comment(`cannot run without the ucx plugin: ${status.reason ?? 'unknown'}`);
    return;
  }
  const { stdout } = await run(process.execPath, [`${root}bin/sapipe.js`, 'launch', '--nproc', '2', fileURLToPath(fixture)], {
    cwd: root,
    timeout: 180_000,
    maxBuffer: 1 << 24,
  });
  const results = [...stdout.matchAll(/RESULT (.*)/g)].map((m) => JSON.parse(m[1]!) as RankResult);
  t.equal(results.length, 4, 'two modes on two ranks reported');
  t.ok(results.every((r) => r.backend === 'ucx'), 'over ucx');
  const { model, batch, STEPS } = (await import(fixture.href)) as {
    model(seed: number): tf.LayersModel;
    batch(step: number): { xs: tf.Tensor; ys: tf.Tensor };
    STEPS: number;
  };
  // The reference: tfjs alone, its momentum optimizer on the whole batch.
  const reference = model(7);
  const optimizer = tf.train.momentum(0.1, 0.9);
  for (let s = 0; s < STEPS; s++) {
    const { xs, ys } = batch(s);
    optimizer.minimize(() => tf.losses.softmaxCrossEntropy(ys, reference.apply(xs) as tf.Tensor) as tf.Scalar);
    tf.dispose([xs, ys]);
  }
  const want = TfjsParams.fromModel(tf, reference);
  const byMode = (mode: string): RankResult[] => results.filter((r) => r.mode === mode).sort((a, b) => a.rank - b.rank);
  const [sync0, sync1] = byMode('sync');
  let worst = 0;
  want.params.weights.array.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - sync0!.weights[i]!) / Math.max(1e-3, Math.abs(v)))));
  t.ok(worst <= 1e-5, `sync: equals tfjs's momentum optimizer on the whole batch (largest relative difference ${worst.toExponential(2)}, limit 1e-5)`);
  t.same(sync1!.weights, sync0!.weights, 'sync: the ranks agree bit for bit');
  const [wp0, wp1] = byMode('sapipe-wp');
  t.same(wp1!.weights, wp0!.weights, 'sapipe-wp: the ranks agree bit for bit');
  const l = wp0!.losses;
  t.ok(l.slice(-3).reduce((a, b) => a + b) < l.slice(0, 3).reduce((a, b) => a + b), `sapipe-wp: the loss falls (${l[0]!.toFixed(3)} -> ${l.at(-1)!.toFixed(3)})`);
  want.params.dispose();
});
