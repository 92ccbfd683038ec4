// AvgPipe's tuned setting against 1F1B and GPipe on the same work, measured, with the tuner's
// prediction beside: a 1F1B run of `sapipe train pipeline` writes the profile it measured, `sapipe
// tune` picks (N, M, A, micro-batch) from it, and each setting then trains the same epochs of the
// same samples, once per seed (the settings in turns, so that a busy moment of the machine does not
// favour one). Throughput is samples trained per second of training wall time over the epochs
// after the first (the first warms up; with one epoch, that one), median over the runs; accuracy is
// the test accuracy after the last epoch, per seed.
//
//   node scripts/experiments/avgpipe-throughput.mjs [--stages 4] [--max-pipelines 2] [--memory-gb 1]
//        [--epochs 1] [--train-samples 4096] [--seeds 1,2,3]
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));
const argv = process.argv.slice(2);
const option = (name, fallback) => {
  const i = argv.indexOf(name);
  return i < 0 ? fallback : argv[i + 1];
};
const stages = option('--stages', '4');
const maxPipelines = option('--max-pipelines', '2');
const memoryGb = option('--memory-gb', '1');
const epochs = Number(option('--epochs', '1'));
const trainSamples = Number(option('--train-samples', '4096'));
const seeds = option('--seeds', '1,2,3').split(',').map(Number);

const dir = mkdtempSync(join(tmpdir(), 'sapipe-avgpipe-tp-'));
const sapipe = (args) => execFileSync(process.execPath, [bin, ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
const common = ['--stages', stages, '--train-samples', String(trainSamples), '--report', join(dir, 'r.html')];
try {
  const profile = join(dir, 'profile.json');
  sapipe(['train', 'pipeline', '--schedule', '1f1b', '--epochs', '1', ...common, '--profile-out', profile, '--json']);
  const tuned = JSON.parse(sapipe(['tune', '--profile', profile, '--memory-gb', memoryGb, '--max-pipelines', maxPipelines, '--top', '100000', '--json']));
  const plain = tuned.candidates.filter((c) => c.pipelines === 1 && c.advance === 0).sort((a, b) => b.samplesPerSecond - a.samplesPerSecond)[0];
  const b = tuned.best;
  // The tuner's grid holds N = 1 with A = 0 (1F1B) and with A >= M + S - 2 (all forwards first, GPipe's order).
  const find = (m, gpipeOrder) => tuned.candidates.find((c) => c.pipelines === 1 && c.microBatches === m && (gpipeOrder ? c.advance >= m + Number(stages) - 2 : c.advance === 0))?.samplesPerSecond;
  const settings = [
    { name: `avgpipe N=${b.pipelines} M=${b.microBatches} A=${b.advance} b=${b.microBatchSize} (tuned)`, args: ['--schedule', 'avgpipe', '--pipelines', String(b.pipelines), '--microbatches', String(b.microBatches), '--microbatch-size', String(b.microBatchSize), '--advance', String(b.advance)], predicted: b.samplesPerSecond, perRound: b.pipelines * b.microBatches * b.microBatchSize },
    { name: `1f1b M=${plain.microBatches} b=${plain.microBatchSize} (the tuner's best 1F1B)`, args: ['--schedule', '1f1b', '--microbatches', String(plain.microBatches), '--microbatch-size', String(plain.microBatchSize)], predicted: plain.samplesPerSecond, perRound: plain.microBatches * plain.microBatchSize },
    { name: '1f1b M=8 b=16 (the profiled run)', args: ['--schedule', '1f1b', '--microbatches', '8', '--microbatch-size', '16'], predicted: find(8, false), perRound: 128 },
    { name: 'gpipe M=8 b=16', args: ['--schedule', 'gpipe', '--microbatches', '8', '--microbatch-size', '16'], predicted: find(8, true), perRound: 128 },
  ];
  const measured = settings.map(() => []);
  const accuracy = settings.map(() => []);
  for (const seed of seeds) {
    settings.forEach((s, i) => {
      const out = JSON.parse(sapipe(['train', 'pipeline', ...s.args, '--epochs', String(epochs), '--seed', String(seed), ...common, '--json']));
      const timed = out.epochs.length > 1 ? out.epochs.slice(1) : out.epochs;
      const samples = Math.floor(trainSamples / s.perRound) * s.perRound * timed.length;
      measured[i].push(samples / (timed.reduce((a, e) => a + e.wallMs, 0) / 1000));
      accuracy[i].push(out.epochs[out.epochs.length - 1].accuracy * 100);
    });
    process.stderr.write(`seed ${seed} done\n`);
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const baseline = median(measured[2]);
  console.log(`tuner: ${tuned.explanation.join('; ')}\n`);
  console.log(`${stages} stages, ${trainSamples} training samples x ${epochs} epoch(s), seeds ${seeds.join(', ')}, the settings in turns\n`);
  console.log('| setting | tuner, samples/s | measured samples/s, median (min-max) | tuner / measured | measured / 1F1B M=8 | test accuracy, mean (per seed) |');
  console.log('|---|---:|---:|---:|---:|---|');
  settings.forEach((s, i) => {
    const m = measured[i];
    const ratio = s.predicted === undefined ? '-' : (s.predicted / median(m)).toFixed(2);
    console.log(
      `| ${s.name} | ${s.predicted === undefined ? '-' : s.predicted.toFixed(0)} | ${median(m).toFixed(0)} (${Math.min(...m).toFixed(0)}-${Math.max(...m).toFixed(0)}) | ${ratio} | ${(median(m) / baseline).toFixed(2)} | ` +
        `${mean(accuracy[i]).toFixed(2)}% (${accuracy[i].map((a) => a.toFixed(2)).join(', ')}) |`,
    );
  });
} finally {
  rmSync(dir, { recursive: true, force: true });
}
