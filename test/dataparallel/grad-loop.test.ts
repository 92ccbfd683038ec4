/**
 * The natural training loop is correct in every data-parallel mode: a caller who zeroes the
 * ParamSet's gradients and accumulates into them each step (the PyTorch habit) never touches a
 * gradient whose all-reduce is in flight. This used to apply 0, 1, 0, 2, 0, 3 in the pipelined modes
 * instead of 1, 1, 1, ...: the trainer alternated two buffers and the caller zeroed the one under
 * reduction.
 */
import t from 'tap';

import { DATA_PARALLEL_MODES, DataParallelTrainer, LocalCommunicator, ParamSet } from '../../dist/index.js';

/** Two ranks in this thread; each step every rank's gradient of w[0] is 1 (by += after a zeroing). */
async function appliedGradients(mode: (typeof DATA_PARALLEL_MODES)[number], zero: 'params' | 'trainer', steps: number): Promise<number[][]> {
  const group = `grad-loop-${process.pid}-${mode}-${zero}`;
  const comms = await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2, timeoutMs: 10_000 })));
  const sets = comms.map(() => new ParamSet({ w: [4] }));
  const trainers = await Promise.all(
    comms.map((comm, r) =>
      DataParallelTrainer.create({
        comm,
        params: sets[r]!,
        mode,
        optimizer: { kind: 'sgd', lr: 1 },
        ...(mode === 'sapipe-dc' || mode === 'sapipe-wp' ? { compensation: { lambda: 0 } } : {}),
      }),
    ),
  );
  const applied: number[][] = [[], []];
  for (let step = 0; step < steps; step++) {
    const before = sets.map((p) => p.get('w').data[0]!);
    for (const [r, p] of sets.entries()) {
      if (zero === 'params') p.zeroGrad();
      else trainers[r]!.zeroGrad();
      p.get('w').grad[0]! += 0.5; // two micro-batches, accumulated
      p.get('w').grad[0]! += 0.5;
    }
    await Promise.all(trainers.map((tr) => tr.step()));
    sets.forEach((p, r) => applied[r]!.push(before[r]! - p.get('w').data[0]!));
  }
  const before = sets.map((p) => p.get('w').data[0]!);
  await Promise.all(trainers.map((tr) => tr.flush()));
  sets.forEach((p, r) => applied[r]!.push(before[r]! - p.get('w').data[0]!));
  await Promise.all(trainers.map((tr) => tr.dispose()));
  for (const p of sets) p.dispose();
  for (const c of comms) c.destroy();
  return applied;
}

for (const mode of DATA_PARALLEL_MODES)
  for (const zero of ['params', 'trainer'] as const)
    t.test(`${mode}: zeroGrad through the ${zero === 'params' ? 'ParamSet' : 'trainer'}, then +=, each step`, async (t) => {
      const steps = 6;
      const applied = await appliedGradients(mode, zero, steps);
      // sync applies each step's gradient at once; the pipelined modes one step later (the first
      // step only starts its reduction, flush() applies the last one).
      const expected = mode === 'sync' ? [...Array(steps).fill(1), 0] : [0, ...Array(steps).fill(1)];
      for (const r of [0, 1]) t.same(applied[r], expected, `rank ${r} applied gradient 1 at every update`);
    });

t.test('the buffer under reduction is never reachable through the ParamSet', async (t) => {
  const group = `grad-loop-reach-${process.pid}`;
  const comms = await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2, timeoutMs: 10_000 })));
  const sets = comms.map(() => new ParamSet({ w: [4] }));
  const trainers = await Promise.all(
    comms.map((comm, r) => DataParallelTrainer.create({ comm, params: sets[r]!, mode: 'pipe-sgd', optimizer: { kind: 'sgd', lr: 1 } })),
  );
  const seen = new Set();
  for (let step = 0; step < 4; step++) {
    const filled = sets.map((p) => p.grads);
    await Promise.all(trainers.map((tr) => tr.step()));
    for (const [r, p] of sets.entries()) {
      t.not(p.grads, filled[r], `step ${step}: rank ${r}'s ParamSet holds another buffer after step()`);
      t.equal(trainers[r]!.grads, p.grads, 'trainer.grads is the ParamSet\'s');
      seen.add(p.grads);
    }
  }
  t.equal(seen.size, 4, 'two buffers per rank alternate');
  await Promise.all(trainers.map((tr) => tr.dispose()));
  for (const p of sets) {
    t.notOk(p.grads.disposed, 'the ParamSet keeps a live gradient buffer after the trainer is disposed');
    p.dispose();
  }
  for (const c of comms) c.destroy();
});
