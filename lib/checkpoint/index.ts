/** Checkpoints on disk (safetensors files, one per rank, written atomically) and resuming from them. */
export { loadCheckpoint, rankCheckpointSteps, readRankCheckpoint, saveCheckpoint, type CheckpointSave, type LoadedCheckpoint, type LoadCheckpointOptions, type RankCheckpoint, type SaveCheckpointOptions, type SavedCheckpoint } from './trainer.js';
export { Checkpointer, type CheckpointerOptions, type CheckpointerStats } from './checkpointer.js';
export { loadPipelineCheckpoint, savePipelineCheckpoint, type SavePipelineCheckpointOptions } from './pipeline.js';
export { CHECKPOINT_VERSION, retractRankSave, writeAtomic, type CheckpointManifest, type SkippedCheckpoint } from './store.js';
export { decodeSafetensors, encodeSafetensors, type SafetensorsTensor } from './safetensors.js';
