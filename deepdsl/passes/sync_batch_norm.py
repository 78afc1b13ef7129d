"""Synchronised batch norm (PyTorch's SyncBatchNorm) in a data-parallel training program: each training batch
norm's statistics are the global batch's.

`sync_batch_norm(g, scale)` rewrites the statements batch norm's lowering and gradient made (ops/norm.py), as the
first step of `data_parallel` where `Bucketing.sync_batch_norm` asks for it: the forward's per-channel mean and mean
square of x less the running mean (equal on every rank) are summed over the ranks by a small blocking all-reduce
(kind "stats": its wait right after its start, in the statistics' place), then the mean and the biased variance
formed from them; the backward's sum(g) and sum(g xh) likewise, before dx. What is computed from the reduced sums
and data-independent values alone is equal on every rank (`rank_invariant`): the scale and shift's gradients and
the running statistics, which data_parallel.py then leaves out of its buckets. The running variance's unbiased
correction is the global count's, R N H W / (R N H W - 1), formed from `dp/scale` (= 1/R): micro-batches are
refused (`refuse_micro_batches`), since a micro-batch's statistics would be neither the global batch's nor those
of gradient accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdsl.errors import DslProgramError, Span
from deepdsl.ir import REGISTRY, Graph, Stmt, Value
from deepdsl.ir.graph import make_attrs
from deepdsl.ops.collective import STATS, data_dependent


def rank_invariant(g: Graph) -> set[str]:
    """The data-dependent values of `g` that are equal on every rank: the results of a statistics all-reduce and
    what is computed from them and from data-independent values alone (the global batch norm statistics, the scale
    and shift's gradients made from them, the running statistics updated from them)."""
    varying = data_dependent(g)
    equal: set[str] = set()
    for s in g.stmts:
        if s.op == "allreduce_wait" and s.a["kind"] == STATS:
            equal.add(s.out.name)
        elif s.out.name in varying and all(v.name not in varying or v.name in equal for v in s.inputs):
            equal.add(s.out.name)
    return equal


@dataclass(frozen=True)
class _Norm:
    """One training batch norm as batch_norm's lowering and gradient made it (ops/norm.py): its input, the
    statements of its batch mean and variance and of its apply (bn_train_apply: x, mean, var, gamma, beta), and the
    backward's sum(g xh) and sum(g) that bn_train_backward reads (None where nothing needs d x)."""

    x: Value
    mean: Stmt
    var: Stmt
    apply: Stmt
    sums: tuple[Value, Value] | None


def _norms(g: Graph) -> list[_Norm]:
    """Every training batch norm of `g` (bn_train_apply over its input's own channel_mean and channel_var); a
    DslProgramError at a batch norm without a scale and shift (its gradient reaches x through the statistics' own
    rules, which the rewrite does not synchronise)."""
    made = {s.out.name: s for s in g.stmts}

    def batch_stats(s: Stmt) -> tuple[Stmt, Stmt] | None:
        x, m, v = s.inputs[:3]
        ms, vs = made.get(m.name), made.get(v.name)
        if (ms is None or vs is None or ms.op != "channel_mean" or vs.op != "channel_var" or ms.inputs != (x,)
                or vs.inputs != (x, m)):  # fmt: skip
            return None
        return ms, vs

    found: dict[str, _Norm] = {}
    for s in g.stmts:
        if s.op == "bn_train_apply" and (st := batch_stats(s)) is not None:
            found[st[0].out.name] = _Norm(s.inputs[0], st[0], st[1], s, None)
    for s in g.stmts:
        if s.op == "bn_train_backward" and s.inputs[2].name in found:
            n = found[s.inputs[2].name]
            found[s.inputs[2].name] = _Norm(n.x, n.mean, n.var, n.apply, (s.inputs[5], s.inputs[6]))
        elif s.op == "bn_apply" and s.inputs[1].name not in found and batch_stats(s) is not None:
            raise DslProgramError(
                "sync_batch_norm: a batch norm without a scale and shift (affine=false) is not synchronised",
                s.span,
                hint="give it its scale and shift (affine=true, the default), or leave sync_batch_norm off",
            )
    return list(found.values())


def sync_batch_norm(g: Graph, scale: Value) -> Graph:
    """`g` with every training batch norm's statistics over the global batch (see the module): the all-reduces are
    `allreduce_start` / `allreduce_wait` of kind "stats", numbered from 0 here (`data_parallel` numbers them after
    its buckets), each wait right after its start."""
    norms = _norms(g)
    if not norms:
        return g
    taken = {d.value.name for d in g.inputs} | {p.value.name for p in g.params} | {s.out.name for s in g.stmts}
    counter = 0
    index = 0

    def emit(op: str, ins: tuple[Value, ...], at: Stmt, **attrs: object) -> Stmt:
        nonlocal counter
        t = REGISTRY[op].shape(tuple(v.type for v in ins), attrs)
        while True:
            counter += 1
            name = f"sbn{counter}"
            if name not in taken:
                taken.add(name)
                break
        return Stmt(Value(name, t), op, ins, make_attrs(**attrs), at.span, at.layer)

    def reduce(parts: tuple[Value, ...], names: tuple[str, ...], at: Stmt) -> tuple[list[Stmt], list[Value]]:
        """The blocking all-reduce of `parts` (each per channel) times the scale: its statements, its slices."""
        nonlocal index
        sizes = tuple(v.type.numel for v in parts)
        start = emit("allreduce_start", (scale, *parts), at, bucket=index, kind=STATS, names=names, sizes=sizes)
        wait = emit("allreduce_wait", (start.out,), at, bucket=index, kind=STATS)
        index += 1
        out, views, offset = [start, wait], [], 0
        for v, name in zip(parts, names):
            sl = emit("bucket_slice", (wait.out,), at, offset=offset, shape=v.type.shape, name=name)
            out.append(sl)
            views.append(sl.out)
            offset += v.type.numel
        return out, views

    running = {s.inputs[1].name: s for s in g.stmts if s.op == "running_update"}
    by_mean = {n.mean.out.name: n for n in norms}
    by_var = {n.var.out.name: n for n in norms}
    last_sum = {}  # the statement after which a batch norm's backward sums are reduced: the later of the two
    made = {s.out.name: i for i, s in enumerate(g.stmts)}
    for n in norms:
        if n.sums is not None:
            last_sum[max(made[v.name] for v in n.sums)] = n
    rename: dict[str, Value] = {}
    unbiased: dict[str, Value] = {}  # a batch variance -> its global unbiased form (for the running variance)
    stmts: list[Stmt] = []
    for i, s in enumerate(g.stmts):
        s = s.replace(inputs=tuple(rename.get(v.name, v) for v in s.inputs))
        if s.out.name in by_var:  # made with the mean, below
            continue
        if s.op == "running_update" and g.stmts[i].inputs[1].name in unbiased:
            s = s.replace(inputs=(s.inputs[0], unbiased[g.stmts[i].inputs[1].name]),
                          attrs=make_attrs(**{**s.a, "correction": 1.0}))  # fmt: skip
        stmts.append(s)
        if s.out.name in by_mean:
            n = by_mean[s.out.name]
            what = running.get(s.out.name)
            layer = what.inputs[0].name.removesuffix(".running_mean") if what is not None else s.layer or s.out.name
            # the moments of x less the running mean (equal on every rank), which is near the batch mean once
            # training is under way: E[x^2] - E[x]^2 then cancels little where a channel's mean is large
            shift = what.inputs[0] if what is not None else None
            if shift is not None:
                centre = emit("broadcast_channel", (shift,), s, shape=n.x.type.shape)
                moved = emit("sub", (n.x, centre.out), s)
                first = emit("channel_mean", (moved.out,), s)
                stmts += [centre, moved, first]
                base, local = moved.out, first.out
            else:
                base, local = n.x, s.out
            product = emit("mul", (base, base), s)
            square = emit("channel_mean", (product.out,), s)
            names = (f"{layer}:batch_mean", f"{layer}:batch_mean_square")
            reduced, (moment, mean_square) = reduce((local, square.out), names, s)
            stmts += [product, square, *reduced]
            # the biased variance E[d^2] - E[d]^2 (never below 0 where rounding would take it there)
            sq = emit("mul", (moment, moment), s)
            diff = emit("sub", (mean_square, sq.out), s)
            var = emit("relu", (diff.out,), s)
            stmts += [sq, diff, var]
            mean = moment
            if shift is not None:
                back = emit("add", (shift, moment), s)
                stmts.append(back)
                mean = back.out
            # the running variance's unbiased correction over the global count G = per / scale: G / (G - 1)
            per = float(n.x.type.numel // n.x.type.shape[1])
            less = emit("rsub_scalar", (scale,), s, value=per)
            factor = emit("rdiv_scalar", (less.out,), s, value=per)
            spread = emit("broadcast_scalar", (factor.out,), s, shape=var.out.type.shape)
            corrected = emit("mul", (var.out, spread.out), s)
            stmts += [less, factor, spread, corrected]
            rename[s.out.name] = mean
            rename[n.var.out.name] = var.out
            unbiased[n.var.out.name] = corrected.out
        if i in last_sum:
            n = last_sum[i]
            assert n.sums is not None
            params = (n.apply.inputs[3].name, n.apply.inputs[4].name)
            reduced, views = reduce(tuple(rename.get(v.name, v) for v in n.sums), params, s)
            stmts += reduced
            for v, w in zip(n.sums, views):
                rename[v.name] = w
    outputs = tuple((name, rename.get(v.name, v)) for name, v in g.outputs)
    updates = tuple((name, rename.get(v.name, v)) for name, v in g.updates)
    return g.replace(stmts=tuple(stmts), outputs=outputs, updates=updates)


def refuse_micro_batches(g: Graph, micro_batches: int, span: Span | None) -> None:
    """A DslProgramError where the data-parallel program `g` synchronises batch norm (kind "stats" all-reduces) and
    is run over `micro_batches` > 1 a step: its statistics would be each micro-batch's sum over the ranks, neither the
    global batch's nor gradient accumulation's (PyTorch's SyncBatchNorm has no accumulation either). `span`: the
    train block's `sync_batch_norm` key, None where the flag asked for it."""
    if micro_batches <= 1 or not any(s.op == "allreduce_start" and s.a["kind"] == STATS for s in g.stmts):
        return
    what = "sync_batch_norm" if span is not None else "--sync-batch-norm"
    raise DslProgramError(
        f"{what} does not combine with --micro-batches {micro_batches}: a batch norm's statistics would be over one "
        "micro-batch of each rank, neither the global batch's nor those of gradient accumulation",
        span,
        hint="more ranks make the global batch larger with synchronised statistics; gradient accumulation "
        "(--micro-batches) normalises each micro-batch with its own (leave sync_batch_norm off)",
    )
