/**
 * The worker-thread entry of one pipeline stage on the `local` backend: joins its pipeline's group
 * (and, with parallel pipelines, its stage's replica group), builds the stage, then runs what the
 * trainer asks, one message at a time.
 */
import { parentPort, workerData } from 'node:worker_threads';

import { LocalCommunicator, type LocalRankData } from '../../comm/local.js';
import { useKernelThreads } from '../../kernel-threads.js';
import { type FromStage, type PipelineData, type StageDescription, type ToStage, StageHost, answerStage, describeError, readyMessage } from './stage-host.js';

interface StageThreadData extends LocalRankData {
  /** One per stage; this thread runs the one of its rank (rank = pipeline x stages + stage). */
  descriptions: StageDescription[];
  data: PipelineData;
  timeoutMs: number;
  /** N parallel pipelines. */
  pipelines: number;
  /** The schedule's rows are data-parallel workers (SAPipe): thread x runs row x as pipeline x. */
  rowsAreWorkers: boolean;
  /** This thread's kernel threads (its core set), or `shared`: the process-wide pool. */
  kernelThreads: number | 'shared';
}

const { sapipeLocal, descriptions, data, timeoutMs, pipelines, rowsAreWorkers, kernelThreads } = workerData as StageThreadData;
// AvgPipe's shared-stages layout: thread k runs row k for every pipeline (rank = stage).
const sharedStages = descriptions[0]!.averaging?.layout === 'shared-stages';
// Threads of one pipeline exchange activations; a worker row exchanges nothing but its all-reduces.
const stages = rowsAreWorkers ? 1 : descriptions.length;
// (A thread of shared stages runs every pipeline; it answers as pipeline 0.)
const pipeline = sharedStages ? 0 : Math.floor(sapipeLocal.rank / stages);
const description = descriptions[rowsAreWorkers || sharedStages ? sapipeLocal.rank : sapipeLocal.rank % stages]!;
const post = (message: FromStage): void => parentPort!.postMessage(message);

async function main(): Promise<void> {
  useKernelThreads(kernelThreads);
  // Two groups per thread: the stages of its pipeline (transfers) and, with parallel pipelines,
  // its stage's replicas (gradient all-reduces, or AvgPipe's averaging). Every thread joins them in
  // the same order. AvgPipe's shared stages: every pipeline's group of the S stages (the
  // pipelines' transfers kept apart), and no replicas' group (they are all on this thread).
  const group = (what: string): string => `${sapipeLocal.group}/${what}`;
  const joined: LocalCommunicator[] = [];
  const join = async (name: string, rank: number, size: number): Promise<LocalCommunicator> => {
    const c = await LocalCommunicator.create({ group: group(name), rank, size, timeoutMs });
    joined.push(c);
    return c;
  };
  let comm: LocalCommunicator | LocalCommunicator[] | undefined;
  let replicas: LocalCommunicator | undefined;
  let host: StageHost;
  try {
    if (sharedStages) {
      if (stages > 1) {
        const links: LocalCommunicator[] = [];
        for (let p = 0; p < pipelines; p++) links.push(await join(`pipeline-${p}`, description.stage, stages));
        comm = links;
      }
    } else {
      // Wavelet's data-parallel workers all-reduce each wave's gradient over the S workers.
      comm = description.waves ? await join('workers', description.stage, descriptions.length) : stages > 1 ? await join(`pipeline-${pipeline}`, description.stage, stages) : undefined;
      if (description.dataParallel || description.averaging) replicas = await join(rowsAreWorkers ? 'workers' : `stage-${description.stage}`, pipeline, pipelines);
    }
    host = await StageHost.create(description, comm, data, replicas, pipeline);
  } catch (error) {
    for (const c of joined) c.destroy();
    throw error;
  }
  post(readyMessage(host, pipeline));
  // Messages are handled in order: a round must end before the weights are read.
  let chain = Promise.resolve();
  parentPort!.on('message', (message: ToStage) => {
    chain = chain.then(async () => {
      try {
        if (message.type === 'stop') {
          await host.dispose();
          for (const c of joined) c.destroy();
          parentPort!.close();
          return;
        }
        const reply = await answerStage(host, message, pipelines, pipeline);
        if (reply) post(reply);
      } catch (error) {
        post(describeError(description.stage, error));
        // Peers blocked on this stage fail at once instead of waiting for their timeout.
        for (const c of joined) c.destroy();
      }
    });
  });
}

main().catch((error: unknown) => post(describeError(description.stage, error)));
