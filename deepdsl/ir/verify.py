"""check_graph: single assignment, definition before use, and every shape re-derived from the registry."""

from __future__ import annotations

from deepdsl.ir.graph import Graph
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.registry import REGISTRY
from deepdsl.ir.types import ShapeError, computed


class GraphInvariantError(AssertionError):
    """A compiler bug: the graph breaks an IR invariant. The message shows the statements around it."""


def check_graph(g: Graph) -> Graph:
    defined = {d.value.name: d.value for d in g.inputs}
    for p in g.params:
        if p.value.name in defined:
            _fail(g, -1, f"{p.value} defined twice")
        defined[p.value.name] = p.value
    for i, s in enumerate(g.stmts):
        for v in s.inputs:
            if defined.get(v.name) != v:
                _fail(g, i, f"{v} used before its definition (or with another type)")
        if s.out.name in defined:
            _fail(g, i, f"{s.out} assigned twice")
        opdef = REGISTRY.get(s.op)
        if opdef is None:
            _fail(g, i, f"unknown op {s.op}")
            continue
        try:
            primary = s.inputs[: opdef.arity] if "epilogue" in s.a else s.inputs  # epilogue inputs follow
            if opdef.arity is not None and len(primary) != opdef.arity:
                raise ShapeError(f"{s.op} takes {opdef.arity} inputs, got {len(s.inputs)}")
            t = opdef.shape(tuple(computed(v.type) for v in primary), s.a)
        except ShapeError as exc:
            _fail(g, i, f"shape rule fails: {exc}")
        if t != computed(s.out.type) and not (s.op == "cast_bf16" and t == s.out.type):
            _fail(g, i, f"type {s.out.type} but the shape rule gives {t}")
        defined[s.out.name] = s.out
    for name, v in g.outputs:
        if defined.get(v.name) != v:
            _fail(g, len(g.stmts), f"output {name} = {v} is not defined")
    params = {p.value.name: p.value for p in g.params}
    for name, v in g.updates:
        if defined.get(v.name) != v:
            _fail(g, len(g.stmts), f"update {name} = {v} is not defined")
        if name not in params or params[name].type != v.type:
            _fail(g, len(g.stmts), f"update {name} = {v}: no parameter or state of that name and type")
    return g


def _fail(g: Graph, at: int, message: str) -> None:
    lo, hi = max(0, at - 10), min(len(g.stmts), at + 11)
    around = [("> " if i == at else "  ") + format_stmt(g.stmts[i]) for i in range(lo, hi)]
    raise GraphInvariantError(f"{g.name}: statement {at}: {message}\n" + "\n".join(around))
