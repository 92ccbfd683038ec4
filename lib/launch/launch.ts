/**
 * Starts the ranks of a job on this node, like torchrun: each rank is a Node process running the
 * same script with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set.
 * The job is all or nothing: when one rank fails, the others are stopped, since a collective
 * would otherwise leave them waiting for a peer that is gone.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { join, resolve as resolvePath } from 'node:path';
import { constants } from 'node:os';
import type { Writable } from 'node:stream';

import { chooseCheckpoint, stepDirectory } from '../checkpoint/store.js';
import { CheckpointError, InvalidArgumentError } from '../errors.js';
import { findFreePort } from './free-port.js';
import { pipeWithPrefix } from './line-prefixer.js';
import { checkInteger, checkOptions, describeValue, optionKeys } from '../validate.js';

/** Options of {@link launch}. @category Launch */
export interface LaunchOptions {
  /** The script each rank runs (a path, resolved against `cwd`). */
  script: string;
  /** Arguments passed to the script. */
  args?: readonly string[];
  /** Ranks to start on this node. */
  nproc: number;
  /** Nodes in the job. Default 1. */
  nnodes?: number;
  /** This node's index in [0, nnodes). Default 0. */
  nodeRank?: number;
  /** Address of the node that runs rank 0. Default 127.0.0.1; required when nnodes > 1. */
  masterAddr?: string;
  /** Port of rank 0's rendezvous store. Default: a free port; required when nnodes > 1. */
  masterPort?: number;
  /** Flags for node itself, placed before the script (e.g. `--enable-source-maps`). */
  nodeArgs?: readonly string[];
  /** Environment the ranks inherit, before the launcher's variables are added. Default `process.env`. */
  env?: NodeJS.ProcessEnv;
  /** Working directory of the ranks. Default the current one. */
  cwd?: string;
  /** Where the ranks' prefixed stdout goes. Default `process.stdout`. */
  stdout?: Writable;
  /** Where the ranks' prefixed stderr and the launcher's own messages go. Default `process.stderr`. */
  stderr?: Writable;
  /** After SIGTERM, how long ranks get to exit before SIGKILL. Default 5000 ms. */
  graceMs?: number;
  /** Forward SIGINT and SIGTERM received by this process to the ranks. Default true. */
  forwardSignals?: boolean;
  /**
   * When a rank fails, stop the others and start the whole job again, up to this many times
   * (torchrun's `--max-restarts`); the ranks meet again through a new rendezvous and resume from
   * their last checkpoint (loadCheckpoint). Each attempt's ranks see `SAPIPE_RESTART_COUNT` (0 first).
   * Default 0. Across nodes, every node's launcher restarts on its own and the ranks meet again
   * at the same `masterPort`.
   */
  maxRestarts?: number;
  /**
   * The job's checkpoint directory (the `dir` its ranks save to), read on a restart to say how
   * much work was lost: the step the ranks resume from and how long before the failure it was
   * saved. Optional; without it the message only says that the work since the last checkpoint is lost.
   */
  checkpointDir?: string;
}

/** How one rank ended. @category Launch */
export interface RankExit {
  rank: number;
  localRank: number;
  /** Exit code, or null if the rank was killed by a signal or could not start. */
  code: number | null;
  signal: NodeJS.Signals | null;
  /** Why the process could not be started, if it could not. */
  error?: Error;
}

/** Outcome of {@link launch}. @category Launch */
export interface LaunchResult {
  /** 0 when every rank exited 0; otherwise the failed rank's code (128 + signal number if killed). */
  exitCode: number;
  /** Every rank, in local rank order. */
  ranks: RankExit[];
  /** The first rank that failed, which made the launcher stop the others. */
  failure?: RankExit;
  /** The signal that made the launcher stop the job, if one did. */
  interruptedBy?: NodeJS.Signals;
  /** A one-line account of why the job failed (also written to `stderr`). */
  message?: string;
  /** The MASTER_PORT the ranks were given (in the last attempt). */
  masterPort: number;
  /** Restarts made (0 when the first attempt was the last). */
  restarts: number;
  /**
   * Set when a failed attempt was not restarted although restarts were left, saying why: the
   * ranks could not resume from `checkpointDir` (loadCheckpoint would fail with this on every
   * rank, so a restart could only fail again).
   */
  notRestarted?: string;
  /** Each failed attempt that was restarted: the failure, and how long the attempt ran. */
  restarted: {
    failure: RankExit;
    message: string;
    elapsedMs: number;
    /**
     * With checkpointDir: the step the ranks resume from, the newest checkpoint at the failure that
     * verifies, as loadCheckpoint chooses it (null: none, the job starts over).
     */
    resumeStep?: number | null;
    /** With checkpointDir: newer steps the ranks will pass over because they do not verify. */
    skippedSteps?: number[];
    /** With checkpointDir: training time lost, from that checkpoint's save (or the attempt's start) to the failure. */
    lostMs?: number;
  }[];
}

const FORWARDED_SIGNALS = ['SIGINT', 'SIGTERM'] as const;

function signalExitCode(signal: NodeJS.Signals): number {
  return 128 + (constants.signals[signal] ?? 0);
}

function describe(exit: RankExit): string {
  const who = `rank ${exit.rank} (local rank ${exit.localRank})`;
  if (exit.error !== undefined) return `${who} could not be started: ${exit.error.message}`;
  if (exit.signal !== null) return `${who} was killed by signal ${exit.signal}`;
  return `${who} exited with code ${exit.code}`;
}


const LAUNCH_OPTION_KEYS = optionKeys<LaunchOptions>({
  script: true,
  args: true,
  nproc: true,
  nnodes: true,
  nodeRank: true,
  masterAddr: true,
  masterPort: true,
  nodeArgs: true,
  env: true,
  cwd: true,
  stdout: true,
  stderr: true,
  graceMs: true,
  forwardSignals: true,
  maxRestarts: true,
  checkpointDir: true,
});

/**
 * Runs `nproc` ranks of `script` and resolves when all have exited. Never rejects for a rank's
 * failure: the result says which rank failed and how. Rejects with InvalidArgumentError for bad
 * options.
 *
 * @category Launch
 */
export async function launch(options: LaunchOptions): Promise<LaunchResult> {
  checkOptions(options, LAUNCH_OPTION_KEYS, 'launch(options)');
  if (typeof options.script !== 'string' || options.script === '') throw new InvalidArgumentError('script must be a non-empty path');
  if (options.cwd !== undefined && typeof options.cwd !== 'string') throw new InvalidArgumentError(`launch: cwd must be a path, got ${describeValue(options.cwd)}`);
  // Checked once here: otherwise every rank's node prints its own stack trace for the missing file.
  const scriptPath = resolvePath(options.cwd ?? process.cwd(), options.script);
  if (!existsSync(scriptPath)) throw new InvalidArgumentError(`launch: the script ${scriptPath} does not exist`);
  const nproc = checkInteger(options.nproc, 'nproc', 1, 4096);
  const nnodes = checkInteger(options.nnodes ?? 1, 'nnodes', 1, 65536);
  const nodeRank = checkInteger(options.nodeRank ?? 0, 'nodeRank', 0, nnodes - 1);
  const graceMs = checkInteger(options.graceMs ?? 5000, 'graceMs', 0, 2 ** 31 - 1);
  if (nnodes > 1 && (options.masterAddr === undefined || options.masterPort === undefined))
    throw new InvalidArgumentError('a job of several nodes needs masterAddr (--master-addr) and masterPort (--master-port), the same on every node');
  const masterAddr = options.masterAddr ?? '127.0.0.1';
  if (typeof masterAddr !== 'string' || masterAddr === '') throw new InvalidArgumentError('masterAddr must be a non-empty string');
  if (options.masterPort !== undefined) checkInteger(options.masterPort, 'masterPort', 1, 65535);
  const maxRestarts = checkInteger(options.maxRestarts ?? 0, 'maxRestarts', 0, 1 << 20);
  const checkpointDir = options.checkpointDir;
  if (checkpointDir !== undefined && (typeof checkpointDir !== 'string' || checkpointDir === ''))
    throw new InvalidArgumentError(`launch: checkpointDir must be a directory path, got ${describeValue(checkpointDir)}`);
  const args = [...(options.args ?? [])];
  const nodeArgs = [...(options.nodeArgs ?? [])];
  for (const a of [...args, ...nodeArgs])
    if (typeof a !== 'string') throw new InvalidArgumentError('args and nodeArgs must be strings');
  const stdout = options.stdout ?? process.stdout;
  const stderr = options.stderr ?? process.stderr;
  const baseEnv = options.env ?? process.env;
  const forwardSignals = options.forwardSignals ?? true;
  const job: Attempt = { script: options.script, args, nodeArgs, nproc, nnodes, nodeRank, masterAddr, graceMs, stdout, stderr, baseEnv, forwardSignals, cwd: options.cwd };
  const say = (line: string): void => {
    stderr.write(`sapipe launch: ${line}\n`);
  };
  const restarted: LaunchResult['restarted'] = [];
  for (let attempt = 0; ; attempt++) {
    // A fresh port per attempt on one node: the failed attempt's store may still hold the old one.
    const masterPort = options.masterPort ?? (await findFreePort());
    const started = Date.now();
    const result = await runAttempt(job, masterPort, attempt);
    if (result.failure === undefined || result.interruptedBy !== undefined || attempt >= maxRestarts) return { ...result, restarts: attempt, restarted };
    const failedAt = Date.now();
    const elapsedMs = failedAt - started;
    const lost = checkpointDir === undefined ? undefined : await lostWork(checkpointDir, nproc * nnodes, started, failedAt);
    if (lost?.checkpointError !== undefined) {
      const notRestarted = `the ranks cannot resume from ${checkpointDir}: ${lost.checkpointError}`;
      say(`not restarting the job (${maxRestarts - attempt} restart${maxRestarts - attempt === 1 ? '' : 's'} left) after ${(elapsedMs / 1000).toFixed(1)} s: ${result.message ?? 'a rank failed'}; ${notRestarted}`);
      return { ...result, restarts: attempt, restarted, notRestarted };
    }
    restarted.push({
      failure: result.failure,
      message: result.message ?? '',
      elapsedMs,
      ...(lost && { resumeStep: lost.resumeStep, lostMs: lost.lostMs, skippedSteps: lost.skipped.map((s) => s.step) }),
    });
    const skipped = lost?.skipped.length ? `; passing over ${lost.skipped.map((s) => `step ${s.step} (${s.reason})`).join(', ')}` : '';
    const what =
      lost === undefined
        ? 'the ranks resume from their last complete checkpoint, and the work since it is lost'
        : lost.resumeStep === null
          ? `no complete checkpoint in ${checkpointDir} yet${skipped}: the job starts over, and its ${(lost.lostMs / 1000).toFixed(1)} s of training are lost`
          : `the ranks resume from step ${lost.resumeStep} (the newest complete checkpoint in ${checkpointDir} that verifies${skipped}), and the ${(lost.lostMs / 1000).toFixed(1)} s of training since it was saved are lost`;
    say(`restarting the job (restart ${attempt + 1} of ${maxRestarts}) after ${(elapsedMs / 1000).toFixed(1)} s: ${result.message ?? 'a rank failed'}; ${what}`);
  }
}

interface LostWork {
  resumeStep: number | null;
  lostMs: number;
  skipped: { step: number; reason: string }[];
  checkpointError?: string;
}

/**
 * How much work a failure lost: the checkpoint in `dir` the ranks will resume from, chosen as
 * loadCheckpoint chooses it (the newest whose every rank's file verifies: the same step every
 * rank takes, so the message is what happens), and the time from its save (its rank-0
 * manifest's modification time, or the attempt's start if it is older) to the failure.
 */
async function lostWork(dir: string, worldSize: number, startedAt: number, failedAt: number): Promise<LostWork> {
  try {
    const { step, skipped } = await chooseCheckpoint(dir, worldSize);
    const passed = skipped.map((s) => ({ step: s.step, reason: s.reason }));
    if (step === undefined) return { resumeStep: null, lostMs: failedAt - startedAt, skipped: passed };
    const savedAt = (await stat(join(stepDirectory(dir, step), 'rank-0.json'))).mtimeMs;
    return { resumeStep: step, lostMs: failedAt - Math.max(startedAt, savedAt), skipped: passed };
  } catch (error) {
    // The ranks' loadCheckpoint will fail the same way: say so rather than promise a resume.
    if (error instanceof CheckpointError) return { resumeStep: null, lostMs: failedAt - startedAt, skipped: [], checkpointError: error.message };
    // An unreadable directory says nothing about the work; the restart goes on regardless.
    return { resumeStep: null, lostMs: failedAt - startedAt, skipped: [] };
  }
}

/** What every attempt of a job runs. */
interface Attempt {
  script: string;
  args: string[];
  nodeArgs: string[];
  nproc: number;
  nnodes: number;
  nodeRank: number;
  masterAddr: string;
  graceMs: number;
  stdout: Writable;
  stderr: Writable;
  baseEnv: NodeJS.ProcessEnv;
  forwardSignals: boolean;
  cwd: string | undefined;
}

/** One attempt: starts the ranks, stops them all at the first failure or signal, resolves when all have exited. */
async function runAttempt(job: Attempt, masterPort: number, attempt: number): Promise<Omit<LaunchResult, 'restarts' | 'restarted'>> {
  const { nproc, nnodes, nodeRank, masterAddr, graceMs, stdout, stderr, baseEnv, nodeArgs, args, forwardSignals } = job;
  const worldSize = nnodes * nproc;
  const shared: NodeJS.ProcessEnv = {
    WORLD_SIZE: String(worldSize),
    LOCAL_WORLD_SIZE: String(nproc),
    GROUP_RANK: String(nodeRank),
    MASTER_ADDR: masterAddr,
    MASTER_PORT: String(masterPort),
    SAPIPE_RESTART_COUNT: String(attempt),
  };
  // On one node the launcher can hand out a secret nobody else sees; across nodes all launchers
  // would need the same one, so there the user sets SAPIPE_TOKEN.
  if (!baseEnv.SAPIPE_TOKEN && nnodes === 1) shared.SAPIPE_TOKEN = randomBytes(16).toString('hex');
  if (!baseEnv.SAPIPE_TOKEN && nnodes > 1 && !/^(1|true)$/i.test((baseEnv.SAPIPE_ALLOW_NO_TOKEN ?? '').trim()))
    stderr.write('sapipe launch: SAPIPE_TOKEN is not set; rank 0 will refuse to serve the rendezvous store to other machines (set the same SAPIPE_TOKEN on every node, see docs/launch.md)\n');

  const ranks: RankExit[] = [];
  const children: ChildProcess[] = [];
  const running = new Set<ChildProcess>();
  const finished: Promise<void>[] = [];
  let failure: RankExit | undefined;
  let interruptedBy: NodeJS.Signals | undefined;
  let message: string | undefined;
  let killTimer: NodeJS.Timeout | undefined;

  const say = (line: string): void => {
    stderr.write(`sapipe launch: ${line}\n`);
  };
  // The signals the launcher sent each rank: a rank that died of another one was killed from outside.
  const sent = new Map<ChildProcess, Set<NodeJS.Signals>>();
  const signalAll = (signal: NodeJS.Signals): void => {
    for (const child of running) {
      if (!sent.has(child)) sent.set(child, new Set());
      sent.get(child)!.add(signal);
      child.kill(signal);
    }
  };
  const killedFromOutside = new Map<RankExit, ChildProcess>();
  const stopAll = (signal: NodeJS.Signals): void => {
    signalAll(signal);
    if (killTimer === undefined && running.size > 0)
      killTimer = setTimeout(() => {
        if (running.size > 0) say(`${running.size} rank(s) still running after ${graceMs} ms; sending SIGKILL`);
        signalAll('SIGKILL');
      }, graceMs);
  };
  const onExit = (exit: RankExit): void => {
    const failed = exit.error !== undefined || exit.signal !== null || exit.code !== 0;
    // Only the first failure counts: the ranks stopped because of it, or because of a signal, are not to blame.
    if (!failed || failure !== undefined || interruptedBy !== undefined) return;
    failure = exit;
    message = describe(exit);
    const others = running.size > 0 ? '; stopping the other ranks' : '';
    say(`${message}${others}`);
    stopAll('SIGTERM');
  };

  const onSignal = (signal: NodeJS.Signals): void => {
    if (interruptedBy !== undefined) {
      // A second Ctrl-C means now.
      signalAll('SIGKILL');
      return;
    }
    interruptedBy = signal;
    message = `received ${signal}; stopping all ranks`;
    say(message);
    stopAll(signal);
  };
  if (forwardSignals) for (const s of FORWARDED_SIGNALS) process.on(s, onSignal);

  try {
    for (let localRank = 0; localRank < nproc; localRank++) {
      const rank = nodeRank * nproc + localRank;
      const exit: RankExit = { rank, localRank, code: null, signal: null };
      ranks.push(exit);
      if (failure !== undefined || interruptedBy !== undefined) {
        exit.error = new Error('not started: the job was already stopping');
        continue;
      }
      const child = spawn(process.execPath, [...nodeArgs, job.script, ...args], {
        env: { ...baseEnv, ...shared, RANK: String(rank), LOCAL_RANK: String(localRank) },
        ...(job.cwd !== undefined && { cwd: job.cwd }),
        // Ranks share no terminal input: which one would read it is not well defined.
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      children.push(child);
      running.add(child);
      const prefix = `[${rank}] `;
      const piped = [pipeWithPrefix(child.stdout!, stdout, prefix), pipeWithPrefix(child.stderr!, stderr, prefix)];
      finished.push(
        new Promise<void>((resolve) => {
          let done = false;
          const settle = (): void => {
            if (done) return;
            done = true;
            running.delete(child);
            onExit(exit);
            // Wait for the pipes too, so no output arrives after launch() resolves.
            void Promise.all(piped).then(() => resolve());
          };
          child.once('exit', (code, signal) => {
            exit.code = code;
            exit.signal = signal;
            if (signal !== null && !sent.get(child)?.has(signal)) killedFromOutside.set(exit, child);
            settle();
          });
          child.on('error', (error) => {
            // 'error' also reports a failed kill(); only a process that never ran is settled by it.
            if (child.pid !== undefined) return;
            exit.error = error;
            settle();
          });
        }),
      );
    }
    await Promise.all(finished);
  } finally {
    if (forwardSignals) for (const s of FORWARDED_SIGNALS) process.off(s, onSignal);
    clearTimeout(killTimer);
  }

  // A rank killed from outside (the OOM killer, a kill -9) is the cause of its peers' failures:
  // they lose it and exit with an error, sometimes before the launcher hears of its death (the
  // kernel closes a dying process's sockets before it tells the parent). Blame the killed rank.
  if (failure !== undefined && !killedFromOutside.has(failure) && interruptedBy === undefined) {
    const killed = ranks.find((r) => killedFromOutside.has(r));
    if (killed !== undefined) {
      const first = failure;
      failure = killed;
      message = `${describe(killed)}; the failure of rank ${first.rank} before it was reported followed from it`;
      say(message);
    }
  }

  let exitCode = 0;
  if (failure !== undefined) {
    if (failure.signal !== null) exitCode = signalExitCode(failure.signal);
    else exitCode = failure.code !== null && failure.code !== 0 ? failure.code : 1;
  } else if (interruptedBy !== undefined) {
    exitCode = signalExitCode(interruptedBy);
  }
  const result: Omit<LaunchResult, 'restarts' | 'restarted'> = { exitCode, ranks, masterPort };
  if (failure !== undefined) result.failure = failure;
  if (interruptedBy !== undefined) result.interruptedBy = interruptedBy;
  if (message !== undefined) result.message = message;
  return result;
}
