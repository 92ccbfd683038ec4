/**
 * The CUDA kernels' element maths runs on the CPU: the C++ harness sapipe_cuda_math_check
 * (native/tests/cuda_math_check.cpp) compiles native/cuda/update_element.cuh and the element
 * functions it calls for the host and checks every kernel variant against the scalar reference
 * over several steps, and the model operations' element maths (native/cuda/nn_element.cuh)
 * against the CPU table, so that a mistake in the GPU maths fails here without a GPU.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

import { KERNEL_VARIANTS } from '../../dist/apps/bench/kernel-variants.js';

const binary = fileURLToPath(new URL('../../build/Release/sapipe_cuda_math_check', import.meta.url));

t.test('every variant of the CUDA element maths matches the scalar reference on the CPU', async (t) => {
  const { stdout } = await promisify(execFile)(binary, [], { maxBuffer: 1 << 24 });
  const summary = /sapipe_cuda_math_check: (\d+) passed, (\d+) failed/.exec(stdout);
  t.ok(summary, 'the harness ran to its summary');
  t.equal(Number(summary?.[2]), 0, `no failed check\n${stdout.split('\n').filter((l) => l.startsWith('not ok')).slice(0, 10).join('\n')}`);
  // 5 sizes x 4 steps x (1 applied + 6 outputs) per variant, then the model operations' element
  // maths: ReLU and its gradient, and the softmax cross-entropy at 1, 10 and 1003 classes (2 each);
  // the layers': GELU (2), layer norm (1), dropout (2), attention (1), max and average pooling
  // (1 each), the token check (1).
  const layers = 2 + 1 + 2 + 1 + 2 + 1;
  t.equal(Number(summary?.[1]), KERNEL_VARIANTS.length * 5 * 4 * 7 + 2 + 3 * 2 + layers, 'every variant, size, step and output checked, and every model operation');
});
