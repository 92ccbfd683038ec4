/**
 * The worker-thread entry of one pipeline stage on the `local` backend: joins its pipeline's group
 * (and, with parallel pipelines, its stage's replica group), builds the stage, then runs what the
 * trainer asks, one message at a time.
 */
import { parentPort, workerData } from 'node:worker_threads';

import { LocalCommunicator, type LocalRankData } from '../../comm/local.js';
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
}

const { sapipeLocal, descriptions, data, timeoutMs, pipelines, rowsAreWorkers } = workerData as StageThreadData;
// Threads of one pipeline exchange activations; a worker row exchanges nothing but its all-reduces.
const stages = rowsAreWorkers ? 1 : descriptions.length;
const pipeline = Math.floor(sapipeLocal.rank / stages);
const description = descriptions[rowsAreWorkers ? sapipeLocal.rank : sapipeLocal.rank % stages]!;
const post = (message: FromStage): void => parentPort!.postMessage(message);

async function main(): Promise<void> {
  // Two groups per thread: the stages of its pipeline (transfers) and, with parallel pipelines,
  // its stage's replicas (gradient all-reduces, or AvgPipe's averaging). Every thread joins them in
  // the same order.
  const group = (what: string): string => `${sapipeLocal.group}/${what}`;
  const comm = stages > 1 ? await LocalCommunicator.create({ group: group(`pipeline-${pipeline}`), rank: description.stage, size: stages, timeoutMs }) : undefined;
  let replicas: LocalCommunicator | undefined;
  let host: StageHost;
  try {
    if (description.dataParallel || description.averaging)
      replicas = await LocalCommunicator.create({ group: group(rowsAreWorkers ? 'workers' : `stage-${description.stage}`), rank: pipeline, size: pipelines, timeoutMs });
    host = await StageHost.create(description, comm, data, replicas, pipeline);
  } catch (error) {
    comm?.destroy();
    replicas?.destroy();
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
          comm?.destroy();
          replicas?.destroy();
          parentPort!.close();
          return;
        }
        const reply = await answerStage(host, message, pipelines, pipeline);
        if (reply) post(reply);
      } catch (error) {
        post(describeError(description.stage, error));
        // Peers blocked on this stage fail at once instead of waiting for their timeout.
        comm?.destroy();
        replicas?.destroy();
      }
    });
  });
}

main().catch((error: unknown) => post(describeError(description.stage, error)));
