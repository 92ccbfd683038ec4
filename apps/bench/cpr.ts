/**
 * The CPR experiment (`sapipe bench cpr`): the recommendation model trained by `ranks` ucx
 * processes under `sapipe launch --max-restarts`, first without checkpoints or failures (the
 * baseline: its training time, step time and the cost of a save), then under each recovery
 * policy with the same failures injected on a fixed schedule (SIGKILLed ranks). Intervals follow
 * ALGORITHMS.md section 7: Young's for full recovery, CPR's for the partial policies, from the
 * measured save cost and the failures' spacing. For each policy: the time lost as a share of the
 * baseline's training time (saves, restarts, recomputed steps), and the final loss and AUC.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { BackendUnavailableError, InvalidArgumentError } from 'sapipe';
import { checkInteger, checkNumber } from 'sapipe/validate';
import { syntheticClicks, writeClickData } from '../recsys/clicks.js';
import { cprIntervalSeconds, RECOVERY_POLICIES, youngIntervalSeconds, type RecoveryPolicy } from '../recsys/cpr.js';
import type { ClickMetrics } from '../recsys/model.js';
import { launchRankScript } from './rank-script.js';
import { median } from './timing.js';
import { EVENT_PREFIX, REPORT_PREFIX, type CprEvent, type CprRankData, type CprRankReport, type FailureMarker } from './cpr-rank.js';

export interface CprBenchOptions {
  ranks: number;
  steps: number;
  /** Failures injected, evenly spaced over the run. */
  failures: number;
  policies: readonly RecoveryPolicy[];
  /** CPR's target portion of lost samples. Default 0.02. */
  lostFraction?: number;
  priorityFraction?: number;
  ssuSampleRate?: number;
  batch?: number;
  seed?: number;
  /** Runs of every job (baseline included); the table gives medians and spreads. Default 1. */
  reps?: number;
}

export interface CprPolicyRow {
  policy: RecoveryPolicy | 'none';
  /** Steps between full saves (and between priority saves: mfu, ssu). */
  saveEvery: number;
  priorityEvery: number | null;
  /** From the first step to the last, restarts included, s: the median over the repetitions. */
  trainingSeconds: number;
  /** The fastest and slowest repetition, s. */
  spread: [number, number];
  /** (trainingSeconds - baseline) / baseline, both medians. */
  overhead: number;
  /** Per failure (of every repetition): from the kill to the ranks ready again, s. */
  restartSeconds: number[];
  /** Steps run again after full recoveries. */
  recomputedSteps: number;
  /** Per failure: the row updates of the lost shard that no save held, lost by a partial recovery (0 for a full one, which recomputes them). */
  lostUpdates: number[];
  saves: { full: number; priority: number; stallMs: number } | null;
  /** Medians over the repetitions. */
  metrics: ClickMetrics;
  restarts: number;
}

export interface CprBenchResult {
  ranks: number;
  steps: number;
  reps: number;
  failAt: number[];
  stepMs: number;
  saveCost: { stallMs: number; writeMs: number; costMs: number };
  mtbfSeconds: number;
  youngSeconds: number;
  cprSeconds: number;
  rows: CprPolicyRow[];
}

/** Runs one policy's job; resolves with rank 0's events and report. */
async function runJob(data: CprRankData, ranks: number, maxRestarts: number): Promise<{ events: CprEvent[]; report: CprRankReport; restarts: number }> {
  const { result, stdout, stderr } = await launchRankScript('cpr-rank', { args: [JSON.stringify(data)], nproc: ranks, maxRestarts, checkpointDir: data.dir, forwardSignals: true });
  const lines = stdout.split('\n');
  const events = lines.filter((l) => l.startsWith(`[0] ${EVENT_PREFIX}`)).map((l) => JSON.parse(l.slice(`[0] ${EVENT_PREFIX}`.length)) as CprEvent);
  const line = lines.find((l) => l.startsWith(`[0] ${REPORT_PREFIX}`));
  if (result.exitCode !== 0 || line === undefined)
    throw new Error(`the ${data.policy} job failed (${result.message ?? `exit code ${result.exitCode}`}): ${stderr.trim().split('\n').slice(-6).join(' | ')}`);
  return { events, report: JSON.parse(line.slice(`[0] ${REPORT_PREFIX}`.length)) as CprRankReport, restarts: result.restarts };
}

export async function benchCpr(options: CprBenchOptions): Promise<CprBenchResult> {
  const ranks = checkInteger(options.ranks, 'bench cpr: ranks', 2, 64);
  const steps = checkInteger(options.steps, 'bench cpr: steps', 10, 1 << 24);
  const failures = checkInteger(options.failures, 'bench cpr: failures', 0, 100);
  const reps = checkInteger(options.reps ?? 1, 'bench cpr: reps', 1, 100);
  for (const p of options.policies) if (!RECOVERY_POLICIES.includes(p)) throw new InvalidArgumentError(`bench cpr: unknown policy ${JSON.stringify(p)}; use ${RECOVERY_POLICIES.join(', ')}`);
  const lostFraction = checkNumber(options.lostFraction ?? 0.02, 'bench cpr: lostFraction', 0, 1, { loOpen: true });
  const { ucxStatus } = await import('sapipe/backends');
  const status = ucxStatus();
  if (!status.available) throw new BackendUnavailableError(`bench cpr needs the ucx backend: ${status.reason ?? 'unknown reason'}`);
  const root = mkdtempSync(join(tmpdir(), 'sapipe-cpr-'));
  const shm = mkdtempSync(join(existsDir('/dev/shm') ? '/dev/shm' : tmpdir(), 'sapipe-cpr-handoff-'));
  // Failure i at the start of step failAt[i], spread over the run away from its ends.
  const failAt = Array.from({ length: failures }, (_, i) => Math.floor((steps * (i + 0.6)) / (failures + 0.2)));
  const batch = checkInteger(options.batch ?? 64, 'bench cpr: batch', 1, 1 << 16);
  const base: Omit<CprRankData, 'policy' | 'dir' | 'handoffDir' | 'workDir' | 'saveEvery'> = {
    priorityFraction: options.priorityFraction ?? 0.125,
    ssuSampleRate: options.ssuSampleRate ?? 0.125,
    failAt,
    steps,
    batch,
    tables: [40000, 40000, 10000, 10000],
    dim: 8,
    dense: 4,
    hidden: [32],
    trainFile: join(root, 'train.safetensors'),
    testFile: join(root, 'test.safetensors'),
    seed: options.seed ?? 3,
    embeddingLr: 0.5,
    lr: 0.05,
  };
  // One epoch: every step on new samples, as recommendation models are trained.
  const clickOptions = { tables: base.tables, dense: base.dense, seed: base.seed };
  writeClickData(base.trainFile, syntheticClicks({ ...clickOptions, samples: steps * batch * ranks, sampleSeed: 1 }));
  writeClickData(base.testFile, syntheticClicks({ ...clickOptions, samples: 20_000, sampleSeed: 2 }));
  let jobs = 0;
  const dirs = (name: string): Pick<CprRankData, 'dir' | 'handoffDir' | 'workDir'> => {
    const workDir = join(root, `${name}-${jobs++}`);
    mkdirSync(workDir, { recursive: true });
    return { dir: join(workDir, 'checkpoints'), handoffDir: join(shm, `${name}-${jobs}`), workDir };
  };
  try {
    // The first baseline run sets the intervals; every repetition runs every policy, so that a
    // machine whose speed drifts affects them alike.
    const baselines: CprRankReport[] = [];
    const baselineSeconds: number[] = [];
    const runBaseline = async (): Promise<void> => {
      const clean = await runJob({ ...base, policy: 'none', saveEvery: 1, ...dirs('none') }, ranks, 0);
      baselines.push(clean.report);
      baselineSeconds.push((clean.report.endedAt - clean.events[0]!.at) / 1000);
    };
    await runBaseline();
    const stepMs = (baselineSeconds[0]! * 1000) / steps;
    const saveCost = baselines[0]!.saveCost!;
    const mtbfSeconds = failures > 0 ? baselineSeconds[0]! / failures : baselineSeconds[0]!;
    const youngSeconds = youngIntervalSeconds(saveCost.costMs / 1000, mtbfSeconds);
    const cprSeconds = cprIntervalSeconds({ saveSeconds: saveCost.costMs / 1000, mtbfSeconds, shards: ranks, lostFraction });
    const runs = new Map<RecoveryPolicy, { seconds: number; report: CprRankReport; row: Omit<CprPolicyRow, 'trainingSeconds' | 'spread' | 'overhead' | 'metrics'> }[]>();
    for (let rep = 0; rep < reps; rep++) {
      if (rep > 0) await runBaseline();
      for (const policy of options.policies) {
        const seconds = policy === 'full' ? youngSeconds : cprSeconds;
        const saveEvery = Math.max(1, Math.round((seconds * 1000) / stepMs));
        const priorityEvery = policy === 'mfu' || policy === 'ssu' ? Math.max(1, Math.round(saveEvery * base.priorityFraction)) : null;
        const d = dirs(policy);
        const job = await runJob({ ...base, policy, saveEvery, ...d }, ranks, failures);
        const markers = Array.from({ length: failures }, (_, i): FailureMarker | undefined => {
          try {
            return JSON.parse(readFileSync(join(d.workDir, `failure-${i}`), 'utf8')) as FailureMarker;
          } catch {
            return undefined;
          }
        });
        const restarts = job.events.slice(1);
        if (restarts.length !== failures || markers.some((m) => m === undefined))
          throw new Error(`the ${policy} job restarted ${restarts.length} times with ${markers.filter(Boolean).length} failures injected; expected ${failures} of each`);
        let recomputed = 0;
        restarts.forEach((e, i) => {
          if (e.resume.kind === 'full') recomputed += Math.max(0, failAt[i]! - e.resume.step);
        });
        const list = runs.get(policy) ?? [];
        list.push({
          seconds: (job.report.endedAt - job.events[0]!.at) / 1000,
          report: job.report,
          row: {
            policy,
            saveEvery,
            priorityEvery,
            restartSeconds: restarts.map((e, i) => (e.at - markers[i]!.at) / 1000),
            recomputedSteps: recomputed,
            // Partial recovery loses the reloaded shard's unsaved updates; full recovery recomputes them.
            lostUpdates: restarts.map((e, i) => (e.resume.kind === 'partial' ? markers[i]!.unsavedUpdates : 0)),
            saves: job.report.stats && { full: job.report.stats.fullSaves, priority: job.report.stats.prioritySaves, stallMs: job.report.stats.saveMs },
            restarts: job.restarts,
          },
        });
        runs.set(policy, list);
      }
    }
    const baseline = median(baselineSeconds);
    const metricsOf = (reports: readonly CprRankReport[]): ClickMetrics => ({ loss: median(reports.map((r) => r.metrics.loss)), auc: median(reports.map((r) => r.metrics.auc)) });
    const rows: CprPolicyRow[] = [
      {
        policy: 'none',
        saveEvery: 0,
        priorityEvery: null,
        trainingSeconds: baseline,
        spread: [Math.min(...baselineSeconds), Math.max(...baselineSeconds)],
        overhead: 0,
        restartSeconds: [],
        recomputedSteps: 0,
        lostUpdates: [],
        saves: null,
        metrics: metricsOf(baselines),
        restarts: 0,
      },
    ];
    for (const [policy, list] of runs) {
      const seconds = list.map((r) => r.seconds);
      const trainingSeconds = median(seconds);
      rows.push({
        ...list[0]!.row,
        policy,
        restartSeconds: list.flatMap((r) => r.row.restartSeconds),
        trainingSeconds,
        spread: [Math.min(...seconds), Math.max(...seconds)],
        overhead: (trainingSeconds - baseline) / baseline,
        metrics: metricsOf(list.map((r) => r.report)),
      });
    }
    return { ranks, steps, reps, failAt, stepMs, saveCost, mtbfSeconds, youngSeconds, cprSeconds, rows };
  } finally {
    rmSync(root, { recursive: true, force: true });
    rmSync(shm, { recursive: true, force: true });
  }
}

function existsDir(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}
