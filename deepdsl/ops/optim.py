"""Optimizer updates (DESIGN §2.4, PyTorch's convention): element-wise, so they fuse as epilogues."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.indexexpr import IE
from deepdsl.ir.registry import defop, flops_rule, index_form, numpy_kernel, storage
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._index_forms import ap, c, pointwise


def _like_first(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    for t in types[1:]:
        if t.shape not in (types[0].shape, ()):
            raise ShapeError(f"optimizer update: {t} does not fit {types[0]}")
    return types[0]


_OPS = {
    "sgd_plain": (2, "w - lr * (g + weight_decay * w)  (w, g)"),
    "sgd_momentum": (3, "momentum * v + g + weight_decay * w  (v, g, w): the new momentum buffer"),
    "sgd_step": (2, "w - lr * v  (w, v)"),
    "adam_moment": (2, "beta * m + (1 - beta) * g^power  (m, g)"),
    "adam_step": (4, "w - lr * m̂ / (sqrt(v̂) + eps), bias-corrected by the step t  (w, m, v, t)"),
    "scale_by": (2, "x * s for a scalar tensor s  (x, s)"),
    # the same with the learning rate a scalar input of the step (a schedule: it changes every iteration)
    "sgd_plain_scheduled": (3, "w - lr * (g + weight_decay * w)  (w, g, lr)"),
    "sgd_step_scheduled": (3, "w - lr * v  (w, v, lr)"),
    "adam_step_scheduled": (5, "w - lr * m̂ / (sqrt(v̂) + eps), bias-corrected by the step t  (w, m, v, t, lr)"),
    # AdamW, RMSprop, Nesterov SGD (torch.optim.AdamW, RMSprop with centered=False, SGD with nesterov=True)
    "adamw_step": (4, "w·(1 - lr·weight_decay) - lr·m̂ / (sqrt(v̂) + eps)  (w, m, v, t): decoupled decay"),
    "adamw_step_scheduled": (5, "w·(1 - lr·weight_decay) - lr·m̂ / (sqrt(v̂) + eps)  (w, m, v, t, lr)"),
    "rmsprop_square": (3, "alpha·s + (1 - alpha)·(g + weight_decay·w)^2  (s, g, w): the new square average"),
    "rmsprop_plain": (3, "w - lr·(g + weight_decay·w) / (sqrt(s) + eps)  (w, g, s)"),
    "rmsprop_plain_scheduled": (4, "w - lr·(g + weight_decay·w) / (sqrt(s) + eps)  (w, g, s, lr)"),
    "rmsprop_momentum": (4, "momentum·b + (g + weight_decay·w) / (sqrt(s) + eps)  (b, g, w, s): the new buffer"),
    "sgd_nesterov": (3, "w - lr·(g + weight_decay·w + momentum·v)  (w, v, g), v the new momentum buffer"),
    "sgd_nesterov_scheduled": (4, "w - lr·(g + weight_decay·w + momentum·v)  (w, v, g, lr)"),
}
# the ops that compute a parameter's or an optimizer state's new value (all but scale_by, a gradient's clipping):
# passes/multi_tensor.py launches them together
UPDATE_OPS = frozenset(name for name in _OPS if name != "scale_by")
# Every op above that reads a learning rate (its attribute lr, or its input lr) multiplies it by the attribute
# `lr_mult` where the statement has one (the train block's lr_mult): a plain constant, no run-time setting.
OPTIMISER_OPS = frozenset(_OPS)  # every update rule (passes/data_parallel.py finds the gradients they read)
for _name, (_arity, _doc) in _OPS.items():
    defop(_name, _arity, doc=_doc, elementwise=True, differentiable=False, cheap_to_recompute=True)(_like_first)


@defop(
    "clip_scale", 1, doc="min(1, clip / sqrt(total)) for the summed squared gradient norm total", differentiable=False
)
def _clip_scale(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    return TensorType(())


def _f(x: np.ndarray, v: float) -> Any:
    return x.dtype.type(v)


def _lr(a: dict) -> float:
    """The learning-rate attribute times the statement's multiplier."""
    return a["lr"] * a.get("lr_mult", 1.0)


def _rate(x: np.ndarray, lr: np.ndarray, a: dict) -> Any:
    """The learning-rate input (a schedule's) times the statement's multiplier, in x's precision."""
    r = lr.astype(x.dtype)
    return r * _f(x, a["lr_mult"]) if "lr_mult" in a else r


numpy_kernel("sgd_plain")(lambda xs, a: xs[0] - _f(xs[0], _lr(a)) * (xs[1] + _f(xs[0], a["weight_decay"]) * xs[0]))
numpy_kernel("sgd_momentum")(
    lambda xs, a: _f(xs[0], a["momentum"]) * xs[0] + xs[1] + _f(xs[0], a["weight_decay"]) * xs[2]
)
numpy_kernel("sgd_step")(lambda xs, a: xs[0] - _f(xs[0], _lr(a)) * xs[1])
numpy_kernel("adam_moment")(
    lambda xs, a: _f(xs[0], a["beta"]) * xs[0] + _f(xs[0], 1 - a["beta"]) * xs[1] ** int(a["power"])
)
numpy_kernel("scale_by")(lambda xs, a: xs[0] * xs[1])
numpy_kernel("sgd_plain_scheduled")(
    lambda xs, a: xs[0] - _rate(xs[0], xs[2], a) * (xs[1] + _f(xs[0], a["weight_decay"]) * xs[0])
)
numpy_kernel("sgd_step_scheduled")(lambda xs, a: xs[0] - _rate(xs[0], xs[2], a) * xs[1])
numpy_kernel("clip_scale")(lambda xs, a: np.minimum(1.0, a["clip"] / (np.sqrt(xs[0]) + 1e-6)).astype(xs[0].dtype))


@numpy_kernel("adam_step")
def _adam_step(xs: tuple, a: dict) -> np.ndarray:
    w, m, v, t = xs
    t = float(t)
    m_hat = m / (1 - a["beta1"] ** t)
    v_hat = v / (1 - a["beta2"] ** t)
    return (w - _lr(a) * m_hat / (np.sqrt(v_hat) + a["eps"])).astype(w.dtype)


@numpy_kernel("adam_step_scheduled")
def _adam_step_scheduled(xs: tuple, a: dict) -> np.ndarray:
    w, m, v, t, lr = xs
    return _adam_step((w, m, v, t), {**a, "lr": float(lr)})


@numpy_kernel("adamw_step")
def _adamw_step(xs: tuple, a: dict) -> np.ndarray:
    w = xs[0]
    decayed = (w - _lr(a) * a["weight_decay"] * w).astype(w.dtype)
    return _adam_step((decayed, *xs[1:]), a)


@numpy_kernel("adamw_step_scheduled")
def _adamw_step_scheduled(xs: tuple, a: dict) -> np.ndarray:
    w, m, v, t, lr = xs
    return _adamw_step((w, m, v, t), {**a, "lr": float(lr)})


def _decayed_grad(g: np.ndarray, w: np.ndarray, a: dict) -> np.ndarray:
    return g + _f(g, a["weight_decay"]) * w


numpy_kernel("rmsprop_square")(
    lambda xs, a: _f(xs[0], a["alpha"]) * xs[0] + _f(xs[0], 1 - a["alpha"]) * _decayed_grad(xs[1], xs[2], a) ** 2
)
numpy_kernel("rmsprop_plain")(
    lambda xs, a: xs[0] - _f(xs[0], _lr(a)) * _decayed_grad(xs[1], xs[0], a) / (np.sqrt(xs[2]) + _f(xs[0], a["eps"]))
)
numpy_kernel("rmsprop_plain_scheduled")(
    lambda xs, a: (
        xs[0] - _rate(xs[0], xs[3], a) * _decayed_grad(xs[1], xs[0], a) / (np.sqrt(xs[2]) + _f(xs[0], a["eps"]))
    )
)
numpy_kernel("rmsprop_momentum")(
    lambda xs, a: (
        _f(xs[0], a["momentum"]) * xs[0] + _decayed_grad(xs[1], xs[2], a) / (np.sqrt(xs[3]) + _f(xs[0], a["eps"]))
    )
)
numpy_kernel("sgd_nesterov")(
    lambda xs, a: xs[0] - _f(xs[0], _lr(a)) * (_decayed_grad(xs[2], xs[0], a) + _f(xs[0], a["momentum"]) * xs[1])
)
numpy_kernel("sgd_nesterov_scheduled")(
    lambda xs, a: xs[0] - _rate(xs[0], xs[3], a) * (_decayed_grad(xs[2], xs[0], a) + _f(xs[0], a["momentum"]) * xs[1])
)


@flops_rule(*_OPS, "clip_scale")
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 4 * out.numel


def _r(a: dict, lr: IE | None = None) -> IE:
    """The learning rate: the attribute lr or the input `lr`, times the statement's lr_mult where it has one."""
    rate = c(a["lr"]) if lr is None else lr
    return ap("*", rate, c(a["lr_mult"])) if "lr_mult" in a else rate


def _adam_step_form(a: dict, w: IE, m: IE, v: IE, t: IE, lr: IE | None = None) -> IE:
    m_hat = ap("/", m, ap("-", c(1), ap("^", c(a["beta1"]), t)))
    v_hat = ap("/", v, ap("-", c(1), ap("^", c(a["beta2"]), t)))
    return ap("-", w, ap("*", _r(a, lr), ap("/", m_hat, ap("+", ap("sqrt", v_hat), c(a["eps"])))))


def _adamw_step_form(a: dict, w: IE, m: IE, v: IE, t: IE, lr: IE | None = None) -> IE:
    decayed = ap("-", w, ap("*", ap("*", _r(a, lr), c(a["weight_decay"])), w))
    return _adam_step_form(a, decayed, m, v, t, lr)


def _dg(a: dict, g: IE, w: IE) -> IE:
    """g + weight_decay·w (RMSprop's and Nesterov SGD's L2 term, as torch adds it to the gradient)."""
    return ap("+", g, ap("*", c(a["weight_decay"]), w))


def _rms_scaled(a: dict, g: IE, w: IE, s: IE) -> IE:
    return ap("/", _dg(a, g, w), ap("+", ap("sqrt", s), c(a["eps"])))


def _rmsprop_square_form(a: dict, s: IE, g: IE, w: IE) -> IE:
    dg = _dg(a, g, w)
    return ap("+", ap("*", c(a["alpha"]), s), ap("*", c(1 - a["alpha"]), ap("*", dg, dg)))


def _nesterov_form(a: dict, w: IE, v: IE, g: IE, lr: IE | None = None) -> IE:
    return ap("-", w, ap("*", _r(a, lr), ap("+", _dg(a, g, w), ap("*", c(a["momentum"]), v))))


_INDEX_FORMS: dict[str, Any] = {
    "sgd_plain": lambda a, w, g: ap("-", w, ap("*", _r(a), ap("+", g, ap("*", c(a["weight_decay"]), w)))),
    "sgd_momentum": lambda a, v, g, w: ap(
        "+", ap("+", ap("*", c(a["momentum"]), v), g), ap("*", c(a["weight_decay"]), w)
    ),  # fmt: skip
    "sgd_step": lambda a, w, v: ap("-", w, ap("*", _r(a), v)),
    "adam_moment": lambda a, m, g: ap(
        "+", ap("*", c(a["beta"]), m), ap("*", c(1 - a["beta"]), ap("^", g, c(a["power"])))
    ),
    "adam_step": _adam_step_form,
    "sgd_plain_scheduled": lambda a, w, g, lr: ap(
        "-", w, ap("*", _r(a, lr), ap("+", g, ap("*", c(a["weight_decay"]), w)))
    ),  # fmt: skip
    "sgd_step_scheduled": lambda a, w, v, lr: ap("-", w, ap("*", _r(a, lr), v)),
    "adam_step_scheduled": _adam_step_form,
    "adamw_step": _adamw_step_form,
    "adamw_step_scheduled": _adamw_step_form,
    "rmsprop_square": _rmsprop_square_form,
    "rmsprop_plain": lambda a, w, g, s: ap("-", w, ap("*", _r(a), _rms_scaled(a, g, w, s))),
    "rmsprop_plain_scheduled": lambda a, w, g, s, lr: ap("-", w, ap("*", _r(a, lr), _rms_scaled(a, g, w, s))),
    "rmsprop_momentum": lambda a, b, g, w, s: ap("+", ap("*", c(a["momentum"]), b), _rms_scaled(a, g, w, s)),
    "sgd_nesterov": _nesterov_form,
    "sgd_nesterov_scheduled": _nesterov_form,
    "scale_by": lambda a, x, s: ap("*", x, s),
    "clip_scale": lambda a, t: ap("min", c(1), ap("/", c(a["clip"]), ap("+", ap("sqrt", t), c(1e-6)))),
}
for _name, _form in _INDEX_FORMS.items():
    index_form(_name)(pointwise(_form))

# --precision bf16: the optimiser reads fp32 master weights and state (a bf16 gradient widened) and writes fp32
storage("fp32", *_OPS)
