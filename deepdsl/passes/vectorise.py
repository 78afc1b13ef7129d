"""Vectorise: an indexed statement that is a matrix product, a transpose or a plain reduction becomes the
library op for it, so a user's `tensor` function runs as fast as a built-in (a Gram matrix becomes a
batched GEMM).

Matched shapes, where every index is a plain variable whose range is the dimension it reads (so no read
falls outside, where the indexed form would give zero):
- out[i, j] = sum[k] A[i|k, k|i] * B[k|j, j|k]  -> matmul (with transposes), and with a leading batch
  index b in out, A and B -> batch_matmul;
- out[o...] = sum[r...] A[...]  (each index a distinct variable, the kept ones in order) -> sum_axes,
  times a constant when the body is scaled;
- out[o...] = A[permutation of o...]  -> transpose.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from deepdsl.ir import Graph, Stmt
from deepdsl.ir.analysis import output_indices, own_index
from deepdsl.ir.graph import make_attrs
from deepdsl.ir.indexexpr import IE, Apply, Const, Read, Reduce
from deepdsl.passes.rewrite import apply_rules


def _plain(r: Read, ranges: dict[str, int], shape: tuple[int, ...]) -> tuple[str, ...] | None:
    names = tuple(a.plain_var for a in r.index)
    if None in names or len(set(names)) != len(names):
        return None
    if any(ranges.get(n) != d for n, d in zip(names, shape)):  # type: ignore[arg-type]
        return None
    return names  # type: ignore[return-value]


def _gemm(s: Stmt, body: IE, out: tuple, ranges: dict) -> Stmt | None:
    if not (isinstance(body, Reduce) and body.kind == "sum" and len(body.vars) == 1):
        return None
    prod = body.body
    if not (isinstance(prod, Apply) and prod.fn == "*" and all(isinstance(a, Read) for a in prod.args)):
        return None
    (k, _), o = body.vars[0], tuple(n for n, _ in out)
    ra, rb = prod.args
    a = _plain(ra, ranges, s.inputs[ra.input].type.shape)  # type: ignore[union-attr]
    b = _plain(rb, ranges, s.inputs[rb.input].type.shape)  # type: ignore[union-attr]
    if a is None or b is None or len(o) not in (2, 3):
        return None
    batch = o[:-2]
    i, j = o[-2:]
    for (x, nx), (y, ny) in (((ra, a), (rb, b)), ((rb, b), (ra, a))):
        if nx[: len(batch)] != batch or ny[: len(batch)] != batch:
            continue
        ax, ay = nx[len(batch) :], ny[len(batch) :]
        if set(ax) == {i, k} and set(ay) == {k, j} and i != j:
            op = "batch_matmul" if batch else "matmul"
            attrs = make_attrs(transpose_a=ax == (k, i), transpose_b=ay == (j, k))
            return s.replace(op=op, inputs=(s.inputs[x.input], s.inputs[y.input]), attrs=attrs)  # type: ignore[union-attr]
    return None


def _scales(e: IE) -> TypeGuard[Apply]:
    """`e` is `a * c` or `a / c` with a constant c that can ride along as a scale (not a division by zero, which
    stays the element-wise statement it is, infinities and all)."""
    if not (isinstance(e, Apply) and e.fn in ("*", "/") and isinstance(e.args[1], Const)):
        return False
    return e.fn == "*" or e.args[1].value != 0


def _reduction(s: Stmt, body: IE, out: tuple) -> tuple[Stmt, float] | None:
    scale = 1.0
    if _scales(body):
        scale = body.args[1].value if body.fn == "*" else 1.0 / body.args[1].value
        body = body.args[0]
    if not (isinstance(body, Reduce) and body.kind == "sum"):
        return None
    read = body.body
    if _scales(read):  # sum[d] x / D
        scale *= read.args[1].value if read.fn == "*" else 1.0 / read.args[1].value
        read = read.args[0]
    if not isinstance(read, Read):
        return None
    ranges = dict(out) | dict(body.vars)
    names = _plain(read, ranges, s.inputs[read.input].type.shape)
    o = tuple(n for n, _ in out)
    if names is None or tuple(n for n in names if n in o) != o:
        return None
    axes = tuple(k for k, n in enumerate(names) if n not in o)
    return s.replace(op="sum_axes", inputs=(s.inputs[read.input],), attrs=make_attrs(axes=axes)), scale


def _transpose(s: Stmt, body: IE, out: tuple) -> Stmt | None:
    if not isinstance(body, Read):
        return None
    names = _plain(body, dict(out), s.inputs[body.input].type.shape)
    o = tuple(n for n, _ in out)
    if names is None or sorted(names) != sorted(o) or names == o:
        return None
    perm = tuple(names.index(n) for n in o)
    return s.replace(op="transpose", inputs=(s.inputs[body.input],), attrs=make_attrs(perm=perm))


def _vectorise(s: Stmt, defs: dict[str, Any]) -> Stmt | None:
    if s.op not in ("indexed", "fused"):
        return None
    body, out = s.a["body"], s.a["out"]
    found = _gemm(s, body, out, dict(out) | (dict(body.vars) if isinstance(body, Reduce) else {}))
    if found is None:
        found = _transpose(s, body, out)
    if found is None:
        reduced = _reduction(s, body, out)
        if reduced is not None:
            found, scale = reduced
            if scale != 1.0:  # the scale rides along as the reduction's epilogue: still one kernel
                own = Read(0, own_index(output_indices(found.out.type)))
                found = found.replace(attrs=found.attrs + (("epilogue", Apply("*", (own, Const(scale)))),))
    return found


def vectorise(g: Graph) -> Graph:
    return apply_rules(g, [_vectorise], max_rounds=1)
