"""Inlining of small index expressions: a broadcast or a constant (an op whose entry is `inline_into_readers`)
read by several element-wise statements is recomputed inside each of them instead of being stored (a [C] ->
[N, C, H, W] broadcast costs a read, its buffer costs N·H·W times more). Single-use expressions are inlined by
`fuse`.

Legal because the inlined expression is pure and cheap: no reduction, at most a few operations.
"""

from __future__ import annotations

from deepdsl.ir import REGISTRY, Graph, Stmt
from deepdsl.ir.graph import make_attrs
from deepdsl.passes.fuse import _form, _has_reduce, _inline
from deepdsl.passes.simplify import fold


def inline(g: Graph) -> Graph:
    pinned = {v.name for _, v in (*g.outputs, *g.updates)}
    readers: dict[str, list[Stmt]] = {}
    for s in g.stmts:
        for v in set(s.inputs):
            readers.setdefault(v.name, []).append(s)
    small = {
        s.out.name: _form(s)
        for s in g.stmts
        if REGISTRY[s.op].inline_into_readers and s.out.name not in pinned and readers.get(s.out.name)
        and all(_form(r) is not None for r in readers[s.out.name])
    }  # fmt: skip
    if not small:
        return g
    fresh = [0]
    out = []
    for s in g.stmts:
        if s.out.name in small:
            continue
        form = _form(s) if any(v.name in small for v in s.inputs) else None
        if form is not None:
            shape, body, inputs, ops = form
            k = 0
            while k < len(inputs):
                producer = small.get(inputs[k].name)
                if producer is None or _has_reduce(producer[1]):
                    k += 1
                    continue
                body, inputs = _inline(body, inputs, k, producer, fresh)
                ops = producer[3] + ops
                k = 0
            s = s.replace(op="fused", inputs=tuple(inputs), attrs=make_attrs(out=shape, body=fold(body), ops=ops))
        out.append(s)
    return g.replace(stmts=tuple(out))
