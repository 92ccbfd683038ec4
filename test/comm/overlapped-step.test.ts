/**
 * startOverlappedStep's two guards on one in-process rank of `local`: `prescan` takes the
 * per-bucket chain (QueuedCommunicator.reduceAndUpdateByBucket) unless a clip needs every bucket
 * first, `deferred` the one update behind the last bucket; both write the same weights, bit for
 * bit, and a NaN skips either with nothing written. With a second rank that leaves instead, the
 * failed reductions stop every update before it writes. allreduceAndStep's prescan guard, shared
 * with the per-bucket chain: a rank whose checks or guard fail does not hold the others up. (Many ranks,
 * every mode and estimate: test/dataparallel/overlap.test.ts and test/comm/ucx.test.ts.)
 */
import t from 'tap';

import { LocalCommunicator } from '../../dist/comm/local.js';
import { allreduceAndStep, startOverlappedStep } from '../../dist/comm/fused-step.js';
import { SGD } from '../../dist/optim/index.js';
import { DisposedError, RankFailedError } from '../../dist/errors.js';
import { ParamSet } from '../../dist/tensor.js';

t.test("guard 'prescan' updates bucket by bucket, 'deferred' once; the same weights", async (t) => {
  const comm = await LocalCommunicator.create({ group: `overlapped-step-${process.pid}`, rank: 0, size: 1 });
  let byBucket = 0;
  const original = comm.reduceAndUpdateByBucket.bind(comm);
  comm.reduceAndUpdateByBucket = (...args) => {
    byBucket++;
    return original(...args);
  };
  t.teardown(() => comm.destroy());
  const run = async (guard: 'prescan' | 'deferred', clip?: number, nanAt = -1) => {
    const params = new ParamSet({ w: [40, 10], b: [10] });
    params.weights.array.forEach((_, i, a) => (a[i] = Math.sin(i)));
    const optimizer = new SGD(params, { lr: 0.1, momentum: 0.9, prediction: { kind: 'linear', steps: 1 } });
    const spare = params.allocateLike();
    const predicted = params.allocateLike();
    const grads = params.allocateLike();
    const results = [];
    for (let step = 0; step < 6; step++) {
      grads.array.forEach((_, i, a) => (a[i] = Math.cos(i + step)));
      if (step === nanAt) grads.array[123] = Number.NaN;
      const before = params.weights.array.slice();
      const r = await startOverlappedStep(comm, optimizer, { grads, weights: spare, predicted, gradScaleFactor: 1, clipGradNorm: clip, bucketBytes: 256, firstBucketBytes: 64, guard });
      results.push(r.applied);
      if (r.applied) {
        params.weights.array.set(spare.array);
        optimizer.stateBuffer('predicted')!.array.set(predicted.array);
      } else t.same(params.weights.array, before, `${guard}: a skipped step leaves the weights`);
    }
    const weights = Array.from(params.weights.array);
    for (const b of [spare, predicted, grads]) b.dispose();
    optimizer.dispose();
    params.dispose();
    return { results, weights };
  };
  const deferred = await run('deferred');
  t.equal(byBucket, 0, "'deferred' never takes the per-bucket chain");
  const prescan = await run('prescan');
  t.equal(byBucket, 6, "'prescan' takes it at every step");
  t.same(prescan, deferred, 'the same results and weights, bit for bit');
  byBucket = 0;
  await run('prescan', 1e9);
  t.equal(byBucket, 0, 'with a clip the update waits for every bucket');
  const [a, b] = [await run('prescan', undefined, 3), await run('deferred', undefined, 3)];
  t.same(a.results, [true, true, true, false, true, true], 'a NaN skips that step');
  t.same(a, b, 'as the deferred guard does');
});

t.test('a reduction that fails (a lost peer) fails the step, and no update writes anything, under either guard', async (t) => {
  for (const guard of ['prescan', 'deferred'] as const) {
    const group = `overlapped-step-lost-${guard}-${process.pid}`;
    const [comm, peer] = (await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2, timeoutMs: 10_000 })))) as [LocalCommunicator, LocalCommunicator];
    const params = new ParamSet({ w: [40, 10], b: [10] });
    params.weights.array.forEach((_, i, a) => (a[i] = Math.sin(i)));
    const optimizer = new SGD(params, { lr: 0.1, momentum: 0.9, prediction: { kind: 'linear', steps: 1 } });
    const [spare, predicted, grads] = [params.allocateLike(), params.allocateLike(), params.allocateLike()];
    spare.array.fill(7);
    predicted.array.fill(7);
    grads.array.fill(0.5);
    const momentum = optimizer.stateBuffer('momentum')!.array.slice();
    // The peer leaves instead of joining the step: this rank's reductions fail.
    const step = startOverlappedStep(comm, optimizer, { grads, weights: spare, predicted, gradScaleFactor: 1, bucketBytes: 256, firstBucketBytes: 64, guard });
    peer.destroy();
    const error = (await step.then(() => undefined, (e: unknown) => e)) as { code?: string } | undefined;
    t.equal(error?.code, 'ERR_PEER_LOST', `${guard}: the step fails with the reduction's error`);
    t.ok(spare.array.every((x) => x === 7), `${guard}: the next weights were not written`);
    t.ok(predicted.array.every((x) => x === 7), `${guard}: nor the predicted weights`);
    t.same(optimizer.stateBuffer('momentum')!.array, momentum, `${guard}: nor the optimizer's state`);
    t.equal(optimizer.steps, 0, `${guard}: no step counted`);
    comm.destroy();
    for (const b of [spare, predicted, grads]) b.dispose();
    optimizer.dispose();
    params.dispose();
  }
});

t.test("allreduceAndStep's prescan: a rank whose checks or guard fail throws its error, and the others a RankFailedError at once", async (t) => {
  const failure = Object.assign(new Error('the guard failed'), { code: 'ERR_INTERNAL' });
  const cases = [
    ['a guard that fails', (comm: LocalCommunicator) => (comm.queueGuard = () => Promise.reject(failure)), failure],
    ['a disposed optimizer', (_comm: LocalCommunicator, optimizer: SGD) => optimizer.dispose(), DisposedError],
  ] as const;
  for (const [what, breakRank1, expected] of cases) {
    const group = `prescan-rank-fails-${what.length}-${process.pid}`;
    const comms = (await Promise.all([0, 1].map((rank) => LocalCommunicator.create({ group, rank, size: 2, timeoutMs: 20_000 })))) as [LocalCommunicator, LocalCommunicator];
    const sets = comms.map(() => new ParamSet({ w: [40, 10], b: [10] }));
    const optimizers = sets.map((p) => new SGD(p, { lr: 0.1, momentum: 0.9 }));
    for (const p of sets) p.grads.array.fill(0.5);
    const before = sets.map((p) => p.weights.array.slice());
    breakRank1(comms[1], optimizers[1]!);
    const started = performance.now();
    const [peer, broken] = await Promise.allSettled(optimizers.map((o, r) => allreduceAndStep(comms[r]!, o, { guard: 'prescan' })));
    const ms = performance.now() - started;
    const reason = broken?.status === 'rejected' ? broken.reason : undefined;
    t.ok(expected === failure ? reason === failure : reason instanceof DisposedError, `${what}: that rank throws its own error`);
    t.ok(peer?.status === 'rejected' && peer.reason instanceof RankFailedError, `${what}: the other throws a RankFailedError`);
    t.ok(ms < 10_000, `${what}: without waiting out the 20 s timeout (${ms.toFixed(0)} ms)`);
    t.same(sets.map((p) => p.weights.array), before, `${what}: no weights changed`);
    t.same([optimizers[0]!.steps, optimizers[0]!.skippedSteps], [0, 0], `${what}: the other rank counted no step, applied or skipped`);
    optimizers[0]!.dispose();
    if (expected === failure) optimizers[1]!.dispose();
    for (const p of sets) p.dispose();
    for (const c of comms) c.destroy();
  }
});
