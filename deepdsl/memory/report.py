"""`deepdsl memcheck`: what one training step needs, from the plan, per layer and in total.

peak = persistent storage (parameters, model state, optimizer state) + the batch's inputs + the arena.
The naive peak keeps every statement result to the end of the step instead.
"""

from __future__ import annotations

import re
from typing import Any

from deepdsl.errors import DslProgramError
from deepdsl.files import atomic_output
from deepdsl.ir import REGISTRY, Graph
from deepdsl.memory.plan import Plan, aligned

# the most scratch one cuDNN convolution may take on the GPU where the plan sets no workspace limit (the PyCUDA
# runner's and the Java CUDA device's default): cuDNN's fast algorithms want more than the CPU's im2col
VENDOR_WORKSPACE_LIMIT = 1 << 30

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """'16GiB', '12GB', '512MiB', '1048576' -> bytes; ValueError on anything else."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise ValueError(f"{text!r} is not a size such as 16GiB, 12GB or 512MiB")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def flops(g: Graph) -> int:
    total = 0
    for s in g.stmts:
        op = REGISTRY[s.op]
        primary = s.inputs[: op.arity] if "epilogue" in s.a else s.inputs
        if op.flops is not None:
            total += op.flops(tuple(v.type for v in primary), s.out.type, s.a)
        if "epilogue" in s.a:
            total += s.out.type.numel
    return total


def persistent_bytes(g: Graph) -> int:
    """Parameters, model and optimizer state, and the batch's inputs: storage outside the arena."""
    return sum(q.value.type.nbytes for q in g.params) + sum(d.value.type.nbytes for d in g.inputs)


def trained_bytes(g: Graph) -> int:
    """Bytes of the parameters the training program `g` updates: those with a gradient (not frozen, and reached by
    the loss), so the bytes of their gradients."""
    updated = {name for name, _ in g.updates}
    return sum(q.value.type.nbytes for q in g.params if q.kind == "param" and q.value.name in updated)


def total_peak(p: Plan) -> int:
    return persistent_bytes(p.graph) + p.arena_bytes


def gpu_scratch_bytes(p: Plan) -> int:
    """The most the CUDA devices' one shared cuDNN scratch (beside the arena) can take for the step of plan `p`:
    where it has a cuDNN convolution, the workspace limit (its chosen algorithm may want up to that much beyond the
    statement's planned workspace); else nothing."""
    from deepdsl.ir.vendor import ConvBackwardData, ConvBackwardFilter, ConvForward, vendor_call

    limit = VENDOR_WORKSPACE_LIMIT if p.workspace_limit is None else p.workspace_limit
    convolutions = (ConvForward, ConvBackwardData, ConvBackwardFilter)
    return limit if any(isinstance(vendor_call(s), convolutions) for s in p.graph.stmts) else 0


def gpu_table_bytes(p: Plan) -> int:
    """The bytes of the tables the CUDA devices' multi-tensor launches read (ir/launches.py; the optimiser's updates in
    one launch): per launch of several segments, the segment count and a row of 64-bit numbers per segment (its first
    block, blocks, elements, kind, then its tensors' addresses; every row as wide as the widest). Written once at the
    start, beside the arena (a step reads them across the plan's whole life, and a smaller step may run between two
    train steps in the same arena), so they are not arena bytes; both CUDA devices allocate exactly this."""
    from deepdsl.ir.groups import group_form
    from deepdsl.memory.launches import planned_launches

    total = 0
    for launch in planned_launches(p):
        if len(launch) > 1:
            width = 4 + max(len(g) + len(group_form(g).inputs) for g in launch)
            total += 8 * (1 + len(launch) * width)
    return total


def naive_arena_bytes(g: Graph) -> int:
    """Every statement result kept to the end of the step, each in its own buffer (views share their base's)."""
    return sum(aligned(s.out.type.nbytes) for s in g.stmts if not REGISTRY[s.op].view)


def report(
    p: Plan, forward: Graph | None = None, remat: str = "none", extra_flops: int = 0, naive: Graph | None = None,
    per_statement: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The memcheck figures of plan `p`; with the forward graph, the eager baseline too (DESIGN §5). The naive
    baseline is taken over `naive`, the program before rematerialisation, when given."""
    from deepdsl.memory.eager import eager_peak_bytes

    g = p.graph
    params = sum(q.value.type.nbytes for q in g.params if q.kind == "param")
    state = sum(q.value.type.nbytes for q in g.params if q.kind == "state")
    opt = sum(q.value.type.nbytes for q in g.params if q.kind == "opt")
    inputs = sum(d.value.type.nbytes for d in g.inputs)
    persistent = persistent_bytes(g)  # with the constants hoisted out of the step (a few bytes)
    train_flops = flops(g) - extra_flops
    at = g.stmts[p.peak_at] if g.stmts else None
    where = {"statement": p.peak_at, "value": f"%{at.out.name}" if at else None, "op": at.op if at else None,
             "layer": at.layer if at else None,
             "source": f"{at.span.file}:{at.span.line}:{at.span.col}" if at and at.span else None}  # fmt: skip
    return {
        "network": g.name,
        "peak_bytes": persistent + p.arena_bytes,
        "peak_at": where,
        "naive_peak_bytes": persistent + naive_arena_bytes(naive if naive is not None else g),
        "eager_peak_bytes": eager_peak_bytes(forward, g) if forward is not None else None,
        "arena_bytes": p.arena_bytes,
        "parameter_bytes": params,
        "state_bytes": state,
        "gradient_bytes": trained_bytes(g),
        "optimizer_state_bytes": opt,
        "input_bytes": inputs,
        "constant_bytes": sum(q.value.type.nbytes for q in g.params if q.kind == "const"),
        "workspace_bytes": max((b.nbytes for b in p.workspace.values()), default=0),
        "workspace_limit": p.workspace_limit,
        # on --device cuda with cuDNN: the most its shared scratch may add beside the arena, and the peak with it (the
        # run's --json says the scratch its chosen algorithms took: gpu_vendor_scratch_bytes)
        "gpu_scratch_limit_bytes": (gpu := gpu_scratch_bytes(p)),
        "gpu_table_bytes": (tables := gpu_table_bytes(p)),
        "gpu_peak_bytes": persistent + p.arena_bytes + gpu + tables,
        "train_flops": train_flops,
        "extra_flops": extra_flops,
        "remat": remat,
        "rows": rows(p, per_statement),
    }


def rows(p: Plan, per_statement: bool = False) -> list[dict[str, Any]]:
    """Per layer (or per statement), in schedule order: the arena bytes allocated and freed, the arena live after
    the row (`live`: the row before's plus allocated less freed), and the most live while one of its statements
    runs (`peak`: its inputs, its result and its workspace at once; the largest is the arena, less any gaps
    the placement leaves between lifetimes)."""
    g = p.graph
    during = live_bytes(p)
    born = {b.start: b for b in p.buffers}
    dies: dict[int, int] = {}
    for b in p.buffers:
        dies[b.end] = dies.get(b.end, 0) + b.nbytes
    out: list[dict[str, Any]] = []
    live = 0
    for i, s in enumerate(g.stmts):
        alloc = born[i].nbytes if i in born and born[i].values[0] == s.out.name else 0
        freed = dies.get(i, 0)
        live += alloc - freed
        name = s.layer or "(program)"
        if per_statement:
            row = {"statement": i, "value": f"%{s.out.name}", "op": s.op, "layer": name, "statements": 0,
                   "allocated": 0, "freed": 0, "workspace": 0, "live": 0, "peak": 0}  # fmt: skip
            out.append(row)
        elif out and out[-1]["layer"] == name:
            row = out[-1]
        else:
            row = {"layer": name, "statements": 0, "allocated": 0, "freed": 0, "workspace": 0, "live": 0, "peak": 0}
            out.append(row)
        row["statements"] += 1
        row["allocated"] += alloc
        row["freed"] += freed
        ws = p.workspace.get(s.out.name)
        row["workspace"] = max(row["workspace"], ws.nbytes if ws else 0)  # scratch: alive during one statement
        row["live"] = live
        row["peak"] = max(row["peak"], during[i])
    return out


def live_bytes(p: Plan) -> list[int]:
    """The arena bytes alive while each statement runs (its inputs and its result)."""
    live = [0] * len(p.graph.stmts)
    for b in (*p.buffers, *p.workspace.values()):
        for i in range(b.start, min(b.end, len(live) - 1) + 1):
            live[i] += b.nbytes
    return live


# what --plot writes, by the file name's suffix
PLOT_FORMATS = ("png", "svg", "pdf")


class MissingDependency(RuntimeError):
    """An optional package a feature needs is not installed."""


def plot(p: Plan, r: dict[str, Any], path: str, replace_readonly: bool = False) -> None:
    """Draw the live memory over the schedule, with the peak marked, into `path` (PNG, SVG or PDF, by its suffix),
    atomically (files.py: never through a link, a read-only file only with `replace_readonly`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependency(
            "--plot needs matplotlib, which is not installed: pip install 'deepdsl[plot]'"
        ) from None
    persistent = r["peak_bytes"] - r["arena_bytes"]
    live = [(persistent + x) / 2**20 for x in live_bytes(p)]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.fill_between(range(len(live)), live, step="mid", alpha=0.4)
    ax.axhline(persistent / 2**20, color="grey", linewidth=0.8, linestyle="--", label="parameters, state, inputs")
    if r.get("eager_peak_bytes"):
        ax.axhline(r["eager_peak_bytes"] / 2**20, color="tab:red", linewidth=0.8, linestyle=":", label="eager peak")
    at = r["peak_at"]
    ax.plot([at["statement"]], [r["peak_bytes"] / 2**20], "v", color="black")
    where = f"{at['value']} = {at['op']}" + (f" ({at['layer']})" if at["layer"] else "")
    ax.annotate(f"peak {size(r['peak_bytes'])}\n{where}", (at["statement"], r["peak_bytes"] / 2**20),
                textcoords="offset points", xytext=(6, -24), fontsize=8)  # fmt: skip
    ax.set_xlabel("statement (schedule order)")
    ax.set_ylabel("MiB live")
    ax.set_title(f"{r['network']}: one training step, remat {r['remat']}")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    try:
        with atomic_output(path, replace_readonly=replace_readonly) as f:
            fig.savefig(f, dpi=120, format=path.rsplit(".", 1)[-1].lower())
    finally:
        plt.close(fig)


def size(n: int) -> str:
    """Bytes in the unit that shows them best: `256 B`, `6.3 KiB`, `1.5 MiB`, `5.26 GiB`."""
    if n < 2**10:
        return f"{n} B"
    if n < 2**20:
        return f"{n / 2**10:.1f} KiB"
    if n < 2**30:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**30:,.2f} GiB"


# the columns of the rows table: key -> title
COLUMNS = {"allocated": "allocated", "freed": "freed", "workspace": "workspace", "live": "live after",
           "peak": "peak live"}  # fmt: skip


def format_report(r: dict[str, Any], with_rows: bool) -> str:
    lines = [f"memcheck {r['network']}: one training step" + (f" in {r['precision']}" if "precision" in r else "")]
    if with_rows:
        width = max([5, *(len(x["layer"]) for x in r["rows"])])
        per_statement = bool(r["rows"]) and "statement" in r["rows"][0]
        head = f"{'#':>5} {'value':<8} {'op':<24} {'layer':<{width}}" if per_statement else (
            f"{'layer':<{width}} {'stmts':>5}")  # fmt: skip
        lines.append(f"  {head} " + " ".join(f"{title:>11}" for title in COLUMNS.values()))
        for x in r["rows"]:
            key = (f"{x['statement']:>5} {x['value']:<8} {x['op']:<24} {x['layer']:<{width}}" if per_statement
                   else f"{x['layer']:<{width}} {x['statements']:>5}")  # fmt: skip
            lines.append(f"  {key} " + " ".join(f"{size(x[k]):>11}" for k in COLUMNS))
        lines += [
            "",
            "  (arena bytes: a row's values are allocated where they are written and freed after their last read;",
            "   live after = the row before's + allocated - freed; peak live = the most held while one of the row's",
            "   statements runs, its inputs, result and workspace at once: the largest is the arena below)",
            "",
        ]
    at = r["peak_at"]
    most = max((x["peak"] for x in r["rows"]), default=r["arena_bytes"])
    lines += [
        f"  parameters        {size(r['parameter_bytes'])}",
        f"  gradients         {size(r['gradient_bytes'])}  (inside the arena while alive)",
        f"  optimizer state   {size(r['optimizer_state_bytes'])}",
        f"  model state       {size(r['state_bytes'])}",
        f"  inputs            {size(r['input_bytes'])}",
        f"  arena             {size(r['arena_bytes'])}  (activations, gradients, temporaries, workspace)"
        + (
            f"; at most {size(most)} of it live at once, {size(r['arena_bytes'] - most)} lost to gaps between lifetimes"
            if most < r["arena_bytes"]
            else ""
        ),
        f"  workspace         {size(r['workspace_bytes'])}  (the largest scratch of one statement, limit "
        + ("none" if r["workspace_limit"] is None else f"{r['workspace_limit']:,} bytes")
        + ")",
        f"  cuDNN scratch     at most {size(r['gpu_scratch_limit_bytes'])} beside the arena on --device cuda with "
        f"cuDNN (its convolutions' algorithms, chosen at the start within the workspace limit)"
        + (f", the multi-tensor launches' tables {size(r['gpu_table_bytes'])}" if r["gpu_table_bytes"] else "")
        + f"; GPU peak at most {size(r['gpu_peak_bytes'])}",
        f"  peak              {size(r['peak_bytes'])}  at statement {at['statement']}: {at['value']} = {at['op']}"
        + (f" in layer {at['layer']}" if at["layer"] else "")
        + (f" ({at['source']})" if at["source"] else ""),
        f"  naive peak        {size(r['naive_peak_bytes'])}  (every value kept to the end)"
        + f", {r['naive_peak_bytes'] / r['peak_bytes']:.2f}x the peak",
    ]
    if r.get("eager_peak_bytes"):
        lines.append(
            f"  eager peak        {size(r['eager_peak_bytes'])}  (kept for the backward pass by eager autograd, "
            f"with parameters, gradients, optimizer state); the peak is "
            f"{r['peak_bytes'] / r['eager_peak_bytes']:.2f}x that"
        )
    lines.append(f"  train FLOPs       {r['train_flops']:,}")
    extra = f" (+{r['extra_flops']:,} FLOPs, {100 * r['extra_flops'] / max(r['train_flops'], 1):.1f}% of a step)"
    lines.append(f"  rematerialised    {r['remat']}" + (extra if r["remat"] != "none" else ""))
    if "budget_bytes" in r:
        verdict = "fits" if r["fits"] else "does NOT fit"
        lines.append(
            f"  budget            {size(r['budget_bytes'])}: {verdict}; largest batch that fits: {r['max_batch']}"
        )
    return "\n".join(lines)


def largest_batch(peak_for: Any, budget: int, limit: int = 1 << 16, known: tuple[int, int] | None = None) -> int:
    """The largest N with peak_for(N) <= budget (0 if even N = 1 does not fit); peak grows with N.

    Each peak_for is a whole plan (a second for ResNet-50), so the search starts where the line through
    (1, peak_for(1)) and `known` (a batch already planned, and its peak) meets the budget: the peak is nearly
    linear in N. From there it brackets the answer in steps doubling away from the guess, then bisects; with
    a good guess that is three or four plans instead of twice log2 N."""
    seen: dict[int, bool] = {}

    def fits(n: int) -> bool:
        if n not in seen:
            seen[n] = peak_for(n) <= budget
        return seen[n]

    first = peak_for(1)
    seen[1] = first <= budget
    if not seen[1]:
        return 0
    guess = 2
    if known is not None and known[0] > 1 and known[1] > first:
        n0, p0 = known
        seen[n0] = p0 <= budget
        guess = int(1 + (budget - first) * (n0 - 1) / (p0 - first))
    guess = max(1, min(guess, limit))
    if fits(guess):  # walk up from the guess: lo fits, hi does not (limit + 1: nothing failed up to the limit)
        lo, hi, step = guess, limit + 1, 1
        while lo + step <= limit and fits(lo + step):
            lo, step = lo + step, 2 * step
        if lo + step <= limit:
            hi = lo + step
    else:  # walk down
        lo, hi, step = 1, guess, 1
        while hi - step > 1 and not fits(hi - step):
            hi, step = hi - step, 2 * step
        if hi - step > 1:
            lo = hi - step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def over_budget(p: Plan, r: dict[str, Any]) -> DslProgramError:
    """The diagnostic for a plan over its --gpu-mem budget, at the peak statement."""
    at = p.graph.stmts[p.peak_at]
    layer = f" in layer '{at.layer}'" if at.layer else ""
    return DslProgramError(
        f"the plan needs {r['peak_bytes']:,} bytes, over the --gpu-mem budget of {r['budget_bytes']:,}; its peak is "
        f"at statement {p.peak_at}, %{at.out.name} = {at.op}(...){layer}",
        at.span,
        hint=f"a batch of {r['max_batch']} fits (--set N={r['max_batch']})" if r.get("max_batch") else None,
    )
