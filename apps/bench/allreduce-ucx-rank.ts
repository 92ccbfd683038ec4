/**
 * One rank of `sapipe bench allreduce --backend ucx` (a process started by `sapipe launch`, so the
 * rendezvous comes from the environment). argv[2]: the measurement options as JSON. Rank 0 prints
 * its report as one line after REPORT_PREFIX.
 */
import { UcxCommunicator } from 'sapipe';
import { measureAllreduce, type AllreduceMeasureOptions } from './allreduce-measure.js';
import { runAsRankScript } from './rank-script.js';

export const REPORT_PREFIX = 'SAPIPE_BENCH_REPORT ';

/** What the driver passes each rank: the measurements, and the algorithm its communicator uses. */
export type UcxRankData = AllreduceMeasureOptions & { algorithm: 'direct' | 'ring' };

async function main(): Promise<void> {
  const data = JSON.parse(process.argv[2] ?? '{}') as UcxRankData;
  const comm = await UcxCommunicator.create({ algorithm: data.algorithm });
  const report = await measureAllreduce(comm, data);
  comm.destroy();
  if (comm.rank === 0) process.stdout.write(`${REPORT_PREFIX}${JSON.stringify(report)}\n`);
}

// Run only as a script, so that the driver can import REPORT_PREFIX.
runAsRankScript(import.meta.url, main);
