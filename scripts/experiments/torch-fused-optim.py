#!/usr/bin/env python3
"""PyTorch's fused optimizers against sapipe's fused CUDA kernels on the same GPU.

Times one step of torch.optim.Adam(fused=True), AdamW(fused=True) and SGD(fused=True, momentum
0.9) on one fp32 tensor of N elements: CUDA events around --inner steps issued back to back (so
Python's dispatch overlaps the GPU's work and only GPU time is counted), divided by --inner;
the median over repetitions after warm-up. sapipe_cuda_bench times each kernel alone between two
events (its first table) and then back to back (its second table, the one compared here, timed
like PyTorch's steps). Then the same maths as sapipe's fused DC + WP variants written
in PyTorch two ways: eager (delay compensation as tensor ops, the fused optimizer, the shadow step
as tensor ops) and torch.compile of the whole step (Inductor fuses it into generated kernels),
which is the best a PyTorch user gets without a custom kernel. Given the output of
`sapipe_cuda_bench N` from the same run (--sapipe FILE), it prints sapipe's time over PyTorch's.

usage: python3 scripts/experiments/torch-fused-optim.py [--elements 67108864] [--reps 15]
           [--inner 20] [--sapipe bench.log]
"""
import argparse
import json
import statistics
import sys

import torch

# sapipe_cuda_bench rows compared with each PyTorch optimizer: the same update, then the same
# update with delay compensation and weight prediction fused in.
PAIRS = {
    "adam": ["adam", "adam+dc", "adam+dc+wp-local-dc"],
    "adamw": ["adamw", "adamw+dc-adaptive", "adamw+dc-adaptive+wp-prev-sync-dc"],
    "sgd-momentum": ["sgd-momentum", "sgd-momentum+dc", "sgd-momentum+dc+wp-local-prev-sync-dc"],
}


INNER = 20


def timed(fn, reps, warmup):
    """Per-call GPU time: INNER calls back to back between two events, median over reps."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(warmup + reps):
        torch.cuda.synchronize()
        start.record()
        for _ in range(INNER):
            fn()
        stop.record()
        stop.synchronize()
        if r >= warmup:
            times.append(start.elapsed_time(stop) / INNER)
    return statistics.median(times), min(times), max(times)


def time_steps(make_optimizer, n, reps, warmup):
    gen = torch.Generator(device="cuda").manual_seed(1)
    p = torch.nn.Parameter(torch.empty(n, device="cuda").uniform_(-1, 1, generator=gen))
    p.grad = torch.empty(n, device="cuda").uniform_(-0.01, 0.01, generator=gen)
    opt = make_optimizer([p])
    result = timed(opt.step, reps, warmup)
    del opt, p
    torch.cuda.empty_cache()
    return result


# The DC + WP steps in PyTorch, matching sapipe's variants (docs/ALGORITHMS.md sections 1-3) in
# what they read and write: elementwise DC of the averaged gradient against the backup, the
# optimizer step, the backup rotated, and a shadow step with a compensated estimate into w_hat.
def adam_dc_wp(w, g, m, v, backup, w_hat, local, lr, b1, b2, eps, wd, lam, bc1, bc2, bc1n, bc2n):
    gt = g + lam * g * g * (w - backup)
    m_new = b1 * m + (1 - b1) * gt
    v_new = b2 * v + (1 - b2) * gt * gt
    w_new = w * (1 - lr * wd) - lr * (m_new / bc1) / (torch.sqrt(v_new / bc2) + eps)
    est = local + lam * local * local * (w_new - w)
    ms = b1 * m_new + (1 - b1) * est
    vs = b2 * v_new + (1 - b2) * est * est
    w_hat.copy_(w_new * (1 - lr * wd) - lr * (ms / bc1n) / (torch.sqrt(vs / bc2n) + eps))
    backup.copy_(w)
    w.copy_(w_new)
    m.copy_(m_new)
    v.copy_(v_new)


def sgd_dc_wp(w, g, m, backup, w_hat, local, prev_local, lr, mu, lam, inv_n):
    gt = g + lam * g * g * (w - backup)
    m_new = mu * m + gt
    w_new = w - lr * m_new
    est = g + (local - prev_local) * inv_n
    est = est + lam * est * est * (w_new - w)
    w_hat.copy_(w_new - lr * (mu * m_new + est))
    backup.copy_(w)
    w.copy_(w_new)
    m.copy_(m_new)
    prev_local.copy_(local)


def dc_wp_eager(kind, n):
    """Eager PyTorch: DC as tensor ops, the fused optimizer, the shadow step as tensor ops."""
    gen = torch.Generator(device="cuda").manual_seed(2)
    u = lambda lo, hi: torch.empty(n, device="cuda").uniform_(lo, hi, generator=gen)
    p = torch.nn.Parameter(u(-1, 1))
    g, backup, local, prev_local = u(-0.01, 0.01), u(-1, 1), u(-0.01, 0.01), u(-0.01, 0.01)
    w_hat = torch.empty_like(g)
    lam, lr = 0.2, 1e-3
    if kind == "sgd-momentum":
        opt = torch.optim.SGD([p], lr=lr, momentum=0.9, fused=True)
    else:
        opt = (torch.optim.AdamW([p], lr=lr, weight_decay=0.01, fused=True) if kind == "adamw"
               else torch.optim.Adam([p], lr=lr, fused=True))

    def step():
        w = p.data
        p.grad = torch.addcmul(g, g * g, w - backup, value=lam)
        backup.copy_(w)
        opt.step()
        st = opt.state[p]
        if kind == "sgd-momentum":
            est = g + (local - prev_local) * 0.5
            est.addcmul_(est * est, w - backup, value=lam)
            torch.add(w, 0.9 * st["momentum_buffer"] + est, alpha=-lr, out=w_hat)
            prev_local.copy_(local)
        else:
            est = local + lam * local * local * (w - backup)
            ms = st["exp_avg"] * 0.9 + 0.1 * est
            vs = st["exp_avg_sq"] * 0.999 + 0.001 * est * est
            torch.sub(w, lr * ms / (torch.sqrt(vs) + 1e-8), out=w_hat)
    return step


def dc_wp_compiled(kind, n):
    """torch.compile of the whole DC + update + WP step (scalars as device tensors: no recompiles)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    u = lambda lo, hi: torch.empty(n, device="cuda").uniform_(lo, hi, generator=gen)
    c = lambda x: torch.tensor(x, device="cuda")
    w, g, m, backup, local, prev_local = u(-1, 1), u(-0.01, 0.01), u(-0.01, 0.01), u(-1, 1), u(-0.01, 0.01), u(-0.01, 0.01)
    w_hat = torch.empty_like(w)
    if kind == "sgd-momentum":
        fn = torch.compile(sgd_dc_wp, fullgraph=True)
        args = (w, g, m, backup, w_hat, local, prev_local, c(1e-3), c(0.9), c(0.2), c(0.5))
    else:
        v = u(0, 1e-4)
        fn = torch.compile(adam_dc_wp, fullgraph=True)
        wd = 0.01 if kind == "adamw" else 0.0
        args = (w, g, m, v, backup, w_hat, local, c(1e-3), c(0.9), c(0.999), c(1e-8), c(wd), c(0.2), c(0.5), c(0.3), c(0.6), c(0.4))
    return lambda: fn(*args)


def copy_ms(n, reps):
    src = torch.empty(n, device="cuda").uniform_(-1, 1)
    dst = torch.empty_like(src)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for r in range(3 + reps):
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        if r >= 3:
            times.append(start.elapsed_time(stop))
    return statistics.median(times)


def read_sapipe(path):
    """sapipe_cuda_bench's back-to-back table (kernel time, timed as PyTorch's steps are here)."""
    rows = {}
    back_to_back = False
    with open(path) as f:
        for line in f:
            if line.startswith("back to back"):
                back_to_back = True
            elif line.startswith("MSTopK"):
                back_to_back = False
            parts = line.split()
            if back_to_back and len(parts) == 4:
                try:
                    rows[parts[0]] = float(parts[1])
                except ValueError:
                    pass
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=64 << 20)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--inner", type=int, default=20, help="steps issued back to back per timing")
    ap.add_argument("--sapipe", help="output of sapipe_cuda_bench for the same element count")
    a = ap.parse_args()
    global INNER
    INNER = a.inner
    n = a.elements
    optimizers = {
        "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True),
        "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True),
        "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, fused=True),
    }
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, {n} fp32 elements, "
          f"per step: {a.inner} steps back to back between CUDA events, median of {a.reps} after {a.warmup} warm-up")
    print(f"D2D copy (torch): {copy_ms(n, a.reps):.3f} ms")
    sapipe = read_sapipe(a.sapipe) if a.sapipe else {}
    result = {}
    for name, make in optimizers.items():
        med, lo, hi = time_steps(make, n, a.reps, a.warmup)
        line = f"torch {name:13s} fused: {med:.3f} ms (min {lo:.3f}, max {hi:.3f})"
        result[name] = {"torch_ms": med}
        for row in PAIRS[name]:
            if row in sapipe:
                ratio = sapipe[row] / med
                line += f" | sapipe {row} {sapipe[row]:.3f} ms = {ratio:.3f}x"
                result[name][row] = ratio
        print(line)
    dc_wp_rows = {"adam": "adam+dc+wp-local-dc", "adamw": "adamw+dc-adaptive+wp-prev-sync-dc",
                  "sgd-momentum": "sgd-momentum+dc+wp-local-prev-sync-dc"}
    for name, row in dc_wp_rows.items():
        line = f"DC+WP {name:13s}"
        for how, make in (("eager", dc_wp_eager), ("compiled", dc_wp_compiled)):
            try:
                med, lo, hi = timed(make(name, n), a.reps, a.warmup)
            except Exception as e:  # a compile failure is reported, not fatal
                line += f" | torch {how}: failed ({type(e).__name__}: {str(e)[:200]})"
                continue
            result[name][f"dc_wp_torch_{how}_ms"] = med
            line += f" | torch {how} {med:.3f} ms (min {lo:.3f}, max {hi:.3f})"
            if row in sapipe:
                result[name][f"{row}_over_{how}"] = sapipe[row] / med
                line += f" = sapipe {row} {sapipe[row]:.3f} ms x{sapipe[row] / med:.3f}"
            torch.cuda.empty_cache()
        print(line, flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
