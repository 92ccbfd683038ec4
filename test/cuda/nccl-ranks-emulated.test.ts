/**
 * test/cuda/nccl-ranks.test.ts where no GPU is: its two rank processes on the CUDA plugin over host
 * memory (native/tests/fakes/plugin_host_memory.cpp), whose NCCL joins processes over Unix domain
 * sockets. What it checks: the unique id through the rendezvous store, every collective's result
 * across processes, the fused steps' reductions, guard and gathers over two ranks, and a peer that
 * dies. What it cannot: NCCL's own transport and the GPU's arithmetic (nccl-ranks.test.ts on two GPUs).
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const plugin = fileURLToPath(new URL('../../build/Release/test-fakes/sapipe_test_plugin_host_memory.so', import.meta.url));
if (!existsSync(plugin)) throw new Error(`${plugin} is missing: build the native targets (npm run build:native)`);
// Read when the addon first opens the CUDA plugin (here and in the rank processes, which inherit it).
process.env.SAPIPE_CUDA_PLUGIN = plugin;
await import('./nccl-ranks.test.js');
