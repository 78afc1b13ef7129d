"""Where a train step's GPU time goes: each launch of the PyCUDA runner timed on its own with CUDA events, summed by
op and by what ran (our kernel, or the cuBLAS / cuDNN routine and its algorithm), beside the whole step's time,
with each launch's work: FLOPs (the op registry's `flops` rules, as `deepdsl memcheck` counts them) and bytes (the
sizes of its distinct arguments: each input read once, the output written once), so achieved TFLOP/s and GB/s.

    python scripts/profile_gpu.py [--network resnet50] [--set N=64] [--kernels own|vendor]
                                  [--workspace-limit BYTES] [--top 20] [--json OUT]

Timing each launch alone serialises the step (no launch overlaps the next), so the launches' sum is at least the
step's time; the difference is the GPU's idle time between launches that a whole-step measurement hides. The JSON
also holds every launch, every vendor call as the runner bound it (routine, cuDNN algorithm, workspace bytes, the
call's shapes), whether the runner's CUDA graph was on (and why not), and the runner's shared vendor scratch. Needs
PyCUDA and a GPU (scripts/gpu_check.sh runs it first, on ResNet-50 at batch 64 with cuBLAS and cuDNN).

    --emulate FOLDER   no GPU: the tests' emulated driver (tests/backends/cuda_emulator.py, kernels compiled for
                       the CPU by g++) with the stand-in cuBLAS and cuDNN (fake_libcublas.c, fake_libcudnn.c) built
                       in FOLDER; the times are the CPU's. The dry run of gpu_check.sh runs it on a small LeNet, so
                       that this script has run once before a GPU sees it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from deepdsl import api  # noqa: E402
from deepdsl.backends.cuda.launch import Launch  # noqa: E402
from deepdsl.backends.cuda.runner import GpuRunner  # noqa: E402
from deepdsl.initializers import init_array  # noqa: E402
from deepdsl.ir import REGISTRY  # noqa: E402
from deepdsl.ir.graph import Graph, Stmt  # noqa: E402
from deepdsl.memory.report import flops  # noqa: E402

WARMUP, REPEATS = 2, 3


def runner_for(c: api.Compilation, kernels: str, driver: Any = None) -> tuple[GpuRunner, Callable[[int], dict]]:
    """A runner of `c`'s train step with its parameters initialised (on `driver`, else GPU 0 through PyCUDA with
    `kernels`), and the feeds of step k (random inputs and labels, fixed by the seed)."""
    if driver is None:
        from deepdsl.backends.cuda.drivers import PyCudaDriver

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


def stmt_flops(s: Stmt, part: str = "all") -> int:
    """The FLOPs of one statement, as memory/report.flops counts them: its op's rule, and one per output element for
    an epilogue; `part` "op" or "epilogue" for the one of the two its launch computes."""
    op = REGISTRY[s.op]
    primary = s.inputs[: op.arity] if "epilogue" in s.a else s.inputs
    work = op.flops(tuple(v.type for v in primary), s.out.type, s.a) if op.flops is not None else 0
    epilogue = s.out.type.numel if "epilogue" in s.a else 0
    return {"all": work + epilogue, "op": work, "epilogue": epilogue}[part]


def is_epilogue(launch: Launch) -> bool:
    """A statement's epilogue launched after its op (translation.py names that kernel NAME_epilogue)."""
    return launch.kernel.endswith("_epilogue")


def launch_costs(g: Graph, launches: Sequence[Launch]) -> Callable[[Launch], tuple[int, int]]:
    """(FLOPs, bytes) of a launch of `g` (one of `launches`): its statements' FLOPs, each counted once (a statement
    whose epilogue is a launch of its own: the op's in the first, the epilogue's in the second), and the sizes of its
    distinct arguments."""
    stmts = {s.out.name: s for s in g.stmts}
    types = {d.value.name: d.value.type for d in g.inputs} | {p.value.name: p.value.type for p in g.params}
    for s in g.stmts:
        types.update((v.name, v.type) for v in (*s.inputs, s.out))
    split = {x.stmt for x in launches if is_epilogue(x)}

    def cost(launch: Launch) -> tuple[int, int]:
        if is_epilogue(launch):
            work = stmt_flops(stmts[launch.stmt], "epilogue") if launch.stmt in stmts else 0
        else:
            work = sum(stmt_flops(stmts[n], "op" if n in split else "all")
                       for n in (launch.stmt, *launch.also) if n in stmts)  # fmt: skip
        moved = sum(types[v].nbytes for v in dict.fromkeys(a.value for a in launch.args) if v in types)
        return work, moved

    return cost


def op_name(launch: Launch) -> str:
    """The op a launch is counted under in the by-op table (an epilogue launched alone under its own name)."""
    return f"{launch.op} epilogue" if is_epilogue(launch) else launch.op


def vendor_calls(runner: GpuRunner, step: str = "train") -> list[dict[str, Any]]:
    """Each launch of `step` a vendor routine serves, as the runner bound it: the statement, the op, the call with
    its shapes, and every plain field the binding records (the routine and its algorithm, its workspace bytes,
    whether that is the runner's shared scratch, ...)."""
    calls = []
    for launch, _, bound in runner.calls[step]:
        if bound is None:
            continue
        row: dict[str, Any] = {"stmt": launch.stmt, "op": launch.op, "call": str(launch.vendor)}
        for f in dataclasses.fields(bound):
            value = getattr(bound, f.name)
            if value is None or isinstance(value, bool | int | float | str):
                row[f.name] = value
        calls.append(row)
    return calls


def runner_facts(runner: GpuRunner) -> dict[str, Any]:
    """What a bench row or a profile says about the runner besides its times."""
    return {"device": runner.driver.description, "vendor": runner.driver.vendor.description, "graph": runner.graph,
            "vendor_launches": runner.vendor_launches, "vendor_workspace_bytes": runner.vendor_workspace_bytes,
            "vendor_scratch_bytes": runner.vendor_scratch_bytes, "planned_bytes": runner.planned_bytes,
            "measured_bytes": runner.measured_bytes}  # fmt: skip


def rates(ms: float, work: int, moved: int) -> dict[str, float | None]:
    seconds = ms / 1e3
    return {"tflops": work / seconds / 1e12 if seconds > 0 and work else None,
            "gbps": moved / seconds / 1e9 if seconds > 0 and moved else None}  # fmt: skip


def profile(c: api.Compilation, runner: GpuRunner, feeds: Callable[[int], dict], warmup: int = WARMUP,
            repeats: int = REPEATS) -> dict[str, Any]:  # fmt: skip
    """The profile of `runner`'s train step: whole steps (the graph, where on) after `warmup`, then `repeats` runs
    with each launch timed alone, each launch's median."""
    steps = [runner.run("train", feeds(k))[1] for k in range(warmup + repeats)][warmup:]
    runs = [runner.profile("train", feeds(warmup + repeats + k)) for k in range(repeats)]
    cost = launch_costs(c.plan.graph, [launch for launch, _, _ in runs[0]])
    launches = []
    for i, (launch, what, _) in enumerate(runs[0]):
        ms = 1e3 * statistics.median(r[i][2] for r in runs)
        work, moved = cost(launch)
        launches.append({"stmt": launch.stmt, "op": op_name(launch), "what": what, "ms": ms, "flops": work,
                         "bytes": moved, **rates(ms, work, moved)})  # fmt: skip
    tables = {}
    total_ms = sum(x["ms"] for x in launches)
    for title, key in (("by op", "op"), ("by what ran", "what")):
        sums: dict[str, dict[str, float]] = defaultdict(lambda: {"launches": 0, "ms": 0.0, "flops": 0, "bytes": 0})
        for x in launches:
            row = sums[x[key]]
            row["launches"] += 1
            for k in ("ms", "flops", "bytes"):
                row[k] += x[k]
        ranked = sorted(sums.items(), key=lambda kv: kv[1]["ms"], reverse=True)
        tables[title] = [{"name": name, **row, "share": row["ms"] / total_ms if total_ms else None,
                          **rates(row["ms"], int(row["flops"]), int(row["bytes"]))}
                         for name, row in ranked]  # fmt: skip
    return {"step_ms": 1e3 * statistics.median(steps), "launches_ms": total_ms, "launch_count": len(launches),
            "train_flops": flops(c.plan.graph), **runner_facts(runner), "tables": tables,
            "slowest": sorted(launches, key=lambda x: x["ms"], reverse=True)[:50], "launches": launches,
            "vendor_calls": vendor_calls(runner)}  # fmt: skip


def _rate(v: float | None, unit: str) -> str:
    return f"{v:>9.2f}" if v is not None else f"{'-':>9}"


def print_profile(p: dict[str, Any], title: str, top: int) -> None:
    print(f"{title}: step {p['step_ms']:.2f} ms (whole, graph {p['graph']}); {p['launch_count']} launches, each "
          f"timed alone: {p['launches_ms']:.2f} ms; vendor scratch {p['vendor_scratch_bytes']:,} bytes")  # fmt: skip
    for name in ("by op", "by what ran"):
        print(f"\n{name:<56} {'launches':>8} {'ms':>9} {'share':>6} {'TFLOP/s':>9} {'GB/s':>9}")
        for r in p["tables"][name][:top]:
            share = f"{100 * r['share']:>5.1f}%" if r["share"] is not None else f"{'-':>6}"
            print(f"{r['name'][:56]:<56} {r['launches']:>8} {r['ms']:>9.3f} {share} {_rate(r['tflops'], 'T')} "
                  f"{_rate(r['gbps'], 'G')}")  # fmt: skip
    print(f"\n{'slowest launches':<56} {'ms':>9} {'TFLOP/s':>9} {'GB/s':>9}")
    for x in p["slowest"][:top]:
        print(f"{(x['stmt'] + ' ' + x['what'])[:56]:<56} {x['ms']:>9.3f} {_rate(x['tflops'], 'T')} "
              f"{_rate(x['gbps'], 'G')}")  # fmt: skip


def emulated_driver(folder: Path, kernels: str) -> Any:
    """The tests' emulated GPU with the stand-in vendor libraries built in `folder` (no GPU, no PyCUDA)."""
    sys.path.insert(0, str(ROOT / "tests" / "backends"))
    from cuda_emulator import EmulatedDriver, fake_vendor

    from deepdsl.backends.cuda.vendor import OWN, open_vendor

    vendor = OWN if kernels == "own" else open_vendor(kernels, [fake_vendor(folder / "vendor")])
    return EmulatedDriver(folder / "kernels", vendor=vendor)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="resnet50", help="a network of networks/ (its file name without .ddsl)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--kernels", default="vendor", choices=("own", "vendor"))
    ap.add_argument("--workspace-limit", type=int, default=None, metavar="BYTES",
                    help="the plan's workspace limit (cuDNN's cap; default none: the runner's 1 GiB)")  # fmt: skip
    ap.add_argument("--top", type=int, default=20, help="how many rows of each table")
    ap.add_argument("--json", dest="out", default=None, help="write the tables, launches and vendor calls here too")
    ap.add_argument("--emulate", default=None, metavar="FOLDER", help="no GPU: the tests' emulated driver (see above)")
    args = ap.parse_args()
    sets = {k: int(v) for k, v in (s.split("=", 1) for s in args.sets)}
    options = api.Options(workspace_limit=args.workspace_limit)
    c = api.compile_file(ROOT / "networks" / f"{args.network}.ddsl", sets, stop_at="plan", options=options)
    driver = emulated_driver(Path(args.emulate), args.kernels) if args.emulate else None
    runner, feeds = runner_for(c, args.kernels, driver)
    try:
        p = profile(c, runner, feeds, *((1, 1) if args.emulate else (WARMUP, REPEATS)))
    finally:
        runner.close()
    head = {"network": args.network, "sets": sets, "kernels": args.kernels, "workspace_limit": args.workspace_limit,
            "emulated": bool(args.emulate)}  # fmt: skip
    print_profile(p, f"{args.network} {sets} --kernels {args.kernels}", args.top)
    if args.out:
        Path(args.out).write_text(json.dumps(head | p, indent=1))


if __name__ == "__main__":
    main()
