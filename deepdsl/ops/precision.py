"""The cast of mixed precision (passes/precision.py): `cast_bf16` rounds a float32 tensor to bfloat16, round to
nearest even on the bits of its float32 (numpy has no bf16 type); and the bit conversions the NumPy runner stores
bf16 values with (their top 16 bits in a uint16 array)."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.registry import defop, flops_rule, numpy_kernel
from deepdsl.ir.types import DType, ShapeError, TensorType


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to bf16 (nearest, ties to even), as the uint16 of its top bits; a NaN stays a NaN."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, (u >> 16).astype(np.uint16) | np.uint16(0x40), rounded) if nan.any() else rounded


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    """The float32 values of bf16 bits `b` (exact)."""
    return (np.asarray(b, np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 `x` rounded to the nearest bf16, as float32."""
    return from_bf16_bits(bf16_bits(x))


@defop("cast_bf16", 1, differentiable=False)
def cast_bf16(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """A float32 tensor rounded to bfloat16 (round to nearest even): the operand of a bf16 GEMM or convolution."""
    (x,) = types
    if x.dtype is DType.I64:
        raise ShapeError(f"cast_bf16 takes a float tensor, got {x}")
    return TensorType(x.shape, DType.BF16)


@numpy_kernel("cast_bf16")
def _cast(xs: tuple[Any, ...], attrs: dict[str, Any]) -> Any:
    return round_bf16(np.asarray(xs[0], np.float32))


@flops_rule("cast_bf16")
def _flops(types: tuple[TensorType, ...], out: TensorType, attrs: dict[str, Any]) -> int:
    return out.numel
