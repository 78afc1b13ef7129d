"""The generic op of tensor functions: out[idx] = body, a scalar index expression over its inputs."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.indexexpr import reads
from deepdsl.ir.registry import defop
from deepdsl.ir.types import ShapeError, TensorType


@defop("indexed", None)
def indexed(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """attrs: out ((index, size), ...) and body (an IE). Each read must match its input's rank."""
    for r in reads(attrs["body"]):
        if r.input >= len(types):
            raise ShapeError(f"indexed body reads input {r.input}, only {len(types)} given")
        if len(r.index) != types[r.input].rank:
            raise ShapeError(f"indexed body reads {types[r.input]} with {len(r.index)} indices")
    return TensorType(tuple(size for _, size in attrs["out"]))
