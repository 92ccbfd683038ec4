export { DataParallelTrainer, type DataParallelTrainerOptions, type LossScalingOptions, type DataParallelStepResult, type DataParallelTrainerState } from './trainer.js';
export { DATA_PARALLEL_MODES, type DataParallelMode, type DataParallelModeOptions, type DataParallelOptimizerSpec } from './mode.js';
