"""What the commands report, as text and as the JSON objects of docs/formats.md: every `--json` through
`json_text` (strict JSON); `check`'s network (inputs, outputs, parameters, layers); `ir --stats`' statements and
kernels of each stage and after each pass; `memcheck`'s memory report."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from deepdsl import api
from deepdsl.frontend.program import Program
from deepdsl.passes import kernels

__all__ = ["check_json", "check_text", "json_text", "memory_report", "stats_json", "stats_text"]


def json_text(obj: dict[str, Any]) -> str:
    """`obj` as strict JSON: a NaN or an infinity (which JSON has not) becomes null and its top-level field is
    named in a list `nonfinite` (docs/formats.md, JSON outputs); the Java program's --json does the same."""
    bad: list[str] = []

    def clean(v: Any, field: str) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            if field not in bad:
                bad.append(field)
            return None
        if isinstance(v, dict):
            return {k: clean(x, field) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x, field) for x in v]
        return v

    out = {k: clean(v, k) for k, v in obj.items()}
    if bad:
        out["nonfinite"] = bad
    return json.dumps(out, allow_nan=False)


def accumulator_bytes(b: api.Build, micro_batches: int) -> int:
    """What gradient accumulation holds beside the arena on every device: with `micro_batches` > 1, each bucket's
    sum over the micro-batches (float32, the bucket's size; synchronised batch norm's statistics are never
    accumulated); 0 otherwise. The same for any batch size: the buckets hold parameter-sized gradients."""
    from deepdsl.ops.collective import STATS, buckets_of

    if micro_batches <= 1 or b.train is None:
        return 0
    return sum(k.nbytes for k in buckets_of(b.train) if k.kind != STATS)


def memory_report(
    c: api.Compilation, file: str, sets: dict, options: api.Options, budget: int | None, per_statement: bool,
    micro_batches: int = 1,
) -> tuple[api.Build, dict[str, Any]]:  # fmt: skip
    """`memcheck`'s report of FILE (memory.report's dict) and the Build it describes: planned within `budget` when
    one is given and no rematerialisation level is (api.plan_within), with whether it fits and the largest batch
    `N` that does at that level. With `micro_batches` > 1 the buckets' accumulators (`accumulator_bytes`) come out
    of the budget first, and the GPU peak holds them."""
    from deepdsl.memory.report import largest_batch, report

    api.compile_file(file, sets, stop_at="plan", c=c, options=options)
    assert c.build is not None
    b = c.build
    held = accumulator_bytes(b, micro_batches)
    if budget is not None and options.remat is None:
        b = api.plan_within(b, max(budget - held, 0))
    r = report(b.train_plan, b.program.graph, b.remat, b.extra_flops, b.train, per_statement=per_statement)
    r["precision"] = b.precision  # the plan's element types follow it (bf16: 2 bytes where the program stores bf16)
    if held:
        r["accumulator_bytes"] = held
        r["gpu_peak_bytes"] += held
    if budget is not None:
        r["budget_bytes"], r["fits"] = budget, r["peak_bytes"] + held <= budget
        at_level = dataclasses.replace(options, remat=b.remat)
        r["max_batch"] = None
        if api.has_const(c, "N"):
            n0 = sets.get("N", api.literal_const(c, "N"))
            known = (int(n0), r["peak_bytes"]) if isinstance(n0, int) else None
            r["max_batch"] = largest_batch(lambda n: api.peak_bytes(file, {**sets, "N": n}, at_level),
                                           budget - held, known=known)  # fmt: skip
    return b, r


def data_parallel_report(b: api.Build, file: str, sets: dict, options: api.Options, ranks: int,
                         micro_batches: int) -> dict[str, Any]:  # fmt: skip
    """memcheck's section on data-parallel training: the buckets of one rank's program, and what holding each
    gradient until its bucket is reduced costs against the plain program's plan at the same level (the plan is
    per rank: every rank runs the same program on its own batch of N)."""
    from deepdsl.data.named import batch_size
    from deepdsl.memory.report import total_peak
    from deepdsl.ops.collective import buckets_of

    plain = api.peak_bytes(file, sets, dataclasses.replace(options, buckets=None, remat=b.remat))
    peak = total_peak(b.train_plan)
    n = batch_size(b.program.graph)
    buckets = [
        {"bucket": k.index, "kind": k.kind, "tensors": len(k.values), "bytes": k.nbytes, "names": list(k.names)}
        for k in sorted(buckets_of(b.train), key=lambda k: k.index)
    ]  # fmt: skip
    return {
        "ranks": ranks, "micro_batches": micro_batches, "batch_per_shard": n, "global_batch": ranks * micro_batches * n,
        "buckets": buckets, "gradient_bytes": sum(k["bytes"] for k in buckets if k["kind"] == "grad"),
        # synchronised batch norm: its statistics' blocking all-reduces are the buckets of kind "stats"
        "sync_batch_norm": any(k["kind"] == "stats" for k in buckets),
        "peak_bytes": peak, "single_process_peak_bytes": plain, "extra_bytes": peak - plain,
        "accumulator_bytes": accumulator_bytes(b, micro_batches),
    }  # fmt: skip


def data_parallel_text(d: dict[str, Any]) -> str:
    grads = [k for k in d["buckets"] if k["kind"] == "grad"]
    stats = [k for k in d["buckets"] if k["kind"] == "stats"]
    sizes = ", ".join(f"{k['bytes'] / 2**20:.2f}" for k in grads)
    accumulated = [
        f"  micro-batches: each bucket summed over the {d['micro_batches']} micro-batches in an accumulator beside the "
        f"arena, {d['accumulator_bytes'] / 2**20:.2f} MiB in all (in the GPU peak above; --gpu-mem counts them)"
    ] if d.get("accumulator_bytes") else []  # fmt: skip
    synced = [
        f"  synchronised batch norm: {len(stats)} blocking all-reduces of {sum(k['bytes'] for k in stats):,} bytes "
        "in all (each batch norm's statistics forward, its sum(g) and sum(g xh) backward), waited for where they "
        "start: on the critical path, not overlapped"
    ] if stats else []  # fmt: skip
    return "\n".join([
        f"data parallel: {d['ranks']} rank(s) x {d['micro_batches']} micro-batch(es) of {d['batch_per_shard']} "
        f"(global batch {d['global_batch']}); per rank:",
        f"  {len(grads)} gradient bucket(s), in backward order, MiB: {sizes}; each all-reduce starts when its last "
        "gradient exists and is waited for before the first update",
        f"  gradients live until their bucket is reduced: peak {d['peak_bytes'] / 2**20:.2f} MiB, "
        f"{d['extra_bytes'] / 2**20:+.2f} MiB against one process's plan ({d['single_process_peak_bytes'] / 2**20:.2f} "
        "MiB)",
        *accumulated,
        *synced,
    ])  # fmt: skip


def stats_json(c: api.Compilation, stage: str | None) -> dict[str, Any]:
    assert c.program is not None and c.train is not None and c.opt is not None
    rows = [("graph", c.program.graph), ("train", c.train), ("opt", c.opt)]
    stages = [{"stage": n, "statements": len(g.stmts), "kernels": kernels(g)} for n, g in rows if stage in (None, n)]
    passes = [{"pass": p.name, "statements": p.statements, "kernels": p.kernels} for p in c.passes]
    return {"stages": stages, "passes": passes}


def stats_text(obj: dict[str, Any]) -> str:
    lines = [f"{'stage':<12} {'statements':>10} {'kernels':>8}"]
    lines += [f"{r['stage']:<12} {r['statements']:>10} {r['kernels']:>8}" for r in obj["stages"]]
    lines += ["", f"{'after pass':<12} {'statements':>10} {'kernels':>8}"]
    lines += [f"{r['pass']:<12} {r['statements']:>10} {r['kernels']:>8}" for r in obj["passes"]]
    return "\n".join(lines)


def check_json(p: Program) -> dict[str, Any]:
    g = p.graph
    return {
        "network": g.name,
        "parameters": g.parameter_count,
        "parameter_bytes": g.parameter_bytes,
        "inputs": {d.value.name: list(d.value.type.shape) for d in g.inputs},
        "outputs": {name: list(v.type.shape) for name, v in g.outputs},
        "precision": p.train.precision,  # the train block's (nothing runs here; --precision is run's and memcheck's)
        "layers": [
            {"name": r.name, "op": r.kind, "output": list(r.output.shape), "parameters": r.parameters} for r in p.layers
        ],
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def check_text(p: Program, file: str, layers: bool) -> str:
    g = p.graph
    lines = [f"network {g.name}  ({file})"]
    for i, d in enumerate(g.inputs):
        extra = "" if d.classes is None else f"  ({d.classes} classes)"
        extra = f"  (vocab {d.classes})" if d.kind == "input" and d.classes is not None else extra
        lines.append(f"  {'inputs' if i == 0 else '':<11} {d.value.name} {d.value.type}{extra}")
    for name, v in g.outputs:
        lines.append(f"  {name:<11} {v.type}")
    lines.append(f"  {'parameters':<11} {g.parameter_count:,} ({_mib(g.parameter_bytes)})")
    if g.state:
        n = sum(s.value.type.numel for s in g.state)
        lines.append(f"  {'state':<11} {n:,} ({_mib(n * 4)}: running statistics)")
    if layers:
        width = max([5, *(len(r.name) for r in p.layers)])
        kind_w = max([4, *(len(r.kind) for r in p.layers)])
        lines.append("")
        lines.append(f"  {'layer':<{width}}  {'kind':<{kind_w}}  {'output':<20} {'parameters':>12}")
        for r in p.layers:
            lines.append(f"  {r.name:<{width}}  {r.kind:<{kind_w}}  {str(r.output):<20} {r.parameters:>12,}")
    return "\n".join(lines)
