"""Normalisation: batch norm (per channel / feature) and local response normalisation."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.registry import defop
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import need_float, need_rank


@defop("batch_norm", None)
def batch_norm(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Inputs x, running_mean, running_var, then gamma, beta when affine. attrs: eps, momentum, affine."""
    x, *rest = types
    need_float(x, "batch_norm")
    need_rank(x, (2, 4), "batch_norm")
    want = 4 if attrs["affine"] else 2
    if len(rest) != want:
        raise ShapeError(f"batch_norm takes {want + 1} inputs, got {len(types)}")
    for t in rest:
        if t.shape != (x.shape[1],):
            raise ShapeError(f"batch_norm: per-channel tensor {t} does not fit {x}")
    return x


@defop("lrn", 1)
def lrn(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Across channels: x / (k + alpha/size * sum x^2)^beta. attrs: size, alpha, beta, k."""
    (x,) = types
    need_rank(x, (4,), "lrn", " ([N, C, H, W])")
    if attrs["size"] < 1:
        raise ShapeError(f"lrn: size must be at least 1, got {attrs['size']}")
    return x
