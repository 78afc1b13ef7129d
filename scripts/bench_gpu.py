"""The training step on a GPU, ours against PyTorch eager on the same network in the same run: every ratio is ours /
PyTorch's, both measured by this one process (or, with --append, by the earlier part of the same check).

    python scripts/bench_gpu.py [--part headline|optional|all] [--steps 20] [--java JAVA --cp CLASSPATH]
                                [--json OUT.json] [--append] [--deadline-at EPOCH] [--profile PROFILE.json]

Rows, per network (ResNet-50 first, then LeNet, both at batch 64):
- PyTorch eager (scripts/bench_runner.py's interpreter of our forward graph, autograd, torch.optim.SGD), timed
  with CUDA events: `torch_fp32` (TF32 off, cudnn.benchmark off: both sides compute true fp32),
  `torch_fp32_benchmark` (the same with cudnn.benchmark = True: PyTorch's best eager fp32), `torch_default`
  (PyTorch's defaults: TF32 convolutions, fp32 matmuls, no benchmark), `torch_default_benchmark`, and
  `torch_amp_bf16` (bf16 autocast, channels-last, cudnn.benchmark: the practical PyTorch ceiling); for ResNet-50
  also a torch.profiler breakdown of two fp32 and two TF32 steps by class (convolution forward, data gradient,
  filter gradient, batch norm, pooling, GEMM, loss, element-wise, optimiser).
- Ours: `deepdsl run ... --device cuda --json` as a user runs it, in a child process whose GpuRunner reports each
  train step's CUDA-event time (the batch upload outside it), whether the CUDA graph was on (and why not), each
  vendor call as bound (routine, cuDNN algorithm, workspace bytes, shapes), the shared vendor scratch and the
  GPU memory taken against the plan: `pycuda_vendor` (cuBLAS + cuDNN), and, where this build's `deepdsl run`
  takes the flag (found in its --help; a row without says "not available in this build"), `pycuda_vendor_tf32`
  and `pycuda_vendor_bf16` (--precision). The generated Java program on its CUDA device: `java_vendor` (its
  steady step by its own wall clock, the loss read back each step).
- Optional (--part optional, after the checks): `pycuda_own` and `java_own` (our kernels alone), `--workspace-limit
  0` against the default (the workspace A/B), `--deterministic`, `--no-graph`; for ResNet-50
  `pycuda_vendor_tf32_kernels` and `pycuda_vendor_bf16_kernels`: the same run profiled by torch.profiler over two
  more steps, every kernel cuBLAS and cuDNN launch inside ours by name, and the time of the layout conversions
  among them (cuDNN's nchwToNhwc / nhwcToNchw transposes around tensor-core convolutions of NCHW data: what
  channels-last would save); Java rows with --precision where the
  Java program takes it; and, with --dp-cp (LeNet compiled with `deepdsl compile --data-parallel`), the data-parallel
  Java program on one rank: `java_dp_plain` (no collective), `java_dp_nccl` and `java_dp_nccl_nograph` (NCCL forced
  for one rank by -Ddeepdsl.collective=true, in the CUDA graph and eager), their losses against the plain run's bit
  for bit and their step times; `java_dp_micro2` and `java_dp_nccl_micro2` the same for `--micro-batches 2`
  (gradient accumulation, call for call), the NCCL one against the plain one's two micro-batches. NCCL is the
  libnccl.so.2 of this Python's site-packages (nvidia/nccl/lib, PyTorch's wheels); where there is none, the NCCL
  rows say "no libnccl.so.2 on this machine" and nothing runs.

Goals (issues 30 and 31) are judged at the end from the rows there are: ResNet-50 vendor <= 0.9x PyTorch fp32 with
cudnn.benchmark (PyCUDA and Java), LeNet <= 0.5x, Java within 15% of PyCUDA, tf32 <= 0.9x PyTorch's TF32 default
with cudnn.benchmark, bf16 <= 1.0x PyTorch AMP, own kernels <= 3x vendor, GPU memory within 1% of the plan. The
JSON is rewritten after every row, so a run stopped by its deadline keeps what it measured; --deadline-at (seconds
since the epoch) skips the rows that would start too late (each says so). Needs PyCUDA, PyTorch and a GPU;
scripts/gpu_check.sh runs it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

FP32_PEAK = 67e12  # H200 (and H100 SXM): 67 TFLOP/s fp32 without tensor cores (NVIDIA's data sheet)
WARMUP = 3
NETWORKS = [("resnet50", {"N": 64}, "ResNet50"), ("lenet", {"N": 64}, "LeNet")]
# PyTorch's rows: name -> (what it is, TF32 for convolutions and matmuls (None: PyTorch's defaults), benchmark, AMP)
TORCH = {
    "torch_fp32": ("eager fp32, TF32 off, cudnn.benchmark off", False, False, False),
    "torch_fp32_benchmark": ("eager fp32, TF32 off, cudnn.benchmark on", False, True, False),
    "torch_default": ("eager, PyTorch's defaults (TF32 convolutions, fp32 matmuls), cudnn.benchmark off", None, False,
                      False),
    "torch_default_benchmark": ("eager, PyTorch's defaults, cudnn.benchmark on", None, True, False),
    "torch_amp_bf16": ("eager, bf16 autocast, channels-last, cudnn.benchmark on", None, True, True),
}  # fmt: skip
# set to N: the child profiles the last N train steps with torch.profiler (they are not timed) and reports each kernel
KERNEL_PROFILE = "BENCH_GPU_KERNEL_PROFILE"
# our rows: name -> (part, kernels, flags of `deepdsl run` (the first is what this build must take), environment)
OURS = {
    "pycuda_vendor": ("headline", "vendor", [], {}),
    "pycuda_vendor_tf32": ("headline", "vendor", ["--precision", "tf32"], {}),
    "pycuda_vendor_bf16": ("headline", "vendor", ["--precision", "bf16"], {}),
    "pycuda_own": ("optional", "own", [], {}),
    "pycuda_vendor_workspace0": ("optional", "vendor", ["--workspace-limit", "0"], {}),
    "pycuda_vendor_nograph": ("optional", "vendor", ["--no-graph"], {}),
    "pycuda_vendor_deterministic": ("optional", "vendor", ["--deterministic"], {}),
    # the kernels cuBLAS and cuDNN run inside our tf32 / bf16 steps, by name (torch.profiler over the last steps):
    # whether cuDNN converts NCHW to NHWC around its tensor-core convolutions (the channels-last decision, issue 31)
    "pycuda_vendor_tf32_kernels": ("optional", "vendor", ["--precision", "tf32"], {KERNEL_PROFILE: "2"}),
    "pycuda_vendor_bf16_kernels": ("optional", "vendor", ["--precision", "bf16"], {KERNEL_PROFILE: "2"}),
}  # fmt: skip
# Java rows: name -> (part, kernels, flags of the generated program (the first is what it must take))
JAVA = {
    "java_vendor": ("headline", "vendor", []),
    "java_own": ("optional", "own", []),
    "java_vendor_tf32": ("optional", "vendor", ["--precision", "tf32"]),
    "java_vendor_bf16": ("optional", "vendor", ["--precision", "bf16"]),
}
# the data-parallel Java program (LeNet only) on one rank: name -> (NCCL forced, flags of the program)
JAVA_DP = {
    "java_dp_plain": (False, []),
    "java_dp_nccl": (True, []),
    "java_dp_nccl_nograph": (True, ["--no-graph"]),
    # gradient accumulation on the CUDA device (call for call), and the same through a one-rank NCCL
    "java_dp_micro2": (False, ["--micro-batches", "2"]),
    "java_dp_nccl_micro2": (True, ["--micro-batches", "2"]),
}
NO_NCCL = "no libnccl.so.2 on this machine"
# (what, network, our row, the row it is measured against, the most the ratio may be; a goal "within" a share is
# |ratio - 1| <= share)
GOALS = [
    ("ResNet-50 cuBLAS+cuDNN, PyCUDA runner <= 0.9x PyTorch fp32 with cudnn.benchmark", "resnet50", "pycuda_vendor",
     "torch_fp32_benchmark", 0.9),
    ("ResNet-50 cuBLAS+cuDNN, Java CUDA device <= 0.9x PyTorch fp32 with cudnn.benchmark", "resnet50", "java_vendor",
     "torch_fp32_benchmark", 0.9),
    ("LeNet cuBLAS+cuDNN, PyCUDA runner <= 0.5x PyTorch fp32 with cudnn.benchmark", "lenet", "pycuda_vendor",
     "torch_fp32_benchmark", 0.5),
    ("ResNet-50 Java CUDA device within 15% of the PyCUDA runner", "resnet50", "java_vendor", "pycuda_vendor",
     ("within", 0.15)),
    ("LeNet Java CUDA device within 15% of the PyCUDA runner", "lenet", "java_vendor", "pycuda_vendor",
     ("within", 0.15)),
    ("ResNet-50 --precision tf32 <= 0.9x PyTorch's TF32 default with cudnn.benchmark", "resnet50",
     "pycuda_vendor_tf32", "torch_default_benchmark", 0.9),
    ("ResNet-50 --precision bf16 <= 1.0x PyTorch AMP (bf16, channels-last, cudnn.benchmark)", "resnet50",
     "pycuda_vendor_bf16", "torch_amp_bf16", 1.0),
    ("ResNet-50 own kernels <= 3x cuBLAS+cuDNN", "resnet50", "pycuda_own", "pycuda_vendor", 3.0),
]  # fmt: skip
NOT_AVAILABLE = "not available in this build"


# ---- our rows: `deepdsl run` in a child process that reports its GpuRunner ----


def child(out: str, argv: list[str]) -> None:
    """`deepdsl run ARGV` in this process with GpuRunner watched: writes to `out` the exit status, the CLI's JSON,
    each train step's device seconds and the runner's facts (profile_gpu.runner_facts, vendor_calls)."""
    import profile_gpu

    from deepdsl import cli
    from deepdsl.backends.cuda import runner as gpu

    runners: list[Any] = []
    seconds: list[float] = []
    init, run = gpu.GpuRunner.__init__, gpu.GpuRunner.run
    profiled = int(os.environ.get(KERNEL_PROFILE, "0"))  # the last train steps to profile, kernel by kernel
    iters = int(argv[argv.index("--iters") + 1]) if "--iters" in argv else 0
    traced: list[float] = []
    profiler: Any = None

    def watched_init(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        init(self, *args, **kwargs)
        runners.append(self)

    def watched_run(self, step, feeds):  # noqa: ANN001, ANN202
        nonlocal profiler
        if step != "train":
            return run(self, step, feeds)
        if profiled and len(seconds) == iters - profiled and profiler is None:
            profiler = start_kernel_profile()
        outputs, s = run(self, step, feeds)
        (traced if profiler is not None and not isinstance(profiler, str) else seconds).append(s)
        return outputs, s

    gpu.GpuRunner.__init__, gpu.GpuRunner.run = watched_init, watched_run
    printed, status, error = io.StringIO(), 0, None
    with redirect_stdout(printed):
        try:
            cli.cli.main(args=argv, prog_name="deepdsl", standalone_mode=False)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:  # noqa: BLE001  (a usage error, a library refusing: the row says so)
            status, error = getattr(exc, "exit_code", 3), f"{type(exc).__name__}: {exc}"
    lines = printed.getvalue().strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    report: dict[str, Any] = {"exit": status, "error": error, "cli": result, "train_seconds": seconds}
    if isinstance(profiler, str):
        report["kernel_profile"] = {"error": profiler}
    elif profiler is not None:
        report["kernel_profile"] = stop_kernel_profile(profiler, len(traced))
    elif profiled:
        report["kernel_profile"] = {"error": "no train step was profiled (fewer steps ran than asked)"}
    if runners:
        report["runner"] = profile_gpu.runner_facts(runners[-1])
        report["vendor_calls"] = profile_gpu.vendor_calls(runners[-1])
    Path(out).write_text(json.dumps(report))


# a layout conversion among the kernels cuDNN and cuBLAS launch (cuDNN's nchwToNhwcKernel / nhwcToNchwKernel, the
# transposes around a tensor-core convolution of NCHW data): the time channels-last would save
LAYOUT_CONVERSION = re.compile(r"nchw_?to_?nhwc|nhwc_?to_?nchw|transpose|permute|convert_?layout", re.I)


def start_kernel_profile() -> Any:
    """torch.profiler tracing every GPU kernel this process launches (CUPTI sees the launches of PyCUDA, cuBLAS and
    cuDNN as it does PyTorch's own), started now; without PyTorch, why not (a string)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError as err:
        return f"no PyTorch to profile with ({err})"
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])  # (CPU: none of ours, but always there)
    prof.start()
    return prof


def stop_kernel_profile(prof: Any, steps: int) -> dict[str, Any]:
    """The profile's kernels, from its Chrome trace (every kernel, whatever launched it): kernel_summary's."""
    import tempfile

    prof.stop()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    return kernel_summary(events, steps)


def kernel_summary(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """From Chrome-trace events (`cat` "kernel", `dur` in µs): each kernel's ms a step, the most costly first, and
    the share of the layout conversions (LAYOUT_CONVERSION) among them."""
    by_name: dict[str, float] = {}
    for e in events:
        if str(e.get("cat", "")).lower() == "kernel":
            by_name[e["name"]] = by_name.get(e["name"], 0.0) + float(e.get("dur", 0.0)) / 1e3 / max(steps, 1)
    total = sum(by_name.values())
    layout = {n: ms for n, ms in by_name.items() if LAYOUT_CONVERSION.search(n)}
    return {"steps": steps, "kernels": len(by_name), "ms_per_step": total,
            "layout_conversion_ms_per_step": sum(layout.values()),
            "layout_conversion_share": sum(layout.values()) / total if total else 0.0,
            "layout_conversion_kernels": sorted(layout, key=lambda n: -layout[n])[:10],
            "top": [{"kernel": n[:160], "ms": ms}
                    for n, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:25]]}  # fmt: skip


def deepdsl_help(command: str = "run") -> str:
    """`deepdsl COMMAND --help` of the deepdsl this script imports (what flags this build takes)."""
    r = subprocess.run([sys.executable, "-m", "deepdsl", command, "--help"], capture_output=True, text=True,
                       timeout=120, check=False, cwd=ROOT)  # fmt: skip
    return r.stdout


def takes(usage: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage) is not None


def ours(name: str, network: str, sets: dict[str, int], steps: int, kernels: str, flags: list[str],
         env: dict[str, str], timeout: float) -> dict[str, Any]:  # fmt: skip
    """One of our rows: `deepdsl run` on the GPU in a child process, WARMUP + `steps` iterations."""
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_gpu_{os.getpid()}_{name}_{network}.json"
    sets_flags = [w for k, v in sets.items() for w in ("--set", f"{k}={v}")]
    profiled = int(env.get(KERNEL_PROFILE, "0"))  # steps run after the timed ones, profiled kernel by kernel
    argv = ["run", str(ROOT / "networks" / f"{network}.ddsl"), *sets_flags, "--device", "cuda", "--kernels", kernels,
            "--data", "synthetic", "--iters", str(WARMUP + steps + profiled), "--json", *flags]  # fmt: skip
    row: dict[str, Any] = {"kernels": kernels, "flags": flags, "command": "deepdsl " + " ".join(argv[:1] + argv[2:])}
    if env:
        row["environment"] = env
    t0 = time.time()
    try:
        r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(out), "--", *argv],
                           capture_output=True, text=True, timeout=timeout, check=False,
                           env=os.environ | env)  # fmt: skip
    except subprocess.TimeoutExpired:
        return row | {"error": f"timed out after {timeout:.0f} s"}
    row["seconds"] = time.time() - t0
    if not out.exists():
        return row | {"error": f"the child ended with status {r.returncode}: {r.stderr[-2000:].strip()}"}
    report = json.loads(out.read_text())
    out.unlink()
    row.update((k, report[k]) for k in ("runner", "vendor_calls", "kernel_profile") if k in report)
    cli = report["cli"] or {}
    if report["exit"] != 0 or not report["train_seconds"]:
        return row | {"error": report["error"] or f"deepdsl run ended with status {report['exit']}: "
                      f"{r.stderr[-2000:].strip()}"}  # fmt: skip
    times = report["train_seconds"][WARMUP:] or report["train_seconds"]
    row["ms"] = 1e3 * statistics.median(times)
    row["step_ms"] = [1e3 * s for s in report["train_seconds"]]
    row["losses"] = cli.get("losses")
    row.update((k, cli[k]) for k in ("precision", "ranks", "world_size", "gpu_graph") if k in cli)
    facts = row.get("runner", {})
    if facts.get("planned_bytes"):
        row["memory_over_plan"] = facts["measured_bytes"] / facts["planned_bytes"] - 1
    return row


def java_usage(java_bin: str, classpath: str, cls: str) -> str:
    """The generated program's usage text (what an unknown flag prints)."""
    r = subprocess.run([java_bin, "-cp", classpath, cls, "--no-such-flag"], capture_output=True, text=True,
                       timeout=60, check=False)  # fmt: skip
    return r.stdout + r.stderr


def java(java_bin: str, classpath: str, cls: str, steps: int, kernels: str, flags: list[str],
         timeout: float, jvm: list[str] | None = None,
         env: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """The generated program on its CUDA device with `kernels` own or vendor (the caller puts the CUDA 13 libraries on
    LD_LIBRARY_PATH for vendor): its --json figures, and the median of its steps' wall clock after the warm-up (each
    step's time as the program measures it, the loss read back included)."""
    jvm = jvm or []
    cmd = [java_bin, "-Dorg.bytedeco.javacpp.cachedir=/tmp/deepdsl_javacpp", *jvm, "-cp", classpath, cls, "--device",
           "cuda", "--kernels", kernels, "--data", "synthetic", "--iters", str(WARMUP + steps), "--json",
           *flags]  # fmt: skip
    row: dict[str, Any] = {"kernels": kernels, "flags": flags, "command": " ".join(jvm + cmd[2 + len(jvm) + 2 :])}
    if env:
        row["environment"] = env
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                           env=os.environ | (env or {}))  # fmt: skip
    except subprocess.TimeoutExpired:
        return row | {"error": f"timed out after {timeout:.0f} s"}
    if r.returncode != 0:
        return row | {"error": r.stderr[-2000:]}
    run = json.loads(r.stdout.strip().splitlines()[-1])
    row["java"] = run
    # the program's --json says whether the graph ran: "on", or "off (why)" (--no-graph, or a capture that failed)
    requested = "off" if "--no-graph" in flags else "on"
    row["graph"] = run.get("gpu_graph", f"not reported by the Java program's --json (requested: {requested})")
    row["ms"] = 1e3 * statistics.median(run["step_seconds"][WARMUP:] or run["step_seconds"])
    row["step_ms"] = [1e3 * s for s in run["step_seconds"]]
    row["losses"] = run.get("losses")
    return row


def find_nccl(paths: list[str] | None = None) -> str | None:
    """The folder of a libnccl.so.2 under nvidia/nccl/lib of this Python's import path (PyTorch's wheels bring
    nvidia-nccl-cu*), else None."""
    for folder in paths if paths is not None else sys.path:
        lib = Path(folder or ".") / "nvidia" / "nccl" / "lib"
        if (lib / "libnccl.so.2").is_file():
            return str(lib)
    return None


# ---- PyTorch's rows ----


def torch_settings(torch: Any, tf32: bool | None, benchmark: bool) -> dict[str, Any]:
    """Set TF32 (None: PyTorch's defaults, TF32 convolutions and fp32 matmuls) and cudnn.benchmark; what was set."""
    torch.backends.cudnn.allow_tf32 = True if tf32 is None else tf32
    torch.backends.cuda.matmul.allow_tf32 = False if tf32 is None else tf32
    torch.backends.cudnn.benchmark = benchmark
    return {"cudnn.allow_tf32": torch.backends.cudnn.allow_tf32, "cudnn.benchmark": benchmark,
            "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32}  # fmt: skip


def torch_step(program: Any, amp: bool) -> Any:
    """One PyTorch training step of `program` on the GPU (bench_runner's interpreter); with `amp`, channels-last and
    the forward pass under bf16 autocast."""
    import bench_runner
    import torch

    step = bench_runner.torch_training_step(program, device="cuda", channels_last=amp)
    if not amp:
        return step

    def autocast_forward() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return step.forward()

    return lambda: step(autocast_forward)


def pytorch(program: Any, steps: int, tf32: bool | None, benchmark: bool, amp: bool) -> dict[str, Any]:
    import torch

    row: dict[str, Any] = {"settings": torch_settings(torch, tf32, benchmark) | {"amp_bf16_channels_last": amp}}
    step = torch_step(program, amp)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(WARMUP + steps):
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del step
    torch.cuda.empty_cache()
    return row | {"ms": statistics.median(times[WARMUP:]), "step_ms": times}


# a kernel's class: the first rule whose pattern the names of the ops that launched it (innermost first, lower
# case) and the kernel's own name match
CLASSES = [
    ("optimiser", r"optimizer\.step|_foreach|multi_tensor|sgd"),
    ("conv dgrad", r"convolution_backward.*\n.*(dgrad|backward_data|bwd_data)"),
    ("conv wgrad", r"convolution_backward.*\n.*(wgrad|backward_filter|bwd_filter)"),
    ("conv backward, other kernels", r"convolution_backward"),
    ("conv fwd", r"convolution"),
    ("batch norm", r"batch_norm"),
    ("pooling", r"pool"),
    ("gemm (linear)", r"aten::(addmm|mm|linear|bmm)|mmbackward|addmmbackward"),
    ("loss", r"cross_entropy|log_softmax|nll_loss"),
    ("element-wise and other", r""),
]


def kernel_class(ops: list[str], kernel: str) -> str:
    text = " ".join(ops).lower() + "\n" + kernel.lower()
    return next(name for name, pattern in CLASSES if re.search(pattern, text))


def torch_profile(program: Any, tf32: bool | None, steps: int = 2) -> dict[str, Any]:
    """torch.profiler over `steps` PyTorch steps (after a warm-up): GPU kernel time per step by class, and the
    kernels that took the most in each class."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    settings = torch_settings(torch, tf32, False)
    step = torch_step(program, False)
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    by_class: dict[str, float] = {}
    kernels: dict[str, dict[str, float]] = {}
    found = 0
    for e in prof.events():
        for k in getattr(e, "kernels", None) or []:
            ops, parent = [], e
            while parent is not None:
                ops.append(parent.name)
                parent = getattr(parent, "cpu_parent", None)
            cls = kernel_class(ops, k.name)
            us = float(k.duration)
            by_class[cls] = by_class.get(cls, 0.0) + us / 1e3 / steps
            kernels.setdefault(cls, {})[k.name] = kernels.get(cls, {}).get(k.name, 0.0) + us / 1e3 / steps
            found += 1
    attributed = "the ops that launched each kernel"
    if not found:  # a PyTorch whose events carry no kernels: the kernels' own events, classed by name alone
        attributed = "the kernels' names alone"
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                cls, ms = kernel_class([], e.name), e.time_range.elapsed_us() / 1e3 / steps
                by_class[cls] = by_class.get(cls, 0.0) + ms
                kernels.setdefault(cls, {})[e.name] = kernels.get(cls, {}).get(e.name, 0.0) + ms
                found += 1
    del step
    torch.cuda.empty_cache()
    top = {c: sorted(({"kernel": n[:160], "ms": ms} for n, ms in ks.items()), key=lambda r: -r["ms"])[:5]
           for c, ks in kernels.items()}  # fmt: skip
    return {"settings": settings, "steps": steps, "kernels_seen": found, "classed_by": attributed,
            "ms_per_step_by_class": by_class,
            "ms_per_step": sum(by_class.values()), "top_kernels": top}  # fmt: skip


# ---- the report ----


def ratios(rows: list[dict[str, Any]]) -> None:
    """Each of our rows' ms over each PyTorch row's of the same network (`vs`)."""
    for row in rows:
        if row.get("side") == "pytorch" or "ms" not in row:
            continue
        row["vs"] = {t["name"]: row["ms"] / t["ms"] for t in rows
                     if t.get("side") == "pytorch" and t["network"] == row["network"] and t.get("ms")}  # fmt: skip


def goals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    found = {(r["network"], r["name"]): r for r in rows}
    judged = []
    for what, network, mine, theirs, most in GOALS:
        a, b = found.get((network, mine), {}), found.get((network, theirs), {})
        if a.get("ms") and b.get("ms"):
            ratio = a["ms"] / b["ms"]
            ok = abs(ratio - 1) <= most[1] if isinstance(most, tuple) else ratio <= most
            judged.append({"goal": what, "ratio": ratio, "met": ok})
        else:
            why = "; ".join(f"{n}: {r.get('error') or r.get('skipped') or 'not run'}"
                            for n, r in ((mine, a), (theirs, b)) if not r.get("ms"))  # fmt: skip
            judged.append({"goal": what, "ratio": None, "met": None, "why": why})
    row = found.get(("resnet50", "pycuda_vendor"), {})
    what = "ResNet-50 measured GPU memory within 1% of the plan (arena + tensors + vendor scratch), PyCUDA runner"
    if "memory_over_plan" in row:
        over = row["memory_over_plan"]
        judged.append({"goal": what, "ratio": 1 + over, "met": abs(over) <= 0.01})
    else:
        why = f"pycuda_vendor: {row.get('error') or 'not run'}"
        judged.append({"goal": what, "ratio": None, "met": None, "why": why})
    return judged


class Report:
    """bench.json, rewritten after every row."""

    def __init__(self, path: str | None, append: bool):
        self.path = Path(path) if path else None
        self.doc: dict[str, Any] = {"rows": []}
        if append and self.path is not None and self.path.exists():
            self.doc = json.loads(self.path.read_text())

    def add(self, row: dict[str, Any]) -> None:
        self.doc["rows"] = [r for r in self.doc["rows"] if (r["network"], r["name"]) != (row["network"], row["name"])]
        self.doc["rows"].append(row)
        self.write()

    def write(self) -> None:
        ratios(self.doc["rows"])
        self.doc["goals"] = goals(self.doc["rows"])
        if self.path is not None:
            self.path.write_text(json.dumps(self.doc, indent=1))


class Bench:
    """The rows of one run, network by network, each started only with time left before the deadline."""

    def __init__(self, args: argparse.Namespace, report: Report, usage: str, have_torch: bool):
        self.args, self.report, self.usage, self.have_torch = args, report, usage, have_torch
        self.deadline = args.deadline_at or float("inf")
        self.java_usages: dict[str, str] = {}

    def network(self, name: str, sets: dict[str, int], cls: str, parts: tuple[str, ...]) -> None:
        from deepdsl import api
        from deepdsl.memory.report import flops

        self.name, self.sets, self.cls, big = name, sets, cls, name == "resnet50"
        self.steps = max(3, self.args.steps // 4) if big else self.args.steps
        # the least time a row needs (one that cannot start that long before the deadline is skipped), the most
        self.margin, self.limit = (25, 180) if big else (8, 90)
        self.c = api.compile_file(ROOT / "networks" / f"{name}.ddsl", sets, stop_at="plan")
        self.work = flops(self.c.plan.graph)
        if "headline" in parts:
            self.ours("pycuda_vendor")
            self.torch("torch_fp32")
            self.torch("torch_fp32_benchmark")
            self.java("java_vendor")
            self.torch("torch_default")
            self.torch("torch_default_benchmark")
            self.ours("pycuda_vendor_tf32")
            self.torch("torch_amp_bf16")
            self.ours("pycuda_vendor_bf16")
            if big:
                self.torch_profile("torch_profile_fp32", False)
                self.torch_profile("torch_profile_tf32", None)
        if "optional" in parts:
            self.ours("pycuda_own")
            self.ours("pycuda_vendor_workspace0")
            self.ours("pycuda_vendor_deterministic")
            self.ours("pycuda_vendor_nograph")
            if big:  # the kernels inside cuDNN's tf32 and bf16 convolutions: do they convert NCHW to NHWC?
                self.ours("pycuda_vendor_tf32_kernels")
                self.ours("pycuda_vendor_bf16_kernels")
            self.java("java_vendor_tf32")
            self.java("java_vendor_bf16")
            if not big:  # ResNet-50's own kernels on the Java device take about 2 s a step: left out
                self.java("java_own")
                for name in JAVA_DP:
                    self.java_dp(name)

    def room(self) -> float:
        return min(self.limit, self.deadline - time.time())

    def add(self, row: dict[str, Any]) -> None:
        self.report.add(row)
        show(row)

    def do(self, name: str, side: str, measure: Any) -> None:
        base = {"network": self.name, "name": name, "side": side, "batch": self.sets["N"]}
        if self.room() < self.margin:
            return self.add(base | {"skipped": "SKIPPED (deadline)"})
        try:
            row = base | measure()
        except Exception as err:  # noqa: BLE001  (PyTorch or a library refusing: the row says so)
            row = base | {"error": f"{type(err).__name__}: {err}"}
        if row.get("ms") and side == "ours":
            row["train_flops"] = self.work
            row["achieved_tflops"] = self.work / (row["ms"] / 1e3) / 1e12
            row["of_fp32_peak"] = row["achieved_tflops"] * 1e12 / FP32_PEAK
        self.add(row)

    def unavailable(self, name: str, flags: list[str], who: str) -> None:
        self.add({"network": self.name, "name": name, "side": "ours", "flags": flags,
                  "skipped": f"{NOT_AVAILABLE} ({who} takes no {flags[0]})"})  # fmt: skip

    def ours(self, name: str) -> None:
        _, kernels, flags, env = OURS[name]
        if flags and not takes(self.usage, flags[0]):
            return self.unavailable(name, flags, "deepdsl run")
        flags = flags[:1] + [f for f in flags[1:] if not f.startswith("--") or takes(self.usage, f)]
        self.do(name, "ours", lambda: ours(name, self.name, self.sets, self.steps, kernels, flags, env, self.room()))

    def java(self, name: str) -> None:
        args = self.args
        if not (args.java and args.cp):
            return
        _, kernels, flags = JAVA[name]
        if self.cls not in self.java_usages:
            self.java_usages[self.cls] = java_usage(args.java, args.cp, self.cls)
        if flags and not takes(self.java_usages[self.cls], flags[0]):
            return self.unavailable(name, flags, "the Java program")
        self.do(name, "ours", lambda: java(args.java, args.cp, self.cls, self.steps, kernels, flags, self.room()))

    def java_dp(self, name: str) -> None:
        """One rank of the data-parallel LeNet (--dp-cp), NCCL forced or not; an NCCL row without a libnccl.so.2
        says so and runs nothing."""
        args = self.args
        if not (args.java and getattr(args, "dp_cp", None)):
            return
        forced, flags = JAVA_DP[name]
        jvm, env = [], {}
        if forced:
            nccl = find_nccl()
            if nccl is None:
                return self.add({"network": self.name, "name": name, "side": "ours", "skipped": NO_NCCL})
            jvm = ["-Ddeepdsl.collective=true"]
            env = {"LD_LIBRARY_PATH": nccl + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")}
        self.do(name, "ours", lambda: java(args.java, args.dp_cp, self.cls, self.steps, "own", flags, self.room(),
                                           jvm, env))  # fmt: skip

    def torch(self, name: str) -> None:
        if self.have_torch:
            what, tf32, benchmark, amp = TORCH[name]
            self.do(name, "pytorch", lambda: {"what": what} | pytorch(self.c.program, self.steps, tf32, benchmark, amp))

    def torch_profile(self, name: str, tf32: bool | None) -> None:
        if self.have_torch:
            self.do(name, "pytorch-profile", lambda: torch_profile(self.c.program, tf32))


def show(row: dict[str, Any]) -> None:
    head = f"{row['network']:<9} {row['name']:<30}"
    if row.get("side") == "pytorch-profile" and "ms_per_step_by_class" in row:
        classes = sorted(row["ms_per_step_by_class"].items(), key=lambda kv: -kv[1])
        shares = ", ".join(f"{k} {v:.2f}" for k, v in classes)
        print(f"{head} {row['ms_per_step']:>9.2f} ms of kernels a step: {shares}")
        return
    if "ms" not in row:
        print(f"{head} {row.get('skipped') or 'failed: ' + str(row.get('error'))[:300]}")
        return
    kp = row.get("kernel_profile") or {}
    if "ms_per_step" in kp:
        print(f"{head} {kp['ms_per_step']:>9.2f} ms of kernels a step ({kp['kernels']} kernels), layout conversions "
              f"{kp['layout_conversion_ms_per_step']:.2f} ms ({kp['layout_conversion_share']:.1%})")  # fmt: skip
    extra = ""
    if row.get("side") == "ours":
        vs = row.get("vs", {})
        extra = "  " + " ".join(f"{k.removeprefix('torch_')} {v:.2f}x" for k, v in vs.items())
        if "runner" in row:
            extra += f"  graph {row['runner']['graph']}"
        if row.get("achieved_tflops"):
            extra += f"  {row['achieved_tflops']:.1f} TFLOP/s ({100 * row['of_fp32_peak']:.0f}% of fp32 peak)"
    print(f"{head} {row['ms']:>9.2f} ms{extra}")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[sys.argv.index("--") + 1 :])
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="all", choices=("headline", "optional", "all"))
    ap.add_argument("--steps", type=int, default=20, help="timed steps of LeNet (ResNet-50: a quarter, at least 3)")
    ap.add_argument("--java", default=None, help="a java binary: also time the generated program's CUDA device")
    ap.add_argument("--cp", default=None, help="the class path of the compiled LeNet and ResNet50 classes")
    ap.add_argument("--json", dest="out", default=None, help="write the rows here (after every row)")
    ap.add_argument("--append", action="store_true", help="add to the rows already in --json (the same check)")
    ap.add_argument("--deadline-at", type=float, default=None, help="seconds since the epoch: start no row after")
    ap.add_argument("--profile", default=None, help="profile_gpu.py's JSON: its by-op table goes into the report")
    ap.add_argument("--dp-cp", default=None, help="the class path of LeNet compiled with --data-parallel")
    ap.add_argument("--networks", default="resnet50,lenet", help="which networks (comma-separated)")
    args = ap.parse_args()
    report = Report(args.out, args.append)
    parts = ("headline", "optional") if args.part == "all" else (args.part,)
    usage = deepdsl_help()
    report.doc.setdefault("support", {})["deepdsl run"] = {flags[0]: takes(usage, flags[0])
                                                           for _, _, flags, _ in OURS.values() if flags}  # fmt: skip
    try:
        import torch

        have_torch = torch.cuda.is_available()
        report.doc["pytorch"] = f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
        if have_torch:
            report.doc["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        have_torch = False
        report.doc["pytorch"] = "not importable (no comparison)"
    print(f"GPU: {report.doc.get('gpu', '?')}; {report.doc['pytorch']}")
    if args.profile and Path(args.profile).exists():
        p = json.loads(Path(args.profile).read_text())
        report.doc["profile"] = {k: p.get(k) for k in ("network", "sets", "kernels", "step_ms", "launches_ms",
                                                       "launch_count", "graph", "vendor_scratch_bytes",
                                                       "vendor_workspace_bytes")}  # fmt: skip
        report.doc["profile"]["by_op"] = p.get("tables", {}).get("by op")
        report.doc["profile"]["vendor_calls"] = p.get("vendor_calls")
    bench = Bench(args, report, usage, have_torch)
    for network, sets, cls in [n for n in NETWORKS if n[0] in args.networks.split(",")]:
        bench.network(network, sets, cls, parts)
    derived(report)
    report.write()
    print()
    for g in report.doc["goals"]:
        verdict = "no figure (" + g["why"] + ")" if g["met"] is None else f"{'MET' if g['met'] else 'NOT MET'} "
        print(f"goal: {g['goal']}: {verdict}" + (f"({g['ratio']:.2f})" if g["ratio"] is not None else ""))


def derived(report: Report) -> None:
    """What two rows say together: the one-rank NCCL runs' losses against the data-parallel program's plain run (of
    as many micro-batches), bit for bit (a one-rank sum is the identity), and their step times over its; the
    workspace A/B (limit 0 against the default)."""
    found = {(r["network"], r["name"]): r for r in report.doc["rows"]}
    for (network, name), row in found.items():
        plain = found.get((network, "java_dp_micro2" if name.endswith("_micro2") else "java_dp_plain"), {})
        if name.startswith("java_dp_nccl") and row.get("losses") and plain.get("losses"):
            row["losses_equal_to_plain"] = row["losses"] == plain["losses"]
            row["plain_row"] = plain["name"]
            row["ms_over_plain"] = row["ms"] / plain["ms"]
        if name == "pycuda_vendor_workspace0" and row.get("ms"):
            default = found.get((network, "pycuda_vendor"), {})
            if default.get("ms"):
                report.doc.setdefault("workspace_ab", {})[network] = {
                    "default_ms": default["ms"], "limit_0_ms": row["ms"],
                    "limit_0_over_default": row["ms"] / default["ms"],
                    "default_vendor_scratch_bytes": default.get("runner", {}).get("vendor_scratch_bytes"),
                    "default_vendor_workspace_bytes": default.get("runner", {}).get("vendor_workspace_bytes"),
                }  # fmt: skip


if __name__ == "__main__":
    main()
