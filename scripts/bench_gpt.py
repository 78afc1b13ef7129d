"""Train-step time of networks/gpt_tiny.ddsl on the Java CPU device and the NumPy runner against PyTorch CPU.

    python scripts/bench_gpt.py [--set T=64] [--warmup 20] [--steps 10] [--threads N] [--runs 2]

The same network three ways, one training step (forward, backward, Adam) on a batch of N sequences of T
characters: the generated Java program (`deepdsl compile` + javac, timed as scripts/bench_java.py times it: the
median of its measured steps' own rates after the JIT's warm-up steps), the NumPy runner (as
scripts/bench_runner.py times it: the median step after one warm-up step) and PyTorch's nn.Module of the same
network (scripts/gpt_tiny_pytorch.py) with torch.optim.Adam, the median step after two warm-up steps. All use
the same number of threads. PyTorch is skipped, and said to be, where it is not importable; each figure is the
median of `--runs` runs taken in turn, with their range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
THREADS = str(os.cpu_count() or 1)
if "--threads" not in sys.argv and not any(a.startswith("--threads=") for a in sys.argv):
    sys.argv += ["--threads", THREADS]  # bench_runner reads it at import to set the BLAS threads
sys.path.insert(0, str(HERE))

import bench_java  # noqa: E402 — after the thread settings
import bench_runner  # noqa: E402
import gpt_tiny_pytorch  # noqa: E402

from deepdsl import api  # noqa: E402

NETWORK = "gpt_tiny"
SIZES = {"N": 16, "T": 64}


def torch_step_seconds(sizes: dict[str, int], lr: float, steps: int, threads: int) -> float | None:
    """The median PyTorch CPU training step of gpt_tiny at `sizes`, or None where torch is not importable."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = {**gpt_tiny_pytorch.CONFIG, "context": sizes["T"]}
    model = gpt_tiny_pytorch.pytorch_model(**config)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    tokens = torch.randint(0, config["vocab"], (sizes["N"], sizes["T"]))
    targets = torch.randint(0, config["vocab"], (sizes["N"], sizes["T"]))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(model(tokens).reshape(-1, config["vocab"]), targets.reshape(-1)).backward()
        opt.step()

    return bench_runner.median_seconds(step, steps, warmup=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a size of the network")
    ap.add_argument("--warmup", type=int, default=20, help="Java steps left out while the JIT compiles")
    ap.add_argument("--steps", type=int, default=10, help="measured steps of every side")
    ap.add_argument("--threads", type=int, default=int(THREADS), help="threads of every side")
    ap.add_argument("--runs", type=int, default=2, help="measurements of each side, taken in turn")
    ap.add_argument("--blas", choices=["java", "openblas"], default="openblas", help="the Java side's SGEMM")
    args = ap.parse_args()
    sizes = {**SIZES, **{k: int(v) for k, v in (s.split("=", 1) for s in args.set)}}
    program = api.compile_file(ROOT / "networks" / f"{NETWORK}.ddsl", sizes).program
    kind, options = program.train.optimizer
    assert kind == "adam", kind
    lr = dict(options).get("lr", 0.001)
    load_before = os.getloadavg()[0]
    java_s, numpy_s, torch_s = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        build = bench_java.build_java(Path(tmp), NETWORK, sizes)
        for _ in range(args.runs):
            java_s.append(bench_java.java_step_seconds(build, NETWORK, args.blas, args.warmup, args.steps,
                                                       args.threads, "GPTTiny"))  # fmt: skip
            numpy_s.append(bench_runner.numpy_step_seconds(program, args.steps))
            t = torch_step_seconds(sizes, lr, args.steps, args.threads)
            if t is not None:
                torch_s.append(t)
    java_m, numpy_m = statistics.median(java_s), statistics.median(numpy_s)
    text = " ".join(f"{k}={v}" for k, v in sizes.items())
    load = f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(f"GPTTiny {text}, one training step (Adam), {args.threads} thread(s), {args.steps} measured steps "
          f"(Java after {args.warmup} warm-up steps), median of {args.runs} run(s); {load}")  # fmt: skip
    print(f"  Java CPU device   {bench_java.figure(java_s)}   (GEMM: {args.blas})")
    print(f"  NumPy runner      {bench_java.figure(numpy_s)}   java/numpy = {java_m / numpy_m:.2f}")
    if not torch_s:
        print("  PyTorch is not importable here: not timed")
    else:
        import torch

        torch_m = statistics.median(torch_s)
        print(f"  PyTorch {torch.__version__:<9} {bench_java.figure(torch_s)}   java/torch = {java_m / torch_m:.2f}"
              f"   numpy/torch = {numpy_m / torch_m:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
