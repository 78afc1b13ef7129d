"""Dense layers: y = x W^T (the weight keeps PyTorch's [out, in] layout), and the bias add."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.registry import defop
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import need_float, need_rank


@defop("linear", 2)
def linear(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """x [N, D] times W [O, D] transposed -> [N, O]."""
    x, w = types
    need_float(x, "full")
    need_rank(x, (2,), "full", " (use `flatten` first to turn [N, C, H, W] into [N, C*H*W])")
    if w.rank != 2 or w.shape[1] != x.shape[1]:
        raise ShapeError(f"full: weight {w} does not fit input {x}")
    return TensorType((x.shape[0], w.shape[0]))


@defop("bias_add", 2, elementwise=True)
def bias_add(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """x + b broadcast along axis 1 (channels or features)."""
    x, b = types
    if x.rank < 2 or b.shape != (x.shape[1],):
        raise ShapeError(f"bias {b} does not fit {x} along axis 1")
    return x
