/**
 * `sapipe bench pipeline`: the pipeline runtime on the demo model. Per schedule, the measured
 * round against the simulator's prediction from the stage costs the runtime measured in the same
 * run (median round of `rounds` after `warmup`), and the runtime's own overhead: on the busiest
 * stage, the time outside model work and optimizer steps (between actions, posting sends) as a
 * share of the round. Beside it, the machine-aware prediction: each part timed alone at several
 * micro-batch sizes (fixed + per-sample fit), the cores a pass uses and the `local` link measured,
 * and the simulator's stages sharing the machine's cores (docs/pipeline.md, "Stages sharing cores").
 */
import { roundOverhead } from '../demo/pipeline-run.js';
import { type AveragingLayout, costsAt, sharedCoresCosts, measuredCosts, measuredResult, mlpLayers, PipelineTrainer, type PipelineProfile, profileOnMachine, type RoundReport, type RuntimeScheduleName, simulateSchedule, type WaveletForm } from 'sapipe';
import { median } from './timing.js';

export interface PipelineBenchOptions {
  schedules: RuntimeScheduleName[];
  stages: number;
  microBatches: number;
  microBatchSize: number;
  sizes: readonly number[];
  rounds: number;
  warmup: number;
  /** Each stage worker's kernel threads (PipelineTrainerOptions.kernelThreads); default auto. */
  kernelThreads?: number | 'auto' | 'shared';
  /** AvgPipe's layout (its rows only; default the trainer's). */
  averagingLayout?: AveragingLayout;
  /** Wavelet's form (its rows only; default the trainer's). */
  form?: WaveletForm;
}

export interface PipelineBenchRow {
  schedule: RuntimeScheduleName;
  measuredMs: number;
  simulatedMs: number;
  /** measured / simulated makespan. */
  ratio: number;
  /** Spread of the measured makespan over the rounds: min and max. */
  measuredMinMs: number;
  measuredMaxMs: number;
  bubbleMeasured: number;
  bubbleSimulated: number;
  overheadPerActionMs: number;
  overheadShare: number;
  boundaries: number[];
  /** The machine-aware prediction: parts timed alone, stages sharing the cores. */
  simulatedMachineMs: number;
  /** measured / simulatedMachineMs. */
  ratioMachine: number;
  /** The simulator fed each round's measured costs with the sharing taken out, stages sharing the cores: the median over rounds. */
  simulatedSharedMs: number;
  /** measured / simulatedSharedMs. */
  ratioShared: number;
  /** The cores the simulation shared, and the cores a pass was measured to use. */
  cores: number;
  passCores: number;
  /** Each stage worker's kernel threads (resolved). */
  kernelThreads: number | 'shared';
  /** What the message carrying each part's output costs the shared cores, ms of CPU (the machine profile's, at this micro-batch). */
  messageCpuMs: number[];
}


export async function benchPipeline(o: PipelineBenchOptions, onRow?: (row: PipelineBenchRow) => void): Promise<PipelineBenchRow[]> {
  const features = o.sizes[0]!;
  const classes = o.sizes[o.sizes.length - 1]!;
  // enough for a round of every schedule here: Wavelet's data-parallel form trains 2S micro-batch sets per round
  const samples = o.microBatches * o.microBatchSize * Math.max(4, 2 * o.stages);
  const inputs = Float32Array.from({ length: samples * features }, (_, i) => ((i * 2654435761) % 1000) / 1000);
  const labels = Int32Array.from({ length: samples }, (_, i) => i % classes);
  const rows: PipelineBenchRow[] = [];
  // one machine profile per cut (every schedule here cuts the same model the same way)
  const profiles = new Map<string, PipelineProfile>();
  for (const schedule of o.schedules) {
    const trainer = await PipelineTrainer.create({
      schedule,
      stages: o.stages,
      microBatches: o.microBatches,
      microBatchSize: o.microBatchSize,
      model: { layers: mlpLayers(o.sizes), seed: 1, boundaries: 'measured' },
      optimizer: { kind: 'sgd', lr: 0.01, momentum: 0.9 },
      data: { inputs, labels, features },
      ...(o.kernelThreads !== undefined ? { kernelThreads: o.kernelThreads } : {}),
      ...(o.averagingLayout !== undefined && schedule === 'avgpipe' ? { averaging: { layout: o.averagingLayout } } : {}),
      ...(o.form !== undefined && schedule === 'wavelet' ? { form: o.form } : {}),
    });
    try {
      for (let i = 0; i < o.warmup; i++) await trainer.trainRound();
      const reports: RoundReport[] = [];
      for (let i = 0; i < o.rounds; i++) reports.push(await trainer.trainRound());
      const measured = reports.map((r) => measuredResult(trainer.schedule, trainer.analysis, r.timeline));
      const makespans = measured.map((m) => m.makespan);
      // The round whose makespan is the median: with an even count the median is the mean of the
      // two middle rounds and no round equals it, so take the lower of the two.
      const mid = makespans.map((m, i) => [m, i] as const).sort((x, y) => x[0] - y[0])[(makespans.length - 1) >> 1]![1];
      const simulated = simulateSchedule(trainer.schedule, measuredCosts(trainer.schedule, reports.map((r) => r.timeline)));
      const overheads = reports.map(roundOverhead);
      const boundaries = trainer.model.kind === 'sequential' ? [...trainer.model.boundaries] : [];
      let profile = profiles.get(boundaries.join(','));
      if (profile === undefined) {
        profile = await profileOnMachine(mlpLayers(o.sizes), boundaries, { microBatchSize: o.microBatchSize, batchSize: o.microBatches * o.microBatchSize, kernelThreads: trainer.kernelThreads });
        profiles.set(boundaries.join(','), profile);
      }
      const layout = trainer.averagingLayout;
      const machineCosts = costsAt(profile, o.microBatchSize, layout);
      const machine = simulateSchedule(trainer.schedule, machineCosts);
      // each round from its own work (a round the machine's other load slowed is slowed in its costs
      // too), the median over rounds, as the measured figure is
      // (and each message's CPU time on the shared cores, as the profile measured it between two threads)
      const messageCpu = machineCosts.sharedCores?.messageCpu;
      const sharing = { cores: profile.machine!.cores, passCores: profile.machine!.passCores ?? 1, ...(messageCpu !== undefined ? { messageCpu } : {}) };
      // a worker per replica: each pipeline's actions of a row are a thread of their own
      // (the timelines show pipeline 0's threads; the others ran alike beside them)
      const perReplica = layout === 'worker-per-replica';
      const threads = perReplica ? { sharedCores: { ...sharing, threads: 'per-pipeline' as const } } : {};
      const sharedMs = median(reports.map((r) => simulateSchedule(trainer.schedule, sharedCoresCosts(trainer.schedule, [r.timeline], { ...sharing, copies: perReplica ? trainer.pipelines : 1 }, threads)).makespan));
      const row: PipelineBenchRow = {
        schedule,
        measuredMs: median(makespans),
        simulatedMs: simulated.makespan,
        ratio: median(makespans) / simulated.makespan,
        measuredMinMs: Math.min(...makespans),
        measuredMaxMs: Math.max(...makespans),
        bubbleMeasured: measured[mid]!.bubbleFraction,
        bubbleSimulated: simulated.bubbleFraction,
        overheadPerActionMs: median(overheads.map((x) => x.perActionMs)),
        overheadShare: median(overheads.map((x) => x.shareOfRound)),
        boundaries,
        simulatedMachineMs: machine.makespan,
        ratioMachine: median(makespans) / machine.makespan,
        simulatedSharedMs: sharedMs,
        ratioShared: median(makespans) / sharedMs,
        cores: profile.machine!.cores,
        passCores: profile.machine!.passCores ?? 1,
        kernelThreads: trainer.kernelThreads,
        messageCpuMs: Array.isArray(messageCpu) ? [...messageCpu] : [],
      };
      rows.push(row);
      onRow?.(row);
    } finally {
      await trainer.dispose();
    }
  }
  return rows;
}
