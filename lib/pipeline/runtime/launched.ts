/**
 * Pipeline stages as processes: every rank of a job started with `sapipe launch --nproc S` (or
 * torchrun, mpirun, Slurm) calls {@link trainPipelineStage} with the same options and runs the
 * stage of its rank over the `ucx` backend, or with `device`, on a GPU of its own with activations
 * and gradients sent by NCCL between neighbouring stages (nccl-links.ts). No coordinator: the
 * stages agree on the sample order (seeded) and meet only through their transfers, as the worker threads of
 * {@link PipelineTrainer} do; at the end of each epoch, every stage sends its weights (and the last
 * stage its losses) to rank 0, which evaluates the whole model when test data is given. Parallel
 * pipelines run as N x S ranks, each joining its pipeline's and its stage's groups.
 */
import { performance } from 'node:perf_hooks';

import { Communicator } from '../../comm/communicator.js';
import { createCommunicator } from '../../comm/create.js';
import { NcclCommunicator } from '../../comm/nccl.js';
import { fromEnv } from '../../comm/rendezvous/env.js';
import { createRendezvous } from '../../comm/rendezvous/rendezvous.js';
import { commBackendEntry, processGroupBackend } from '../../comm/registry.js';
import { chooseDevice, type CudaDevice } from '../../device/index.js';
import { BackendUnavailableError, InvalidArgumentError } from '../../errors.js';
import { FlatBuffer } from '../../tensor.js';
import { checkInteger, checkObject, describeValue, optionKeys } from '../../validate.js';
import { withKernelThreads } from '../../kernel-threads.js';
import { epochOrder, planPipeline, resolveKernelThreads, TRAINER_OPTION_KEYS, type PipelineTrainerOptions } from './plan.js';
import { NCCL_STAGE_SCHEDULES, ncclStageTransport } from './nccl-links.js';
import { StageHost } from './stage-host.js';
import type { StageTransport, VersionRead } from './stage-runner.js';
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
  /** Its pipeline (0 without parallel pipelines). */
  readonly pipeline: number;
  /** Rank 0: per epoch, the mean loss (from the last stages) and the test accuracy when test data was given. */
  readonly epochs: readonly { epoch: number; loss: number; accuracy?: number; wallMs: number }[];
  /** Each pipeline's rank 0: every part's weights after the last epoch, index = part. Other ranks: their own parts. */
  readonly weights: readonly (Float32Array | undefined)[];
  /** The versions this stage's passes read, per round. */
  readonly versions: readonly (readonly VersionRead[])[];
  /** The kernel threads this process trained on (`kernelThreads` resolved), or `shared` (its process-wide pool). */
  readonly kernelThreads: number | 'shared';
}

/**
 * Trains this rank's stage of a pipeline job; every rank of the job calls it with the same
 * options. Resolves on every rank when training ends; a stage that dies or throws makes the
 * others fail (ERR_PEER_LOST) within the communicator's timeout.
 *
 * Parallel pipelines (`pipelines: N` with `dataParallel`, or `avgpipe`, whose layout here is
 * `worker-per-replica`) take N x S ranks, rank `p*S + s` running stage s of pipeline p; each rank joins two
 * ucx communicators over the launcher's rendezvous: its pipeline's stages (transfers) and its
 * stage's replicas (gradient all-reduces or elastic averaging). They are created here, so `comm`
 * cannot be given then.
 *
 * On GPUs (`device: 'cuda:N'`; `'cuda'`: `cuda:<local rank>`; `'auto'`: the same where CUDA is usable):
 * each stage keeps its part's weights, activations and optimizer state on its device and sends
 * activations and gradients to its neighbours by NCCL send/recv (two NCCL communicators created
 * from the launcher's environment, one per direction); the losses and the weights gathered at the
 * end of each epoch go through the job's host communicator. GPipe, 1F1B and PipeOptim run so;
 * one pipeline only, of sapipe's layers, with the cross-entropy loss, as on one GPU.
 *
 * @category Pipeline runtime
 */
export async function trainPipelineStage(options: PipelineStageOptions): Promise<PipelineStageReport> {
  checkObject(options, 'trainPipelineStage(options)');
  const { epochs: epochsOption, test, comm: given, roundsPerEpoch: roundsOption, ...trainerOptions } = options;
  // 'cuda', and 'auto' on a machine with CUDA: every stage on the GPU of its local rank.
  const requested: unknown = trainerOptions.device;
  if (requested === 'auto' || requested === 'cuda') trainerOptions.device = localStageDevice(requested);
  // Launched processes run AvgPipe's pipelines each on its own ranks (N x S).
  const plan = await planPipeline(trainerOptions as PipelineTrainerOptions, 'trainPipelineStage', STAGE_OPTION_KEYS, 'worker-per-replica');
  if (plan.averaging?.layout === 'shared-stages')
    throw new InvalidArgumentError(
      "trainPipelineStage: launched processes run AvgPipe's pipelines in the 'worker-per-replica' layout (--nproc N*S, the default here); the 'shared-stages' layout over processes is planned: leave out averaging.layout, or train in one process with PipelineTrainer",
    );
  if (plan.rowsAreWorkers)
    throw new InvalidArgumentError(`trainPipelineStage: '${plan.schedule.name}' runs its data-parallel workers as PipelineTrainer threads; launched processes of it are planned`);
  const device = plan.device === 'cpu' ? undefined : plan.device;
  if (device !== undefined && !NCCL_STAGE_SCHEDULES.includes(plan.schedule.name))
    throw new InvalidArgumentError(
      `trainPipelineStage: launched stages on ${device} run ${NCCL_STAGE_SCHEDULES.join(', ')}; '${plan.schedule.name}' runs launched on the CPU (leave out device) or with every stage on one GPU (PipelineTrainer)`,
    );
  if (device !== undefined && given !== undefined)
    throw new InvalidArgumentError(`trainPipelineStage: stages on ${device} create their communicators (NCCL between the stages, the host's for the losses and weights) from the launcher's environment; leave out comm`);
  const epochs = checkInteger(epochsOption, 'trainPipelineStage: epochs', 1, 1 << 20);
  if (test !== undefined) {
    checkObject(test, 'trainPipelineStage: test');
    if (!(test.inputs instanceof Float32Array)) throw new InvalidArgumentError('trainPipelineStage: test.inputs must be a Float32Array');
    if (plan.model.kind !== 'sequential') throw new InvalidArgumentError('trainPipelineStage: test data is evaluated for models of sapipe layers; evaluate your own with the returned weights');
  }
  const withReplicas = plan.dataParallel !== undefined || plan.averaging !== undefined;
  if (withReplicas && given !== undefined)
    throw new InvalidArgumentError('trainPipelineStage: parallel pipelines create their communicators (one per pipeline, one per stage\'s replicas) from the launcher\'s environment; leave out comm');
  const stages = plan.schedule.stages;
  if (given instanceof Communicator && stages > 1 && !commBackendEntry(given.backend, 'trainPipelineStage: comm').capabilities.sendRecv)
    throw new BackendUnavailableError(`trainPipelineStage: the stages exchange activations by send and recv, which the ${given.backend} backend does not offer`);
  const perRound = plan.pipelines * plan.schedule.microBatches * plan.microBatchSize;
  const share = perRound / plan.pipelines;
  const fullEpoch = Math.floor(plan.samples / perRound);
  const rounds = roundsOption === undefined ? fullEpoch : checkInteger(roundsOption, 'trainPipelineStage: roundsPerEpoch', 1, fullEpoch);
  // This process's share of the machine's cores: the launcher's LOCAL_WORLD_SIZE processes split them.
  const localProcesses = Number(process.env.LOCAL_WORLD_SIZE);
  const kernelThreads = Number.isInteger(localProcesses) && localProcesses >= 1 ? resolveKernelThreads(options.kernelThreads, localProcesses, plan.device, 'trainPipelineStage') : plan.kernelThreads;
  const groups = withReplicas
    ? await joinParallelGroups(plan.pipelines, stages, plan.timeoutMs)
    : device !== undefined && stages > 1
      ? await joinDevicePipeline(stages, device, plan.timeoutMs)
      : await joinPipeline(given, stages, plan.timeoutMs);
  const { comm, replicas, pipeline, stage } = groups;
  try {
    return await withKernelThreads(kernelThreads, async () => {
      const host = await StageHost.create(plan.descriptions[stage]!, stages > 1 ? (groups.links ?? comm) : undefined, plan.data, replicas, pipeline);
      try {
        const report: { epoch: number; loss: number; accuracy?: number; wallMs: number }[] = [];
        const versions: VersionRead[][] = [];
        const lastPart = plan.schedule.parts - 1;
        const holder = plan.descriptions.findIndex((d) => d.parts.includes(lastPart));
        const lossBox = FlatBuffer.allocate(2);
        try {
          for (let epoch = 0; epoch < epochs; epoch++) {
            const order = epochOrder(plan.samples, plan.shuffle, plan.seed, epoch);
            const start = performance.now();
            let total = 0;
            let count = 0;
            for (let r = 0; r < rounds; r++) {
              // Pipeline p trains on the p-th share of the round's samples.
              const from = r * perRound + pipeline * share;
              const result = await host.runRound(order.slice(from, from + share), performance.timeOrigin + performance.now());
              versions.push(result.versions);
              for (const l of result.losses)
                if (l !== undefined) {
                  total += l;
                  count++;
                }
            }
            const wallMs = performance.now() - start;
            // The mean loss over every pipeline's micro-batches (the last stages sum theirs over the
            // replicas) and every part's weights go to rank 0.
            if (stage === holder) {
              lossBox.array.set([total, count]);
              if (replicas) await replicas.allreduce(lossBox, { op: 'sum' });
              if (holder !== 0) await comm!.send(lossBox, 0);
            }
            if (stage === 0 && holder !== 0) await comm!.recv(lossBox, holder);
            const weights = await gatherWeights(comm, host, plan.descriptions.map((d) => d.parts));
            if (stage === 0 && pipeline === 0) {
              const [sum, n] = lossBox.array;
              const entry: { epoch: number; loss: number; accuracy?: number; wallMs: number } = { epoch: epoch + 1, loss: n! > 0 ? sum! / n! : NaN, wallMs };
              if (test && plan.model.kind === 'sequential' && plan.data.loss === 'cross-entropy') entry.accuracy = evaluateSequential(plan.model, weights as Float32Array[], test.inputs, test.labels, 'accuracy');
              report.push(entry);
            }
            if (epoch === epochs - 1) return { stage, pipeline, epochs: report, weights, versions, kernelThreads };
          }
        } finally {
          lossBox.dispose();
        }
        throw new InvalidArgumentError(`trainPipelineStage: epochs must be at least 1, got ${describeValue(epochs)}`);
      } finally {
        await host.dispose();
      }
    });
  } finally {
    groups.close();
  }
}

interface StageGroups {
  /** The pipeline's stages (undefined for a one-stage pipeline with replicas). */
  comm: Communicator<FlatBuffer> | undefined;
  /** The stage's replicas in the other pipelines. */
  replicas: Communicator<FlatBuffer> | undefined;
  pipeline: number;
  stage: number;
  /** The stages' transfers, where they do not go through `comm` (stages on GPUs: NCCL). */
  links?: StageTransport;
  close(): void;
}

/**
 * `device: 'cuda'` of a launched stage: the GPU of its local rank; `'auto'`: the same where CUDA is
 * usable, else the CPU. (A rank whose GPU is missing fails when the plan checks it, with
 * ERR_BACKEND_UNAVAILABLE: the stages of one job run all on GPUs or all on CPUs.)
 */
function localStageDevice(requested: 'auto' | 'cuda'): 'cpu' | CudaDevice {
  if (requested === 'auto' && chooseDevice('auto').device === 'cpu') return 'cpu';
  return `cuda:${fromEnv().localRank}`;
}

/**
 * One pipeline of stages on GPUs: the job's host communicator (losses, weights) and the two NCCL
 * communicators of the stages' transfers, all through one rendezvous store, in that order on
 * every rank.
 */
async function joinDevicePipeline(stages: number, device: CudaDevice, timeoutMs: number): Promise<StageGroups> {
  const env = fromEnv();
  if (env.worldSize !== stages) throw oneRankPerStage(env.worldSize, stages);
  const store = await createRendezvous({ ...env, timeoutMs });
  let comm: Communicator<FlatBuffer> | undefined;
  const nccl: NcclCommunicator[] = [];
  const close = (): void => {
    for (const c of nccl) c.destroy();
    comm?.destroy();
    // Rank 0 serves the store and waits (bounded) for the others to disconnect first.
    void store.close().catch(() => {});
  };
  try {
    comm = await processGroupBackend().joinStore(store.group('pipeline-0', env.rank, stages), { timeoutMs });
    for (const direction of ['activations', 'gradients'])
      nccl.push(await NcclCommunicator.create({ rank: env.rank, size: stages, device, store, key: `sapipe/pipeline-${direction}`, timeoutMs }));
  } catch (error) {
    close();
    throw error;
  }
  return { comm, replicas: undefined, pipeline: 0, stage: env.rank, links: ncclStageTransport(env.rank, nccl[0]!, nccl[1]!) as StageTransport, close };
}

function oneRankPerStage(ranks: number, stages: number): InvalidArgumentError {
  return new InvalidArgumentError(`trainPipelineStage: the job has ${ranks} ranks for ${stages} stages; launch one rank per stage (--nproc ${stages})`);
}

/** One pipeline: the job's communicator (given, or created here and destroyed by close()). */
async function joinPipeline(given: Communicator<FlatBuffer> | undefined, stages: number, timeoutMs: number): Promise<StageGroups> {
  const comm = given ?? ((await createCommunicator('auto', { timeoutMs })) as Communicator<FlatBuffer>);
  if (comm.size !== stages) {
    if (given === undefined) comm.destroy();
    throw oneRankPerStage(comm.size, stages);
  }
  return { comm, replicas: undefined, pipeline: 0, stage: comm.rank, close: () => given === undefined && comm.destroy() };
}

/** N pipelines of S stages: rank p*S + s joins pipeline p's group and stage s's replica group, in that order on every rank. */
async function joinParallelGroups(pipelines: number, stages: number, timeoutMs: number): Promise<StageGroups> {
  const env = fromEnv();
  if (env.worldSize !== pipelines * stages)
    throw new InvalidArgumentError(
      `trainPipelineStage: the job has ${env.worldSize} ranks for ${pipelines} pipelines x ${stages} stages; launch one rank per stage of every pipeline (--nproc ${pipelines * stages})`,
    );
  const pipeline = Math.floor(env.rank / stages);
  const stage = env.rank % stages;
  const backend = processGroupBackend();
  const store = await createRendezvous({ ...env, timeoutMs });
  let comm: Communicator<FlatBuffer> | undefined;
  let replicas: Communicator<FlatBuffer> | undefined;
  const close = (): void => {
    comm?.destroy();
    replicas?.destroy();
    // Rank 0 serves the store and waits (bounded) for the others to disconnect first.
    void store.close().catch(() => {});
  };
  try {
    if (stages > 1) comm = await backend.joinStore(store.group(`pipeline-${pipeline}`, stage, stages), { timeoutMs });
    replicas = await backend.joinStore(store.group(`stage-${stage}`, pipeline, pipelines), { timeoutMs });
  } catch (error) {
    close();
    throw error;
  }
  return { comm, replicas, pipeline, stage, close };
}

/**
 * The pipeline's rank 0 receives every part's weights (each preceded by its length); the others
 * send theirs. Returns what this rank holds (AvgPipe: the center, the model the pipelines agree on).
 */
async function gatherWeights(comm: Communicator<FlatBuffer> | undefined, host: StageHost, partsOf: readonly number[][]): Promise<(Float32Array | undefined)[]> {
  const out: (Float32Array | undefined)[] = [];
  for (const p of host.weights()) out[p.part] = p.weights;
  if (comm === undefined) return out;
  // A length travels as two floats (below 2^20 each), exact for any length a ParamSet can have.
  const length = FlatBuffer.allocate(2);
  try {
    if (comm.rank !== 0) {
      for (const p of host.weights()) {
        length.array[0] = Math.floor(p.weights.length / 2 ** 20);
        length.array[1] = p.weights.length % 2 ** 20;
        await comm.send(length, 0);
        const buffer = FlatBuffer.allocate(p.weights.length);
        try {
          buffer.array.set(p.weights);
          await comm.send(buffer, 0);
        } finally {
          buffer.dispose();
        }
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
