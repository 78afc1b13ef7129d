"""The op registry: one `OpDef` per op holds everything the op means.

Issue 2 fills in the shape rules; gradients, costs and kernels join the same entries later, so that
adding an op is adding one entry, never editing the backends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepdsl.errors import did_you_mean
from deepdsl.ir.types import TensorType

ShapeRule = Callable[[tuple[TensorType, ...], dict[str, Any]], TensorType]


@dataclass(frozen=True)
class OpDef:
    name: str
    shape: ShapeRule
    arity: int | None  # number of inputs, None for variadic (concat, indexed)
    doc: str = ""
    elementwise: bool = False
    view: bool = False  # the output aliases its input (flatten/reshape): no kernel, no copy


REGISTRY: dict[str, OpDef] = {}


def defop(
    name: str, arity: int | None = 1, *, doc: str = "", elementwise: bool = False, view: bool = False
) -> Callable[[ShapeRule], ShapeRule]:
    """Register `fn` as the shape rule of op `name`; `doc` (else the rule's docstring) describes the op."""

    def register(fn: ShapeRule) -> ShapeRule:
        assert name not in REGISTRY, f"op {name} registered twice"
        REGISTRY[name] = OpDef(name, fn, arity, doc or (fn.__doc__ or "").strip(), elementwise, view)
        return fn

    return register


def lookup(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        hint = did_you_mean(name, REGISTRY)
        raise KeyError(f"no op named {name!r}" + (f"; {hint}" if hint else "")) from None
