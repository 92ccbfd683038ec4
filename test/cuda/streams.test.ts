/**
 * Streams of their own on a device (DeviceStream), and the device links between pipeline stages.
 * On the CUDA plugin over host memory (test/cuda/emulated.test.ts imports this file), streams
 * finish on enqueue, but the plugin checks the order a GPU would need between them (a stream
 * touching memory another stream touched, with no event wait or host synchronisation between, is
 * refused with ERR_INTERNAL "stream order") and, with SAPIPE_FAKE_STREAM_LOG, logs the stream of
 * each operation: so there the tests also check which stream the work went to, and that a missing
 * wait is refused rather than passing (device-pipeline.test.ts checks the stages' streams). On a
 * GPU they check the results only (the order itself is compute-sanitizer's, see docs/cuda.md).
 * With neither, they assert why no device is usable.
 */
import t, { type Test } from 'tap';

import { cudaStatus, DeviceBuffer, DeviceEvents, DeviceStream } from '../../dist/device/index.js';
import { BackendUnavailableError, InternalError, InvalidArgumentError } from '../../dist/errors.js';
import { modelDevice, relu } from '../../dist/nn/ops.js';
import { DeviceLinks } from '../../dist/pipeline/runtime/device-links.js';
import { emulated, logged } from '../helpers/stream-log.js';

const gpu = cudaStatus().available;

function deviceTest(name: string, fn: (t: Test) => Promise<void> | void): void {
  t.test(`GPU: ${name}`, async (t) => {
    if (!gpu) {
      t.throws(() => DeviceStream.create({ device: 'cuda:0' }), BackendUnavailableError, 'no usable device: a stream says so, typed');
      return;
    }
    await fn(t);
  });
}

deviceTest('DeviceStream.run puts the operations on the stream, only while fn runs, and refuses an async fn; idle() waits without blocking', async (t) => {
  const stream = DeviceStream.create({ device: 'cuda:0' });
  const x = DeviceBuffer.from(new Float32Array([-1, 2, -3, 4]), { device: 'cuda:0' });
  try {
    t.equal(stream.run(() => 7), 7, "run returns fn's result");
    t.throws(() => stream.run(() => Promise.resolve(1)), InvalidArgumentError, 'an async fn is refused');
    t.throws(() => stream.run(() => { throw new RangeError('inner'); }), RangeError, "fn's error propagates");
    stream.run(() => relu({ buffer: x }, { buffer: x }, 4));
    await stream.idle(10_000);
    t.same(Array.from(x.copyToHost(new Float32Array(4))), [0, 2, 0, 4], 'idle() resolves once the work has run');
    await t.rejects(stream.idle(0), InvalidArgumentError, 'a timeout of 0 is refused');
  } finally {
    x.dispose();
    stream.dispose();
  }
  t.throws(() => stream.run(() => 1), { code: 'ERR_DISPOSED' });
  await t.rejects(stream.idle(1000), { code: 'ERR_DISPOSED' });
});

deviceTest('two streams: an event wait orders them; a planted missing wait is refused where the plugin can tell', async (t) => {
  const [a, b] = [DeviceStream.create({ device: 'cuda:0' }), DeviceStream.create({ device: 'cuda:0' })];
  const events = DeviceEvents.create(1, { device: 'cuda:0' });
  const x = DeviceBuffer.from(new Float32Array([-1, 2, -3, 4]), { device: 'cuda:0' });
  const y = DeviceBuffer.allocate(4, { device: 'cuda:0' });
  try {
    const { ops } = await logged(async () => {
      a.run(() => relu({ buffer: x }, { buffer: x }, 4));
      a.record(events, 0);
      b.wait(events, 0);
      b.run(() => relu({ buffer: y }, { buffer: x }, 4));
    });
    if (emulated) {
      t.equal(ops.length, 2);
      t.not(ops[0]!.stream, ops[1]!.stream, 'each run on its own stream');
      t.ok(ops.every((o) => o.stream !== 0), 'none on the default stream');
      // a writing x while b may still be reading it is refused as well (write after read).
      t.throws(() => a.run(() => relu({ buffer: x }, { buffer: x }, 4)), InternalError, 'a write racing the read on another stream is refused');
      b.record(events, 0);
      a.wait(events, 0);
      // The planted violation: a writes x again (now after b's read), and b reads it with no wait in between.
      a.run(() => relu({ buffer: x }, { buffer: x }, 4));
      t.throws(() => b.run(() => relu({ buffer: y }, { buffer: x }, 4)), InternalError, 'a read racing another stream is refused, typed');
      t.throws(() => b.run(() => relu({ buffer: y }, { buffer: x }, 4)), /stream order/, 'and says why');
    }
    a.synchronize();
    b.synchronize();
    t.same(Array.from(y.copyToHost(new Float32Array(4))), [0, 2, 0, 4]);
  } finally {
    for (const r of [x, y, events, a, b]) r.dispose();
  }
});

deviceTest('the device links: a transfer is ordered by events both ways; writing a buffer still being sent is refused', async (t) => {
  const links = new DeviceLinks(2, modelDevice('cuda:0'), 5000);
  const [l0, l1] = [links.transport(0), links.transport(1)];
  const src = DeviceBuffer.from(new Float32Array([-1, 2, -3, 4]), { device: 'cuda:0' });
  const dst = DeviceBuffer.allocate(4, { device: 'cuda:0' });
  const out = DeviceBuffer.allocate(4, { device: 'cuda:0' });
  try {
    t.ok(l0.stream && l1.stream && l0.stream !== l1.stream, 'a stream per stage');
    // Produced on stage 0's stream, received on stage 1's and read there, then rewritten by stage 0.
    l0.stream!.run(() => relu({ buffer: src }, { buffer: src }, 4));
    const sent = l0.send(src, 1);
    await l1.recv(dst, 0);
    await sent;
    l1.stream!.run(() => relu({ buffer: out }, { buffer: dst }, 4));
    l0.stream!.run(() => relu({ buffer: src }, { buffer: src }, 4));
    l1.stream!.synchronize();
    t.same(Array.from(out.copyToHost(new Float32Array(4))), [0, 2, 0, 4]);
    if (emulated) {
      // Planted: stage 0 writes its buffer after posting the send, before the copy reads it.
      const planted = l0.send(src, 1);
      l0.stream!.run(() => relu({ buffer: src }, { buffer: src }, 4));
      await t.rejects(l1.recv(dst, 0), InternalError, "the copy reading the sender's unordered write is refused, typed");
      await t.rejects(planted, InternalError, 'the send fails with it');
    }
  } finally {
    links.dispose();
    for (const b of [src, dst, out]) b.dispose();
  }
});
