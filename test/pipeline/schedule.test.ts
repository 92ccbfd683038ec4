// The representation (text form, shape checks) and the validator (dependencies, deadlock).
import t from 'tap';

import { InvalidArgumentError, InvalidScheduleError } from '../../lib/errors.js';
import {
  action,
  createSchedule,
  formatAction,
  formatSchedule,
  parseAction,
  parseSchedule,
  simulateSchedule,
  validateSchedule,
  withCommunication,
} from '../../lib/pipeline/index.js';

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

const M2 = { microBatches: 2 };

t.test('a correct hand-written schedule validates', async (t) => {
  const s = parseSchedule(['0F0 0sa0>1 0F1 0sa1>1 0rg0<1 0B0 0rg1<1 0B1 0U', '1ra0<0 1F0 1B0 1ra1<0 1sg0>0 1F1 1B1 1sg1>0 1U'], M2);
  const a = validateSchedule(s);
  t.same(a.peakActivations, [2, 1]);
  t.same(a.maxStaleness, [0, 0]);
  t.equal(a.unappliedGradients, 0);
});

t.test('invalid schedules name the first broken action', async (t) => {
  const cases: [string, string[], { microBatches: number }, RegExp][] = [
    ['backward before forward', ['0B0 0F0 0U'], { microBatches: 1 }, /stage 0, action #0 \(0B0\): its forward has not run/],
    ['activation never received', ['0F0 0sa0>1 0rg0<1 0B0', '1F0 1B0 1sg0>0'], { microBatches: 1 }, /stage 1, action #0 \(1F0\): its input from stage 0 .* insert "1ra0<0"/],
    ['send without receive', ['0F0 0sa0>1 0B0', '1ra0<0 1F0 1B0'], { microBatches: 1 }, /stage 0, action #2 \(0B0\): its input from stage 1/],
    ['forwarded twice', ['0F0 0F0 0B0'], { microBatches: 1 }, /stage 0, action #1 \(0F0\): forward .* second time/],
    ['never backwarded', ['0F0 0F1 0B0'], M2, /micro-batch 1, part 0 is never backwarded/],
    ['future version', ['0F0@1 0B0 0U'], { microBatches: 1 }, /\(0F0@1\): reads weight version 1/],
    ['backward on another stage', ['0F0 0sa0>1 0B1', '1ra0<0 1F0 1B0 1F1 1sg0>0'], M2, /never forwarded|must run on stage/],
    ['unmatched receive', ['0F0 0rg0<1 0B0', '1F0 1B0'], { microBatches: 1 }, /part 0 has no previous part|never sends|runs on/],
    ['restore without stash', ['0F0 0R0 0B0'], { microBatches: 1 }, /\(0R0\): the stash/],
  ];
  for (const [name, lines, shape, pattern] of cases) {
    t.throws(() => validateSchedule(parseSchedule(lines, shape)), pattern, name);
    t.throws(() => validateSchedule(parseSchedule(lines, shape)), { code: 'ERR_INVALID_SCHEDULE' }, name);
  }
});

t.test('blocking sends in the naive 1F1B order deadlock, and withCommunication repairs them', async (t) => {
  // stage 0 blocks sending micro-batch 1 while stage 1 blocks sending the gradient of micro-batch 0
  const naive = parseSchedule(['0F0 0sa0>1 0F1 0sa1>1 0rg0<1 0B0 0rg1<1 0B1', '1ra0<0 1F0 1B0 1sg0>0 1ra1<0 1F1 1B1 1sg1>0'], M2);
  t.throws(() => validateSchedule(naive), /deadlock under blocking point-to-point at stage 0, action #3 \(0sa1>1\)/);
  t.throws(() => validateSchedule(naive), InvalidScheduleError);
  const repaired = withCommunication(naive);
  t.doesNotThrow(() => validateSchedule(repaired));
  t.ok(simulateSchedule(repaired).makespan > 0);
});

t.test('an all-reduce that not every stage joins blocks the step that waits for it', async (t) => {
  const s = parseSchedule(['0F0/0 0B0/0 0A0/0 0U0/0', '1F0/0p1 1B0/0p1 1U0/0p1'], { microBatches: 1, parts: 1, pipelines: 2 });
  t.doesNotThrow(() => validateSchedule(s), 'stage 1 takes no part, so the reduction has one participant');
  // each stage's step waits for a reduction the other stage only joins after its own step
  const blocked = parseSchedule(
    ['0F0/0 0B0/0 0F1/0 0B1/0 0A0/0 0U0/0 0A1/0 0U1/0', '1F0/0p1 1B0/0p1 1F1/0p1 1B1/0p1 1A1/0 1U1/0p1 1A0/0 1U/0p1'],
    { microBatches: 2, parts: 1, pipelines: 2 },
  );
  t.throws(() => validateSchedule(blocked), /deadlock .* at stage 0, action #5 \(0U0\): .*all-reduce/);
});

t.test('validateSchedule refuses what is not a schedule', async (t) => {
  t.throws(() => validateSchedule(null as never), { code: 'ERR_INVALID_ARGUMENT' });
  t.throws(() => withCommunication({} as never), { code: 'ERR_INVALID_ARGUMENT' });
});
