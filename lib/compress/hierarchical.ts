/**
 * The hierarchical compressed all-reduce for jobs that span hosts (docs/ALGORITHMS.md section 6):
 * a dense reduce-scatter among the ranks of a host (shared memory, cheap) leaves each of them the
 * host's mean of one part of the gradient; each selects the top-k of its part (MSTopK with error
 * feedback) and exchanges it with the ranks holding the same part on the other hosts (the sparse
 * all-reduce, the only traffic between hosts); an all-gather among the host's ranks puts the parts
 * together. A host sends density x length elements across, where the flat sparse all-reduce sends
 * that from every rank.
 *
 * All or nothing: the averaged gradient is the same on every rank of every host, so its count of
 * NaN/Inf is too; when it is not 0 (a non-finite input anywhere), nothing is applied and every
 * rank puts its selection back into its residual.
 */
import { Communicator } from '../comm/communicator.js';
import type { HostGroups } from '../comm/host-groups.js';
import { QueuedCommunicator } from '../comm/queued.js';
import { InvalidArgumentError, SizeMismatchError } from '../errors.js';
import { countNonFinite } from '../ops.js';
import { FlatBuffer } from '../tensor.js';
import { checkOptions, describeValue } from '../validate.js';
import { exchangeSparse, SPARSE_OPTION_KEYS, type SparseAllreduceOptions } from './sparse-allreduce.js';
import { checkTopkArguments } from './topk.js';

/** What {@link hierarchicalSparseAllreduce} did. @category Compression */
export interface HierarchicalSparseResult {
  /** NaN/Inf elements in the averaged gradient (the same on every rank; the step is to be skipped when not 0). */
  nonFiniteCount: number;
  /** Elements this rank sent across hosts (the top-k of its part). */
  k: number;
  /** Bytes this rank received from the other hosts. */
  crossBytes: number;
}

/**
 * Length of the part of a `length`-element gradient that one of `localSize` ranks of a host
 * selects from, and of the residual it keeps (the gradient padded to a multiple of the host's ranks).
 *
 * @category Compression
 */
export function hierarchicalPartLength(length: number, localSize: number): number {
  if (!Number.isSafeInteger(length) || length < 0) throw new InvalidArgumentError(`hierarchicalPartLength: length must be a non-negative integer, got ${describeValue(length)}`);
  if (!Number.isSafeInteger(localSize) || localSize < 1) throw new InvalidArgumentError(`hierarchicalPartLength: localSize must be a positive integer, got ${describeValue(localSize)}`);
  return Math.ceil(length / localSize);
}

/**
 * Replaces `grad` on every rank of every host with the mean over all ranks, each host's part
 * sent across hosts as its top-k (see the file comment). `options.density` is of each part;
 * `options.residual` (error feedback) has {@link hierarchicalPartLength} elements. Every rank calls
 * it with the same gradient length and options.
 *
 * @category Compression
 */
export async function hierarchicalSparseAllreduce(groups: HostGroups, grad: FlatBuffer, options: SparseAllreduceOptions): Promise<HierarchicalSparseResult> {
  if (groups === null || typeof groups !== 'object' || !(groups.local instanceof Communicator) || !(groups.cross instanceof Communicator))
    throw new InvalidArgumentError(`hierarchicalSparseAllreduce(groups) must be { local, cross } communicators, got ${describeValue(groups)}`);
  if (!(grad instanceof FlatBuffer)) throw new InvalidArgumentError(`hierarchicalSparseAllreduce(grad) must be a FlatBuffer, got ${describeValue(grad)}`);
  checkOptions(options, SPARSE_OPTION_KEYS, 'hierarchicalSparseAllreduce(groups, grad, options)');
  const { local, cross } = groups;
  const n = grad.length;
  const part = hierarchicalPartLength(n, local.size);
  if (options.residual !== undefined && (!(options.residual instanceof FlatBuffer) || options.residual.length !== part))
    throw new SizeMismatchError(`hierarchicalSparseAllreduce: residual must be a FlatBuffer of ${part} elements (hierarchicalPartLength(${n}, ${local.size}))`);
  const { mine, padded, release } = scratch(local, part);
  try {
    // Checked against this rank's part before anything starts (a rank that threw later would
    // leave its peers waiting).
    const { k, rounds, residual } = checkTopkArguments(mine, options, 'hierarchicalSparseAllreduce');
    local.checkLive('hierarchicalSparseAllreduce');
    cross.checkLive('hierarchicalSparseAllreduce');
    padded.array.fill(0);
    padded.array.set(grad.array);
    if (local.size > 1) await local.reduceScatter(padded, mine, { op: 'avg' });
    else mine.array.set(padded.array);
    const exchanged = await exchangeSparse(cross, mine, k, rounds, residual);
    if (local.size > 1) await local.allgather(mine, padded);
    else padded.array.set(mine.array);
    // Every rank of every host now holds the same average: the same verdict everywhere.
    const nonFinite = countNonFinite(padded);
    if (nonFinite > 0) exchanged.restore();
    grad.array.set(padded.array.subarray(0, n));
    return { nonFiniteCount: nonFinite, k, crossBytes: exchanged.bytes };
  } finally {
    release();
  }
}

interface Scratch {
  mine: FlatBuffer;
  padded: FlatBuffer;
  busy: boolean;
}
/** Per host communicator and part length, the buffers of the last exchange, reused by the next. */
const scratches = new WeakMap<Communicator, Map<number, Scratch>>();

/**
 * The part and padded buffers of an exchange on `local`: in the communicator's memory where it
 * has one (shared memory on ucx, so the reduce-scatter and all-gather inside the host read the
 * peers' buffers directly instead of running a ring), kept for the next exchange of the same
 * length (a region's mapping costs more than a small exchange). An exchange overlapping one in
 * flight on the same communicator gets buffers of its own, freed after it.
 */
function scratch(local: Communicator, part: number): { mine: FlatBuffer; padded: FlatBuffer; release(): void } {
  const memory = local instanceof QueuedCommunicator && local.size > 1 ? local : undefined;
  const allocate = (n: number): FlatBuffer => (memory ? memory.allocate(n) : FlatBuffer.allocate(n));
  let byLength = scratches.get(local);
  if (!byLength) scratches.set(local, (byLength = new Map()));
  const kept = byLength.get(part);
  if (kept && !kept.busy && !kept.mine.disposed && !kept.padded.disposed) {
    kept.busy = true;
    return { mine: kept.mine, padded: kept.padded, release: () => void (kept.busy = false) };
  }
  const fresh: Scratch = { mine: allocate(part), padded: allocate(part * local.size), busy: true };
  if (kept?.busy) {
    return {
      mine: fresh.mine,
      padded: fresh.padded,
      release: () => {
        fresh.mine.dispose();
        fresh.padded.dispose();
      },
    };
  }
  kept?.mine.dispose();
  kept?.padded.dispose();
  byLength.set(part, fresh);
  return { mine: fresh.mine, padded: fresh.padded, release: () => void (fresh.busy = false) };
}
