"""Batch norm (per channel / feature): the op, its lowering in the train and infer programs, and the statements it
lowers to (the apply, its training form and gradient, the inverse deviation, the running statistics' updates)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from deepdsl.ir.registry import (
    defop,
    eager_saves,
    flops_rule,
    index_form,
    java_call,
    lowering,
    numpy_kernel,
    storage,
    vendor_rule,
    vjp_rule,
)
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ir.vendor import BatchNorm
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_float, need_rank
from deepdsl.ops._index_forms import ap, c, pointwise, read


@defop("batch_norm", None)  # lowered before anything runs: see _lower_batch_norm
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


# ---- batch norm in the train and infer programs ----


@defop("bn_apply", None, cheap_to_recompute=True)  # element-wise after a per-channel broadcast
def bn_apply(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """(x - mean) / sqrt(var + eps) * gamma + beta per channel; inputs x, mean, var[, gamma, beta]."""
    x, *rest = types
    if len(rest) not in (2, 4) or any(t.shape != (x.shape[1],) for t in rest):
        raise ShapeError(f"bn_apply: per-channel inputs {', '.join(map(str, rest))} do not fit {x}")
    return x


@defop("bn_train_apply", 5, cheap_to_recompute=True)  # bn_apply's kernel; its gradient the closed form
def bn_train_apply(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """bn_apply with a scale and shift (inputs x, mean, var, gamma, beta), where mean and var are x's own batch
    statistics (channel_mean, channel_var: what batch_norm's lowering gives it in training), so that its gradient
    is batch norm's whole one: to x through the statistics too (bn_train_backward), none to mean and var."""
    if len(types) != 5:
        raise ShapeError(f"bn_train_apply takes x, mean, var, gamma and beta, got {len(types)} inputs")
    return bn_apply(types, attrs)


@defop("bn_train_backward", 7, differentiable=False)
def bn_train_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d bn_train_apply / d x: inputs x, g (d y), mean, r = 1 / sqrt(var + eps) (bn_invstd), gamma, and the
    scale's and shift's gradients sum(g xh) and sum(g) (the statements the gradient has anyway); per channel, over
    its M = N H W values, gamma r (g - sum(g) / M - xh sum(g xh) / M) with xh = (x - mean) r: one element-wise pass
    (reads x and g, writes dx); attrs: eps.

    No vendor routine serves it, on purpose: cuDNN's batch-norm backward cannot take dgamma and dbeta, so it would
    make a reduction pass over x and g of its own for sums the statements already hold (its dx needs them), and
    write them where nothing reads them: 7 passes of activation traffic per batch norm where ours makes 5 (the
    sums' pass reads x and g; this one reads them again and writes dx). Letting cuDNN's sums be the statements'
    instead (skipping ours) saves no traffic (its backward makes the same two passes), and loses more: the sums
    would be made by another statement's launch, so the plan, `deepdsl ir --stats` and the two CUDA devices would
    differ between --kernels vendor and own; the inverse deviation, computed in our sums' last block, would
    need a launch of its own; cuDNN's summation order is its own (ours is fixed, the same bits every run); and under
    a synchronised batch norm the sums must be the ranks' total, which cuDNN's local ones are not (docs/gpu.md)."""
    x, g, *rest = types
    if g.shape != x.shape or any(t.shape != (x.shape[1],) for t in rest):
        raise ShapeError(f"bn_train_backward: gradient {g} and per-channel inputs do not fit {x}")
    return x


@defop("bn_invstd", 1, differentiable=False)
def bn_invstd(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """1 / sqrt(var + eps) per channel: batch norm's inverse deviation, which its backward reads; attrs: eps."""
    (v,) = types
    if v.rank != 1:
        raise ShapeError(f"bn_invstd takes a per-channel variance, got {v}")
    return v


@defop("running_update", 2, differentiable=False)
def running_update(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """(1 - momentum) * r + momentum * correction * v: a running statistic r after batch statistic v."""
    return types[0]


@lowering("batch_norm")
def _lower_batch_norm(b: Any, s: Any, ctx: Any) -> Any:
    x, rm, rv, *affine = s.inputs
    eps, momentum = s.a["eps"], s.a["momentum"]
    if not ctx.train:
        return _e(b, s, "bn_apply", x, rm, rv, *affine, eps=eps)
    mean = _e(b, s, "channel_mean", x)
    var = _e(b, s, "channel_var", x, mean)
    per = x.type.numel // x.type.shape[1]
    b.update(rm.name, _e(b, s, "running_update", rm, mean, momentum=momentum, correction=1.0))
    b.update(rv.name, _e(b, s, "running_update", rv, var, momentum=momentum, correction=per / max(per - 1, 1)))
    # NOTE: with a scale, the apply whose gradient is batch norm's closed form (one statement for dx, a sum each
    # for the scale and shift); without one, bn_apply, whose gradient reaches x through the statistics' own rules
    return _e(b, s, "bn_train_apply" if affine else "bn_apply", x, mean, var, *affine, eps=eps)


def _bc(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape((1, -1) + (1,) * (ndim - 2))


@numpy_kernel("bn_apply", "bn_train_apply")
def _bn_apply_np(xs: tuple, a: dict) -> np.ndarray:
    x, mean, var, *affine = xs
    scale = 1 / np.sqrt(var + x.dtype.type(a["eps"]))
    if affine:
        scale = scale * affine[0]
    y = (x - _bc(mean, x.ndim)) * _bc(scale, x.ndim)
    return y + _bc(affine[1], x.ndim) if affine else y


numpy_kernel("running_update")(lambda xs, a: (1 - a["momentum"]) * xs[0] + (a["momentum"] * a["correction"]) * xs[1])


numpy_kernel("bn_invstd")(lambda xs, a: 1 / np.sqrt(xs[0] + xs[0].dtype.type(a["eps"])))


@numpy_kernel("bn_train_backward")
def _bn_train_backward_np(xs: tuple, a: dict) -> np.ndarray:
    x, g, mean, invstd, gamma, sum_gxh, sum_g = xs
    per = x.dtype.type(x.size // x.shape[1])
    r = _bc(invstd, x.ndim)
    xh = (x - _bc(mean, x.ndim)) * r
    return _bc(gamma, x.ndim) * r * (g - _bc(sum_g / per, x.ndim) - xh * _bc(sum_gxh / per, x.ndim))


@flops_rule("bn_apply", "bn_train_apply", "running_update", "bn_invstd")
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 4 * out.numel


@flops_rule("bn_train_backward")
def _bn_train_backward_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 6 * out.numel  # centring, scaling, the two terms, the product


@vjp_rule("bn_apply")
def _bn_apply_vjp(b: Any, s: Any, g: Any) -> tuple:
    # y = (x - m) * r * gamma + beta with r = (v + eps)^-1/2
    x, m, v, *affine = s.inputs
    shape = x.type.shape
    r = _e(b, s, "pow_scalar", _e(b, s, "add_scalar", v, value=s.a["eps"]), value=-0.5)
    scale = _e(b, s, "mul", r, affine[0]) if affine else r
    gx = _e(b, s, "mul", g, _e(b, s, "broadcast_channel", scale, shape=shape))
    gm = _e(b, s, "neg", _e(b, s, "channel_sum", gx))
    sum_g_centred = _e(b, s, "channel_sum", _e(b, s, "mul", g, _e(b, s, "sub", x, _e(b, s, "broadcast_channel", m,
                                                                                        shape=shape))))  # fmt: skip
    r3 = _e(b, s, "mul_scalar", _e(b, s, "mul", _e(b, s, "mul", r, r), scale), value=-0.5)  # -1/2 gamma r^3
    gv = _e(b, s, "mul", sum_g_centred, r3)
    if not affine:
        return (gx, gm, gv)
    return (gx, gm, gv, _e(b, s, "mul", sum_g_centred, r), _e(b, s, "channel_sum", g))


def _batch_norm_fact(x: TensorType, a: dict) -> BatchNorm | None:
    """cuDNN's batch norm (SPATIAL) where it computes ours: an eps of at least cuDNN's CUDNN_BN_MIN_EPSILON (1e-5,
    the default); None (our kernel) below it."""
    if a["eps"] < 1e-5:
        return None
    n, c, *rest = x.shape
    return BatchNorm(n, c, rest[0] if rest else 1, math.prod(rest[1:]), a["eps"])


# the forward with a scale and shift (cuDNN's takes them; without, our kernel), in training and inference alike
vendor_rule("bn_apply", "bn_train_apply")(lambda types, out, a: _batch_norm_fact(out, a) if len(types) == 5 else None)
# the training gradient has none: our one pass with the statements' sums (bn_train_backward's docstring says why)


@vjp_rule("bn_train_apply")
def _bn_train_apply_vjp(b: Any, s: Any, g: Any) -> tuple:
    # y = xh gamma + beta with xh = (x - m) r, m and v x's own statistics: dgamma = sum(g xh) (xh recomputed where
    # the sum reads it: emitted before dx, so that fusing it there keeps nothing alive longer), dbeta = sum(g), dx
    # the closed form from those sums (one statement, one pass); none to m and v, whose dependence on x dx holds
    # (the inverse deviation a statement of its own after the sums, computed in their pass's last block on a
    # GPU (ir/reductions.py), which dx reads with the mean: every CUDA path, vendor or own, runs dx as our one pass)
    x, m, v, gamma, _ = s.inputs
    gamma_grad = _e(b, s, "channel_sum", _e(b, s, "mul", g, _e(b, s, "bn_apply", x, m, v, **s.a)))
    beta_grad = _e(b, s, "channel_sum", g)
    invstd = _e(b, s, "bn_invstd", v, **s.a)
    dx = _e(b, s, "bn_train_backward", x, g, m, invstd, gamma, gamma_grad, beta_grad, **s.a)
    return (dx, None, None, gamma_grad, beta_grad)


@index_form("bn_apply", "bn_train_apply")
def _bn_apply_form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> Any:
    x, m, v, *affine = (read(k, t, out) for k, t in enumerate(types))
    y = ap("*", ap("-", x, m), ap("rsqrt", ap("+", v, c(a["eps"]))))
    return ap("+", ap("*", y, affine[0]), affine[1]) if affine else y


index_form("bn_invstd")(pointwise(lambda a, v: ap("rsqrt", ap("+", v, c(a["eps"])))))
index_form("running_update")(
    pointwise(lambda a, r, v: ap("+", ap("*", c(1 - a["momentum"]), r), ap("*", c(a["momentum"] * a["correction"]), v)))
)


# what eager autograd keeps: the input and the batch's mean and inverse deviation per channel
eager_saves("batch_norm", which=(0,), extra=lambda types, out, a: 2 * types[0].shape[1] * 4)


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call(
    "bn_train_backward",
    "Buf x, Buf g, Buf mean, Buf invstd, Buf gamma, Buf gammaGrad, Buf betaGrad, float eps",
    cls="CpuNormalisation",
)
# a step calls the device's bnApply for the training program's apply where it stands alone (cuDNN's on the CUDA
# device); fused into a loop it is part of a generated kernel, as the inference program's bn_apply always is (the
# convolution's epilogue, mostly)
java_call(
    "bn_train_apply",
    "Buf x, Buf mean, Buf var, Buf gamma, Buf beta, float eps",
    cls="CpuNormalisation",
    device="bnApply",
    called=True,
)

# --precision bf16: the running statistics are fp32 state, updated in fp32
storage("fp32", "running_update")
