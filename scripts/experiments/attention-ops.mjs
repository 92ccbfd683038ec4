#!/usr/bin/env node
/**
 * Times the GPT's costliest element and attention operations on the CPU, as `bench models`'s GPT
 * step runs them: causal attention forward and backward at batch x seq x heads x headDim, and
 * GELU forward and backward over batch x seq x 4 width values. Prints the median of --reps calls
 * (after one warm-up call) at the active instruction set (SAPIPE_SIMD lowers it).
 *
 *   node scripts/experiments/attention-ops.mjs [--batch 16] [--seq 128] [--heads 4] [--head-dim 32] [--reps 20]
 */
import { parseArgs } from 'node:util';
import { FlatBuffer, attention, attentionGrad, gelu, geluGrad } from '../../dist/index.js';
import { backendStatuses } from '../../dist/backends/index.js';

const { values } = parseArgs({
  options: {
    batch: { type: 'string', default: '16' },
    seq: { type: 'string', default: '128' },
    heads: { type: 'string', default: '4' },
    'head-dim': { type: 'string', default: '32' },
    reps: { type: 'string', default: '20' },
  },
});
const [batch, seq, heads, headDim, reps] = [values.batch, values.seq, values.heads, values['head-dim'], values.reps].map(Number);
const n = batch * seq * heads * headDim;
const view = (length, seed) => {
  const buffer = FlatBuffer.allocate(length);
  const a = buffer.array;
  for (let i = 0; i < length; i++) a[i] = 0.5 * Math.sin(0.37 * i + seed);
  return { buffer };
};
const [q, k, v, dout, o, dq, dk, dv] = [1, 2, 3, 4, 5, 6, 7, 8].map((s) => view(n, s));
const lse = view(batch * heads * seq, 9);
const shape = { batch, seq, heads, headDim };
const hidden = batch * seq * 4 * heads * headDim;
const [gx, gy, gdx] = [11, 12, 13].map((s) => view(hidden, s));

const median = (f) => {
  f();
  const times = [];
  for (let r = 0; r < reps; r++) {
    const t0 = performance.now();
    f();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return `${times[Math.floor(reps / 2)].toFixed(2)} ms (${times[0].toFixed(2)}-${times[reps - 1].toFixed(2)})`;
};
const cpu = backendStatuses().find((b) => b.name === 'cpu');
console.log(`simd ${cpu?.details?.simd}, ${cpu?.details?.threads} threads; median of ${reps} calls (min-max)`);
console.log(`attention ${batch} x ${seq} x ${heads} x ${headDim}: forward ${median(() => attention({ o, lse }, q, k, v, shape))}, backward ${median(() => attentionGrad({ dq, dk, dv }, dout, q, k, v, { o, lse }, shape))}`);
console.log(`gelu over ${hidden} values: forward ${median(() => gelu(gy, gx, hidden))}, backward ${median(() => geluGrad(gdx, gx, gy, hidden))}`);
