"""Optimizer updates (DESIGN §2.4, PyTorch's convention): element-wise, so they fuse as epilogues."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.indexexpr import IE
from deepdsl.ir.registry import defop, flops_rule, index_form, numpy_kernel
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
}
for _name, (_arity, _doc) in _OPS.items():
    defop(_name, _arity, doc=_doc, elementwise=True, differentiable=False, cheap_to_recompute=True)(_like_first)


@defop(
    "clip_scale", 1, doc="min(1, clip / sqrt(total)) for the summed squared gradient norm total", differentiable=False
)
def _clip_scale(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    return TensorType(())


def _f(x: np.ndarray, v: float) -> Any:
    return x.dtype.type(v)


numpy_kernel("sgd_plain")(lambda xs, a: xs[0] - _f(xs[0], a["lr"]) * (xs[1] + _f(xs[0], a["weight_decay"]) * xs[0]))
numpy_kernel("sgd_momentum")(
    lambda xs, a: _f(xs[0], a["momentum"]) * xs[0] + xs[1] + _f(xs[0], a["weight_decay"]) * xs[2]
)
numpy_kernel("sgd_step")(lambda xs, a: xs[0] - _f(xs[0], a["lr"]) * xs[1])
numpy_kernel("adam_moment")(
    lambda xs, a: _f(xs[0], a["beta"]) * xs[0] + _f(xs[0], 1 - a["beta"]) * xs[1] ** int(a["power"])
)
numpy_kernel("scale_by")(lambda xs, a: xs[0] * xs[1])
numpy_kernel("sgd_plain_scheduled")(
    lambda xs, a: xs[0] - xs[2].astype(xs[0].dtype) * (xs[1] + _f(xs[0], a["weight_decay"]) * xs[0])
)
numpy_kernel("sgd_step_scheduled")(lambda xs, a: xs[0] - xs[2].astype(xs[0].dtype) * xs[1])
numpy_kernel("clip_scale")(lambda xs, a: np.minimum(1.0, a["clip"] / (np.sqrt(xs[0]) + 1e-6)).astype(xs[0].dtype))


@numpy_kernel("adam_step")
def _adam_step(xs: tuple, a: dict) -> np.ndarray:
    w, m, v, t = xs
    t = float(t)
    m_hat = m / (1 - a["beta1"] ** t)
    v_hat = v / (1 - a["beta2"] ** t)
    return (w - a["lr"] * m_hat / (np.sqrt(v_hat) + a["eps"])).astype(w.dtype)


@numpy_kernel("adam_step_scheduled")
def _adam_step_scheduled(xs: tuple, a: dict) -> np.ndarray:
    w, m, v, t, lr = xs
    return _adam_step((w, m, v, t), {**a, "lr": float(lr)})


@flops_rule(*_OPS, "clip_scale")
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 4 * out.numel


def _adam_step_form(a: dict, w: IE, m: IE, v: IE, t: IE, lr: IE | None = None) -> IE:
    m_hat = ap("/", m, ap("-", c(1), ap("^", c(a["beta1"]), t)))
    v_hat = ap("/", v, ap("-", c(1), ap("^", c(a["beta2"]), t)))
    rate = c(a["lr"]) if lr is None else lr
    return ap("-", w, ap("*", rate, ap("/", m_hat, ap("+", ap("sqrt", v_hat), c(a["eps"])))))


_INDEX_FORMS: dict[str, Any] = {
    "sgd_plain": lambda a, w, g: ap("-", w, ap("*", c(a["lr"]), ap("+", g, ap("*", c(a["weight_decay"]), w)))),
    "sgd_momentum": lambda a, v, g, w: ap(
        "+", ap("+", ap("*", c(a["momentum"]), v), g), ap("*", c(a["weight_decay"]), w)
    ),  # fmt: skip
    "sgd_step": lambda a, w, v: ap("-", w, ap("*", c(a["lr"]), v)),
    "adam_moment": lambda a, m, g: ap(
        "+", ap("*", c(a["beta"]), m), ap("*", c(1 - a["beta"]), ap("^", g, c(a["power"])))
    ),
    "adam_step": _adam_step_form,
    "sgd_plain_scheduled": lambda a, w, g, lr: ap(
        "-", w, ap("*", lr, ap("+", g, ap("*", c(a["weight_decay"]), w)))
    ),  # fmt: skip
    "sgd_step_scheduled": lambda a, w, v, lr: ap("-", w, ap("*", lr, v)),
    "adam_step_scheduled": _adam_step_form,
    "scale_by": lambda a, x, s: ap("*", x, s),
    "clip_scale": lambda a, t: ap("min", c(1), ap("/", c(a["clip"]), ap("+", ap("sqrt", t), c(1e-6)))),
}
for _name, _form in _INDEX_FORMS.items():
    index_form(_name)(pointwise(_form))
