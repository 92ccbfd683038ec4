/**
 * The demo's models: the MLP on the MNIST digits (default), sapipe's small CNN (cnnLayers) on
 * Fashion-MNIST, or a small byte-level GPT (gptLayers) on the fortunes text. A worker trains any
 * of them through the same calls, forward, loss, backward and accuracy: the MLP has them, and the
 * CNN and the GPT (`Sequential`s, whose loss the caller owns) get them from SequentialClassifier,
 * whose cross-entropy runs over every row of classes (the GPT: each position's next byte).
 */
import { cnnLayers, type CudaDevice, DeviceBuffer, FlatBuffer, type GradientListener, layerParams, MLP, modelDevice, type ModelDevice, type ParamSet, Sequential, softmaxCrossEntropy, softmaxXent } from 'sapipe';
import { describeGpt, type GptSize, gptSizeLayers } from './gpt-size.js';

/** The models `sapipe demo --model` takes. */
export const DEMO_MODELS = ['mlp', 'cnn', 'gpt'] as const;
export type DemoModelName = (typeof DEMO_MODELS)[number];

/** The MLP: MNIST's 784 pixels, one hidden layer of 128, 10 classes. */
export const DEMO_LAYERS: readonly number[] = [784, 128, 10];
/** The CNN's convolution channels: conv(1->8) ReLU max-pool, conv(8->16) ReLU max-pool, linear to 10. */
const CNN_CHANNELS = [8, 16];
const cnn = (): ReturnType<typeof cnnLayers> => cnnLayers({ channels: 1, height: 28, width: 28 }, CNN_CHANNELS, 10);
/**
 * The GPT's default size: 2 blocks of width 64, 4 heads, over 64 bytes of context (small enough
 * for 4 workers on 2 cores); `--blocks`, `--dim`, `--heads` and `--context` change it.
 */
export const DEMO_GPT_DEFAULTS: Readonly<GptSize> = { blocks: 2, dim: 64, heads: 4, context: 64 };

/** What a demo worker trains. */
export interface DemoModel {
  readonly params: ParamSet;
  /** Forward of `batch` samples of `x` on `weights` (a buffer of the ParamSet's layout). */
  forward(x: FlatBuffer, batch: number, weights: FlatBuffer): void;
  /** The mean softmax cross-entropy of the last forward against `labels`; keeps its gradient. */
  loss(labels: ArrayLike<number>): number;
  /** The parameter gradients of the last forward and loss, into `grads`. */
  backward(grads: FlatBuffer): void;
  /** Test accuracy on the model's own weights (per row of classes: the GPT's next bytes). */
  accuracy(inputs: Float32Array, labels: ArrayLike<number>): number;
  /** Accuracy and the mean cross-entropy on test data with the model's own weights, in one pass (absent: the model gives accuracy alone). */
  evaluate?(inputs: Float32Array, labels: ArrayLike<number>): { accuracy: number; loss: number };
  dispose(): void;
}

/** The model `name` (the GPT of size `gpt`), initialised from `seed` (the same on every rank). */
export function createDemoModel(name: DemoModelName, seed: number, gpt: GptSize = DEMO_GPT_DEFAULTS): DemoModel {
  if (name === 'mlp') return new MLP(DEMO_LAYERS, { seed });
  return new SequentialClassifier(new Sequential(name === 'cnn' ? cnn() : gptSizeLayers(gpt), { seed }), name === 'gpt' ? gpt.context : 1);
}

/**
 * What a demo worker trains on a GPU: the model's weights and gradients are the trainer's device
 * buffers (a DeviceParamSet's), each batch is copied in from the host, and the loss stays on the
 * device (reading it would wait for the device every step).
 */
export interface DeviceDemoModel {
  /** The host copy: the layout and the initial weights the trainer puts on the device. */
  readonly params: ParamSet;
  readonly numParams: number;
  readonly device: CudaDevice;
  /** Reports each layer's gradients as the backward enqueues them (the trainer reduces each bucket behind the backward). */
  setGradientListener(listener: GradientListener | undefined): void;
  /** Forward of `batch` samples of `x` on `weights`, softmax cross-entropy against `labels`, and the parameter gradients into `grads`. */
  computeGradient(x: Float32Array, batch: number, labels: ArrayLike<number>, weights: DeviceBuffer, grads: DeviceBuffer): void;
  /** Accuracy (per row of classes) on test data with `weights`, and the mean cross-entropy where the host model gives it too. */
  evaluate(inputs: Float32Array, labels: ArrayLike<number>, weights: DeviceBuffer): { accuracy: number; loss: number | undefined };
  dispose(): void;
}

/** The model `name` on `device`, initialised from `seed` as createDemoModel initialises it on the host. */
export function createDeviceDemoModel(name: DemoModelName, seed: number, device: CudaDevice, gpt: GptSize = DEMO_GPT_DEFAULTS): DeviceDemoModel {
  if (name !== 'mlp') return new DeviceSequentialClassifier(new Sequential<DeviceBuffer>(name === 'cnn' ? cnn() : gptSizeLayers(gpt), { seed, device }), name === 'gpt' ? gpt.context : 1, device);
  const mlp = new MLP(DEMO_LAYERS, { seed, device });
  return {
    params: mlp.params,
    numParams: mlp.numParams,
    device,
    setGradientListener: (listener) => mlp.setGradientListener(listener),
    computeGradient(x, batch, labels, weights, grads) {
      mlp.forwardLogits(x, batch, weights);
      mlp.loss(labels, { read: false });
      mlp.backward(grads);
    },
    // As on the host, the MLP gives accuracy alone.
    evaluate: (inputs, labels, weights) => ({ accuracy: mlp.accuracy(inputs, labels, weights), loss: undefined }),
    dispose: () => mlp.dispose(),
  };
}

/** The model (the GPT of size `gpt`) and its data in words, for tables and reports. */
export function describeDemoModel(name: DemoModelName, gpt: GptSize = DEMO_GPT_DEFAULTS): string {
  if (name === 'gpt') return describeGpt(gpt);
  return name === 'mlp' ? `MLP ${DEMO_LAYERS.join('-')} on ${DEMO_DATASETS.mlp}` : `CNN (conv ${CNN_CHANNELS.join(',')}, 3x3, max-pool 2; linear to 10) on ${DEMO_DATASETS.cnn}`;
}

/** The data set each model trains on, in words (titles). */
export const DEMO_DATASETS: Readonly<Record<DemoModelName, string>> = { mlp: 'MNIST', cnn: 'Fashion-MNIST', gpt: 'the fortunes text' };

/** Parameters (weights and biases) of the model `name` (the GPT of size `gpt`). */
export function demoModelParams(name: DemoModelName, gpt: GptSize = DEMO_GPT_DEFAULTS): number {
  return name === 'mlp' ? DEMO_LAYERS.slice(1).reduce((a, out, i) => a + (DEMO_LAYERS[i]! + 1) * out, 0) : layerParams(name === 'cnn' ? cnn() : gptSizeLayers(gpt)).reduce((a, b) => a + b, 0);
}

/**
 * A classifier's forward, loss, backward and accuracy over a Sequential (slot 0, one batch at a
 * time), its output `rows` rows of classes per sample (the GPT: one per position).
 */
class SequentialClassifier implements DemoModel {
  private logits: FlatBuffer | undefined;
  private batch = 0;
  private dlogits: FlatBuffer | undefined;
  private readonly classes: number;

  constructor(
    private readonly model: Sequential,
    private readonly rows: number,
  ) {
    this.classes = model.outputSize / rows;
  }

  get params(): ParamSet {
    return this.model.params;
  }

  forward(x: FlatBuffer, batch: number, weights: FlatBuffer): void {
    this.model.release(0);
    this.logits = this.model.forward(0, x, batch, weights);
    this.batch = batch;
  }

  loss(labels: ArrayLike<number>): number {
    const n = this.batch * this.model.outputSize;
    if (!this.dlogits || this.dlogits.length < n) {
      this.dlogits?.dispose();
      this.dlogits = FlatBuffer.allocate(n);
    }
    return softmaxCrossEntropy(this.logits!.array.subarray(0, n), labels, this.batch * this.rows, this.classes, this.dlogits.array.subarray(0, n));
  }

  backward(grads: FlatBuffer): void {
    this.model.backward(0, this.dlogits!, { grads, inputGrad: false });
  }

  accuracy(inputs: Float32Array, labels: ArrayLike<number>): number {
    return this.evaluate(inputs, labels).accuracy;
  }

  /** Accuracy and mean cross-entropy over every row of the test data, in chunks of samples. */
  evaluate(inputs: Float32Array, labels: ArrayLike<number>): { accuracy: number; loss: number } {
    const { inputSize: features, outputSize } = this.model;
    const [rows, classes] = [this.rows, this.classes];
    const samples = inputs.length / features;
    const chunk = Math.max(1, Math.floor(2 ** 20 / outputSize));
    const x = FlatBuffer.allocate(chunk * features);
    let correct = 0;
    let total = 0;
    try {
      for (let start = 0; start < samples; start += chunk) {
        const n = Math.min(chunk, samples - start);
        x.array.set(inputs.subarray(start * features, (start + n) * features));
        this.model.release(1);
        const logits = this.model.forward(1, x, n, this.model.params.weights).array.subarray(0, n * outputSize);
        const rowLabels = Array.prototype.slice.call(labels, start * rows, (start + n) * rows) as number[];
        total += n * rows * softmaxCrossEntropy(logits, rowLabels, n * rows, classes);
        for (let r = 0; r < n * rows; r++) {
          let best = 0;
          for (let c = 1; c < classes; c++) if (logits[r * classes + c]! > logits[r * classes + best]!) best = c;
          if (best === rowLabels[r]) correct++;
        }
      }
    } finally {
      this.model.release(1);
      x.dispose();
    }
    return { accuracy: correct / labels.length, loss: total / labels.length };
  }

  dispose(): void {
    this.dlogits?.dispose();
    this.model.dispose();
  }
}

/**
 * SequentialClassifier on a device: the same forward, cross-entropy over every row of classes,
 * backward and evaluation in chunks, with the loss computed by the model-operation table's
 * softmaxXent on the device instead of on the host.
 */
class DeviceSequentialClassifier implements DeviceDemoModel {
  private readonly memory: ModelDevice;
  private readonly classes: number;
  /** Grown to the largest batch seen: the input, its labels (as floats), per-row losses and hits, dLogits. */
  private buffers: { samples: number; input: DeviceBuffer; labels: DeviceBuffer; losses: DeviceBuffer; correct: DeviceBuffer; dlogits: DeviceBuffer } | undefined;

  constructor(
    private readonly model: Sequential<DeviceBuffer>,
    private readonly rows: number,
    readonly device: CudaDevice,
  ) {
    this.memory = modelDevice(device);
    this.classes = model.outputSize / rows;
  }

  get params(): ParamSet {
    return this.model.params;
  }
  get numParams(): number {
    return this.model.params.numParams;
  }

  setGradientListener(listener: GradientListener | undefined): void {
    this.model.setGradientListener(listener);
  }

  computeGradient(x: Float32Array, batch: number, labels: ArrayLike<number>, weights: DeviceBuffer, grads: DeviceBuffer): void {
    const b = this.reserve(batch);
    this.model.release(0);
    const logits = this.forward(0, x, batch, weights, labels);
    const rows = batch * this.rows;
    softmaxXent({ buffer: logits }, { buffer: b.labels }, rows, this.classes, 1 / rows, { losses: { buffer: b.losses }, dlogits: { buffer: b.dlogits } });
    this.model.backward(0, b.dlogits, { grads, inputGrad: false });
  }

  evaluate(inputs: Float32Array, labels: ArrayLike<number>, weights: DeviceBuffer): { accuracy: number; loss: number } {
    const { inputSize: features, outputSize } = this.model;
    const samples = inputs.length / features;
    // The host classifier's chunks: about 2^20 logits at a time.
    const chunk = Math.max(1, Math.floor(2 ** 20 / outputSize));
    let correct = 0;
    let total = 0;
    try {
      for (let start = 0; start < samples; start += chunk) {
        const n = Math.min(chunk, samples - start);
        const b = this.reserve(n);
        this.model.release(1);
        const rowLabels = Array.prototype.slice.call(labels, start * this.rows, (start + n) * this.rows) as number[];
        const logits = this.forward(1, inputs.subarray(start * features, (start + n) * features), n, weights, rowLabels);
        const rows = n * this.rows;
        softmaxXent({ buffer: logits }, { buffer: b.labels }, rows, this.classes, 1 / rows, { losses: { buffer: b.losses }, correct: { buffer: b.correct } });
        for (const v of this.memory.read(b.losses, rows)) total += v;
        for (const v of this.memory.read(b.correct, rows)) correct += v;
      }
    } finally {
      this.model.release(1);
    }
    return { accuracy: correct / labels.length, loss: total / labels.length };
  }

  dispose(): void {
    this.freeBuffers();
    this.model.dispose();
  }

  /** Copies `batch` samples of `x` and their labels in and runs slot `slot`'s forward on `weights`. */
  private forward(slot: number, x: Float32Array, batch: number, weights: DeviceBuffer, labels: ArrayLike<number>): DeviceBuffer {
    const b = this.buffers!;
    this.memory.write(b.input, x.subarray(0, batch * this.model.inputSize));
    this.memory.write(b.labels, Float32Array.from({ length: batch * this.rows }, (_, i) => labels[i]!));
    return this.model.forward(slot, b.input, batch, weights);
  }

  private reserve(samples: number): NonNullable<DeviceSequentialClassifier['buffers']> {
    if (this.buffers && this.buffers.samples >= samples) return this.buffers;
    this.freeBuffers();
    const rows = samples * this.rows;
    const allocate = (length: number): DeviceBuffer => this.memory.allocate(length) as DeviceBuffer;
    this.buffers = {
      samples,
      input: allocate(samples * this.model.inputSize),
      labels: allocate(rows),
      losses: allocate(rows),
      correct: allocate(rows),
      dlogits: allocate(samples * this.model.outputSize),
    };
    return this.buffers;
  }

  private freeBuffers(): void {
    if (!this.buffers) return;
    for (const buffer of [this.buffers.input, this.buffers.labels, this.buffers.losses, this.buffers.correct, this.buffers.dlogits]) buffer.dispose();
    this.buffers = undefined;
  }
}
