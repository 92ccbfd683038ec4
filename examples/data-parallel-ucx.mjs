// Data-parallel training across processes on the ucx backend: the linear regression of
// linear-regression.mjs, its samples split over the ranks, each step one fused all-reduce +
// sharded update (every rank reduces and updates its own part of the model, then every rank gets
// every part's new weights). The ParamSet lies in the communicator's shared memory, so on one
// machine the collectives read the other ranks' buffers directly. Each step applies its own
// averaged gradient at once (synchronous data parallelism), so no gradient is stale and neither
// delay compensation nor weight prediction has anything to correct; for the staleness-1 modes that
// use them, see DataParallelTrainer (README, "A training loop").
// Run: npx sapipe launch --nproc 2 examples/data-parallel-ucx.mjs   (needs the ucx plugin: sapipe info)
import { SGD, ParamSet, UcxCommunicator, allreduceAndStep, gatherShardedState } from '../dist/index.js';
import { regressionData } from './regression-data.mjs';

const comm = await UcxCommunicator.create(); // RANK, WORLD_SIZE, MASTER_ADDR/PORT from sapipe launch
const features = 64;
const samples = 1024;
const localBatch = 16; // per rank; the global batch is localBatch x ranks

// The same data set on every rank; rank r trains on samples r, r + size, ...
const { addGradient, loss } = regressionData({ features, samples });
const mine = [];
for (let s = comm.rank; s < samples; s += comm.size) mine.push(s);

const params = new ParamSet({ weight: [features], bias: [1] }, { memory: comm });
const optimizer = new SGD(params, {
  lr: 0.05,
  momentum: 0.9,
  gradScale: 1 / localBatch, // the all-reduce averages over ranks, this over each rank's batch
});
const weight = params.get('weight');
const bias = params.get('bias');

const steps = Math.floor(mine.length / localBatch);
for (let epoch = 0; epoch < 10; epoch++) {
  for (let k = 0; k < steps; k++) {
    const w = optimizer.forwardView('weight');
    const b = optimizer.forwardView('bias');
    params.zeroGrad();
    for (const s of mine.slice(k * localBatch, (k + 1) * localBatch)) addGradient(s, w, b, weight.grad, bias.grad);
    await allreduceAndStep(comm, optimizer, { update: 'sharded' });
  }
  if (comm.rank === 0 && (epoch % 3 === 2 || epoch === 0)) console.log(`epoch ${epoch + 1}: loss ${loss(weight.data, bias.data).toExponential(3)}`);
}
await gatherShardedState(comm, optimizer); // every rank's optimizer state whole again
// Every rank holds the same model: its checksum, averaged over the ranks, equals its own.
const sum = comm.allocate(1);
sum.array[0] = weight.data.reduce((a, v) => a + v, bias.data[0]);
const own = sum.array[0];
await comm.allreduce(sum, { op: 'avg' });
console.log(`rank ${comm.rank}: replicas agree: ${Math.abs(sum.array[0] - own) <= 1e-6 * Math.abs(own)}; collectives on shared memory: ${comm.sharedMemoryCollectives}`);
optimizer.dispose();
params.dispose();
sum.dispose();
await comm.destroy();
