#!/usr/bin/env python3
"""The PyTorch side of `sapipe bench models`: PyTorch eager on the CPU or on one CUDA device,
driven by the sapipe CLI.

The CLI starts this script and talks to it in JSON lines (one request on stdin, one reply on
stdout), so that its runs interleave with sapipe's in one measurement:

  first reply (unasked):  the setup: torch version, threads, BLAS and its core (on a device:
                          torch.version.cuda, the GPU, TF32 off), or {"error": "no-torch", ...}
                          (exit 3) when `import torch` fails, {"error": "no-cuda", ...} (exit 3)
                          when the device asked for is not usable by torch
  {"op": "build", "name": N, "layers": [LayerSpec...], "batch": B, "classes": C, "rowsPerSample": R,
   "vocab": V or null, "inputSize": F, "seed": S, "lr": LR, "momentum": M}
                          builds model N from sapipe's layer list (the same JSON), the same
                          initialisation scale, a fixed batch and SGD; replies {"params": count}
  {"op": "steps", "name": N, "steps": K}   runs K training steps; replies {"ms": per step}
  {"op": "gemm", "size": S, "products": K} K products of S x S matrices; replies {"ms": per product}
  {"op": "quit"}

Threads come from the environment the CLI sets (SAPIPE_BENCH_THREADS; OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS alike), the device from SAPIPE_BENCH_DEVICE ("cpu", the default, or
"cuda:N"). On a device the model, its batch and the matrices live there, TF32 is off for matmuls
and cuDNN (sapipe computes in fp32), and each timed block ends with torch.cuda.synchronize(). A layer kind this script does not know fails with its name: add it
to `build_model` below when sapipe's Sequential gains one.
"""
import ctypes
import json
import math
import os
import sys
import time


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def blas_setup(torch):
    """BLAS as torch reports it, and OpenBLAS's own view (core, config) when it is the one loaded."""
    config = torch.__config__.show()
    blas_info = "unknown"
    for part in config.replace("\n", ",").split(","):
        part = part.strip()
        if part.startswith("BLAS_INFO="):
            blas_info = part[len("BLAS_INFO="):]
    out = {
        "blasInfo": blas_info,
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "cpuCapability": next((l.split(":", 1)[1].strip() for l in config.splitlines() if "CPU capability usage" in l), "unknown"),
        "openblas": None,
    }
    a = torch.ones(8, 8)
    (a @ a).sum().item()  # loads the BLAS library if it is loaded lazily
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "blas" in line.lower() and line.split()[-1].startswith("/")})
    except OSError:
        paths = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            corename = lib.openblas_get_corename
            corename.restype = ctypes.c_char_p
            cfg = lib.openblas_get_config
            cfg.restype = ctypes.c_char_p
            out["openblas"] = {
                "library": path,
                "core": corename().decode(),
                "config": cfg().decode().strip(),
                "threads": int(lib.openblas_get_num_threads()),
            }
            break
        except (OSError, AttributeError):
            continue
    if out["openblas"] is None and paths:
        out["libraries"] = paths
    return out


class Model:
    pass


def Embedding(torch, vocab, dim, context):
    """sapipe's `embedding` layer: token embedding plus a learned position embedding, GPT-2's N(0, 0.02) init."""
    nn = torch.nn

    class Module(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Parameter(torch.randn(vocab, dim) * 0.02)
            self.positions = nn.Parameter(torch.randn(context, dim) * 0.02)

        def forward(self, x):
            return self.tokens[x] + self.positions[: x.shape[1]]

    return Module()


def Block(torch, dim, heads, context, hidden):
    """sapipe's `transformerBlock`: the pre-LN GPT-2 block, causal attention written out as PyTorch
    1.13 users write it (no fused attention there), tanh GELU; separate q, k, v as sapipe's."""
    nn = torch.nn
    F = torch.nn.functional
    hd = dim // heads

    class Module(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-5), nn.LayerNorm(dim, eps=1e-5)
            self.q, self.k, self.v, self.proj = (nn.Linear(dim, dim) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
            for m in (self.q, self.k, self.v, self.proj, self.fc1, self.fc2):
                with torch.no_grad():
                    m.weight.normal_(0, 0.02)
                    m.bias.zero_()
            self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), diagonal=1))

        def forward(self, x):
            b, t, _ = x.shape
            u = self.ln1(x)
            q, k, v = (m(u).view(b, t, heads, hd).transpose(1, 2) for m in (self.q, self.k, self.v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = torch.softmax(att.masked_fill(self.mask[:t, :t], float("-inf")), dim=-1)
            h = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, dim))
            return h + self.fc2(F.gelu(self.fc1(self.ln2(h)), approximate="tanh"))

    return Module()


def build_model(torch, req):
    nn = torch.nn
    torch.manual_seed(int(req.get("seed", 1)))
    modules = []
    # What a sample is at this point: "flat" (a row of features, as sapipe holds every sample),
    # "image" ([C, H, W], for convolutions and pooling) or "rows" ([rows, features], for layers
    # applied to each of a sample's rows, as sapipe's `rows` on linear and layerNorm).
    state = {"shape": "flat", "rows": 1}

    def to_flat():
        if state["shape"] != "flat":
            modules.append(nn.Flatten())
            state["shape"] = "flat"

    def to_rows(rows, features):
        if rows == 1:
            to_flat()
        elif state["shape"] != "rows" or state["rows"] != rows:
            to_flat()
            modules.append(nn.Unflatten(1, (rows, features)))
            state["shape"], state["rows"] = "rows", rows

    def to_image(c, h, w):
        if state["shape"] != "image":
            to_flat()
            modules.append(nn.Unflatten(1, (c, h, w)))
            state["shape"] = "image"

    def uniform_(tensor, bound):
        with torch.no_grad():
            tensor.uniform_(-bound, bound)

    def init(module, fan_in):
        # sapipe's initialisation: kaimingUniform U(+-sqrt(6 / fanIn)) for weights, biasUniform
        # U(+-1 / sqrt(fanIn)) for biases (lib/nn/init.ts); PyTorch's default weight bound is
        # sqrt(6) times smaller.
        uniform_(module.weight, math.sqrt(6.0 / fan_in))
        uniform_(module.bias, 1.0 / math.sqrt(fan_in))

    for i, layer in enumerate(req["layers"]):
        kind = layer["kind"]
        if kind == "embedding":
            # Token ids [batch, context] -> [batch, context, dim]: a sample is `context` rows from here.
            modules.append(Embedding(torch, layer["vocab"], layer["dim"], layer["context"]))
            state["shape"], state["rows"] = "rows", int(layer["context"])
        elif kind == "transformerBlock":
            to_rows(int(layer["context"]), layer["dim"])
            modules.append(Block(torch, layer["dim"], layer["heads"], layer["context"], int(layer.get("hidden") or 4 * layer["dim"])))
        elif kind == "linear":
            to_rows(int(layer.get("rows", 1)), layer["in"])
            m = nn.Linear(layer["in"], layer["out"])
            init(m, layer["in"])
            modules.append(m)
        elif kind == "conv2d":
            to_image(layer["inChannels"], layer["height"], layer["width"])
            k = layer["kernel"]
            m = nn.Conv2d(layer["inChannels"], layer["outChannels"], k, stride=layer.get("stride", 1), padding=layer.get("padding", 0))
            init(m, layer["inChannels"] * k * k)
            modules.append(m)
        elif kind in ("maxPool", "avgPool"):
            to_image(layer["channels"], layer["height"], layer["width"])
            k = layer["kernel"]
            cls = nn.MaxPool2d if kind == "maxPool" else nn.AvgPool2d
            modules.append(cls(k, stride=layer.get("stride", k)))
        elif kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "gelu":
            modules.append(nn.GELU(approximate="tanh"))
        elif kind == "layerNorm":
            to_rows(int(layer.get("rows", 1)), layer["features"])
            modules.append(nn.LayerNorm(layer["features"], eps=1e-5))
        else:
            raise ValueError(f"layer {i}: kind {kind!r} has no PyTorch counterpart in this script yet (apps/bench/torch-models.py, build_model)")
    to_flat()
    model = Model()
    device = req["device"]
    model.device = device
    model.net = nn.Sequential(*modules).to(device)
    batch = int(req["batch"])
    classes = int(req["classes"])
    features = int(req["inputSize"])
    rows = int(req.get("rowsPerSample") or 1)
    vocab = req.get("vocab")
    # The same kind of batch as sapipe's side: values in [0, 1) (or token ids in [0, vocab)) and
    # labels r % classes, one per loss row (rowsPerSample of them a sample).
    model.x = (torch.randint(int(vocab), (batch, features)) if vocab else torch.rand(batch, features)).to(device)
    model.y = (torch.arange(batch * rows) % classes).to(device)
    model.classes = classes
    model.loss = nn.CrossEntropyLoss()
    model.opt = torch.optim.SGD(model.net.parameters(), lr=float(req["lr"]), momentum=float(req["momentum"]))
    model.params = sum(p.numel() for p in model.net.parameters())
    return model


def step(model):
    model.opt.zero_grad(set_to_none=True)
    loss = model.loss(model.net(model.x).reshape(-1, model.classes), model.y)
    loss.backward()
    model.opt.step()


def synchronize(torch, device):
    """Waits for the device's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    try:
        import torch
    except ImportError as error:
        send({"error": "no-torch", "message": str(error), "python": sys.executable, "pythonVersion": sys.version.split()[0]})
        return 3
    name = os.environ.get("SAPIPE_BENCH_DEVICE", "cpu") or "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        index = 0 if device.index is None else device.index
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            why = (
                f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees {torch.cuda.device_count()} CUDA device(s)"
                if torch.cuda.is_available()
                else f"torch {torch.__version__} cannot use CUDA (torch.version.cuda {torch.version.cuda}, torch.cuda.is_available() is False)"
            )
            send({"error": "no-cuda", "message": f"{name}: {why}", "python": sys.executable, "pythonVersion": sys.version.split()[0]})
            return 3
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        # sapipe computes in fp32: no TF32 in PyTorch's matmuls and convolutions either.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    threads = int(os.environ.get("SAPIPE_BENCH_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    setup = {
        "torch": torch.__version__,
        "python": sys.executable,
        "pythonVersion": sys.version.split()[0],
        "threads": torch.get_num_threads(),
        "interopThreads": torch.get_num_interop_threads(),
        "openblasCoretype": os.environ.get("OPENBLAS_CORETYPE"),
        "ompWaitPolicy": os.environ.get("OMP_WAIT_POLICY"),
    }
    if device.type == "cuda":
        setup.update({
            "device": f"cuda:{device.index}",
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(device),
            "tf32": {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)},
        })
    else:
        setup["device"] = "cpu"
        setup.update(blas_setup(torch))
    send(setup)
    models = {}
    matrices = {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "quit":
                break
            if op == "build":
                models[req["name"]] = build_model(torch, dict(req, device=device))
                send({"params": models[req["name"]].params})
            elif op == "steps":
                model = models[req["name"]]
                n = int(req["steps"])
                synchronize(torch, device)
                start = time.perf_counter()
                for _ in range(n):
                    step(model)
                synchronize(torch, device)
                send({"ms": (time.perf_counter() - start) * 1000 / max(n, 1)})
            elif op == "gemm":
                size = int(req["size"])
                if size not in matrices:
                    g = torch.Generator().manual_seed(0)
                    matrices[size] = tuple(m.to(device) for m in (torch.rand(size, size, generator=g) - 0.5, torch.rand(size, size, generator=g) - 0.5, torch.empty(size, size)))
                a, b, c = matrices[size]
                n = int(req["products"])
                synchronize(torch, device)
                start = time.perf_counter()
                for _ in range(n):
                    torch.mm(a, b, out=c)
                synchronize(torch, device)
                send({"ms": (time.perf_counter() - start) * 1000 / max(n, 1)})
            else:
                send({"error": "bad-request", "message": f"unknown op {op!r}"})
        except Exception as error:  # reported to the CLI, which fails with it
            send({"error": "failed", "message": f"{type(error).__name__}: {error}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
