"""Shape ops: reshape (flatten is a view of it) and concat."""

from __future__ import annotations

import math
from typing import Any

from deepdsl.ir.registry import defop
from deepdsl.ir.types import ShapeError, TensorType


@defop("reshape", 1, view=True)
def reshape(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """A view with the same elements in another shape. attrs: shape."""
    (x,) = types
    shape = tuple(attrs["shape"])
    if math.prod(shape) != x.numel:
        raise ShapeError(f"cannot reshape {x} to [{', '.join(map(str, shape))}]")
    return TensorType(shape, x.dtype)


@defop("concat", None)
def concat(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Join along attrs["axis"]; every other dimension must agree."""
    axis = attrs["axis"]
    first = types[0]
    if not 0 <= axis < first.rank:
        raise ShapeError(f"concat: axis {axis} is out of range for {first}")
    for t in types[1:]:
        if t.rank != first.rank:
            raise ShapeError(f"concat: {first} and {t} differ in rank")
        for i, (a, b) in enumerate(zip(first.shape, t.shape)):
            if i != axis and a != b:
                raise ShapeError(f"concat along axis {axis}: {first} and {t} differ in axis {i} ({a} vs {b})")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(tuple(shape), first.dtype)
