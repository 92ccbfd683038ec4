/**
 * `sapipe simulate dataparallel`: projects sync against SAPipe (staleness 1, all-reduce overlapped
 * with the next step's compute) at cluster scale from a per-step compute time, a model size and
 * the ring all-reduce cost model. Every figure it prints is modelled, and it says so.
 */
import { cliTable } from '../table.js';
import type { Command } from 'commander';

import { type DataParallelProfile, type DataParallelProjection, InvalidArgumentError, MAX_PROJECTION_WORKERS, parseDataParallelProfile, projectDataParallel, readDataParallelProfile } from 'sapipe';

export interface SimulateDataParallelCliOptions {
  workers: string;
  gbps?: string;
  latencyUs: string;
  profile?: string;
  computeMs?: string;
  params?: string;
  modelMb?: string;
  samplesPerStep?: string;
  json?: boolean;
}

function num(value: string, name: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n)) throw new InvalidArgumentError(`${name} must be a number, got "${value}"`);
  return n;
}

/** Parses `8` or `2,4,8,16,64` into worker counts (integers >= 1, no repeats). */
export function parseWorkerList(text: string): number[] {
  const parts = text.split(',').map((s) => s.trim());
  if (parts.length === 0 || parts.some((p) => p === '')) throw new InvalidArgumentError(`--workers: expected a count or a list like 2,4,8,16, got "${text}"`);
  const counts = parts.map((p) => {
    const n = Number(p);
    if (!/^\d+$/.test(p) || !Number.isInteger(n) || n < 1 || n > MAX_PROJECTION_WORKERS)
      throw new InvalidArgumentError(`--workers: each count must be an integer in [1, ${MAX_PROJECTION_WORKERS}], got "${p}"`);
    return n;
  });
  if (new Set(counts).size !== counts.length) throw new InvalidArgumentError(`--workers: each count at most once, got "${text}"`);
  return counts;
}

/**
 * The profile from `--profile` with any direct flag overriding its field, or from the flags alone
 * (then --compute-ms and one of --params / --model-mb are required; --samples-per-step defaults to 1).
 */
export function profileFromCli(o: SimulateDataParallelCliOptions): DataParallelProfile {
  if (o.params !== undefined && o.modelMb !== undefined) throw new InvalidArgumentError('give --params or --model-mb, not both');
  // Each flag is checked under its own name before it joins the profile.
  const positive = (value: string, name: string): number => {
    const n = num(value, name);
    if (n <= 0) throw new InvalidArgumentError(`${name} must be a number > 0, got "${value}"`);
    return n;
  };
  const base: Record<string, unknown> = o.profile === undefined ? {} : { ...readDataParallelProfile(o.profile) };
  if (o.computeMs !== undefined) base.computeMs = positive(o.computeMs, '--compute-ms');
  if (o.samplesPerStep !== undefined) base.samplesPerStep = positive(o.samplesPerStep, '--samples-per-step');
  if (o.params !== undefined || o.modelMb !== undefined) {
    delete base.params;
    delete base.modelBytes;
  }
  if (o.params !== undefined) {
    base.params = positive(o.params, '--params');
    if (!Number.isSafeInteger(base.params)) throw new InvalidArgumentError(`--params must be a whole number, got "${o.params}"`);
  }
  // MB as 1e6 bytes, as network figures count them.
  if (o.modelMb !== undefined) base.modelBytes = positive(o.modelMb, '--model-mb') * 1e6;
  if (o.profile === undefined) {
    if (base.computeMs === undefined) throw new InvalidArgumentError('give --profile <file>, or --compute-ms with --params or --model-mb');
    if (base.params === undefined && base.modelBytes === undefined) throw new InvalidArgumentError('give --params or --model-mb (the size of the gradient to all-reduce)');
    base.samplesPerStep ??= 1;
  }
  return parseDataParallelProfile(base);
}

export function projectionFromCli(o: SimulateDataParallelCliOptions): DataParallelProjection {
  if (o.gbps === undefined) throw new InvalidArgumentError('--gbps is required: the bandwidth of each link in Gbit/s');
  const gbps = num(o.gbps, '--gbps');
  if (gbps <= 0) throw new InvalidArgumentError(`--gbps must be a number > 0, got "${o.gbps}"`);
  const latencyUs = num(o.latencyUs, '--latency-us');
  if (latencyUs < 0) throw new InvalidArgumentError(`--latency-us must be a number >= 0, got "${o.latencyUs}"`);
  return projectDataParallel({ profile: profileFromCli(o), workers: parseWorkerList(o.workers), network: { gbps, latencyUs } });
}

const MODEL_NOTE =
  'MODEL, not a measurement: steady-state step = compute + all-reduce (sync) or max(compute, all-reduce) (SAPipe, staleness 1); ' +
  'ring all-reduce = 2(W-1)/W x gradient bytes / bandwidth + 2(W-1) x latency; overlap is assumed perfect (no contention).';

function fmt(x: number, digits: number): string {
  return x >= 1e6 ? x.toExponential(3) : x.toFixed(digits);
}

export function renderProjection(p: DataParallelProjection, tty = false): string {
  const src = p.profile.source ? ` (${p.profile.source})` : '';
  const lines = [
    `MODELLED projection: compute ${Number(p.profile.computeMs.toPrecision(4))} ms per step per worker, ${p.profile.samplesPerStep} samples per step per worker, ` +
      `gradient ${(p.gradientBytes / 1e6).toFixed(3)} MB, links ${p.network.gbps} Gbit/s, ${p.network.latencyUs} us latency${src}`,
  ];
  const table = cliTable(
    ['workers', 'all-reduce ms', 'comm/compute', 'sync step ms', 'SAPipe step ms', 'sync samples/s', 'SAPipe samples/s', 'SAPipe speedup', 'scaling eff. sync / SAPipe'],
    !tty,
  );
  for (const r of p.rows)
    table.push([
      r.workers,
      fmt(r.allreduceMs, 3),
      fmt(r.commComputeRatio, 2),
      fmt(r.syncStepMs, 3),
      fmt(r.sapipeStepMs, 3),
      fmt(r.syncSamplesPerSec, 0),
      fmt(r.sapipeSamplesPerSec, 0),
      `${r.speedup.toFixed(2)}x`,
      `${(r.syncScalingEfficiency * 100).toFixed(0)}% / ${(r.sapipeScalingEfficiency * 100).toFixed(0)}%`,
    ]);
  lines.push(table.toString(), verdict(p), MODEL_NOTE);
  return lines.join('\n');
}

/** One line saying where SAPipe hides the all-reduce completely and where the network sets the pace. */
export function verdict(p: DataParallelProjection): string {
  const hidden = p.rows.filter((r) => r.workers > 1 && r.commComputeRatio <= 1).map((r) => r.workers);
  const bound = p.rows.filter((r) => r.commComputeRatio > 1).map((r) => r.workers);
  const parts: string[] = [];
  if (hidden.length > 0) parts.push(`SAPipe hides the whole all-reduce behind compute at ${hidden.join(', ')} workers (comm/compute <= 1)`);
  if (bound.length > 0)
    parts.push(
      `at ${bound.join(', ')} workers the network sets the pace (comm/compute > 1): SAPipe still saves the compute time per step, ` +
        'but a faster network, a larger batch per worker or gradient compression would help more',
    );
  return parts.length > 0 ? `${parts.join('; ')}.` : 'One worker: nothing to communicate.';
}

export function registerSimulateCommand(program: Command): void {
  const simulate = program.command('simulate').description('MODELLED projections (not measurements) of training at scale');
  simulate
    .command('dataparallel')
    .description(
      'project sync vs SAPipe (staleness 1, all-reduce overlapped with the next step) step time and throughput on W workers ' +
        'from a per-step compute time, the model size and the ring all-reduce cost model (a MODEL, not a measurement)',
    )
    .option('--workers <list>', 'worker count, or a comma-separated list for a sweep (e.g. 2,4,8,16,64)', '2,4,8,16,64')
    .option('--gbps <x>', 'link bandwidth per worker, Gbit/s (required)')
    .option('--latency-us <x>', 'latency per message, microseconds', '0')
    .option('--profile <file>', 'JSON profile: { "computeMs": 12.5, "params": 25557032 | "modelBytes": N, "samplesPerStep": 32 } (e.g. from sapipe demo --profile-out)')
    .option('--compute-ms <x>', 'compute time of one step on one worker, ms (forward, backward, update); overrides the profile')
    .option('--params <n>', 'parameter count (fp32 gradients, 4 bytes each); overrides the profile')
    .option('--model-mb <x>', 'gradient bytes all-reduced per step, in MB (1e6 bytes), instead of --params')
    .option('--samples-per-step <n>', 'samples per step per worker (default: the profile\'s, else 1)')
    .option('--json', 'print the projection as JSON')
    .addHelpText(
      'after',
      '\nEvery figure is MODELLED: sync step = compute + all-reduce, SAPipe step = max(compute, all-reduce),\n' +
        'with the ring all-reduce of lib/comm/emulation.ts. Examples:\n' +
        '  sapipe simulate dataparallel --gbps 10 --compute-ms 120 --params 25557032 --samples-per-step 32\n' +
        '  sapipe demo --profile-out p.json && sapipe simulate dataparallel --profile p.json --gbps 1 --workers 2,8,64',
    )
    .action((options: SimulateDataParallelCliOptions) => {
      const projection = projectionFromCli(options);
      if (options.json) console.log(JSON.stringify(projection, null, 2));
      else console.log(renderProjection(projection, process.stdout.isTTY === true));
    });
}
