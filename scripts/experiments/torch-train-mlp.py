"""PyTorch eager baseline for scripts/experiments/train-mlp.mjs: the same MLP (Linear + ReLU,
softmax cross-entropy), batch, optimizer (SGD with momentum) and data (export-mnist.mjs), every
batch on the device before the clock starts, the loss read back once every 50 steps.

    python3 scripts/experiments/torch-train-mlp.py --data DIR [--device cuda:0] [--sizes 784,128,10]
        [--batch 256] [--epochs 8] [--lr 0.05] [--momentum 0.9] [--steps 300] [--repeats 3]
        [--foreach | --fused]

Prints the setup (torch version, device, threads, BLAS) with the figures, so a baseline is never
read without knowing how it ran.
"""
import argparse, gzip, json, os, time

import numpy as np
import torch

p = argparse.ArgumentParser()
p.add_argument("--data", required=True)
p.add_argument("--device", default="cpu")
p.add_argument("--sizes", default="784,128,10")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--epochs", type=int, default=8)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--momentum", type=float, default=0.9)
p.add_argument("--steps", type=int, default=300)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--fused", action="store_true", help="torch.optim.SGD(fused=True)")
p.add_argument("--json", action="store_true")
a = p.parse_args()

def read(name):
    x = np.frombuffer(gzip.decompress(open(os.path.join(a.data, f"{name}-x.f32.gz"), "rb").read()), dtype="<f4")
    y = np.frombuffer(open(os.path.join(a.data, f"{name}-y.u8"), "rb").read(), dtype=np.uint8)
    return torch.from_numpy(x.copy()).view(len(y), -1), torch.from_numpy(y.astype(np.int64))

dev = torch.device(a.device)
sizes = [int(s) for s in a.sizes.split(",")]
torch.manual_seed(1)
layers = []
for i in range(len(sizes) - 1):
    layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
    if i + 2 < len(sizes):
        layers.append(torch.nn.ReLU())
model = torch.nn.Sequential(*layers).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, fused=True if a.fused else None)
loss_fn = torch.nn.CrossEntropyLoss()
(tx, ty), (vx, vy) = read("train"), read("test")
batches = [(tx[s:s + a.batch].to(dev), ty[s:s + a.batch].to(dev)) for s in range(0, len(ty) - a.batch + 1, a.batch)]
vx, vy = vx.to(dev), vy.to(dev)

def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)

def step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss

t0 = time.perf_counter()
for e in range(a.epochs):
    for i, (x, y) in enumerate(batches):
        loss = step(x, y)
        if i == len(batches) - 1:
            last = loss.item()
train_s = time.perf_counter() - t0
with torch.no_grad():
    acc = (model(vx).argmax(1) == vy).float().mean().item()

rates = []
for r in range(a.repeats):
    for i in range(20):
        step(*batches[i % len(batches)])
    sync()
    t = time.perf_counter()
    for i in range(a.steps):
        loss = step(*batches[i % len(batches)])
        if i % 50 == 49 or i == a.steps - 1:
            loss.item()
    rates.append(a.steps * a.batch / (time.perf_counter() - t))

setup = {"torch": torch.__version__, "device": str(dev), "threads": torch.get_num_threads(),
         "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
         "blas": torch.__config__.show().split("BLAS_INFO=")[-1].split(",")[0] if "BLAS_INFO=" in torch.__config__.show() else "?",
         "optimizer": "SGD fused" if a.fused else "SGD (default: foreach on CUDA)"}
result = {"setup": setup, "sizes": sizes, "batch": a.batch, "epochs": a.epochs, "trainSeconds": train_s, "finalLoss": last,
          "testAccuracy": acc, "samplesPerSecond": rates}
if a.json:
    print(json.dumps(result))
else:
    print(f"torch {setup['torch']} {dev} ({setup['gpu'] or str(setup['threads']) + ' threads, BLAS ' + setup['blas']}), {setup['optimizer']}, "
          f"MLP {'-'.join(map(str, sizes))} batch {a.batch}: test accuracy {acc * 100:.2f}% after {a.epochs} epochs ({train_s:.2f} s), "
          + " / ".join(f"{v:.0f}" for v in rates) + " samples/s")
