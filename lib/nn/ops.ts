/**
 * The model operations on tensors in host or device memory: the TypeScript face of the one op
 * table (native/include/sapipe/nn.h) that has a CPU implementation (SIMD SGEMM over the thread
 * pool, plain loops) and a CUDA one (cuBLAS for the products, plugin kernels for the rest).
 *
 * A {@link Tensor} is a FlatBuffer (host) or a DeviceBuffer (`cuda:N`); each operation takes views
 * (a tensor and an element offset) that must all live in the same memory, and dispatches on it:
 * host operands run to completion on the calling thread, device operands are enqueued on the
 * device's default stream, in order with DeviceBuffer copies and DeviceParamSet steps, so nothing
 * waits for the GPU until a result is copied to the host. The addon checks every view against its
 * buffer (ERR_SIZE_MISMATCH), the memory (ERR_INVALID_ARGUMENT for mixed host and device
 * operands) and disposed or busy buffers (ERR_DISPOSED, ERR_BUSY); the functions here add only
 * what the addon cannot see.
 *
 * {@link ModelDevice} bundles the rest a model needs to run on either side: allocating tensors and
 * moving data in and out. Models (MLP) are written once against it.
 */
import { DeviceBuffer, parseDevice, type CudaDevice } from '../device/index.js';
import { InvalidArgumentError } from '../errors.js';
import { callNative, nativeAddon, type OperandHandle } from '../native.js';
import { FlatBuffer } from '../tensor.js';
import { describeValue } from '../validate.js';

/** fp32 memory a model operation reads or writes: host (FlatBuffer) or device (DeviceBuffer). @category Models */
export type Tensor = FlatBuffer | DeviceBuffer;

/** Where a model runs: `cpu` or `cuda:N`. @category Models */
export type Device = 'cpu' | CudaDevice;

/** A row-major matrix or vector starting at element `offset` (default 0) of `buffer`. @category Models */
export interface TensorView<T extends Tensor = Tensor> {
  buffer: T;
  offset?: number;
}

function handleOf(view: TensorView, what: string): OperandHandle {
  if (view === null || typeof view !== 'object') throw new InvalidArgumentError(`${what} must be a { buffer, offset? } view`);
  const buffer = view.buffer as unknown;
  if (!(buffer instanceof FlatBuffer) && !(buffer instanceof DeviceBuffer))
    throw new InvalidArgumentError(`${what}.buffer must be a FlatBuffer or a DeviceBuffer, got ${describeValue(buffer)}`);
  return buffer.handle;
}

const offsetOf = (view: TensorView): number => view.offset ?? 0;

/** y[r, j] += bias[j] for `rows` rows of `cols` values. @category Models */
export function biasAdd(y: TensorView, bias: TensorView, rows: number, cols: number): void {
  const [hy, hb] = [handleOf(y, 'biasAdd: y'), handleOf(bias, 'biasAdd: bias')];
  callNative(() => nativeAddon().nnBiasAdd(hy, offsetOf(y), hb, offsetOf(bias), rows, cols));
}

/** db[j] = sum over the rows of dy[r, j] (added to db when `accumulate`). @category Models */
export function biasGrad(db: TensorView, dy: TensorView, rows: number, cols: number, accumulate = false): void {
  const [hd, hy] = [handleOf(db, 'biasGrad: db'), handleOf(dy, 'biasGrad: dy')];
  callNative(() => nativeAddon().nnBiasGrad(hd, offsetOf(db), hy, offsetOf(dy), rows, cols, accumulate === true));
}

/** y = max(0, x) over `count` values (NaN becomes 0); y may be x. @category Models */
export function relu(y: TensorView, x: TensorView, count: number): void {
  const [hy, hx] = [handleOf(y, 'relu: y'), handleOf(x, 'relu: x')];
  callNative(() => nativeAddon().nnRelu(hy, offsetOf(y), hx, offsetOf(x), count));
}

/** dx = dy where the forward output y > 0, else 0; dx may be dy. @category Models */
export function reluGrad(dx: TensorView, y: TensorView, dy: TensorView, count: number): void {
  const [hdx, hy, hdy] = [handleOf(dx, 'reluGrad: dx'), handleOf(y, 'reluGrad: y'), handleOf(dy, 'reluGrad: dy')];
  callNative(() => nativeAddon().nnReluBackward(hdx, offsetOf(dx), hy, offsetOf(y), hdy, offsetOf(dy), count));
}

/** @category Models */
export interface SoftmaxXentOutputs {
  /** Per-row loss logsumexp(z) - z[label] (rows values). */
  losses: TensorView;
  /** (softmax(z) - onehot(label)) * gradScale per logit (rows x classes); may be the logits. */
  dlogits?: TensorView;
  /** 1 where the row's first largest logit is at its label, else 0 (rows values). */
  correct?: TensorView;
}

/**
 * Softmax cross-entropy of `rows` rows of `classes` logits against labels held as floats (class
 * numbers); a label that is not a class number gives a NaN loss and a zero gradient row.
 * `gradScale` is 1 / rows for the gradient of the mean loss. @category Models
 */
export function softmaxXent(logits: TensorView, labels: TensorView, rows: number, classes: number, gradScale: number, out: SoftmaxXentOutputs): void {
  if (out === null || typeof out !== 'object') throw new InvalidArgumentError('softmaxXent: out must be { losses, dlogits?, correct? }');
  const hl = handleOf(logits, 'softmaxXent: logits');
  const hlab = handleOf(labels, 'softmaxXent: labels');
  const hloss = handleOf(out.losses, 'softmaxXent: out.losses');
  const hd = out.dlogits === undefined ? null : handleOf(out.dlogits, 'softmaxXent: out.dlogits');
  const hc = out.correct === undefined ? null : handleOf(out.correct, 'softmaxXent: out.correct');
  callNative(() =>
    nativeAddon().nnSoftmaxXent(
      hl,
      offsetOf(logits),
      hlab,
      offsetOf(labels),
      rows,
      classes,
      gradScale,
      hloss,
      offsetOf(out.losses),
      hd,
      out.dlogits === undefined ? 0 : offsetOf(out.dlogits),
      hc,
      out.correct === undefined ? 0 : offsetOf(out.correct),
    ),
  );
}

/**
 * What a model needs of the memory it runs in beyond the operations: tensors, and data moved in
 * and out. {@link modelDevice} returns the one for `cpu` or `cuda:N`.
 *
 * @category Models
 */
export interface ModelDevice {
  readonly device: Device;
  /** A zero-filled tensor of `length` floats. */
  allocate(length: number): Tensor;
  /** tensor[offset, offset + values.length) = values. */
  write(tensor: Tensor, values: Float32Array, offset?: number): void;
  /** The values tensor[offset, offset + count), copied to the host (waits for the device's pending work). */
  read(tensor: Tensor, count: number, offset?: number): Float32Array;
  /** Whether `tensor` lives in this memory. */
  holds(tensor: unknown): tensor is Tensor;
}

const hostDevice: ModelDevice = {
  device: 'cpu',
  allocate: (length) => FlatBuffer.allocate(length),
  write: (tensor, values, offset = 0) => (tensor as FlatBuffer).array.set(values, offset),
  read: (tensor, count, offset = 0) => (tensor as FlatBuffer).array.slice(offset, offset + count),
  holds: (tensor): tensor is Tensor => tensor instanceof FlatBuffer,
};

function cudaModelDevice(device: CudaDevice, index: number): ModelDevice {
  return {
    device,
    allocate: (length) => DeviceBuffer.allocate(length, { device }),
    write: (tensor, values, offset = 0) => (tensor as DeviceBuffer).copyFromHost(values, offset),
    read: (tensor, count, offset = 0) => (tensor as DeviceBuffer).copyToHost(new Float32Array(count), offset),
    holds: (tensor): tensor is Tensor => tensor instanceof DeviceBuffer && tensor.deviceIndex === index,
  };
}

/** The {@link ModelDevice} of `cpu` or `cuda:N` (`cuda` is `cuda:0`). @category Models */
export function modelDevice(device: Device | string = 'cpu'): ModelDevice {
  if (typeof device !== 'string') throw new InvalidArgumentError(`device must be "cpu" or "cuda:N", got ${describeValue(device)}`);
  const parsed = parseDevice(device);
  if (parsed.kind === 'cpu') return hostDevice;
  return cudaModelDevice(`cuda:${parsed.index}`, parsed.index);
}
