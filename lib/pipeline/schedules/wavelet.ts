import { InvalidArgumentError } from '../../errors.js';
import { withCommunication } from '../communication.js';
import { type Action, type Schedule, buildSchedule, makeAction } from '../schedule.js';
import { type ScheduleOptions, WAVELET_FORMS, checkOptions, checkUnits } from './options.js';
import { describeValue } from '../../validate.js';

/**
 * Wavelet tick-tock: two waves of the same job, the tock wave half an iteration behind the tick
 * wave, so that one wave's forward (memory rising) runs beside the other's backward (memory
 * falling).
 *
 * `data-parallel` (default): S workers, each with two model replicas (tick = pipeline 2x, tock =
 * pipeline 2x+1), M batches per wave. Per worker: tock B(t-1), tick F(t), tick B(t), tock F(t),
 * so one wave's activations are freed before the other's forward stores its own (the worker's
 * peak is one wave's, plain data parallelism's); each wave's gradient is all-reduced across
 * workers while the other wave computes, and applied before that wave's next forward. What a wave's `allReduce` sums (ALGORITHMS.md section 5): on
 * each worker, the wave's gradient averaged with the other wave's latest gradient of the round on
 * that worker (tick's first has none, and goes alone), summed over the S workers of its wave
 * (`allReduce` pipeline 0: the tick replicas, 1: the tock replicas); the wave's `optimizerStep`
 * applies that sum over S.
 *
 * `model-parallel`: S devices and S model parts; micro-batches go in waves of S. At forward step
 * t device x runs part t on micro-batch `(x - t) mod S` of the current wave (so a micro-batch
 * moves to the next device each step), backward steps run the parts in reverse; the forward steps
 * of wave r+1 (tock) interleave with the backward steps of wave r (tick). Each device runs every
 * part, so each part is all-reduced across devices and stepped once, after the last wave's
 * backward: every pass of the M micro-batches reads the same weights and the update applies the
 * mean of their gradients, as GPipe's does (a wave's forward runs before the previous wave's
 * backward of the same part, so a step between waves would mix weight versions).
 *
 * @category Pipeline schedules
 */
export function wavelet(options: ScheduleOptions): Schedule {
  const { S, M } = checkOptions('wavelet', options);
  const form = options.form ?? 'data-parallel';
  if (form === 'data-parallel') {
    // two replicas per worker: tick and tock
    checkUnits('wavelet (data-parallel)', S, M, { replicas: 2 }, []);
    return waveletDataParallel(S, M);
  }
  if (form === 'model-parallel') return waveletModelParallel(S, M);
  throw new InvalidArgumentError(`wavelet: form must be one of ${WAVELET_FORMS.map((f) => `"${f}"`).join(', ')}, got ${describeValue(form)}`);
}

function waveletDataParallel(S: number, M: number): Schedule {
  const actions: Action[][] = [];
  for (let x = 0; x < S; x++) {
    const row: Action[] = [];
    const tick = { part: 0, pipeline: 2 * x };
    const tock = { part: 0, pipeline: 2 * x + 1 };
    const backward = (wave: typeof tick, w: number, t: number): void => {
      row.push(makeAction('backward', x, wave.part, t, wave.pipeline, -1, -1));
      row.push(makeAction('allReduce', x, 0, t, w, -1, -1));
    };
    const step = (wave: typeof tick, t: number): void => {
      row.push(makeAction('optimizerStep', x, wave.part, t, wave.pipeline, -1, -1));
    };
    // A wave's backward runs before the other wave's forward, so the worker never holds both
    // waves' activations: the tick's peak (after its forward) meets the tock's trough (its
    // backward done) and the reverse, as the paper's half-iteration offset arranges on a device.
    // Each wave's all-reduce runs while the other wave computes a forward and a backward; its step
    // comes just before that wave's next forward.
    for (let t = 0; t < M; t++) {
      if (t > 0) {
        backward(tock, 1, t - 1);
        step(tick, t - 1);
      }
      row.push(makeAction('forward', x, 0, t, 2 * x, -1, -1));
      backward(tick, 0, t);
      if (t > 0) step(tock, t - 1);
      row.push(makeAction('forward', x, 0, t, 2 * x + 1, -1, -1));
    }
    backward(tock, 1, M - 1);
    step(tick, M - 1);
    step(tock, M - 1);
    actions.push(row);
  }
  return buildSchedule({
    name: 'wavelet',
    stages: S,
    parts: 1,
    pipelines: 2 * S,
    microBatches: M,
    actions,
    params: { S, M, form: 'data-parallel' },
  }, false);
}

function waveletModelParallel(S: number, M: number): Schedule {
  const rounds = Math.ceil(M / S); // waves
  const actions: Action[][] = [];
  for (let x = 0; x < S; x++) {
    const row: Action[] = [];
    const batch = (r: number, t: number): number => r * S + ((((x - t) % S) + S) % S);
    const forwardStep = (r: number, t: number): void => {
      const m = batch(r, t);
      if (m < M) row.push(makeAction('forward', x, t, m, 0, -1, -1));
    };
    const backwardStep = (r: number, q: number): void => {
      const t = S - 1 - q;
      const m = batch(r, t);
      if (m < M) row.push(makeAction('backward', x, t, m, 0, -1, -1));
    };
    for (let t = 0; t < S; t++) forwardStep(0, t);
    for (let r = 0; r < rounds; r++) {
      for (let q = 0; q < S; q++) {
        backwardStep(r, q);
        if (r + 1 < rounds) forwardStep(r + 1, q);
      }
    }
    for (let t = 0; t < S; t++) row.push(makeAction('allReduce', x, t, M - 1, 0, -1, -1));
    for (let t = 0; t < S; t++) row.push(makeAction('optimizerStep', x, t, M - 1, 0, -1, -1));
    actions.push(row);
  }
  return withCommunication(
    buildSchedule({ name: 'wavelet', stages: S, parts: S, microBatches: M, actions, params: { S, M, form: 'model-parallel' } }, false),
  );
}
