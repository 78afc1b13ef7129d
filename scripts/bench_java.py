"""Train-step time of the generated Java program (CPU device) against the NumPy runner and PyTorch CPU.

    python scripts/bench_java.py [--warmup 40] [--steps 20] [--threads N] [--runs 3]

LeNet at batch 64 on synthetic data. The Java class is compiled with `deepdsl compile` and javac, then run for
warm-up + measured steps; each progress line gives one step's images/s (the step alone, data loading
excluded), and the median of the measured steps is the Java figure. The warm-up steps are left out because
the JIT is still compiling then: the steps reach their steady speed only after some 30 steps (a training run
takes thousands), so `--warmup` defaults to 40. The NumPy runner and
PyTorch are timed as in scripts/bench_runner.py (median step after one warm-up step), all with the same
number of threads (-XX:ActiveProcessorCount for Java). PyTorch is skipped where it is not importable.

The three are measured `--runs` times in turn and each figure is the median of its runs, with the range of the
runs beside it; the load average before and after says how busy the machine was (other jobs skew the figures,
the more so with more threads).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
THREADS = str(os.cpu_count() or 1)
if "--threads" not in sys.argv and not any(a.startswith("--threads=") for a in sys.argv):
    sys.argv += ["--threads", THREADS]  # bench_runner reads it at import to set the BLAS threads
sys.path.insert(0, str(HERE))

import bench_runner  # noqa: E402 — after the thread settings

from deepdsl import api  # noqa: E402

NETWORK, SETS = "lenet", {"N": 64}


def build_java(tmp: Path, network: str = NETWORK, sizes: dict[str, int] = SETS) -> Path:
    """The class of networks/`network`.ddsl at `sizes` (LeNet at batch 64 by default) and its runtime (CUDA device
    left out) compiled into `tmp`/build."""
    src, build = tmp / "src", tmp / "build"
    sets = [arg for k, v in sizes.items() for arg in ("--set", f"{k}={v}")]
    net = str(ROOT / "networks" / f"{network}.ddsl")
    subprocess.run([sys.executable, "-m", "deepdsl", "compile", net, *sets, "-o", str(src)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    sources = [str(p) for p in [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")]]
    cpu_only = [s for s in sources if not s.endswith("CudaDevice.java")]  # runs without the JCuda jars
    subprocess.run(["javac", "-nowarn", "-d", str(build), *cpu_only], check=True)
    return build


def java_step_seconds(build: Path, warmup: int, steps: int, threads: int, cls: str = "LeNet",
                      batch: int = SETS["N"]) -> float:  # fmt: skip
    """The median time of one of `steps` training steps of class `cls` (batch `batch`) after `warmup` steps."""
    cmd = ["java", f"-XX:ActiveProcessorCount={threads}", "-cp", str(build), cls, "--data", "synthetic",
           "--device", "cpu", "--iters", str(warmup + steps)]  # fmt: skip
    lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    rates = [float(line.split()[-2].replace(",", "")) for line in lines if line.endswith("images/s")]
    assert len(rates) == warmup + steps, lines
    return statistics.median(batch / rate for rate in rates[warmup:])


def figure(runs: list[float]) -> str:
    """The median of `runs` in ms, with their range when there are several."""
    text = f"{1000 * statistics.median(runs):8.1f} ms"
    return text + f"  ({1000 * min(runs):.1f}-{1000 * max(runs):.1f})" if len(runs) > 1 else text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=40, help="Java steps left out while the JIT compiles")
    ap.add_argument("--steps", type=int, default=20, help="measured steps of every side")
    ap.add_argument("--threads", type=int, default=int(THREADS), help="threads of every side")
    ap.add_argument("--runs", type=int, default=3, help="measurements of each side, taken in turn")
    args = ap.parse_args()
    program = api.compile_file(ROOT / "networks" / f"{NETWORK}.ddsl", SETS).program
    load_before = os.getloadavg()[0]
    java_s, numpy_s, torch_s = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        build = build_java(Path(tmp))
        for _ in range(args.runs):
            java_s.append(java_step_seconds(build, args.warmup, args.steps, args.threads))
            numpy_s.append(bench_runner.numpy_step_seconds(program, args.steps))
            t = bench_runner.torch_step_seconds(program, args.steps)
            if t is not None:
                torch_s.append(t)
    java_m, numpy_m = statistics.median(java_s), statistics.median(numpy_s)
    sizes = " ".join(f"{k}={v}" for k, v in SETS.items())
    load = f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(f"LeNet {sizes}, one training step, {args.threads} thread(s), {args.steps} measured steps "
          f"(Java after {args.warmup} warm-up steps), "
          f"median of {args.runs} run(s); {load}")  # fmt: skip
    print(f"  Java CPU device   {figure(java_s)}")
    print(f"  NumPy runner      {figure(numpy_s)}   java/numpy = {java_m / numpy_m:.2f}")
    if not torch_s:
        print("  PyTorch is not importable here: not timed")
    else:
        import torch

        torch_m = statistics.median(torch_s)
        print(f"  PyTorch {torch.__version__:<9} {figure(torch_s)}   java/torch = {java_m / torch_m:.2f}")


if __name__ == "__main__":
    main()
