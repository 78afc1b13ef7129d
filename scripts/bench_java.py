"""Train-step time of the generated Java program (CPU device) against the NumPy runner and PyTorch CPU.

    python scripts/bench_java.py [--network lenet|resnet50|all] [--blas java|openblas|both]
                                 [--warmup N] [--steps N] [--threads N] [--runs 3] [--no-numpy]

LeNet at batch 64 and ResNet-50 at batch 8, 64x64, on synthetic data. The Java class is compiled with
`deepdsl compile` and javac, then run for warm-up + measured steps, once per SGEMM (`--blas`: the Java SGEMM
and OpenBLAS, whose jars it takes from $DEEPDSL_JCUDA_JARS or .ci/jcuda/lib, as the tests do); each step's time
comes from the program's `--json` (`step_seconds`: the step alone, data loading excluded), and the median of the
measured steps is the Java figure. The warm-up steps are left out because the JIT is still compiling then: LeNet's steps
reach their steady speed only after some 30 steps (a training run takes thousands), so its warm-up defaults
to 40; ResNet-50's to 24 (on two threads at `b180079` its steps 9-16 took 163-199 ms and every step from the
20th 161-174 ms). The NumPy runner and
PyTorch are timed as in scripts/bench_runner.py (median step after one warm-up step), all with the same
number of threads (-XX:ActiveProcessorCount for Java). PyTorch is skipped where it is not importable.

The three are measured `--runs` times in turn and each figure is the median of its runs, with the range of the
runs beside it, and each run's Java figure over the PyTorch figure measured right after it (a neighbour's load
slows both of a pair); the load average before and after says how busy the machine was (other jobs skew the
figures, the more so with more threads).
"""

from __future__ import annotations

import argparse
import json
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

# network: (class, sizes, warm-up steps, measured steps)
NETWORKS = {
    "lenet": ("LeNet", {"N": 64}, 40, 20),
    "resnet50": ("ResNet50", {"N": 8, "H": 64, "W": 64}, 24, 8),
}


def openblas_jars() -> str:
    """The class path of the OpenBLAS jars (JavaCPP's presets), as tests/backends/java_env.py finds them."""
    folder = Path(os.environ.get("DEEPDSL_JCUDA_JARS", ROOT / ".ci" / "jcuda" / "lib"))
    if not list(folder.glob("openblas-*.jar")):
        sys.exit(f"no OpenBLAS jars in {folder}: `mvn -f .ci/jcuda/pom.xml dependency:copy-dependencies "
                 "-DoutputDirectory=lib` fetches them (or run with --blas java)")  # fmt: skip
    return f"{folder}/*"


def build_java(tmp: Path, network: str, sizes: dict[str, int] | None = None) -> Path:
    """The class of networks/`network`.ddsl (at `sizes`, default those of NETWORKS) and its runtime (CUDA device
    left out) compiled into `tmp`/build."""
    src, build = tmp / "src", tmp / "build"
    sizes = NETWORKS[network][1] if sizes is None else sizes
    sets = [arg for k, v in sizes.items() for arg in ("--set", f"{k}={v}")]
    net = str(ROOT / "networks" / f"{network}.ddsl")
    subprocess.run([sys.executable, "-m", "deepdsl", "compile", net, *sets, "-o", str(src)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    sources = [str(p) for p in [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")]]
    cpu_only = [s for s in sources if not s.endswith("CudaDevice.java")]  # runs without the JCuda jars
    subprocess.run(["javac", "-nowarn", "-d", str(build), *cpu_only], check=True)
    return build


def java_step_seconds(build: Path, network: str, blas: str, warmup: int, steps: int, threads: int,
                      main: str | None = None) -> float:  # fmt: skip
    """The median time of one of `steps` training steps after `warmup` steps of the class `main` (default: that of
    NETWORKS[network]) on the SGEMM `blas`."""
    if main is None:
        main = NETWORKS[network][0]
    cp = f"{build}:{openblas_jars()}" if blas == "openblas" else str(build)
    cmd = ["java", f"-XX:ActiveProcessorCount={threads}", "-cp", cp, main, "--data", "synthetic", "--device", "cpu",
           "--threads", str(threads), "--blas", blas, "--iters", str(warmup + steps), "--json"]  # fmt: skip
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert f"GEMM {'OpenBLAS' if blas == 'openblas' else 'Java SGEMM'}" in r.stderr, r.stderr
    seconds = json.loads(r.stdout.strip().splitlines()[-1])["step_seconds"]  # each step alone, data excluded
    assert len(seconds) == warmup + steps, seconds
    return statistics.median(seconds[warmup:])


def figure(runs: list[float]) -> str:
    """The median of `runs` in ms, with their range when there are several."""
    text = f"{1000 * statistics.median(runs):8.1f} ms"
    return text + f"  ({1000 * min(runs):.1f}-{1000 * max(runs):.1f})" if len(runs) > 1 else text


def bench(network: str, blases: list[str], args: argparse.Namespace) -> None:
    main, sets, warmup, steps = NETWORKS[network]
    warmup = warmup if args.warmup is None else args.warmup
    steps = steps if args.steps is None else args.steps
    program = api.compile_file(ROOT / "networks" / f"{network}.ddsl", sets).program
    load_before = os.getloadavg()[0]
    java_s: dict[str, list[float]] = {b: [] for b in blases}
    numpy_s, torch_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        build = build_java(Path(tmp), network)
        for _ in range(args.runs):
            for blas in blases:
                java_s[blas].append(java_step_seconds(build, network, blas, warmup, steps, args.threads))
            if args.numpy:
                numpy_s.append(bench_runner.numpy_step_seconds(program, steps))
            t = bench_runner.torch_step_seconds(program, steps)
            if t is not None:
                torch_s.append(t)
    sizes = " ".join(f"{k}={v}" for k, v in sets.items())
    load = f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(f"{main} {sizes}, one training step, {args.threads} thread(s), {steps} measured steps "
          f"(Java after {warmup} warm-up steps), median of {args.runs} run(s); {load}")  # fmt: skip
    medians = {b: statistics.median(java_s[b]) for b in blases}
    torch_m = statistics.median(torch_s) if torch_s else None
    for blas in blases:
        ratio = f"   java/torch = {medians[blas] / torch_m:.2f}" if torch_m else ""
        if torch_m and len(torch_s) > 1:  # each run's Java against the PyTorch run after it: a slow spell slows both
            paired = [j / t for j, t in zip(java_s[blas], torch_s, strict=True)]
            ratio += f" (run by run {' '.join(f'{r:.2f}' for r in paired)})"
        print(f"  Java, {'OpenBLAS' if blas == 'openblas' else 'Java SGEMM':<10} {figure(java_s[blas])}{ratio}")
    if len(blases) == 2:
        print(f"  OpenBLAS / Java SGEMM = {medians['openblas'] / medians['java']:.2f}")
    if numpy_s:
        best = min(medians.values())
        print(f"  NumPy runner      {figure(numpy_s)}   java/numpy = {best / statistics.median(numpy_s):.2f}")
    if torch_m is None:
        print("  PyTorch is not importable here: not timed")
    else:
        import torch

        print(f"  PyTorch {torch.__version__:<9} {figure(torch_s)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", choices=[*NETWORKS, "all"], default="lenet")
    ap.add_argument("--blas", choices=["java", "openblas", "both"], default="both", help="the Java side's SGEMM")
    ap.add_argument("--warmup", type=int, help="Java steps left out while the JIT compiles (default per network)")
    ap.add_argument("--steps", type=int, help="measured steps of every side (default per network)")
    ap.add_argument("--threads", type=int, default=int(THREADS), help="threads of every side")
    ap.add_argument("--runs", type=int, default=3, help="measurements of each side, taken in turn")
    ap.add_argument("--no-numpy", dest="numpy", action="store_false", help="leave out the NumPy runner")
    args = ap.parse_args()
    blases = ["java", "openblas"] if args.blas == "both" else [args.blas]
    for network in NETWORKS if args.network == "all" else [args.network]:
        bench(network, blases, args)


if __name__ == "__main__":
    main()
