"""Our own convolution kernels (`--kernels own`: library.cu's register-tiled implicit GEMMs and the split filter
gradient) against cuDNN's, per convolution shape of a network's train step, on a GPU.

    python scripts/bench_own_kernels.py [--network resnet50] [--set N=64] [--repeats 3] [--json OUT]

One train step's launches of the PyCUDA runner are each timed alone with CUDA events (GpuRunner.profile), once with
our kernels only and once with cuBLAS + cuDNN, on the same plan (the statements carry the same names); each
convolution statement's time (its kernel, and for a split filter gradient the finishing launch too) is summed by
(op, shape), with the ratio own / vendor and our achieved TFLOP/s, then the totals: all convolutions, the GEMMs, and
every launch of the step. The issue's goal: ResNet-50's step with our kernels at most 3x the vendor step. Needs
PyCUDA, cuDNN and a GPU; `measure` takes any two GpuRunner drivers (the tests pass the CPU emulator's).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from deepdsl import api  # noqa: E402
from deepdsl.backends.cuda.runner import GpuRunner  # noqa: E402
from deepdsl.initializers import init_array  # noqa: E402
from deepdsl.ir import REGISTRY, Stmt  # noqa: E402

CONVS = ("conv2d", "conv2d_backward_data", "conv2d_backward_filter")
GEMMS = ("linear", "matmul", "batch_matmul")
WARMUP = 2


def shape_key(s: Stmt) -> str:
    """A convolution statement's shape: input, weight, output, stride, pad, groups (and any dilation)."""
    ins = " ".join("x".join(map(str, v.type.shape)) for v in s.inputs[:2])
    a = s.a
    extra = f" d{tuple(a['dilation'])}" if tuple(a.get("dilation", (1, 1))) != (1, 1) else ""
    out = "x".join(map(str, s.out.type.shape))
    return f"{ins} -> {out} s{tuple(a['stride'])} p{tuple(a['pad'])} g{a['groups']}{extra}"


def _runner(c: api.Compilation, driver: Any) -> tuple[GpuRunner, Callable[[int], dict[str, np.ndarray]]]:
    g = c.plan.graph
    seed = c.program.train.seed
    arrays = {p.value.name: init_array(p.value.name, p.value.type.shape, p.init.kind, p.init.args, p.init.fan_in,
                                       p.init.fan_out, seed, np.float32) for p in g.params}  # fmt: skip
    runner = GpuRunner(driver, c.plan, None, arrays)
    rng = np.random.default_rng(0)
    feeds: dict[str, Any] = {}
    for d in g.inputs:
        if d.kind == "input":
            feeds[d.value.name] = rng.random(d.value.type.shape, np.float32)
        elif d.kind == "label":
            feeds[d.value.name] = rng.integers(0, d.classes, d.value.type.shape)

    def step(k: int) -> dict[str, np.ndarray]:
        return feeds | {d.value.name: np.int64(k) for d in g.inputs if d.kind == "step"}

    return runner, step


def per_statement(c: api.Compilation, driver: Any, repeats: int) -> tuple[dict[str, float], float, dict[str, str]]:
    """On a new GpuRunner over `driver`: (seconds of each statement's launches, each launch timed alone: the median
    over `repeats` profiled runs; the whole step's median seconds; what ran for each statement)."""
    runner, feeds = _runner(c, driver)
    try:
        steps = [runner.run("train", feeds(k))[1] for k in range(WARMUP + repeats)][WARMUP:]
        runs = [runner.profile("train", feeds(WARMUP + repeats + k)) for k in range(repeats)]
    finally:
        runner.close()
    seconds: dict[str, float] = defaultdict(float)
    what: dict[str, str] = {}
    for i, (launch, ran, _) in enumerate(runs[0]):
        seconds[launch.stmt] += statistics.median(r[i][2] for r in runs)
        what.setdefault(launch.stmt, ran)
    return dict(seconds), statistics.median(steps), what


def measure(c: api.Compilation, own: Callable[[], Any], vendor: Callable[[], Any], repeats: int = 3) -> dict[str, Any]:
    """Our kernels (on the driver `own()` makes) against the vendor libraries (on `vendor()`'s) on `c`'s train step:
    the rows by convolution shape and the totals, as the JSON this script writes."""
    mine, own_step, _ = per_statement(c, own(), repeats)
    theirs, vendor_step, ran = per_statement(c, vendor(), repeats)
    stmts = {s.out.name: s for s in c.plan.graph.stmts}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for name, s in stmts.items():
        if s.op not in CONVS or name not in mine:
            continue
        fresh = {"op": s.op, "shape": shape_key(s), "count": 0, "own_ms": 0.0, "vendor_ms": 0.0, "flop": 0,
                 "vendor": ran.get(name, "")}  # fmt: skip
        row = groups.setdefault((s.op, shape_key(s)), fresh)
        row["count"] += 1
        row["own_ms"] += 1e3 * mine[name]
        row["vendor_ms"] += 1e3 * theirs.get(name, 0.0)
        op = REGISTRY[s.op]  # its own inputs (an epilogue's come after them)
        primary = tuple(v.type for v in s.inputs[: op.arity if op.arity is not None else len(s.inputs)])
        row["flop"] += op.flops(primary, s.out.type, s.a) if op.flops else 0
    rows = sorted(groups.values(), key=lambda r: r["own_ms"], reverse=True)
    for r in rows:
        r["ratio"] = r["own_ms"] / r["vendor_ms"] if r["vendor_ms"] else None
        r["own_tflops"] = r["flop"] / (r["own_ms"] * 1e-3) / 1e12 if r["own_ms"] else None

    def total(ops: tuple[str, ...], times: dict[str, float]) -> float:
        return 1e3 * sum(t for n, t in times.items() if stmts[n].op in ops)

    totals = {
        "conv_own_ms": total(CONVS, mine), "conv_vendor_ms": total(CONVS, theirs),
        "gemm_own_ms": total(GEMMS, mine), "gemm_vendor_ms": total(GEMMS, theirs),
        "launches_own_ms": 1e3 * sum(mine.values()), "launches_vendor_ms": 1e3 * sum(theirs.values()),
        "step_own_ms": 1e3 * own_step, "step_vendor_ms": 1e3 * vendor_step,
    }  # fmt: skip
    for part in ("conv", "gemm", "launches", "step"):
        v = totals[f"{part}_vendor_ms"]
        totals[f"{part}_ratio"] = totals[f"{part}_own_ms"] / v if v else None
    return {"rows": rows, "totals": totals}


def report(result: dict[str, Any], top: int) -> list[str]:
    """The table as lines."""
    lines = [f"{'op':<24} {'shape':<58} {'n':>3} {'own ms':>9} {'cuDNN ms':>9} {'ratio':>6} {'own TF/s':>8}"]
    for r in result["rows"][:top]:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        tf = f"{r['own_tflops']:.2f}" if r["own_tflops"] is not None else "-"
        lines.append(f"{r['op']:<24} {r['shape'][:58]:<58} {r['count']:>3} {r['own_ms']:>9.3f} "
                     f"{r['vendor_ms']:>9.3f} {ratio:>6} {tf:>8}")  # fmt: skip
    t = result["totals"]
    for part, title in (("conv", "all convolutions"), ("gemm", "GEMMs"), ("launches", "every launch, each alone"),
                        ("step", "the whole step (CUDA events)")):  # fmt: skip
        ratio = f"{t[f'{part}_ratio']:.2f}x" if t[f"{part}_ratio"] is not None else "-"
        lines.append(f"{title}: own {t[f'{part}_own_ms']:.2f} ms, vendor {t[f'{part}_vendor_ms']:.2f} ms, {ratio}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="resnet50", help="a network of networks/ (its file name without .ddsl)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=40, help="how many shapes to print")
    ap.add_argument("--json", dest="out", default=None, help="write the rows and totals here too")
    args = ap.parse_args(argv)
    sets = {k: int(v) for k, v in (s.split("=", 1) for s in args.sets)} or {"N": 64}
    c = api.compile_file(ROOT / "networks" / f"{args.network}.ddsl", sets, stop_at="plan")
    from deepdsl.backends.cuda.drivers import PyCudaDriver

    result = measure(c, lambda: PyCudaDriver("own"), lambda: PyCudaDriver("vendor"), args.repeats)
    print(f"{args.network} {sets}: our convolutions against cuDNN's, each launch timed alone")
    print("\n".join(report(result, args.top)))
    if args.out:
        Path(args.out).write_text(json.dumps({"network": args.network, "sets": sets, **result}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
