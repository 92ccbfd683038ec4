/**
 * A fully connected layer on ParamSet tensors: weight [out, in] and bias [out], read from any flat
 * buffer with the ParamSet's layout (the real weights, or an optimizer's predicted weights), in
 * host memory (FlatBuffer) or on a device (DeviceBuffer, e.g. a DeviceParamSet's): every step is
 * an operation of the model-operation table (ops.ts), which runs where its operands live.
 * All three matrix products go through the native SGEMM (cuBLAS on a device):
 *   forward   Y  = X W^T + b     (batch x out)
 *   backward  dW = dY^T X        (out x in)
 *             dX = dY W          (batch x in)
 *             db = column sums of dY
 */
import { DeviceBuffer } from '../device/index.js';
import { InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { FlatBuffer, ParamSet, type TensorLayout } from '../tensor.js';
import { describeValue } from '../validate.js';
import { sgemm } from './gemm.js';
import { biasAdd, biasGrad, type Tensor, type TensorView } from './ops.js';

/** A matrix stored row-major from `offset` in `buffer` (host or device memory). @category Models */
export type MatrixRef = TensorView;

/**
 * A fully connected layer over two tensors of a ParamSet (weight [out, in], bias [out]),
 * with forward and backward through the native SGEMM, reading any weights buffer of the
 * ParamSet's layout (the real weights or an optimizer's predicted ones).
 *
 * @category Models
 */
export class Linear {
  readonly inFeatures: number;
  readonly outFeatures: number;
  readonly weight: TensorLayout;
  readonly bias: TensorLayout;

  constructor(
    readonly params: ParamSet,
    weightName: string,
    biasName: string,
  ) {
    if (!(params instanceof ParamSet))
      throw new InvalidArgumentError(`Linear(params, weightName, biasName): params must be a ParamSet, got ${describeValue(params)}`);
    this.weight = params.layout(weightName);
    this.bias = params.layout(biasName);
    if (this.weight.shape.length !== 2 || this.bias.shape.length !== 1 || this.bias.shape[0] !== this.weight.shape[0])
      throw new SizeMismatchError(
        `Linear: "${weightName}" must be [out, in] and "${biasName}" [out], got ${JSON.stringify(this.weight.shape)} and ${JSON.stringify(this.bias.shape)}`,
      );
    this.outFeatures = this.weight.shape[0]!;
    this.inFeatures = this.weight.shape[1]!;
    if (this.outFeatures === 0 || this.inFeatures === 0) throw new InvalidArgumentError('Linear: in and out features must be at least 1');
  }

  /** Y[batch, out] = X[batch, in] W^T + b, with W and b read from `weights`. */
  forward(x: MatrixRef, batch: number, y: MatrixRef, weights: Tensor = this.params.weights): void {
    this.checkWeights(weights, 'forward');
    denseForward(y, x, { buffer: weights, offset: this.weight.offset }, { buffer: weights, offset: this.bias.offset }, batch, this.inFeatures, this.outFeatures);
  }

  /**
   * Gradients of this layer from dY[batch, out]: dW and db are written into `grads` at the
   * ParamSet's offsets (added to what is there when `accumulate`, as gradient accumulation over
   * micro-batches needs, in the same SGEMM pass); dX[batch, in] into `dx` unless it is undefined
   * (first layer). `weights` must be the buffer the forward pass read.
   */
  backward(
    x: MatrixRef,
    dy: MatrixRef,
    batch: number,
    dx: MatrixRef | undefined,
    grads: Tensor,
    weights: Tensor = this.params.weights,
    accumulate = false,
  ): void {
    this.checkWeights(weights, 'backward');
    this.checkWeights(grads, 'backward (grads)');
    this.weightGrad(x, dy, batch, grads, accumulate);
    if (dx) this.inputGrad(dy, batch, dx, weights);
  }

  /** dW = dY^T X and db = column sums of dY, written (or added, when `accumulate`) into `grads`. */
  weightGrad(x: MatrixRef, dy: MatrixRef, batch: number, grads: Tensor, accumulate = false): void {
    this.checkWeights(grads, 'weightGrad (grads)');
    denseWeightGrad({ buffer: grads, offset: this.weight.offset }, { buffer: grads, offset: this.bias.offset }, x, dy, batch, this.inFeatures, this.outFeatures, accumulate);
  }

  /** dX[batch, in] = dY W, with W read from `weights` (the buffer the forward pass read). */
  inputGrad(dy: MatrixRef, batch: number, dx: MatrixRef, weights: Tensor = this.params.weights): void {
    this.checkWeights(weights, 'inputGrad');
    denseInputGrad(dx, dy, { buffer: weights, offset: this.weight.offset }, batch, this.inFeatures, this.outFeatures);
  }

  private checkWeights(buffer: Tensor, what: string): void {
    if (!(buffer instanceof FlatBuffer) && !(buffer instanceof DeviceBuffer))
      throw new InvalidArgumentError(`Linear.${what}: expected a FlatBuffer or DeviceBuffer with the ParamSet's layout`);
    // A DeviceParamSet's buffers may be padded past the ParamSet (for sharding): at least its length.
    if (buffer instanceof FlatBuffer ? buffer.length !== this.params.length : buffer.length < this.params.length)
      throw new SizeMismatchError(
        `Linear.${what}: the buffer has ${buffer.length} elements but the ParamSet ${this.params.length}; pass a buffer with the ParamSet's layout`,
      );
  }
}

/**
 * A dense layer's three products on views (a `Linear`'s parameters, or a transformer block's):
 * y[rows, out] = x[rows, in] W^T + b. @internal
 */
export function denseForward(y: TensorView, x: TensorView, w: TensorView, b: TensorView, rows: number, inF: number, outF: number): void {
  sgemm({ transB: true, m: rows, n: outF, k: inF, a: x.buffer, aOffset: x.offset ?? 0, b: w.buffer, bOffset: w.offset ?? 0, c: y.buffer, cOffset: y.offset ?? 0 });
  biasAdd(y, b, rows, outF);
}

/** dW = dY^T X and db = column sums of dY, added to dW and db when `accumulate`. @internal */
export function denseWeightGrad(dw: TensorView, db: TensorView, x: TensorView, dy: TensorView, rows: number, inF: number, outF: number, accumulate: boolean): void {
  sgemm({ transA: true, m: outF, n: inF, k: rows, a: dy.buffer, aOffset: dy.offset ?? 0, b: x.buffer, bOffset: x.offset ?? 0, c: dw.buffer, cOffset: dw.offset ?? 0, beta: accumulate ? 1 : 0 });
  biasGrad(db, dy, rows, outF, accumulate);
}

/** dX = dY W (added to dX when `accumulate`). @internal */
export function denseInputGrad(dx: TensorView, dy: TensorView, w: TensorView, rows: number, inF: number, outF: number, accumulate = false): void {
  sgemm({ m: rows, n: inF, k: outF, a: dy.buffer, aOffset: dy.offset ?? 0, b: w.buffer, bOffset: w.offset ?? 0, c: dx.buffer, cOffset: dx.offset ?? 0, beta: accumulate ? 1 : 0 });
}
