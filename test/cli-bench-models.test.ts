/**
 * `sapipe bench models` as a user runs it (a real `node bin/sapipe.js` process on dist/): its
 * help, a --quick run (with PyTorch when an interpreter here imports torch, sapipe alone when
 * none does), and the typed errors for a missing PyTorch and an unknown model. No timing is
 * asserted: only that the figures are there and positive.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import t from 'tap';

const run = promisify(execFile);
const bin = fileURLToPath(new URL('../bin/sapipe.js', import.meta.url));
const sapipe = (args: string[], env: NodeJS.ProcessEnv = process.env) => run(process.execPath, [bin, ...args], { env, maxBuffer: 1 << 24 });
const finitePositive = (x: unknown): boolean => typeof x === 'number' && Number.isFinite(x) && x > 0;

/** The interpreter the command would pick, if any imports torch here. */
function pythonWithTorch(): string | undefined {
  for (const python of [process.env.SAPIPE_PYTHON, 'python3', '/usr/bin/python3'].filter((p): p is string => !!p))
    try {
      execFileSync(python, ['-c', 'import torch'], { stdio: 'ignore', timeout: 60_000 });
      return python;
    } catch {
      // not this one
    }
  return undefined;
}

t.test('bench models --help names the models, the PyTorch options and --quick', async (t) => {
  const { stdout } = await sapipe(['bench', 'models', '--help']);
  for (const text of ['mlp', 'cnn', '--python', '--sapipe-only', '--quick', '--threads', '--openblas-coretype', '--device', 'cuda:N', 'PyTorch']) t.ok(stdout.includes(text), `mentions ${text}`);
});

t.test('bench models --quick --json: every model, positive times', async (t) => {
  const python = pythonWithTorch();
  const args = ['bench', 'models', '--quick', '--json', ...(python ? ['--python', python] : ['--sapipe-only'])];
  t.comment(python ? `PyTorch found (${python}): both sides` : 'no interpreter here imports torch: sapipe alone');
  const r = JSON.parse((await sapipe(args)).stdout) as {
    threads: number;
    gemm: { sapipe: { gflops: number }; torch?: { gflops: number } };
    torch?: { torch: string; threads: number; openblasCoretype: string | null };
    rows: { model: string; params: number; sapipe: { medianMs: number; samples: number[] }; torch?: { medianMs: number }; ratio?: number }[];
  };
  t.same(r.rows.map((x) => x.model), ['mlp', 'cnn', 'gpt'], 'a row per model, in order');
  t.equal(r.rows[0]!.params, 784 * 512 + 512 + 5 * (512 * 512 + 512) + 512 * 10 + 10, 'the MLP 784-512x6-10');
  t.equal(r.rows[1]!.params, 9098, 'the CNN of cnnLayers([8, 16])');
  // Embedding (256 + 128) x 128; 4 blocks of 2 layer norms (2 x 256), q, k, v, proj (4 x (128 x 128 + 128)),
  // fc1 (128 x 512 + 512) and fc2 (512 x 128 + 128); the final norm 256; the head 128 x 256 + 256.
  t.equal(r.rows[2]!.params, 875_520, 'the GPT of gptLayers(vocab 256, context 128, dim 128, heads 4, layers 4)');
  t.ok(finitePositive(r.gemm.sapipe.gflops), "sapipe's SGEMM rate");
  for (const row of r.rows) {
    t.ok(finitePositive(row.sapipe.medianMs), `${row.model}: sapipe ms/step`);
    t.equal(row.sapipe.samples.length, 2, `${row.model}: --quick is 2 repeats`);
    if (python) {
      t.ok(finitePositive(row.torch?.medianMs) && finitePositive(row.ratio), `${row.model}: PyTorch ms/step and the ratio`);
    } else t.equal(row.torch, undefined, `${row.model}: no PyTorch figure`);
  }
  if (python) {
    t.equal(r.torch?.threads, r.threads, "PyTorch runs sapipe's thread count");
    t.ok(finitePositive(r.gemm.torch?.gflops), "PyTorch's SGEMM rate");
  } else t.equal(r.torch, undefined, 'no PyTorch setup');
});

t.test('without PyTorch: a typed error that says what to install', async (t) => {
  // A torch package that fails to import, first on the path: every interpreter lacks torch.
  const dir = mkdtempSync(path.join(tmpdir(), 'sapipe-no-torch-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  mkdirSync(path.join(dir, 'torch'));
  writeFileSync(path.join(dir, 'torch', '__init__.py'), 'raise ImportError("No module named \'torch\' (hidden by the test)")\n');
  const error = (await sapipe(['bench', 'models', '--quick', '--models', 'cnn'], { ...process.env, PYTHONPATH: dir }).then(
    () => undefined,
    (e: unknown) => e,
  )) as { code?: number; stderr?: string } | undefined;
  t.ok(error, 'the command fails');
  t.equal(error?.code, 1, 'exit code 1');
  t.match(error?.stderr ?? '', /^ERR_BACKEND_UNAVAILABLE: bench models: PyTorch is not available; tried /, 'the error code first');
  t.match(error?.stderr ?? '', /pip install torch/, 'what to install');
  t.match(error?.stderr ?? '', /--python/, 'how to name an interpreter');
  t.match(error?.stderr ?? '', /--sapipe-only/, 'how to time sapipe alone');

  const missing = (await sapipe(['bench', 'models', '--quick', '--python', path.join(dir, 'no-such-python')]).then(
    () => undefined,
    (e: unknown) => e,
  )) as { stderr?: string } | undefined;
  t.match(missing?.stderr ?? '', /ERR_BACKEND_UNAVAILABLE: .*no-such-python \(not found\)/, 'an interpreter that does not exist is named');
});

t.test('an unknown model is a typed invalid argument', async (t) => {
  const error = (await sapipe(['bench', 'models', '--quick', '--sapipe-only', '--models', 'mlp,resnet']).then(
    () => undefined,
    (e: unknown) => e,
  )) as { stderr?: string } | undefined;
  t.match(error?.stderr ?? '', /^ERR_INVALID_ARGUMENT: bench models: unknown model "resnet"; the models are mlp, cnn/);
});
