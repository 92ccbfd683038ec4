/**
 * A MODEL (not a measurement) of data-parallel training at cluster scale: how fast `sync` and the
 * SAPipe staleness-1 modes would step on W workers, from a per-step compute time, the gradient's
 * size and the ring all-reduce cost of lib/comm/emulation.ts (the same model that delays the
 * emulated network, so a projection and an emulated run agree by construction).
 *
 * Per worker per step, with C the compute time (forward, backward and the optimizer update) and
 * M = emulatedMs('allreduce', gradient bytes, W):
 *
 *     sync:   C + M        (each step waits for its own all-reduce)
 *     SAPipe: max(C, M)    (the all-reduce of step t runs during step t+1's compute; one is in
 *                           flight at a time, so the slower of the two sets the pace)
 *
 * Assumptions, all optimistic for SAPipe and for sync alike: the all-reduce does not slow the
 * compute it overlaps (separate engines, no memory-bandwidth contention), links do not contend
 * with other jobs, every worker computes equally fast, and the pipeline's one-step warm-up is
 * ignored (steady state).
 */
import { readFileSync } from 'node:fs';

import { emulatedMs, type NetworkEmulation } from '../comm/emulation.js';
import { InvalidArgumentError } from '../errors.js';
import { fromJsonText } from '../json-input.js';
import { describeValue } from '../validate.js';

/** @internal
 * A per-worker training profile (JSON). `computeMs` and `samplesPerStep` are required, and one of
 * `params` or `modelBytes`:
 *
 *     { "computeMs": 12.5, "params": 25557032, "samplesPerStep": 32 }
 */
export interface DataParallelProfile {
  /** Milliseconds of one step on one worker without communication: forward, backward and update. */
  readonly computeMs: number;
  /** Parameters (fp32 gradients: 4 bytes each are all-reduced). */
  readonly params?: number;
  /** Bytes of gradient all-reduced per step (instead of params). */
  readonly modelBytes?: number;
  /** Samples one worker processes per step (its local batch). */
  readonly samplesPerStep: number;
  /** Free text: where the figures come from (e.g. written by `sapipe demo --profile-out`). */
  readonly source?: string;
}

/** @internal */
export interface DataParallelProjectionInput {
  readonly profile: DataParallelProfile;
  /** Worker counts to project, each >= 1. */
  readonly workers: readonly number[];
  /** The network: bandwidth per link and latency per message, as in the emulated network. */
  readonly network: NetworkEmulation;
}

/** @internal */
export interface DataParallelProjectionRow {
  readonly workers: number;
  /** Modelled ring all-reduce of the gradient, ms. */
  readonly allreduceMs: number;
  readonly computeMs: number;
  readonly syncStepMs: number;
  readonly sapipeStepMs: number;
  /** Samples per second over all workers. */
  readonly syncSamplesPerSec: number;
  readonly sapipeSamplesPerSec: number;
  /** syncStepMs / sapipeStepMs. */
  readonly speedup: number;
  /** allreduceMs / computeMs: below 1 SAPipe hides all communication; above, it is network-bound. */
  readonly commComputeRatio: number;
  /** Throughput over W times one communication-free worker's: computeMs / stepMs. */
  readonly syncScalingEfficiency: number;
  readonly sapipeScalingEfficiency: number;
}

/** @internal */
export interface DataParallelProjection {
  /** Always true: these are modelled figures. */
  readonly model: true;
  readonly profile: DataParallelProfile;
  readonly network: Required<NetworkEmulation>;
  readonly gradientBytes: number;
  readonly rows: readonly DataParallelProjectionRow[];
}

/** @internal The largest worker count projected: far beyond any cluster this model is meant for. */
export const MAX_WORKERS = 1 << 20;

const positive = (where: string, v: unknown): number => {
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) throw new InvalidArgumentError(`${where} must be a finite number > 0, got ${describeValue(v)}`);
  return v;
};

/** @internal Checks a profile (an object, or JSON text) and returns it. */
export function parseDataParallelProfile(input: unknown): DataParallelProfile {
  const value = fromJsonText(input, 'the profile');
  if (value === null || typeof value !== 'object' || Array.isArray(value))
    throw new InvalidArgumentError('a data-parallel profile must be an object like { "computeMs": 12.5, "params": 25557032, "samplesPerStep": 32 }');
  const p = value as Record<string, unknown>;
  const known = new Set(['computeMs', 'params', 'modelBytes', 'samplesPerStep', 'source']);
  const unknown = Object.keys(p).filter((k) => !known.has(k));
  if (unknown.length > 0) throw new InvalidArgumentError(`profile: unknown field(s) ${unknown.join(', ')}; expected ${[...known].join(', ')}`);
  const computeMs = positive('profile.computeMs', p.computeMs);
  const samplesPerStep = positive('profile.samplesPerStep', p.samplesPerStep);
  if (p.params !== undefined && p.modelBytes !== undefined) throw new InvalidArgumentError('profile: give params or modelBytes, not both');
  if (p.params === undefined && p.modelBytes === undefined) throw new InvalidArgumentError('profile: give params (parameter count) or modelBytes (gradient bytes per step)');
  if (p.params !== undefined && (!Number.isSafeInteger(p.params) || (p.params as number) < 1))
    throw new InvalidArgumentError(`profile.params must be a positive integer, got ${describeValue(p.params)}`);
  if (p.modelBytes !== undefined) positive('profile.modelBytes', p.modelBytes);
  if (p.source !== undefined && typeof p.source !== 'string') throw new InvalidArgumentError('profile.source must be a string');
  return {
    computeMs,
    samplesPerStep,
    ...(p.params !== undefined ? { params: p.params as number } : { modelBytes: p.modelBytes as number }),
    ...(p.source !== undefined ? { source: p.source as string } : {}),
  };
}

/** @internal Reads and checks a profile file. */
export function readDataParallelProfile(path: string): DataParallelProfile {
  if (typeof path !== 'string' || path === '') throw new InvalidArgumentError(`readDataParallelProfile: path must be a file path, got ${describeValue(path)}`);
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    throw new InvalidArgumentError(`cannot read the profile ${path}: ${(error as Error).message}`, { cause: error });
  }
  return parseDataParallelProfile(text);
}

/** @internal Bytes all-reduced per step: modelBytes, or 4 bytes (fp32) per parameter. */
export function gradientBytes(p: DataParallelProfile): number {
  return p.modelBytes ?? 4 * p.params!;
}

/** @internal Projects sync and SAPipe step time and throughput for each worker count (a MODEL; see the file comment). */
export function projectDataParallel(input: DataParallelProjectionInput): DataParallelProjection {
  if (input === null || typeof input !== 'object') throw new InvalidArgumentError('projectDataParallel(input) must be an object');
  const profile = parseDataParallelProfile(input.profile);
  const n = input.network;
  if (n === null || typeof n !== 'object') throw new InvalidArgumentError('network must be an object like { gbps: 100, latencyUs: 5 }');
  const gbps = positive('network.gbps', n.gbps);
  const latencyUs = n.latencyUs ?? 0;
  if (typeof latencyUs !== 'number' || !Number.isFinite(latencyUs) || latencyUs < 0)
    throw new InvalidArgumentError(`network.latencyUs must be a finite number >= 0, got ${describeValue(latencyUs)}`);
  if (!Array.isArray(input.workers) || input.workers.length === 0) throw new InvalidArgumentError('workers: give at least one worker count');
  for (const w of input.workers)
    if (!Number.isInteger(w) || w < 1 || w > MAX_WORKERS) throw new InvalidArgumentError(`workers: each count must be an integer in [1, ${MAX_WORKERS}], got ${describeValue(w)}`);
  const network = { gbps, latencyUs };
  const bytes = gradientBytes(profile);
  const c = profile.computeMs;
  const rows = input.workers.map((workers): DataParallelProjectionRow => {
    const m = emulatedMs(network, 'allreduce', bytes, workers);
    const syncStepMs = c + m;
    const sapipeStepMs = Math.max(c, m);
    const rate = (stepMs: number): number => (workers * profile.samplesPerStep * 1000) / stepMs;
    return {
      workers,
      allreduceMs: m,
      computeMs: c,
      syncStepMs,
      sapipeStepMs,
      syncSamplesPerSec: rate(syncStepMs),
      sapipeSamplesPerSec: rate(sapipeStepMs),
      speedup: syncStepMs / sapipeStepMs,
      commComputeRatio: m / c,
      syncScalingEfficiency: c / syncStepMs,
      sapipeScalingEfficiency: c / sapipeStepMs,
    };
  });
  return { model: true, profile, network, gradientBytes: bytes, rows };
}
