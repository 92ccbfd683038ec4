/**
 * The demo's models: the MLP on the MNIST digits (default), or sapipe's small CNN (cnnLayers) on
 * Fashion-MNIST. A worker trains either through the same four calls, forward, loss, backward and
 * accuracy: the MLP has them, and the CNN (a `Sequential`, whose loss the caller owns) gets them
 * from SequentialClassifier.
 */
import { cnnLayers, FlatBuffer, layerParams, MLP, type ParamSet, Sequential, softmaxCrossEntropy } from 'sapipe';

/** The models `sapipe demo --model` takes. */
export const DEMO_MODELS = ['mlp', 'cnn'] as const;
export type DemoModelName = (typeof DEMO_MODELS)[number];

/** The MLP: MNIST's 784 pixels, one hidden layer of 128, 10 classes. */
export const DEMO_LAYERS: readonly number[] = [784, 128, 10];
/** The CNN's convolution channels: conv(1->8) ReLU max-pool, conv(8->16) ReLU max-pool, linear to 10. */
const CNN_CHANNELS = [8, 16];
const cnn = (): ReturnType<typeof cnnLayers> => cnnLayers({ channels: 1, height: 28, width: 28 }, CNN_CHANNELS, 10);

/** What a demo worker trains. */
export interface DemoModel {
  readonly params: ParamSet;
  /** Forward of `batch` samples of `x` on `weights` (a buffer of the ParamSet's layout). */
  forward(x: FlatBuffer, batch: number, weights: FlatBuffer): void;
  /** The mean softmax cross-entropy of the last forward against `labels`; keeps its gradient. */
  loss(labels: ArrayLike<number>): number;
  /** The parameter gradients of the last forward and loss, into `grads`. */
  backward(grads: FlatBuffer): void;
  /** Test accuracy on the model's own weights. */
  accuracy(inputs: Float32Array, labels: ArrayLike<number>): number;
  dispose(): void;
}

/** The model `name`, initialised from `seed` (the same on every rank). */
export function createDemoModel(name: DemoModelName, seed: number): DemoModel {
  return name === 'mlp' ? new MLP(DEMO_LAYERS, { seed }) : new SequentialClassifier(new Sequential(cnn(), { seed }));
}

/** The model and its data in words, for tables and reports. */
export function describeDemoModel(name: DemoModelName): string {
  return name === 'mlp' ? `MLP ${DEMO_LAYERS.join('-')} on MNIST` : `CNN (conv ${CNN_CHANNELS.join(',')}, 3x3, max-pool 2; linear to 10) on Fashion-MNIST`;
}

/** Parameters (weights and biases) of the model `name`. */
export function demoModelParams(name: DemoModelName): number {
  return name === 'mlp' ? DEMO_LAYERS.slice(1).reduce((a, out, i) => a + (DEMO_LAYERS[i]! + 1) * out, 0) : layerParams(cnn()).reduce((a, b) => a + b, 0);
}

/** A classifier's forward, loss, backward and accuracy over a Sequential (slot 0, one batch at a time). */
class SequentialClassifier implements DemoModel {
  private logits: FlatBuffer | undefined;
  private batch = 0;
  private dlogits: FlatBuffer | undefined;

  constructor(private readonly model: Sequential) {}

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
    return softmaxCrossEntropy(this.logits!.array.subarray(0, n), labels, this.batch, this.model.outputSize, this.dlogits.array.subarray(0, n));
  }

  backward(grads: FlatBuffer): void {
    this.model.backward(0, this.dlogits!, { grads, inputGrad: false });
  }

  accuracy(inputs: Float32Array, labels: ArrayLike<number>): number {
    const features = this.model.inputSize;
    const classes = this.model.outputSize;
    const chunk = 500;
    const x = FlatBuffer.allocate(chunk * features);
    let correct = 0;
    try {
      for (let start = 0; start < labels.length; start += chunk) {
        const n = Math.min(chunk, labels.length - start);
        x.array.set(inputs.subarray(start * features, (start + n) * features));
        this.model.release(1);
        const logits = this.model.forward(1, x, n, this.model.params.weights).array;
        for (let r = 0; r < n; r++) {
          let best = 0;
          for (let c = 1; c < classes; c++) if (logits[r * classes + c]! > logits[r * classes + best]!) best = c;
          if (best === labels[start + r]) correct++;
        }
      }
    } finally {
      this.model.release(1);
      x.dispose();
    }
    return correct / labels.length;
  }

  dispose(): void {
    this.dlogits?.dispose();
    this.model.dispose();
  }
}
