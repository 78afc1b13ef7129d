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


class DType(Enum):
    F32 = "f32"
    I64 = "i64"

    @property
    def nbytes(self) -> int:
        return 4 if self is DType.F32 else 8


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
