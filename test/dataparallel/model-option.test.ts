/**
 * The library's own MLP fits the trainer: as its `model` option, and built in the communicator's
 * memory (the ucx backend's shared-memory path; here `local`, whose memory a counting source wraps).
 */
import t from 'tap';

import { DataParallelTrainer, FlatBuffer, LocalCommunicator, MLP, ParamSet, type MemorySource } from '../../dist/index.js';

t.test('DataParallelTrainer takes an MLP as its model', async (t) => {
  const comm = await LocalCommunicator.create({ group: `model-option-${process.pid}`, rank: 0, size: 1 });
  const mlp = new MLP([4, 3, 2], { seed: 1 });
  t.equal(mlp.numParams, 4 * 3 + 3 + 3 * 2 + 2);
  const trainer = await DataParallelTrainer.create({ comm, params: mlp.params, model: mlp, mode: 'sync', optimizer: { kind: 'sgd', lr: 0.1 } });
  await trainer.dispose();
  const other = new ParamSet({ w: [mlp.numParams] });
  await t.rejects(
    DataParallelTrainer.create({ comm, params: other, model: mlp, mode: 'sync', optimizer: { kind: 'sgd', lr: 0.1 } }),
    { code: 'ERR_INVALID_ARGUMENT', message: /its own ParamSet/ },
    "a ParamSet that is not the model's is refused even when the counts agree",
  );
  await t.rejects(
    DataParallelTrainer.create({ comm, params: other, model: { numParams: 3 }, mode: 'sync', optimizer: { kind: 'sgd', lr: 0.1 } }),
    { code: 'ERR_SIZE_MISMATCH' },
  );
  other.dispose();
  mlp.dispose();
  comm.destroy();
});

t.test('MLP allocates its parameters from a memory source', async (t) => {
  let allocations = 0;
  const memory: MemorySource = {
    allocate(length: number) {
      allocations++;
      return FlatBuffer.allocate(length);
    },
  };
  const mlp = new MLP([4, 3, 2], { seed: 1, memory });
  t.equal(allocations, 2, 'weights and gradients from the source');
  mlp.params.allocateLike();
  t.equal(allocations, 3, 'and the optimizer state after them');
  const plain = new MLP([4, 3, 2], { seed: 1 });
  t.same([...mlp.params.weights.array], [...plain.params.weights.array], 'the same initial weights');
  t.throws(() => new MLP([4, 2], { memory: 3 as never }), { code: 'ERR_INVALID_ARGUMENT' });
  mlp.dispose();
  plain.dispose();
});
