"""Train-step time of the generated Java program (CPU device) against the NumPy runner and PyTorch CPU.

    python scripts/bench_java.py [--steps 10] [--threads N]

LeNet at batch 64 on synthetic data. The Java class is compiled with `deepdsl compile` and javac, then run for
warm-up + measured steps; each progress line gives one step's images/s (the step alone, data loading
excluded), and the median of the measured steps is the Java figure, JIT warm-up excluded. The NumPy runner and
PyTorch are timed as in scripts/bench_runner.py (median step after one warm-up step), all with the same
number of threads (-XX:ActiveProcessorCount for Java). PyTorch is skipped where it is not importable.
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
WARMUP = 5


def java_step_seconds(steps: int, threads: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        src, build = Path(tmp) / "src", Path(tmp) / "build"
        sets = [arg for k, v in SETS.items() for arg in ("--set", f"{k}={v}")]
        net = str(ROOT / "networks" / f"{NETWORK}.ddsl")
        subprocess.run([sys.executable, "-m", "deepdsl", "compile", net, *sets, "-o", str(src)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        sources = [str(p) for p in [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")]]
        cpu_only = [s for s in sources if not s.endswith("CudaDevice.java")]  # runs without the JCuda jars
        subprocess.run(["javac", "-nowarn", "-d", str(build), *cpu_only], check=True)

        cmd = ["java", f"-XX:ActiveProcessorCount={threads}", "-cp", str(build), "LeNet", "--data", "synthetic",
               "--device", "cpu", "--iters", str(WARMUP + steps)]  # fmt: skip
        lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
        rates = [float(line.split()[-2].replace(",", "")) for line in lines if line.endswith("images/s")]
        assert len(rates) == WARMUP + steps, lines
        return statistics.median(SETS["N"] / rate for rate in rates[WARMUP:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=int(THREADS), help="threads of every side")
    args = ap.parse_args()
    program = api.compile_file(ROOT / "networks" / f"{NETWORK}.ddsl", SETS).program
    java_s = java_step_seconds(args.steps, args.threads)
    numpy_s = bench_runner.numpy_step_seconds(program, args.steps)
    torch_s = bench_runner.torch_step_seconds(program, args.steps)
    sizes = " ".join(f"{k}={v}" for k, v in SETS.items())
    print(f"LeNet {sizes}, one training step, {args.threads} thread(s), {args.steps} measured steps")
    print(f"  Java CPU device   {1000 * java_s:8.1f} ms")
    print(f"  NumPy runner      {1000 * numpy_s:8.1f} ms   java/numpy = {java_s / numpy_s:.2f}")
    if torch_s is None:
        print("  PyTorch is not importable here: not timed")
    else:
        import torch

        print(f"  PyTorch {torch.__version__:<9} {1000 * torch_s:8.1f} ms   java/torch = {java_s / torch_s:.2f}")


if __name__ == "__main__":
    main()
