/**
 * SGEMM throughput against the machine's peak fp32 rate. The peak is a model, not a measurement:
 * threads x FMA units per core x SIMD lanes x 2 flops x clock, where the clock is measured with a
 * dependent multiply chain (the nominal clock in /proc/cpuinfo is wrong under turbo and on virtual
 * machines) and the FMA units per core are assumed (2 on server cores with AVX-512; give
 * --fma-units 1 for parts with one 512-bit unit). Cores may clock lower under AVX-512 than under
 * the scalar chain, so the ratio is, if anything, an underestimate; the JSON says what went into it.
 */
import { readFileSync } from 'node:fs';

import { FlatBuffer, InvalidArgumentError, sgemm } from 'sapipe';
import { describeValue } from 'sapipe/validate';
import { nativeAddon } from 'sapipe/kernels';
import { median } from './timing.js';
import { performance } from 'node:perf_hooks';

export interface GemmBenchOptions {
  m: number;
  n: number;
  k: number;
  transA?: boolean;
  transB?: boolean;
  reps: number;
  warmup: number;
  /** Overrides the measured clock. */
  clockGhz?: number;
  /** FMA units per core (default 2). */
  fmaUnits?: number;
}

export interface GemmBenchResult {
  m: number;
  n: number;
  k: number;
  transA: boolean;
  transB: boolean;
  threads: number;
  simd: string;
  /** Median milliseconds of one product. */
  medianMs: number;
  gflops: number;
  peak: {
    gflops: number;
    clockGhz: number;
    clockSource: 'measured' | 'given' | '/proc/cpuinfo';
    fmaUnitsPerCore: number;
    lanes: number;
    formula: string;
  };
  ratioToPeak: number;
}

const LANES: Record<string, number> = { baseline: 4, avx2: 8, avx512: 16 };

function cpuinfoGhz(): number {
  try {
    const match = /cpu MHz\s*:\s*([\d.]+)/.exec(readFileSync('/proc/cpuinfo', 'utf8'));
    return match ? Number(match[1]) / 1000 : 0;
  } catch {
    return 0;
  }
}

export function benchGemm(options: GemmBenchOptions): GemmBenchResult {
  const { m, n, k } = options;
  for (const [name, v] of Object.entries({ m, n, k, reps: options.reps }))
    if (!Number.isInteger(v) || v < 1) throw new InvalidArgumentError(`bench gemm: ${name} must be a positive integer, got ${describeValue(v)}`);
  if (!Number.isInteger(options.warmup) || options.warmup < 0) throw new InvalidArgumentError('bench gemm: warmup must be a non-negative integer');
  if (options.clockGhz !== undefined && !(options.clockGhz > 0 && Number.isFinite(options.clockGhz)))
    throw new InvalidArgumentError('bench gemm: --clock-ghz must be a positive number');
  const fmaUnits = options.fmaUnits ?? 2;
  if (!Number.isInteger(fmaUnits) || fmaUnits < 1) throw new InvalidArgumentError('bench gemm: --fma-units must be a positive integer');
  const addon = nativeAddon();
  const info = addon.info();
  const a = FlatBuffer.allocate(m * k);
  const b = FlatBuffer.allocate(k * n);
  const c = FlatBuffer.allocate(m * n);
  try {
    for (let i = 0; i < a.length; i++) a.array[i] = ((i * 7919) % 1000) / 1000 - 0.5;
    for (let i = 0; i < b.length; i++) b.array[i] = ((i * 104729) % 1000) / 1000 - 0.5;
    const args = { m, n, k, transA: options.transA ?? false, transB: options.transB ?? false, a, b, c };
    const run = (): void => sgemm(args);
    // Each timed sample is a batch of products lasting about 5 ms, so timer resolution and one
    // call's jitter do not dominate small sizes.
    const t0 = performance.now();
    run();
    const once = Math.max(performance.now() - t0, 1e-3);
    const batch = Math.max(1, Math.min(10000, Math.round(5 / once)));
    for (let i = 0; i < options.warmup * batch; i++) run();
    const samples: number[] = [];
    for (let r = 0; r < options.reps; r++) {
      const start = performance.now();
      for (let i = 0; i < batch; i++) run();
      samples.push((performance.now() - start) / batch);
    }
    const medianMs = median(samples);
    const gflops = (2 * m * n * k) / (medianMs * 1e6);
    let clockGhz = options.clockGhz ?? 0;
    let clockSource: GemmBenchResult['peak']['clockSource'] = 'given';
    if (options.clockGhz === undefined) {
      clockGhz = addon.measureClockGhz();
      clockSource = 'measured';
      if (!(clockGhz > 0)) {
        clockGhz = cpuinfoGhz();
        clockSource = '/proc/cpuinfo';
      }
    }
    const lanes = LANES[info.simd] ?? 4;
    const peakGflops = info.threads * fmaUnits * lanes * 2 * clockGhz;
    return {
      m,
      n,
      k,
      transA: args.transA,
      transB: args.transB,
      threads: info.threads,
      simd: info.simd,
      medianMs,
      gflops,
      peak: {
        gflops: peakGflops,
        clockGhz,
        clockSource,
        fmaUnitsPerCore: fmaUnits,
        lanes,
        formula: `${info.threads} threads x ${fmaUnits} FMA units x ${lanes} fp32 lanes x 2 flops x ${clockGhz.toFixed(2)} GHz`,
      },
      ratioToPeak: peakGflops > 0 ? gflops / peakGflops : NaN,
    };
  } finally {
    a.dispose();
    b.dispose();
    c.dispose();
  }
}
