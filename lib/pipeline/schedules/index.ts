/**
 * The schedule generators by name.
 */
import { InvalidArgumentError } from '../../errors.js';
import type { Schedule } from '../schedule.js';
import { avgpipe } from './avgpipe.js';
import { gpipe } from './gpipe.js';
import { interleaved1F1B } from './interleaved-1f1b.js';
import { oneFOneB } from './one-f-one-b.js';
import type { ScheduleOptions } from './options.js';
import { pipedream } from './pipedream.js';
import { pipedream2BW } from './pipedream-2bw.js';
import { pipelinedBackprop } from './pipelined-backprop.js';
import { pipeoptim } from './pipeoptim.js';
import { sapipe } from './sapipe.js';
import { spectrain } from './spectrain.js';
import { wavelet } from './wavelet.js';
import { zbH1 } from './zb-h1.js';
import { describeValue } from '../../validate.js';

export { advanceForwardOrder, forwardsBeforeBackward } from './advance-forward.js';
export type { Step } from './advance-forward.js';
export type { ScheduleOptions } from './options.js';
export { avgpipe, gpipe, interleaved1F1B, oneFOneB, pipedream, pipedream2BW, pipelinedBackprop, pipeoptim, sapipe, spectrain, wavelet, zbH1 };

/** Names accepted by {@link generateSchedule} and the `sapipe schedule` command. @category Pipeline schedules */
export const scheduleNames = [
  'gpipe',
  '1f1b',
  'interleaved-1f1b',
  'pipedream',
  'pipedream-2bw',
  'pipeoptim',
  'spectrain',
  'avgpipe',
  'wavelet',
  'pipelined-backprop',
  'sapipe',
  'zb-h1',
] as const;

/** @category Pipeline schedules */
export type ScheduleName = (typeof scheduleNames)[number];

const generators: Record<ScheduleName, (options: ScheduleOptions) => Schedule> = {
  gpipe,
  '1f1b': oneFOneB,
  'interleaved-1f1b': interleaved1F1B,
  pipedream,
  'pipedream-2bw': pipedream2BW,
  pipeoptim,
  spectrain,
  avgpipe,
  wavelet,
  'pipelined-backprop': pipelinedBackprop,
  sapipe,
  'zb-h1': zbH1,
};

/** Builds the named schedule. @category Pipeline schedules */
export function generateSchedule(name: ScheduleName, options: ScheduleOptions): Schedule {
  if (typeof name !== 'string' || !Object.hasOwn(generators, name)) {
    throw new InvalidArgumentError(`unknown schedule ${typeof name === 'string' ? `"${name}"` : describeValue(name)}; use one of: ${scheduleNames.join(', ')}`);
  }
  return generators[name](options);
}
