"""Tensor types: a static shape and an element type. Frozen and hashable."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

# What the generated programs can index (docs/language.md, "Limits"): Java arrays hold at most 2^31 - 1 elements and
# index with ints; the CUDA kernels index with 32-bit ints in grid-stride loops stepping by up to 2^24 (65536 blocks
# of 256 threads). Every size, stride, window, pad and group count is an int of the Java program.
INT_MAX = 2**31 - 1  # the largest integer attribute (a stride, window, pad, LRN size, group count, axis)
MAX_ELEMENTS = 2**31 - 2**24  # the most elements of one tensor


# the training precisions (`precision = ...` of the train block, `--precision`): fp32 everywhere; tf32: fp32 storage,
# the vendor GEMMs and convolutions in TF32 tensor-op math; bf16: mixed precision, the values the ops' registry facts
# allow stored as bfloat16 (passes/precision.py), fp32 master weights, optimiser state, statistics and losses
PRECISIONS = ("fp32", "tf32", "bf16")


class DType(Enum):
    F32 = "f32"
    I64 = "i64"
    BF16 = "bf16"  # bfloat16: the top 16 bits of a float32 (8 exponent bits, 7 stored mantissa bits)

    @property
    def nbytes(self) -> int:
        return {DType.F32: 4, DType.I64: 8, DType.BF16: 2}[self]

    @property
    def floating(self) -> bool:
        return self is not DType.I64


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType = DType.F32

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.nbytes

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"


def computed(t: TensorType) -> TensorType:
    """The type an op computes `t` in: a bf16 value (mixed precision, passes/precision.py) is read and written as
    float32 by every kernel and only stored as bf16."""
    return TensorType(t.shape, DType.F32) if t.dtype is DType.BF16 else t


def f32(*shape: int) -> TensorType:
    return TensorType(tuple(shape), DType.F32)


class ShapeError(Exception):
    """Raised by an op's shape rule; the builder attaches the source span and the producers."""


def same_shape(a: TensorType, b: TensorType, what: str) -> None:
    if a.shape != b.shape:
        raise ShapeError(f"{what} needs equal shapes, got {a} and {b}")


def positive(shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    if any(d <= 0 for d in shape):
        raise ShapeError(f"{what} gives a shape with a zero or negative dimension: [{', '.join(map(str, shape))}]")
    return shape
