"""Inlining of small index expressions: a broadcast or a constant (an op whose entry is `inline_into_readers`)
read by several element-wise statements is recomputed inside each of them instead of being stored (a [C] ->
[N, C, H, W] broadcast costs a read, its buffer costs N·H·W times more). Single-use expressions are inlined by
`fuse`.

Legal because the inlined expression is pure and cheap: no reduction, at most a few operations.
"""

from __future__ import annotations

from deepdsl.ir import REGISTRY, Graph
from deepdsl.ir.analysis import composable_form, has_reduce, readers, returned
from deepdsl.ir.graph import make_attrs
from deepdsl.passes.fuse import inline_input
from deepdsl.passes.simplify import fold


def inline(g: Graph) -> Graph:
    pinned = returned(g)
    read_by = readers(g.stmts)
    small = {
        s.out.name: composable_form(s)
        for s in g.stmts
        if REGISTRY[s.op].inline_into_readers and s.out.name not in pinned and read_by.get(s.out.name)
        and all(composable_form(g.stmts[r]) is not None for r in read_by[s.out.name])
    }  # fmt: skip
    if not small:
        return g
    fresh = [0]
    out = []
    for s in g.stmts:
        if s.out.name in small:
            continue
        form = composable_form(s) if any(v.name in small for v in s.inputs) else None
        if form is not None:
            k = 0
            while k < len(form.inputs):
                producer = small.get(form.inputs[k].name)
                if producer is None or has_reduce(producer.body):
                    k += 1
                    continue
                form = inline_input(form, k, producer, fresh)
                k = 0
            attrs = make_attrs(out=form.out, body=fold(form.body), ops=form.ops)
            s = s.replace(op="fused", inputs=form.inputs, attrs=attrs)
        out.append(s)
    return g.replace(stmts=tuple(out))
