/**
 * The worker-thread entry of {@link measurePassCores}: builds one model part, waits for `go`, runs
 * `passes` forward + backward passes of it and posts how long they took, so that several such
 * threads at once show how passes share the cores.
 */
import { parentPort, workerData } from 'node:worker_threads';

import { useKernelThreads } from '../../kernel-threads.js';
import { FlatBuffer } from '../../tensor.js';
import { Sequential, type LayerSpec } from '../../nn/sequential.js';

interface ContentionData {
  layers: LayerSpec[];
  range: [number, number];
  microBatchSize: number;
  passes: number;
  /** This thread's kernel threads, as a stage worker's. */
  kernelThreads: number | 'shared';
}

const { layers, range, microBatchSize, passes, kernelThreads } = workerData as ContentionData;
useKernelThreads(kernelThreads);
const model = new Sequential(layers, { seed: 0, range });
const input = FlatBuffer.allocate(microBatchSize * model.inputSize);
const gradOutput = FlatBuffer.allocate(microBatchSize * model.outputSize);
input.fill(0.5);
gradOutput.fill(0.01);
const pass = (slot: number): void => {
  model.forward(slot, input, microBatchSize, model.params.weights);
  const dx = model.backward(slot, gradOutput, { grads: model.params.grads, inputGrad: range[0] > 0 });
  if (dx) model.recycle(dx);
};
pass(0);
parentPort!.postMessage({ type: 'ready' });
parentPort!.on('message', () => {
  const start = performance.now();
  for (let i = 0; i < passes; i++) pass(i);
  const ms = performance.now() - start;
  input.dispose();
  gradOutput.dispose();
  model.dispose();
  parentPort!.postMessage({ type: 'done', ms });
});
