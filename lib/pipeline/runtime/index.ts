/** The pipeline runtime: stage workers that execute schedules on real model parts with the native kernels. */
export { PIPELINE_STATE_COUPLINGS, PipelineTrainer, type EpochReport, type PipelineStateCoupling, type PipelineReplicaState, type PipelineTrainerState, type RoundReport } from './trainer.js';
export { DATA_PARALLEL_SCHEDULES, type PipelineModelOptions, type PipelinedBackpropOptions, type PipelineTrainerOptions } from './plan.js';
export { StageRunner, type MicroBatchSource, type StagePart, type StageRoundResult, type StageTransport, type VersionRead } from './stage-runner.js';
export type { AveragingLayout, DataParallelPartState, PipelineAveragingOptions, PipelineDataParallelOptions, PipelineLoss, PipelineModelSpec, PipelineOptimizerSpec } from './stage-host.js';
export { AVERAGING_LAYOUTS, PIPELINE_LOSSES } from './stage-host.js';
export { measuredCosts, measuredResult, profileLayers, waveletMemory, type WaveletMemory } from './measure.js';
export { type MachineProfileOptions, type PartCostOptions, type PartCostProfile, calibrateProfile, machineCores, measureLocalLink, measurePassCores, measuredP2pLatency, profileOnMachine, profilePartCosts, sharedCoresCosts } from './cost-profile.js';
export { RUNTIME_SCHEDULES, type RuntimeScheduleName } from './weights.js';
export { trainPipelineStage, type PipelineStageOptions, type PipelineStageReport } from './launched.js';
