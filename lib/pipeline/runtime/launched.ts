/**
 * Pipeline stages as processes: every rank of a job started with `sapipe launch --nproc S` (or
 * torchrun, mpirun, Slurm) calls {@link trainPipelineStage} with the same options and runs the
 * stage of its rank over the `ucx` backend. No coordinator: the stages agree on the sample order
 * (seeded) and meet only through their transfers, as the worker threads of
 * {@link PipelineTrainer} do; at the end of each epoch, every stage sends its weights (and the last
 * stage its losses) to rank 0, which evaluates the whole model when test data is given.
 */
import { performance } from 'node:perf_hooks';

import type { Communicator } from '../../comm/communicator.js';
import { createCommunicator } from '../../comm/create.js';
import { InvalidArgumentError } from '../../errors.js';
import { FlatBuffer } from '../../tensor.js';
import { checkInteger, checkObject, describeValue, optionKeys } from '../../validate.js';
import { epochOrder, planPipeline, TRAINER_OPTION_KEYS, type PipelineTrainerOptions } from './plan.js';
import { StageHost } from './stage-host.js';
import type { VersionRead } from './stage-runner.js';
import { evaluateSequential } from './trainer.js';

/** Options of {@link trainPipelineStage}: the trainer's, and how long to train. @category Pipeline runtime */
export interface PipelineStageOptions extends PipelineTrainerOptions {
  epochs: number;
  /** Test data rank 0 evaluates the whole model on after each epoch (models of sapipe layers). */
  test?: { inputs: Float32Array; labels: ArrayLike<number> };
  /** This rank's communicator; default createCommunicator() (ucx in a launched process). */
  comm?: Communicator<FlatBuffer>;
  /** Stop after this many rounds of each epoch (default: the whole epoch). */
  roundsPerEpoch?: number;
}
const STAGE_OPTION_KEYS = [...TRAINER_OPTION_KEYS, ...optionKeys<Omit<PipelineStageOptions, keyof PipelineTrainerOptions>>({ epochs: true, test: true, comm: true, roundsPerEpoch: true })];

/** What a stage process reports. @category Pipeline runtime */
export interface PipelineStageReport {
  readonly stage: number;
  /** Rank 0: per epoch, the mean loss (from the last stage) and the test accuracy when test data was given. */
  readonly epochs: readonly { epoch: number; loss: number; accuracy?: number; wallMs: number }[];
  /** Rank 0: every part's weights after the last epoch, index = part. Other ranks: their own parts. */
  readonly weights: readonly (Float32Array | undefined)[];
  /** The versions this stage's passes read, per round. */
  readonly versions: readonly (readonly VersionRead[])[];
}

/**
 * Trains this rank's stage of a pipeline job; every rank of the job calls it with the same
 * options. Resolves on every rank when training ends; a stage that dies or throws makes the
 * others fail (ERR_PEER_LOST) within the communicator's timeout.
 *
 * @category Pipeline runtime
 */
export async function trainPipelineStage(options: PipelineStageOptions): Promise<PipelineStageReport> {
  checkObject(options, 'trainPipelineStage(options)');
  const { epochs: epochsOption, test, comm: given, roundsPerEpoch: roundsOption, ...trainerOptions } = options;
  const plan = await planPipeline(trainerOptions as PipelineTrainerOptions, 'trainPipelineStage', STAGE_OPTION_KEYS);
  const epochs = checkInteger(epochsOption, 'trainPipelineStage: epochs', 1, 1 << 20);
  if (test !== undefined) {
    checkObject(test, 'trainPipelineStage: test');
    if (!(test.inputs instanceof Float32Array)) throw new InvalidArgumentError('trainPipelineStage: test.inputs must be a Float32Array');
    if (plan.model.kind !== 'sequential') throw new InvalidArgumentError('trainPipelineStage: test data is evaluated for models of sapipe layers; evaluate your own with the returned weights');
  }
  if (plan.pipelines > 1 || plan.dataParallel || plan.averaging)
    throw new InvalidArgumentError('trainPipelineStage: parallel pipelines run on the worker threads of PipelineTrainer; as launched processes they are planned');
  const perRound = plan.schedule.microBatches * plan.microBatchSize;
  const fullEpoch = Math.floor(plan.samples / perRound);
  const rounds = roundsOption === undefined ? fullEpoch : checkInteger(roundsOption, 'trainPipelineStage: roundsPerEpoch', 1, fullEpoch);
  const comm = given ?? ((await createCommunicator('auto', { timeoutMs: plan.timeoutMs })) as Communicator<FlatBuffer>);
  try {
    if (comm.size !== plan.schedule.stages)
      throw new InvalidArgumentError(`trainPipelineStage: the job has ${comm.size} ranks for ${plan.schedule.stages} stages; launch one rank per stage (--nproc ${plan.schedule.stages})`);
    const stage = comm.rank;
    const host = await StageHost.create(plan.descriptions[stage]!, plan.schedule.stages > 1 ? comm : undefined, plan.data);
    try {
      const report: { epoch: number; loss: number; accuracy?: number; wallMs: number }[] = [];
      const versions: VersionRead[][] = [];
      const lastPart = plan.schedule.parts - 1;
      const holdsLast = plan.descriptions[stage]!.parts.includes(lastPart);
      const lossBox = FlatBuffer.allocate(1);
      try {
        for (let epoch = 0; epoch < epochs; epoch++) {
          const order = epochOrder(plan.samples, plan.shuffle, plan.seed, epoch);
          const start = performance.now();
          let total = 0;
          let count = 0;
          for (let r = 0; r < rounds; r++) {
            const result = await host.runRound(order.slice(r * perRound, (r + 1) * perRound), performance.timeOrigin + performance.now());
            versions.push(result.versions);
            for (const l of result.losses)
              if (l !== undefined) {
                total += l;
                count++;
              }
          }
          const wallMs = performance.now() - start;
          // The last stage's mean loss and every part's weights go to rank 0.
          const holder = plan.descriptions.findIndex((d) => d.parts.includes(lastPart));
          if (holdsLast) lossBox.array[0] = count > 0 ? total / count : NaN;
          if (holder !== 0) {
            if (stage === holder) await comm.send(lossBox, 0);
            if (stage === 0) await comm.recv(lossBox, holder);
          }
          const weights = await gatherWeights(comm, host, plan.descriptions.map((d) => d.parts));
          if (stage === 0) {
            const entry: { epoch: number; loss: number; accuracy?: number; wallMs: number } = { epoch: epoch + 1, loss: lossBox.array[0]!, wallMs };
            if (test && plan.model.kind === 'sequential') entry.accuracy = evaluateSequential(plan.model, weights as Float32Array[], test.inputs, test.labels);
            report.push(entry);
          }
          if (epoch === epochs - 1) return { stage, epochs: report, weights, versions };
        }
      } finally {
        lossBox.dispose();
      }
      throw new InvalidArgumentError(`trainPipelineStage: epochs must be at least 1, got ${describeValue(epochs)}`);
    } finally {
      await host.dispose();
    }
  } finally {
    if (given === undefined) comm.destroy();
  }
}

/** Rank 0 receives every part's weights (each preceded by its length); the others send theirs. Returns what this rank holds. */
async function gatherWeights(comm: Communicator<FlatBuffer>, host: StageHost, partsOf: readonly number[][]): Promise<(Float32Array | undefined)[]> {
  const out: (Float32Array | undefined)[] = [];
  for (const p of host.parts) out[p.part] = p.model.params.weights.array.slice();
  // A length travels as two floats (below 2^20 each), exact for any length a ParamSet can have.
  const length = FlatBuffer.allocate(2);
  try {
    if (comm.rank !== 0) {
      for (const p of host.parts) {
        length.array[0] = Math.floor(p.model.params.length / 2 ** 20);
        length.array[1] = p.model.params.length % 2 ** 20;
        await comm.send(length, 0);
        await comm.send(p.model.params.weights, 0);
      }
      return out;
    }
    for (let stage = 1; stage < partsOf.length; stage++) {
      for (const part of partsOf[stage]!) {
        await comm.recv(length, stage);
        const buffer = FlatBuffer.allocate(length.array[0]! * 2 ** 20 + length.array[1]!);
        try {
          await comm.recv(buffer, stage);
          out[part] = buffer.array.slice();
        } finally {
          buffer.dispose();
        }
      }
    }
    return out;
  } finally {
    length.dispose();
  }
}
