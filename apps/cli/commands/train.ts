/**
 * `sapipe train pipeline`: trains an MLP on the MNIST digits cut into pipeline stages, with one
 * of the schedules the runtime executes, on one worker thread per stage; prints loss and test
 * accuracy per epoch and the measured round against the simulator, and writes an HTML report.
 */
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';

import { SingleBar } from 'cli-progress';
import type { Command } from 'commander';

import { AVERAGING_LAYOUTS, DATA_PARALLEL_MODES, DATA_PARALLEL_SCHEDULES, InvalidArgumentError, OPTIMIZER_KINDS, OPTIMIZERS, RUNTIME_SCHEDULES, type RuntimeSchedule, type RuntimeScheduleName, SCHEDULES, type ScheduleOptionName, type ScheduleTrainerOption, WAVELET_FORMS } from 'sapipe';
import { checkOneOf } from 'sapipe/validate';
import { pipelineComparison, renderPipelineReport, renderPipelineSvg } from '../../demo/pipeline-report.js';
import { describeModel, MNIST_PIPELINE_DEFAULTS, parallelPipelinesNote, PIPELINE_CNN_CHANNELS, PIPELINE_GPT_DEFAULTS, PIPELINE_MODELS, pipelineDefaults, pipelinesCoupling, runMnistPipeline, type MnistPipelineConfig } from '../../demo/pipeline-run.js';
import { addGptSizeOptions, gptSizeFromCli, type GptSizeCliOptions } from '../gpt-options.js';
import { kernelThreadsOption, numberOption } from '../parse.js';
import { cliTable } from '../table.js';

interface TrainCliOptions extends GptSizeCliOptions {
  schedule: string;
  stages: string;
  microbatches: string;
  microbatchSize: string;
  epochs: string;
  optimizer: string;
  lr?: string;
  momentum?: string;
  seed: string;
  trainSamples?: string;
  iterations?: string;
  pipelines?: string;
  dpMode?: string;
  advance?: string;
  averagingLayout?: string;
  form?: string;
  spikeCompensation: boolean;
  weightPrediction: boolean;
  boundaries: string;
  layers: string;
  model?: string;
  channels?: string;
  report: string;
  svg?: string;
  profileOut?: string;
  json?: boolean;
  device?: string;
  kernelThreads?: number | 'auto' | 'shared';
}

const num = numberOption;

/** The run's configuration from the command line; every bad value is a typed error naming its option. */
/** The help's schedule lists, read from the registry. */
const runtimeOf = (name: RuntimeScheduleName): RuntimeSchedule => SCHEDULES[name].runtime;
const takes = (option: ScheduleOptionName): string => RUNTIME_SCHEDULES.filter((n) => (SCHEDULES[n].options as readonly string[]).includes(option)).join(', ');
const owning = (option: ScheduleTrainerOption): string => RUNTIME_SCHEDULES.filter((n) => runtimeOf(n).trainerOptions.includes(option)).join(', ');
const smallBatchRule = (): string => RUNTIME_SCHEDULES.filter((n) => 'smallBatchRule' in runtimeOf(n).defaultSgd).join(', ');
function defaultRates(): string {
  const byRate = new Map<number, string[]>();
  for (const n of RUNTIME_SCHEDULES) {
    const sgd = runtimeOf(n).defaultSgd;
    if ('lr' in sgd) byRate.set(sgd.lr, [...(byRate.get(sgd.lr) ?? []), n]);
  }
  const sgd = [...byRate].map(([lr, names]) => `${lr} for ${names.join(', ')}`).join('; ');
  const others = OPTIMIZER_KINDS.filter((k) => k !== 'sgd').map((k) => `${OPTIMIZERS[k].className} ${OPTIMIZERS[k].defaultLr}`).join(', ');
  return `SGD ${sgd}; ${smallBatchRule()} the small-batch rule; ${others}`;
}
const workerSchedules = (): string => RUNTIME_SCHEDULES.filter((n) => runtimeOf(n).coupling === 'workers').join(', ');
function averaged(): string {
  const averaging = RUNTIME_SCHEDULES.filter((n) => runtimeOf(n).coupling === 'elastic-averaging');
  return averaging.map((n) => `for ${n} by elastic averaging (default ${runtimeOf(n).defaultPipelines})`).join(', ');
}

export function pipelineConfigFromCli(o: TrainCliOptions): MnistPipelineConfig & { defaultsNote?: string } {
  const boundaries = o.boundaries === 'measured' || o.boundaries === 'params' ? o.boundaries : o.boundaries.split(',').map((b) => num(b, '--boundaries'));
  const sizes = o.layers.split(',').map((x) => num(x, '--layers'));
  if (sizes[0] !== 784 || sizes[sizes.length - 1] !== 10) throw new InvalidArgumentError(`--layers must start with 784 (MNIST pixels) and end with 10 (digits), got ${o.layers}`);
  const model = checkOneOf(o.model ?? 'mlp', '--model', PIPELINE_MODELS);
  if (o.channels !== undefined && model !== 'cnn') throw new InvalidArgumentError('--channels sets the CNN\'s convolutions; use it with --model cnn');
  const gpt = gptSizeFromCli(o, model, PIPELINE_GPT_DEFAULTS);
  return {
    schedule: o.schedule as MnistPipelineConfig['schedule'],
    stages: num(o.stages, '--stages'),
    microBatches: num(o.microbatches, '--microbatches'),
    microBatchSize: num(o.microbatchSize, '--microbatch-size'),
    epochs: num(o.epochs, '--epochs'),
    optimizer: o.optimizer as MnistPipelineConfig['optimizer'],
    ...hyperparameters(o),
    seed: num(o.seed, '--seed'),
    ...(o.trainSamples === undefined ? {} : { trainSamples: num(o.trainSamples, '--train-samples') }),
    ...(o.iterations === undefined ? {} : { iterations: num(o.iterations, '--iterations') }),
    ...(o.pipelines === undefined ? {} : { pipelines: num(o.pipelines, '--pipelines') }),
    ...(o.advance === undefined ? {} : { advance: num(o.advance, '--advance') }),
    ...(o.dpMode === undefined ? {} : { dataParallel: o.dpMode as MnistPipelineConfig['dataParallel'] }),
    ...(o.averagingLayout === undefined ? {} : { averagingLayout: o.averagingLayout as MnistPipelineConfig['averagingLayout'] }),
    ...(o.form === undefined ? {} : { form: o.form as MnistPipelineConfig['form'] }),
    ...(o.spikeCompensation ? {} : { spikeCompensation: false }),
    ...(o.weightPrediction ? {} : { weightPrediction: false }),
    boundaries,
    model,
    sizes,
    ...(o.channels === undefined ? {} : { channels: o.channels.split(',').map((x) => num(x, '--channels')) }),
    ...(gpt ? { gpt } : {}),
    device: o.device as MnistPipelineConfig['device'],
    ...(o.kernelThreads === undefined ? {} : { kernelThreads: o.kernelThreads }),
  };
}

/** --lr and --momentum, or where neither is given the schedule's defaults and the note that says which. */
function hyperparameters(o: TrainCliOptions): { lr: number; momentum: number; defaultsNote?: string } {
  const schedule = checkOneOf(o.schedule, '--schedule', RUNTIME_SCHEDULES);
  const optimizer = checkOneOf(o.optimizer, '--optimizer', OPTIMIZER_KINDS);
  const defaults = pipelineDefaults(schedule, optimizer, num(o.microbatchSize, '--microbatch-size'));
  if (o.lr !== undefined || o.momentum !== undefined)
    return { lr: o.lr === undefined ? defaults.lr : num(o.lr, '--lr'), momentum: o.momentum === undefined ? 0.9 : num(o.momentum, '--momentum') };
  return { lr: defaults.lr, momentum: defaults.momentum, defaultsNote: defaults.note };
}

/** Samples one round trains: every pipeline's micro-batches (2BW: its iterations' batches), or every worker's (SAPipe). */
function samplesPerRound(result: { config: MnistPipelineConfig; measured: { schedule: { pipelines: number; microBatches: number } } }): number {
  const c = result.config;
  const coupling = SCHEDULES[c.schedule].runtime.coupling;
  // (Wavelet's data-parallel workers: two waves each, the schedule's 2S pipelines.)
  const copies = coupling === 'workers' ? c.stages : coupling === 'elastic-averaging' || c.form === 'data-parallel' ? result.measured.schedule.pipelines : (c.pipelines ?? 1);
  return copies * result.measured.schedule.microBatches * c.microBatchSize;
}

export function registerTrainCommand(program: Command): void {
  const train = program.command('train').description('Train a model with sapipe (pipeline-parallel today)');
  const d = MNIST_PIPELINE_DEFAULTS;
  const pipeline = train
    .command('pipeline')
    .description(
      'Train an MLP on the MNIST digits cut into pipeline stages (one worker thread each, local backend) with a schedule; ' +
        'report loss and test accuracy per epoch and the measured timeline against the simulated one',
    )
    .option('--schedule <name>', `one of ${RUNTIME_SCHEDULES.join(', ')}`, d.schedule)
    .option('--stages <S>', `pipeline stages (worker threads); for ${workerSchedules()} its data-parallel workers`, String(d.stages))
    .option('--microbatches <M>', `micro-batches per round (one batch; for ${takes('iterations')} per batch)`, String(d.microBatches))
    .option('--microbatch-size <b>', 'samples per micro-batch', String(d.microBatchSize))
    .option('--epochs <n>', 'epochs', String(d.epochs))
    .option('--optimizer <kind>', OPTIMIZER_KINDS.join(', '), d.optimizer)
    .option('--lr <lr>', `learning rate (default: the schedule's: ${defaultRates()})`)
    .option('--momentum <mu>', `SGD momentum (default: 0.9; ${smallBatchRule()} the small-batch rule)`)
    .option('--seed <n>', 'seed of the weights, the split and the shuffle', String(d.seed))
    .option('--train-samples <n>', 'use only the first n training samples (quick runs)')
    .option('--iterations <n>', `${takes('iterations')}: batches per round`)
    .option('--pipelines <N>', `parallel pipelines (N x S worker threads; avgpipe's share S by default, --averaging-layout), each on its own micro-batches; stage replicas combined by --dp-mode, or ${averaged()}`)
    .option('--advance <A>', `${owning('advance')}: advance forward propagation depth (default S-1)`)
    .option(
      '--averaging-layout <layout>',
      `${owning('averaging')}: where its N pipelines run: ${AVERAGING_LAYOUTS[0]} (default, the paper's form: S worker threads, each running its stage's row for every pipeline) or ${AVERAGING_LAYOUTS[1]} (N x S worker threads, each pipeline on its own)`,
    )
    .option('--dp-mode <mode>', `how stage replicas combine gradients: ${DATA_PARALLEL_MODES.join(', ')} (sync by default; ${DATA_PARALLEL_SCHEDULES.join(', ')}); for ${workerSchedules()} its workers' staleness-1 mode (default sapipe-wp)`)
    .option(
      '--form <form>',
      `${owning('form')}: ${WAVELET_FORMS[1]} (default: S stages, the model cut in S parts) or ${WAVELET_FORMS[0]} (S workers, each with a tick and a tock replica of the whole model, each wave all-reduced over the workers; the report shows each wave's and the worker's peak activations)`,
    )
    .option('--no-spike-compensation', `${owning('pipelinedBackprop')}: plain SGD-momentum on the late gradients`)
    .option('--no-weight-prediction', `${owning('pipelinedBackprop')}: forwards read the current weights, not the linear prediction`)
    .option('--boundaries <how>', "where to cut: 'measured' (balance measured layer times), 'params', or layer indices like 2,4,6", 'measured')
    .option('--model <kind>', `${PIPELINE_MODELS.join(', ')}: an MLP on the MNIST digits, a small CNN on Fashion-MNIST (Debian's dataset-fashion-mnist), or a byte-level GPT on the text of Debian's fortunes (per-byte cross-entropy; validation loss and perplexity per epoch)`, 'mlp')
    .option('--layers <sizes>', '--model mlp: its widths, 784 first and 10 last', d.sizes.join(','))
    .option('--channels <list>', `--model cnn: the convolutions' output channels (default ${PIPELINE_CNN_CHANNELS.join(',')})`);
  addGptSizeOptions(pipeline, PIPELINE_GPT_DEFAULTS)
    .option('--report <file>', 'HTML report', 'pipeline-report.html')
    .option('--svg <file>', 'also write the measured and simulated timelines as one SVG')
    .option(
      '--profile-out <file>',
      'also write the measured stage costs and sizes as a profile for `sapipe tune`; with one pipeline, machine-aware: each stage timed alone at several micro-batch sizes ' +
        '(fixed + per-sample fit, brought to the run\'s costs), the cores and how many a pass uses, the local link',
    )
    .option('--device <where>', 'where the stages run: cpu (a worker thread each), cuda:N (every stage on that GPU, in this process), or auto (cuda:0 where it is usable, else cpu)', 'cpu')
    .option(
      '--kernel-threads <n>',
      "native kernel threads of each worker thread: auto (this machine's cores split among the workers, at least 1 each), a number, or shared (every worker on the process-wide pool, one job at a time)",
      kernelThreadsOption,
    )
    .option('--json', 'print the result as JSON instead of tables')
    .action(async (o: TrainCliOptions) => {
      const { defaultsNote, ...config } = pipelineConfigFromCli(o);
      if (defaultsNote && !o.json) console.log(`hyperparameters: ${defaultsNote}`);
      const bar = !o.json && process.stderr.isTTY ? new SingleBar({ format: 'epoch {value}/{total} {bar} test accuracy {accuracy}', stream: process.stderr, hideCursor: true }) : undefined;
      bar?.start(config.epochs, 0, { accuracy: '-' });
      let result;
      try {
        result = await runMnistPipeline(config, (e) => bar?.update(e.epoch, { accuracy: `${(e.accuracy * 100).toFixed(2)}%` }), { machineProfile: o.profileOut !== undefined });
      } finally {
        bar?.stop();
      }
      const report = resolve(o.report);
      writeFileSync(report, renderPipelineReport(result));
      if (o.svg !== undefined) writeFileSync(resolve(o.svg), renderPipelineSvg(result));
      if (o.profileOut !== undefined) writeFileSync(resolve(o.profileOut), `${JSON.stringify(result.profile, null, 2)}\n`);
      if (o.json) {
        console.log(
          JSON.stringify(
            {
              config: result.config,
              device: result.device,
              kernelThreads: result.kernelThreads,
              ...(result.averagingLayout ? { averagingLayout: result.averagingLayout } : {}),
              ...(defaultsNote ? { hyperparameters: defaultsNote } : {}),
              trainSamples: result.trainSamples,
              samplesPerRound: samplesPerRound(result),
              trainMs: result.trainMs,
              boundaries: result.boundaries,
              epochs: result.epochs,
              measured: { makespanMs: result.measured.makespan, bubbleFraction: result.measured.bubbleFraction },
              simulated: { makespanMs: result.simulated.makespan, bubbleFraction: result.simulated.bubbleFraction },
              overhead: result.overhead,
              memory: {
                peakActivations: result.peakActivations,
                peakActivationBytes: result.measured.peakActivationBytes,
                peakMemoryBytes: result.measured.peakMemoryBytes,
                ...(result.waves ? { waves: result.waves } : {}),
              },
              report,
            },
            null,
            2,
          ),
        );
        return;
      }
      const c = result.config;
      console.log(
        `${describeModel(c)} (${result.trainSamples} train / ${result.testSamples} test), ${c.schedule} on ${c.stages} stages${pipelinesCoupling(c) ? ` (${pipelinesCoupling(c)})` : ''}, ` +
          `M=${c.microBatches} x ${c.microBatchSize} samples, cut at layers [${result.boundaries.join(', ')}], ${c.optimizer} lr ${c.lr}, seed ${c.seed}`,
      );
      console.log(`device: ${result.device.device} (${result.device.reason})${result.device.device === 'cpu' ? `; kernel threads per worker: ${result.kernelThreads === 'shared' ? "the process-wide pool's" : result.kernelThreads}` : ''}`);
      const lm = c.model === 'gpt';
      const epochs = cliTable(['epoch', 'mean loss', ...(lm ? ['validation loss', 'perplexity', 'next-byte accuracy'] : ['test accuracy']), 'wall s']);
      for (const e of result.epochs)
        epochs.push([e.epoch, e.loss.toFixed(4), ...(lm ? [e.validationLoss!.toFixed(4), e.perplexity!.toFixed(2)] : []), `${(e.accuracy * 100).toFixed(2)}%`, (e.wallMs / 1000).toFixed(2)]);
      console.log(epochs.toString());
      const compare = cliTable(['one round', 'measured', 'simulated from measured costs']);
      for (const row of pipelineComparison(result)) compare.push(row);
      console.log(compare.toString());
      const note = parallelPipelinesNote(c);
      if (note) console.log(note);
      if (result.waves) {
        const waves = cliTable(['worker', 'tick peak', 'tock peak', 'worker peak', 'x plain DP at b', `per-wave b in plain DP's memory (b = ${c.microBatchSize})`]);
        const cell = (p: { peakActivations: number; peakActivationBytes: number }): string => `${p.peakActivations} mb, ${p.peakActivationBytes} B`;
        result.waves.forEach((w, x) => waves.push([x, cell(w.tick), cell(w.tock), cell(w.worker), w.comparison ? w.comparison.ratio.toFixed(2) : '-', w.comparison ? w.comparison.sameMemoryMicroBatch : '-']));
        console.log(waves.toString());
        console.log("stored activations per worker: each wave's peak is plain data parallelism's at the same micro-batch (one replica's forward); the worker runs one pass at a time, so it holds the tick's and the tock's at once");
      }
      console.log(`runtime overhead: ${result.overhead.perActionMs.toFixed(3)} ms per action, ${(result.overhead.shareOfRound * 100).toFixed(1)}% of a round`);
      console.log(`report: ${report}`);
    });
}
