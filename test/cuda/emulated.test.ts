/**
 * The `GPU:` tests of test/cuda/device.test.ts, model-ops.test.ts, device-pipeline.test.ts,
 * device-trainer.test.ts, device-trainer-overlap.test.ts, gpt-device.test.ts and streams.test.ts again, where no GPU is
 * needed: on the CUDA plugin over host memory (native/tests/fakes/plugin_host_memory.cpp: host
 * memory as the device, an NCCL of
 * ranks over Unix sockets, the CPU kernels behind every entry, every stream done as soon as it is
 * enqueued on).
 * The device and NCCL bindings and everything above them run for real: the order of queued
 * operations, the staging of host buffers, the device guard's outcomes and the recheck, the
 * data-parallel trainer over nccl (its exported state and resumption included). What this cannot
 * check is the GPU's own arithmetic and concurrency, and NCCL's own transport: device.test.ts checks
 * those on a GPU, test/cuda/nccl-ranks.test.ts on two.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const plugin = fileURLToPath(new URL('../../build/Release/test-fakes/sapipe_test_plugin_host_memory.so', import.meta.url));
if (!existsSync(plugin)) throw new Error(`${plugin} is missing: build the native targets (npm run build:native)`);
// Read when the addon first opens the CUDA plugin, which no module imported so far has done.
process.env.SAPIPE_CUDA_PLUGIN = plugin;
await import('./device.test.js');
await import('./model-ops.test.js');
await import('./device-pipeline.test.js');
await import('./device-trainer.test.js');
await import('./device-trainer-overlap.test.js');
await import('./gpt-device.test.js');
await import('./streams.test.js');
