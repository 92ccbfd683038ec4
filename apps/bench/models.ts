/**
 * `sapipe bench models`: one training step (forward, softmax cross-entropy, backward, SGD with
 * momentum) of sapipe's Sequential against PyTorch eager on the CPU, or on one CUDA device
 * (`device: 'cuda:N'`: sapipe's device path, the weights, gradients and optimizer state in a
 * DeviceParamSet, against PyTorch eager on the same GPU), the same model, batch,
 * initialisation scale and thread count, in one run. The PyTorch side is torch-models.py in a
 * child process, built from the same layer list (LayerSpec JSON); the two sides' repeats
 * alternate (sapipe first on even repeats, PyTorch first on odd ones) so that a busy machine's
 * drift falls on both, and a 512^3 SGEMM of each BLAS is timed the same way beside them.
 *
 * A model is one entry of {@link BENCH_MODELS}: its layers and batch (its classes, loss rows per
 * sample and vocabulary come from the layers: {@link lossShape}). A new layer kind needs its
 * PyTorch counterpart in torch-models.py (`build_model`), which fails naming the kind until it has
 * one.
 */
import { availableParallelism, cpus, loadavg } from 'node:os';
import { performance } from 'node:perf_hooks';

import {
  BackendUnavailableError,
  DeviceParamSet,
  FlatBuffer,
  InvalidArgumentError,
  SGD,
  Sequential,
  backendStatuses,
  chooseDevice,
  cnnLayers,
  gptLayers,
  layerParams,
  mlpLayers,
  modelDevice,
  nativeInfo,
  sgemm,
  softmaxXent,
  type LayerSpec,
  DeviceBuffer,
  type ModelDevice,
} from 'sapipe';
import { median } from './timing.js';

/** A buffer of the model's memory: the host's or a device's. */
type Buffer = FlatBuffer | DeviceBuffer;
import { TorchProcess, openblasCoretype, torchScriptPath, type TorchSetup } from './torch-child.js';

/** A model of the comparison: everything both sides build it from. */
export interface BenchModel {
  readonly name: string;
  readonly description: string;
  readonly batch: number;
  layers(): LayerSpec[];
}

/** The models `sapipe bench models` knows, in the order it runs them. */
export const BENCH_MODELS: readonly BenchModel[] = [
  {
    name: 'mlp',
    description: 'MLP 784 -> 6 x 512 (ReLU) -> 10',
    batch: 256,
    layers: () => mlpLayers([784, 512, 512, 512, 512, 512, 512, 10]),
  },
  {
    name: 'cnn',
    description: 'CNN conv3x3(1->8) ReLU maxpool2, conv3x3(8->16) ReLU maxpool2, linear(784->10)',
    batch: 64,
    layers: () => cnnLayers({ channels: 1, height: 28, width: 28 }, [8, 16], 10),
  },
  {
    name: 'gpt',
    description: 'byte-level GPT: 4 pre-LN blocks of width 128, 4 heads, context 128 (gptLayers), per-token loss',
    batch: 16,
    layers: () => gptLayers({ vocab: 256, context: 128, dim: 128, heads: 4, layers: 4 }),
  },
];

export const BENCH_MODEL_NAMES = BENCH_MODELS.map((m) => m.name);

/**
 * What a model's loss reads, from its layers: the classes of a loss row (the last linear layer's
 * outputs), loss rows per sample (its `rows`: a language model's positions), and, when the first
 * layer is an embedding, the vocabulary its token ids are drawn from.
 */
export function lossShape(layers: readonly LayerSpec[]): { classes: number; rowsPerSample: number; vocab?: number } {
  const [first, last] = [layers[0], layers.at(-1)];
  if (last?.kind !== 'linear') throw new InvalidArgumentError('bench models: a model ends with a linear layer, its logits');
  return { classes: last.out, rowsPerSample: last.rows ?? 1, ...(first?.kind === 'embedding' ? { vocab: first.vocab } : {}) };
}

export interface ModelsBenchOptions {
  /** Names from BENCH_MODELS. */
  models: readonly string[];
  /** Timed steps per repeat. */
  steps: number;
  /** Repeats (each side times `steps` steps per repeat). */
  reps: number;
  /** Untimed steps per side before the first repeat. */
  warmup: number;
  /** Batch size for every model (default: each model's own). */
  batch?: number;
  /** Time sapipe alone. */
  sapipeOnly?: boolean;
  /**
   * Where both sides run: `cpu` (the default), `cuda:N`, or `auto` (chooseDevice: cuda:0 where it
   * can run models, else cpu). An unusable device is BackendUnavailableError.
   */
  device?: string;
  /** Interpreters to try in order (the first that imports torch runs the PyTorch side). */
  pythons: readonly string[];
  torchScript?: string;
  /** OPENBLAS_CORETYPE for the PyTorch process (default: from the CPU flags). */
  openblasCoretype?: string;
  lr?: number;
  momentum?: number;
  seed?: number;
  /** Called before each timed block, for progress. */
  onProgress?: (done: number, total: number, label: string) => void;
}

/** Milliseconds per step (or per product) over the repeats. */
export interface Spread {
  medianMs: number;
  minMs: number;
  maxMs: number;
  samples: number[];
}

export interface ModelRow {
  model: string;
  description: string;
  batch: number;
  params: number;
  sapipe: Spread;
  torch?: Spread;
  /** sapipe median / PyTorch median (goal: at most 1). */
  ratio?: number;
  /** The ratio of each repeat's pair of runs: median, min, max. */
  ratioPerRepeat?: { median: number; min: number; max: number };
}

export interface ModelsBenchResult {
  /** Where both sides ran: cpu or cuda:N. */
  device: 'cpu' | `cuda:${number}`;
  /** Why that device (chooseDevice's reason: "asked for", or what `auto` found). */
  deviceReason: string;
  /** The GPU as the CUDA plugin names it (on a device). */
  deviceName?: string;
  threads: number;
  simd: string;
  cores: number;
  cpu: string;
  loadAverage: { before: number[]; after: number[] };
  steps: number;
  reps: number;
  warmup: number;
  momentum: number;
  torch?: TorchSetup & { openblasCoretypeSource: string };
  gemm: { size: number; sapipe: Spread & { gflops: number }; torch?: Spread & { gflops: number } };
  rows: ModelRow[];
}

const GEMM_SIZE = 512;

function spread(samples: number[]): Spread {
  return { medianMs: median(samples), minMs: Math.min(...samples), maxMs: Math.max(...samples), samples };
}

/**
 * sapipe's side of one model: Sequential, native softmax cross-entropy, SGD, one fixed batch. On a
 * device the model runs there, its weights, gradients and SGD's momentum in a DeviceParamSet, and
 * the batch is copied there once.
 */
class SapipeModel {
  readonly model: Sequential<Buffer>;
  readonly optimizer: SGD;
  /** The device's weights, gradients and optimizer state (on a device). */
  private readonly state: DeviceParamSet | undefined;
  private readonly memory: ModelDevice;
  private readonly input: Buffer;
  private readonly labels: Buffer;
  private readonly losses: Buffer;
  private readonly dlogits: Buffer;

  /** Loss rows of a batch: batch x rowsPerSample. */
  private readonly rows: number;
  /** Classes of a loss row. */
  private readonly classes: number;

  constructor(
    layers: LayerSpec[],
    readonly batch: number,
    options: { seed: number; lr: number; momentum: number; device: 'cpu' | `cuda:${number}` },
  ) {
    const { classes, rowsPerSample: perSample, vocab } = lossShape(layers);
    this.classes = classes;
    this.memory = modelDevice(options.device);
    this.model = new Sequential<Buffer>(layers, { seed: options.seed, device: options.device });
    const made: Buffer[] = [];
    let optimizer: SGD | undefined;
    let state: DeviceParamSet | undefined;
    try {
      optimizer = new SGD(this.model.params, { lr: options.lr, momentum: options.momentum });
      state = options.device === 'cpu' ? undefined : DeviceParamSet.create(this.model.params, { device: options.device, optimizer });
      this.optimizer = optimizer;
      this.state = state;
      // Values in [0, 1) (or token ids) and labels r % classes, as the PyTorch side draws its batch;
      // drawn on the host and copied to the model's memory once, before any timing.
      const input = new Float32Array(batch * this.model.inputSize);
      let s = options.seed >>> 0 || 1;
      for (let i = 0; i < input.length; i++) {
        s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
        const u = s / 2 ** 32;
        input[i] = vocab !== undefined ? Math.floor(u * vocab) : u;
      }
      this.rows = batch * perSample;
      const labels = new Float32Array(this.rows);
      for (let r = 0; r < this.rows; r++) labels[r] = r % classes;
      const allocate = (length: number): Buffer => {
        const t = this.memory.allocate(length) as Buffer;
        made.push(t);
        return t;
      };
      this.input = allocate(input.length);
      this.memory.write(this.input, input);
      this.labels = allocate(this.rows);
      this.memory.write(this.labels, labels);
      this.losses = allocate(this.rows);
      this.dlogits = allocate(this.rows * classes);
    } catch (error) {
      for (const t of made) t.dispose();
      state?.dispose();
      optimizer?.dispose();
      this.model.dispose();
      throw error;
    }
  }

  step(): void {
    const weights = this.state ? this.state.forwardWeights : this.optimizer.forwardWeights;
    const logits = this.model.forward(0, this.input, this.batch, weights);
    softmaxXent({ buffer: logits }, { buffer: this.labels }, this.rows, this.classes, 1 / this.rows, { losses: { buffer: this.losses }, dlogits: { buffer: this.dlogits } });
    this.model.backward(0, this.dlogits, { grads: this.state ? this.state.grads : this.model.params.grads, inputGrad: false });
    // On a device the fused update runs to completion (it reports its non-finite count).
    if (this.state) this.state.step();
    else this.optimizer.stepSync();
  }

  /**
   * Milliseconds per step over `steps` steps. On a device the block ends by reading a loss back
   * to the host, which waits for every operation queued on the device, so the time is the device's.
   */
  time(steps: number): number {
    const start = performance.now();
    for (let i = 0; i < steps; i++) this.step();
    if (this.state) this.memory.read(this.losses, 1);
    return (performance.now() - start) / steps;
  }

  dispose(): void {
    for (const b of [this.input, this.labels, this.losses, this.dlogits]) b.dispose();
    this.state?.dispose();
    this.optimizer.dispose();
    this.model.dispose();
  }
}

/**
 * sapipe's SGEMM of size^3 (the same product as the PyTorch side's): the native kernel on the
 * host, cuBLAS through sgemm on DeviceBuffers on a device (the block ends by reading a value back,
 * which waits for the products).
 */
class SapipeGemm {
  private readonly a: Buffer;
  private readonly b: Buffer;
  private readonly c: Buffer;
  private readonly memory: ModelDevice;
  constructor(
    readonly size: number,
    device: 'cpu' | `cuda:${number}`,
  ) {
    this.memory = modelDevice(device);
    const a = new Float32Array(size * size);
    const b = new Float32Array(size * size);
    for (let i = 0; i < a.length; i++) {
      a[i] = ((i * 7919) % 1000) / 1000 - 0.5;
      b[i] = ((i * 104729) % 1000) / 1000 - 0.5;
    }
    this.a = this.memory.allocate(a.length) as Buffer;
    this.b = this.memory.allocate(b.length) as Buffer;
    this.c = this.memory.allocate(a.length) as Buffer;
    this.memory.write(this.a, a);
    this.memory.write(this.b, b);
  }
  time(products: number): number {
    const start = performance.now();
    for (let i = 0; i < products; i++) sgemm({ m: this.size, n: this.size, k: this.size, a: this.a, b: this.b, c: this.c });
    if (!(this.c instanceof FlatBuffer)) this.memory.read(this.c, 1);
    return (performance.now() - start) / products;
  }
  dispose(): void {
    for (const x of [this.a, this.b, this.c]) x.dispose();
  }
}

function pick(names: readonly string[]): BenchModel[] {
  if (names.length === 0) throw new InvalidArgumentError(`bench models: name at least one model of ${BENCH_MODEL_NAMES.join(', ')}`);
  return names.map((name) => {
    const m = BENCH_MODELS.find((x) => x.name === name);
    if (!m) throw new InvalidArgumentError(`bench models: unknown model "${name}"; the models are ${BENCH_MODEL_NAMES.join(', ')}`);
    return m;
  });
}

/**
 * The environment of the PyTorch process: sapipe's thread count everywhere torch and its BLAS read
 * one, the OpenBLAS core (see openblasCoretype), and OMP_WAIT_POLICY=PASSIVE unless the environment
 * sets it: on a machine busy with others' work, libgomp's threads spinning between ATen's parallel
 * loops against OpenBLAS's own threads made PyTorch's MLP step 20 to 40 times slower (400 ms
 * instead of 17 ms, 2 threads, bench/RESULTS.md).
 */
export function torchEnvironment(threads: number, coretypeOption?: string, env: NodeJS.ProcessEnv = process.env): { env: NodeJS.ProcessEnv; coretypeSource: string } {
  const coretype = openblasCoretype(coretypeOption, env);
  const t = String(threads);
  const out: NodeJS.ProcessEnv = { ...env, SAPIPE_BENCH_THREADS: t, OMP_NUM_THREADS: t, OPENBLAS_NUM_THREADS: t, MKL_NUM_THREADS: t };
  out.OMP_WAIT_POLICY = env.OMP_WAIT_POLICY || 'PASSIVE';
  if (coretype.value !== undefined) out.OPENBLAS_CORETYPE = coretype.value;
  else delete out.OPENBLAS_CORETYPE;
  return { env: out, coretypeSource: coretype.source };
}

export async function benchModels(options: ModelsBenchOptions): Promise<ModelsBenchResult> {
  const entries = pick(options.models);
  for (const [name, v] of Object.entries({ steps: options.steps, reps: options.reps }))
    if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`bench models: ${name} must be a positive integer, got ${v}`);
  if (!Number.isInteger(options.warmup) || options.warmup < 0) throw new InvalidArgumentError('bench models: warmup must be an integer of 0 or more');
  // chooseDevice: cpu as given, cuda:N checked able to run models (BackendUnavailableError saying
  // why not), auto resolved with its reason.
  let choice: ReturnType<typeof chooseDevice>;
  try {
    choice = chooseDevice(options.device ?? 'cpu');
  } catch (error) {
    if (!(error instanceof BackendUnavailableError)) throw error;
    throw new BackendUnavailableError(
      `bench models: ${error.message}. Run it where an NVIDIA GPU, its driver and a CUDA plugin of sapipe (build/Release/sapipe_cuda*.so, or the package's prebuilds) are usable ` +
        '(`npx sapipe info` says what each backend lacks; SAPIPE_CUDA_PLUGIN names another plugin file), or time the CPU with --device cpu',
    );
  }
  const device = choice.device;
  const deviceName = device === 'cpu' ? undefined : String(backendStatuses().find((b) => b.name === 'cuda')?.details?.[device] ?? 'unknown');
  const seed = options.seed ?? 1;
  const lr = options.lr ?? 0.01;
  const momentum = options.momentum ?? 0.9;
  const info = nativeInfo();
  const threads = info.threads;
  const loadBefore = loadavg();

  let torch: TorchProcess | undefined;
  let coretypeSource = '';
  if (!options.sapipeOnly) {
    const { env, coretypeSource: source } = torchEnvironment(threads, options.openblasCoretype);
    coretypeSource = source;
    env.SAPIPE_BENCH_DEVICE = device;
    torch = await TorchProcess.start(options.pythons, options.torchScript ?? torchScriptPath(), env, device);
  }
  const sides: SapipeModel[] = [];
  let gemm: SapipeGemm | undefined;
  try {
    const gemmSide = new SapipeGemm(GEMM_SIZE, device);
    gemm = gemmSide;
    const rows: ModelRow[] = [];
    for (const entry of entries) {
      const batch = options.batch ?? entry.batch;
      const layers = entry.layers();
      const side = new SapipeModel(layers, batch, { seed, lr, momentum, device });
      sides.push(side);
      const row: ModelRow = { model: entry.name, description: entry.description, batch, params: layerParams(layers).reduce((a, b) => a + b, 0), sapipe: spread([]) };
      if (torch) {
        const loss = lossShape(layers);
        const built = await torch.request({
          op: 'build',
          name: entry.name,
          layers,
          batch,
          classes: loss.classes,
          rowsPerSample: loss.rowsPerSample,
          vocab: loss.vocab ?? null,
          inputSize: side.model.inputSize,
          seed,
          lr,
          momentum,
        });
        if (built.params !== row.params)
          throw new InvalidArgumentError(`bench models: ${entry.name} has ${row.params} parameters in sapipe but ${String(built.params)} in PyTorch; the two sides must build the same model`);
      }
      rows.push(row);
    }
    // Warm-up: both sides, every model, and the products (about 20 ms of them).
    const gemmOnce = gemmSide.time(1);
    const products = Math.max(1, Math.min(200, Math.round(20 / Math.max(gemmOnce, 1e-3))));
    gemmSide.time(products);
    await torch?.request({ op: 'gemm', size: GEMM_SIZE, products });
    for (const [i, side] of sides.entries()) {
      if (options.warmup > 0) {
        side.time(options.warmup);
        await torch?.request({ op: 'steps', name: rows[i]!.model, steps: options.warmup });
      }
    }
    const samples = rows.map(() => ({ sapipe: [] as number[], torch: [] as number[] }));
    const gemmSamples = { sapipe: [] as number[], torch: [] as number[] };
    const total = options.reps * (rows.length + 1);
    let done = 0;
    for (let r = 0; r < options.reps; r++) {
      const torchFirst = r % 2 === 1;
      const pair = async (sapipeRun: () => number, torchRun: () => Promise<number>, into: { sapipe: number[]; torch: number[] }): Promise<void> => {
        if (torch && torchFirst) into.torch.push(await torchRun());
        into.sapipe.push(sapipeRun());
        if (torch && !torchFirst) into.torch.push(await torchRun());
      };
      options.onProgress?.(done++, total, 'sgemm');
      await pair(() => gemmSide.time(products), async () => Number((await torch!.request({ op: 'gemm', size: GEMM_SIZE, products })).ms), gemmSamples);
      for (const [i, side] of sides.entries()) {
        options.onProgress?.(done++, total, rows[i]!.model);
        await pair(() => side.time(options.steps), async () => Number((await torch!.request({ op: 'steps', name: rows[i]!.model, steps: options.steps })).ms), samples[i]!);
      }
    }
    for (const [i, row] of rows.entries()) {
      row.sapipe = spread(samples[i]!.sapipe);
      if (torch) {
        row.torch = spread(samples[i]!.torch);
        row.ratio = row.sapipe.medianMs / row.torch.medianMs;
        const ratios = samples[i]!.sapipe.map((s, k) => s / samples[i]!.torch[k]!);
        row.ratioPerRepeat = { median: median(ratios), min: Math.min(...ratios), max: Math.max(...ratios) };
      }
    }
    const flops = 2 * GEMM_SIZE ** 3;
    const withGflops = (s: Spread): Spread & { gflops: number } => ({ ...s, gflops: flops / (s.medianMs * 1e6) });
    return {
      device,
      deviceReason: choice.reason,
      ...(deviceName !== undefined ? { deviceName } : {}),
      threads,
      simd: info.simd,
      cores: availableParallelism(),
      cpu: cpus()[0]?.model ?? 'unknown',
      loadAverage: { before: loadBefore, after: loadavg() },
      steps: options.steps,
      reps: options.reps,
      warmup: options.warmup,
      momentum,
      ...(torch ? { torch: { ...torch.setup, openblasCoretypeSource: coretypeSource } } : {}),
      gemm: { size: GEMM_SIZE, sapipe: withGflops(spread(gemmSamples.sapipe)), ...(torch ? { torch: withGflops(spread(gemmSamples.torch)) } : {}) },
      rows,
    };
  } finally {
    torch?.close();
    gemm?.dispose();
    for (const s of sides) s.dispose();
  }
}
