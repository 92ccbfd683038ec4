/**
 * Pipeline stages as processes under the real launcher (test/fixtures/pipeline/ucx-stage.mjs, one
 * rank per stage), with what they printed collected: rank 0's RESULT and every rank's FAILED line.
 * test/pipeline/runtime-ucx.test.ts and runtime-nccl.test.ts share it.
 */
import { fileURLToPath } from 'node:url';
import { Writable } from 'node:stream';

import { launch } from '../../dist/launch/index.js';

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
  const sink = (append: (s: string) => void): Writable =>
    new Writable({
      write(chunk: Buffer, _encoding, callback): void {
        append(chunk.toString());
        callback();
      },
    });
  const start = Date.now();
  const result = await launch({
    script: FIXTURE,
    args: [JSON.stringify(config)],
    nproc: stages,
    cwd: repoRoot,
    env: { ...process.env, NODE_OPTIONS: '', ...env },
    forwardSignals: false,
    stdout: sink((s) => (out += s)),
    stderr: sink((s) => (err += s)),
  });
  const line = out.split('\n').find((l) => l.startsWith('[0] RESULT '));
  const failures = new Map<number, { code?: string; message: string; ms: number }>();
  for (const l of out.split('\n')) {
    const m = /^\[(\d+)\] FAILED (.*)$/.exec(l);
    if (m) failures.set(Number(m[1]), JSON.parse(m[2]!));
  }
  return { exitCode: result.exitCode, ...(line ? { result: JSON.parse(line.slice('[0] RESULT '.length)) } : {}), failures, stderr: err, elapsedMs: Date.now() - start };
}
