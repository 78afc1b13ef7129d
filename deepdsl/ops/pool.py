"""Pooling over NCHW windows (floor mode; avg_pool counts padding in the divisor), and its gradients.

The NumPy kernels visit the kh*kw window offsets in row-major order, each as one strided slice of the
padded input, so they cost kh*kw passes over the output and never build the windows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.registry import (
    defop,
    eager_saves,
    flops_rule,
    java_call,
    numpy_kernel,
    storage,
    vendor_rule,
    vjp_rule,
)
from deepdsl.ir.types import INT_MAX, ShapeError, TensorType
from deepdsl.ir.vendor import Pool, PoolBackward
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_float, need_rank, window_out


def _pool(what: str):  # noqa: ANN202
    def rule(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
        (x,) = types
        need_float(x, what)
        need_rank(x, (4,), what, " ([N, C, H, W])")
        (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
        if ph * 2 > kh or pw * 2 > kw:
            raise ShapeError(f"{what}: padding {max(ph, pw)} is more than half the window {max(kh, kw)}")
        if kh * kw > INT_MAX:  # the programs count a window's elements (avg_pool's divisor) in an int
            raise ShapeError(f"{what}: a window of {kh} x {kw} holds {kh * kw:,} elements; at most {INT_MAX:,} "
                             "(2^31 - 1)")  # fmt: skip
        n, c, h, w = x.shape
        return TensorType((n, c, window_out(h, kh, sh, ph, what), window_out(w, kw, sw, pw, what)))

    rule.__doc__ = f"{what}: attrs kernel (kh, kw), stride (sh, sw), pad (ph, pw)."
    return rule


_max_pool = defop("max_pool2d", 1)(_pool("max_pool"))
_avg_pool = defop("avg_pool2d", 1)(_pool("avg_pool"))


@defop("global_avg_pool", 1)
def global_avg_pool(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """[N, C, H, W] -> [N, C, 1, 1]."""
    (x,) = types
    need_rank(x, (4,), "global_avg_pool", " ([N, C, H, W])")
    return TensorType((x.shape[0], x.shape[1], 1, 1))


@defop("max_pool2d_backward", 3, differentiable=False)
def max_pool2d_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d max_pool2d / d x: inputs x, y (the pooled output), g (d y); each g goes to the first maximum of its
    window in row-major order, overlapping windows add up. attrs as max_pool2d."""
    x, y, g = types
    if _max_pool((x,), attrs).shape != y.shape or y.shape != g.shape:
        raise ShapeError(f"max_pool2d_backward: output {y} and gradient {g} do not fit input {x}")
    return x


@defop("avg_pool2d_backward", 1, differentiable=False)
def avg_pool2d_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d avg_pool2d / d x: input g (d out); attrs as avg_pool2d and in_shape (the shape of x)."""
    (g,) = types
    x = TensorType(tuple(attrs["in_shape"]))
    if _avg_pool((x,), attrs).shape != g.shape:
        raise ShapeError(f"avg_pool2d_backward: gradient {g} does not fit input {x}")
    return x


@defop("global_avg_pool_backward", 1, differentiable=False)
def global_avg_pool_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d global_avg_pool / d x: g [N, C, 1, 1] spread evenly over attrs in_shape [N, C, H, W]."""
    (g,) = types
    x = TensorType(tuple(attrs["in_shape"]))
    if global_avg_pool((x,), attrs).shape != g.shape:
        raise ShapeError(f"global_avg_pool_backward: gradient {g} does not fit input {x}")
    return x


# ---- NumPy kernels ----


def _padded(x: np.ndarray, ph: int, pw: int, fill: float) -> np.ndarray:
    if not (ph or pw):
        return x
    n, c, h, w = x.shape
    out = np.full((n, c, h + 2 * ph, w + 2 * pw), fill, dtype=x.dtype)
    out[:, :, ph : ph + h, pw : pw + w] = x
    return out


def _offsets(a: dict, oh: int, ow: int):  # noqa: ANN202
    """The window offsets in row-major order, each as the index of its strided slice of the padded input."""
    (kh, kw), (sh, sw) = a["kernel"], a["stride"]
    for i in range(kh):
        for j in range(kw):
            yield (slice(None), slice(None), slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw))


def _out_hw(shape: tuple[int, ...], a: dict) -> tuple[int, int]:
    (kh, kw), (sh, sw), (ph, pw) = a["kernel"], a["stride"], a["pad"]
    return window_out(shape[2], kh, sh, ph, "pool"), window_out(shape[3], kw, sw, pw, "pool")


def _crop(xp: np.ndarray, shape: tuple[int, ...], a: dict) -> np.ndarray:
    ph, pw = a["pad"]
    return xp[:, :, ph : ph + shape[2], pw : pw + shape[3]]


@numpy_kernel("max_pool2d")
def _max_pool_np(xs: tuple, a: dict) -> np.ndarray:
    (x,) = xs
    oh, ow = _out_hw(x.shape, a)
    xp = _padded(x, *a["pad"], fill=-np.inf)
    y = None
    for at in _offsets(a, oh, ow):
        y = xp[at].copy() if y is None else np.maximum(y, xp[at], out=y)
    return y


@numpy_kernel("max_pool2d_backward")
def _max_pool_backward_np(xs: tuple, a: dict) -> np.ndarray:
    x, y, g = xs
    oh, ow = y.shape[2:]
    xp = _padded(x, *a["pad"], fill=np.nan)  # padding never equals a maximum, so it never takes the gradient
    dxp = np.zeros(xp.shape, dtype=g.dtype)
    free = np.ones(y.shape, dtype=bool)  # windows whose (first) maximum is still to be found
    hit = np.empty(y.shape, dtype=bool)
    zero = g.dtype.type(0)
    for at in _offsets(a, oh, ow):
        np.equal(xp[at], y, out=hit)
        hit &= free
        free ^= hit
        dxp[at] += np.where(hit, g, zero)
    return np.ascontiguousarray(_crop(dxp, x.shape, a))


@numpy_kernel("avg_pool2d")
def _avg_pool_np(xs: tuple, a: dict) -> np.ndarray:
    (x,) = xs
    oh, ow = _out_hw(x.shape, a)
    xp = _padded(x, *a["pad"], fill=0.0)
    y = np.zeros((x.shape[0], x.shape[1], oh, ow), dtype=x.dtype)
    for at in _offsets(a, oh, ow):
        y += xp[at]
    kh, kw = a["kernel"]
    return y / x.dtype.type(kh * kw)


@numpy_kernel("avg_pool2d_backward")
def _avg_pool_backward_np(xs: tuple, a: dict) -> np.ndarray:
    (g,) = xs
    n, c, h, w = a["in_shape"]
    (kh, kw), (ph, pw) = a["kernel"], a["pad"]
    share = g / g.dtype.type(kh * kw)
    dxp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=g.dtype)
    for at in _offsets(a, *g.shape[2:]):
        dxp[at] += share
    return np.ascontiguousarray(_crop(dxp, (n, c, h, w), a))


numpy_kernel("global_avg_pool")(lambda xs, a: np.mean(xs[0], axis=(2, 3), keepdims=True))


@numpy_kernel("global_avg_pool_backward")
def _global_avg_pool_backward_np(xs: tuple, a: dict) -> np.ndarray:
    (g,) = xs
    n, c, h, w = a["in_shape"]
    return np.broadcast_to(g / g.dtype.type(h * w), (n, c, h, w)).copy()


@flops_rule("max_pool2d", "avg_pool2d")
def _pool_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    kh, kw = a["kernel"]
    return out.numel * kh * kw


@flops_rule("max_pool2d_backward", "avg_pool2d_backward")
def _pool_backward_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    kh, kw = a["kernel"]
    per = 3 if len(types) == 3 else 1  # max: compare, mask and add per window element
    return types[-1].numel * kh * kw * per


@flops_rule("global_avg_pool", "global_avg_pool_backward")
def _global_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return max(types[0].numel, out.numel)


# ---- cuDNN's pooling calls (ir/vendor.py): the same windows, floor mode, padding as above ----


def _pool_fact(mode: str, x: tuple[int, ...], y: tuple[int, ...], a: dict) -> Pool:
    n, c, h, w = x
    return Pool(mode, n, c, h, w, y[2], y[3], tuple(a["kernel"]), tuple(a["stride"]), tuple(a["pad"]))


vendor_rule("max_pool2d")(lambda types, out, a: _pool_fact("max", types[0].shape, out.shape, a))
vendor_rule("avg_pool2d")(lambda types, out, a: _pool_fact("avg", types[0].shape, out.shape, a))
vendor_rule("max_pool2d_backward")(lambda types, out, a: PoolBackward(_pool_fact("max", out.shape, types[2].shape, a)))
vendor_rule("avg_pool2d_backward")(lambda types, out, a: PoolBackward(_pool_fact("avg", out.shape, types[0].shape, a)))


# ---- gradients ----


@vjp_rule("max_pool2d")
def _max_pool_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "max_pool2d_backward", s.inputs[0], s.out, g, **s.a),)


@vjp_rule("avg_pool2d")
def _avg_pool_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "avg_pool2d_backward", g, in_shape=s.inputs[0].type.shape, **s.a),)


@vjp_rule("global_avg_pool")
def _global_avg_pool_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "global_avg_pool_backward", g, in_shape=s.inputs[0].type.shape),)


# what eager autograd keeps: the input, and for max pooling the int64 index of each output's maximum
eager_saves("max_pool2d", which=(0,), extra=lambda types, out, a: out.numel * 8)
eager_saves("avg_pool2d", "global_avg_pool", which=(0,))


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("max_pool2d", "Buf x, int[] kernel, int[] pad, int[] stride", cls="CpuPooling")
java_call("max_pool2d_backward", "Buf x, Buf y, Buf g, int[] kernel, int[] pad, int[] stride", cls="CpuPooling")
# a step calls the device's avgPool2d although the op has a CUDA form: cuDNN's on the CUDA device
java_call("avg_pool2d", "Buf x, int[] kernel, int[] pad, int[] stride", cls="CpuPooling", called=True)
java_call("avg_pool2d_backward", "Buf g, int[] inShape, int[] kernel, int[] pad, int[] stride", cls="CpuPooling")
java_call("global_avg_pool", "Buf x", cls="CpuPooling")
java_call("global_avg_pool_backward", "Buf g, int[] inShape", cls="CpuPooling")

# --precision bf16: a window's max or mean of bf16 values, stored bf16 (computed in fp32)
storage("bf16_out", "max_pool2d", "avg_pool2d", "max_pool2d_backward", "avg_pool2d_backward")
