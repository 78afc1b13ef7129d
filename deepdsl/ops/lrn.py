"""Local response normalisation across channels (PyTorch's LocalResponseNorm): the op and its gradient."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.registry import defop, eager_saves, flops_rule, java_call, numpy_kernel, vendor_rule, vjp_rule
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ir.vendor import Lrn, LrnBackward
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_rank

# y = x * d^-beta with d = k + alpha/size * S(x^2), S summing the channels c - size//2 .. c + (size-1)//2
# (zero-padded), PyTorch's LocalResponseNorm.


@defop("lrn", 1)
def lrn(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Across channels: x / (k + alpha/size * sum x^2)^beta. attrs: size, alpha, beta, k."""
    (x,) = types
    need_rank(x, (4,), "lrn", " ([N, C, H, W])")
    if attrs["size"] < 1:
        raise ShapeError(f"lrn: size must be at least 1, got {attrs['size']}")
    return x


@defop("lrn_backward", 3, differentiable=False)
def lrn_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d lrn / d x: inputs x, y (the lrn output), g (d y); attrs as lrn."""
    x, y, g = types
    if not x.shape == y.shape == g.shape:
        raise ShapeError(f"lrn_backward: output {y} and gradient {g} do not fit input {x}")
    return lrn((x,), attrs)


def _window_sum(v: np.ndarray, before: int, after: int) -> np.ndarray:
    """out[:, c] = sum of v[:, c - before .. c + after] along axis 1, zero outside the channels."""
    c = v.shape[1]
    out = np.zeros_like(v)
    for o in range(max(-before, 1 - c), min(after, c - 1) + 1):  # offsets past the channels add nothing
        lo, hi = max(0, -o), min(c, c - o)  # out[:, lo:hi] takes v[:, lo + o : hi + o]
        if lo < hi:
            out[:, lo:hi] += v[:, lo + o : hi + o]
    return out


def _lrn_denominator(x: np.ndarray, a: dict) -> np.ndarray:
    size = a["size"]
    t = x.dtype.type
    return t(a["k"]) + t(a["alpha"] / size) * _window_sum(x * x, size // 2, (size - 1) // 2)


@numpy_kernel("lrn")
def _lrn_np(xs: tuple, a: dict) -> np.ndarray:
    (x,) = xs
    return x * np.power(_lrn_denominator(x, a), x.dtype.type(-a["beta"]))


@numpy_kernel("lrn_backward")
def _lrn_backward_np(xs: tuple, a: dict) -> np.ndarray:
    # dx_j = g_j d_j^-beta - 2 alpha beta / size * x_j * sum over the c whose window holds j of g_c y_c / d_c
    x, y, g = xs
    size, t = a["size"], x.dtype.type
    d = _lrn_denominator(x, a)
    back = _window_sum(g * y / d, (size - 1) // 2, size // 2)  # the transposed window
    return g * np.power(d, t(-a["beta"])) - t(2 * a["alpha"] * a["beta"] / size) * x * back


@flops_rule("lrn", "lrn_backward")
def _lrn_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    per = a["size"] + 4  # square, window sum, scale and shift, power, product
    return out.numel * (per if len(types) == 1 else 2 * per + 4)


def _lrn_fact(x: TensorType, a: dict) -> Lrn | None:
    """cuDNN's cross-channel LRN where it computes ours: an odd window (cuDNN looks (size - 1) // 2 channels behind,
    size // 2 ahead; ours size // 2 behind, (size - 1) // 2 ahead) within cuDNN's limits (window 1..16, k >= 1e-5,
    beta >= 0.01); None (our kernel) elsewhere. cuDNN divides alpha by the window inside the library, as we do."""
    size, alpha, beta, k = a["size"], a["alpha"], a["beta"], a["k"]
    if size % 2 == 0 or not 1 <= size <= 16 or k < 1e-5 or beta < 0.01:
        return None
    return Lrn(*x.shape, size, alpha, beta, k)


vendor_rule("lrn")(lambda types, out, a: _lrn_fact(out, a))
vendor_rule("lrn_backward")(lambda types, out, a: None if (f := _lrn_fact(out, a)) is None else LrnBackward(f))


@vjp_rule("lrn")
def _lrn_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "lrn_backward", s.inputs[0], s.out, g, **s.a),)


# what eager autograd keeps (LRN is composite in PyTorch): the input, the squares padded by size - 1 channels, the
# scale and its power
eager_saves(
    "lrn",
    which=(0,),
    extra=lambda types, out, a: 2 * out.nbytes + out.nbytes // out.shape[1] * (out.shape[1] + a["size"] - 1),
)

# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("lrn", "Buf x, float alpha, float beta, float k, int size", cls="CpuNormalisation")
java_call("lrn_backward", "Buf x, Buf y, Buf g, float alpha, float beta, float k, int size", cls="CpuNormalisation")
