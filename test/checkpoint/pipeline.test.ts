/**
 * PipelineTrainer checkpoints: for each schedule whose state crosses rounds (weights, optimizer
 * state with its predictions and spike compensation, the version counters), 2 rounds, a save, the
 * trainer disposed, a new one resumed from the file, 2 more rounds: the weights equal those of 4
 * uninterrupted rounds bit for bit, and so do the losses of rounds 3 and 4 (the same data
 * order, reshuffled per epoch). Faulty files and other configurations are typed errors with the
 * trainer unchanged; Wavelet's model-parallel form is refused (planned; parallel pipelines:
 * pipeline-parallel.test.ts). Imports the build: stages are worker threads of dist/.
 */
import t from 'tap';

import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { gptLayers, loadPipelineCheckpoint, PipelineTrainer, savePipelineCheckpoint, type PipelineOptimizerSpec, type RuntimeScheduleName } from '../../dist/index.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries } from '../pipeline/runtime-helpers.js';
import { sameValues } from '../helpers/same-values.js';

const S = 3;
const sgdm: PipelineOptimizerSpec = { kind: 'sgd', lr: 0.05, momentum: 0.9 };
const cases: { schedule: RuntimeScheduleName; optimizer: PipelineOptimizerSpec; microBatches: number }[] = [
  { schedule: '1f1b', optimizer: { kind: 'adam', lr: 0.003 }, microBatches: 6 },
  { schedule: 'pipedream', optimizer: sgdm, microBatches: 6 },
  { schedule: 'pipedream-2bw', optimizer: sgdm, microBatches: 3 },
  { schedule: 'pipeoptim', optimizer: { kind: 'adam', lr: 0.003 }, microBatches: 6 },
  { schedule: 'spectrain', optimizer: sgdm, microBatches: 6 },
  { schedule: 'pipelined-backprop', optimizer: sgdm, microBatches: 6 },
];
const B = 4;
// 3 rounds per epoch: rounds 3 and 4 cross an epoch boundary, reshuffled.
const { inputs, labels } = dataset(3 * 6 * B + 5, 13);

function create(c: (typeof cases)[number]): Promise<PipelineTrainer> {
  return PipelineTrainer.create({
    schedule: c.schedule,
    stages: S,
    microBatches: c.microBatches,
    microBatchSize: B,
    model: { layers: LAYERS, seed: SEED, boundaries: evenBoundaries(LAYERS.length, S) },
    optimizer: c.optimizer,
    data: { inputs, labels, features: FEATURES },
    seed: 5,
  });
}

for (const c of cases) {
  t.test(`${c.schedule} (${c.optimizer.kind}): 2 rounds, save, resume, 2 rounds equals 4 rounds`, async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipe-ckpt-'));
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const whole = await create(c);
    const losses: number[] = [];
    for (let r = 0; r < 4; r++) losses.push((await whole.trainRound()).loss);
    const expected = await whole.weights();
    await whole.dispose();

    const first = await create(c);
    await first.trainRound();
    await first.trainRound();
    const save = await savePipelineCheckpoint(first, { dir, extra: { note: 'two rounds' } });
    t.equal(save.step, 2);
    await save.written;
    await first.trainRound(); // work after the checkpoint, lost with the trainer
    await first.dispose();

    const resumed = await create(c);
    const loaded = await loadPipelineCheckpoint(resumed, { dir });
    t.same([loaded?.step, loaded?.extra], [2, { note: 'two rounds' }]);
    t.equal(resumed.rounds, 2);
    const after = [(await resumed.trainRound()).loss, (await resumed.trainRound()).loss];
    t.ok(sameValues(after, losses.slice(2)), `rounds 3 and 4 lose the same (${after.map((l) => l.toFixed(6)).join(', ')})`);
    const got = await resumed.weights();
    t.ok(got.length === expected.length && got.every((w, j) => sameValues(w, expected[j]!)), 'every part bit for bit');
    await resumed.dispose();
  });
}

// A transformer: a tiny byte-level GPT (per-token loss, AdamW, PipeOptim's predictions) resumes as exactly.
t.test('a GPT under pipeoptim (adamw, per-token loss): 2 rounds, save, resume, 2 rounds equals 4 rounds', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipe-ckpt-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const [vocab, context] = [13, 6];
  const windows = Float32Array.from({ length: 3 * 4 * 2 * context + 2 * context }, (_, i) => (i * 7 + (i >> 3)) % vocab);
  const targets = Int32Array.from(windows, (v, i) => (v + (i % context) + 1) % vocab);
  const create = (): Promise<PipelineTrainer> =>
    PipelineTrainer.create({
      schedule: 'pipeoptim',
      stages: 2,
      microBatches: 4,
      microBatchSize: 2,
      model: { layers: gptLayers({ vocab, context, dim: 8, heads: 2, layers: 2 }), seed: SEED, boundaries: [2] },
      optimizer: { kind: 'adamw', lr: 0.003 },
      data: { inputs: windows, labels: targets, features: context },
      seed: 5,
    });
  const whole = await create();
  const losses: number[] = [];
  for (let r = 0; r < 4; r++) losses.push((await whole.trainRound()).loss);
  const expected = await whole.weights();
  await whole.dispose();
  const first = await create();
  await first.trainRound();
  await first.trainRound();
  await (await savePipelineCheckpoint(first, { dir })).written;
  await first.dispose();
  const resumed = await create();
  t.equal((await loadPipelineCheckpoint(resumed, { dir }))?.step, 2);
  const after = [(await resumed.trainRound()).loss, (await resumed.trainRound()).loss];
  t.ok(sameValues(after, losses.slice(2)), `rounds 3 and 4 lose the same (${after.map((l) => l.toFixed(6)).join(', ')})`);
  const got = await resumed.weights();
  t.ok(got.length === 2 && got.every((w, j) => sameValues(w, expected[j]!)), 'every part bit for bit');
  await resumed.dispose();
});

t.test('faulty files and other configurations are typed errors; the trainer stays usable', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipe-ckpt-bad-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const c = cases[0]!;
  const a = await create(c);
  await a.trainRound();
  await (await savePipelineCheckpoint(a, { dir })).written;
  await a.dispose();
  // Another optimizer: the file does not fit.
  const other = await create({ ...c, optimizer: sgdm });
  await t.rejects(loadPipelineCheckpoint(other, { dir }), { code: 'ERR_CHECKPOINT', reason: 'mismatch' });
  t.equal(other.rounds, 0, 'unchanged');
  await other.trainRound();
  await other.dispose();
  // Another schedule.
  const pd = await create(cases[1]!);
  await t.rejects(loadPipelineCheckpoint(pd, { dir }), { code: 'ERR_CHECKPOINT', reason: 'mismatch' });
  await pd.dispose();
  // A corrupted file.
  const step = join(dir, readdirSync(dir).find((n) => n.startsWith('step-'))!);
  writeFileSync(join(step, 'rank-0.safetensors'), 'garbage');
  const b = await create(c);
  await t.rejects(loadPipelineCheckpoint(b, { dir }), { code: 'ERR_CHECKPOINT' });
  await t.rejects(savePipelineCheckpoint(b, { dir, extra: 1n } as never), { code: 'ERR_INVALID_ARGUMENT' });
  await t.rejects(b.importState({ version: 2 } as never), { code: 'ERR_INVALID_ARGUMENT' });
  // A state of the right shape with one bad field anywhere changes no stage.
  const good = await b.exportState();
  const noMomentum = { ...good, parts: good.parts.map((p, j) => (j === 2 ? { ...p, optimizer: { ...p.optimizer, buffers: {} } } : p)) };
  await t.rejects(b.importState(noMomentum), { code: 'ERR_INVALID_ARGUMENT', message: /optimizer buffers/ });
  const badCounters = { ...good, parts: good.parts.map((p, j) => (j === 2 ? { ...p, skipped: p.updates + 1 } : p)) };
  await t.rejects(b.importState(badCounters), { code: 'ERR_INVALID_ARGUMENT', message: /counters/ });
  await b.trainRound(); // still usable
  await b.importState(good);
  await b.dispose();
  // Wavelet's model-parallel form: every stage holds a copy of a part.
  const wavelet = await create({ schedule: 'wavelet', optimizer: sgdm, microBatches: 6 });
  await t.rejects(wavelet.exportState(), { code: 'ERR_INVALID_ARGUMENT', message: /wavelet.*model-parallel form.*planned; supported: one pipeline, parallel pipelines/ });
  await wavelet.dispose();
});
