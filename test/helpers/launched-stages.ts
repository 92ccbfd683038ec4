/**
 * Pipeline stages as processes under the real launcher (test/fixtures/pipeline/ucx-stage.mjs, one
 * rank per stage), with what they printed collected: rank 0's RESULT and every rank's FAILED line,
 * and the worker-thread trainer a launched job is checked against.
 * test/pipeline/runtime-ucx.test.ts and runtime-nccl.test.ts share it.
 */
import { fileURLToPath } from 'node:url';

import { PipelineTrainer, type EpochReport, type PipelineOptimizerSpec, type PipelineTrainerOptions, type RuntimeScheduleName } from '../../dist/index.js';
import { launch } from '../../dist/launch/index.js';
import { FEATURES, LAYERS, dataset } from '../fixtures/pipeline/data.mjs';
import { textSink } from './text-sink.js';

const FIXTURE = fileURLToPath(new URL('../fixtures/pipeline/ucx-stage.mjs', import.meta.url));
const repoRoot = fileURLToPath(new URL('../..', import.meta.url));

export interface LaunchedStages {
  exitCode: number;
  /** Rank 0's RESULT: each epoch's loss and accuracy, every part's weights, the kernel threads it ran on. */
  result?: { epochs: { loss: number; accuracy?: number }[]; weights: number[][]; kernelThreads: number | 'shared' };
  failures: Map<number, { code?: string; message: string; ms: number }>;
  stderr: string;
  elapsedMs: number;
}

/** Launches `stages` ranks of the fixture with `config`; `env` is added to this process's (the runner's loader hooks left out). */
export async function launchStages(config: Record<string, unknown>, stages: number, env: Record<string, string> = {}): Promise<LaunchedStages> {
  let out = '';
  let err = '';
  const start = Date.now();
  const result = await launch({
    script: FIXTURE,
    args: [JSON.stringify(config)],
    nproc: stages,
    cwd: repoRoot,
    env: { ...process.env, NODE_OPTIONS: '', ...env },
    forwardSignals: false,
    stdout: textSink((s) => (out += s)),
    stderr: textSink((s) => (err += s)),
  });
  const line = out.split('\n').find((l) => l.startsWith('[0] RESULT '));
  const failures = new Map<number, { code?: string; message: string; ms: number }>();
  for (const l of out.split('\n')) {
    const m = /^\[(\d+)\] FAILED (.*)$/.exec(l);
    if (m) failures.set(Number(m[1]), JSON.parse(m[2]!));
  }
  return { exitCode: result.exitCode, ...(line ? { result: JSON.parse(line.slice('[0] RESULT '.length)) } : {}), failures, stderr: err, elapsedMs: Date.now() - start };
}

/**
 * The worker-thread trainer a launched job is checked against: the fixture's model (LAYERS, seed 3)
 * cut at the job's boundaries, on the job's first `samples` samples and seed, with `extra`
 * (parallel pipelines, ...), trained `epochs` epochs. The caller disposes the trainer.
 */
export async function threadReference(
  job: { schedule: RuntimeScheduleName; stages: number; microBatches: number; microBatchSize: number; boundaries: number[]; seed: number },
  optimizer: PipelineOptimizerSpec,
  samples: number,
  extra: Partial<PipelineTrainerOptions> = {},
  epochs = 2,
): Promise<{ trainer: PipelineTrainer; epochs: EpochReport[]; weights: Float32Array[]; inputs: Float32Array; labels: Int32Array }> {
  const { inputs, labels } = dataset(samples);
  const trainer = await PipelineTrainer.create({
    schedule: job.schedule,
    stages: job.stages,
    microBatches: job.microBatches,
    microBatchSize: job.microBatchSize,
    model: { layers: LAYERS, seed: 3, boundaries: job.boundaries },
    optimizer,
    data: { inputs, labels, features: FEATURES },
    seed: job.seed,
    ...extra,
  });
  try {
    const reports: EpochReport[] = [];
    for (let e = 0; e < epochs; e++) reports.push(await trainer.trainEpoch());
    return { trainer, epochs: reports, weights: await trainer.weights(), inputs, labels };
  } catch (error) {
    await trainer.dispose();
    throw error;
  }
}
