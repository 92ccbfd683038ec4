/**
 * Checkpoints on disk: a directory of steps, each holding one safetensors file per rank and, per
 * rank, a small manifest written after its file (format, step, rank, world size, the file's size
 * and SHA-256). A step is complete when every rank's manifest is there, and it verifies when
 * every rank's file also matches its manifest. Loading takes the newest step that verifies, so a
 * save cut short (a crash, a SIGKILL) or a damaged file leaves the previous one in use.
 *
 *     <dir>/step-0000000100/rank-0.safetensors   rank-0.json   rank-1.safetensors   rank-1.json
 *
 * Every file is written atomically: a temporary file in the same directory, fsync, rename over
 * the final name, fsync of the directory. The writes are asynchronous (libuv's threads): the
 * caller's thread only prepares the bytes. No collective is involved, so a save never changes the
 * order of a job's collectives. The ranks agree on which step to load by what is on the disk
 * alone: every rank checks every rank's manifest and file of the steps it considers, so ranks
 * that see the same directory (one shared by the job's machines, or one on the machine of a job
 * of one machine) choose the same step, whatever is damaged, and so does the launcher when it
 * says where a restart resumes.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readdir, readFile, rename, rm, stat, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Worker } from 'node:worker_threads';

import { CheckpointError, InvalidArgumentError, SapipeError } from '../errors.js';
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
const stepName = (step: number): string => `step-${String(step).padStart(10, '0')}`;
const dataFile = (rank: number): string => `rank-${rank}.safetensors`;
const manifestFile = (rank: number): string => `rank-${rank}.json`;
/** A rank's save withdrawn after it finished (retractRankSave): its old manifest, renamed. */
const retractedFile = (rank: number): string => `rank-${rank}.retracted`;

/** The OS error of a failed file operation, for messages: `ENOTDIR: not a directory, mkdir '/x/y'`. */
function osError(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function errnoOf(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^E[A-Z0-9]+$/.test(code) ? code : undefined;
}

/**
 * @internal A failure to write a checkpoint, as a CheckpointError naming the directory and the OS
 * error (errors sapipe raised itself pass through).
 */
export function writeFailure(dir: string, error: unknown): Error {
  if (error instanceof SapipeError) return error;
  return new CheckpointError(`cannot write a checkpoint to ${dir}: ${osError(error)}; give a directory this process can create and write`, { reason: 'unwritable', cause: error });
}

/**
 * Creates `path` and its missing parents. Not `mkdir({ recursive: true })`: where the kernel
 * answers ENOENT for a directory whose parent exists (procfs: `/proc/self/x`), Node's recursive
 * mkdir retries forever and its promise never settles.
 */
async function makeDirectory(path: string, depth = 0): Promise<void> {
  try {
    await mkdir(path);
  } catch (error) {
    const code = errnoOf(error);
    if (code === 'EEXIST') {
      const s = await stat(path);
      if (!s.isDirectory()) throw error;
      return;
    }
    const parent = dirname(path);
    if (code !== 'ENOENT' || parent === path || depth > 4096) throw error;
    // The parent is missing: create it, then try once more (a second ENOENT is the answer).
    await makeDirectory(parent, depth + 1);
    try {
      await mkdir(path);
    } catch (again) {
      if (errnoOf(again) !== 'EEXIST') throw again;
    }
  }
}

/** @internal Creates the checkpoint directory if missing; a CheckpointError (`unwritable`) naming it and the OS error if it cannot be. */
export async function ensureDirectory(dir: string): Promise<void> {
  try {
    await makeDirectory(dir);
  } catch (error) {
    throw writeFailure(dir, error);
  }
}

/**
 * @internal Checks that files can be created in `dir` (created if missing) by writing and removing
 * a small hidden file: a directory that cannot take a checkpoint is refused before training, not
 * at the first save.
 */
export async function probeWritable(dir: string): Promise<void> {
  await ensureDirectory(dir);
  const probe = join(dir, `.sapipe-probe-${process.pid}-${randomBytes(4).toString('hex')}`);
  try {
    const handle = await open(probe, 'wx');
    await handle.close();
    await unlink(probe);
  } catch (error) {
    await rm(probe, { force: true }).catch(() => undefined);
    throw writeFailure(dir, error);
  }
}

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

/**
 * Files known to match their manifests in this process, by path: the identity of the file then
 * (inode, size, modification time) and its SHA-256. Pruning asks whether a step verifies after
 * every save; a file written or verified here is not read again while it is unchanged.
 */
const verifiedFiles = new Map<string, string>();
const VERIFIED_FILES_LIMIT = 4096;

function fileIdentity(s: { ino: number; size: number; mtimeMs: number }, sha256: string): string {
  return `${s.ino}:${s.size}:${s.mtimeMs}:${sha256}`;
}

function rememberVerified(path: string, identity: string): void {
  verifiedFiles.delete(path);
  verifiedFiles.set(path, identity);
  if (verifiedFiles.size > VERIFIED_FILES_LIMIT) verifiedFiles.delete(verifiedFiles.keys().next().value!);
}

/**
 * Writes `chunks` to `path` atomically (a temporary file renamed over it, so a reader sees the old
 * file or the whole new one); resolves with the bytes written and their SHA-256 (computed off
 * this thread).
 * @category Checkpoints
 */
export async function writeAtomic(path: string, chunks: readonly Uint8Array[]): Promise<{ bytes: number; sha256: string }> {
  if (typeof path !== 'string' || path === '' || path.includes('\0')) throw new InvalidArgumentError(`writeAtomic: path must be a file path, got ${describeValue(path)}`);
  if (!Array.isArray(chunks) || !chunks.every((c) => c instanceof Uint8Array))
    throw new InvalidArgumentError(`writeAtomic: chunks must be an array of Uint8Arrays (Buffers), got ${describeValue(chunks)}`);
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
  await makeDirectory(at);
  await syncDirectory(dirname(at)).catch(() => undefined);
  const file = dataFile(rank);
  const { bytes, sha256 } = await writeAtomic(join(at, file), chunks);
  // What was hashed is what the file holds (read back before the rename): it verifies as written.
  const written = await stat(join(at, file)).catch(() => undefined);
  if (written !== undefined) rememberVerified(join(at, file), fileIdentity(written, sha256));
  const manifest: CheckpointManifest = { format: CHECKPOINT_FORMAT, version: CHECKPOINT_VERSION, kind, step, rank, worldSize, file, bytes, sha256 };
  await writeAtomic(join(at, manifestFile(rank)), [Buffer.from(`${JSON.stringify(manifest, null, 2)}\n`)]);
  // A save of this step withdrawn earlier is superseded; the manifest, written first, already counts.
  await rm(join(at, retractedFile(rank)), { force: true });
  return manifest;
}

/**
 * Withdraws `rank`'s finished save of `step` (a timeline rolled back): its manifest is
 * renamed aside in one atomic step, so the save no longer counts and a rank choosing a step
 * meanwhile never sees a file without its manifest (which would read as damage), then its file is
 * removed.
 * @category Checkpoints
 */
export async function retractRankSave(dir: string, step: number, rank: number): Promise<void> {
  if (typeof dir !== 'string' || dir === '' || dir.includes('\0')) throw new InvalidArgumentError(`retractRankSave: dir must be a directory path, got ${describeValue(dir)}`);
  checkInteger(step, 'retractRankSave: step', 0, Number.MAX_SAFE_INTEGER);
  checkInteger(rank, 'retractRankSave: rank', 0, 1 << 20);
  const at = stepDirectory(dir, step);
  try {
    await rename(join(at, manifestFile(rank)), join(at, retractedFile(rank)));
  } catch (error) {
    if (errnoOf(error) !== 'ENOENT') throw error;
  }
  await rm(join(at, dataFile(rank)), { force: true });
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

/** The names in `dir` (none when it does not exist); a CheckpointError naming it and the OS error when it cannot be listed. */
async function listDirectory(dir: string): Promise<string[]> {
  try {
    return await readdir(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw new CheckpointError(`${dir}: the checkpoint directory cannot be listed (${osError(error)})`, { reason: 'missing', cause: error });
  }
}

/** Steps among `names`, newest first. */
function stepsOf(names: readonly string[]): number[] {
  return names
    .map((n) => STEP_DIR.exec(n))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => b - a);
}

/** Steps in `dir`, newest first. */
async function steps(dir: string): Promise<number[]> {
  return stepsOf(await listDirectory(dir));
}

/**
 * Names a checkpoint directory may hold besides checkpoints: hidden files (an NFS client's
 * `.nfs*`, a desktop's `.DS_Store`, the probe of probeWritable) and the `lost+found` of a volume
 * mounted there.
 */
function ignorable(name: string): boolean {
  return name.startsWith('.') || name === 'lost+found';
}

/** Every rank's manifest of `step`, or undefined when one is missing or does not hold (never throws: pruning asks). */
async function manifestsOf(dir: string, step: number, worldSize: number): Promise<CheckpointManifest[] | undefined> {
  const at = stepDirectory(dir, step);
  const out: CheckpointManifest[] = [];
  for (let r = 0; r < worldSize; r++) {
    const m = await readManifest(join(at, manifestFile(r))).catch(() => undefined);
    if (m === undefined || m.step !== step || m.rank !== r || m.worldSize !== worldSize) return undefined;
    out.push(m);
  }
  return out;
}

/**
 * Checks a rank's file against its manifest (size, then SHA-256) and resolves with the fault, if
 * any. `keep`: read the file whole and give its bytes back (the caller's own rank, which it
 * decodes next: read once).
 */
async function verifyFile(path: string, manifest: CheckpointManifest, keep: boolean): Promise<{ fault?: CheckpointError; bytes?: Buffer }> {
  let s;
  try {
    s = await stat(path);
  } catch (error) {
    return { fault: new CheckpointError(`${path}: cannot be read (${osError(error)})`, { reason: 'missing', cause: error }) };
  }
  if (s.size !== manifest.bytes) return { fault: new CheckpointError(`${path}: ${s.size} bytes, its manifest says ${manifest.bytes} (truncated?)`, { reason: 'truncated' }) };
  let sha256: string;
  let bytes: Buffer | undefined;
  try {
    if (keep || s.size < INLINE_HASH_BYTES) {
      bytes = await readFile(path);
      if (bytes.byteLength !== manifest.bytes) return { fault: new CheckpointError(`${path}: ${bytes.byteLength} bytes, its manifest says ${manifest.bytes} (truncated?)`, { reason: 'truncated' }) };
      sha256 = createHash('sha256').update(bytes).digest('hex');
    } else {
      if (verifiedFiles.get(path) === fileIdentity(s, manifest.sha256)) return {};
      sha256 = await sha256OfFile(path);
    }
  } catch (error) {
    return { fault: new CheckpointError(`${path}: cannot be read (${osError(error)})`, { reason: 'missing', cause: error }) };
  }
  if (sha256 !== manifest.sha256) return { fault: new CheckpointError(`${path}: its SHA-256 differs from its manifest's: the file is corrupt`, { reason: 'corrupt' }) };
  rememberVerified(path, fileIdentity(s, sha256));
  return keep ? { bytes: bytes! } : {};
}

/** What one step of a directory is, for loading. */
type StepVerdict =
  /** Every rank's manifest and file verify; `bytes`: the file of the rank asked for. */
  | { state: 'verified'; manifests: CheckpointManifest[]; bytes?: Buffer }
  /** A save cut short: some ranks have neither manifest nor file (or withdrew their save); `finished` ranks have both. */
  | { state: 'unfinished'; finished: number[] }
  /** Something saved is wrong: a file without its manifest, a manifest that does not hold, a file that does not match. */
  | { state: 'damaged'; fault: CheckpointError };

/**
 * Faults that make a step unusable, after which loading goes on to the one before: the files of a
 * step are missing, cut short or corrupt. A file of another format version or another job shape
 * (`version`, `mismatch`) is the caller's configuration, the same for every step: it stays an error.
 */
/** @internal The faults of a step's files that loading passes over for an older step (damage, not a wrong job or version). */
export const FALLBACK_REASONS: ReadonlySet<string> = new Set(['missing', 'truncated', 'corrupt', 'foreign']);

async function judgeStep(dir: string, step: number, worldSize: number, keepRank: number | undefined): Promise<StepVerdict> {
  const at = stepDirectory(dir, step);
  let names: string[];
  try {
    names = await readdir(at);
  } catch (error) {
    return { state: 'damaged', fault: new CheckpointError(`${at}: cannot be listed (${osError(error)})`, { reason: 'missing', cause: error }) };
  }
  const present = new Set(names);
  const manifests: CheckpointManifest[] = [];
  const finished: number[] = [];
  let unfinished = false;
  for (let r = 0; r < worldSize; r++) {
    const path = join(at, manifestFile(r));
    let m: CheckpointManifest | undefined;
    try {
      m = present.has(manifestFile(r)) ? await readManifest(path) : undefined;
    } catch (error) {
      if (error instanceof CheckpointError && FALLBACK_REASONS.has(error.reason)) return { state: 'damaged', fault: error };
      throw error;
    }
    if (m === undefined) {
      // A file without its manifest is damage, unless the save was withdrawn, or cut short while
      // its manifest was being written (the manifest's temporary file is there).
      const writingManifest = names.some((n) => n.startsWith(`${manifestFile(r)}.tmp-`));
      if (present.has(dataFile(r)) && !present.has(retractedFile(r)) && !writingManifest)
        return {
          state: 'damaged',
          fault: new CheckpointError(`${join(at, dataFile(r))}: has no manifest (${manifestFile(r)} was deleted, or the save was cut short between the file and its manifest)`, { reason: 'missing' }),
        };
      unfinished = true;
      continue;
    }
    if (m.step !== step || m.rank !== r || m.file !== dataFile(r))
      return { state: 'damaged', fault: new CheckpointError(`${path} names step ${m.step}, rank ${m.rank}, file ${m.file}`, { reason: 'corrupt' }) };
    if (m.worldSize !== worldSize)
      throw new CheckpointError(`${at}: saved by a job of ${m.worldSize} ranks, loaded by one of ${worldSize}; resume with the same number of ranks`, { reason: 'mismatch' });
    manifests.push(m);
    finished.push(r);
  }
  if (unfinished) return { state: 'unfinished', finished };
  let bytes: Buffer | undefined;
  // Every rank's file, not only the caller's: the step chosen must be the same on every rank.
  for (let r = 0; r < worldSize; r++) {
    const checked = await verifyFile(join(at, manifests[r]!.file), manifests[r]!, r === keepRank);
    if (checked.fault) return { state: 'damaged', fault: checked.fault };
    if (r === keepRank) bytes = checked.bytes;
  }
  return bytes === undefined ? { state: 'verified', manifests } : { state: 'verified', manifests, bytes };
}

/** A step that loading passed over, and why. @category Checkpoints */
export interface SkippedCheckpoint {
  readonly step: number;
  /** The step's directory. */
  readonly path: string;
  /** Why it was passed over (names the file). */
  readonly reason: string;
}

/** @internal What loading takes from a directory. */
export interface CheckpointChoice {
  /** The newest step that verifies; undefined: a fresh start. */
  readonly step: number | undefined;
  /** Newer steps passed over, newest first. */
  readonly skipped: SkippedCheckpoint[];
  /** With `rank`: that rank's file of `step`, verified. */
  readonly file?: { bytes: Buffer; manifest: CheckpointManifest; path: string };
}

/**
 * @internal The step to resume from: the newest one whose every rank's manifest and file verify,
 * passing over newer steps that are unfinished (a save cut short) or damaged. A function of the
 * directory's content alone, so every rank of a job, and the launcher, choose the same step.
 * Undefined step (a fresh start) only when the directory is missing or holds nothing a save left
 * behind except saves cut short; anything else that does not verify is a CheckpointError saying
 * what is wrong and what to do. A file of another format version or another number of ranks
 * stops the search with its error.
 */
export async function chooseCheckpoint(dir: string, worldSize: number, rank?: number): Promise<CheckpointChoice> {
  const names = await listDirectory(dir);
  const skipped: SkippedCheckpoint[] = [];
  let damaged: CheckpointError | undefined;
  for (const step of stepsOf(names)) {
    const verdict = await judgeStep(dir, step, worldSize, rank);
    const path = stepDirectory(dir, step);
    if (verdict.state === 'verified') {
      const file = rank === undefined ? undefined : { bytes: verdict.bytes!, manifest: verdict.manifests[rank]!, path: join(path, verdict.manifests[rank]!.file) };
      return file === undefined ? { step, skipped } : { step, skipped, file };
    }
    if (verdict.state === 'damaged') {
      damaged ??= verdict.fault;
      skipped.push({ step, path, reason: verdict.fault.message });
    } else if (verdict.finished.length > 0) {
      const missing = Array.from({ length: worldSize }, (_, r) => r).filter((r) => !verdict.finished.includes(r));
      skipped.push({ step, path, reason: `incomplete: the save of rank${missing.length > 1 ? 's' : ''} ${missing.join(', ')} of ${worldSize} did not finish` });
    }
  }
  // Nothing verifies. A fresh start only if nothing here is a checkpoint that could be meant.
  const stray = names.filter((n) => !ignorable(n) && !STEP_DIR.test(n));
  if (damaged === undefined && stray.length === 0) return { step: undefined, skipped };
  const advice = `restore the files, or move ${dir} aside (or give an empty directory) to start afresh`;
  if (damaged !== undefined)
    throw new CheckpointError(`${damaged.message}; no checkpoint in ${dir} verifies: ${advice}`, { reason: damaged.reason, cause: damaged });
  const shown = stray.slice(0, 5).join(', ') + (stray.length > 5 ? `, and ${stray.length - 5} more` : '');
  throw new CheckpointError(
    `${dir}: holds no checkpoint (no step-NNNNNNNNNN directory that verifies) but is not empty (${shown}); a step directory renamed is not loaded, and a directory holding other files is not taken for an empty one: ${advice}`,
    { reason: 'missing' },
  );
}

/**
 * @internal Says through `process.emitWarning` (code `SAPIPE_CHECKPOINT_FALLBACK`) which newer
 * steps loading passed over and why, and which step it loads instead (or that it starts afresh).
 */
export function warnSkipped(dir: string, choice: CheckpointChoice, rank?: number): void {
  if (choice.skipped.length === 0) return;
  const to = choice.step === undefined ? 'starting afresh (no finished checkpoint)' : `loading ${stepName(choice.step)} instead`;
  const who = rank === undefined ? '' : ` (rank ${rank})`;
  process.emitWarning(`${dir}${who}: ${choice.skipped.map((s) => `skipped ${stepName(s.step)}: ${s.reason}`).join('; ')}; ${to}`, { code: 'SAPIPE_CHECKPOINT_FALLBACK' });
}

/** @internal The steps whose manifest `rank` wrote (its save finished), newest first. */
export async function rankSteps(dir: string, rank: number): Promise<number[]> {
  const out: number[] = [];
  for (const step of await steps(dir)) {
    const m = await readManifest(join(stepDirectory(dir, step), manifestFile(rank)));
    if (m !== undefined && m.step === step && m.rank === rank) out.push(step);
  }
  return out;
}

/** @internal The rank's file of `step`, checked against its manifest (size and SHA-256). */
export async function readRankFile(dir: string, step: number, rank: number): Promise<{ bytes: Buffer; manifest: CheckpointManifest; path: string }> {
  const at = stepDirectory(dir, step);
  const manifest = await readManifest(join(at, manifestFile(rank)));
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

/** Whether every rank's file of `step` matches its manifest (files verified before in this process are not read again). */
async function stepVerifies(dir: string, step: number, worldSize: number): Promise<boolean> {
  const manifests = await manifestsOf(dir, step, worldSize);
  if (manifests === undefined) return false;
  for (const m of manifests) if ((await verifyFile(join(stepDirectory(dir, step), m.file), m, false)).fault) return false;
  return true;
}

/**
 * @internal Removes complete steps older than the newest `keep` complete ones, and anything older
 * still (rank 0 does it, after saving step `saved`). Never `saved` itself or a newer step: other
 * ranks may still be writing it. A job started afresh in a directory that holds newer steps of an
 * earlier run saves its first steps below them, and removing those would pull the files from
 * under the ranks writing them. And never the last checkpoint that verifies: nothing is removed
 * until one of the steps kept verifies (every rank's file against its manifest; a file this
 * process wrote or checked is not read again), so a damaged newer step (a file corrupted on disk,
 * a step re-saved after a fallback whose other ranks have not written yet) does not count as
 * a good one.
 */
export async function pruneSteps(dir: string, worldSize: number, keep: number, saved: number): Promise<void> {
  checkInteger(keep, 'keep', 1, 1 << 20);
  const kept: number[] = [];
  const doomed: number[] = [];
  for (const step of await steps(dir)) {
    if (step >= saved) {
      if ((await manifestsOf(dir, step, worldSize)) !== undefined) kept.push(step);
      continue;
    }
    if (kept.length >= keep) doomed.push(step);
    else if ((await manifestsOf(dir, step, worldSize)) !== undefined) kept.push(step);
  }
  if (doomed.length === 0) return;
  let safe = false;
  for (const step of kept)
    if (await stepVerifies(dir, step, worldSize)) {
      safe = true;
      break;
    }
  if (!safe) return;
  for (const step of doomed) {
    const at = stepDirectory(dir, step);
    for (const path of verifiedFiles.keys()) if (path.startsWith(at)) verifiedFiles.delete(path);
    await rm(at, { recursive: true, force: true });
  }
}

/** @internal Checks a checkpoint directory argument: a path that is not an existing non-directory. */
export async function checkDirectory(dir: unknown, what: string): Promise<string> {
  if (typeof dir !== 'string' || dir === '' || dir.includes('\0')) throw new InvalidArgumentError(`${what}: dir must be a directory path, got ${describeValue(dir)}`);
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
 * @internal The scheduler position saved in `metadata`, checked as untrusted input (undefined
 * without a scheduler to continue). A scheduler passed for a checkpoint saved without one is a
 * CheckpointError: continuing from step 0 would silently restart the schedule. Read before the
 * trainer changes, applied (restoreScheduler) after.
 */
export function savedSchedulerState(scheduler: LrScheduler | undefined, metadata: Record<string, string>, path: string): LrSchedulerState | undefined {
  if (scheduler === undefined) return undefined;
  if (metadata.lrScheduler === undefined)
    throw new CheckpointError(`${path}: saved without a scheduler's position; save with { scheduler } to continue one, or load without it`, { reason: 'mismatch' });
  let state: LrSchedulerState;
  try {
    state = JSON.parse(metadata.lrScheduler) as LrSchedulerState;
  } catch (error) {
    throw new CheckpointError(`${path}: the scheduler's position is not JSON`, { reason: 'corrupt', cause: error });
  }
  if (state === null || typeof state !== 'object') throw new CheckpointError(`${path}: the scheduler's position is not an object`, { reason: 'corrupt' });
  checkCount(state.step, 'the scheduler\'s step', path);
  checkRate(state.baseLr, 'the scheduler\'s base learning rate', path);
  return state;
}

/** @internal Continues `scheduler` from a position savedSchedulerState() checked. */
export function restoreScheduler(scheduler: LrScheduler | undefined, state: LrSchedulerState | undefined, path: string): void {
  if (scheduler === undefined || state === undefined) return;
  try {
    scheduler.loadState(state);
  } catch (error) {
    throw new CheckpointError(`${path}: the scheduler cannot continue from the saved position: ${(error as Error).message}`, { reason: 'mismatch', cause: error });
  }
}

/**
 * @internal A counter read from a checkpoint (a step count, a number of calls or skips): a
 * non-negative safe integer, or a CheckpointError. A file is untrusted input: a count of 1e300
 * passes Number.isInteger and would make every later count meaningless.
 */
export function checkCount(value: unknown, what: string, path: string): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0)
    throw new CheckpointError(`${path}: ${what} is ${describeValue(value)}, not a non-negative integer below 2^53; the file is corrupt or was not written by sapipe`, { reason: 'corrupt' });
  return value;
}

/** @internal A learning rate or other rate read from a checkpoint: finite and non-negative, or a CheckpointError. */
export function checkRate(value: unknown, what: string, path: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0)
    throw new CheckpointError(`${path}: ${what} is ${describeValue(value)}, not a finite non-negative number; the file is corrupt or was not written by sapipe`, { reason: 'corrupt' });
  return value;
}
