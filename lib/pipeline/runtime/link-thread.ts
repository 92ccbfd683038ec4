/**
 * The worker-thread entry of {@link measureLocalLink}: one of two ranks of a `local` group, in a
 * thread of its own as a stage is. Rank 0 sends each message and waits for it to come back; rank 1
 * returns it. Rank 0 posts the median round trip of each size, and the process's CPU time per
 * message over the timed trips (both threads, the transport's threads and their wake-ups: what a
 * message costs cores that stages share).
 */
import { parentPort, workerData } from 'node:worker_threads';

import { LocalCommunicator } from '../../comm/local.js';
import { FlatBuffer } from '../../tensor.js';

interface LinkData {
  group: string;
  rank: 0 | 1;
  sizes: number[];
  repeats: number;
}

const { group, rank, sizes, repeats } = workerData as LinkData;

async function main(): Promise<void> {
  const comm = await LocalCommunicator.create({ group, rank, size: 2 });
  const roundTripMs: number[] = [];
  const cpuPerMessageMs: number[] = [];
  try {
    for (const n of sizes) {
      const buffer = FlatBuffer.allocate(n);
      try {
        buffer.fill(1);
        const times: number[] = [];
        let cpu: NodeJS.CpuUsage | undefined;
        // two unmeasured trips first: the queues' threads start on the first message
        for (let i = 0; i < repeats + 2; i++) {
          if (i === 2) cpu = process.cpuUsage();
          if (rank === 0) {
            const start = performance.now();
            await comm.send(buffer, 1);
            await comm.recv(buffer, 1);
            if (i >= 2) times.push(performance.now() - start);
          } else {
            await comm.recv(buffer, 0);
            await comm.send(buffer, 0);
          }
        }
        const used = process.cpuUsage(cpu);
        times.sort((a, b) => a - b);
        roundTripMs.push(times.length ? times[times.length >> 1]! : 0);
        // process-wide CPU (microseconds) over `repeats` round trips of two messages each
        cpuPerMessageMs.push((used.user + used.system) / 1000 / (2 * repeats));
      } finally {
        buffer.dispose();
      }
    }
  } finally {
    await comm.destroy();
  }
  parentPort!.postMessage({ type: 'done', roundTripMs, cpuPerMessageMs });
}

main().catch((error: unknown) => parentPort!.postMessage({ type: 'error', message: error instanceof Error ? error.message : String(error) }));
