/**
 * Pipeline schedules as data (representation, generators, validator and analysis, simulator,
 * pictures, the AvgPipe tuner: pure TypeScript), and the runtime that executes them on stage
 * workers with the native kernels (runtime/).
 */
export {
  type Action,
  type ActionKind,
  type Schedule,
  type ScheduleInit,
  action,
  computeKinds,
  createSchedule,
  formatAction,
  formatSchedule,
  p2pKinds,
  parseAction,
  parseSchedule,
  scheduleLimits,
} from './schedule.js';
export { withCommunication } from './communication.js';
export * from './schedules/index.js';
export { type ReplicaAnalysis, type ScheduleAnalysis, type StalenessEntry, stalenessOf, validateSchedule } from './validate.js';
export { type PerPart, type SharedCores, type SimulationCosts, type SimulationResult, simulateSchedule } from './simulate.js';
export type { TimedAction } from './timeline.js';
export { type RenderOptions, renderAscii, renderHtml, renderSvg, scheduleTitle, summarize } from './render.js';
export {
  type MachineProfile,
  type MessageCpu,
  type PassCost,
  type PipelineProfile,
  type ProfileOptions,
  type StageCostFit,
  fitPassCost,
  type StageFunctions,
  type StageProfile,
  parseProfile,
  profileStages,
} from './profile.js';
export { type TuneCandidate, type TuneOptions, type TuneResult, type TuneSetting, costsAt, simulateSetting, tuneAvgPipe } from './tune.js';
export * from './runtime/index.js';
