"""Common-subexpression elimination: value numbering over (op, inputs, attrs).

Two statements with the same op, the same inputs and the same attributes compute the same value
(ops are pure, and dropout masks depend only on their step input and attributes), so the later one is
replaced by the earlier. `net(x)` shared by `loss` and `predict`, and repeated backward subgraphs, merge.
"""

from __future__ import annotations

from deepdsl.ir import Graph, Stmt, Value
from deepdsl.passes.rewrite import apply_rules


def _numbering() -> object:
    seen: dict[tuple, Value] = {}

    def rule(s: Stmt, defs: dict[str, Stmt]) -> Value | None:
        key = (s.op, tuple(v.name for v in s.inputs), s.attrs)
        if key in seen and seen[key].name != s.out.name:
            return seen[key]
        seen[key] = s.out
        return None

    return rule


def cse(g: Graph) -> Graph:
    return apply_rules(g, [_numbering()], max_rounds=1) if g.stmts else g
