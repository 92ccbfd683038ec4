/**
 * Plain TypeScript reference of ALGORITHMS.md sections 1-4, written per element and straight from
 * the formulas, independent of the native kernels' structure. State is stored in Float32Array like
 * the kernels' fp32 state; arithmetic is done in double, so differences to the kernels are fp32
 * rounding only.
 */
export interface RefCompensation {
  kind: 'elementwise' | 'adaptive';
  lambda: number;
  eps: number;
}

export type RefPrediction =
  | { kind: 'shadow'; estimate: 'local' | 'prev-sync' | 'local-prev-sync'; compensate: boolean; n: number; localScale: number }
  | { kind: 'linear'; steps: number };

export interface RefConfig {
  optimizer: 'sgd' | 'adam' | 'adamw';
  lr: number;
  weightDecay: number;
  momentum: number;
  dampening: number;
  nesterov: boolean;
  spikeDelay?: number;
  beta1: number;
  beta2: number;
  eps: number;
  gradScale: number;
  compensation?: RefCompensation;
  prediction?: RefPrediction;
}

export class ReferenceOptimizer {
  readonly w: Float32Array;
  readonly m: Float32Array;
  readonly v: Float32Array;
  readonly backup: Float32Array;
  readonly predicted: Float32Array;
  readonly prevLocal: Float32Array;
  t = 0;

  constructor(
    readonly cfg: RefConfig,
    weights: Float32Array,
  ) {
    const n = weights.length;
    this.w = Float32Array.from(weights);
    this.m = new Float32Array(n);
    this.v = new Float32Array(n);
    this.backup = Float32Array.from(weights);
    this.predicted = Float32Array.from(weights);
    this.prevLocal = new Float32Array(n);
  }

  /** One step with the applied gradient g (and this worker's local gradient). Returns false if skipped. */
  step(g: Float32Array, local?: Float32Array): boolean {
    const c = this.cfg;
    const needsLocal = c.prediction?.kind === 'shadow' && c.prediction.estimate !== 'prev-sync';
    for (let i = 0; i < g.length; i++) {
      if (!Number.isFinite(g[i]!)) return false;
      if (needsLocal && !Number.isFinite(local![i]!)) return false;
    }
    const first = this.t === 0;
    const t = this.t + 1;
    for (let i = 0; i < g.length; i++) this.element(i, g[i]! * c.gradScale, local?.[i], first, t);
    this.t = t;
    return true;
  }

  private compensate(g: number, wNow: number, wThen: number): number {
    const dc = this.cfg.compensation!;
    const term = dc.lambda * g * g * (wNow - wThen);
    return dc.kind === 'adaptive' ? g + term / Math.sqrt(g * g + dc.eps) : g + term;
  }

  /** The optimizer's update of (w, m, v) by gradient g at step t; returns the new values. */
  private optimizerStep(w: number, m: number, v: number, g: number, t: number, first: boolean): { w: number; m: number; v: number } {
    const c = this.cfg;
    if (c.optimizer === 'sgd') {
      const d = g + c.weightDecay * w;
      if (c.momentum === 0) return { w: w - c.lr * d, m, v };
      if (c.spikeDelay !== undefined) {
        const a = c.momentum ** c.spikeDelay;
        const b = (1 - a) / (1 - c.momentum);
        const mNew = first ? d : c.momentum * m + d;
        return { w: w - c.lr * (a * mNew + b * d), m: mNew, v };
      }
      const mNew = first ? d : c.momentum * m + (1 - c.dampening) * d;
      const dir = c.nesterov ? d + c.momentum * mNew : mNew;
      return { w: w - c.lr * dir, m: mNew, v };
    }
    let wStart = w;
    let d = g;
    if (c.optimizer === 'adamw') wStart = w * (1 - c.lr * c.weightDecay);
    else d = g + c.weightDecay * w;
    const mNew = c.beta1 * m + (1 - c.beta1) * d;
    const vNew = c.beta2 * v + (1 - c.beta2) * d * d;
    const mHat = mNew / (1 - c.beta1 ** t);
    const vHat = vNew / (1 - c.beta2 ** t);
    return { w: wStart - (c.lr * mHat) / (Math.sqrt(vHat) + c.eps), m: mNew, v: vNew };
  }

  private element(i: number, a: number, localRaw: number | undefined, first: boolean, t: number): void {
    const c = this.cfg;
    const p = c.prediction;
    const wOld = this.w[i]!;
    // The SAPipe estimate of the gradient in flight, from the raw (uncompensated) applied gradient.
    let est = 0;
    if (p?.kind === 'shadow') {
      const local = localRaw === undefined ? 0 : localRaw * p.localScale;
      if (p.estimate === 'local') est = local;
      else if (p.estimate === 'prev-sync') est = a;
      else {
        est = first ? a : a + (local - this.prevLocal[i]! * p.localScale) / p.n;
        this.prevLocal[i] = localRaw!;
      }
    }
    let g = a;
    if (c.compensation) {
      g = this.compensate(a, wOld, this.backup[i]!);
      this.backup[i] = wOld;
    }
    const r = this.optimizerStep(wOld, this.m[i]!, this.v[i]!, g, t, first);
    this.w[i] = r.w;
    this.m[i] = r.m;
    this.v[i] = r.v;
    const w = this.w[i]!;
    const m = this.m[i]!;
    const v = this.v[i]!;
    if (p?.kind === 'shadow') {
      if (p.compensate) est = this.compensate(est, w, wOld);
      // A shadow step at t + 1 from the updated state; only w_hat is kept.
      this.predicted[i] = this.optimizerStep(w, m, v, est, t + 1, false).w;
    } else if (p?.kind === 'linear') {
      const s = p.steps;
      if (c.optimizer === 'sgd') {
        const dir = c.momentum === 0 ? g + c.weightDecay * wOld : m;
        this.predicted[i] = w - c.lr * s * dir;
      } else {
        const D = m / (1 - c.beta1 ** t) / (Math.sqrt(v / (1 - c.beta2 ** t)) + c.eps);
        const decay = c.optimizer === 'adamw' ? (1 - c.lr * c.weightDecay) ** s : 1;
        this.predicted[i] = w * decay - c.lr * s * D;
      }
    }
  }
}

/** Elastic averaging: d = alpha*(x - c); x -= d; c += d. */
export function referenceElasticAverage(x: Float32Array, center: Float32Array, alpha: number): void {
  for (let i = 0; i < x.length; i++) {
    const d = alpha * (x[i]! - center[i]!);
    x[i] = x[i]! - d;
    center[i] = center[i]! + d;
  }
}
