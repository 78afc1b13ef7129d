"""A tiny rule engine and the graph surgery every pass shares.

A rule looks at one statement (its inputs already renamed to their replacements) and the statements
that defined its inputs, and returns None (no change), a Value (the statement's result is that value)
or a new Stmt (it replaces the statement, keeping its result's name and type).
"""

from __future__ import annotations

from collections.abc import Callable

from deepdsl.ir import Graph, Stmt, Value

Rule = Callable[[Stmt, dict[str, Stmt]], "Value | Stmt | None"]


def rename(g: Graph, stmts: list[Stmt], mapping: dict[str, Value]) -> Graph:
    """`g` with `stmts`, and its outputs and updates renamed through `mapping`."""

    def r(v: Value) -> Value:
        return mapping.get(v.name, v)

    return g.replace(
        stmts=tuple(stmts),
        outputs=tuple((n, r(v)) for n, v in g.outputs),
        updates=tuple((n, r(v)) for n, v in g.updates),
    )


def apply_rules(g: Graph, rules: list[Rule], max_rounds: int = 20) -> Graph:
    """Apply `rules` statement by statement, to a fixed point; returns `g` itself when nothing changed."""
    current = g
    for _ in range(max_rounds):
        mapping: dict[str, Value] = {}
        defs: dict[str, Stmt] = {}
        out: list[Stmt] = []
        changed = False
        for s in current.stmts:
            if any(v.name in mapping for v in s.inputs):
                s = s.replace(inputs=tuple(mapping.get(v.name, v) for v in s.inputs))
                changed = True
            for rule in rules:
                result = rule(s, defs)
                if result is None:
                    continue
                changed = True
                if isinstance(result, Value):
                    mapping[s.out.name] = result
                    s = None  # type: ignore[assignment]
                    break
                s = result
            if s is not None:
                out.append(s)
                defs[s.out.name] = s
        if not changed:
            return current
        current = rename(current, out, mapping)
    return current
