/**
 * Loading passes over a newest step that does not verify and takes the newest that does, the
 * same on every rank, with a warning (SAPIPE_CHECKPOINT_FALLBACK) naming the step and why; a
 * directory that holds something but nothing that verifies (a manifest deleted, a step directory
 * renamed) is a CheckpointError saying what to do, not a silent fresh start; a file's counters
 * are checked as untrusted input; pruning never removes the last step that verifies.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import t, { type Test } from 'tap';

import {
  CheckpointError,
  Checkpointer,
  DataParallelTrainer,
  LocalCommunicator,
  LrScheduler,
  ParamSet,
  decodeSafetensors,
  encodeSafetensors,
  loadCheckpoint,
  readRankCheckpoint,
  saveCheckpoint,
} from '../../dist/index.js';
import { pruneSteps, retractRankSave, saveRankFile, stepDirectory } from '../../dist/checkpoint/store.js';

let group = 0;
const CONFIG = { mode: 'pipe-sgd', optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 } } as const;

/** `size` data-parallel ranks in this process (local communicators). */
async function ranks(t: Test, size: number): Promise<DataParallelTrainer[]> {
  const name = `ckpt-fallback-${process.pid}-${group++}`;
  const comms = await Promise.all(Array.from({ length: size }, (_, rank) => LocalCommunicator.create({ group: name, rank, size, timeoutMs: 10_000 })));
  const trainers = await Promise.all(
    comms.map((comm) => {
      const params = new ParamSet({ w: [40], b: [3] });
      params.weights.array.forEach((_, i, a) => (a[i] = Math.cos(i)));
      return DataParallelTrainer.create({ comm, params, ...CONFIG });
    }),
  );
  t.teardown(async () => {
    for (const tr of trainers) {
      await tr.dispose();
      tr.params.dispose();
    }
    for (const c of comms) c.destroy();
  });
  return trainers;
}

async function train(trainers: DataParallelTrainer[], steps: number): Promise<void> {
  for (let s = 0; s < steps; s++)
    await Promise.all(
      trainers.map((tr) => {
        tr.grads.array.forEach((_, i, a) => (a[i] = 0.01 * Math.sin(i + s + tr.comm.rank)));
        return tr.step();
      }),
    );
}

async function save(trainers: DataParallelTrainer[], dir: string): Promise<void> {
  const saves = await Promise.all(trainers.map((tr) => saveCheckpoint(tr, { dir, extra: { at: tr.stepCalls } })));
  await Promise.all(saves.map((s) => s.written));
}

function tempDir(t: Test): string {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-ckpt-fallback-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** The SAPIPE_CHECKPOINT_FALLBACK warnings emitted while `body` runs. */
async function warningsOf<T>(body: () => Promise<T>): Promise<{ value: T; warnings: string[] }> {
  const warnings: string[] = [];
  const listen = (w: Error & { code?: string }): void => {
    if (w.code === 'SAPIPE_CHECKPOINT_FALLBACK') warnings.push(w.message);
  };
  process.on('warning', listen);
  try {
    const value = await body();
    // emitWarning delivers on the next tick.
    await new Promise((resolve) => setImmediate(resolve));
    return { value, warnings };
  } finally {
    process.off('warning', listen);
  }
}

/** Rewrites a rank's file with changed metadata and a manifest to match (a file that verifies). */
function rewrite(stepDir: string, rank: number, edit: (metadata: Record<string, string>) => void): void {
  const file = join(stepDir, `rank-${rank}.safetensors`);
  const { tensors, metadata } = decodeSafetensors(readFileSync(file), file);
  edit(metadata);
  const bytes = Buffer.concat(encodeSafetensors(tensors, metadata));
  writeFileSync(file, bytes);
  const manifestPath = join(stepDir, `rank-${rank}.json`);
  const manifest = JSON.parse(readFileSync(manifestPath, 'utf8'));
  manifest.bytes = bytes.length;
  manifest.sha256 = execFileSync('sha256sum', [file], { encoding: 'utf8' }).split(' ')[0];
  writeFileSync(manifestPath, JSON.stringify(manifest));
}

const damages: [string, (step6: string) => void, RegExp][] = [
  [
    "a byte flipped in rank 1's file",
    (at) => {
      const f = join(at, 'rank-1.safetensors');
      const b = readFileSync(f);
      b[b.length - 2]! ^= 0x01;
      writeFileSync(f, b);
    },
    /rank-1\.safetensors: its SHA-256 differs/,
  ],
  ["rank 0's file truncated", (at) => truncateSync(join(at, 'rank-0.safetensors'), 100), /rank-0\.safetensors: 100 bytes, its manifest says \d+ \(truncated\?\)/],
  ["rank 1's manifest deleted", (at) => unlinkSync(join(at, 'rank-1.json')), /rank-1\.safetensors: has no manifest/],
  ["rank 0's file deleted", (at) => unlinkSync(join(at, 'rank-0.safetensors')), /rank-0\.safetensors: cannot be read \(ENOENT/],
  ["rank 1's manifest garbage", (at) => writeFileSync(join(at, 'rank-1.json'), '{"step": 6, "oops'), /rank-1\.json: not JSON/],
];

for (const [what, damage, why] of damages) {
  t.test(`2 ranks, the newest step damaged (${what}): both ranks load the step before, and warn why`, async (t) => {
    const dir = tempDir(t);
    const trainers = await ranks(t, 2);
    await train(trainers, 3);
    await save(trainers, dir);
    const atThree = trainers.map((tr) => Array.from(tr.params.weights.array));
    await train(trainers, 3);
    await save(trainers, dir);
    damage(stepDirectory(dir, 6));
    const fresh = await ranks(t, 2);
    const { value: loaded, warnings } = await warningsOf(() => Promise.all(fresh.map((tr) => loadCheckpoint(tr, { dir }))));
    t.same(
      loaded.map((l) => l?.step),
      [3, 3],
      'every rank resumes from step 3',
    );
    t.same(
      loaded.map((l) => l?.skipped.map((s) => s.step)),
      [[6], [6]],
      'and says it passed over step 6',
    );
    t.match(loaded[0]?.skipped[0]?.reason, why, 'naming the file and the fault');
    t.same(
      fresh.map((tr) => Array.from(tr.params.weights.array)),
      atThree,
      "with step 3's weights",
    );
    t.equal(warnings.length, 2, 'one warning per rank');
    for (const w of warnings) t.match(w, new RegExp(`skipped step-0000000006: .*${why.source}.*; loading step-0000000003 instead`), w);
  });
}

t.test('a save cut short on one rank is passed over with a warning; with nothing older, a fresh start', async (t) => {
  const dir = tempDir(t);
  const trainers = await ranks(t, 2);
  await train(trainers, 2);
  // Only rank 0 finished its save of step 2 (rank 1 died before its file was written).
  await (await saveCheckpoint(trainers[0]!, { dir })).written;
  writeFileSync(join(stepDirectory(dir, 2), 'rank-1.safetensors.tmp-123-abcd'), 'partial');
  const fresh = await ranks(t, 2);
  const none = await warningsOf(() => Promise.all(fresh.map((tr) => loadCheckpoint(tr, { dir }))));
  t.same(none.value, [null, null], 'nothing older: a fresh start on every rank');
  t.equal(none.warnings.length, 2);
  for (const w of none.warnings) t.match(w, /skipped step-0000000002: incomplete: the save of rank 1 of 2 did not finish; starting afresh/);
  // A save withdrawn (CPR's rollback) is a save cut short too, not damage.
  await save(trainers, dir);
  await retractRankSave(dir, 2, 1);
  t.notOk(existsSync(join(stepDirectory(dir, 2), 'rank-1.safetensors')), 'the withdrawn file is gone');
  const again = await ranks(t, 2);
  t.same(await Promise.all(again.map((tr) => loadCheckpoint(tr, { dir }))), [null, null], 'a withdrawn save does not count, and is not an error');
});

t.test('only an absent or empty directory is a fresh start; a deleted manifest or a renamed step directory is an error', async (t) => {
  const dir = tempDir(t);
  const [trainer] = await ranks(t, 1);
  const [fresh] = await ranks(t, 1);
  t.equal(await loadCheckpoint(fresh!, { dir: join(dir, 'absent') }), null, 'an absent directory');
  mkdirSync(join(dir, 'empty'));
  writeFileSync(join(dir, 'empty', '.nfs0001'), '');
  t.equal(await loadCheckpoint(fresh!, { dir: join(dir, 'empty') }), null, 'an empty one (hidden files aside)');
  mkdirSync(join(dir, 'cut', 'step-0000000004'), { recursive: true });
  writeFileSync(join(dir, 'cut', 'step-0000000004', 'rank-0.safetensors.tmp-1-abcd'), 'partial');
  t.equal(await loadCheckpoint(fresh!, { dir: join(dir, 'cut') }), null, 'one with only a first save cut short before its file was written');

  const ckpt = join(dir, 'ckpt');
  await train([trainer!], 2);
  await save([trainer!], ckpt);
  await train([trainer!], 2);
  await save([trainer!], ckpt);
  // The newest step's manifest deleted: the step before verifies and loads, with a warning.
  unlinkSync(join(stepDirectory(ckpt, 4), 'rank-0.json'));
  const { value, warnings } = await warningsOf(() => loadCheckpoint(fresh!, { dir: ckpt }));
  t.equal(value?.step, 2, 'the newest step without its manifest: the one before loads');
  t.match(warnings, [/skipped step-0000000004: .*rank-0\.safetensors: has no manifest/]);
  // Every manifest deleted: nothing verifies, and the directory is not empty.
  unlinkSync(join(stepDirectory(ckpt, 2), 'rank-0.json'));
  const [other] = await ranks(t, 1);
  const before = Array.from(other!.params.weights.array);
  await t.rejects(loadCheckpoint(other!, { dir: ckpt }), {
    code: 'ERR_CHECKPOINT',
    reason: 'missing',
    message: /step-0000000004\/rank-0\.safetensors: has no manifest .*no checkpoint in .* verifies: restore the files, or move .* aside \(or give an empty directory\) to start afresh/,
  });
  t.same(Array.from(other!.params.weights.array), before, 'the trainer is unchanged');
  await t.rejects(Checkpointer.create(other!, { dir: ckpt, every: 1 }), { code: 'ERR_CHECKPOINT', reason: 'missing' }, 'Checkpointer.create too');

  // A step directory renamed: not loaded, and not taken for an empty directory.
  const renamed = join(dir, 'renamed');
  await save([trainer!], renamed);
  renameSync(stepDirectory(renamed, 4), join(renamed, 'step-4'));
  await t.rejects(loadCheckpoint(other!, { dir: renamed }), { code: 'ERR_CHECKPOINT', reason: 'missing', message: /renamed.*holds no checkpoint .* but is not empty \(step-4\); a step directory renamed is not loaded/ });
  await t.rejects(Checkpointer.create(other!, { dir: renamed, every: 1 }), { code: 'ERR_CHECKPOINT', reason: 'missing' });
});

t.test("a file's counters are untrusted input: impossible ones are a CheckpointError, the trainer unchanged", async (t) => {
  const dir = tempDir(t);
  const [trainer] = await ranks(t, 1);
  await train([trainer!], 3);
  const scheduler = new LrScheduler(trainer!.optimizer, () => 1);
  const saved = await (await saveCheckpoint(trainer!, { dir, scheduler })).written;
  const file = join(saved.path, 'rank-0.safetensors');
  const manifest = join(saved.path, 'rank-0.json');
  const good = [readFileSync(file), readFileSync(manifest)] as const;
  const cases: [string, (m: Record<string, string>) => void, RegExp][] = [
    ['an optimizer step count of 1e300', (m) => (m.trainer = m.trainer!.replace(/"step":\d+/, '"step":1e300')), /optimizer's step count is 1e\+300/],
    ['a negative skipped-step count', (m) => (m.trainer = m.trainer!.replace(/"skippedSteps":\d+/, '"skippedSteps":-1')), /skipped steps is -1/],
    ['2^53 step() calls', (m) => (m.trainer = m.trainer!.replace(/"calls":\d+/, '"calls":9007199254740992')), /step\(\) calls is 9007199254740992/],
    ['a learning rate of Infinity', (m) => (m.trainer = m.trainer!.replace(/"lr":[\d.e+-]+/, '"lr":1e400')), /learning rate is Infinity/],
    ['a fractional non-finite count', (m) => (m.trainer = m.trainer!.replace(/"nonFiniteCount":\d+/, '"nonFiniteCount":0.5')), /non-finite count is 0\.5/],
    ["a scheduler's step of 1e300", (m) => (m.lrScheduler = JSON.stringify({ step: 1e300, baseLr: 0.1 })), /scheduler's step is 1e\+300/],
  ];
  for (const [what, edit, message] of cases) {
    rewrite(saved.path, 0, edit);
    const [fresh] = await ranks(t, 1);
    const before = Array.from(fresh!.params.weights.array);
    await t.rejects(loadCheckpoint(fresh!, { dir, scheduler: new LrScheduler(fresh!.optimizer, () => 1) }), { code: 'ERR_CHECKPOINT', reason: 'corrupt', message }, what);
    t.same(Array.from(fresh!.params.weights.array), before, `${what}: the trainer is unchanged`);
    t.equal(fresh!.stepCalls, 0, `${what}: no counter changed`);
    writeFileSync(file, good[0]);
    writeFileSync(manifest, good[1]);
  }
  const [fresh] = await ranks(t, 1);
  t.equal((await loadCheckpoint(fresh!, { dir }))?.step, 3, 'the file as saved loads');
});

t.test('pruning never removes the last step that verifies', async (t) => {
  const dir = tempDir(t);
  const bytes = (step: number): Uint8Array[] => [new Uint8Array([step, 1, 2, 3])];
  for (const step of [10, 15, 20]) for (const rank of [0, 1]) await saveRankFile(dir, step, rank, 2, 'test', bytes(step));
  // Steps 15 and 20 complete by their manifests, but rank 1's files corrupted on disk.
  for (const step of [15, 20]) writeFileSync(join(stepDirectory(dir, step), 'rank-1.safetensors'), Buffer.from([9, 9, 9, 9]));
  await pruneSteps(dir, 2, 2, 20);
  t.ok(existsSync(stepDirectory(dir, 10)), 'step 10, the only one that verifies, is kept');
  // A newer step with a manifest that is not even JSON does not make the save fail.
  mkdirSync(stepDirectory(dir, 25));
  writeFileSync(join(stepDirectory(dir, 25), 'rank-0.json'), 'not json');
  writeFileSync(join(stepDirectory(dir, 25), 'rank-1.json'), 'not json');
  await t.resolves(pruneSteps(dir, 2, 2, 20), 'a garbage manifest does not fail pruning');
  rmSync(stepDirectory(dir, 25), { recursive: true });
  // Step 20 saved again, good: now a kept step verifies, and the old ones go.
  for (const rank of [0, 1]) await saveRankFile(dir, 20, rank, 2, 'test', bytes(20));
  await pruneSteps(dir, 2, 2, 20);
  t.same([10, 15, 20].filter((s) => existsSync(stepDirectory(dir, s))), [15, 20], 'the newest two kept once one of them verifies');
});

t.test("readRankCheckpoint (one rank's file, partial recovery): the newest that verifies, a step asked for read or refused", async (t) => {
  const dir = tempDir(t);
  const trainers = await ranks(t, 2);
  await train(trainers, 3);
  await save(trainers, dir);
  const atThree = await readRankCheckpoint(dir, 1);
  await train(trainers, 3);
  await save(trainers, dir);
  const f = join(stepDirectory(dir, 6), 'rank-1.safetensors');
  const b = readFileSync(f);
  b[b.length - 2]! ^= 0x01;
  writeFileSync(f, b);
  const { value: read, warnings } = await warningsOf(() => readRankCheckpoint(dir, 1));
  t.equal(read?.step, 3, 'the step before the damaged one');
  t.same(read?.skipped.map((s) => s.step), [6]);
  t.match(read?.skipped[0]?.reason, /rank-1\.safetensors: its SHA-256 differs/);
  t.same([...read!.tensors.keys()], [...atThree!.tensors.keys()]);
  t.match(warnings, [/\(rank 1\): skipped step-0000000006: .*SHA-256 differs.*; loading step-0000000003 instead/]);
  t.equal((await readRankCheckpoint(dir, 0))?.step, 6, "rank 0's newest is whole: no fallback");
  t.same((await readRankCheckpoint(dir, 0))?.skipped, []);
  await t.rejects(readRankCheckpoint(dir, 1, 6), { code: 'ERR_CHECKPOINT', reason: 'corrupt' }, 'a step asked for is refused, not replaced');
  truncateSync(join(stepDirectory(dir, 3), 'rank-1.safetensors'), 10);
  await t.rejects(readRankCheckpoint(dir, 1), { code: 'ERR_CHECKPOINT', message: /no file of rank 1 in .* verifies/ }, 'none verifies: an error, not null');
  t.equal(await readRankCheckpoint(dir, 5), null, 'a rank that never saved: null');
});
