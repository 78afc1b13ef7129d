"""Reductions: the sum of everything, per-channel sums and means, and the sum of squares."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from deepdsl.ir.indexexpr import IE, Affine, Read, Reduce
from deepdsl.ir.registry import (
    defop,
    eager_saves,
    flops_rule,
    index_form,
    java_call,
    numpy_kernel,
    vendor_rule,
    vjp_rule,
)
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ir.vendor import ConvBackwardBias
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._index_forms import ap, c, pointwise


def _channel_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(i for i in range(x.ndim) if i != 1)


@defop("sum", 1, doc="the sum of every element: a scalar")
def _sum(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    return TensorType(())


@defop("sum_squares", 1, doc="the sum of the squares of every element: a scalar")
def _sum_squares(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    return TensorType(())


def _per_channel(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    (x,) = types
    if x.rank < 2:
        raise ShapeError(f"a per-channel reduction needs a 2-D or higher input, got {x}")
    return TensorType((x.shape[1],))


defop("channel_sum", 1, doc="sum over every axis but 1: [N, C, ...] -> [C]")(_per_channel)
defop("channel_mean", 1, doc="mean over every axis but 1: [N, C, ...] -> [C]")(_per_channel)


@defop("channel_var", 2, doc="biased variance over every axis but 1 of x, given its channel mean m: (x, m) -> [C]")
def _channel_var(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    x, m = types
    if m.shape != _per_channel((x,), a).shape:
        raise ShapeError(f"channel_var: mean {m} does not fit {x}")
    return m


@defop(
    "broadcast_channel", 1, doc="[C] -> attrs shape, repeating each channel value over every other axis",
    inline_into_readers=True,
)  # fmt: skip
def _broadcast_channel(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    return TensorType(tuple(a["shape"]))


def _bc(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape((1, -1) + (1,) * (ndim - 2))


numpy_kernel("sum")(lambda xs, a: np.sum(xs[0]))
numpy_kernel("sum_squares")(lambda xs, a: np.sum(xs[0] * xs[0]))
numpy_kernel("channel_sum")(lambda xs, a: np.sum(xs[0], axis=_channel_axes(xs[0])))
numpy_kernel("channel_mean")(lambda xs, a: np.mean(xs[0], axis=_channel_axes(xs[0])))
numpy_kernel("channel_var")(lambda xs, a: np.mean(np.square(xs[0] - _bc(xs[1], xs[0].ndim)), axis=_channel_axes(xs[0])))
numpy_kernel("broadcast_channel")(lambda xs, a: np.broadcast_to(_bc(xs[0], len(a["shape"])), a["shape"]).copy())


@flops_rule("sum", "sum_squares", "channel_sum", "channel_mean", "channel_var")
def _reduce_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return types[0].numel * (3 if len(types) == 2 else 1)


@flops_rule("broadcast_channel")
def _bc_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return out.numel


@vjp_rule("sum")
def _sum_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    return (_e(b, s, "broadcast_scalar", g, shape=x.type.shape),)


@vjp_rule("sum_squares")
def _sum_squares_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    return (_e(b, s, "mul", _e(b, s, "broadcast_scalar", g, shape=x.type.shape), _e(b, s, "mul_scalar", x, value=2.0)),)


@vjp_rule("channel_sum")
def _channel_sum_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "broadcast_channel", g, shape=s.inputs[0].type.shape),)


@vjp_rule("channel_mean")
def _channel_mean_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    per = x.type.numel // x.type.shape[1]
    return (_e(b, s, "broadcast_channel", _e(b, s, "mul_scalar", g, value=1.0 / per), shape=x.type.shape),)


@vjp_rule("channel_var")
def _channel_var_vjp(b: Any, s: Any, g: Any) -> tuple:
    # var = mean((x - m)^2): d/dx = 2 (x - m) / per · g;  d/dm = -2 mean(x - m) · g (zero when m is the mean,
    # but kept exact so the rule holds for any m)
    x, m = s.inputs
    per = x.type.numel // x.type.shape[1]
    centred = _e(b, s, "sub", x, _e(b, s, "broadcast_channel", m, shape=x.type.shape))
    gx = _e(b, s, "mul", centred, _e(b, s, "broadcast_channel", _e(b, s, "mul_scalar", g, value=2.0 / per),
                                     shape=x.type.shape))  # fmt: skip
    gm = _e(b, s, "mul", _e(b, s, "mul_scalar", _e(b, s, "channel_mean", centred), value=-2.0), g)
    return (gx, gm)


@defop("broadcast_scalar", 1, doc="a scalar repeated to attrs shape", inline_into_readers=True)
def _broadcast_scalar(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    if types[0].shape != ():
        raise ShapeError(f"broadcast_scalar takes a scalar, got {types[0]}")
    return TensorType(tuple(a["shape"]))


numpy_kernel("broadcast_scalar")(lambda xs, a: np.full(a["shape"], xs[0], dtype=xs[0].dtype))
flops_rule("broadcast_scalar")(_bc_flops)


@vjp_rule("broadcast_scalar")
def _broadcast_scalar_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "sum", g),)


@vjp_rule("broadcast_channel")
def _broadcast_channel_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "channel_sum", g),)


# ---- index forms: a reduction over every axis but 1 (channel_*) or over every axis (sum*) ----


def _reduce_form(kind: str) -> Any:
    def form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> IE:
        x = types[0]
        per_channel = out.rank == 1
        vars_ = tuple((f"r{k}", n) for k, n in enumerate(x.shape) if not (per_channel and k == 1))
        index = tuple(Affine.var("i0") if per_channel and k == 1 else Affine.var(f"r{k}") for k in range(x.rank))
        value: IE = Read(0, index)
        if kind == "var":
            value = ap("-", value, Read(1, (Affine.var("i0"),)))
        if kind in ("var", "squares"):
            value = ap("*", value, value)
        body: IE = Reduce("sum", vars_, value)
        if kind in ("mean", "var"):
            body = ap("/", body, c(x.numel // (x.shape[1] if per_channel else 1)))
        return body

    return form


index_form("sum", "channel_sum")(_reduce_form("sum"))


@vendor_rule("channel_sum")
def _channel_sum_vendor(types: tuple[TensorType, ...], out: TensorType, a: dict) -> ConvBackwardBias:
    """cuDNN's bias gradient (a conv's or a linear layer's): [N, C, ...] with the trailing axes as H and W."""
    n, ch, *rest = types[0].shape
    return ConvBackwardBias(n, ch, rest[0] if rest else 1, math.prod(rest[1:]))


index_form("sum_squares")(_reduce_form("squares"))
index_form("channel_mean")(_reduce_form("mean"))
index_form("channel_var")(_reduce_form("var"))
index_form("broadcast_channel", "broadcast_scalar")(pointwise(lambda a, x: x))


@defop("sum_axes", 1)  # its gradient: ops/axes.py
def _sum_axes(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    """The sum over attrs axes; the other axes stay, in order."""
    (x,) = types
    axes = tuple(a["axes"])
    if any(not 0 <= k < x.rank for k in axes) or len(set(axes)) != len(axes):
        raise ShapeError(f"sum_axes: axes {axes} do not fit {x}")
    return TensorType(tuple(n for k, n in enumerate(x.shape) if k not in axes))


numpy_kernel("sum_axes")(lambda xs, a: np.sum(xs[0], axis=tuple(a["axes"])))
flops_rule("sum_axes")(lambda types, out, a: types[0].numel)


eager_saves("sum_squares", which=(0,))  # what eager autograd keeps


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("sum_axes", "Buf x, int[] axes", cls="CpuShapes")
