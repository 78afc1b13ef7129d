"""The sizes the front end refuses, so that a loop run away, or a program too large for the backends, is an error at
its source: evaluation steps, statements, integers, and the elements of one tensor (with that error's diagnostic).
"""

from __future__ import annotations

from typing import Any

from deepdsl.errors import DslError, DslShapeError, Note, Span
from deepdsl.ir import Graph, TensorType
from deepdsl.ir.types import INT_MAX, MAX_ELEMENTS

MAX_STEPS = 2_000_000  # evaluation steps before we call a program too large to unroll
INT_LIMIT = 2**62
# statements of the forward program: ResNet-50 has 177, a residual MLP of 1,000 blocks 3,999; every later stage
# (autodiff, the passes, the memory plan) takes seconds per thousand, so a loop run away is refused here
MAX_STATEMENTS = 10_000


def too_many(what: str, t: TensorType, span: Span | None, notes: list[Note] | None = None) -> DslShapeError:
    """The error of a tensor with more than MAX_ELEMENTS elements (ir/types.py: the generated CUDA kernels index
    with 32-bit integers in grid-stride loops that step by up to 2^24, and Java arrays hold at most 2^31 - 1)."""
    return DslShapeError(
        f"{what} {t} has {t.numel:,} elements; at most {MAX_ELEMENTS:,} (2^31 - 2^24) fit the backends' 32-bit "
        "indices", span, notes=notes or (), hint="a smaller batch (--set N=...) or smaller layers",
    )  # fmt: skip


def too_many_elements(g: Graph) -> list[DslError]:
    """A diagnostic for the first input, parameter or value with more than MAX_ELEMENTS elements (each is refused
    where it is made; this is the last word on the graph as built)."""
    found: list[tuple[str, TensorType, Span | None]] = [(d.value.name, d.value.type, d.span) for d in g.inputs]
    found += [(p.value.name, p.value.type, p.span) for p in g.params]
    found += [(f"the result of {s.op}", s.out.type, s.span) for s in g.stmts]
    return [too_many(what, t, span) for what, t, span in found if t.numel > MAX_ELEMENTS][:1]


def too_large(value: Any) -> bool:
    """Whether an attribute holds an integer (or a tuple of them) above INT_MAX in magnitude."""
    if isinstance(value, tuple):
        return any(too_large(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_MAX
