import t from 'tap';

import { InvalidArgumentError, InvalidScheduleError } from '../../lib/errors.js';
import { action, createSchedule, formatAction, formatSchedule, parseAction, parseSchedule } from '../../lib/pipeline/index.js';

t.test('the text form round-trips every kind of action', async (t) => {
  const texts = ['0F1', '1B3@2', '0sa1>1', '1ra1<0', '2sg4>1', '1rg4<2', '3U', '3U7', '0P2', '0S5', '0R5', '2Ep1', '0F4/4', '1A3/0', '1W0p2@1'];
  for (const text of texts) {
    const a = parseAction(text);
    t.equal(formatAction(a), text, text);
  }
  t.same(parseAction('0F1'), { kind: 'forward', stage: 0, part: 0, microBatch: 1, pipeline: 0, version: -1, peer: -1 });
  t.same(parseAction('1B3@2'), { kind: 'backward', stage: 1, part: 1, microBatch: 3, pipeline: 0, version: 2, peer: -1 });
  t.equal(formatAction(action('sendActivation', 0, { microBatch: 2, peer: 1 })), '0sa2>1');
});

t.test('bad text is refused with what to write instead', async (t) => {
  t.throws(() => parseAction('0X1'), InvalidArgumentError);
  t.throws(() => parseAction('0sa1'), /needs its peer stage/);
  t.throws(() => parseAction('0sa1<1'), /needs its peer stage/);
  t.throws(() => parseAction('0F1>2'), /not a send or receive/);
  t.throws(() => parseAction('0F'), /needs a micro-batch/);
  t.throws(() => parseAction(3 as unknown as string), { code: 'ERR_INVALID_ARGUMENT' });
});

t.test('createSchedule checks the shape of every action', async (t) => {
  t.throws(() => createSchedule({ stages: 0, microBatches: 1, actions: [] }), InvalidArgumentError);
  t.throws(() => createSchedule({ stages: 2, microBatches: 1, actions: [[]] }), /one list per stage/);
  t.throws(() => createSchedule({ stages: 1, microBatches: 1, actions: [[action('forward', 1, { microBatch: 0 })]] }), InvalidScheduleError);
  t.throws(() => createSchedule({ stages: 1, microBatches: 1, actions: [[action('forward', 0, { microBatch: 1 })]] }), /stage 0, action #0 \(0F1\): microBatch/);
  t.throws(() => createSchedule({ stages: 1, microBatches: 1, actions: [[action('forward', 0, { microBatch: 0, pipeline: 1 })]] }), /pipeline/);
  t.throws(() => createSchedule({ stages: 2, microBatches: 1, actions: [[action('sendActivation', 0, { microBatch: 0, peer: 0 })], []] }), /peer/);
  t.throws(() => createSchedule({ stages: 1, microBatches: 1, actions: [[{ kind: 'jump' } as never]] }), /unknown kind/);
});

t.test('parseSchedule reads one line per stage, with or without labels', async (t) => {
  const s = parseSchedule(['0: 0F0 0sa0>1 0rg0<1 0B0 0U', '1: 1ra0<0 1F0 1B0 1sg0>0 1U'], { microBatches: 1 });
  t.equal(s.stages, 2);
  t.equal(s.actions[1]!.length, 5);
  t.equal(formatSchedule(s), '0: 0F0 0sa0>1 0rg0<1 0B0 0U\n1: 1ra0<0 1F0 1B0 1sg0>0 1U');
  t.equal(parseSchedule('0F0 0B0\n', { microBatches: 1 }).stages, 1);
});
