/** Communication: the Communicator API, the local, ucx and nccl backends, the fused all-reduce + update, and the rendezvous store. */
export { Communicator, DEFAULT_COMM_TIMEOUT_MS, type CommBuffer, type AllreduceOptions, type CommBackendName, type ReduceOp, type ReduceOptions, type ReduceResult } from './communicator.js';
export { LocalCommunicator, spawnLocalRanks, runLocalRanks, type RunLocalRanksOptions, partition, type LocalCommunicatorOptions, type LocalRankData } from './local.js';
export { UcxCommunicator, DEFAULT_UCX_CHUNK_BYTES, type UcxCommunicatorOptions } from './ucx.js';
export { NcclCommunicator, type NcclCommunicatorOptions, type NcclStepOptions, type NcclStepResultInfo } from './nccl.js';
export { emulatedMs, type NetworkEmulation, type RingPattern } from './emulation.js';
export { QueuedCommunicator } from './queued.js';
export { allreduceAndStep, gatherShardedState, type FusedStepOptions, type FusedStepResult } from './fused-step.js';
export { bucketRanges, DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES } from './buckets.js';
export * from './rendezvous/index.js';
export { createCommunicator, type CreateCommunicatorOptions, type CreatedCommunicator } from './create.js';
export { createHostGroups, type CreateHostGroupsOptions, type HostGroups } from './host-groups.js';
