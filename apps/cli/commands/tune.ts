import { readFileSync } from 'node:fs';

import type { Command } from 'commander';

import { InvalidArgumentError, parseProfile, tuneAvgPipe } from 'sapipe';

interface TuneCommandOptions {
  profile: string;
  memoryGb: string;
  maxPipelines: string;
  maxMicrobatches: string;
  top: string;
  json?: boolean;
}

export function registerTuneCommand(program: Command): void {
  program
    .command('tune')
    .description('choose AvgPipe pipelines N, micro-batches M and advance A for the best simulated throughput under a memory cap')
    .requiredOption('-p, --profile <file>', 'stage profile JSON (format in docs/pipeline.md)')
    .requiredOption('--memory-gb <X>', 'memory per stage device, GiB')
    .option('--max-pipelines <N>', 'largest N to try', '4')
    .option('--max-microbatches <M>', 'largest M to try', '64')
    .option('--top <K>', 'also list the K fastest settings', '5')
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
  to activationBytes). A profile measured by profileStages() works as is.`,
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
      const b = result.best;
      const train = b
        ? `npx sapipe train pipeline --schedule avgpipe --stages ${profile.stages.length} --pipelines ${b.pipelines} --microbatches ${b.microBatches} --microbatch-size ${b.microBatchSize} --advance ${b.advance}`
        : undefined;
      if (options.json) {
        console.log(JSON.stringify({ best: result.best ?? null, train: train ?? null, explanation: result.explanation, candidates: result.candidates.slice(0, top) }, null, 2));
      } else {
        for (const line of result.explanation) console.log(line);
        if (train) console.log(`to train with it: ${train}`);
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
