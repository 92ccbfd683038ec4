/**
 * Learning rates of PyTorch's schedulers, written out step by step from their documented
 * recurrences (independent of lib/optim/lr-schedule.ts, which uses closed forms).
 */

/** torch.optim.lr_scheduler.LinearLR(start_factor, end_factor=1, total_iters) */
export function linearLr(base: number, startFactor: number, totalIters: number, steps: number): number[] {
  const out: number[] = [];
  let factor = startFactor;
  for (let t = 0; t <= steps; t++) {
    if (t > 0 && t <= totalIters) factor += (1 - startFactor) / totalIters;
    out.push(base * factor);
  }
  return out;
}

/** torch CosineAnnealingLR(T_max, eta_min) for t <= T_max, by its recursive form. */
export function cosineLr(base: number, tMax: number, etaMin: number, steps: number): number[] {
  const out = [base];
  let lr = base;
  for (let t = 1; t <= steps; t++) {
    if (t > tMax) lr = etaMin;
    else lr = etaMin + ((lr - etaMin) * (1 + Math.cos((Math.PI * t) / tMax))) / (1 + Math.cos((Math.PI * (t - 1)) / tMax));
    out.push(lr);
  }
  return out;
}

/** torch StepLR(step_size, gamma): multiply at every multiple of step_size. */
export function stepLr(base: number, stepSize: number, gamma: number, steps: number): number[] {
  const out = [base];
  let lr = base;
  for (let t = 1; t <= steps; t++) {
    if (t % stepSize === 0) lr *= gamma;
    out.push(lr);
  }
  return out;
}
