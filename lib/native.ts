/**
 * Loading the N-API addon. The addon is found by node-gyp-build: `build/Release` (a source or
 * cmake-js build) or `prebuilds/<platform>-<arch>/`. It is loaded on first use, so the pure
 * TypeScript parts of the package (schedules, simulator, CLI help) work even where it is missing;
 * then every native entry throws BackendUnavailableError with the reason.
 */
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

import { BackendUnavailableError, fromNativeError } from './errors.js';

/** A 64-byte aligned fp32 buffer owned by native code. @category Kernels */
export interface NativeBufferHandle {
  readonly array: Float32Array;
  readonly length: number;
  readonly disposed: boolean;
  dispose(): void;
  view(offset: number, length: number): Float32Array;
}

/** An in-order native execution queue (one worker thread), like a CUDA stream. @internal */
export interface QueueHandle {
  readonly pending: number;
  /** Resolves once the queue's submitted operations have settled and its thread is joined. */
  close(): Promise<void>;
}

/** Numeric form of the native update configuration (see native/include/sapipe/kernels.h). @category Kernels */
export interface NativeUpdateConfig {
  optimizer: number;
  lr: number;
  weightDecay?: number;
  momentum?: number;
  dampening?: number;
  nesterov?: boolean;
  momentumIsEmpty?: boolean;
  spikeDelay?: number;
  beta1?: number;
  beta2?: number;
  eps?: number;
  step?: number;
  gradScale?: number;
  /** The caller guarantees the gradients are finite (checked by the reduction that made them). */
  gradChecked?: boolean;
  compensation?: number;
  compensationLambda?: number;
  compensationEps?: number;
  prediction?: number;
  estimate?: number;
  compensateEstimate?: boolean;
  worldSize?: number;
  havePrevLocal?: boolean;
  localGradScale?: number;
  predictionSteps?: number;
}

/** @category Kernels */
export interface NativeUpdateBuffers {
  weights: NativeBufferHandle;
  grad: NativeBufferHandle;
  momentum?: NativeBufferHandle | undefined;
  secondMoment?: NativeBufferHandle | undefined;
  backup?: NativeBufferHandle | undefined;
  predicted?: NativeBufferHandle | undefined;
  localGrad?: NativeBufferHandle | undefined;
  prevLocalGrad?: NativeBufferHandle | undefined;
  /** Out of place: the weights are read here and the updated weights written to `weights`. */
  weightsIn?: NativeBufferHandle | undefined;
  offset?: number;
  count?: number;
}

/** @category Kernels */
export interface NativeUpdateResult {
  applied: boolean;
  nonFiniteCount: number;
  /** With a clip: the gradient's norm in the units the optimizer applies (before clipping). */
  gradNorm?: number;
}

/**
 * Gradient-norm clipping decided where the update runs (native/core/queued_update.h): the norm
 * is sqrt(sum g^2) * base * unscale, and above maxNorm the step's scale becomes base * unscale *
 * maxNorm / (norm + 1e-6); otherwise base * unscale.
 * @internal
 */
export interface NativeClip {
  maxNorm: number;
  /** The optimizer's gradScale. */
  base: number;
  /** Loss scale and accumulation removed. */
  unscale: number;
}

/** @internal */
export interface NativeInfo {
  abiVersion: number;
  simd: 'baseline' | 'avx2' | 'avx512';
  simdSupported: 'baseline' | 'avx2' | 'avx512';
  threads: number;
  alignment: number;
}

/** Arguments of the native SGEMM: C = alpha*op(A)*op(B) + beta*C on dense row-major views at element offsets. */
/** Device memory as the model operations see it (the CUDA plugin's buffers, lib/device/buffer.ts). @internal */
export interface DeviceMemoryHandle {
  readonly length: number;
  readonly device: number;
  readonly disposed: boolean;
}

/** An operand of a model operation: host memory, or device memory. @internal */
export type OperandHandle = NativeBufferHandle | DeviceMemoryHandle;

/** A convolution's shape as the addon reads it (native/include/sapipe/nn.h, sapipe_nn_conv2d_shape). @internal */
export interface NativeConv2dShape {
  batch: number;
  inChannels: number;
  height: number;
  width: number;
  outChannels: number;
  kernelH: number;
  kernelW: number;
  strideH: number;
  strideW: number;
  padH: number;
  padW: number;
}

/** @internal */
export interface NativeGemmArgs {
  transA?: boolean;
  transB?: boolean;
  m: number;
  n: number;
  k: number;
  alpha?: number;
  beta?: number;
  a: OperandHandle;
  aOffset?: number;
  b: OperandHandle;
  bOffset?: number;
  c: OperandHandle;
  cOffset?: number;
}

/** @internal What the MSTopK kernel returns (native/cpu/topk.cpp). */
export interface NativeTopkResult {
  indices: Int32Array;
  values: Float32Array;
  passes: number;
  lower: number;
  upper: number;
  band: number;
}

/** @category Kernels */
export interface NativeAddon {
  NativeBuffer: new (length: number) => NativeBufferHandle;
  Queue: new () => QueueHandle;
  update(config: NativeUpdateConfig, buffers: NativeUpdateBuffers): NativeUpdateResult;
  /**
   * gate: a bucket update of a step guarded up front (guardAsync, then a sum all-reduce of the
   * gate): it runs only if gate[0] and gate[1] are 0, else writes nothing and reports gate[0].
   */
  updateAsync(
    queue: QueueHandle,
    config: NativeUpdateConfig,
    buffers: NativeUpdateBuffers,
    clip?: NativeClip,
    gate?: NativeBufferHandle,
    /** Run only once latchSignalAsync(latch, slot) has run (on another queue); ERR_TIMEOUT after timeoutMs, ERR_DISPOSED when the signal failed or was dropped. */
    wait?: { latch: NativeBufferHandle; slot: number; timeoutMs: number },
  ): Promise<NativeUpdateResult>;
  /** Queued: sets latch[slot] to 1, releasing the updates waiting on it; to -1 (failing them) when the operation before it on its queue failed or latch[slot - 1] is -1 (a slot - 1 still 0 does not hold it back). The latch must start at zeros. */
  latchSignalAsync(queue: QueueHandle, latch: NativeBufferHandle, slot: number): Promise<void>;
  /** Queued: gate[0] = grad's non-finite elements, gate[1] = 1 if a sum of `size` such gradients could overflow fp32. */
  guardAsync(queue: QueueHandle, grad: NativeBufferHandle, gate: NativeBufferHandle, size: number): Promise<void>;
  updateBytesPerElement(config: NativeUpdateConfig): number;
  elasticAverage(worker: NativeBufferHandle, center: NativeBufferHandle, alpha: number): void;
  sum(out: NativeBufferHandle, inputs: NativeBufferHandle[], scale: number): number;
  scale(x: NativeBufferHandle, s: number): void;
  axpy(y: NativeBufferHandle, x: NativeBufferHandle, a: number): void;
  squaredNorm(x: NativeBufferHandle): number;
  countNonFinite(x: NativeBufferHandle): number;
  /** STREAM triad on doubles: each buffer holds length/2 doubles. */
  triad(a: NativeBufferHandle, b: NativeBufferHandle, c: NativeBufferHandle, s: number): void;
  copy(dst: NativeBufferHandle, src: NativeBufferHandle): void;
  topkSelect(grad: NativeBufferHandle, residual: NativeBufferHandle | null, k: number, rounds: number): NativeTopkResult;
  topkExact(x: NativeBufferHandle, k: number): { indices: Int32Array; values: Float32Array };
  scatterAdd(out: NativeBufferHandle, indices: Int32Array, values: Float32Array, scale: number): void;
  info(): NativeInfo;
  /** The calling thread's kernels on a pool of `threads` of their own (0: the process-wide pool); returns the threads they now use. */
  bindKernelThreads(threads: number): number;
  /** The calling thread's own pool's threads, or 0 on the process-wide pool. */
  kernelThreads(): number;
  sgemm(args: NativeGemmArgs): void;
  // The model operations (native/include/sapipe/nn.h; native/addon/nn_binding.cpp): operands are
  // all host buffers (the CPU table) or all buffers of one CUDA device (the plugin's table).
  nnBiasAdd(y: OperandHandle, yOffset: number, bias: OperandHandle, biasOffset: number, rows: number, cols: number): void;
  nnBiasGrad(db: OperandHandle, dbOffset: number, dy: OperandHandle, dyOffset: number, rows: number, cols: number, accumulate: boolean): void;
  nnRelu(y: OperandHandle, yOffset: number, x: OperandHandle, xOffset: number, count: number): void;
  nnReluBackward(dx: OperandHandle, dxOffset: number, y: OperandHandle, yOffset: number, dy: OperandHandle, dyOffset: number, count: number): void;
  nnSoftmaxXent(
    logits: OperandHandle,
    logitsOffset: number,
    labels: OperandHandle,
    labelsOffset: number,
    rows: number,
    classes: number,
    gradScale: number,
    losses: OperandHandle,
    lossesOffset: number,
    dlogits: OperandHandle | null,
    dlogitsOffset: number,
    correct: OperandHandle | null,
    correctOffset: number,
  ): void;
  nnGelu(y: OperandHandle, yOffset: number, x: OperandHandle, xOffset: number, count: number): void;
  nnGeluBackward(dx: OperandHandle, dxOffset: number, x: OperandHandle, xOffset: number, dy: OperandHandle, dyOffset: number, count: number): void;
  nnAdd(y: OperandHandle, yOffset: number, a: OperandHandle, aOffset: number, b: OperandHandle, bOffset: number, count: number): void;
  nnLayerNorm(
    y: OperandHandle,
    yOffset: number,
    mean: OperandHandle,
    meanOffset: number,
    rstd: OperandHandle,
    rstdOffset: number,
    x: OperandHandle,
    xOffset: number,
    gamma: OperandHandle,
    gammaOffset: number,
    beta: OperandHandle,
    betaOffset: number,
    rows: number,
    cols: number,
    eps: number,
  ): void;
  nnLayerNormBackward(
    dx: OperandHandle,
    dxOffset: number,
    dgamma: OperandHandle,
    dgammaOffset: number,
    dbeta: OperandHandle,
    dbetaOffset: number,
    dy: OperandHandle,
    dyOffset: number,
    x: OperandHandle,
    xOffset: number,
    mean: OperandHandle,
    meanOffset: number,
    rstd: OperandHandle,
    rstdOffset: number,
    gamma: OperandHandle,
    gammaOffset: number,
    rows: number,
    cols: number,
    accumulate: boolean,
  ): void;
  nnEmbedding(
    y: OperandHandle,
    yOffset: number,
    tokens: OperandHandle,
    tokensOffset: number,
    tokenTable: OperandHandle,
    tokenTableOffset: number,
    positionTable: OperandHandle,
    positionTableOffset: number,
    batch: number,
    seq: number,
    vocab: number,
    dim: number,
  ): void;
  nnEmbeddingBackward(
    dtokenTable: OperandHandle,
    dtokenTableOffset: number,
    dpositionTable: OperandHandle | null,
    dpositionTableOffset: number,
    dy: OperandHandle,
    dyOffset: number,
    tokens: OperandHandle,
    tokensOffset: number,
    batch: number,
    seq: number,
    vocab: number,
    dim: number,
    accumulate: boolean,
  ): void;
  nnDropout(y: OperandHandle, yOffset: number, x: OperandHandle, xOffset: number, count: number, p: number, seed: number, offset: number): void;
  nnAttention(
    o: OperandHandle,
    oOffset: number,
    lse: OperandHandle,
    lseOffset: number,
    q: OperandHandle,
    qOffset: number,
    k: OperandHandle,
    kOffset: number,
    v: OperandHandle,
    vOffset: number,
    batch: number,
    seq: number,
    heads: number,
    headDim: number,
    scale: number,
  ): void;
  nnConv2d(y: OperandHandle, yOffset: number, x: OperandHandle, xOffset: number, w: OperandHandle, wOffset: number, bias: OperandHandle | null, biasOffset: number, shape: NativeConv2dShape): void;
  nnConv2dBackward(
    dx: OperandHandle | null,
    dxOffset: number,
    dw: OperandHandle,
    dwOffset: number,
    db: OperandHandle | null,
    dbOffset: number,
    dy: OperandHandle,
    dyOffset: number,
    x: OperandHandle,
    xOffset: number,
    w: OperandHandle,
    wOffset: number,
    shape: NativeConv2dShape,
    accumulate: boolean,
  ): void;
  nnPool2d(y: OperandHandle, yOffset: number, x: OperandHandle, xOffset: number, shape: NativeConv2dShape, mode: number): void;
  nnPool2dBackward(dx: OperandHandle, dxOffset: number, dy: OperandHandle, dyOffset: number, x: OperandHandle, xOffset: number, shape: NativeConv2dShape, mode: number): void;
  nnAttentionBackward(
    dq: OperandHandle,
    dqOffset: number,
    dk: OperandHandle,
    dkOffset: number,
    dv: OperandHandle,
    dvOffset: number,
    dout: OperandHandle,
    doutOffset: number,
    q: OperandHandle,
    qOffset: number,
    k: OperandHandle,
    kOffset: number,
    v: OperandHandle,
    vOffset: number,
    o: OperandHandle,
    oOffset: number,
    lse: OperandHandle,
    lseOffset: number,
    batch: number,
    seq: number,
    heads: number,
    headDim: number,
    scale: number,
  ): void;
  /** Core clock in GHz measured with a dependent multiply chain; 0 where it cannot be measured. */
  measureClockGhz(): number;
}

/** Numeric enums shared with the C ABI. @category Kernels */
export const OptimizerKind = { sgd: 0, adam: 1, adamw: 2 } as const;
/** @category Kernels */
export const CompensationKind = { none: 0, elementwise: 1, adaptive: 2 } as const;
/** @category Kernels */
export const PredictionKind = { none: 0, shadowStep: 1, linear: 2 } as const;
/** @category Kernels */
export const EstimateKind = { local: 0, 'prev-sync': 1, 'local-prev-sync': 2 } as const;

const packageRoot = fileURLToPath(new URL('..', import.meta.url));

let loaded: NativeAddon | undefined;
let loadError: Error | undefined;

function load(): NativeAddon {
  const require = createRequire(import.meta.url);
  const nodeGypBuild = require('node-gyp-build') as (dir: string) => unknown;
  return nodeGypBuild(packageRoot) as NativeAddon;
}

/** The addon, loading it on first call. Throws BackendUnavailableError if it cannot be loaded. @category Kernels */
export function nativeAddon(): NativeAddon {
  if (loaded) return loaded;
  if (!loadError) {
    try {
      loaded = load();
      return loaded;
    } catch (error) {
      loadError = error instanceof Error ? error : new Error(String(error));
    }
  }
  throw new BackendUnavailableError(
    `the sapipe native addon could not be loaded (${loadError.message}). ` +
      'Reinstall the package, or build it from source with `npm run build:native` (needs a C++17 compiler and CMake).',
    { cause: loadError },
  );
}

/** Why the addon is unavailable, or undefined when it loads. @category Kernels */
export function nativeUnavailableReason(): string | undefined {
  try {
    nativeAddon();
    return undefined;
  } catch (error) {
    return (error as Error).message;
  }
}

/** Runs a native call, turning its errors into SapipeError subclasses. @internal */
export function callNative<T>(fn: () => T): T {
  try {
    return fn();
  } catch (error) {
    throw fromNativeError(error);
  }
}

/** Awaits a native Promise, turning its rejection into a SapipeError subclass. @internal */
export async function awaitNative<T>(promise: Promise<T>): Promise<T> {
  try {
    return await promise;
  } catch (error) {
    throw fromNativeError(error);
  }
}
