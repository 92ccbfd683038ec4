/**
 * The PyTorch process of `sapipe bench models`: finds an interpreter with torch (with CUDA, for a
 * device run), starts torch-models.py (beside this file in the repository; shipped at apps/bench/
 * in the package) with the threads, the OpenBLAS core and the device (SAPIPE_BENCH_DEVICE) set, and
 * exchanges JSON lines with it.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { BackendUnavailableError, InternalError } from 'sapipe';

/**
 * What the PyTorch process reports of itself before any request. On a device run the BLAS fields
 * (blasInfo, mkl, mkldnn, cpuCapability, openblas) are not reported: the device fields are.
 */
export interface TorchSetup {
  torch: string;
  python: string;
  pythonVersion: string;
  threads: number;
  interopThreads: number;
  /** OPENBLAS_CORETYPE as the process saw it (undefined: OpenBLAS chose from its own CPU detection). */
  openblasCoretype: string | null;
  /** OMP_WAIT_POLICY as the process saw it. */
  ompWaitPolicy: string | null;
  /** BLAS_INFO of torch.__config__.show(). */
  blasInfo: string;
  mkl: boolean;
  mkldnn: boolean;
  /** "CPU capability usage" of torch.__config__.show() (ATen's own vectorised kernels). */
  cpuCapability: string;
  /** OpenBLAS's report of itself, when the BLAS library loaded is OpenBLAS. */
  openblas: { library: string; core: string; config: string; threads: number } | null;
  /** Where the models and products run: cpu or cuda:N. */
  device?: string;
  /** On a device: torch.version.cuda. */
  cuda?: string | null;
  /** On a device: torch.cuda.get_device_name. */
  gpu?: string;
  /** On a device: whether TF32 is allowed for matmuls and for cuDNN (the script turns both off: sapipe computes in fp32). */
  tf32?: { matmul: boolean; cudnn: boolean };
}

/** The script: beside this module when run from source, at apps/bench/ of the package root when run from dist/apps/bench/. */
export function torchScriptPath(): string {
  const candidates = [new URL('./torch-models.py', import.meta.url), new URL('../../../apps/bench/torch-models.py', import.meta.url)].map((u) => fileURLToPath(u));
  const found = candidates.find((p) => existsSync(p));
  if (!found) throw new BackendUnavailableError(`bench models: the PyTorch script torch-models.py is missing (looked at ${candidates.join(', ')}); reinstall sapipe or pass --torch-script <path>`);
  return found;
}

/**
 * The OPENBLAS_CORETYPE for this CPU from its flags (avx512f: SkylakeX, avx2: Haswell), so that
 * OpenBLAS's own detection cannot take a virtual CPU for an old one and run its slow kernels.
 * `given` (the --openblas-coretype option) wins; a value in the environment is replaced by the
 * detected one and `source` says so.
 */
export function openblasCoretype(given?: string, env: NodeJS.ProcessEnv = process.env): { value: string | undefined; source: string } {
  if (given !== undefined && given !== '') return { value: given, source: 'given by --openblas-coretype' };
  const before = env.OPENBLAS_CORETYPE ? `; the environment's ${env.OPENBLAS_CORETYPE} replaced` : '';
  let flags = '';
  try {
    flags = /^flags\s*:\s*(.*)$/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? '';
  } catch {
    return { value: env.OPENBLAS_CORETYPE, source: 'as in the environment: /proc/cpuinfo unreadable' };
  }
  const has = (flag: string): boolean => flags.split(/\s+/).includes(flag);
  if (has('avx512f')) return { value: 'SkylakeX', source: `set from the CPU flags: avx512f${before}` };
  if (has('avx2')) return { value: 'Haswell', source: `set from the CPU flags: avx2${before}` };
  return { value: env.OPENBLAS_CORETYPE, source: 'neither avx512f nor avx2 among the CPU flags: as in the environment' };
}

type Reply = Record<string, unknown> & { error?: string; message?: string };

/** One running torch-models.py. */
export class TorchProcess {
  private readonly pending: Array<{ resolve: (r: Reply) => void; reject: (e: Error) => void }> = [];
  private stderr = '';
  private exited: Error | undefined;

  private constructor(
    private readonly child: ChildProcessWithoutNullStreams,
    readonly setup: TorchSetup,
    lines: AsyncIterator<string>,
  ) {
    void (async () => {
      for (;;) {
        const next = await lines.next();
        if (next.done) break;
        const waiter = this.pending.shift();
        if (waiter) waiter.resolve(JSON.parse(next.value) as Reply);
      }
    })();
    child.stderr.on('data', (d: Buffer) => (this.stderr = (this.stderr + d.toString()).slice(-4000)));
    child.on('exit', (code) => {
      this.exited = new InternalError(`bench models: the PyTorch process exited (code ${code})${this.stderr ? `: ${this.stderr.trim()}` : ''}`);
      for (const w of this.pending.splice(0)) w.reject(this.exited);
    });
  }

  /**
   * Starts the script under the first interpreter of `pythons` that imports torch. Throws
   * BackendUnavailableError, saying what was tried and what to install, when none does.
   */
  static async start(pythons: readonly string[], script: string, env: NodeJS.ProcessEnv, device = 'cpu'): Promise<TorchProcess> {
    const tried: string[] = [];
    for (const python of pythons) {
      const child = spawn(python, [script], { env, stdio: ['pipe', 'pipe', 'pipe'] });
      let stderr = '';
      child.stderr.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-2000)));
      const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
      const first = await new Promise<{ line?: string; error?: string }>((resolve) => {
        child.once('error', (e: NodeJS.ErrnoException) => resolve({ error: e.code === 'ENOENT' ? 'not found' : e.message }));
        lines.next().then(
          (r) => resolve(r.done ? { error: `exited without a word${stderr ? `: ${stderr.trim().split('\n').slice(-1)[0]}` : ''}` } : { line: r.value }),
          (e: Error) => resolve({ error: e.message }),
        );
      });
      let reply: Reply | undefined;
      try {
        reply = first.line === undefined ? undefined : (JSON.parse(first.line) as Reply);
      } catch {
        first.error = `printed ${JSON.stringify(first.line?.slice(0, 100))} instead of its setup`;
      }
      if (reply && reply.error === undefined) return new TorchProcess(child, reply as unknown as TorchSetup, lines);
      child.kill();
      tried.push(`${python} (${reply?.error === 'no-torch' ? `Python ${String(reply.pythonVersion)}: ${String(reply.message)}` : (reply?.message ?? first.error)})`);
    }
    if (device !== 'cpu')
      throw new BackendUnavailableError(
        `bench models: PyTorch with CUDA is not available for ${device}; tried ${tried.join(', ')}. Install a CUDA build of torch for one of these interpreters ` +
          '(`pip install torch` on Linux x86-64, or the command for your CUDA version at https://pytorch.org/get-started/locally/), ' +
          'pass --python <an interpreter whose torch.cuda.is_available() is True>, or time sapipe alone with --sapipe-only',
      );
    throw new BackendUnavailableError(
      `bench models: PyTorch is not available; tried ${tried.join(', ')}. Install it for one of these interpreters ` +
        '(`pip install torch`, or `apt install python3-torch` on Debian and Ubuntu), pass --python <an interpreter that imports torch>, ' +
        'or time sapipe alone with --sapipe-only',
    );
  }

  async request(body: Record<string, unknown>): Promise<Reply> {
    if (this.exited) throw this.exited;
    const reply = new Promise<Reply>((resolve, reject) => this.pending.push({ resolve, reject }));
    this.child.stdin.write(`${JSON.stringify(body)}\n`);
    const r = await reply;
    if (r.error !== undefined) throw new InternalError(`bench models: PyTorch side, ${String(body.op)}: ${r.message ?? r.error}`);
    return r;
  }

  close(): void {
    if (this.exited) return;
    this.child.stdin.end(`${JSON.stringify({ op: 'quit' })}\n`);
    const timer = setTimeout(() => this.child.kill(), 2000);
    timer.unref();
  }
}
