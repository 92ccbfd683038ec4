import t from 'tap';

import { type PipelineProfile, costsAt, parseProfile, profileStages, tuneAvgPipe } from '../../lib/pipeline/index.js';

const GiB = 2 ** 30;
const profile: PipelineProfile = {
  stages: Array.from({ length: 4 }, () => ({
    forwardMs: 4,
    backwardMs: 8,
    activationBytes: 0.125 * GiB,
    weightBytes: 1 * GiB,
    optimizerStateBytes: 2 * GiB,
  })),
  microBatchSize: 4,
  batchSize: 32,
  overheadMs: 0.5,
  p2pLatencyMs: 2,
  p2pBandwidthGBps: 20,
};

t.test('the tuner picks the fastest setting that fits and explains it', async (t) => {
  const roomy = tuneAvgPipe(profile, { memoryBytes: 64 * GiB, maxPipelines: 3, maxMicroBatches: 16 });
  t.ok(roomy.best);
  t.equal(roomy.best, roomy.candidates.find((c) => c.fits));
  t.ok(roomy.candidates.every((c, i) => i === 0 || roomy.candidates[i - 1]!.samplesPerSecond >= c.samplesPerSecond), 'fastest first');
  const plain = roomy.candidates.find((c) => c.pipelines === 1 && c.advance === 0 && c.microBatches === 8)!;
  t.ok(roomy.best!.samplesPerSecond > plain.samplesPerSecond, 'beats plain 1F1B when memory allows');
  t.ok(roomy.best!.pipelines > 1 || roomy.best!.advance > 0);
  t.match(roomy.explanation.join('\n'), /chosen: N=\d+, M=\d+/);
  t.match(roomy.explanation.join('\n'), /why: /);

  const tight = tuneAvgPipe(profile, { memoryBytes: 4.5 * GiB, maxPipelines: 3, maxMicroBatches: 16 });
  t.ok(tight.best);
  t.ok(tight.best!.peakMemoryBytes.every((b) => b <= 4.5 * GiB));
  t.ok(tight.best!.samplesPerSecond <= roomy.best!.samplesPerSecond);
  t.match(tight.explanation.join('\n'), /faster but over the cap/);

  const none = tuneAvgPipe(profile, { memoryBytes: 1 * GiB, maxPipelines: 2, maxMicroBatches: 4 });
  t.equal(none.best, undefined);
  t.match(none.explanation.join('\n'), /none fits: the smallest needs/);
});

t.test('costs scale with the micro-batch beyond the fixed overhead', async (t) => {
  const c = costsAt(profile, 8);
  t.same(c.forward, [7.5, 7.5, 7.5, 7.5]);
  t.same(c.backward, [15.5, 15.5, 15.5, 15.5]);
  t.equal(c.p2pBandwidth, 20e6);
});

t.test('profiles are checked with the field named', async (t) => {
  t.same(parseProfile(JSON.stringify(profile)), profile);
  t.throws(() => parseProfile('{'), /not valid JSON/);
  t.throws(() => parseProfile({ ...profile, stages: [] }), /profile.stages must be a non-empty array/);
  t.throws(() => parseProfile({ ...profile, stages: [{ forwardMs: 1 }] }), /profile.stages\[0\].backwardMs/);
  t.throws(() => parseProfile({ ...profile, batchSize: 0 }), /profile.batchSize must be an integer >= 1/);
  t.throws(() => parseProfile({ ...profile, overheadMs: 100 }), /overheadMs \(100\) exceeds/);
  t.throws(() => parseProfile({ ...profile, p2pBandwidthGBps: 0 }), /p2pBandwidthGBps/);
  t.throws(() => tuneAvgPipe(profile, { memoryBytes: -1 }), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => tuneAvgPipe(profile, { memoryBytes: GiB, maxPipelines: 0 }), /maxPipelines/);
});

t.test('profileStages times user stage functions', async (t) => {
  const spin = (ms: number) => () => {
    const end = performance.now() + ms;
    while (performance.now() < end);
  };
  const p = await profileStages(
    [
      { forward: spin(1), backward: spin(2), activationBytes: 10, weightBytes: 100 },
      { forward: async () => spin(1)(), backward: spin(2) },
    ],
    { microBatchSize: 2, batchSize: 8, warmup: 1, repeats: 3 },
  );
  t.equal(p.stages.length, 2);
  t.ok(p.stages[0]!.forwardMs >= 1 && p.stages[0]!.backwardMs >= 2);
  t.equal(p.stages[0]!.activationBytes, 10);
  t.equal(p.batchSize, 8);
  t.ok(tuneAvgPipe(p, { memoryBytes: GiB, maxPipelines: 2 }).best);
  await t.rejects(profileStages([{ forward: 1 } as never], { microBatchSize: 1, batchSize: 1 }), /forward\(\) and backward\(\)/);
  await t.rejects(profileStages([], { microBatchSize: 1, batchSize: 1 }), { code: 'ERR_INVALID_ARGUMENT' });
});
