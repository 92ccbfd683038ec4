/**
 * The `sapipe` command line. Each command lives in apps/cli/commands/ and registers itself on the
 * program here.
 */
import { Command } from 'commander';

import { registerBenchCommand } from './commands/bench.js';
import { registerDemoCommand } from './commands/demo.js';
import { registerInfoCommand } from './commands/info.js';
import { registerScheduleCommand } from './commands/schedule.js';
import { registerSimulateCommand } from './commands/simulate.js';
import { registerTuneCommand } from './commands/tune.js';
import { registerLaunchCommand } from './commands/launch.js';
import { registerTrainCommand } from './commands/train.js';
import { packageVersion } from 'sapipe';

export function buildProgram(): Command {
  const program = new Command();
  program
    .name('sapipe')
    .description('Staleness-aware distributed training: fused kernels, communication and pipeline schedules')
    .version(packageVersion())
    .showHelpAfterError();
  registerInfoCommand(program);
  registerLaunchCommand(program);
  registerBenchCommand(program);
  registerScheduleCommand(program);
  registerTuneCommand(program);
  registerDemoCommand(program);
  registerTrainCommand(program);
  registerSimulateCommand(program);
  return program;
}

export async function main(argv: string[]): Promise<void> {
  await buildProgram().parseAsync(argv);
}
