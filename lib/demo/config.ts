/**
 * The demo's configuration: which data-parallel modes train the MLP on MNIST, on how many local
 * workers, for how long, and over which (optionally emulated) network. Validated once here so the
 * workers can trust every field.
 */
import { InvalidArgumentError } from '../errors.js';
import { DATA_PARALLEL_MODES, type DataParallelMode } from '../dataparallel/mode.js';
import type { NetworkEmulation } from '../comm/emulation.js';

export interface DemoConfig {
  workers: number;
  modes: DataParallelMode[];
  epochs: number;
  /** Samples per worker per step. */
  batch: number;
  lr: number;
  momentum: number;
  seed: number;
  /** Use at most this many training samples (after the seeded split); undefined: all. */
  trainSamples: number | undefined;
  emulate: NetworkEmulation | undefined;
}

/** The defaults keep the four-mode run on 2 cores under two minutes while sync clears 90%. */
export const DEMO_DEFAULTS = {
  workers: 4,
  modes: [...DATA_PARALLEL_MODES] as DataParallelMode[],
  epochs: 8,
  batch: 32,
  lr: 0.05,
  momentum: 0.9,
  seed: 1,
} as const;

/** The model: MNIST's 784 pixels, one hidden layer of 128, 10 classes. */
export const DEMO_LAYERS: readonly number[] = [784, 128, 10];

/** sapipe-wp needs a gradient estimate; the demo uses the one combining local and last synced gradients. */
export const DEMO_WP_ESTIMATE = 'local-prev-sync' as const;

/** Parses `sync,sapipe-dc`, rejecting unknown or repeated modes. */
export function parseModes(list: string): DataParallelMode[] {
  const names = list.split(',').map((s) => s.trim()).filter(Boolean);
  if (names.length === 0) throw new InvalidArgumentError(`--modes: give at least one of ${DATA_PARALLEL_MODES.join(', ')}`);
  for (const n of names)
    if (!(DATA_PARALLEL_MODES as readonly string[]).includes(n))
      throw new InvalidArgumentError(`--modes: unknown mode "${n}"; choose from ${DATA_PARALLEL_MODES.join(', ')}`);
  if (new Set(names).size !== names.length) throw new InvalidArgumentError(`--modes: each mode at most once, got "${list}"`);
  return names as DataParallelMode[];
}

export function checkDemoConfig(c: DemoConfig): DemoConfig {
  const int = (v: number, name: string, lo: number, hi: number): void => {
    if (!Number.isInteger(v) || v < lo || v > hi) throw new InvalidArgumentError(`${name} must be an integer in [${lo}, ${hi}], got ${String(v)}`);
  };
  int(c.workers, '--workers', 1, 64);
  int(c.epochs, '--epochs', 1, 1000);
  int(c.batch, '--batch', 1, 65536);
  int(c.seed, '--seed', 0, 0xffffffff);
  if (c.trainSamples !== undefined) int(c.trainSamples, '--train-samples', 1, 1e9);
  if (!Number.isFinite(c.lr) || c.lr <= 0) throw new InvalidArgumentError(`--lr must be a positive number, got ${String(c.lr)}`);
  if (!Number.isFinite(c.momentum) || c.momentum < 0 || c.momentum >= 1)
    throw new InvalidArgumentError(`--momentum must be a number in [0, 1), got ${String(c.momentum)}`);
  if (c.modes.length === 0) throw new InvalidArgumentError('--modes: give at least one mode');
  for (const m of c.modes) if (!DATA_PARALLEL_MODES.includes(m)) throw new InvalidArgumentError(`--modes: unknown mode "${String(m)}"`);
  if (c.emulate !== undefined) {
    const { gbps, latencyUs } = c.emulate;
    if (!Number.isFinite(gbps) || gbps <= 0) throw new InvalidArgumentError(`--gbps must be a positive number, got ${String(gbps)}`);
    if (latencyUs !== undefined && (!Number.isFinite(latencyUs) || latencyUs < 0))
      throw new InvalidArgumentError(`--latency-us must be a non-negative number, got ${String(latencyUs)}`);
  }
  return c;
}
