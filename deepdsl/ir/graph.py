"""The tensor program: an SSA list of statements over typed values, plus inputs, parameters and state.

Everything is frozen and holds tuples; passes build new graphs with `.replace(...)`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from deepdsl.errors import Span
from deepdsl.ir.types import TensorType


@dataclass(frozen=True)
class Value:
    name: str
    type: TensorType

    def __str__(self) -> str:
        return f"%{self.name}"


@dataclass(frozen=True)
class Init:
    """How a parameter or state tensor starts: he(), xavier(), gaussian(std), uniform(a), constant(v)."""

    kind: str
    args: tuple[float, ...] = ()
    fan_in: int = 0
    fan_out: int = 0

    def __str__(self) -> str:
        args = ", ".join(f"{a:g}" for a in self.args)
        fans = f"  fan_in={self.fan_in} fan_out={self.fan_out}" if self.kind in ("he", "xavier") else ""
        return f"{self.kind}({args}){fans}"


@dataclass(frozen=True)
class InputDef:
    value: Value
    # "input" (float data), "label" (int class ids), "step" (the iteration, for dropout masks) or "lr" (the learning
    # rate of a schedule, f32[])
    kind: str
    classes: int | None = None
    span: Span | None = None
    # a label's ignored value (`nll(..., ignore_index=-100)`): the data may hold it besides the ids in [0, classes)
    ignore: int | None = None


@dataclass(frozen=True)
class ParamDef:
    value: Value
    init: Init
    # "param" (trained), "state" (running statistics), "opt" (optimizer state) or "const" (a loop-invariant
    # tensor the optimiser hoisted out of the step: set once by its init, never updated, not in parameter files)
    kind: str = "param"
    layer: str = ""
    span: Span | None = None


Attrs = tuple[tuple[str, Any], ...]


def make_attrs(**kw: Any) -> Attrs:
    return tuple(sorted(kw.items()))


@dataclass(frozen=True)
class Stmt:
    out: Value
    op: str
    inputs: tuple[Value, ...]
    attrs: Attrs = ()
    span: Span | None = None
    layer: str = ""  # the layer path that emitted it (`cv1`, `model.stage1.bottleneck1.conv_bn1.conv1`)

    @cached_property
    def a(self) -> dict[str, Any]:
        return dict(self.attrs)

    def replace(self, **kw: Any) -> Stmt:
        return dataclasses.replace(self, **kw)


@dataclass(frozen=True)
class Graph:
    name: str
    inputs: tuple[InputDef, ...]
    params: tuple[ParamDef, ...]
    stmts: tuple[Stmt, ...]
    outputs: tuple[tuple[str, Value], ...]
    updates: tuple[tuple[str, Value], ...] = ()  # parameter or state name -> its value after the step

    def replace(self, **kw: Any) -> Graph:
        return dataclasses.replace(self, **kw)

    @property
    def trainable(self) -> tuple[ParamDef, ...]:
        return tuple(p for p in self.params if p.kind == "param")

    @property
    def state(self) -> tuple[ParamDef, ...]:
        return tuple(p for p in self.params if p.kind == "state")

    def output(self, name: str) -> Value:
        return dict(self.outputs)[name]

    @property
    def parameter_count(self) -> int:
        return sum(p.value.type.numel for p in self.trainable)

    @property
    def parameter_bytes(self) -> int:
        return sum(p.value.type.nbytes for p in self.trainable)
