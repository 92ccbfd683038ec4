/**
 * Checkpoints on disk: a directory of steps, each holding one safetensors file per rank and, per
 * rank, a small manifest written after its file (format, step, rank, world size, the file's size
 * and SHA-256). A step is complete when every rank's manifest is there; loading takes the newest
 * complete step, so a save cut short (a crash, a SIGKILL) leaves the previous one in use.
 *
 *     <dir>/step-0000000100/rank-0.safetensors   rank-0.json   rank-1.safetensors   rank-1.json
 *
 * Every file is written atomically: a temporary file in the same directory, fsync, rename over
 * the final name, fsync of the directory. The writes are asynchronous (libuv's threads): the
 * caller's thread only prepares the bytes. No collective is involved, so a save never changes the
 * order of a job's collectives; the ranks agree on which step to load by the manifests alone
 * (a shared directory, or one per machine for ranks of one machine).
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Worker } from 'node:worker_threads';

import { CheckpointError, InvalidArgumentError } from '../errors.js';
import { checkInteger, describeValue } from '../validate.js';
import { LrScheduler, type LrSchedulerState } from '../optim/lr-schedule.js';

/** @internal What every manifest and file says it is. */
export const CHECKPOINT_FORMAT = 'sapipe-checkpoint';
/** The format version this sapipe writes and reads. @category Checkpoints */
export const CHECKPOINT_VERSION = 1;

/** A rank's manifest. @category Checkpoints */
export interface CheckpointManifest {
  readonly format: typeof CHECKPOINT_FORMAT;
  readonly version: number;
  /** What saved it (`data-parallel-trainer`). */
  readonly kind: string;
  readonly step: number;
  readonly rank: number;
  readonly worldSize: number;
  /** The rank's file, relative to the step's directory. */
  readonly file: string;
  readonly bytes: number;
  readonly sha256: string;
}

/** @internal The directory of a step. */
export function stepDirectory(dir: string, step: number): string {
  return join(dir, `step-${String(step).padStart(10, '0')}`);
}
const STEP_DIR = /^step-(\d{10})$/;

/**
 * The SHA-256 of a file, computed by a worker thread that reads it back (from the page cache, just
 * written): hashing 134 MB takes about 95 ms here, which on the training thread would stall every
 * step meanwhile. The worker's code is inline (CommonJS), so it runs the same from the sources and
 * from the build.
 */
const HASH_WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const { createReadStream } = require('node:fs');
const hash = createHash('sha256');
createReadStream(workerData, { highWaterMark: 1 << 22 })
  .on('data', (chunk) => hash.update(chunk))
  .on('end', () => parentPort.postMessage({ sha256: hash.digest('hex') }))
  .on('error', (error) => parentPort.postMessage({ error: error.message }));
`;

/** Below this a file is hashed on the calling thread: a worker's start costs more than the hash. */
const INLINE_HASH_BYTES = 1 << 20;

function sha256OfFile(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const worker = new Worker(HASH_WORKER, { eval: true, workerData: path });
    worker.once('message', (m: { sha256?: string; error?: string }) => (m.sha256 !== undefined ? resolve(m.sha256) : reject(new Error(`cannot read ${path} back: ${m.error}`))));
    worker.once('error', reject);
    worker.once('exit', (code) => reject(new Error(`the hashing thread exited with code ${code}`)));
  });
}

/** @internal Writes `chunks` to `path` atomically; resolves with the bytes written and their SHA-256 (computed off this thread). */
export async function writeAtomic(path: string, chunks: readonly Uint8Array[]): Promise<{ bytes: number; sha256: string }> {
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
  let bytes = 0;
  let sha256: string;
  const handle = await open(tmp, 'w');
  try {
    for (const chunk of chunks) {
      let at = 0;
      while (at < chunk.byteLength) {
        const { bytesWritten } = await handle.write(chunk, at, chunk.byteLength - at);
        at += bytesWritten;
      }
      bytes += chunk.byteLength;
    }
    await handle.sync();
    // A small file (a manifest) is hashed here; a large one by a worker thread reading back what
    // reached the file, so that the training thread is not stalled for the hash.
    sha256 = bytes < INLINE_HASH_BYTES ? chunks.reduce((h, c) => h.update(c), createHash('sha256')).digest('hex') : await sha256OfFile(tmp);
  } catch (error) {
    await handle.close().catch(() => undefined);
    await rm(tmp, { force: true });
    throw error;
  }
  await handle.close();
  await rename(tmp, path);
  await syncDirectory(dirname(path));
  return { bytes, sha256 };
}

/** Makes a rename in `dir` durable. */
async function syncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** @internal Writes the rank's file, then its manifest (which makes it count): both atomic. */
export async function saveRankFile(dir: string, step: number, rank: number, worldSize: number, kind: string, chunks: readonly Uint8Array[]): Promise<CheckpointManifest> {
  const at = stepDirectory(dir, step);
  await mkdir(at, { recursive: true });
  await syncDirectory(dirname(at)).catch(() => undefined);
  const file = `rank-${rank}.safetensors`;
  const { bytes, sha256 } = await writeAtomic(join(at, file), chunks);
  const manifest: CheckpointManifest = { format: CHECKPOINT_FORMAT, version: CHECKPOINT_VERSION, kind, step, rank, worldSize, file, bytes, sha256 };
  await writeAtomic(join(at, `rank-${rank}.json`), [Buffer.from(`${JSON.stringify(manifest, null, 2)}\n`)]);
  return manifest;
}

/** Reads and checks a manifest; undefined if it does not exist. */
async function readManifest(path: string): Promise<CheckpointManifest | undefined> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new CheckpointError(`${path}: cannot be read (${(error as Error).message})`, { reason: 'missing', cause: error });
  }
  let m: Partial<CheckpointManifest>;
  try {
    m = JSON.parse(text) as Partial<CheckpointManifest>;
  } catch (error) {
    throw new CheckpointError(`${path}: not JSON; a corrupt manifest`, { reason: 'corrupt', cause: error });
  }
  if (m === null || typeof m !== 'object' || m.format !== CHECKPOINT_FORMAT) throw new CheckpointError(`${path}: not a sapipe checkpoint manifest`, { reason: 'foreign' });
  if (m.version !== CHECKPOINT_VERSION)
    throw new CheckpointError(`${path}: checkpoint format version ${describeValue(m.version)}; this sapipe reads version ${CHECKPOINT_VERSION}`, { reason: 'version' });
  for (const key of ['step', 'rank', 'worldSize', 'bytes'] as const)
    if (!Number.isSafeInteger(m[key]) || (m[key] as number) < 0) throw new CheckpointError(`${path}: ${key} is not a non-negative integer`, { reason: 'corrupt' });
  if (typeof m.file !== 'string' || !/^rank-\d+\.safetensors$/.test(m.file) || typeof m.sha256 !== 'string' || typeof m.kind !== 'string')
    throw new CheckpointError(`${path}: file, sha256 or kind is missing`, { reason: 'corrupt' });
  return m as CheckpointManifest;
}

/** Steps in `dir`, newest first. */
async function steps(dir: string): Promise<number[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw new CheckpointError(`${dir}: cannot be listed (${(error as Error).message})`, { reason: 'missing', cause: error });
  }
  return names
    .map((n) => STEP_DIR.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => b - a);
}

/** Whether every rank of `worldSize` has its manifest for `step`, each naming that step and world size. */
async function complete(dir: string, step: number, worldSize: number): Promise<boolean> {
  const at = stepDirectory(dir, step);
  for (let r = 0; r < worldSize; r++) {
    const m = await readManifest(join(at, `rank-${r}.json`));
    if (m === undefined) return false;
    if (m.step !== step || m.rank !== r) throw new CheckpointError(`${join(at, `rank-${r}.json`)} names step ${m.step}, rank ${m.rank}`, { reason: 'corrupt' });
    if (m.worldSize !== worldSize)
      throw new CheckpointError(`${at}: saved by a job of ${m.worldSize} ranks, loaded by one of ${worldSize}; resume with the same number of ranks`, { reason: 'mismatch' });
  }
  return true;
}

/** @internal The newest step every rank saved completely, or undefined. */
export async function latestCompleteStep(dir: string, worldSize: number): Promise<number | undefined> {
  for (const step of await steps(dir)) if (await complete(dir, step, worldSize)) return step;
  return undefined;
}

/** @internal The steps whose manifest `rank` wrote (its save finished), newest first. */
export async function rankSteps(dir: string, rank: number): Promise<number[]> {
  const out: number[] = [];
  for (const step of await steps(dir)) {
    const m = await readManifest(join(stepDirectory(dir, step), `rank-${rank}.json`));
    if (m !== undefined && m.step === step && m.rank === rank) out.push(step);
  }
  return out;
}

/** @internal The rank's file of `step`, checked against its manifest (size and SHA-256). */
export async function readRankFile(dir: string, step: number, rank: number): Promise<{ bytes: Buffer; manifest: CheckpointManifest; path: string }> {
  const at = stepDirectory(dir, step);
  const manifest = await readManifest(join(at, `rank-${rank}.json`));
  if (manifest === undefined) throw new CheckpointError(`${at}: rank ${rank} has no manifest (its save did not finish)`, { reason: 'missing' });
  const path = join(at, manifest.file);
  let bytes: Buffer;
  try {
    bytes = await readFile(path);
  } catch (error) {
    throw new CheckpointError(`${path}: cannot be read (${(error as Error).message})`, { reason: 'missing', cause: error });
  }
  if (bytes.byteLength !== manifest.bytes) throw new CheckpointError(`${path}: ${bytes.byteLength} bytes, its manifest says ${manifest.bytes} (truncated?)`, { reason: 'truncated' });
  const sha256 = createHash('sha256').update(bytes).digest('hex');
  if (sha256 !== manifest.sha256) throw new CheckpointError(`${path}: its SHA-256 differs from its manifest's: the file is corrupt`, { reason: 'corrupt' });
  return { bytes, manifest, path };
}

/**
 * @internal Removes complete steps older than the newest `keep` complete ones, and anything older
 * still (rank 0 does it, after saving step `saved`). Never `saved` itself or a newer step: other
 * ranks may still be writing it. A job started afresh in a directory that holds newer steps of an
 * earlier run saves its first steps below them, and removing those would pull the files from
 * under the ranks writing them.
 */
export async function pruneSteps(dir: string, worldSize: number, keep: number, saved: number): Promise<void> {
  checkInteger(keep, 'keep', 1, 1 << 20);
  let kept = 0;
  for (const step of await steps(dir)) {
    if (step >= saved) {
      if (await complete(dir, step, worldSize)) kept++;
      continue;
    }
    if (kept >= keep) await rm(stepDirectory(dir, step), { recursive: true, force: true });
    else if (await complete(dir, step, worldSize)) kept++;
  }
}

/** @internal Checks a checkpoint directory argument. */
export async function checkDirectory(dir: unknown, what: string): Promise<string> {
  if (typeof dir !== 'string' || dir === '') throw new InvalidArgumentError(`${what}: dir must be a directory path, got ${describeValue(dir)}`);
  const s = await stat(dir).catch(() => undefined);
  if (s !== undefined && !s.isDirectory()) throw new InvalidArgumentError(`${what}: ${dir} exists and is not a directory`);
  return dir;
}

/** @internal An optional scheduler option: an LrScheduler or undefined. */
export function checkScheduler(scheduler: unknown, what: string): void {
  if (scheduler !== undefined && !(scheduler instanceof LrScheduler))
    throw new InvalidArgumentError(`${what}: scheduler must be an LrScheduler, got ${describeValue(scheduler)}`);
}

/** @internal The metadata entry that keeps a scheduler's position (none without a scheduler). */
export function schedulerMetadata(scheduler: unknown, what: string): { lrScheduler?: string } {
  checkScheduler(scheduler, what);
  return scheduler === undefined ? {} : { lrScheduler: JSON.stringify((scheduler as LrScheduler).state()) };
}

/**
 * @internal Continues `scheduler` from the position saved in `metadata`. A scheduler passed for a
 * checkpoint saved without one is a CheckpointError: continuing from step 0 would silently
 * restart the schedule.
 */
export function restoreScheduler(scheduler: LrScheduler | undefined, metadata: Record<string, string>, path: string): void {
  if (scheduler === undefined) return;
  if (metadata.lrScheduler === undefined)
    throw new CheckpointError(`${path}: saved without a scheduler's position; save with { scheduler } to continue one, or load without it`, { reason: 'mismatch' });
  let state: LrSchedulerState;
  try {
    state = JSON.parse(metadata.lrScheduler) as LrSchedulerState;
  } catch (error) {
    throw new CheckpointError(`${path}: the scheduler's position is not JSON`, { reason: 'corrupt', cause: error });
  }
  scheduler.loadState(state);
}
