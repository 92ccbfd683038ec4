import { readFileSync } from 'node:fs';

import type { Command } from 'commander';

import { AVERAGING_LAYOUTS, InvalidArgumentError, type PipelineProfile, parseProfile, SCHEDULES, simulateSetting, type TuneCandidate, type TuneSetting, tuneAvgPipe } from 'sapipe';
import { checkOneOf } from 'sapipe/validate';

interface TuneCommandOptions {
  profile: string;
  memoryGb: string;
  maxPipelines: string;
  maxMicrobatches: string;
  top: string;
  measured?: string;
  json?: boolean;
}

/** The tuner's prediction for a run of `sapipe train pipeline --json`, against what that run measured. */
export interface PredictionError {
  /** The run's setting in the tuner's terms. */
  readonly setting: TuneSetting & { readonly schedule: string };
  readonly predicted: TuneCandidate;
  /** Samples trained per second of training wall time (every round, and between rounds). */
  readonly measuredSamplesPerSecond: number;
  /** Samples of one round per second of the run's median round. */
  readonly measuredRoundSamplesPerSecond: number;
  /** predicted / measured - 1, over wall time and over the median round. */
  readonly error: number;
  readonly roundError: number;
}

const need = (ok: boolean, what: string): void => {
  if (!ok) throw new InvalidArgumentError(`--measured: ${what}; pass the JSON that \`sapipe train pipeline ... --json\` printed`);
};

/**
 * The run a `train pipeline --json` report describes, as an AvgPipe setting (1F1B is A = 0 with one
 * pipeline, GPipe all forwards first), simulated from the profile and compared with the run.
 */
export function predictionError(profile: PipelineProfile, reportInput: unknown): PredictionError {
  need(reportInput !== null && typeof reportInput === 'object', 'the report must be a JSON object');
  const report = reportInput as Record<string, any>;
  const c = report.config as Record<string, any> | undefined;
  need(c !== null && typeof c === 'object', 'the report has no config');
  const schedule = c!.schedule as string;
  need(schedule === 'avgpipe' || schedule === '1f1b' || schedule === 'gpipe', `the tuner predicts avgpipe, 1f1b and gpipe runs, not ${JSON.stringify(schedule)}`);
  const S = profile.stages.length;
  need(c!.stages === S, `the run has ${c!.stages} stages and the profile ${S}`);
  need(Number.isInteger(c!.microBatches) && c!.microBatches >= 1 && Number.isInteger(c!.microBatchSize) && c!.microBatchSize >= 1, 'config.microBatches and config.microBatchSize must be integers >= 1');
  const M = c!.microBatches as number;
  const avg = SCHEDULES.avgpipe.runtime;
  const setting: TuneSetting =
    schedule === 'avgpipe'
      ? {
          pipelines: c!.pipelines ?? avg.defaultPipelines,
          microBatches: M,
          advance: c!.advance ?? S - 1,
          microBatchSize: c!.microBatchSize,
          // the layout that ran (reports from before the shared stages ran each pipeline on its own workers)
          layout: checkOneOf(report.averagingLayout ?? 'worker-per-replica', '--measured: averagingLayout', AVERAGING_LAYOUTS),
        }
      : { pipelines: 1, microBatches: M, advance: schedule === 'gpipe' ? M + S : 0, microBatchSize: c!.microBatchSize };
  need((c!.pipelines ?? 1) === setting.pipelines || schedule === 'avgpipe', 'parallel pipelines of 1f1b or gpipe are not a setting the tuner predicts');
  const perRound = report.samplesPerRound;
  const trainSamples = report.trainSamples;
  const trainMs = report.trainMs;
  const makespan = report.measured?.makespanMs;
  const epochs = Array.isArray(report.epochs) ? report.epochs.length : NaN;
  for (const [name, v] of [['samplesPerRound', perRound], ['trainSamples', trainSamples], ['trainMs', trainMs], ['measured.makespanMs', makespan]] as const)
    need(typeof v === 'number' && v > 0 && Number.isFinite(v), `${name} must be a number > 0 (a report of this version of sapipe has it)`);
  need(epochs >= 1, 'the report has no epochs');
  const predicted = simulateSetting(profile, setting);
  const measuredSamplesPerSecond = (Math.floor(trainSamples / perRound) * perRound * epochs) / (trainMs / 1000);
  const measuredRoundSamplesPerSecond = (perRound * 1000) / makespan;
  return {
    setting: { schedule, ...setting },
    predicted,
    measuredSamplesPerSecond,
    measuredRoundSamplesPerSecond,
    error: predicted.samplesPerSecond / measuredSamplesPerSecond - 1,
    roundError: predicted.samplesPerSecond / measuredRoundSamplesPerSecond - 1,
  };
}

const signed = (x: number): string => `${x >= 0 ? '+' : ''}${(x * 100).toFixed(1)}%`;

export function registerTuneCommand(program: Command): void {
  program
    .command('tune')
    .description('choose AvgPipe pipelines N, micro-batches M and advance A for the best simulated throughput under a memory cap')
    .requiredOption('-p, --profile <file>', 'stage profile JSON (format in docs/pipeline.md)')
    .requiredOption('--memory-gb <X>', 'memory per stage device, GiB')
    .option('--max-pipelines <N>', 'largest N to try', '4')
    .option('--max-microbatches <M>', 'largest M to try', '64')
    .option('--top <K>', 'also list the K fastest settings', '5')
    .option('--measured <report>', 'a run\'s result (`sapipe train pipeline ... --json` saved to a file): print its prediction against what it measured')
    .option('--json', 'print the result as JSON')
    .addHelpText(
      'after',
      `
Profile (JSON; costs measured at microBatchSize samples per micro-batch; docs/pipeline.md has more):
  {
    "stages": [ { "forwardMs": 6, "backwardMs": 12, "activationBytes": 50331648,
                  "storedActivationBytes": 50331648, "weightBytes": 1073741824,
                  "optimizerStateBytes": 2147483648 }, ... one per stage ],
    "microBatchSize": 8,        samples per micro-batch of the measurement (required)
    "batchSize": 64,            samples per pipeline per iteration, split into M (required)
    "overheadMs": 0.3,          part of each time that does not shrink with the micro-batch
    "p2pLatencyMs": 1.5, "p2pBandwidthGBps": 12     the link between stages
  }
  forwardMs/backwardMs are required per stage; the byte sizes default to 0 (storedActivationBytes
  to activationBytes). A profile measured by profileStages() works as is.

Machine-aware profiles (\`sapipe train pipeline --profile-out\` with one pipeline) also hold, per stage,
  "fit": { "forward": { "fixedMs", "perSampleMs" }, "backward": { ... } }   a pass at b samples costs
                              fixedMs + perSampleMs * b (timed at several b, brought to the run's costs)
  "optimizerStepMs"           the stage's optimizer step
and "machine": { "cores", "poolThreads", "passCores" }: the stages are then simulated as the runtime's
worker threads (one per stage and pipeline) sharing the cores; a pass that runs while more cores are
asked for than there are slows down in proportion (docs/pipeline.md, "Stages sharing cores").

Prediction error of a run: train the printed setting with --json saved to a file, then
  npx sapipe tune --profile profile.json --memory-gb X --measured run.json
prints the prediction for that run's setting against its measured samples/s (training wall time, and
its median round).`,
    )
    .action((options: TuneCommandOptions) => {
      let text: string;
      try {
        text = readFileSync(options.profile, 'utf8');
      } catch (error) {
        throw new InvalidArgumentError(`cannot read the profile ${options.profile}: ${(error as Error).message}`, { cause: error });
      }
      const memoryGb = Number(options.memoryGb);
      if (!(memoryGb > 0) || !Number.isFinite(memoryGb)) throw new InvalidArgumentError(`--memory-gb must be a number > 0, got "${options.memoryGb}"`);
      const top = Number(options.top);
      if (!Number.isInteger(top) || top < 0) throw new InvalidArgumentError('--top must be an integer >= 0');
      const profile = parseProfile(text);
      const result = tuneAvgPipe(profile, {
        memoryBytes: memoryGb * 2 ** 30,
        maxPipelines: Number(options.maxPipelines),
        maxMicroBatches: Number(options.maxMicrobatches),
      });
      // The chosen setting as the command that trains with it (the profile's stages are the pipeline's).
      let measured: PredictionError | undefined;
      if (options.measured !== undefined) {
        let report: unknown;
        try {
          report = JSON.parse(readFileSync(options.measured, 'utf8'));
        } catch (error) {
          throw new InvalidArgumentError(`cannot read the run's result ${options.measured}: ${(error as Error).message}`, { cause: error });
        }
        measured = predictionError(profile, report);
      }
      const b = result.best;
      const train = b
        ? `npx sapipe train pipeline --schedule avgpipe --stages ${profile.stages.length} --pipelines ${b.pipelines} --microbatches ${b.microBatches} --microbatch-size ${b.microBatchSize} --advance ${b.advance}`
        : undefined;
      if (options.json) {
        console.log(JSON.stringify({ best: result.best ?? null, train: train ?? null, explanation: result.explanation, candidates: result.candidates.slice(0, top), ...(measured ? { measured } : {}) }, null, 2));
      } else {
        for (const line of result.explanation) console.log(line);
        if (train) console.log(`to train with it: ${train}`);
        if (measured) {
          const m = measured;
          const st = m.setting;
          console.log(
            `\nthe measured run, ${st.schedule} N=${st.pipelines} M=${st.microBatches} A=${st.advance >= st.microBatches + profile.stages.length ? 'all-forward-first' : st.advance} micro-batch ${st.microBatchSize}:\n` +
              `  predicted ${m.predicted.samplesPerSecond.toFixed(1)} samples/s\n` +
              `  measured  ${m.measuredSamplesPerSecond.toFixed(1)} samples/s over training wall time: prediction error ${signed(m.error)}\n` +
              `  measured  ${m.measuredRoundSamplesPerSecond.toFixed(1)} samples/s over its median round: prediction error ${signed(m.roundError)}`,
          );
        }
        if (top > 0) {
          // The settings that fit first (fastest first), then the faster ones that would need more
          // memory, so the list is never all `fits: no` while settings that fit exist.
          const fitting = result.candidates.filter((c) => c.fits).slice(0, top);
          const faster = result.candidates.filter((c) => !c.fits && c.samplesPerSecond > (fitting[0]?.samplesPerSecond ?? 0)).slice(0, Math.max(0, top - fitting.length));
          const shown = [...fitting, ...faster];
          console.log(`\nfastest ${fitting.length} settings that fit${faster.length > 0 ? `, then ${faster.length} faster that do not` : ''}:`);
          console.log('     N    M    A  samples/s  bubble  peak GiB  fits');
          for (const c of shown) {
            const a = c.advance >= c.microBatches + (c.peakMemoryBytes.length) ? 'AFF' : String(c.advance);
            console.log(
              `  ${String(c.pipelines).padStart(4)} ${String(c.microBatches).padStart(4)} ${a.padStart(4)} ${c.samplesPerSecond.toFixed(1).padStart(10)} ` +
                `${(c.bubbleFraction * 100).toFixed(1).padStart(6)}% ${(Math.max(...c.peakMemoryBytes) / 2 ** 30).toFixed(2).padStart(9)}  ${c.fits ? 'yes' : 'no'}`,
            );
          }
        }
      }
      if (!result.best) process.exitCode = 1;
    });
}
