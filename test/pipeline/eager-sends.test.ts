/**
 * A stage posts each send as soon as its message exists, not where its row puts it
 * (StageRunner.runRound; StageTransport.independentSends): the last stage of 1F1B places the send
 * of micro-batch 0's gradient after the receive of micro-batch 1's activation. Against a scripted
 * first stage that hands out that activation only once the gradient has arrived, the runner
 * finishes the round with sends that go ahead, and keeps its row's order (receive, then send)
 * where the transport says its sends are not independent; each peer's sends stay in row order.
 */
import t from 'tap';

import { FlatBuffer, SGD, Sequential, StageRunner, generateSchedule, type StageTransport } from '../../dist/index.js';
import { CLASSES, FEATURES, LAYERS, SEED, evenBoundaries } from './runtime-helpers.js';

const M = 3;
const B = 2;
const schedule = generateSchedule('1f1b', { stages: 2, microBatches: M });

/** Stage 0 as a script: activation k is handed out only after gradient k - 1 arrived (from k = 1 on), as a peer that must see the gradient first would. */
function scriptedPeer(independentSends: boolean, width: number): StageTransport & { log: string[] } {
  const log: string[] = [];
  let gradients = 0;
  let activations = 0;
  const waiting: (() => void)[] = [];
  return {
    size: 2,
    independentSends,
    log,
    async send(buffer, peer) {
      if (peer !== 0 || !(buffer instanceof FlatBuffer)) throw new Error('unexpected send');
      log.push(`send g${gradients}`);
      gradients++;
      for (const wake of waiting.splice(0)) wake();
    },
    async recv(buffer, peer) {
      if (peer !== 0 || !(buffer instanceof FlatBuffer) || buffer.length !== B * width) throw new Error('unexpected recv');
      const k = activations++;
      log.push(`recv a${k}`);
      // without the gradient of k - 1, the activation never comes: a bounded wait fails the test
      const deadline = Date.now() + 2_000;
      while (k > 0 && gradients < k) {
        if (Date.now() > deadline) throw new Error(`activation ${k} waited for gradient ${k - 1}, which was never sent`);
        await new Promise<void>((resolve) => {
          waiting.push(resolve);
          setTimeout(resolve, 50);
        });
      }
      buffer.array.fill(0.1 * (k + 1));
    },
  };
}

const boundaries = evenBoundaries(LAYERS.length, 2);
const labels = Int32Array.from({ length: B }, (_, i) => i % CLASSES);
const source = { batch: B, input: () => FlatBuffer.allocate(B * FEATURES), labels: () => labels };

async function runLastStage(independentSends: boolean): Promise<{ log: string[]; error?: unknown }> {
  const model = Sequential.part(LAYERS, boundaries, 1, { seed: SEED });
  const optimizer = new SGD(model.params, { lr: 0.1 });
  const peer = scriptedPeer(independentSends, model.inputSize);
  const runner = new StageRunner(1, schedule, peer, [{ part: 1, model, optimizer, backwardPredictionRatio: 0 }]);
  try {
    await runner.runRound(source);
    return { log: peer.log };
  } catch (error) {
    return { log: peer.log, error };
  } finally {
    runner.dispose();
    optimizer.dispose();
    model.dispose();
  }
}

t.test("the last stage's row sends gradient k after receiving activation k + 1", async (t) => {
  const row = schedule.actions[1]!.filter((a) => a.kind === 'recvActivation' || a.kind === 'sendGradient').map((a) => `${a.kind === 'recvActivation' ? 'recv a' : 'send g'}${a.microBatch}`);
  t.same(row, ['recv a0', 'recv a1', 'send g0', 'recv a2', 'send g1', 'send g2'], "1F1B's row, as the generator orders it");
});

t.test('independent sends go ahead of the receive the row puts first', async (t) => {
  const { log, error } = await runLastStage(true);
  t.equal(error, undefined, 'the round completes');
  t.same(log, ['recv a0', 'send g0', 'recv a1', 'send g1', 'recv a2', 'send g2'], 'each gradient leaves as soon as its backward made it');
});

t.test('sends that are not independent keep the row order', async (t) => {
  const { log, error } = await runLastStage(false);
  t.same(log.slice(0, 2), ['recv a0', 'recv a1'], 'the receive of activation 1 is posted before gradient 0 is sent');
  t.match(error, { message: /gradient 0, which was never sent/ }, 'so the scripted peer, which needs the gradient first, never answers');
});
