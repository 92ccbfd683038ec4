/**
 * The transfers of launched pipeline stages each on a GPU of its own: activations and gradients
 * between neighbouring stages by NCCL send/recv. Two communicators join the job's stages, one per
 * direction, because each runs its operations in order on a queue of its own and an NCCL send
 * returns only once the peer's matching recv has taken it: with one queue, stage s's send of the
 * next activation would wait for stage s+1, itself waiting in its send of a gradient for the recv
 * queued behind that send on stage s. Per direction the order is the schedules' own (activations
 * in micro-batch order downstream, gradients upstream), which every rank posts in the same order.
 */
import type { NcclCommunicator } from '../../comm/nccl.js';
import type { DeviceBuffer } from '../../device/index.js';
import { InvalidArgumentError } from '../../errors.js';
import type { StageTransport } from './stage-runner.js';

/**
 * @internal The schedules whose launched stages run on GPUs: one part per stage, part s on stage
 * s, so that a transfer to a later stage is an activation and one to an earlier stage a gradient.
 */
export const NCCL_STAGE_SCHEDULES: readonly string[] = ['gpipe', '1f1b', 'pipeoptim'];

/** @internal Stage `stage`'s transport over the communicators of the two directions. */
export function ncclStageTransport(stage: number, activations: NcclCommunicator, gradients: NcclCommunicator): StageTransport<DeviceBuffer> {
  if (activations.size !== gradients.size || activations.rank !== stage || gradients.rank !== stage)
    throw new InvalidArgumentError(`ncclStageTransport: both communicators must join the stages as rank ${stage}`);
  return {
    size: activations.size,
    send: (buffer, peer) => (peer > stage ? activations : gradients).send(buffer, peer),
    recv: (buffer, peer) => (peer < stage ? activations : gradients).recv(buffer, peer),
  };
}
