/**
 * A misspelled option is never silently ignored: every options object of the public entries
 * rejects unknown keys with ERR_INVALID_ARGUMENT, naming the key and, where one is close, the
 * intended one. (`new Adam(p, { lr: 1, weight_decay: 0.1, beta1: 0.8 })` used to be accepted, both
 * options doing nothing.)
 */
import t from 'tap';

import {
  Adam,
  AdamW,
  DataParallelTrainer,
  LocalCommunicator,
  MLP,
  ParamSet,
  SGD,
  allreduceAndStep,
  generateSchedule,
  launch,
  renderAscii,
  simulateSchedule,
  syntheticDataset,
  FlatBuffer,
} from '../dist/index.js';

t.test('the example: Adam with weight_decay and beta1', async (t) => {
  const p = new ParamSet({ w: [4] });
  t.throws(() => new Adam(p, { lr: 1, weight_decay: 0.1, beta1: 0.8 } as never), {
    code: 'ERR_INVALID_ARGUMENT',
    message: /unknown option 'weight_decay'; did you mean 'weightDecay'\?/,
  });
  t.throws(() => new Adam(p, { lr: 1, beta1: 0.8 } as never), { message: /unknown option 'beta1'; did you mean 'betas'\?/ });
  p.dispose();
});

t.test('every options object rejects an unknown key', async (t) => {
  const p = new ParamSet({ w: [4] });
  const comm = await LocalCommunicator.create({ group: `unknown-options-${process.pid}`, rank: 0, size: 1 });
  const optimizer = new SGD(p, { lr: 0.1 });
  const buffer = FlatBuffer.allocate(8);
  const simulated = simulateSchedule(generateSchedule('gpipe', { stages: 2, microBatches: 2 }));
  const bogus = { bogusOption: 1 };
  const cases: [string, (extra: object) => unknown, string?][] = [
    ['SGD', (x) => new SGD(p, { lr: 0.1, ...x })],
    ['SGD momentun', () => new SGD(p, { lr: 0.1, momentun: 0.9 } as never), 'momentum'],
    ['Adam', (x) => new Adam(p, { lr: 0.1, ...x })],
    ['AdamW epsilon', () => new AdamW(p, { lr: 0.1, epsilon: 1e-8 } as never), 'eps'],
    ['compensation', (x) => new SGD(p, { lr: 0.1, compensation: { lambda: 0.1, ...x } })],
    ['compensation lamda', () => new SGD(p, { lr: 0.1, compensation: { lamda: 0.1 } as never }), 'lambda'],
    ['prediction sapipe', (x) => new SGD(p, { lr: 0.1, prediction: { kind: 'sapipe', estimate: 'local', ...x } })],
    ['prediction pipeoptim', (x) => new SGD(p, { lr: 0.1, prediction: { kind: 'pipeoptim', stage: 0, stages: 2, ...x } })],
    ['prediction linear step', () => new SGD(p, { lr: 0.1, prediction: { kind: 'linear', step: 1 } as never }), 'steps'],
    ['spikeCompensation', (x) => new SGD(p, { lr: 0.1, momentum: 0.9, spikeCompensation: { delay: 1, ...x } })],
    ['ParamSet', (x) => new ParamSet({ w: [1] }, x)],
    ['MLP', (x) => new MLP([2, 2], x)],
    ['LocalCommunicator.create', (x) => LocalCommunicator.create({ group: 'never-joined', rank: 0, size: 1, ...x })],
    ['LocalCommunicator.create timeout', () => LocalCommunicator.create({ group: 'never', rank: 0, size: 1, timeout: 5 } as never), 'timeoutMs'],
    ['allreduce', (x) => comm.allreduce(buffer, { op: 'sum', ...x })],
    ['reduceScatter', (x) => comm.reduceScatter(buffer, buffer, { ...x })],
    ['allreduceAndStep', (x) => allreduceAndStep(comm, optimizer, { ...x })],
    ['DataParallelTrainer.create', (x) => DataParallelTrainer.create({ comm, params: p, mode: 'sync', optimizer: { kind: 'sgd', lr: 0.1 }, ...x })],
    ['DataParallelTrainer optimizer', (x) => DataParallelTrainer.create({ comm, params: p, mode: 'sync', optimizer: { kind: 'sgd', lr: 0.1, ...x } })],
    ['DataParallelTrainer optimizer weight_decay', () => DataParallelTrainer.create({ comm, params: p, mode: 'sync', optimizer: { kind: 'adam', lr: 0.1, weight_decay: 1 } as never }), 'weightDecay'],
    ['generateSchedule', (x) => generateSchedule('1f1b', { stages: 2, microBatches: 2, ...x })],
    ['generateSchedule microbatches', () => generateSchedule('1f1b', { stages: 2, microbatches: 2 } as never), 'microBatches'],
    ['syntheticDataset', (x) => syntheticDataset({ count: 4, features: 2, classes: 2, ...x })],
    ['launch', (x) => launch({ script: 'x.js', nproc: 1, ...x })],
    ['renderAscii', (x) => renderAscii(simulated, { ...x })],
  ];
  for (const [what, call, intended] of cases) {
    const error = await (async () => {
      try {
        await call(bogus);
      } catch (e) {
        return e as { code?: string; message?: string };
      }
      return undefined;
    })();
    t.equal(error?.code, 'ERR_INVALID_ARGUMENT', `${what}: rejected`);
    if (intended) t.match(error?.message, new RegExp(`did you mean '${intended}'`), `${what}: suggests ${intended}`);
    else t.match(error?.message, /unknown option 'bogusOption'/, `${what}: names the key`);
  }
  optimizer.dispose();
  buffer.dispose();
  p.dispose();
  comm.destroy();
});
