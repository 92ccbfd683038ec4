/**
 * The device: everything sapipe knows about GPU memory and the CUDA plugin, in one place. The
 * plugin's entries (cuda-native.ts), device strings (device-spec.ts), what the plugin and the
 * libraries it opens report (probe.ts: cuda, cuBLAS, NCCL), device buffers (buffer.ts), a
 * ParamSet on a device (param-set.ts), the kernels that stand alone (kernels.ts), and events and
 * streams (events.ts, stream.ts). The communicator that moves device buffers (nccl) lives with the
 * other communication backends in lib/comm and takes its device facilities from here; nothing
 * here imports lib/comm.
 */
export * from './cuda-native.js';
export * from './device-spec.js';
export * from './probe.js';
export * from './buffer.js';
export * from './param-set.js';
export * from './kernels.js';
export * from './events.js';
export * from './stream.js';
