/**
 * `sapipe demo`: trains an MLP on MNIST with N data-parallel workers (threads on the CPU, or one
 * GPU each over NCCL with --device) in each mode and compares accuracy, speed and exposed
 * communication, in a table and an HTML report.
 */
import { DEMO_GPT_DEFAULTS, DEMO_MODELS, type DemoModelName } from '../../demo/models.js';
import { writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { resolve } from 'node:path';

import { MultiBar } from 'cli-progress';
import { addGptSizeOptions, gptSizeFromCli, type GptSizeCliOptions } from '../gpt-options.js';
import { numberOption } from '../parse.js';
import { checkInteger, checkOneOf } from 'sapipe/validate';
import { cliTable } from '../table.js';
import type { Command } from 'commander';

import { type DataParallelProfile, DEFAULT_ADAPTIVE_DC_LAMBDA, DEFAULT_DC_KIND, DEFAULT_ELEMENTWISE_DC_LAMBDA, DEFAULT_WP_ESTIMATE, emulatedMs, InvalidArgumentError, SapipeError, RUNTIME_SCHEDULES, type RuntimeScheduleName } from 'sapipe';
import { checkDemoConfig, DEMO_DEFAULTS, parseModes, type DemoConfig } from '../../demo/config.js';
import { DEMO_CPU, DEMO_DEVICE_SPELLINGS, type DemoDevice, resolveDemoDevice } from '../../demo/device.js';
import { renderDemoReport } from '../../demo/report.js';
import { deviceWaitNote, runDemo, speedupNote, type DemoProgress, type DemoResult } from '../../demo/run-demo.js';
// TensorFlow.js itself is loaded only when --tfjs asks for it (demo/tfjs-model.ts).
import { runTfjsDemo, TFJS_DEMO_DEFAULTS, type TfjsDemoConfig } from '../../demo/tfjs-run.js';

interface DemoCliOptions extends GptSizeCliOptions {
  model: string;
  /** Undefined: not given (the device decides: 4 on the CPU, one per usable GPU). */
  workers?: string;
  /** Undefined: cpu. */
  device?: string;
  modes: string;
  epochs: string;
  batch: string;
  lr: string;
  momentum: string;
  seed: string;
  trainSamples?: string;
  gbps?: string;
  latencyUs?: string;
  lambda?: string;
  dcKind?: string;
  overlap?: boolean;
  topk?: string;
  errorFeedback?: boolean;
  profileOut?: string;
  report: string;
  json?: boolean;
  tfjs?: boolean;
  schedules: string;
  stages: string;
}

// Options arrive as strings and are checked here (not by commander parsers) so every bad value
// fails as a typed InvalidArgumentError with the option's name.
const num = numberOption;

export function demoConfigFromCli(o: DemoCliOptions): DemoConfig {
  const latencyUs = o.latencyUs === undefined ? undefined : num(o.latencyUs, '--latency-us');
  if (latencyUs !== undefined && o.gbps === undefined) throw new InvalidArgumentError('--latency-us needs --gbps (the emulated link speed)');
  // The model first: a size option beside an unknown model is the model's mistake, not the option's.
  const model = checkOneOf(o.model, '--model', DEMO_MODELS);
  const gpt = gptSizeFromCli(o, model, DEMO_GPT_DEFAULTS);
  const given = o.workers === undefined ? undefined : num(o.workers, '--workers');
  // A count no device could take is the count's mistake, whatever the device.
  if (given !== undefined) checkInteger(given, '--workers', 1, 64);
  const { device, workers } = o.device === undefined ? { device: DEMO_CPU, workers: given ?? DEMO_DEFAULTS.workers } : resolveDemoDevice(o.device, given, DEMO_DEFAULTS.workers);
  return checkDemoConfig({
    model: model as DemoModelName,
    ...(gpt ? { gpt } : {}),
    device,
    workers,
    modes: parseModes(o.modes),
    epochs: num(o.epochs, '--epochs'),
    batch: num(o.batch, '--batch'),
    lr: num(o.lr, '--lr'),
    momentum: num(o.momentum, '--momentum'),
    seed: num(o.seed, '--seed'),
    trainSamples: o.trainSamples === undefined ? undefined : num(o.trainSamples, '--train-samples'),
    emulate: o.gbps === undefined ? undefined : { gbps: num(o.gbps, '--gbps'), latencyUs: latencyUs ?? 0 },
    lambda: o.lambda === undefined ? undefined : num(o.lambda, '--lambda'),
    dcKind: o.dcKind as DemoConfig['dcKind'],
    overlap: o.overlap ?? true,
    topk: o.topk === undefined ? undefined : { density: num(o.topk, '--topk'), errorFeedback: o.errorFeedback ?? true },
  });
}

/**
 * The profile `sapipe simulate dataparallel --profile` reads, from this run: the per-step time
 * outside communication of the sync run (else the first mode). With more workers than cores the
 * workers took turns on the cores, so the time is scaled by cores/workers to estimate one worker
 * on a core of its own.
 */
export function demoProfile(result: DemoResult, cores = availableParallelism()): DataParallelProfile {
  refuseProfileOnGpu(result.config.device);
  const m = result.modes.find((r) => r.variant.mode === 'sync') ?? result.modes[0]!;
  const c = result.config;
  const share = Math.min(1, cores / c.workers);
  return {
    computeMs: m.stepMs.compute * share,
    params: c.params,
    samplesPerStep: c.batch,
    source:
      `sapipe demo: ${c.description}, mode ${m.mode}, ${c.workers} workers on ${cores} cores, ` +
      `measured ${m.stepMs.compute.toFixed(3)} ms per step outside communication` +
      (share < 1 ? `, scaled by ${cores}/${c.workers} for one worker per core` : ''),
  };
}


/** The profile models workers sharing a machine's cores; a GPU's compute time is no such thing. */
function refuseProfileOnGpu(device: DemoDevice): void {
  if (device.kind !== 'cpu') throw new InvalidArgumentError('--profile-out is not offered with a GPU --device: the profile models workers sharing CPU cores; leave it out, or use --device cpu');
}

function progress(enabled: boolean, config: DemoConfig): { update: (p: DemoProgress) => void; stop: () => void } {
  if (!enabled || !process.stderr.isTTY) return { update: () => {}, stop: () => {} };
  const bars = new MultiBar({ format: '{mode} {bar} epoch {value}/{total}  test accuracy {accuracy}', stream: process.stderr, hideCursor: true });
  const byMode = new Map(config.modes.map((m) => [m.label, bars.create(config.epochs, 0, { mode: m.label.padEnd(10), accuracy: '-' })]));
  return {
    update: (p) => byMode.get(p.mode)?.update(p.epoch, { accuracy: `${(p.accuracy * 100).toFixed(2)}%` }),
    stop: () => bars.stop(),
  };
}

function printTable(result: DemoResult): void {
  const c = result.config;
  const onGpu = c.device.kind === 'cuda';
  const network = onGpu ? `NCCL` : c.emulate ? `emulated network ${c.emulate.gbps} Gbit/s, ${c.emulate.latencyUs ?? 0} us latency` : 'local shared memory';
  console.log(`device: ${onGpu ? c.device.ranks.map((d, r) => `worker ${r} on ${d}`).join(', ') : 'cpu (every worker a thread)'} (${c.device.reason})`);
  console.log(
    `${c.description} (${c.trainSamples} train / ${c.testSamples} test), ${c.workers} workers x batch ${c.batch}, ` +
      `${c.epochs} epoch(s), lr ${c.lr}${c.lambda === undefined ? '' : `, DC lambda ${c.lambda}`}${c.dcKind === undefined ? '' : `, DC ${c.dcKind}`}, seed ${c.seed}, communication: ${network}${c.topk ? `, top-k density ${c.topk.density}${c.topk.errorFeedback ? '' : ' without error feedback'}` : ''}`,
  );
  // The CNN and the GPT also report their test loss (the GPT: per byte, and its perplexity).
  const withLoss = result.modes.some((m) => m.finalLoss !== undefined);
  const lm = c.model === 'gpt';
  const table = cliTable(['mode', lm ? 'next-byte accuracy' : 'test accuracy', ...(withLoss ? ['test loss'] : []), ...(lm ? ['perplexity'] : []), 'wall s', 'samples/s', 'speedup vs sync', 'exposed comm s', 'step ms']);
  for (const m of result.modes)
    table.push([
      m.mode,
      `${(m.finalAccuracy * 100).toFixed(2)}%`,
      ...(withLoss ? [m.finalLoss?.toFixed(4) ?? '-'] : []),
      ...(lm ? [m.finalLoss === undefined ? '-' : Math.exp(m.finalLoss).toFixed(2)] : []),
      (m.wallMs / 1000).toFixed(2),
      m.samplesPerSec.toFixed(0),
      m.speedup === undefined ? '-' : `${m.speedup.toFixed(2)}x`,
      (m.exposedCommMs / 1000).toFixed(2),
      m.loopStepMs.toFixed(2),
    ]);
  console.log(table.toString());
  if (c.emulate) {
    const m = emulatedMs(c.emulate, 'allreduce', 4 * c.params, c.workers);
    console.log(
      `Modelled ring all-reduce of the gradient on the emulated network: ${m.toFixed(2)} ms per step. ` +
        'A fully overlapped staleness-1 mode steps in about max(its compute, that); sync pays the sum.',
    );
  }
  console.log(
    'Exposed comm: time step() waited for communication, summed over steps, per worker, averaged. ' +
      'Step ms: steady-state time per step (the end-of-epoch flush and evaluation excluded). ' +
      [deviceWaitNote(result), speedupNote(result)].filter(Boolean).join(' '),
  );
}

/** `--tfjs`: the TensorFlow.js CNN, with its own defaults where the user gave none. */
async function tfjsDemo(options: DemoCliOptions, command: Command): Promise<void> {
  for (const name of ['profileOut', 'report'])
    if (command.getOptionValueSource(name) === 'cli') throw new InvalidArgumentError(`--${name === 'profileOut' ? 'profile-out' : name} is not offered with --tfjs (the table or --json is its output)`);
  const fromUser = (name: string): boolean => command.getOptionValueSource(name) === 'cli';
  const o: DemoCliOptions = {
    ...options,
    modes: fromUser('modes') ? options.modes : TFJS_DEMO_DEFAULTS.modes,
    epochs: fromUser('epochs') ? options.epochs : String(TFJS_DEMO_DEFAULTS.epochs),
    batch: fromUser('batch') ? options.batch : String(TFJS_DEMO_DEFAULTS.batch),
    trainSamples: options.trainSamples ?? String(TFJS_DEMO_DEFAULTS.trainSamples),
  };
  const config: TfjsDemoConfig = {
    ...demoConfigFromCli(o),
    schedules: parseSchedules(o.schedules),
    stages: num(o.stages, '--stages'),
  };
  const live = !options.json && process.stderr.isTTY;
  const result = await runTfjsDemo(config, (run) => {
    if (live) process.stderr.write(`${run.run}: test accuracy ${(run.accuracy * 100).toFixed(2)}%, ${(run.wallMs / 1000).toFixed(1)} s\n`);
  });
  if (options.json) {
    console.log(JSON.stringify(result, null, 2));
    return;
  }
  const c = result.config;
  console.log(
    `TensorFlow.js CNN (conv 3x3x8, max-pool, dense 64, dense 10) on MNIST (${c.trainSamples} train / ${c.testSamples} test), tfjs backend ${c.backend}, ` +
      `global batch ${c.workers} x ${c.batch}, ${c.epochs} epoch(s), SGD lr ${c.lr} momentum ${c.momentum}, seed ${c.seed}, ${c.cores} cores`,
  );
  const table = cliTable(['run', 'test accuracy', 'wall s', 'samples/s', 'speedup vs tfjs alone', 'tfjs fwd+bwd ms/step', 'adapter ms/step', 'adapter share']);
  for (const r of result.runs)
    table.push([
      r.run,
      `${(r.accuracy * 100).toFixed(2)}%`,
      (r.wallMs / 1000).toFixed(2),
      r.samplesPerSec.toFixed(0),
      r.speedup === undefined ? '-' : `${r.speedup.toFixed(2)}x`,
      r.stepMs ? r.stepMs.tfjs.toFixed(1) : '-',
      r.stepMs ? r.stepMs.adapter.toFixed(3) : '-',
      r.adapterShare === undefined ? '-' : `${(r.adapterShare * 100).toFixed(2)}%`,
    ]);
  console.log(table.toString());
  console.log(
    `Data-parallel rows: ${c.workers} ranks (threads) each on its ${c.batch} samples of every global batch; adapter: writing the weights the forward reads into the model and copying tfjs's gradients out, per step, against tfjs's forward and backward. ` +
      `Pipeline rows: the CNN cut into ${c.stages} TfjsStage parts, ${c.workers} micro-batches of ${c.batch} per round. ` +
      (c.workers > c.cores ? `With ${c.workers} ranks on ${c.cores} cores the ranks take turns on the cores.` : ''),
  );
}

function parseSchedules(list: string): RuntimeScheduleName[] {
  const names = list.split(',').map((s) => s.trim()).filter(Boolean);
  for (const n of names)
    if (!(RUNTIME_SCHEDULES as readonly string[]).includes(n)) throw new InvalidArgumentError(`--schedules: unknown schedule "${n}"; choose from ${RUNTIME_SCHEDULES.join(', ')}`);
  if (new Set(names).size !== names.length) throw new InvalidArgumentError(`--schedules: each schedule at most once, got "${list}"`);
  return names as RuntimeScheduleName[];
}

export function registerDemoCommand(program: Command): void {
  const demo = program
    .command('demo')
    .description('Train an MLP on MNIST with data-parallel workers (threads on the CPU, or one GPU each with --device) in each mode and compare accuracy, speed and exposed communication')
    .option('--model <kind>', `${DEMO_MODELS.join(', ')}: the MLP on the MNIST digits, sapipe's small CNN on Fashion-MNIST (Debian's dataset-fashion-mnist), or a small byte-level GPT on the text of Debian's fortunes (next-byte accuracy, test loss and perplexity)`, 'mlp');
  // The GPT's size, as `sapipe train pipeline` takes it (its defaults: the demo's small GPT).
  addGptSizeOptions(demo, DEMO_GPT_DEFAULTS)
    .option('--workers <n>', `data-parallel workers: threads on the CPU (default ${DEMO_DEFAULTS.workers}); with a GPU --device, one per GPU (default: one per usable GPU; 1 with --device cuda:N)`)
    .option(
      '--device <where>',
      `where the workers compute, one of ${DEMO_DEVICE_SPELLINGS}: cpu (default; threads over the local backend), cuda:N (one worker on that GPU), cuda (worker r on cuda:r, over NCCL), auto (cuda where a GPU can run models and NCCL is there, else cpu). A GPU run trains every --model with the dense exchange (not --topk, --gbps, --no-overlap, the local sapipe-wp estimates, --profile-out or --tfjs)`,
    )
    .option(
      '--modes <list>',
      `comma-separated modes: sync, pipe-sgd, sapipe-dc, sapipe-wp (estimate ${DEFAULT_WP_ESTIMATE}); sapipe-wp:<local|prev-sync|local-prev-sync>[+dc] picks the estimate and adds delay compensation`,
      DEMO_DEFAULTS.modes,
    )
    .option('--epochs <n>', 'passes over the training set', String(DEMO_DEFAULTS.epochs))
    .option('--batch <n>', 'samples per worker per step', String(DEMO_DEFAULTS.batch))
    .option('--lr <x>', 'SGD learning rate', String(DEMO_DEFAULTS.lr))
    .option('--momentum <x>', 'SGD momentum', String(DEMO_DEFAULTS.momentum))
    .option('--seed <n>', 'seed of the split, the shuffles and the initial weights', String(DEMO_DEFAULTS.seed))
    .option('--train-samples <n>', 'use at most this many training samples (quick runs)')
    .option('--gbps <x>', 'emulate a network of this many Gbit/s (collectives are delayed accordingly)')
    .option('--latency-us <x>', 'emulated per-message latency in microseconds (with --gbps)')
    .option(
      '--lambda <x>',
      `delay-compensation strength of sapipe-dc and sapipe-wp:...+dc (default: ${DEFAULT_ADAPTIVE_DC_LAMBDA} for adaptive, ${DEFAULT_ELEMENTWISE_DC_LAMBDA} for elementwise)`,
    )
    .option(
      '--dc-kind <kind>',
      `delay-compensation form: ${DEFAULT_DC_KIND} (default; the term divided by sqrt(g*g + eps)) or ${DEFAULT_DC_KIND === 'adaptive' ? 'elementwise' : 'adaptive'}`,
    )
    .option('--topk <density>', "exchange each worker's top-k gradient elements (MSTopK, this fraction of them) instead of the dense all-reduce (DataParallelTrainer's compression)")
    .option('--no-error-feedback', '--topk: drop what was not sent instead of adding it to the next gradient')
    .option('--no-overlap', "staleness-1 modes: apply each update at the next step() instead of behind its all-reduce (DataParallelTrainer's overlapUpdate: false), to compare")
    .option('--profile-out <file>', 'also write a profile of the measured compute time for `sapipe simulate dataparallel --profile` (not with --tfjs)')
    .option('--report <file>', 'where to write the HTML report (not with --tfjs, whose output is the table or --json)', 'demo-report.html')
    .option('--json', 'print JSON (table rows and per-epoch accuracy) instead of a table')
    .option(
      '--tfjs',
      `train a TensorFlow.js CNN through sapipe/tfjs instead of sapipe's MLP: tfjs alone, then data-parallel in each mode, then pipeline-parallel under each of --schedules (needs @tensorflow/tfjs; defaults: --modes ${TFJS_DEMO_DEFAULTS.modes} --epochs ${TFJS_DEMO_DEFAULTS.epochs} --batch ${TFJS_DEMO_DEFAULTS.batch} --train-samples ${TFJS_DEMO_DEFAULTS.trainSamples})`,
    )
    .option('--schedules <list>', '--tfjs: pipeline schedules for the CNN cut into --stages parts (empty: none)', TFJS_DEMO_DEFAULTS.schedules)
    .option('--stages <n>', '--tfjs: pipeline stages (2 or 3)', String(TFJS_DEMO_DEFAULTS.stages))
    .action(async (options: DemoCliOptions, command: Command) => {
      try {
        await demoAction(options, command);
      } catch (error) {
        // Typed errors say their code, as `sapipe bench` does, so that scripts can tell them apart.
        if (!(error instanceof SapipeError)) throw error;
        console.error(`${error.code}: ${error.message}`);
        process.exitCode = 1;
      }
    });
}

async function demoAction(options: DemoCliOptions, command: Command): Promise<void> {
  if (options.tfjs) {
    if (options.device !== undefined && options.device !== 'cpu') throw new InvalidArgumentError(`--device ${options.device} is not offered with --tfjs: the TensorFlow.js demo trains on the CPU; leave --device out, or drop --tfjs to train sapipe's MLP on the GPU`);
    if (command.getOptionValueSource('model') === 'cli') throw new InvalidArgumentError("--model picks sapipe's own model; --tfjs trains its TensorFlow.js CNN on MNIST");
    for (const name of ['blocks', 'dim', 'heads', 'context'])
      if (command.getOptionValueSource(name) === 'cli') throw new InvalidArgumentError(`--${name} sets the size of sapipe's GPT (--model gpt); --tfjs trains its TensorFlow.js CNN on MNIST`);
    return tfjsDemo(options, command);
  }
  for (const name of ['schedules', 'stages'])
    if (command.getOptionValueSource(name) === 'cli') throw new InvalidArgumentError(`--${name} belongs to --tfjs (the TensorFlow.js demo)`);
  const config = demoConfigFromCli(options);
  // Before training, not after it: the profile is written once the run is done.
  if (options.profileOut !== undefined) refuseProfileOnGpu(config.device ?? DEMO_CPU);
  const bar = progress(!options.json, config);
  let result: DemoResult;
  try {
    result = await runDemo(config, bar.update);
  } finally {
    bar.stop();
  }
  const reportPath = resolve(options.report);
  writeFileSync(reportPath, renderDemoReport(result));
  if (options.profileOut !== undefined) writeFileSync(resolve(options.profileOut), JSON.stringify(demoProfile(result), null, 2) + '\n');
  if (options.json) console.log(JSON.stringify({ ...result, report: reportPath }, null, 2));
  else {
    printTable(result);
    console.log(`report: ${reportPath}`);
  }
}
