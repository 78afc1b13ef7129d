"""What expressions evaluate to during elaboration, and the scopes that name parameters.

Compile-time values are plain Python ints, floats, bools and strings, tuples of them, and the frozen
classes below: tensors (an IR value plus where it came from), functions (built-in layers, partial
applications, compositions, defs, tensor functions, shared layer instances), and specs (`he()`,
`mnist("dir")`, `sgd(...)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepdsl.errors import Span
from deepdsl.frontend import ast
from deepdsl.ir.graph import Value


class Env:
    """Names in scope: a block's or a def's own values, then the enclosing ones."""

    def __init__(self, values: dict[str, Any], parent: Env | None = None):
        self.values = values
        self.parent = parent

    def lookup(self, name: str) -> Any:
        env: Env | None = self
        while env is not None:
            if name in env.values:
                return env.values[name]
            env = env.parent
        raise KeyError(name)

    def names(self) -> set[str]:
        out: set[str] = set()
        env: Env | None = self
        while env is not None:
            out |= set(env.values)
            env = env.parent
        return out


@dataclass(frozen=True)
class TensorVal:
    value: Value
    origin: str  # "conv 'cv1'", "input 'x'": which layer produced it, for shape errors
    span: Span | None = None
    classes: int | None = None  # for labels

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.type.shape


@dataclass(frozen=True)
class Spec:
    """A call that describes rather than computes: initialisers, data sources, optimizers."""

    family: str  # "init", "data", "optimizer"
    name: str
    args: tuple[tuple[str, Any], ...]

    def arg(self, key: str) -> Any:
        return dict(self.args)[key]


@dataclass(frozen=True)
class Function:
    """Base of every callable value."""


@dataclass(frozen=True)
class BuiltinFn(Function):
    name: str


@dataclass(frozen=True)
class Partial(Function):
    """A function with its non-input arguments bound: `conv(20, kernel=5)`, `bottleneck(64, 256)`."""

    fn: Function
    args: tuple[tuple[str, Any], ...]
    span: Span


@dataclass(frozen=True)
class Composed(Function):
    outer: Function
    inner: Function


@dataclass(frozen=True)
class DefFn(Function):
    node: ast.Def


@dataclass(frozen=True)
class TensorFn(Function):
    node: ast.TensorDef


@dataclass(frozen=True)
class LayerInstance(Function):
    """A function bound to a name: its parameters are made at the first application and then shared."""

    fn: Function
    path: str
    span: Span


def describe(v: Any) -> str:
    """A short phrase naming the kind of a value, for error messages."""
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, tuple):
        return "a tuple"
    if isinstance(v, TensorVal):
        return f"a tensor {v.value.type}"
    if isinstance(v, Spec):
        return f"{v.name}(...)"
    if isinstance(v, Function):
        return "a function"
    return type(v).__name__


@dataclass
class Scope:
    """A naming scope: parameters made here are `path.NAME`; calls get `NAME<k>` ordinals per name."""

    path: str
    owner: LayerInstance | None = None
    application: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    applied_at: Span | None = None  # where the layer instance that owns this scope is applied

    def child_path(self, base: str, explicit: str | None = None) -> str:
        if explicit is None:
            self.counters[base] = self.counters.get(base, 0) + 1
            # a name ending in a digit takes its ordinal after `_`: dwconv3_1, not dwconv31
            explicit = f"{base}{'_' if base[-1:].isdigit() else ''}{self.counters[base]}"
        return f"{self.path}.{explicit}" if self.path else explicit
