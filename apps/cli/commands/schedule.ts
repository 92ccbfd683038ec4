import { writeFileSync } from 'node:fs';

import type { Command } from 'commander';

import { formatSchedule, generateSchedule, InvalidArgumentError, renderAscii, SCHEDULES, type ScheduleOptionName, type ScheduleOptions, renderHtml, renderSvg, type ScheduleName, scheduleNames, scheduleTitle, simulateSchedule, summarize } from 'sapipe';

interface ScheduleCommandOptions {
  stages: string;
  microbatches: string;
  pipelines?: string;
  advance?: string;
  virtualStages?: string;
  iterations?: string;
  form?: string;
  forward: string;
  backward: string;
  weightGrad?: string;
  latency: string;
  allreduce?: string;
  svg?: string;
  html?: string;
  ascii?: boolean;
  actions?: boolean;
  json?: boolean;
}

function integer(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (!Number.isInteger(value)) throw new InvalidArgumentError(`${flag} must be an integer, got "${text}"`);
  return value;
}

function number(flag: string, text: string): number {
  const value = Number(text);
  if (!Number.isFinite(value) || value < 0) throw new InvalidArgumentError(`${flag} must be a number >= 0, got "${text}"`);
  return value;
}

/** The schedules whose generator reads `option`, for the help (from the registry). */
const takes = (option: ScheduleOptionName): string => scheduleNames.filter((n) => (SCHEDULES[n].options as readonly string[]).includes(option)).join(', ');
/** The schedules whose simulation reads `cost`. */
const costs = (cost: 'weightGrad' | 'allReduce'): string => scheduleNames.filter((n) => (SCHEDULES[n].costs as readonly string[]).includes(cost)).join(', ');
/** The schedules that can draw data-parallel workers rather than pipeline stages as rows. */
const drawsWorkers = (): string =>
  scheduleNames
    .filter((n) => ([{}, { form: 'data-parallel' }] as Record<string, string>[]).some((form) => SCHEDULES[n].rowName({ stages: 2, microBatches: 2, ...form }) === 'worker'))
    .join(' and ');

export function registerScheduleCommand(program: Command): void {
  program
    .command('schedule')
    .description('generate a pipeline schedule, validate and simulate it, and draw its timeline')
    .argument('<name>', `one of: ${scheduleNames.join(', ')}`)
    .option('-s, --stages <S>', `pipeline stages (workers for ${drawsWorkers()})`, '4')
    .option('-m, --microbatches <M>', 'micro-batches per pipeline', '8')
    .option('-n, --pipelines <N>', `parallel pipelines (${takes('pipelines')})`)
    .option('-a, --advance <A>', `advance forward propagation depth (${takes('advance')}; default S-1)`)
    .option('-v, --virtual-stages <V>', `model chunks per stage (${takes('virtualStages')}; default 2)`)
    .option('--iterations <I>', `batches of M micro-batches (${takes('iterations')}; default 3)`)
    .option('--form <form>', `${takes('form')} form: data-parallel or model-parallel`)
    .option('--forward <t>', 'forward time of a micro-batch on a stage', '1')
    .option('--backward <t>', 'backward time of a micro-batch on a stage', '2')
    .option('--weight-grad <t>', `weight-gradient share of the backward (${costs('weightGrad')}; default backward/2)`)
    .option('--latency <t>', 'point-to-point latency', '0')
    .option('--allreduce <t>', `all-reduce time (${costs('allReduce')}; default: the backward time, so the picture shows the overlap)`)
    .option('--svg <file>', 'write the timeline as SVG')
    .option('--html <file>', 'write the timeline as an HTML page')
    .option('--ascii', 'print the timeline as text (the default when no file is asked for)')
    .option('--actions', 'print every stage\'s actions in the compact text form')
    .option('--json', 'print the figures as JSON')
    .action((name: string, options: ScheduleCommandOptions) => {
      // generateSchedule refuses an unknown name and a bad form, naming the choices
      const form = options.form as ScheduleOptions['form'];
      const schedule = generateSchedule(name as ScheduleName, {
        stages: integer('--stages', options.stages)!,
        microBatches: integer('--microbatches', options.microbatches)!,
        pipelines: integer('--pipelines', options.pipelines),
        advance: integer('--advance', options.advance),
        virtualStages: integer('--virtual-stages', options.virtualStages),
        iterations: integer('--iterations', options.iterations),
        form,
      });
      // the flags give a stage's cost; a stage split into V chunks spends 1/V of it per chunk
      const share = schedule.parts > schedule.stages ? schedule.stages / schedule.parts : 1;
      const result = simulateSchedule(schedule, {
        forward: number('--forward', options.forward) * share,
        backward: number('--backward', options.backward) * share,
        ...(options.weightGrad !== undefined ? { weightGrad: number('--weight-grad', options.weightGrad) * share } : {}),
        p2pLatency: number('--latency', options.latency),
        allReduce: options.allreduce === undefined ? number('--backward', options.backward) : number('--allreduce', options.allreduce),
      });
      if (options.json) {
        console.log(
          JSON.stringify(
            {
              schedule: schedule.name,
              params: schedule.params,
              makespan: result.makespan,
              bubbleFraction: result.bubbleFraction,
              throughput: result.throughput,
              forwardsBeforeFirstBackward: result.analysis.forwardsBeforeFirstBackward,
              peakActivations: result.analysis.peakActivations,
              weightVersions: result.analysis.weightVersions,
              maxStaleness: result.analysis.maxStaleness,
            },
            null,
            2,
          ),
        );
      }
      if (options.svg) {
        writeFileSync(options.svg, renderSvg(result));
        console.log(`wrote ${options.svg}`);
      }
      if (options.html) {
        writeFileSync(options.html, renderHtml(result));
        console.log(`wrote ${options.html}`);
      }
      if (options.actions) console.log(formatSchedule(schedule));
      if (options.json) return;
      if (options.ascii || (!options.svg && !options.html)) console.log(renderAscii(result));
      else console.log([scheduleTitle(result), ...summarize(result)].join('\n'));
    });
}
