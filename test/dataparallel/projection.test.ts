/**
 * The data-parallel projection against hand-computed cases (ring all-reduce 2(W-1)/W x bytes /
 * bandwidth + 2(W-1) x latency; sync = compute + all-reduce; SAPipe = max of the two), and its
 * rejection of bad profiles and inputs.
 */
import t, { type Test } from 'tap';

import { emulatedMs } from '../../dist/comm/emulation.js';
import { InvalidArgumentError } from '../../dist/errors.js';
import { parseDataParallelProfile, projectDataParallel } from '../../dist/dataparallel/projection.js';

const close = (t: Test, actual: number, expected: number, what: string): void => {
  t.ok(Math.abs(actual - expected) <= 1e-9 * Math.max(1, Math.abs(expected)), `${what}: ${actual} ~ ${expected}`);
};

t.test('compute-bound: 10 ms compute, 5 MB gradient, 10 Gbit/s', (t) => {
  // 1 250 000 fp32 parameters = 5e6 bytes; at 10 Gbit/s a byte takes 8e-7 ms.
  const p = projectDataParallel({ profile: { computeMs: 10, params: 1_250_000, samplesPerStep: 32 }, workers: [1, 2, 4], network: { gbps: 10, latencyUs: 5 } });
  t.equal(p.model, true, 'labelled as a model');
  t.equal(p.gradientBytes, 5e6);
  t.same(p.rows.map((r) => r.workers), [1, 2, 4]);
  const [one, two, four] = p.rows;
  // One worker: nothing to reduce.
  close(t, one!.allreduceMs, 0, 'W=1 all-reduce');
  close(t, one!.speedup, 1, 'W=1 speedup');
  close(t, one!.syncSamplesPerSec, 3200, 'W=1 samples/s');
  // W=2: 2*1/2 * 5e6 * 8e-7 = 4 ms, + 2*1*0.005 ms latency.
  close(t, two!.allreduceMs, 4.01, 'W=2 all-reduce');
  close(t, two!.syncStepMs, 14.01, 'W=2 sync step');
  close(t, two!.sapipeStepMs, 10, 'W=2 SAPipe step = compute');
  close(t, two!.speedup, 1.401, 'W=2 speedup');
  close(t, two!.syncSamplesPerSec, (2 * 32 * 1000) / 14.01, 'W=2 sync samples/s');
  close(t, two!.sapipeSamplesPerSec, 6400, 'W=2 SAPipe samples/s');
  close(t, two!.commComputeRatio, 0.401, 'W=2 comm/compute');
  close(t, two!.sapipeScalingEfficiency, 1, 'W=2 SAPipe hides all communication');
  // W=4: 2*3/4 * 5e6 * 8e-7 = 6 ms, + 6 * 0.005 ms.
  close(t, four!.allreduceMs, 6.03, 'W=4 all-reduce');
  close(t, four!.syncStepMs, 16.03, 'W=4 sync step');
  close(t, four!.syncScalingEfficiency, 10 / 16.03, 'W=4 sync scaling efficiency');
  t.end();
});

t.test('network-bound: the all-reduce sets SAPipe\'s pace', (t) => {
  // 1e6 bytes at 1 Gbit/s (8e-6 ms per byte) on 8 workers: 2*7/8 * 8 ms = 14 ms against 2 ms compute.
  const p = projectDataParallel({ profile: { computeMs: 2, modelBytes: 1e6, samplesPerStep: 1 }, workers: [8], network: { gbps: 1 } });
  const r = p.rows[0]!;
  close(t, r.allreduceMs, 14, 'all-reduce');
  close(t, r.syncStepMs, 16, 'sync step');
  close(t, r.sapipeStepMs, 14, 'SAPipe step = all-reduce');
  close(t, r.speedup, 16 / 14, 'speedup');
  close(t, r.commComputeRatio, 7, 'comm/compute');
  t.same(p.network, { gbps: 1, latencyUs: 0 }, 'latency defaults to 0');
  t.end();
});

t.test('the all-reduce cost is emulation.ts\'s (one model for emulation and projection)', (t) => {
  const network = { gbps: 3.5, latencyUs: 12 };
  const p = projectDataParallel({ profile: { computeMs: 7, params: 123_457, samplesPerStep: 3 }, workers: [3, 16, 64], network });
  for (const r of p.rows) t.equal(r.allreduceMs, emulatedMs(network, 'allreduce', 4 * 123_457, r.workers), `W=${r.workers}`);
  t.end();
});

t.test('profiles: JSON text or object, checked', (t) => {
  t.same(parseDataParallelProfile('{"computeMs": 1.5, "params": 10, "samplesPerStep": 4, "source": "x"}'), { computeMs: 1.5, params: 10, samplesPerStep: 4, source: 'x' });
  const bad: [unknown, RegExp][] = [
    ['{', /not valid JSON/],
    [[], /must be an object/],
    [null, /must be an object/],
    [{ params: 10, samplesPerStep: 1 }, /computeMs must be a finite number > 0/],
    [{ computeMs: 0, params: 10, samplesPerStep: 1 }, /computeMs must be a finite number > 0/],
    [{ computeMs: 1, samplesPerStep: 1 }, /give params .* or modelBytes/],
    [{ computeMs: 1, params: 10, modelBytes: 40, samplesPerStep: 1 }, /not both/],
    [{ computeMs: 1, params: 1.5, samplesPerStep: 1 }, /params must be a positive integer/],
    [{ computeMs: 1, modelBytes: -1, samplesPerStep: 1 }, /modelBytes must be/],
    [{ computeMs: 1, params: 10 }, /samplesPerStep must be/],
    [{ computeMs: 1, params: 10, samplesPerStep: 1, computeMS: 2 }, /unknown field\(s\) computeMS/],
    [{ computeMs: 1, params: 10, samplesPerStep: 1, source: 3 }, /source must be a string/],
  ];
  for (const [input, message] of bad) t.throws(() => parseDataParallelProfile(input), { code: 'ERR_INVALID_ARGUMENT', message }, JSON.stringify(input) ?? String(input));
  t.end();
});

t.test('bad projection inputs throw InvalidArgumentError', (t) => {
  const profile = { computeMs: 1, params: 10, samplesPerStep: 1 };
  const cases: [unknown, RegExp][] = [
    [{ profile, workers: [], network: { gbps: 1 } }, /at least one worker count/],
    [{ profile, workers: [0], network: { gbps: 1 } }, /integer in \[1,/],
    [{ profile, workers: [2.5], network: { gbps: 1 } }, /integer in \[1,/],
    [{ profile, workers: [2], network: { gbps: 0 } }, /gbps must be/],
    [{ profile, workers: [2], network: { gbps: 1, latencyUs: -1 } }, /latencyUs must be/],
    [{ profile, workers: [2] }, /network must be an object/],
    [{ profile: { computeMs: -1, params: 10, samplesPerStep: 1 }, workers: [2], network: { gbps: 1 } }, /computeMs/],
  ];
  for (const [input, message] of cases) {
    let thrown: unknown;
    try {
      projectDataParallel(input as Parameters<typeof projectDataParallel>[0]);
    } catch (error) {
      thrown = error;
    }
    t.ok(thrown instanceof InvalidArgumentError, `${String(message)}: an InvalidArgumentError`);
    t.match((thrown as Error | undefined)?.message, message);
  }
  t.end();
});
