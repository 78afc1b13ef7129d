"""The training step on a GPU: deepdsl's kernels (the PyCUDA runner, timed with CUDA events) against PyTorch eager
on the same network, measured in the same run; and the generated Java program's CUDA device where a Java and
its classes are given (scripts/gpu_check.sh passes them).

    python scripts/bench_gpu.py [--steps 20] [--java JAVA --cp CLASSPATH] [--json OUT.json]

Per network (LeNet and ResNet-50 at batch 64): our median step in ms, PyTorch eager's in fp32 with TF32 off
(both sides then compute in true fp32) and with PyTorch's default TF32 settings, the ratios, and our achieved
FLOP/s against the H200's fp32 peak. Needs PyCUDA, PyTorch and a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_runner  # noqa: E402

from deepdsl import api  # noqa: E402
from deepdsl.backends.cuda.runner import GpuRunner, PyCudaDriver  # noqa: E402
from deepdsl.initializers import init_array  # noqa: E402
from deepdsl.memory.report import flops  # noqa: E402

CASES = [("lenet", {"N": 64}, "LeNet"), ("resnet50", {"N": 64}, "ResNet50")]
FP32_PEAK = 67e12  # H200 (and H100 SXM): 67 TFLOP/s fp32 without tensor cores (NVIDIA's data sheet)
WARMUP = 3


def runner_for(c: api.Compilation, kernels: str) -> tuple[GpuRunner, Callable[[int], dict[str, np.ndarray]]]:
    """A PyCUDA runner of `c`'s train step with its parameters initialised, and the feeds of step k (random inputs
    and labels, fixed by the seed)."""
    driver = PyCudaDriver(kernels)
    g = c.plan.graph
    seed = c.program.train.seed
    arrays = {p.value.name: init_array(p.value.name, p.value.type.shape, p.init.kind, p.init.args, p.init.fan_in,
                                       p.init.fan_out, seed, np.float32) for p in g.params}  # fmt: skip
    runner = GpuRunner(driver, c.plan, None, arrays)
    rng = np.random.default_rng(0)
    feeds = {}
    for d in g.inputs:
        t = d.value.type
        if d.kind == "input":
            feeds[d.value.name] = rng.random(t.shape, np.float32)
        elif d.kind == "label":
            feeds[d.value.name] = rng.integers(0, d.classes, t.shape)

    def step(k: int) -> dict[str, np.ndarray]:
        return feeds | {d.value.name: np.int64(k) for d in g.inputs if d.kind == "step"}

    return runner, step


def ours(c: api.Compilation, steps: int, kernels: str) -> tuple[float, int, str]:
    """(median step seconds on the GPU by CUDA events, GPU bytes the runner took, which kernels ran) with `kernels`
    "own" (ours alone) or "vendor" (cuBLAS and cuDNN where they serve)."""
    runner, feeds = runner_for(c, kernels)
    times = [runner.run("train", feeds(k))[1] for k in range(WARMUP + steps)]
    taken = runner.measured_bytes
    what = runner.driver.vendor.description if kernels != "own" else "own kernels"
    runner.close()
    return statistics.median(times[WARMUP:]), taken, what


def pytorch(program, steps: int, tf32: bool) -> float | None:  # noqa: ANN001
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cuda.matmul.allow_tf32 = tf32 and torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    step = bench_runner.torch_training_step(program, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(WARMUP + steps):
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del step
    torch.cuda.empty_cache()
    return statistics.median(times[WARMUP:])


def java(java_bin: str, classpath: str, cls: str, steps: int, kernels: str) -> dict:
    """The generated program on its CUDA device with `kernels` own or vendor (the caller puts the CUDA 13 libraries on
    LD_LIBRARY_PATH for vendor): its --json figures, and the median of its steps' wall clock after the warm-up (each
    step's time as the program measures it, the loss read back included)."""
    cmd = [java_bin, "-Dorg.bytedeco.javacpp.cachedir=/tmp/deepdsl_javacpp", "-cp", classpath, cls, "--device", "cuda",
           "--kernels", kernels, "--data", "synthetic", "--iters", str(WARMUP + steps), "--json"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    run = json.loads(r.stdout.strip().splitlines()[-1])
    run["steady_step_seconds"] = statistics.median(run["step_seconds"][WARMUP:])
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--java", default=None, help="a java binary: also time the generated program's CUDA device")
    ap.add_argument("--cp", default=None, help="the class path of the compiled LeNet and ResNet50 classes")
    ap.add_argument("--json", dest="out", default=None, help="write the figures here too")
    args = ap.parse_args()
    driver = PyCudaDriver()
    gpu = driver.description
    driver.close()
    print(f"GPU: {gpu}")
    try:
        import torch

        print(f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    except ImportError:
        print("PyTorch: not importable (no comparison)")
    rows = []
    print(f"{'network':<10} {'kernels':<7} {'ours ms':>8} {'torch fp32':>10} {'ours/torch':>10} {'torch tf32':>10} "
          f"{'TFLOP/s':>8} {'of peak':>8}")  # fmt: skip

    def ms(v: float | None) -> str:
        return f"{v:>10.2f}" if v else f"{'n/a':>10}"

    for name, sets, cls in CASES:
        c = api.compile_file(ROOT / "networks" / f"{name}.ddsl", sets, stop_at="plan")
        steps = args.steps if name == "lenet" else max(3, args.steps // 4)
        fp32 = pytorch(c.program, steps, tf32=False)
        tf32 = pytorch(c.program, steps, tf32=True)
        work = flops(c.plan.graph)
        for kernels in ("own", "vendor"):
            try:
                mine, taken, what = ours(c, steps, kernels)
            except Exception as err:  # noqa: BLE001  (a vendor library missing or refusing: the row says so)
                rows.append({"network": name, "kernels": kernels, "error": f"{type(err).__name__}: {err}"})
                print(f"{name:<10} {kernels:<7} failed: {type(err).__name__}: {err}")
                continue
            row = {"network": name, "kernels": kernels, "which": what, "batch": sets["N"], "ours_ms": 1e3 * mine,
                   "torch_fp32_ms": fp32 and 1e3 * fp32, "torch_default_tf32_ms": tf32 and 1e3 * tf32,
                   "ratio_fp32": fp32 and mine / fp32, "ratio_tf32": tf32 and mine / tf32, "train_flops": work,
                   "achieved_tflops": work / mine / 1e12, "of_fp32_peak": work / mine / FP32_PEAK,
                   "planned_arena_bytes": c.plan.arena_bytes, "gpu_bytes_taken": taken}  # fmt: skip
            if args.java and args.cp:
                j = java(args.java, args.cp, cls, steps, kernels)
                row["java"] = j
                row["java_ms"] = j["steady_step_seconds"] * 1e3 if "error" not in j else None
            rows.append(row)
            print(f"{name:<10} {kernels:<7} {row['ours_ms']:>8.2f} {ms(row['torch_fp32_ms'])} "
                  f"{(row['ratio_fp32'] or 0):>10.2f} {ms(row['torch_default_tf32_ms'])} "
                  f"{row['achieved_tflops']:>8.2f} {100 * row['of_fp32_peak']:>7.1f}%  ({what})")  # fmt: skip
            if "java_ms" in row:
                java_ms = f"{row['java_ms']:.2f}" if row["java_ms"] else "failed"
                print(f"{'':<18} Java CUDA device: {java_ms} ms per step (wall clock, the loss read back each step)")
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
