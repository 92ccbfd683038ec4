/**
 * The schedule generators and their registry (registry.ts: every schedule's entry, the name list,
 * generateSchedule).
 */
export { advanceForwardOrder, forwardsBeforeBackward } from './advance-forward.js';
export type { Step } from './advance-forward.js';
export { limits as generatorLimits, type ScheduleOptions, WAVELET_FORMS, type WaveletForm } from './options.js';
export { AVGPIPE_DEFAULT_PIPELINES } from './avgpipe.js';
export * from './registry.js';
