"""Element-wise ops: arithmetic between equal shapes, with scalars, the activations and their gradients."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.registry import defop, eager_saves, flops_rule, index_form, numpy_kernel, vjp_rule
from deepdsl.ir.types import TensorType
from deepdsl.ops._helpers import binary_same, unary_same
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._index_forms import ap, c, pointwise

_BINARY = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b"}
_SCALAR = {  # the scalar c is attrs["value"]
    "add_scalar": "x + c", "mul_scalar": "x * c", "rsub_scalar": "c - x", "rdiv_scalar": "c / x", "pow_scalar": "x ^ c",
}  # fmt: skip
_UNARY = {
    "neg": "-x", "relu": "max(x, 0)", "sigmoid": "1 / (1 + exp(-x))", "tanh": "tanh(x)", "exp": "exp(x)",
    "log": "log(x)", "sqrt": "sqrt(x)", "abs": "|x|", "leaky_relu": "x > 0 ? x : slope * x (attrs: slope)",
}  # fmt: skip
# gradients that need their own kernel: (g, y or x) -> g * f'(.)
_GRADS = {
    "relu_grad": "g where y > 0, else 0 (y = relu(x))",
    "sigmoid_grad": "g * y * (1 - y) (y = sigmoid(x))",
    "tanh_grad": "g * (1 - y^2) (y = tanh(x))",
    "abs_grad": "g * sign(x)",
    "leaky_relu_grad": "g where x > 0, else slope * g",
}

for _name, _doc in _BINARY.items():
    defop(_name, 2, doc=f"element-wise {_doc}", elementwise=True, cheap_to_recompute=True)(binary_same)
for _name, _doc in _GRADS.items():  # only in backward programs: never differentiated themselves
    defop(_name, 2, doc=f"element-wise {_doc}", elementwise=True, differentiable=False, cheap_to_recompute=True)(
        binary_same
    )
for _name, _doc in (_SCALAR | _UNARY).items():
    defop(_name, 1, doc=f"element-wise {_doc}", elementwise=True, cheap_to_recompute=True)(unary_same)


@defop("fill", 0, doc="a tensor of attrs shape with every element attrs value", inline_into_readers=True)
def fill(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    return TensorType(tuple(attrs["shape"]))


# ---- NumPy kernels ----


@numpy_kernel("fill")
def _fill(xs: tuple, a: dict) -> np.ndarray:
    return np.full(a["shape"], a["value"], dtype=a.get("dtype", np.float32))


_NP: dict[str, Any] = {
    "add": lambda x, y, a: x + y,
    "sub": lambda x, y, a: x - y,
    "mul": lambda x, y, a: x * y,
    "div": lambda x, y, a: x / y,
    "relu_grad": lambda g, y, a: np.where(y > 0, g, 0).astype(g.dtype),
    "sigmoid_grad": lambda g, y, a: g * y * (1 - y),
    "tanh_grad": lambda g, y, a: g * (1 - y * y),
    "abs_grad": lambda g, x, a: g * np.sign(x).astype(g.dtype),
    "leaky_relu_grad": lambda g, x, a: np.where(x > 0, g, g * g.dtype.type(a["slope"])),
}
_NP1: dict[str, Any] = {
    "add_scalar": lambda x, a: x + x.dtype.type(a["value"]),
    "mul_scalar": lambda x, a: x * x.dtype.type(a["value"]),
    "rsub_scalar": lambda x, a: x.dtype.type(a["value"]) - x,
    "rdiv_scalar": lambda x, a: x.dtype.type(a["value"]) / x,
    "pow_scalar": lambda x, a: np.power(x, x.dtype.type(a["value"])),
    "neg": lambda x, a: -x,
    "relu": lambda x, a: np.maximum(x, 0),
    "sigmoid": lambda x, a: (0.5 * (1 + np.tanh(0.5 * x))).astype(x.dtype),
    "tanh": lambda x, a: np.tanh(x),
    "exp": lambda x, a: np.exp(x),
    "log": lambda x, a: np.log(x),
    "sqrt": lambda x, a: np.sqrt(x),
    "abs": lambda x, a: np.abs(x),
    "leaky_relu": lambda x, a: np.where(x > 0, x, x * x.dtype.type(a["slope"])),
}
for _name, _fn in _NP.items():
    numpy_kernel(_name)(lambda xs, a, fn=_fn: fn(xs[0], xs[1], a))
for _name, _fn in _NP1.items():
    numpy_kernel(_name)(lambda xs, a, fn=_fn: fn(xs[0], a))


@flops_rule(*_BINARY, *_GRADS, *_SCALAR, *_UNARY, "fill")
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return out.numel


# ---- gradients: (builder, statement, d out) -> d inputs ----


@vjp_rule("add")
def _add_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (g, g)


@vjp_rule("sub")
def _sub_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (g, _e(b, s, "neg", g))


@vjp_rule("mul")
def _mul_vjp(b: Any, s: Any, g: Any) -> tuple:
    x, y = s.inputs
    return (_e(b, s, "mul", g, y), _e(b, s, "mul", g, x))


@vjp_rule("div")
def _div_vjp(b: Any, s: Any, g: Any) -> tuple:
    x, y = s.inputs
    gx = _e(b, s, "div", g, y)
    return (gx, _e(b, s, "neg", _e(b, s, "div", _e(b, s, "mul", gx, x), y)))


@vjp_rule("add_scalar")
def _add_scalar_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (g,)


@vjp_rule("mul_scalar")
def _mul_scalar_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "mul_scalar", g, value=s.a["value"]),)


@vjp_rule("neg", "rsub_scalar")
def _neg_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "neg", g),)


@vjp_rule("rdiv_scalar")
def _rdiv_vjp(b: Any, s: Any, g: Any) -> tuple:
    # d(c / x) = -(c / x) / x = -y / x
    (x,) = s.inputs
    return (_e(b, s, "neg", _e(b, s, "mul", g, _e(b, s, "div", s.out, x))),)


@vjp_rule("pow_scalar")
def _pow_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    c = s.a["value"]
    return (_e(b, s, "mul", g, _e(b, s, "mul_scalar", _e(b, s, "pow_scalar", x, value=c - 1.0), value=c)),)


@vjp_rule("exp")
def _exp_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "mul", g, s.out),)


@vjp_rule("log")
def _log_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "div", g, s.inputs[0]),)


@vjp_rule("sqrt")
def _sqrt_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "div", g, _e(b, s, "mul_scalar", s.out, value=2.0)),)


@vjp_rule("relu", "sigmoid", "tanh")
def _by_output_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, f"{s.op}_grad", g, s.out),)


@vjp_rule("abs")
def _abs_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "abs_grad", g, s.inputs[0]),)


@vjp_rule("leaky_relu")
def _leaky_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "leaky_relu_grad", g, s.inputs[0], slope=s.a["slope"]),)


# ---- index forms (what fusion composes) ----

_FORMS: dict[str, Any] = {
    "add": lambda a, x, y: ap("+", x, y),
    "sub": lambda a, x, y: ap("-", x, y),
    "mul": lambda a, x, y: ap("*", x, y),
    "div": lambda a, x, y: ap("/", x, y),
    "add_scalar": lambda a, x: ap("+", x, c(a["value"])),
    "mul_scalar": lambda a, x: ap("*", x, c(a["value"])),
    "rsub_scalar": lambda a, x: ap("-", c(a["value"]), x),
    "rdiv_scalar": lambda a, x: ap("/", c(a["value"]), x),
    "pow_scalar": lambda a, x: ap("^", x, c(a["value"])),
    "neg": lambda a, x: ap("neg", x),
    "relu": lambda a, x: ap("max", x, c(0)),
    "leaky_relu": lambda a, x: ap("select", ap(">", x, c(0)), x, ap("*", c(a["slope"]), x)),
    "relu_grad": lambda a, g, y: ap("select", ap(">", y, c(0)), g, c(0)),
    "sigmoid_grad": lambda a, g, y: ap("*", g, ap("*", y, ap("-", c(1), y))),
    "tanh_grad": lambda a, g, y: ap("*", g, ap("-", c(1), ap("*", y, y))),
    "abs_grad": lambda a, g, x: ap(
        "*", g, ap("select", ap(">", x, c(0)), c(1), ap("select", ap("<", x, c(0)), c(-1), c(0)))
    ),  # fmt: skip
    "leaky_relu_grad": lambda a, g, x: ap("select", ap(">", x, c(0)), g, ap("*", c(a["slope"]), g)),
}
for _name in ("sigmoid", "tanh", "exp", "log", "sqrt", "abs"):
    _FORMS[_name] = lambda a, x, fn=_name: ap(fn, x)
for _name, _fn in _FORMS.items():
    index_form(_name)(pointwise(_fn))
index_form("fill")(lambda types, out, a: c(a["value"]))


# what eager autograd keeps for the backward pass (PyTorch's derivative formulas)
eager_saves("relu", "sigmoid", "tanh", "exp", "sqrt", which=("out",))
eager_saves("log", "abs", "leaky_relu", "pow_scalar", "rdiv_scalar", which=(0,))
eager_saves("mul", "div", which=(0, 1))
