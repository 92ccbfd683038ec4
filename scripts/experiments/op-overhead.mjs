// The host's cost of one model operation call, per layer of the path, on `cpu` and `cuda:N`:
// the addon's entry called directly, the TypeScript op above it, and a tiny SGEMM both ways; each
// timed over `--calls` calls (after 2 000 warm-up calls), as the time to issue them and the time
// until the device has run them too. It says where a device training step's host time goes
// (bench/RESULTS.md, "GPU training": the step is bound by issuing operations).
//   node scripts/experiments/op-overhead.mjs [--device cuda:0] [--calls 20000]
import { parseArgs } from 'node:util';

import { biasAdd, modelDevice, relu, sgemm } from '../../dist/index.js';
import { nativeAddon } from '../../dist/kernels.js';

const { values: a } = parseArgs({ options: { device: { type: 'string', default: 'cpu' }, calls: { type: 'string', default: '20000' } } });
const calls = Number(a.calls);
const memory = modelDevice(a.device);
const [x, y, z] = [memory.allocate(256), memory.allocate(256), memory.allocate(256)];
const addon = nativeAddon();
const wait = () => memory.read(x, 1);
const rows = [];
const time = (name, fn) => {
  for (let i = 0; i < 2000; i++) fn();
  wait();
  const start = performance.now();
  for (let i = 0; i < calls; i++) fn();
  const issued = performance.now();
  wait();
  const done = performance.now();
  rows.push({ name, issueUs: (((issued - start) * 1000) / calls).toFixed(2), untilRunUs: (((done - start) * 1000) / calls).toFixed(2) });
};
time('addon.nnRelu (16 floats)', () => addon.nnRelu(y.handle, 0, x.handle, 0, 16));
time('ops.relu (16 floats)', () => relu({ buffer: y }, { buffer: x }, 16));
time('ops.biasAdd (4 x 4)', () => biasAdd({ buffer: y }, { buffer: x }, 4, 4));
time('addon.sgemm (16 x 16 x 16)', () =>
  addon.sgemm({ transA: false, transB: false, m: 16, n: 16, k: 16, alpha: 1, beta: 0, a: x.handle, aOffset: 0, b: y.handle, bOffset: 0, c: z.handle, cOffset: 0 }),
);
time('nn sgemm (16 x 16 x 16)', () => sgemm({ m: 16, n: 16, k: 16, a: x, b: y, c: z }));
console.log(`${a.device}, ${calls} calls each (microseconds per call: to issue, and until the device has run them)`);
console.table(rows);
