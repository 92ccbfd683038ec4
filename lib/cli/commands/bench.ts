import type { Command } from 'commander';

export function registerBenchCommand(program: Command): void {
  program.command('bench').description('microbenchmarks');
}
