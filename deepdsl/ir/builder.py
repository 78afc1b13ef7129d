"""GraphBuilder: emits statements, running each op's shape rule as it goes, value-numbering on the fly."""

from __future__ import annotations

from typing import Any

from deepdsl.errors import Span
from deepdsl.ir.graph import Graph, InputDef, ParamDef, Stmt, Value, make_attrs
from deepdsl.ir.registry import lookup
from deepdsl.ir.types import ShapeError, TensorType


class GraphBuilder:
    def __init__(self, name: str):
        self.name = name
        self.inputs: list[InputDef] = []
        self.params: list[ParamDef] = []
        self.stmts: list[Stmt] = []
        self.outputs: list[tuple[str, Value]] = []
        self.updates: list[tuple[str, Value]] = []
        self._numbering: dict[tuple, Value] = {}
        self._counter = 0

    def add_input(self, d: InputDef) -> Value:
        self.inputs.append(d)
        return d.value

    def add_param(self, d: ParamDef) -> Value:
        self.params.append(d)
        return d.value

    def infer(self, op: str, inputs: tuple[Value, ...], **attrs: Any) -> TensorType:
        """The output type of `op` on `inputs`; raises ShapeError with the rule's message."""
        opdef = lookup(op)
        if opdef.arity is not None and len(inputs) != opdef.arity:
            raise ShapeError(f"{op} takes {opdef.arity} inputs, got {len(inputs)}")
        return opdef.shape(tuple(v.type for v in inputs), attrs)

    def emit(self, op: str, *inputs: Value, span: Span | None = None, layer: str = "", **attrs: Any) -> Value:
        """Append `out = op(inputs){attrs}` (or return the value an identical earlier statement made)."""
        frozen = make_attrs(**attrs)
        key = (op, tuple(v.name for v in inputs), frozen)
        if key in self._numbering:
            return self._numbering[key]
        out_type = self.infer(op, inputs, **attrs)
        self._counter += 1
        out = Value(str(self._counter), out_type)
        self.stmts.append(Stmt(out, op, tuple(inputs), frozen, span, layer))
        self._numbering[key] = out
        return out

    def output(self, name: str, value: Value) -> None:
        self.outputs.append((name, value))

    def update(self, name: str, value: Value) -> None:
        self.updates.append((name, value))

    def build(self) -> Graph:
        return Graph(
            self.name, tuple(self.inputs), tuple(self.params), tuple(self.stmts), tuple(self.outputs),
            tuple(self.updates),
        )  # fmt: skip
