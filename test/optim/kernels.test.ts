/**
 * Every fused kernel variant against the plain TypeScript reference (test/reference), over many
 * steps of random data, at sizes that exercise vector tails and the split across threads.
 * The tolerance is stated in run-variant.ts.
 */
import t from 'tap';

import { KERNEL_VARIANTS } from '../../dist/apps/bench/kernel-variants.js';
import { runVariant } from './run-variant.js';

const SIZES: [number, number][] = [
  [1, 100],
  [7, 100],
  [33, 100],
  [1023, 100],
  [4099, 100],
  [(1 << 20) + 3, 3], // split across threads, with a tail
];

for (const variant of KERNEL_VARIANTS) {
  t.test(variant.name, async (t) => {
    for (const [size, steps] of SIZES) {
      const run = runVariant(variant.config, size, steps, size * 31 + variant.name.length);
      t.ok(run.worst <= 1, `size ${size}, ${steps} steps: worst error ratio ${run.worst.toFixed(3)} ${run.worst > 1 ? run.where : ''}`);
    }
  });
}

// Above 4M elements the predicted weights are written with streaming stores: check that path too.
for (const name of ['sgd+linear', 'sgd-momentum+wp-local', 'adamw+wp-local-prev-sync', 'adam+dc+wp-local-dc']) {
  t.test(`${name}, streamed prediction output`, async (t) => {
    const variant = KERNEL_VARIANTS.find((v) => v.name === name)!;
    const run = runVariant(variant.config, (1 << 22) + 5, 2, 5);
    t.ok(run.worst <= 1, `worst error ratio ${run.worst.toFixed(3)} ${run.worst > 1 ? run.where : ''}`);
  });
}
