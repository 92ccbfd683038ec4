import { resolve } from 'node:path';

import { InvalidArgumentError as CommanderArgumentError, type Command } from 'commander';

import { launch } from 'sapipe';

function integer(min: number, max: number): (text: string) => number {
  return (text) => {
    const value = Number(text);
    if (!/^\d+$/.test(text.trim()) || !Number.isSafeInteger(value) || value < min || value > max)
      throw new CommanderArgumentError(`expected an integer in [${min}, ${max}]`);
    return value;
  };
}

function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}

interface LaunchCommandOptions {
  nproc: number;
  nnodes: number;
  nodeRank: number;
  masterAddr?: string;
  masterPort?: number;
  nodeArg?: string[];
  graceMs: number;
  maxRestarts: number;
  checkpointDir?: string;
}

/**
 * `sapipe launch`: torchrun for Node scripts. Everything after the script is the script's own,
 * options included, which needs positional options on the program.
 */
export function registerLaunchCommand(program: Command): void {
  program.enablePositionalOptions();
  program
    .command('launch')
    .description('run N ranks of a Node script with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ... set (torchrun conventions)')
    .requiredOption('--nproc <n>', 'ranks to start on this node', integer(1, 4096))
    .option('--nnodes <k>', 'nodes in the job', integer(1, 65536), 1)
    .option('--node-rank <r>', "this node's index in [0, nnodes)", integer(0, 65535), 0)
    .option('--master-addr <addr>', 'address of the node running rank 0 (default 127.0.0.1; required with --nnodes > 1)')
    .option('--master-port <port>', 'port of the rendezvous store (default: a free port; required with --nnodes > 1)', integer(1, 65535))
    .option('--node-arg <flag>', 'flag for node before the script, e.g. --node-arg=--enable-source-maps (repeatable)', collect)
    .option('--grace-ms <ms>', 'after SIGTERM, how long ranks get before SIGKILL', integer(0, 2 ** 31 - 1), 5000)
    .option('--max-restarts <k>', 'when a rank fails, restart the whole job up to k times (the ranks resume from their last checkpoint)', integer(0, 1 << 20), 0)
    .option('--checkpoint-dir <dir>', "the job's checkpoint directory: on a restart, say which step the ranks resume from and how much training was lost")
    .argument('<script>', 'the Node script every rank runs')
    .argument('[args...]', "the script's arguments, passed unchanged")
    .passThroughOptions()
    .action(async (script: string, args: string[], options: LaunchCommandOptions) => {
      const result = await launch({
        script,
        args,
        nproc: options.nproc,
        nnodes: options.nnodes,
        nodeRank: options.nodeRank,
        ...(options.masterAddr !== undefined && { masterAddr: options.masterAddr }),
        ...(options.masterPort !== undefined && { masterPort: options.masterPort }),
        nodeArgs: options.nodeArg ?? [],
        graceMs: options.graceMs,
        maxRestarts: options.maxRestarts,
        ...(options.checkpointDir !== undefined && { checkpointDir: resolve(options.checkpointDir) }),
      });
      process.exitCode = result.exitCode;
    });
}
