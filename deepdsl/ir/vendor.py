"""Vendor routines: what one call of a vendor library (cuBLAS, cuDNN) computes, as data.

An op's registry entry may say which routine serves one of its statements (`vendor_rule`): a function of the
statement's input types, output type and attributes that returns one of these descriptions. A backend that has the
library interprets the description (backends/cuda/vendor.py calls cuBLAS for a `Gemm`); one that has not runs the
op's own kernel. The description is all a backend needs, so no backend keeps a table of op names.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdsl.ir.graph import Stmt
from deepdsl.ir.registry import REGISTRY


@dataclass(frozen=True)
class Gemm:
    """C[b] = op(A[b]) @ op(B[b]) for b < batch, in float32, every matrix row-major and contiguous: A is [M, K]
    ([K, M] when transpose_a), B is [K, N] ([N, K] when transpose_b), C is [M, N], the batches one after another.
    A BLAS SGEMM (strided-batched when batch > 1); the statement's inputs are A and B, its output C."""

    batch: int
    m: int
    n: int
    k: int
    transpose_a: bool
    transpose_b: bool


@dataclass(frozen=True)
class ConvForward:
    """Y = conv(X, W), float32, NCHW, a cross-correlation: X [n, c, h, w], W [f, c / groups, kh, kw], Y [n, f, oh,
    ow] with the given stride, zero padding and dilation (the gap between the kernel's taps). cuDNN's convolution
    forward; the statement's inputs are X and W, its output Y, and its planned workspace (memory/plan.py) is the
    routine's scratch."""

    n: int
    c: int
    h: int
    w: int
    f: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    pad: tuple[int, int]
    groups: int
    dilation: tuple[int, int] = (1, 1)


@dataclass(frozen=True)
class ConvBackwardData:
    """dX of the convolution `conv` (the transposed convolution of dY by W): the statement's inputs are dY [n, f, oh,
    ow] and W, its output dX [n, c, h, w]. cuDNN's convolution backward-data, in the statement's planned workspace."""

    conv: ConvForward


@dataclass(frozen=True)
class ConvBackwardFilter:
    """dW of the convolution `conv`: the statement's inputs are X and dY, its output dW [f, c / groups, kh, kw].
    cuDNN's convolution backward-filter, in the statement's planned workspace."""

    conv: ConvForward


@dataclass(frozen=True)
class ConvBackwardBias:
    """db[c] = the sum of dY[:, c] over every other axis: dY [n, c, h, w] float32 NCHW (a [N, C, ...] tensor with its
    trailing axes as h and w), db [c]. cuDNN's convolution backward-bias; the statement's input is dY, its output db."""

    n: int
    c: int
    h: int
    w: int


@dataclass(frozen=True)
class Pool:
    """Y = pool(X), float32, NCHW, over kernel-sized windows with the given stride and padding, floor mode: X [n, c,
    h, w], Y [n, c, oh, ow]. `mode` "max": padding never the maximum, NaN propagates; "avg": the padding counts as
    zeros and every window divides by kh * kw. cuDNN's pooling forward; the statement's input is X, its output Y."""

    mode: str
    n: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]


@dataclass(frozen=True)
class PoolBackward:
    """dX of the pooling `pool`: "max" takes inputs X, Y, dY and sends each dY to the first maximum of its window in
    row-major order (overlapping windows add up); "avg" takes dY alone and spreads it evenly. cuDNN's pooling
    backward; the statement's output is dX."""

    pool: Pool


@dataclass(frozen=True)
class Softmax:
    """Y = softmax (or, with `log`, log_softmax) of each row of X [rows, k], float32, accurately (the row's maximum
    subtracted first). cuDNN's softmax forward over the channels of [rows, k, 1, 1]; the statement's input is X."""

    rows: int
    k: int
    log: bool


@dataclass(frozen=True)
class SoftmaxBackward:
    """dX of the `softmax` whose output is Y: the statement's inputs are Y and dY; dX = Y (dY - sum(dY Y)) per row, or
    for log_softmax dY - exp(Y) sum(dY). cuDNN's softmax backward."""

    softmax: Softmax


@dataclass(frozen=True)
class Lrn:
    """Y = X / (k + alpha / size * the sum of X^2 over channels c - (size - 1) / 2 .. c + (size - 1) / 2)^beta, NCHW
    float32 [n, c, h, w], `size` odd (where cuDNN's window and PyTorch's agree). cuDNN's cross-channel LRN forward
    (whose alpha is divided by the window inside the library, as ours); the statement's input is X."""

    n: int
    c: int
    h: int
    w: int
    size: int
    alpha: float
    beta: float
    k: float


@dataclass(frozen=True)
class LrnBackward:
    """dX of the `lrn`: the statement's inputs are X, Y and dY. cuDNN's cross-channel LRN backward."""

    lrn: Lrn


@dataclass(frozen=True)
class BatchNorm:
    """Y = gamma (X - mean) / sqrt(var + eps) + beta per channel c of X [n, c, h, w] (float32 NCHW; a [N, C, ...]
    tensor with its trailing axes as h and w), the mean and variance given: cuDNN's batch-norm forward in its
    inference form (SPATIAL), which the training program's apply uses too, with the batch's statistics. The
    statement's inputs are X, mean, var, gamma and beta, each per-channel one [c]."""

    n: int
    c: int
    h: int
    w: int
    eps: float


# the descriptions a backend may be asked to interpret
VendorCall = (
    Gemm
    | ConvForward
    | ConvBackwardData
    | ConvBackwardFilter
    | ConvBackwardBias
    | Pool
    | PoolBackward
    | Softmax
    | SoftmaxBackward
    | Lrn
    | LrnBackward
    | BatchNorm
)


def vendor_call(s: Stmt) -> VendorCall | None:
    """The vendor routine that serves statement `s` (its op's `vendor` rule), or None where none does."""
    op = REGISTRY[s.op]
    if op.vendor is None:
        return None
    arity = op.arity if op.arity is not None else len(s.inputs)  # the rest are an epilogue's inputs
    return op.vendor(tuple(v.type for v in s.inputs[:arity]), s.out.type, s.a)
