/**
 * The worker-thread entry of one pipeline stage on the `local` backend: joins the stages' group,
 * builds the stage, then runs what the trainer asks, one message at a time.
 */
import { parentPort, workerData } from 'node:worker_threads';

import { LocalCommunicator, type LocalRankData } from '../../comm/local.js';
import { type FromStage, type PipelineData, type StageDescription, type ToStage, StageHost, describeError } from './stage-host.js';

interface StageThreadData extends LocalRankData {
  /** One per stage; this thread runs the one of its rank. */
  descriptions: StageDescription[];
  data: PipelineData;
  timeoutMs: number;
}

const { sapipeLocal, descriptions, data, timeoutMs } = workerData as StageThreadData;
const description = descriptions[sapipeLocal.rank]!;
const post = (message: FromStage): void => parentPort!.postMessage(message);

async function main(): Promise<void> {
  const comm = description.schedule.stages > 1 ? await LocalCommunicator.create({ ...sapipeLocal, timeoutMs }) : undefined;
  let host: StageHost;
  try {
    host = await StageHost.create(description, comm, data);
  } catch (error) {
    comm?.destroy();
    throw error;
  }
  post({
    type: 'ready',
    stage: description.stage,
    parts: host.parts.map((p) => ({ part: p.part, inputSize: p.model.inputSize, outputSize: p.model.outputSize, numParams: p.model.params.numParams })),
  });
  // Messages are handled in order: a round must end before the weights are read.
  let chain = Promise.resolve();
  parentPort!.on('message', (message: ToStage) => {
    chain = chain.then(async () => {
      try {
        switch (message.type) {
          case 'round':
            post({ type: 'round', result: await host.runRound(message.samples, message.startAt) });
            break;
          case 'weights':
            post({ type: 'weights', stage: description.stage, parts: host.weights() });
            break;
          case 'lr':
            host.setLr(message.lr);
            break;
          case 'stop':
            host.dispose();
            comm?.destroy();
            parentPort!.close();
            break;
        }
      } catch (error) {
        post(describeError(description.stage, error));
        // Peers blocked on this stage fail at once instead of waiting for their timeout.
        comm?.destroy();
      }
    });
  });
}

main().catch((error: unknown) => post(describeError(description.stage, error)));
