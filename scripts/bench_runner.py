"""Train-step time of the NumPy reference runner, and of PyTorch (CPU) on the same network, as a ratio.

    python scripts/bench_runner.py [--steps 10] [--threads 1]

The PyTorch side runs the very same forward graph (an interpreter over our IR with torch.nn.functional)
with autograd and torch.optim.SGD, same batch, same number of threads (OpenBLAS's for NumPy, set before
NumPy loads; torch.set_num_threads for PyTorch). Where PyTorch is not importable only the NumPy figures
are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

THREADS = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--threads=")), None) or (
    sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
)
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = THREADS

import numpy as np  # noqa: E402 — after the thread settings

from deepdsl import api  # noqa: E402 — after the thread settings
from deepdsl.data.named import fields_of, load_samples  # noqa: E402 — after the thread settings
from deepdsl.trainer import Trainer  # noqa: E402 — after the thread settings

ROOT = Path(__file__).resolve().parent.parent
CASES = [
    ("lenet", {"N": 64}),
    ("resnet50", {"N": 8, "H": 64, "W": 64}),
]


def median_seconds(step, steps: int, warmup: int = 1) -> float:  # noqa: ANN001
    """The median time of one of `steps` calls of `step()`, after `warmup` calls not timed."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def numpy_step_seconds(program, steps: int) -> float:  # noqa: ANN001
    t = Trainer(api.build(program), load_samples("synthetic", {}, fields_of(program.graph.inputs), 1))
    return median_seconds(t.step, steps)


def torch_training_step(program, threads: int = 1, device: str = "cpu", channels_last: bool = False):  # noqa: ANN001, ANN201
    """A PyTorch function running one training step of `program`'s forward graph on `device`, or None without
    PyTorch; with `channels_last`, the 4-D parameters and inputs in that memory format (scripts/bench_gpu.py's AMP
    row)."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(threads)
    g = program.graph
    torch.manual_seed(0)
    params = {}
    for p in g.params:
        shape = p.value.type.shape
        value = (torch.full(shape, p.init.args[0], device=device) if p.init.kind == "constant"
                 else torch.randn(shape, device=device) * 0.05)  # fmt: skip
        if channels_last and value.dim() == 4:
            value = value.contiguous(memory_format=torch.channels_last)
        params[p.value.name] = value.requires_grad_(p.kind == "param")
    ops = {
        "conv2d": lambda a, x, w: F.conv2d(x, w, stride=a["stride"], padding=a["pad"], groups=a["groups"]),
        "bias_add": lambda a, x, b: x + b.reshape((1, -1) + (1,) * (x.dim() - 2)),
        "max_pool2d": lambda a, x: F.max_pool2d(x, a["kernel"], a["stride"], a["pad"]),
        "avg_pool2d": lambda a, x: F.avg_pool2d(x, a["kernel"], a["stride"], a["pad"], count_include_pad=True),
        "global_avg_pool": lambda a, x: F.adaptive_avg_pool2d(x, 1),
        "linear": lambda a, x, w: F.linear(x, w),
        "reshape": lambda a, x: x.reshape(a["shape"]),
        "relu": lambda a, x: F.relu(x),
        "add": lambda a, x, y: x + y,
        "concat": lambda a, *xs: torch.cat(xs, dim=a["axis"]),
        "lrn": lambda a, x: F.local_response_norm(x, a["size"], a["alpha"], a["beta"], a["k"]),
        "dropout": lambda a, x: F.dropout(x, a["p"], training=True),
        "batch_norm": lambda a, x, rm, rv, *gb: F.batch_norm(
            x, rm, rv, *gb, training=True, momentum=a["momentum"], eps=a["eps"]
        ),  # fmt: skip
        "softmax_cross_entropy": lambda a, x, y: F.cross_entropy(x, y),
    }
    x_def = next(d for d in g.inputs if d.kind == "input")
    y_def = next(d for d in g.inputs if d.kind == "label")
    feeds = {x_def.value.name: torch.rand(x_def.value.type.shape, device=device),
             y_def.value.name: torch.randint(0, y_def.classes, y_def.value.type.shape, device=device)}  # fmt: skip
    if channels_last and feeds[x_def.value.name].dim() == 4:
        feeds[x_def.value.name] = feeds[x_def.value.name].contiguous(memory_format=torch.channels_last)
    opt_args = dict(program.train.optimizer[1])
    trainable = [params[p.value.name] for p in g.params if p.kind == "param"]
    opt = torch.optim.SGD(trainable, lr=opt_args.get("lr", 0.01), momentum=opt_args.get("momentum", 0.0),
                          weight_decay=opt_args.get("weight_decay", 0.0))  # fmt: skip

    def forward() -> torch.Tensor:
        env = {**feeds, **params}
        for s in g.stmts:
            env[s.out.name] = ops[s.op](s.a, *(env[v.name] for v in s.inputs))
        return env[g.output("loss").name]

    def step(fwd=forward) -> None:  # noqa: ANN001
        opt.zero_grad()
        fwd().backward()
        opt.step()

    step.forward = forward  # type: ignore[attr-defined]
    step.parameters = list(params.values())  # type: ignore[attr-defined]
    return step


def torch_step_seconds(program, steps: int) -> float | None:  # noqa: ANN001
    step = torch_training_step(program, int(THREADS))
    return None if step is None else median_seconds(step, steps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="BLAS / PyTorch threads on both sides")
    args = ap.parse_args()
    head = f"{'network':<10} {'sizes':<24} {'numpy ms':>9} {'torch ms':>9} {'numpy/torch':>12}"
    print(f"{head}   (median of {args.steps})")
    for name, sets in CASES:
        program = api.compile_file(ROOT / "networks" / f"{name}.ddsl", sets).program
        ours = numpy_step_seconds(program, args.steps)
        theirs = torch_step_seconds(program, args.steps)
        ratio = f"{ours / theirs:>12.2f}" if theirs else f"{'n/a':>12}"
        torch_ms = f"{1000 * theirs:>9.1f}" if theirs else f"{'n/a':>9}"
        sizes = " ".join(f"{k}={v}" for k, v in sets.items())
        print(f"{name:<10} {sizes:<24} {1000 * ours:>9.1f} {torch_ms} {ratio}")
    try:
        import torch

        print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads; NumPy {np.__version__}, "
              f"OPENBLAS_NUM_THREADS={THREADS}")  # fmt: skip
    except ImportError:
        print("PyTorch is not importable here: only the NumPy runner was timed")


if __name__ == "__main__":
    main()
