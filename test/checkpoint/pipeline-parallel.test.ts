/**
 * Checkpoints of parallel pipelines and data-parallel rows: for each configuration, R rounds, an
 * export, R more rounds recorded; a new trainer imports the export and runs R rounds: every loss
 * and every final weight equal the uninterrupted run's bit for bit (the same kernels on the same
 * values in the same order, every replica, optimizer, data-parallel state and center restored).
 * Through the file too for AvgPipe and a data-parallel configuration. A state of another
 * configuration is refused with its code before any stage changes, and a file of one pipeline in
 * the layout before version 2 still resumes. Imports the build.
 */
import t, { type Test } from 'tap';

import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { decodeSafetensors, encodeSafetensors, loadPipelineCheckpoint, PipelineTrainer, savePipelineCheckpoint, type PipelineTrainerOptions, type PipelineTrainerState } from '../../dist/index.js';
import { FEATURES, LAYERS, SEED, dataset, evenBoundaries } from '../pipeline/runtime-helpers.js';
import { sameValues } from '../helpers/same-values.js';

const B = 2;
const R = 2;
const { inputs, labels } = dataset(160, 13);

type Config = Omit<PipelineTrainerOptions, 'model' | 'data' | 'optimizer' | 'microBatchSize'> & { parts: number };
const configs: Record<string, Config> = {
  '1f1b x 2 sync': { schedule: '1f1b', stages: 2, parts: 2, microBatches: 4, pipelines: 2, dataParallel: { mode: 'sync' } },
  '1f1b x 2 sapipe-wp': { schedule: '1f1b', stages: 2, parts: 2, microBatches: 4, pipelines: 2, dataParallel: { mode: 'sapipe-wp' } },
  'avgpipe N=2 shared-stages': { schedule: 'avgpipe', stages: 2, parts: 2, microBatches: 4, pipelines: 2, averaging: { layout: 'shared-stages' } },
  'avgpipe N=2 worker-per-replica': { schedule: 'avgpipe', stages: 2, parts: 2, microBatches: 4, pipelines: 2, averaging: { layout: 'worker-per-replica' } },
  'sapipe (sapipe-dc)': { schedule: 'sapipe', stages: 2, parts: 1, microBatches: 4, dataParallel: { mode: 'sapipe-dc' } },
  'wavelet data-parallel': { schedule: 'wavelet', stages: 2, parts: 1, microBatches: 2, form: 'data-parallel' },
};

function create(c: Config): Promise<PipelineTrainer> {
  const { parts, ...options } = c;
  return PipelineTrainer.create({
    ...options,
    microBatchSize: B,
    model: { layers: LAYERS, seed: SEED, boundaries: evenBoundaries(LAYERS.length, parts) },
    optimizer: { kind: 'sgd', lr: 0.05, momentum: 0.9 },
    data: { inputs, labels, features: FEATURES },
    seed: 5,
  });
}

/** create(), disposed when the test ends however it ends (a failed assertion must not leave stage threads holding the process). */
async function open(t: Test, c: Config): Promise<PipelineTrainer> {
  const trainer = await create(c);
  t.teardown(() => trainer.dispose());
  return trainer;
}

async function rounds(trainer: PipelineTrainer, n: number): Promise<number[]> {
  const losses: number[] = [];
  for (let r = 0; r < n; r++) losses.push(...(await trainer.trainRound()).losses);
  return losses;
}

function sameWeights(a: Float32Array[], b: Float32Array[]): boolean {
  return a.length === b.length && a.every((w, j) => sameValues(w, b[j]!));
}

/** Every replica's weights and optimizer buffers and every center, for comparing whole states. */
function sameState(a: PipelineTrainerState, b: PipelineTrainerState): boolean {
  const arrays = (s: PipelineTrainerState): Float32Array[] => [
    ...s.parts.flatMap((p) => [p.weights, ...Object.values(p.optimizer.buffers).filter((x): x is Float32Array => x !== undefined), ...(p.dataParallel?.pending ? [p.dataParallel.pending.averaged] : [])]),
    ...(s.centers ?? []).map((c) => c.weights),
  ];
  const [x, y] = [arrays(a), arrays(b)];
  return x.length === y.length && x.every((v, i) => sameValues(v, y[i]!));
}

for (const [name, c] of Object.entries(configs)) {
  t.test(`${name}: ${R} rounds, export, ${R} rounds equals another trainer importing the export`, async (t) => {
    const first = await open(t, c);
    await rounds(first, R);
    const state = await first.exportState();
    t.equal(state.version, 2);
    const losses = await rounds(first, R);
    const weights = await first.weights();
    const after = await first.exportState();
    await first.dispose();

    // The importing trainer has trained a round of its own (a gradient in flight, centers moved): the state replaces all of it.
    const second = await open(t, c);
    await rounds(second, 1);
    await second.importState(state);
    t.equal(second.rounds, R);
    t.ok(sameValues(await rounds(second, R), losses), 'every loss of the resumed rounds');
    t.ok(sameWeights(await second.weights(), weights), 'the final weights');
    t.ok(sameState(await second.exportState(), after), "every replica's weights and optimizer state, in-flight gradients and centers");
    await second.dispose();
  });
}

for (const name of ['avgpipe N=2 worker-per-replica', '1f1b x 2 sapipe-wp', 'wavelet data-parallel']) {
  t.test(`${name}: through the file`, async (t) => {
    const c = configs[name]!;
    const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipe-ckpt-par-'));
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const first = await open(t, c);
    await rounds(first, R);
    await (await savePipelineCheckpoint(first, { dir, extra: { n: 1 } })).written;
    const losses = await rounds(first, R);
    const weights = await first.weights();
    await first.dispose();
    const second = await open(t, c);
    const loaded = await loadPipelineCheckpoint(second, { dir });
    t.same(loaded?.extra, { n: 1 });
    t.ok(sameValues(await rounds(second, R), losses), 'every loss');
    t.ok(sameWeights(await second.weights(), weights), 'the final weights');
    await second.dispose();
  });
}

t.test('a state of another configuration is refused with its code before any stage changes', async (t) => {
  const states = new Map<string, PipelineTrainerState>();
  for (const [name, c] of Object.entries(configs)) {
    const trainer = await open(t, c);
    await trainer.trainRound();
    states.set(name, await trainer.exportState());
    await trainer.dispose();
  }
  const one = await open(t, { schedule: '1f1b', stages: 2, parts: 2, microBatches: 4 });
  await one.trainRound();
  states.set('one pipeline', await one.exportState());
  await one.dispose();
  // N = 3 and the other layout and form are other configurations too.
  const n3 = await open(t, { ...configs['avgpipe N=2 shared-stages']!, pipelines: 3 });
  await n3.trainRound();
  states.set('avgpipe N=3 shared-stages', await n3.exportState());
  await n3.dispose();
  for (const [name, c] of Object.entries(configs)) {
    const trainer = await open(t, c);
    const before = await trainer.exportState();
    for (const [other, state] of states) {
      if (other === name) continue;
      await t.rejects(trainer.importState(state), { code: 'ERR_INVALID_ARGUMENT' }, `${name} refuses ${other}'s state`);
    }
    t.ok(sameState(await trainer.exportState(), before), `${name}: unchanged`);
    // A version 1 state (one pipeline's) is refused by parallel pipelines.
    const v1 = { ...states.get('one pipeline')!, version: 1 as const };
    await t.rejects(trainer.importState(v1), { code: 'ERR_INVALID_ARGUMENT', message: /version 1 state is of one pipeline/ });
    await trainer.dispose();
  }
  // A bad center or in-flight gradient anywhere changes no stage.
  const avg = await open(t, configs['avgpipe N=2 worker-per-replica']!);
  const good = states.get('avgpipe N=2 worker-per-replica')!;
  const before = await avg.exportState();
  const badCenter = { ...good, centers: good.centers!.map((x, i) => (i === 3 ? { ...x, weights: x.weights.subarray(1) } : x)) };
  await t.rejects(avg.importState(badCenter), { code: 'ERR_SIZE_MISMATCH', message: /center of pipeline 1's part 1/ });
  t.ok(sameState(await avg.exportState(), before), 'unchanged');
  await avg.dispose();
  const dp = await open(t, configs['1f1b x 2 sapipe-wp']!);
  const wp = states.get('1f1b x 2 sapipe-wp')!;
  const badMode = { ...wp, parts: wp.parts.map((p, i) => (i === 3 ? { ...p, dataParallel: { ...p.dataParallel!, mode: 'sync' as const } } : p)) };
  await t.rejects(dp.importState(badMode), { code: 'ERR_INVALID_ARGUMENT', message: /mode 'sapipe-wp'/ });
  await dp.importState(wp);
  await dp.dispose();
  // overlapUpdate off keeps the averaged gradient in flight, on the update applied ahead: neither state fits the other trainer.
  const offConfig: Config = { ...configs['1f1b x 2 sapipe-wp']!, dataParallel: { mode: 'sapipe-wp', overlapUpdate: false } };
  const off = await open(t, offConfig);
  await off.trainRound();
  const offState = await off.exportState();
  t.ok(offState.parts.every((p) => p.dataParallel?.pending && !p.dataParallel.ahead), 'overlapUpdate off: a gradient in flight per replica');
  const on = await open(t, configs['1f1b x 2 sapipe-wp']!);
  const onBefore = await on.exportState();
  await t.rejects(on.importState(offState), { code: 'ERR_INVALID_ARGUMENT', message: /a gradient not yet applied.*overlapUpdate on/ });
  t.ok(sameState(await on.exportState(), onBefore), 'unchanged');
  await on.trainRound();
  const onState = await on.exportState();
  t.ok(onState.parts.every((p) => p.dataParallel?.ahead && !p.dataParallel.pending), 'overlapUpdate on: an update applied ahead per replica');
  const offBefore = await off.exportState();
  await t.rejects(off.importState(onState), { code: 'ERR_INVALID_ARGUMENT', message: /an update applied ahead.*overlapUpdate off/ });
  t.ok(sameState(await off.exportState(), offBefore), 'unchanged');
  await Promise.all([on.dispose(), off.dispose()]);
  // A version 1 state still imports into one pipeline.
  const v1trainer = await open(t, { schedule: '1f1b', stages: 2, parts: 2, microBatches: 4 });
  const s = states.get('one pipeline')!;
  await v1trainer.importState({ version: 1, schedule: s.schedule, stages: s.stages, rounds: s.rounds, epochs: s.epochs, orderPosition: s.orderPosition, parts: s.parts.map(({ weights, optimizer, updates, skipped }) => ({ weights, optimizer, updates, skipped })) });
  t.equal(v1trainer.rounds, 1);
  await v1trainer.dispose();
});

t.test('a file of one pipeline written before version 2 (no configuration, replicas by index) still resumes', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-pipe-ckpt-v1-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const c: Config = { schedule: '1f1b', stages: 2, parts: 2, microBatches: 4 };
  const first = await open(t, c);
  await rounds(first, R);
  const save = await savePipelineCheckpoint(first, { dir });
  await save.written;
  const losses = await rounds(first, R);
  const weights = await first.weights();
  await first.dispose();
  // Rewrite the file's counters as version 1 wrote them, and its manifest to match.
  const step = join(dir, readdirSync(dir).find((d) => d.startsWith('step-'))!);
  const file = join(step, 'rank-0.safetensors');
  const { tensors, metadata } = decodeSafetensors(readFileSync(file), file);
  const saved = JSON.parse(metadata.trainer!) as { parts: Record<string, unknown>[] } & Record<string, unknown>;
  t.same([saved.version, saved.coupling, [...tensors.keys()].filter((k) => k.endsWith('/weights')).sort()], [2, 'none', ['part0/weights', 'part1/weights']], "one pipeline's names are version 1's");
  const { version, pipelines, coupling, ...v1 } = saved;
  void [version, pipelines, coupling];
  const bytes = Buffer.concat(encodeSafetensors(tensors, { ...metadata, trainer: JSON.stringify({ ...v1, parts: saved.parts.map(({ pipeline, part, ...p }) => (void [pipeline, part], p)) }) }));
  writeFileSync(file, bytes);
  const manifest = join(step, 'rank-0.json');
  const sha = createHash('sha256').update(bytes).digest('hex');
  writeFileSync(manifest, readFileSync(manifest, 'utf8').replace(/"bytes": \d+/, `"bytes": ${bytes.length}`).replace(/"sha256": "[0-9a-f]+"/, `"sha256": "${sha}"`));
  const second = await open(t, c);
  await loadPipelineCheckpoint(second, { dir });
  t.ok(sameValues(await rounds(second, R), losses), 'every loss');
  t.ok(sameWeights(await second.weights(), weights), 'the final weights');
  await second.dispose();
  // The same file into parallel pipelines: another configuration.
  const dp = await open(t, configs['1f1b x 2 sync']!);
  await t.rejects(loadPipelineCheckpoint(dp, { dir }), { code: 'ERR_CHECKPOINT', reason: 'mismatch', message: /version 1 state is of one pipeline/ });
  await dp.dispose();
});
