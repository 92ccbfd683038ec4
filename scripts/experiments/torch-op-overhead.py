"""PyTorch's cost of issuing one small operation on a GPU, beside scripts/experiments/op-overhead.mjs
(the same shapes: ReLU of 16 floats, bias add of 4 x 4, a 16 x 16 x 16 product), as the time to
issue 20 000 calls and the time until the device has run them, in microseconds per call.

    python3 scripts/experiments/torch-op-overhead.py [--device cuda:0] [--calls 20000]
"""
import argparse, time

import torch

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda:0")
p.add_argument("--calls", type=int, default=20000)
a = p.parse_args()
dev = torch.device(a.device)
x = torch.randn(16, device=dev)
y = torch.empty(16, device=dev)
m = torch.randn(16, 16, device=dev)
n = torch.randn(16, 16, device=dev)
c = torch.empty(16, 16, device=dev)
b = torch.randn(4, device=dev)
z = torch.randn(4, 4, device=dev)

def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)

def timed(name, fn):
    for _ in range(2000):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.calls):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    print(f"{name:32s} issue {(t1 - t0) / a.calls * 1e6:7.2f} us   until run {(t2 - t0) / a.calls * 1e6:7.2f} us")

print(f"torch {torch.__version__} on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, {a.calls} calls each")
with torch.no_grad():
    timed("relu into y (16 floats)", lambda: torch.clamp_min(x, 0, out=y))
    timed("add_ bias (4 x 4)", lambda: z.add_(b))
    timed("mm out= (16 x 16 x 16)", lambda: torch.mm(m, n, out=c))
