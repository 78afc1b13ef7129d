"""Sums down columns as row-outer loops: the Java form of a kernel `out[.., j] = sum[r..] f` whose terms read
contiguous runs along the output's last axis `j`.

The plain form of a reduction (java/kernels.py) loops over the reduction inside each output element. When the
terms read their inputs at `[.., r, j]` (a bias gradient `sum[r] dy[r, j]`, an embedding's gradient
`sum[r] (tokens[r] == v ? dy[r, j] : 0)`), that inner loop walks a column with a stride of a whole row. Here the
loops are turned around: the output's last axis is the innermost loop, each term added into the output element
itself (first set to 0), and the reduction's loops around it, so the inner loop reads and writes contiguous memory
and vectorises. When the term is `cond ? x : 0` with a condition that does not depend on `j` (an embedding's
one-hot lookup), the condition is tested once per reduction step, outside the inner loop, and the run is skipped
where it fails: an embedding's lookup and gradient cost one test per token instead of one per token and column.

The terms of each output element are added in the reduction's order into one float, as the plain form's one
accumulator does, so the result differs from the plain form's four lane accumulators only in rounding. A kernel's
output is never in place over an input it reduces (memory/check.py), so setting it to 0 first is sound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepdsl.backends import cexpr
from deepdsl.backends.java.invariants import mentions
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, Reduce, reads

if TYPE_CHECKING:
    from deepdsl.backends.java.kernels import Gen


def _has_reduce(e: IE) -> bool:
    return isinstance(e, Reduce) or isinstance(e, Apply) and any(_has_reduce(a) for a in e.args)


def column_form(body: IE, out: tuple[tuple[str, int], ...]) -> tuple[IE | None, IE] | None:
    """`(cond, term)` where `body` is `sum[r..] term` (or `sum[r..] (cond ? term : 0)` with `cond` free of the
    output's last variable `j`) whose reads either do not use `j` or read it plainly as their last index and use it
    nowhere else, at least one of them reading it; None for any other body."""
    if not out or not isinstance(body, Reduce) or body.kind != "sum" or _has_reduce(body.body):
        return None
    j = out[-1][0]
    cond: IE | None = None
    term = body.body
    if isinstance(term, Apply) and term.fn == "select" and term.args[2] == Const(0.0):
        if not mentions(term.args[0], j):
            cond, term = term.args[0], term.args[1]
    along = 0
    for r in reads(body.body):
        if any(mentions(Read(r.input, (a,)), j) for a in r.index[:-1]):
            return None
        if r.index and mentions(Read(r.input, (r.index[-1],)), j):
            if r.index[-1] != Affine.var(j):
                return None
            along += 1
    return (cond, term) if along else None


def column_loops(g: Gen, body: Reduce, cond: IE | None, term: IE, names: list[str], target: str,
                 dialect: cexpr.Dialect) -> list[str]:  # fmt: skip
    """The loops of a kernel in its column form: the output's outer axes as the plain form loops over them
    (`names`, the first over the rows `[lo, hi)`), then the last axis (`names[-1]`) set to 0, the
    reduction's loops, the condition, and the last axis again adding each term into `target`."""
    assert g.sizes is not None  # a shaped kernel: its sizes are the buffers' dims
    depth = len(names)
    lines = []
    for k, v in enumerate(names[:-1]):
        lo, hi = ("lo", "hi") if k == 0 else ("0", g.sizes.out_dim(k))
        lines.append(f"{'  ' * (k + 2)}for (int {v} = {lo}; {v} < {hi}; {v}++) {{")
    indent = "  " * (depth + 1)
    j = names[-1]
    lo, hi = ("lo", "hi") if depth == 1 else ("0", g.sizes.out_dim(depth - 1))
    lines.append(f"{indent}for (int {j} = {lo}; {j} < {hi}; {j}++) {{")
    lines += [f"{indent}  {target} = 0f;", f"{indent}}}"]
    inner = indent
    for var, size in body.vars:
        bound = g.range_of(var, size, body.body)
        v = g.bind(var, size, bound)
        lines.append(f"{inner}for (int {v} = 0; {v} < {bound}; {v}++) {{")
        inner += "  "
    opened = len(body.vars)
    outer, g.locals = g.locals, None  # the term changes with the reduction's variables: no locals shared
    try:
        if cond is not None:
            pre: list[str] = []
            test = cexpr.as_bool(g.expr(cond, pre, inner), dialect)
            lines += [*pre, f"{inner}if ({test}) {{"]
            inner += "  "
            opened += 1
        pre = []
        value = cexpr.as_float(g.expr(term, pre, inner + "  "), dialect)
    finally:
        g.locals = outer
    lines.append(f"{inner}for (int {j} = {lo}; {j} < {hi}; {j}++) {{")
    lines += [*pre, f"{inner}  {target} += {value};", f"{inner}}}"]
    for k in range(opened):
        lines.append(f"{indent}{'  ' * (opened - 1 - k)}}}")
    lines += [f"{'  ' * (k + 2)}}}" for k in reversed(range(depth - 1))]
    return lines
