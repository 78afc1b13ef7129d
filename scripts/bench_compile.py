"""Compile time: the whole `deepdsl compile` and `deepdsl check` processes of ResNet-50, and every stage per network.

    python scripts/bench_compile.py [--runs 5] [--stages] [--stage-runs 7]

First the CPU time (user + system, of the whole process: interpreter start, imports, every stage, the files
written) of `deepdsl compile networks/resnet50.ddsl -o DIR` and of `deepdsl check networks/resnet50.ddsl`, the
median of `--runs` processes after one warm-up run, beside `torch.compile` of the same network's training step on
the CPU where PyTorch is importable (its first call, which compiles it and runs the step once; said so where
PyTorch is missing). The processes run with this interpreter and environment: where PYTHONDONTWRITEBYTECODE is set
and the package has no byte code cached, each process compiles deepdsl's sources too (the script says which).
With --stages, then the time of each stage from source to the optimised training program, per network.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("parse", "elaborate", "autodiff", "optimise")
RESNET = ROOT / "networks" / "resnet50.ddsl"


def process_cpu_seconds(args: list[str]) -> float:
    """User + system CPU seconds of one run of `args` (it must succeed), the process and any children it waits for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def median_cpu(args: list[str], runs: int) -> tuple[float, list[float]]:
    process_cpu_seconds(args)  # warm-up: the OS's file cache, and the byte code where Python may write it
    times = [process_cpu_seconds(args) for _ in range(runs)]
    return statistics.median(times), times


def byte_code_note() -> str:
    cached = any((ROOT / "deepdsl" / "__pycache__").glob("api.*.pyc"))
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not cached:
        return "PYTHONDONTWRITEBYTECODE is set and deepdsl has no cached byte code: each process compiles its sources"
    return "deepdsl's byte code cached (as an installed package has it)"


def torch_compile_cpu(path: Path) -> tuple[float, float] | None:
    """(CPU seconds, wall seconds) of torch.compile's first call of the network's training step, or None without
    PyTorch. The CPU time counts this process and the compile workers it waits for."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_runner import torch_training_step

    from deepdsl import api

    step = torch_training_step(api.compile_file(path).program)
    if step is None:
        return None
    import torch

    compiled = torch.compile(step.forward)
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    t0 = time.perf_counter()
    step(compiled)
    wall = time.perf_counter() - t0
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(a.ru_utime - b.ru_utime + a.ru_stime - b.ru_stime for a, b in zip(after, before))
    return cpu, wall


def whole_process(runs: int) -> None:
    py = [sys.executable, "-m", "deepdsl"]
    with tempfile.TemporaryDirectory() as out:
        rows = [
            ("deepdsl compile resnet50.ddsl -o DIR", [*py, "compile", str(RESNET), "-o", out]),
            ("deepdsl check resnet50.ddsl", [*py, "check", str(RESNET)]),
        ]
        print(f"ResNet-50, CPU seconds (user + system) of the whole process, median of {runs} ({byte_code_note()}):")
        ours = {}
        for label, args in rows:
            med, times = median_cpu(args, runs)
            ours[label] = med
            print(f"  {label:<40} {med:6.3f} s   ({' '.join(f'{t:.3f}' for t in times)})")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("  torch.compile of the same training step: not measured, PyTorch is not importable here")
        return
    theirs = torch_compile_cpu(RESNET)
    assert theirs is not None
    cpu, wall = theirs
    mine = ours[rows[0][0]]
    print(f"  {'torch.compile, first training step':<40} {cpu:6.3f} s   (wall {wall:.2f} s; compiles and runs the "
          f"step once) = {cpu / mine:.1f}x deepdsl compile")  # fmt: skip


def time_stages(path: Path) -> tuple[dict[str, float], int, int]:
    from deepdsl import api
    from deepdsl.autodiff import train_program
    from deepdsl.passes import kernels

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


def stages(runs: int) -> None:
    from deepdsl.frontend.parser import _lark

    t0 = time.perf_counter()
    _lark()
    print(f"grammar load (once per process): {1000 * (time.perf_counter() - t0):.0f} ms")
    head = " ".join(f"{s + ' ms':>12}" for s in STAGES)
    print(f"{'network':<10} {head} {'total ms':>9} {'kernels -O0 -> -O2':>20}")
    for path in sorted((ROOT / "networks").glob("*.ddsl")):
        results = [time_stages(path) for _ in range(runs)]
        med = {s: statistics.median(r[0][s] for r in results) for s in STAGES}
        total = statistics.median(sum(r[0].values()) for r in results)
        cols = " ".join(f"{1000 * med[s]:>12.1f}" for s in STAGES)
        print(f"{path.stem:<10} {cols} {1000 * total:>9.1f} {results[0][1]:>11} -> {results[0][2]:<6}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="processes per whole-process figure (default 5)")
    ap.add_argument("--stages", action="store_true", help="also time each stage per network, in this process")
    ap.add_argument("--stage-runs", type=int, default=7)
    args = ap.parse_args()
    whole_process(args.runs)
    if args.stages:
        print()
        stages(args.stage_runs)


if __name__ == "__main__":
    main()
