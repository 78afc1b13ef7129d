"""The stable text form of a Graph (`deepdsl ir --stage graph`), one line per statement."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.graph import Graph, Stmt
from deepdsl.ir.indexexpr import IE, format_ie
from deepdsl.ir.registry import REGISTRY


def format_attr(value: Any, stmt: Stmt, key: str = "") -> str:
    if isinstance(value, IE):
        names = tuple(str(v) for v in stmt.inputs)
        if key == "epilogue":  # Read(0) is the kernel's own result, then the inputs after its operands
            arity = REGISTRY[stmt.op].arity or 0
            names = ("$result", *names[arity:])
        return format_ie(value, names)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(format_attr(v, stmt) for v in value) + ")"
    return str(value)


def format_stmt(s: Stmt) -> str:
    attrs = ", ".join(f"{k}={format_attr(v, s, k)}" for k, v in s.attrs)
    attrs = f" {{{attrs}}}" if attrs else ""
    where = f"  # {s.span.file.rsplit('/', 1)[-1]}:{s.span.line}:{s.span.col}" if s.span else ""
    layer = f" {s.layer}" if s.layer else ""
    where = where + layer if where else (f"  #{layer}" if layer else "")
    return f"{s.out} = {s.op}({', '.join(map(str, s.inputs))}){attrs} : {s.out.type}{where}"


def format_graph(g: Graph) -> str:
    lines = [f"graph {g.name}"]
    for d in g.inputs:
        extra = f" classes {d.classes}" if d.classes is not None else ""
        lines.append(f"  {d.kind:<6} {d.value} : {d.value.type}{extra}")
    for p in g.params:
        lines.append(f"  {p.kind:<6} {p.value} : {p.value.type} = {p.init}")
    for s in g.stmts:
        lines.append("  " + format_stmt(s))
    for name, v in g.outputs:
        lines.append(f"  output {name} = {v}")
    for name, v in g.updates:
        lines.append(f"  update {name} = {v}")
    return "\n".join(lines) + "\n"
