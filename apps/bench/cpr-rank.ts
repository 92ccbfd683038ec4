/**
 * One rank of `sapipe bench cpr` (a process started by `sapipe launch --max-restarts`, so the
 * rendezvous comes from the environment): trains the recommendation model under one recovery
 * policy, injects the failures of the schedule (the victim SIGKILLs itself at the start of its
 * step, once per failure: a marker file says it happened), hands its state off when it survives
 * a failure (partial policies), and at the end evaluates on the test set. argv[2]: CprRankData as
 * JSON. Rank 0 prints its events and its report as lines after EVENT_PREFIX and REPORT_PREFIX.
 */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';

import { PeerLostError, UcxCommunicator } from 'sapipe';
import { readClickData, type ClickData } from '../recsys/clicks.js';
import { CprCheckpointer, type CprResume, type CprStats, type RecoveryPolicy } from '../recsys/cpr.js';
import { ClickModel, type ClickMetrics } from '../recsys/model.js';
import { runAsRankScript } from './rank-script.js';

export const EVENT_PREFIX = 'SAPIPE_CPR_EVENT ';
export const REPORT_PREFIX = 'SAPIPE_CPR_REPORT ';

/** What the driver passes each rank. */
export interface CprRankData {
  /** `none`: no checkpoints and no failures (the baseline the overheads are measured against). */
  policy: RecoveryPolicy | 'none';
  dir: string;
  handoffDir: string;
  /** Where the failure markers go. */
  workDir: string;
  saveEvery: number;
  priorityFraction: number;
  ssuSampleRate: number;
  /** Steps at whose start a failure is injected; failure i kills rank (i + 1) % size. */
  failAt: number[];
  steps: number;
  batch: number;
  tables: number[];
  dim: number;
  dense: number;
  hidden: number[];
  /** The data sets (writeClickData), generated once by the driver. */
  trainFile: string;
  testFile: string;
  seed: number;
  embeddingLr: number;
  lr: number;
}

/** What a rank that kills itself writes first. */
export interface FailureMarker {
  /** Wall clock, ms since the epoch. */
  at: number;
  /** Row updates of its shard that no save holds. */
  unsavedUpdates: number;
}

/** A resume, as rank 0 saw it. */
export interface CprEvent {
  /** Wall clock (ms since the epoch) when the ranks were ready to train again. */
  at: number;
  attempt: number;
  resume: CprResume;
}

/** Rank 0's report at the end of the job. */
export interface CprRankReport {
  policy: CprRankData['policy'];
  metrics: ClickMetrics;
  /** Steps this attempt ran (the last attempt). */
  stepsRun: number;
  /** Wall clock of the last step's end. */
  endedAt: number;
  stats: CprStats | null;
  /** The baseline: a full save's stall on the training thread (mean), its file's write, and its cost to training (see measureSave), ms. */
  saveCost?: { stallMs: number; writeMs: number; costMs: number };
}

/**
 * What a full save costs training, measured two ways: the snapshot on the training thread (its
 * stall), and the steps' slowdown while saving (alternating stretches of steps without and with
 * a save every SAVE_EVERY steps: the background writes compete with training for the cores and
 * the disk, and a step waits for the slowest rank). The larger is the save cost the intervals use.
 */
async function measureSave(model: ClickModel, data: CprRankData, train: ClickData, perEpoch: number): Promise<NonNullable<CprRankReport['saveCost']>> {
  const STEPS = 120;
  const SAVE_EVERY = 10;
  const { rank, size } = model.comm;
  const cpr = await CprCheckpointer.create(model, { dir: join(data.workDir, 'save-cost'), policy: 'full', saveEvery: SAVE_EVERY });
  let plain = 0;
  let saving = 0;
  let at = 0;
  const stretch = async (save: boolean): Promise<number> => {
    const start = performance.now();
    for (let i = 0; i < STEPS; i++, at++) {
      await model.trainStep(train, ((at % perEpoch) * size + rank) * data.batch, data.batch);
      if (save) await cpr.afterStep();
    }
    await cpr.close();
    return performance.now() - start;
  };
  for (let r = 0; r < 2; r++) {
    plain += await stretch(false);
    saving += await stretch(true);
  }
  const saves = cpr.costSoFar.fullSaves;
  return {
    stallMs: cpr.costSoFar.saveMs / saves,
    writeMs: cpr.costSoFar.lastSaved!.writeMs,
    costMs: Math.max(cpr.costSoFar.saveMs / saves, (saving - plain) / saves),
  };
}

async function main(): Promise<void> {
  const data = JSON.parse(process.argv[2] ?? '{}') as CprRankData;
  const attempt = Number(process.env.SAPIPE_RESTART_COUNT ?? 0);
  let cpr: CprCheckpointer | null = null;
  // The launcher's SIGTERM after another rank's failure: a survivor hands its state off at once
  // (from its last complete step, whatever collective it is blocked in) and leaves.
  process.on('SIGTERM', () => {
    if (cpr && data.policy !== 'full') cpr.handOff();
    process.exit(1);
  });
  const comm = await UcxCommunicator.create({ timeoutMs: 20_000 });
  const { rank, size } = comm;
  const train = readClickData(data.trainFile);
  const test = readClickData(data.testFile);
  const model = await ClickModel.create({
    comm,
    tables: data.tables,
    dim: data.dim,
    denseFeatures: data.dense,
    hidden: data.hidden,
    seed: data.seed,
    embeddingLr: data.embeddingLr,
    optimizer: { kind: 'sgd', lr: data.lr, momentum: 0.9 },
  });
  cpr =
    data.policy === 'none'
      ? null
      : await CprCheckpointer.create(model, {
          dir: data.dir,
          policy: data.policy,
          saveEvery: data.saveEvery,
          priorityFraction: data.priorityFraction,
          ssuSampleRate: data.ssuSampleRate,
          handoffDir: data.handoffDir,
          seed: data.seed,
        });
  const first = cpr?.resumed.step ?? 0;
  const resume = cpr?.resumed ?? { step: 0, kind: 'fresh', reloaded: [], reloadedFrom: [], ms: 0 };
  if (rank === 0) process.stdout.write(`${EVENT_PREFIX}${JSON.stringify({ at: Date.now(), attempt, resume } satisfies CprEvent)}\n`);
  const perEpoch = Math.floor(train.samples / (size * data.batch));
  let step = first;
  try {
    for (; step < data.steps; step++) {
      const failure = data.policy === 'none' ? -1 : data.failAt.indexOf(step);
      if (failure >= 0 && rank === (failure + 1) % size) {
        const marker = join(data.workDir, `failure-${failure}`);
        if (!existsSync(marker)) {
          // When it died, and the row updates of its shard no save holds (what partial recovery loses).
          writeFileSync(marker, JSON.stringify({ at: Date.now(), unsavedUpdates: cpr!.unsavedUpdates() } satisfies FailureMarker));
          process.kill(process.pid, 'SIGKILL');
        }
      }
      await model.trainStep(train, ((step % perEpoch) * size + rank) * data.batch, data.batch);
      await cpr?.afterStep();
    }
  } catch (error) {
    if (cpr && data.policy !== 'full' && error instanceof PeerLostError) cpr.handOff();
    throw error;
  }
  const endedAt = Date.now();
  await cpr?.close();
  const metrics = await model.evaluate(test, 512);
  // The baseline measures what a full save costs the training thread and how long its file takes.
  const saveCost = data.policy === 'none' ? await measureSave(model, data, train, perEpoch) : undefined;
  if (rank === 0)
    process.stdout.write(
      `${REPORT_PREFIX}${JSON.stringify({ policy: data.policy, metrics, stepsRun: step - first, endedAt, stats: cpr ? cpr.costSoFar : null, ...(saveCost && { saveCost }) } satisfies CprRankReport)}\n`,
    );
  await model.dispose();
  comm.destroy();
}

// Run only as a script, so that the driver can import the prefixes.
runAsRankScript(import.meta.url, main);
