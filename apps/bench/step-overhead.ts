/**
 * `sapipe bench step-overhead`: the cost of the asynchronous step() (queue hand-off, Promise
 * settlement) over stepSync() for one optimizer on one ParamSet, interleaved so both see the same
 * machine state.
 */
import { Adam, ParamSet } from 'sapipe';
import { fillDistinct } from './kernels.js';
import { median } from './timing.js';
import { performance } from 'node:perf_hooks';

export interface StepOverheadResult {
  elements: number;
  syncMs: number;
  asyncMs: number;
  /** asyncMs / syncMs - 1. */
  overhead: number;
}

export async function benchStepOverhead(elements: number, reps: number, warmup: number): Promise<StepOverheadResult> {
  const params = new ParamSet({ w: [elements] });
  const optimizer = new Adam(params, { lr: 1e-3 });
  try {
    fillDistinct(params.weights.array, 1, -1, 1);
    fillDistinct(params.grads.array, 2, 1e-4, 1e-3);
    for (let i = 0; i < warmup; i++) {
      optimizer.stepSync();
      await optimizer.step();
    }
    const sync: number[] = [];
    const async: number[] = [];
    for (let i = 0; i < reps; i++) {
      let start = performance.now();
      optimizer.stepSync();
      sync.push(performance.now() - start);
      start = performance.now();
      await optimizer.step();
      async.push(performance.now() - start);
    }
    const syncMs = median(sync);
    const asyncMs = median(async);
    return { elements, syncMs, asyncMs, overhead: asyncMs / syncMs - 1 };
  } finally {
    optimizer.dispose();
    params.dispose();
  }
}
