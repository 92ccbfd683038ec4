/**
 * The command line's rough edges, as a user met them: `info` lines that broke the table (a
 * multi-line reason, an available backend's details missing), an empty
 * kernel table with `NaN ms` for a filter that matched nothing, and a stack trace per rank from
 * `launch` with a missing script.
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import t from 'tap';

const bin = fileURLToPath(new URL('../bin/sapipe.js', import.meta.url));
function sapipe(args: string[], env: NodeJS.ProcessEnv = process.env): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) =>
    execFile(process.execPath, [bin, ...args], { env, timeout: 120_000 }, (error, stdout, stderr) =>
      resolve({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    ),
  );
}

t.test('info: lines fit the width, and a backend missing for another one points at it', async (t) => {
  const { code, stdout } = await sapipe(['info']);
  t.equal(code, 0);
  const long = stdout.split('\n').filter((line) => line.length > 120 && !/\S{60,}/.test(line));
  t.same(long, [], 'no line over 120 columns (unless one word is)');
  const nccl = stdout.slice(stdout.indexOf('  nccl'), stdout.indexOf('  local'));
  const cudaReason = /cuda\s+compute unavailable: ([^\n]+)/.exec(stdout)?.[1];
  if (cudaReason) t.notOk(nccl.includes(cudaReason.trim()), "nccl's line does not repeat cuda's reason");
  t.notMatch(stdout, /since \w+ is unavailable \(/, 'auto selects names what it passed over without repeating why');
  // An available backend says what it found (on a GPU machine: cuda's devices and architectures).
  t.match(stdout, /  local\s+comm\s+available\n\s+ranks: worker_threads/, 'the local backend lists its details under its line');
  // A reason that spans lines (NCCL's list of places looked at) stays inside the table's indent.
  const backends = stdout.slice(stdout.indexOf('backends:'), stdout.indexOf('auto selects:')).split('\n').slice(1);
  t.same(backends.filter((line) => line !== '' && !line.startsWith('  ')), [], 'every line of the backends table is indented');
});

t.test('bench kernels --filter that matches nothing: an error that lists the kernels', async (t) => {
  const { code, stdout, stderr } = await sapipe(['bench', 'kernels', '--filter', 'nothing', '--size', '1024']);
  t.not(code, 0);
  t.match(stderr, /--filter "nothing" matches no kernel; the kernels are: sgd, /);
  t.notMatch(stdout, /NaN/);
});

t.test('launch with a missing script: one line, no stack traces', async (t) => {
  const { code, stdout, stderr } = await sapipe(['launch', '--nproc', '2', 'no-such-script.js']);
  t.not(code, 0);
  t.match(stderr, /launch: the script .*no-such-script\.js does not exist/);
  t.equal(stderr.trim().split('\n').length, 1, stderr);
  t.equal(stdout, '');
});

t.test('tune: the profile format in --help, and the settings that fit listed first', async (t) => {
  const help = await sapipe(['tune', '--help']);
  t.match(help.stdout, /"microBatchSize": 8/);
  t.match(help.stdout, /forwardMs\/backwardMs are required per stage/);
  const profile = fileURLToPath(new URL('../docs/schedules/example-profile.json', import.meta.url));
  const { code, stdout } = await sapipe(['tune', '--profile', profile, '--memory-gb', '4']);
  t.equal(code, 0);
  const rows = stdout.split('\n').filter((line) => /^\s+\d+\s+\d+\s+(\d+|AFF)\s/.test(line));
  t.ok(rows.length > 0, 'settings listed');
  t.ok(rows[0]!.endsWith('yes'), `the first listed setting fits: ${rows[0]}`);
  t.match(stdout, /faster but over the cap/, 'the faster settings over the cap are still named');
});

t.test('schedule pictures: workers for the data-parallel forms, the all-reduce shown, interleaved chunks told apart', async (t) => {
  const sapipe_ = await sapipe(['schedule', 'sapipe', '-s', '2', '-m', '2']);
  t.match(sapipe_.stdout, /^worker  0 \|/m, 'SAPipe rows are workers');
  t.match(sapipe_.stdout, /^\s+\|\s*A+/m, 'the all-reduce lane is drawn by default (non-zero --allreduce)');
  const wavelet = await sapipe(['schedule', 'wavelet', '-s', '2', '-m', '2']);
  t.match(wavelet.stdout, /^worker  1 \|/m);
  const gpipe = await sapipe(['schedule', 'gpipe', '-s', '2', '-m', '2']);
  t.match(gpipe.stdout, /^stage  0 \|/m, 'pipeline rows stay stages');
  const zero = await sapipe(['schedule', 'sapipe', '-s', '2', '-m', '2', '--allreduce', '0']);
  t.notMatch(zero.stdout, /^\s+\|\s*A+/m, '--allreduce 0 still hides it');
  const interleaved = await sapipe(['schedule', 'interleaved-1f1b', '-s', '2', '-m', '4']);
  const row0 = /^stage  0 \|(.*)\|/m.exec(interleaved.stdout)?.[1] ?? '';
  t.match(row0, /F0/, 'chunk 0 in upper case');
  t.match(row0, /f0/, 'chunk 1 in lower case');
  t.match(interleaved.stdout, /lower case: odd chunks/);
});
