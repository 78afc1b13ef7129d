"""In-place: an element-wise statement whose input dies there writes its result into that input's buffer.

Marked with the attribute `inplace=k` (input k's buffer is reused); the runners and the memory planner
honour it. Legal when input k has the result's type, is read by the statement only element for element
(every read at the output's own index, no reduction over it), is read by nothing later (nor by an output
or update), is a temporary (not an input, parameter or state), and is no view's base (the view would
see the overwrite).
"""

from __future__ import annotations

from deepdsl.ir import REGISTRY, Graph, Stmt
from deepdsl.ir.analysis import composable_form, last_reads, returned


def inplace(g: Graph) -> Graph:
    last = last_reads(g.stmts)
    pinned = returned(g)
    produced = {s.out.name: s for s in g.stmts}
    viewed = {v.name for s in g.stmts if REGISTRY[s.op].view for v in s.inputs}
    out: list[Stmt] = []
    changed = False
    for i, s in enumerate(g.stmts):
        k = _candidate(s, i, last, pinned, produced, viewed)
        if k is not None and s.a.get("inplace") != k:
            s = s.replace(attrs=tuple(sorted((*((a, v) for a, v in s.attrs if a != "inplace"), ("inplace", k)))))
            changed = True
        out.append(s)
    return g.replace(stmts=tuple(out)) if changed else g


def _candidate(s: Stmt, i: int, last: dict, pinned: set, produced: dict, viewed: set) -> int | None:
    form = composable_form(s)
    if form is None:
        return None
    for k, v in enumerate(form.inputs):
        p = produced.get(v.name)
        if (p is None or REGISTRY[p.op].view or v.type != s.out.type or last.get(v.name) != i or v.name in pinned
                or v.name in viewed or sum(1 for x in s.inputs if x == v) != 1):  # fmt: skip
            continue
        if form.reads_pointwise({k}):
            return k
    return None
