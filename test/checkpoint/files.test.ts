/**
 * Checkpoint files: what a save writes (a safetensors file per rank that Python reads with numpy
 * alone, and a manifest), and everything that can be wrong with one is a CheckpointError with the
 * reason and the file named, the trainer left as it was: a truncated file, a flipped bit in the
 * data or the header, a foreign file, another format version, another model, another optimizer,
 * another mode, another number of ranks. And 20 SIGKILLs of a process saving in a loop (a real
 * process, files of 4 MB per rank): after each, the newest complete checkpoint loads and verifies.
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import t, { type Test } from 'tap';

import { CheckpointError, DataParallelTrainer, LocalCommunicator, ParamSet, decodeSafetensors, loadCheckpoint, saveCheckpoint } from '../../dist/index.js';

const FIXTURE = fileURLToPath(new URL('../fixtures/checkpoint/train.mjs', import.meta.url));
const PYTHON_READER = fileURLToPath(new URL('../fixtures/checkpoint/read_safetensors.py', import.meta.url));

async function oneRank(t: Test, layout: Record<string, number[]>, config: Record<string, unknown>): Promise<DataParallelTrainer> {
  const comm = await LocalCommunicator.create({ group: `ckpt-files-${process.pid}-${Math.random()}`, rank: 0, size: 1 });
  const params = new ParamSet(layout);
  params.weights.array.forEach((_, i, a) => (a[i] = Math.sin(i)));
  const trainer = await DataParallelTrainer.create({ comm, params, ...config } as never);
  t.teardown(async () => {
    await trainer.dispose();
    comm.destroy();
    params.dispose();
  });
  return trainer;
}

async function trainSome(trainer: DataParallelTrainer, steps: number): Promise<void> {
  for (let s = 0; s < steps; s++) {
    trainer.grads.array.forEach((_, i, a) => (a[i] = 0.01 * Math.cos(i + s)));
    await trainer.step();
  }
}

const LAYOUT = { 'encoder.weight': [6, 4], 'encoder.bias': [6], head: [3] };
const SGDM = { mode: 'pipe-sgd', optimizer: { kind: 'sgd', lr: 0.1, momentum: 0.9 } };

t.test('a save writes a safetensors file and a manifest; Python with numpy reads the weights as sapipe holds them', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-ckpt-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const trainer = await oneRank(t, LAYOUT, SGDM);
  await trainSome(trainer, 3);
  const save = await saveCheckpoint(trainer, { dir, extra: { epoch: 1, batch: 17 } });
  const saved = await save.written;
  t.equal(saved.step, 3);
  t.same(readdirSync(saved.path).sort(), ['rank-0.json', 'rank-0.safetensors'], 'the file and its manifest, no temporary left');
  const manifest = JSON.parse(readFileSync(join(saved.path, 'rank-0.json'), 'utf8'));
  t.match(manifest, { format: 'sapipe-checkpoint', version: 1, step: 3, rank: 0, worldSize: 1, file: 'rank-0.safetensors', bytes: saved.bytes });
  const state = await trainer.exportState();
  const py = JSON.parse(execFileSync('python3', [PYTHON_READER, join(saved.path, 'rank-0.safetensors')], { encoding: 'utf8' }));
  for (const name of trainer.params.names) {
    const want = Array.from(trainer.params.view(trainer.params.weights, name));
    t.same(py.tensors[`weights/${name}`].shape, trainer.params.layout(name).shape, `${name}: the shape`);
    t.same(py.tensors[`weights/${name}`].values, want, `${name}: the values, bit for bit`);
  }
  t.same(py.tensors['optimizer/momentum'].values, Array.from(state.optimizer.buffers.momentum!), 'the momentum');
  t.equal(py.metadata.format, 'sapipe-checkpoint');
  t.same(JSON.parse(py.metadata.extra), { epoch: 1, batch: 17 });
});

t.test('every fault is a CheckpointError naming the file and the reason, and the trainer is left as it was', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-ckpt-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const source = await oneRank(t, LAYOUT, SGDM);
  await trainSome(source, 4);
  const saved = await (await saveCheckpoint(source, { dir })).written;
  const file = join(saved.path, 'rank-0.safetensors');
  const manifestPath = join(saved.path, 'rank-0.json');
  const good = readFileSync(file);
  const goodManifest = readFileSync(manifestPath, 'utf8');
  const restore = (): void => {
    writeFileSync(file, good);
    writeFileSync(manifestPath, goodManifest);
  };
  const fresh = await oneRank(t, LAYOUT, SGDM);
  const before = Array.from(fresh.params.weights.array);
  const expectFault = async (what: string, reason: string, message: RegExp, into: DataParallelTrainer = fresh): Promise<void> => {
    const error = await loadCheckpoint(into, { dir }).then(
      () => undefined,
      (e: unknown) => e,
    );
    t.ok(error instanceof CheckpointError, `${what}: a CheckpointError (${String(error)})`);
    t.match(error, { code: 'ERR_CHECKPOINT', reason, message }, what);
    t.same(Array.from(into.params.weights.array), before, `${what}: the trainer is unchanged`);
    restore();
  };
  truncateSync(file, good.length - 10);
  await expectFault('a truncated file', 'truncated', /rank-0\.safetensors.*truncated/);
  const flipped = Buffer.from(good);
  flipped[flipped.length - 3]! ^= 0x10;
  writeFileSync(file, flipped);
  await expectFault('a bit flipped in the data', 'corrupt', /SHA-256/);
  const header = Buffer.from(good);
  header[20]! ^= 0x01;
  writeFileSync(file, header);
  await expectFault('a bit flipped in the header', 'corrupt', /SHA-256/);
  writeFileSync(manifestPath, goodManifest.replace('"version": 1', '"version": 7'));
  await expectFault('another format version', 'version', /version 7; this sapipe reads version 1/);
  writeFileSync(manifestPath, '{"format":"something-else"}');
  await expectFault('a foreign manifest', 'foreign', /not a sapipe checkpoint manifest/);
  // A file that passes its manifest but is not safetensors (its manifest rewritten to match).
  const junk = Buffer.from('PK\u0003\u0004 this is a zip file, not safetensors');
  writeFileSync(file, junk);
  const sha = execFileSync('sha256sum', [file], { encoding: 'utf8' }).split(' ')[0];
  writeFileSync(manifestPath, goodManifest.replace(/"bytes": \d+/, `"bytes": ${junk.length}`).replace(/"sha256": "[0-9a-f]+"/, `"sha256": "${sha}"`));
  await expectFault('a foreign file', 'foreign', /not a safetensors file/);

  const otherModel = await oneRank(t, { 'encoder.weight': [6, 5], 'encoder.bias': [6], head: [3] }, SGDM);
  await expectFault('another model', 'mismatch', /saved for a model with tensors/, otherModel);
  const otherOptimizer = await oneRank(t, LAYOUT, { mode: 'pipe-sgd', optimizer: { kind: 'adam', lr: 0.01 } });
  await expectFault('another optimizer', 'mismatch', /optimizer of kind "sgd", this trainer's is "adam"/, otherOptimizer);
  const otherMode = await oneRank(t, LAYOUT, { ...SGDM, mode: 'sapipe-dc' });
  await expectFault('another mode', 'mismatch', /saved in mode "pipe-sgd", this trainer runs "sapipe-dc"/, otherMode);

  // Another number of ranks: a manifest of a 2-rank job in the same directory.
  writeFileSync(manifestPath, goodManifest.replace('"worldSize": 1', '"worldSize": 2'));
  await expectFault('another number of ranks', 'mismatch', /saved by a job of 2 ranks, loaded by one of 1/);

  const loaded = await loadCheckpoint(fresh, { dir });
  t.equal(loaded?.step, 4, 'the restored file loads');
  t.same(Array.from(fresh.params.weights.array), Array.from(source.params.weights.array), 'and gives the saved weights');
  t.equal(await loadCheckpoint(fresh, { dir: join(dir, 'empty') }), null, 'a directory without checkpoints: null');
  await t.rejects(saveCheckpoint(fresh, { dir: file }), { code: 'ERR_INVALID_ARGUMENT', message: /not a directory/ });
  await t.rejects(saveCheckpoint(fresh, { dir, extra: { big: 1n } }), { code: 'ERR_INVALID_ARGUMENT', message: /JSON/ });
});

t.test('decodeSafetensors checks what it reads', async (t) => {
  const bad = (bytes: Buffer, reason: string, message: RegExp, what: string): void => {
    t.throws(() => decodeSafetensors(bytes, 'x'), { code: 'ERR_CHECKPOINT', reason, message }, what);
  };
  const file = (header: unknown, data = Buffer.alloc(0)): Buffer => {
    const json = Buffer.from(JSON.stringify(header));
    const n = Buffer.alloc(8);
    n.writeBigUInt64LE(BigInt(json.length));
    return Buffer.concat([n, json, data]);
  };
  bad(Buffer.alloc(4), 'truncated', /too short/, 'shorter than the length');
  bad(file({ a: { dtype: 'F32', shape: [2], data_offsets: [0, 8] } }, Buffer.alloc(4)), 'truncated', /not inside/, 'data cut short');
  bad(file({ a: { dtype: 'F16', shape: [2], data_offsets: [0, 4] } }, Buffer.alloc(4)), 'foreign', /dtype F16/, 'a dtype checkpoints do not use');
  bad(file({ a: { dtype: 'F32', shape: [3], data_offsets: [0, 8] } }, Buffer.alloc(8)), 'corrupt', /8 bytes for shape \[3\]/, 'a shape that does not fit its bytes');
  bad(file({ a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] }, b: { dtype: 'F32', shape: [1], data_offsets: [0, 4] } }, Buffer.alloc(8)), 'corrupt', /gap or an overlap/, 'overlapping tensors');
  bad(file({ a: { dtype: 'F32', shape: [1], data_offsets: [0, 4] } }, Buffer.alloc(8)), 'corrupt', /4 bytes after the last tensor/, 'trailing bytes');
  bad(file([1, 2]), 'corrupt', /not a JSON object/, 'a header that is not an object');
  const huge = Buffer.alloc(16);
  huge.writeBigUInt64LE(2n ** 40n);
  bad(huge, 'foreign', /not a safetensors file/, 'an absurd header length');
});

t.test('20 SIGKILLs of a process saving in a loop: the newest complete checkpoint always loads and verifies', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-ckpt-kill-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const config = { mode: 'pipe-sgd', optimizer: { kind: 'sgd', lr: 0.01, momentum: 0.9 } };
  let duringWrite = 0;
  const seen = new Set<string>(); // temporary files of earlier kills
  let lastStep = -1;
  const KILLS = 20;
  for (let k = 0; k < KILLS; k++) {
    const child = spawn(process.execPath, [FIXTURE, JSON.stringify({ dir, config, loop: true, size: 1 << 19, group: `kill-${k}` })], { env: { ...process.env, NODE_OPTIONS: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve));
    // Kill at a random moment once it has saved at least once after start (so saves are under
    // way). A child that exits first, or has not saved within 60 s, fails the test with its
    // stderr instead of leaving it waiting.
    const saved = await new Promise<boolean>((resolve) => {
      const poll = setInterval(() => {
        if (/SAVED/.test(out)) {
          clearInterval(poll);
          clearTimeout(limit);
          setTimeout(() => resolve(true), Math.random() * 150);
        }
      }, 5);
      const limit = setTimeout(() => {
        clearInterval(poll);
        resolve(false);
      }, 60_000);
      void closed.then(() => {
        clearInterval(poll);
        clearTimeout(limit);
        resolve(/SAVED/.test(out));
      });
    });
    child.kill('SIGKILL');
    const code = await closed;
    if (!saved) {
      t.fail(`kill ${k + 1}: the saving process never saved (exit ${String(code)}); its stderr: ${err.slice(-2000)}`);
      break;
    }
    const leftovers = readdirSync(dir).flatMap((d) => readdirSync(join(dir, d)).filter((f) => f.includes('.tmp-')).map((f) => join(d, f)));
    if (leftovers.some((f) => !seen.has(f))) duringWrite++;
    for (const f of leftovers) seen.add(f);
    const verify = execFileSync(process.execPath, [FIXTURE, JSON.stringify({ dir, config, verify: true, size: 1 << 19, group: `verify-${k}` })], { encoding: 'utf8', env: { ...process.env, NODE_OPTIONS: '' } });
    const steps = JSON.parse(/VERIFIED (.*)/.exec(verify)![1]!) as (number | null)[];
    t.ok(steps[0] !== null && steps[0] === steps[1], `kill ${k + 1}: both ranks loaded step ${steps[0]}`);
    lastStep = steps[0] ?? -1;
  }
  t.ok(lastStep > 0, 'checkpoints were made');
  t.comment(`${duringWrite} of ${KILLS} kills left a save half-written (temporary files); every time the newest complete checkpoint loaded and verified`);
  t.ok(duringWrite > 0, `some kills landed during a write (${duringWrite} of ${KILLS})`);
});
