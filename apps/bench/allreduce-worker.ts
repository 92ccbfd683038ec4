/**
 * One rank of `sapipe bench allreduce --backend local` (a worker thread); rank 0 posts the report.
 */
import { parentPort, workerData } from 'node:worker_threads';

import { LocalCommunicator, type LocalRankData } from 'sapipe';
import { measureAllreduce, type AllreduceMeasureOptions } from './allreduce-measure.js';

export interface AllreduceWorkerData extends LocalRankData, AllreduceMeasureOptions {
  algorithm: 'direct' | 'ring';
}

const data = workerData as AllreduceWorkerData;
const { group, rank, size } = data.sapipeLocal;

async function main(): Promise<void> {
  const comm = await LocalCommunicator.create({ group, rank, size, algorithm: data.algorithm });
  const report = await measureAllreduce(comm, data, (bytes) => {
    if (rank === 0) parentPort!.postMessage({ progress: bytes });
  });
  comm.destroy();
  if (rank === 0) parentPort!.postMessage(report);
}

main().catch((e: unknown) => parentPort!.postMessage({ error: String(e) }));
