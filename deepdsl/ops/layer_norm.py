"""Layer norm: PyTorch's nn.LayerNorm over the last axis, lowered to one statement that normalises each row
(`layer_norm_rows`, whose gradient is one statement too), then the scale and the shift."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.registry import defop, eager_saves, flops_rule, java_call, lowering, numpy_kernel, vjp_rule
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_float, need_rank


@defop("layer_norm", 3)  # lowered before anything runs: see _lower_layer_norm
def layer_norm(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Per row of x [R, D]: (x - mean) / sqrt(biased var + eps) * gamma + beta; inputs x, gamma [D], beta [D]."""
    x, gamma, beta = types
    need_float(x, "layer_norm")
    need_rank(x, (2,), "layer_norm", " ([rows, features]; the built-in reshapes to it)")
    if gamma.shape != (x.shape[1],) or beta.shape != (x.shape[1],):
        raise ShapeError(f"layer_norm: scale {gamma} and shift {beta} do not fit rows of {x}")
    return x


@lowering("layer_norm")
def _lower_layer_norm(b: Any, s: Any, ctx: Any) -> Any:
    # NOTE: the rows normalised by one statement (layer_norm_rows, whose gradient is one statement too), then the
    # scale and shift, which fuse with what reads them. Each row's statistics stay inside the two statements, as
    # a row at a time: a pass over the rows forward and one backward, where the statistics as statements of their
    # own (channel_mean, channel_var and bn_apply over [1, R, D]) took four passes forward and ten backward. The
    # same in training and inference (no running state).
    x, gamma, beta = s.inputs
    rows, d = x.type.shape
    h = _e(b, s, "layer_norm_rows", x, eps=s.a["eps"])
    scaled = _e(b, s, "mul", h, _e(b, s, "broadcast_channel", gamma, shape=(rows, d)))
    return _e(b, s, "bias_add", scaled, beta)


@defop("layer_norm_rows", 1, cheap_to_recompute=True)  # a pass over each row of its input, which its gradient keeps
def layer_norm_rows(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Each row of x [R, D] as (x - mean) / sqrt(biased var + eps), its mean and variance over the row; attrs: eps."""
    (x,) = types
    need_float(x, "layer_norm_rows")
    need_rank(x, (2,), "layer_norm_rows", " ([rows, features])")
    return x


@defop("layer_norm_rows_backward", 2, differentiable=False)
def layer_norm_rows_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d layer_norm_rows / d x: inputs x, g (d y); per row r (g - mean(g) - y mean(g y)) with y the row normalised
    and r its 1 / sqrt(var + eps); attrs as layer_norm_rows."""
    x, g = types
    if x.shape != g.shape:
        raise ShapeError(f"layer_norm_rows_backward: gradient {g} does not fit input {x}")
    return layer_norm_rows((x,), attrs)


def _normalised_rows(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Each row of x normalised, and each row's 1 / sqrt(var + eps) (a column)."""
    centred = x - x.mean(axis=1, keepdims=True)
    r = 1 / np.sqrt(np.mean(centred * centred, axis=1, keepdims=True) + x.dtype.type(eps))
    return centred * r, r


numpy_kernel("layer_norm_rows")(lambda xs, a: _normalised_rows(xs[0], a["eps"])[0])


@numpy_kernel("layer_norm_rows_backward")
def _layer_norm_rows_backward_np(xs: tuple, a: dict) -> np.ndarray:
    x, g = xs
    y, r = _normalised_rows(x, a["eps"])
    return r * (g - g.mean(axis=1, keepdims=True) - y * np.mean(g * y, axis=1, keepdims=True))


@flops_rule("layer_norm_rows", "layer_norm_rows_backward")
def _layer_norm_rows_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    # forward: the sum, the centred squares' sum, the scaling; backward: those again, two sums, the result
    return out.numel * (5 if len(types) == 1 else 11)


@vjp_rule("layer_norm_rows")
def _layer_norm_rows_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "layer_norm_rows_backward", s.inputs[0], g, **s.a),)


# layer norm keeps its input and each row's mean and inverse deviation (native_layer_norm)
eager_saves("layer_norm", which=(0,), extra=lambda types, out, a: 2 * types[0].shape[0] * 4)


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("layer_norm_rows", "Buf x, float eps", cls="CpuNormalisation")
java_call("layer_norm_rows_backward", "Buf x, Buf g, float eps", cls="CpuNormalisation")
