/**
 * `sapipe train pipeline` end to end in a child process: trains, prints the tables, writes the
 * report with the measured and simulated timelines, and refuses bad options with a message.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../../bin/sapipe.js', import.meta.url));

t.test('trains on MNIST, prints measured against simulated, writes the report', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-train-'));
  const report = join(dir, 'report.html');
  const { stdout } = await run(process.execPath, [bin, 'train', 'pipeline', '--schedule', 'pipeoptim', '--stages', '3', '--boundaries', '2,4', '--epochs', '2', '--train-samples', '3000', '--kernel-threads', '1', '--report', report, '--json'], { timeout: 120_000 });
  const result = JSON.parse(stdout) as { epochs: { accuracy: number; loss: number }[]; measured: { makespanMs: number; bubbleFraction: number }; simulated: { makespanMs: number }; boundaries: number[]; kernelThreads: number | 'shared' };
  t.equal(result.kernelThreads, 1, 'each stage worker on the kernel threads asked for');
  t.equal(result.epochs.length, 2);
  // Fixed cuts: with cuts balanced by measured time the parts (and so PipeOptim's per-stage
  // prediction horizon) depend on the machine's load, and 2 short epochs reach 0.67-0.81.
  t.ok(result.epochs[1]!.accuracy > 0.7, `test accuracy ${result.epochs[1]!.accuracy} after 2 short epochs (0.81 here)`);
  t.ok(result.epochs[1]!.loss < result.epochs[0]!.loss, 'the loss falls');
  t.same(result.boundaries, [2, 4], 'cut into 3 parts where asked');
  t.ok(result.measured.makespanMs > 0 && result.simulated.makespanMs > 0);
  const html = readFileSync(report, 'utf8');
  t.match(html, /Measured round/);
  t.match(html, /Simulated from the measured costs/);
  t.equal((html.match(/<svg/g) ?? []).length, 2, 'two timelines, drawn by the same renderer');
  const refused = await run(process.execPath, [bin, 'train', 'pipeline', '--kernel-threads', '0'], { timeout: 60_000 }).then(
    () => undefined,
    (error: { stderr: string }) => error.stderr,
  );
  t.match(refused, /--kernel-threads \(or 'auto', 'shared'\) must be an integer in \[1, 1024\], got 0/, 'a count of 0 is refused naming the option');
});

t.test('--model cnn trains the CNN on Fashion-MNIST through the pipeline, and --device auto says where it ran', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-train-'));
  const { stdout } = await run(
    process.execPath,
    [bin, 'train', 'pipeline', '--model', 'cnn', '--channels', '4,8', '--schedule', 'gpipe', '--stages', '2', '--boundaries', '3', '--epochs', '1', '--train-samples', '2048', '--device', 'auto', '--report', join(dir, 'r.html'), '--json'],
    { timeout: 120_000 },
  );
  const result = JSON.parse(stdout) as { epochs: { accuracy: number }[]; device: { device: string; reason: string }; config: { model: string; channels: number[] } };
  t.same([result.config.model, result.config.channels], ['cnn', [4, 8]]);
  // 2048 images, one epoch: 0.6-0.7 here (10 classes: 0.1 by chance).
  t.ok(result.epochs[0]!.accuracy > 0.45, `Fashion-MNIST test accuracy ${result.epochs[0]!.accuracy} after one short epoch`);
  t.ok(['cpu', 'cuda:0'].includes(result.device.device) && result.device.reason.length > 5, `ran on ${result.device.device}: ${result.device.reason}`);
  const refused = await run(process.execPath, [bin, 'train', 'pipeline', '--model', 'mlp', '--channels', '4'], { timeout: 60_000 }).then(
    () => undefined,
    (error: { stderr: string }) => error.stderr,
  );
  t.match(refused, /--channels sets the CNN's convolutions; use it with --model cnn/);
});

t.test('--model gpt trains a byte-level GPT on the fortunes text through the pipeline and reports validation loss and perplexity', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-train-'));
  const { stdout } = await run(
    process.execPath,
    [bin, 'train', 'pipeline', '--model', 'gpt', '--blocks', '2', '--dim', '32', '--heads', '2', '--context', '32', '--schedule', '1f1b', '--stages', '2', '--boundaries', '2', '--optimizer', 'adamw', '--lr', '0.003', '--epochs', '2', '--train-samples', '1024', '--report', join(dir, 'r.html'), '--json'],
    { timeout: 120_000 },
  );
  const result = JSON.parse(stdout) as { epochs: { loss: number; accuracy: number; validationLoss: number; perplexity: number }[] };
  const [first, second] = result.epochs;
  t.ok(second!.validationLoss < first!.validationLoss, `validation loss falls: ${first!.validationLoss.toFixed(3)} -> ${second!.validationLoss.toFixed(3)}`);
  // Uniform over the bytes is ln 256 = 5.55 nats; two short epochs of this tiny GPT reach 3.42 here.
  t.ok(second!.validationLoss < 3.8, `validation loss ${second!.validationLoss.toFixed(3)} nats per byte (3.42 here)`);
  t.ok(Math.abs(second!.perplexity - Math.exp(second!.validationLoss)) < 1e-9, 'perplexity = exp(validation loss)');
  t.ok(second!.accuracy > 0.1 && second!.accuracy < 1, `next-byte accuracy ${second!.accuracy}`);
  const refused = await run(process.execPath, [bin, 'train', 'pipeline', '--model', 'gpt', '--dim', '30', '--heads', '4'], { timeout: 60_000 }).then(
    () => undefined,
    (error: { stderr: string }) => error.stderr,
  );
  t.match(refused, /--dim 30 must be a multiple of --heads 4/);
});

t.test('--pipelines 2 --dp-mode sync trains two pipelines whose stage replicas combine gradients', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-train-'));
  const report = join(dir, 'report.html');
  const { stdout } = await run(process.execPath, [bin, 'train', 'pipeline', '--schedule', '1f1b', '--stages', '2', '--pipelines', '2', '--dp-mode', 'sync', '--epochs', '2', '--train-samples', '3000', '--report', report, '--json'], { timeout: 120_000 });
  const result = JSON.parse(stdout) as { epochs: { accuracy: number; loss: number }[] };
  // Fixed cuts: with cuts balanced by measured time the parts (and so PipeOptim's per-stage
  // prediction horizon) depend on the machine's load, and 2 short epochs reach 0.67-0.81.
  t.ok(result.epochs[1]!.accuracy > 0.7, `test accuracy ${result.epochs[1]!.accuracy} after 2 short epochs (0.81 here)`);
  t.ok(result.epochs[1]!.loss < result.epochs[0]!.loss, 'the loss falls');
  t.match(readFileSync(report, 'utf8'), /2 parallel pipelines whose stage replicas combine gradients in data-parallel mode sync/);
});

t.test('a profile the run measured is accepted by tune, and tune\'s choice is a command that trains', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-train-'));
  const profile = join(dir, 'profile.json');
  await run(process.execPath, [bin, 'train', 'pipeline', '--schedule', '1f1b', '--stages', '2', '--epochs', '1', '--train-samples', '1024', '--report', join(dir, 'a.html'), '--profile-out', profile], { timeout: 120_000 });
  const written = JSON.parse(readFileSync(profile, 'utf8')) as { stages: { forwardMs: number; backwardMs: number; weightBytes: number }[]; microBatchSize: number; batchSize: number };
  t.equal(written.stages.length, 2, 'a profile entry per stage');
  t.ok(written.stages.every((s) => s.forwardMs > 0 && s.backwardMs > 0 && s.weightBytes > 0), 'measured times and sizes');
  t.same([written.microBatchSize, written.batchSize], [16, 128], "the run's micro-batch and a pipeline's batch");
  const { stdout } = await run(process.execPath, [bin, 'tune', '--profile', profile, '--memory-gb', '1', '--max-pipelines', '2', '--max-microbatches', '8', '--json'], { timeout: 60_000 });
  const tuned = JSON.parse(stdout) as { train: string | null };
  t.match(tuned.train, /^npx sapipe train pipeline --schedule avgpipe --stages 2 --pipelines \d+ --microbatches \d+ --microbatch-size \d+ --advance \d+$/);
  const args = tuned.train!.split(' ').slice(2);
  const trained = await run(process.execPath, [bin, ...args, '--epochs', '1', '--train-samples', '1024', '--report', join(dir, 'b.html'), '--json'], { timeout: 120_000 });
  t.ok((JSON.parse(trained.stdout) as { epochs: unknown[] }).epochs.length === 1, 'the tuned command trains');
  // the profile knows the machine, and the tuner reports its prediction for the run it chose
  const machine = JSON.parse(readFileSync(profile, 'utf8')) as { machine?: { cores: number; passCores: number; messageCpu?: { fixedMs: number; perByteMs: number } }; stages: { fit?: { forward: { perSampleMs: number } } }[] };
  t.ok(machine.machine && machine.machine.cores >= 1 && machine.machine.passCores >= 1, 'cores and the cores a pass uses');
  // a message between two threads costs a few tens of microseconds of CPU here (wake-ups at both ends)
  const mc = machine.machine?.messageCpu;
  t.ok(mc && mc.fixedMs > 0 && mc.fixedMs < 5 && mc.perByteMs >= 0, `what a message costs the cores: ${JSON.stringify(mc)}`);
  t.ok(machine.stages.every((s) => s.fit !== undefined && s.fit.forward.perSampleMs >= 0), 'a fixed + per-sample fit per stage');
  const runFile = join(dir, 'run.json');
  writeFileSync(runFile, trained.stdout);
  const checked = await run(process.execPath, [bin, 'tune', '--profile', profile, '--memory-gb', '1', '--max-pipelines', '2', '--max-microbatches', '8', '--top', '0', '--measured', runFile], { timeout: 60_000 });
  t.match(checked.stdout, /the measured run, avgpipe N=\d+ M=\d+ A=\d+ micro-batch \d+:\n  predicted [\d.]+ samples\/s\n  measured  [\d.]+ samples\/s over training wall time: prediction error [-+][\d.]+%/);
});

t.test('--schedule sapipe trains its data-parallel workers and compares the measured round with the simulated one', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'sapipe-train-'));
  const { stdout } = await run(process.execPath, [bin, 'train', 'pipeline', '--schedule', 'sapipe', '--stages', '2', '--microbatches', '4', '--epochs', '1', '--train-samples', '1024', '--report', join(dir, 's.html'), '--json'], { timeout: 120_000 });
  const result = JSON.parse(stdout) as { epochs: { loss: number }[]; measured: { makespanMs: number }; simulated: { makespanMs: number } };
  t.ok(Number.isFinite(result.epochs[0]!.loss));
  t.ok(result.measured.makespanMs > 0 && result.simulated.makespanMs > 0, 'measured and simulated rounds');
  t.match(readFileSync(join(dir, 's.html'), 'utf8'), /data-parallel workers, each holding the whole model, in data-parallel mode sapipe-wp/);
});

t.test('bad options are refused with what to change', async (t) => {
  for (const [args, message] of [
    [['--schedule', 'pipe-dreams'], /--schedule must be one of/],
    [['--schedule', 'sapipe', '--dp-mode', 'sync'], /staleness 1/],
    [['--schedule', 'sapipe', '--stages', '2', '--pipelines', '3'], /one data-parallel worker per row/],
    [['--stages', 'four'], /--stages must be a number/],
    [['--layers', '10,10'], /--layers must start with 784/],
    [['--stages', '12'], /9 layers for 12 parts/],
    [['--schedule', 'pipedream', '--pipelines', '2'], /run the synchronous schedules/],
    [['--pipelines', '2', '--dp-mode', 'async'], /--dp-mode must be one of/],
    [['--no-spike-compensation'], /use them with --schedule pipelined-backprop/],
  ] as const) {
    const error = (await run(process.execPath, [bin, 'train', 'pipeline', '--epochs', '1', '--train-samples', '500', ...args], { timeout: 60_000 }).catch((e: unknown) => e)) as { stderr: string; code: number };
    t.not(error.code, 0, args.join(' '));
    t.match(error.stderr, message, args.join(' '));
  }
});
