/**
 * The names of the communication backends, the one list of them: the registry
 * (./registry.ts) holds an entry for each, and the compiler holds it to this list.
 */

/** @category Backends */
export const COMM_BACKENDS = ['local', 'ucx', 'nccl'] as const;

/** @category Backends */
export type CommBackendName = (typeof COMM_BACKENDS)[number];
