/**
 * A pipeline configuration's bad optimizer values are typed errors from PipelineTrainer.create,
 * thrown before any worker starts (they once surfaced as RankFailedError from inside a stage).
 */
import t from 'tap';

import { InvalidArgumentError, PipelineTrainer, mlpLayers, type PipelineOptimizerSpec } from '../../dist/index.js';

const inputs = new Float32Array(64 * 4);
const labels = new Int32Array(64);

t.test('bad optimizer values: InvalidArgumentError naming the value, no worker started', async (t) => {
  const bad: [PipelineOptimizerSpec, RegExp][] = [
    [{ kind: 'sgd', lr: -1 }, /optimizer: lr must be >= 0/],
    [{ kind: 'sgd', lr: 0.1, momentum: 2 }, /optimizer: momentum must be in \[0, 1\)/],
    [{ kind: 'adam', lr: 0.1, betas: [2, 0.9] }, /optimizer: betas\[0\]/],
    [{ kind: 'sgd', lr: 0.1, weightDecay: -1 }, /optimizer: weightDecay/],
    [{ kind: 'sgd', lr: 0.1, nesterov: true }, /optimizer: nesterov needs momentum/],
  ];
  for (const [optimizer, message] of bad) {
    const started = performance.now();
    const error = await PipelineTrainer.create({
      schedule: '1f1b',
      stages: 2,
      microBatches: 2,
      microBatchSize: 2,
      model: { layers: mlpLayers([4, 3, 2]), seed: 0, boundaries: [1] },
      optimizer,
      data: { inputs, labels, features: 4 },
    }).then(
      async (trainer) => {
        await trainer.dispose();
        return undefined;
      },
      (e: unknown) => e,
    );
    t.ok(error instanceof InvalidArgumentError, `${JSON.stringify(optimizer)}: ${String(error)}`);
    t.match(String(error), message);
    t.ok(performance.now() - started < 1000, 'refused at once, not after the workers came up');
  }
});
