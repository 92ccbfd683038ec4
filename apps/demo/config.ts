/**
 * The demo's configuration: which data-parallel modes train the MLP on MNIST, on how many
 * workers (threads on the CPU, or one GPU each), for how long, and over which (optionally
 * emulated) network. Validated once here so the workers can trust every field.
 */
import { cudaDeviceIndex, DATA_PARALLEL_MODES, type DataParallelMode, DC_LAMBDA_MAX, type DataParallelTrainerOptions, DEFAULT_WP_ESTIMATE, type GradientEstimate, InvalidArgumentError, type NetworkEmulation } from 'sapipe';
import { describeValue } from 'sapipe/validate';
import { checkGptSize, type GptSize } from './gpt-size.js';
import type { DemoDevice } from './device.js';
import { DEMO_MODELS, type DemoModelName } from './models.js';

export { DEMO_LAYERS } from './models.js';

/**
 * One trained configuration: a mode and, for `sapipe-wp`, its gradient estimate and whether the
 * late gradient and the estimate are delay-compensated. Written `sapipe-wp:local+dc` on the
 * command line; `label` is that spelling, used in tables and reports.
 */
export interface DemoVariant {
  label: string;
  mode: DataParallelMode;
  /** `sapipe-wp` only. */
  estimate: GradientEstimate | undefined;
  /** `sapipe-wp` only: add delay compensation (of the late gradient and of the estimate). */
  compensate: boolean;
}

export const WP_ESTIMATES: readonly GradientEstimate[] = ['local', 'prev-sync', 'local-prev-sync'];

export interface DemoConfig {
  /** The model and its data (default `mlp`: the MLP on MNIST; `cnn`: the CNN on Fashion-MNIST; `gpt`: the byte-level GPT on the fortunes text). */
  model?: DemoModelName;
  /** `model: 'gpt'`: its size (default DEMO_GPT_DEFAULTS: 2 blocks, width 64, 4 heads, context 64). */
  gpt?: GptSize;
  workers: number;
  modes: DemoVariant[];
  epochs: number;
  /** Samples per worker per step. */
  batch: number;
  lr: number;
  momentum: number;
  seed: number;
  /** Use at most this many training samples (after the seeded split); undefined: all. */
  trainSamples: number | undefined;
  emulate: NetworkEmulation | undefined;
  /** Delay-compensation strength for `sapipe-dc` and `sapipe-wp:...+dc`; undefined: the trainer's default. */
  lambda: number | undefined;
  /** Delay-compensation form (ALGORITHMS.md section 2); undefined: elementwise. */
  dcKind: 'elementwise' | 'adaptive' | undefined;
  /** The staleness-1 modes' update overlapped behind its all-reduce (DataParallelTrainer's overlapUpdate); default true. */
  overlap?: boolean;
  /** Top-k compressed exchange (DataParallelTrainer's compression): the density each worker sends, with or without error feedback; undefined: dense. */
  topk?: { density: number; errorFeedback: boolean } | undefined;
  /** Where the workers compute (resolveDemoDevice); undefined: the CPU, threads over the local backend. */
  device?: DemoDevice | undefined;
}

/** The defaults keep the four-mode run on 2 cores under two minutes while sync clears 90%. */
export const DEMO_DEFAULTS = {
  workers: 4,
  modes: DATA_PARALLEL_MODES.join(','),
  epochs: 8,
  batch: 32,
  lr: 0.05,
  momentum: 0.9,
  seed: 1,
} as const;


/** Parses one `--modes` entry: a mode, and for `sapipe-wp` an optional `:estimate` and `+dc`. */
export function parseVariant(text: string): DemoVariant {
  const m = /^([a-z-]+)(?::([a-z-]+))?(\+dc)?$/.exec(text);
  const mode = m?.[1];
  if (!m || !(DATA_PARALLEL_MODES as readonly string[]).includes(mode!))
    throw new InvalidArgumentError(
      `--modes: unknown mode "${text}"; choose from ${DATA_PARALLEL_MODES.join(', ')} (sapipe-wp also as sapipe-wp:<${WP_ESTIMATES.join('|')}>[+dc])`,
    );
  if (mode !== 'sapipe-wp' && (m[2] !== undefined || m[3] !== undefined))
    throw new InvalidArgumentError(`--modes: "${text}": only sapipe-wp takes an estimate (:local) or +dc`);
  if (mode !== 'sapipe-wp') return { label: text, mode: mode as DataParallelMode, estimate: undefined, compensate: false };
  const estimate = m[2] ?? DEFAULT_WP_ESTIMATE;
  if (!(WP_ESTIMATES as readonly string[]).includes(estimate))
    throw new InvalidArgumentError(`--modes: "${text}": unknown estimate "${estimate}"; choose from ${WP_ESTIMATES.join(', ')}`);
  return { label: text, mode: 'sapipe-wp', estimate: estimate as GradientEstimate, compensate: m[3] !== undefined };
}

/** Parses `sync,sapipe-dc,sapipe-wp:local+dc`, rejecting unknown or repeated entries. */
export function parseModes(list: string): DemoVariant[] {
  const names = list.split(',').map((s) => s.trim()).filter(Boolean);
  if (names.length === 0) throw new InvalidArgumentError(`--modes: give at least one of ${DATA_PARALLEL_MODES.join(', ')}`);
  const variants = names.map(parseVariant);
  const key = (v: DemoVariant): string => `${v.mode}:${v.estimate ?? ''}:${v.compensate}`;
  if (new Set(variants.map(key)).size !== variants.length) throw new InvalidArgumentError(`--modes: each mode at most once, got "${list}"`);
  return variants;
}

export function checkDemoConfig(c: DemoConfig): DemoConfig {
  const int = (v: number, name: string, lo: number, hi: number): void => {
    if (!Number.isInteger(v) || v < lo || v > hi) throw new InvalidArgumentError(`${name} must be an integer in [${lo}, ${hi}], got ${describeValue(v)}`);
  };
  if (c.model !== undefined && !DEMO_MODELS.includes(c.model)) throw new InvalidArgumentError(`--model must be one of ${DEMO_MODELS.join(', ')}, got ${describeValue(c.model)}`);
  if (c.gpt !== undefined) {
    // A size beside another model would be ignored without a word.
    if (c.model !== 'gpt') throw new InvalidArgumentError(`--blocks, --dim, --heads and --context set the GPT's size; use them with --model gpt, got --model ${c.model ?? 'mlp'}`);
    checkGptSize(c.gpt);
  }
  int(c.workers, '--workers', 1, 64);
  int(c.epochs, '--epochs', 1, 1000);
  int(c.batch, '--batch', 1, 65536);
  int(c.seed, '--seed', 0, 0xffffffff);
  if (c.trainSamples !== undefined) int(c.trainSamples, '--train-samples', 1, 1e9);
  if (!Number.isFinite(c.lr) || c.lr <= 0) throw new InvalidArgumentError(`--lr must be a positive number, got ${describeValue(c.lr)}`);
  if (!Number.isFinite(c.momentum) || c.momentum < 0 || c.momentum >= 1)
    throw new InvalidArgumentError(`--momentum must be a number in [0, 1), got ${describeValue(c.momentum)}`);
  if (!Array.isArray(c.modes) || c.modes.length === 0) throw new InvalidArgumentError('--modes: give at least one mode');
  for (const m of c.modes) {
    if (m === null || typeof m !== 'object' || !DATA_PARALLEL_MODES.includes(m.mode)) throw new InvalidArgumentError(`--modes: unknown mode ${typeof m?.mode === 'string' ? `"${m.mode}"` : describeValue(m?.mode)}`);
    if (m.mode === 'sapipe-wp' ? m.estimate === undefined || !WP_ESTIMATES.includes(m.estimate) : m.estimate !== undefined || m.compensate)
      throw new InvalidArgumentError(`--modes: "${m.label}": only sapipe-wp has an estimate (one of ${WP_ESTIMATES.join(', ')}) and +dc`);
  }
  if (c.lambda !== undefined && (!Number.isFinite(c.lambda) || c.lambda < 0 || c.lambda > DC_LAMBDA_MAX))
    throw new InvalidArgumentError(`--lambda must be a number in [0, ${DC_LAMBDA_MAX.toExponential().replace('e+', 'e')}], got ${describeValue(c.lambda)}`);
  if (c.dcKind !== undefined && c.dcKind !== 'elementwise' && c.dcKind !== 'adaptive')
    throw new InvalidArgumentError(`--dc-kind must be elementwise or adaptive, got ${describeValue(c.dcKind)}`);
  if (c.topk !== undefined && (!Number.isFinite(c.topk.density) || c.topk.density <= 0 || c.topk.density > 1))
    throw new InvalidArgumentError(`--topk must be a density in (0, 1], got ${describeValue(c.topk.density)}`);
  if (c.emulate !== undefined) {
    const { gbps, latencyUs } = c.emulate;
    if (!Number.isFinite(gbps) || gbps <= 0) throw new InvalidArgumentError(`--gbps must be a positive number, got ${describeValue(gbps)}`);
    if (latencyUs !== undefined && (!Number.isFinite(latencyUs) || latencyUs < 0))
      throw new InvalidArgumentError(`--latency-us must be a non-negative number, got ${describeValue(latencyUs)}`);
  }
  if (c.device !== undefined) checkDemoDevice(c);
  return c;
}

/**
 * On GPUs the workers are NCCL ranks whose model computes on the device: what the data-parallel
 * trainer does not offer there is refused here, before any worker starts, with what to pass instead.
 */
function checkDemoDevice(c: DemoConfig): void {
  const d = c.device!;
  if (d === null || typeof d !== 'object' || (d.kind !== 'cpu' && d.kind !== 'cuda') || !Array.isArray(d.ranks))
    throw new InvalidArgumentError(`device must be a resolved demo device (resolveDemoDevice), got ${describeValue(d)}`);
  if (d.kind === 'cpu') {
    if (d.ranks.length !== 0) throw new InvalidArgumentError('device: the CPU has no GPU ranks');
    return;
  }
  d.ranks.forEach((r, i) => cudaDeviceIndex(r, `device.ranks[${i}]`));
  if (d.ranks.length !== c.workers) throw new InvalidArgumentError(`device: ${d.ranks.length} GPU(s) for ${c.workers} workers; each worker needs a GPU of its own`);
  if (new Set(d.ranks).size !== d.ranks.length) throw new InvalidArgumentError(`device: the workers' GPUs must differ (NCCL cannot put two ranks on one GPU), got ${d.ranks.join(', ')}`);
  const where = `--device ${d.ranks.length === 1 ? d.ranks[0] : 'cuda'}`;
  if (c.topk !== undefined) throw new InvalidArgumentError(`--topk is not offered with ${where}: the compressed exchange reduces host buffers; leave --topk out, or use --device cpu`);
  if (c.emulate !== undefined) throw new InvalidArgumentError(`--gbps and --latency-us are not offered with ${where}: the network emulation delays the local backend's collectives, not NCCL's; leave them out, or use --device cpu`);
  if (c.overlap === false) throw new InvalidArgumentError(`--no-overlap is not offered with ${where}: over NCCL the staleness-1 modes always update behind the all-reduce; leave it out, or use --device cpu`);
  for (const m of c.modes)
    if (m.mode === 'sapipe-wp' && m.estimate !== 'prev-sync')
      throw new InvalidArgumentError(`--modes: ${m.label} is not offered with ${where}: the '${m.estimate}' estimate reads each rank's next gradient on the host; use sapipe-wp (estimate prev-sync)${m.compensate ? ' or sapipe-wp:prev-sync+dc' : ''}, or --device cpu`);
}

/** The MNIST split every demo rank reads: SharedArrayBuffer-backed, so N workers do not each copy it. */
export interface DemoSharedData {
  /** Values per sample (pixels, or the GPT's context of token ids). */
  features: number;
  trainInputs: Float32Array;
  trainLabels: Uint8Array;
  testInputs: Float32Array;
  testLabels: Uint8Array;
}

/** What a demo rank's DataParallelTrainer needs besides the communicator and the parameters. */
export type DemoTrainerSettings = Pick<DemoConfig, 'lambda' | 'dcKind' | 'overlap' | 'topk' | 'lr' | 'momentum'>;

/** The DataParallelTrainer options of one variant: its mode, estimate and compensation, SGD with momentum, and the exchange. */
export function demoTrainerOptions(variant: DemoVariant, s: DemoTrainerSettings): Omit<DataParallelTrainerOptions, 'comm' | 'params'> {
  const compensated = variant.mode === 'sapipe-dc' || variant.compensate;
  const overlap = s.overlap ?? true;
  return {
    mode: variant.mode,
    ...(variant.estimate ? { estimate: variant.estimate } : {}),
    ...(compensated ? { compensation: { ...(s.lambda === undefined ? {} : { lambda: s.lambda }), ...(s.dcKind === undefined ? {} : { kind: s.dcKind }) } } : {}),
    optimizer: { kind: 'sgd', lr: s.lr, momentum: s.momentum },
    ...(overlap || s.topk ? {} : { overlapUpdate: false }),
    ...(s.topk ? { compression: { kind: 'topk' as const, density: s.topk.density, errorFeedback: s.topk.errorFeedback } } : {}),
  };
}
