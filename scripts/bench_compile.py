"""Compile time per network: every stage from source to the optimised training program (median of runs).

    python scripts/bench_compile.py [--runs 7] [--torch-compile]

With --torch-compile and PyTorch importable, it also times `torch.compile` of the same network's training
step on the CPU (the first call, which compiles; lenet and resnet50 only, it takes a while) and prints
the ratio to deepdsl's whole compile.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from deepdsl import api
from deepdsl.autodiff import train_program
from deepdsl.frontend.parser import _lark
from deepdsl.passes import kernels

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("parse", "elaborate", "autodiff", "optimise")


def time_stages(path: Path) -> tuple[dict[str, float], int, int]:
    text = path.read_text()
    c = api.Compilation()
    t = [time.perf_counter()]
    module = api.parse_stage(text, str(path), c)
    t.append(time.perf_counter())
    program = api.elaborate_stage(module, api.load_includes(module, c), {})
    t.append(time.perf_counter())
    train = train_program(program.graph, program.train.optimizer, program.train.seed)
    t.append(time.perf_counter())
    opt, _ = api.optimise(train, api.Options())
    t.append(time.perf_counter())
    return {s: t[i + 1] - t[i] for i, s in enumerate(STAGES)}, kernels(train), kernels(opt)


def torch_compile_seconds(path: Path) -> float | None:
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_runner import torch_training_step

    program = api.compile_file(path).program
    step = torch_training_step(program)
    if step is None:
        return None
    import torch

    compiled = torch.compile(step.forward)
    t0 = time.perf_counter()
    step(compiled)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--torch-compile", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    _lark()
    print(f"grammar load (once per process): {1000 * (time.perf_counter() - t0):.0f} ms")
    head = " ".join(f"{s + ' ms':>12}" for s in STAGES)
    print(f"{'network':<10} {head} {'total ms':>9} {'kernels -O0 -> -O2':>20}")
    for path in sorted((ROOT / "networks").glob("*.ddsl")):
        runs = [time_stages(path) for _ in range(args.runs)]
        med = {s: statistics.median(r[0][s] for r in runs) for s in STAGES}
        total = statistics.median(sum(r[0].values()) for r in runs)
        cols = " ".join(f"{1000 * med[s]:>12.1f}" for s in STAGES)
        print(f"{path.stem:<10} {cols} {1000 * total:>9.1f} {runs[0][1]:>11} -> {runs[0][2]:<6}")
        if args.torch_compile and path.stem in ("lenet", "resnet50"):
            theirs = torch_compile_seconds(path)
            if theirs is None:
                print("  torch.compile: PyTorch is not importable")
            else:
                print(f"  torch.compile first step: {theirs:.2f} s = {theirs / total:.0f}x deepdsl's whole compile")


if __name__ == "__main__":
    main()
