"""Element-wise ops: arithmetic between equal shapes, with scalars, the activations and their gradients."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.registry import defop, eager_saves, flops_rule, index_form, kink_points, numpy_kernel, vjp_rule
from deepdsl.ir.types import ShapeError, TensorType
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
kink_points("relu", "abs", "leaky_relu", at=((0, 0.0),))  # the slope jumps at 0
kink_points("relu_grad", "abs_grad", "leaky_relu_grad", at=((1, 0.0),))  # the value jumps where y (x) is 0


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


# ---- GELU, the exact (erf) form, PyTorch's default: x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)) ----
# erf is Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7, below float32's resolution of the result), written with
# the scalar functions every backend already has, so that NumPy, Java and CUDA compute the same polynomial. The
# gradient is the analytic one, d/dx [x Phi(x)] = Phi(x) + x phi(x) with phi(x) = exp(-x^2 / 2) / sqrt(2 pi), not
# the derivative of the polynomial: phi's exponential is the one erf's formula already computes (exp(-u^2) at
# u = |x| / sqrt 2), so gelu' costs a multiply and an add more than gelu, where the derivative of the polynomial
# cost ten times as many operations. It is within 1e-7 of the exact gelu' and within 6e-7 of the polynomial's
# own slope (tests/ops/test_transformer_ops.py): float64 finite differences see that, float32 training does not.

_ERF_P = 0.3275911
_ERF_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def _erf_parts(u: Any, num: Any) -> tuple[Any, Any]:
    """(erf(u), exp(-u^2)) for u >= 0, given the operations `num` (add, mul, div, exp) on u's kind of value."""
    add, mul, div, exp = num
    t = div(1.0, add(1.0, mul(_ERF_P, u)))
    poly = mul(t, _ERF_A[4])  # Horner: poly = sum a_k t^(k+1)
    for k in (3, 2, 1, 0):
        poly = mul(t, add(_ERF_A[k], poly))
    e = exp(mul(-1.0, mul(u, u)))
    return add(1.0, mul(-1.0, mul(poly, e))), e


def _ie(v: Any) -> Any:
    return v if not isinstance(v, float | int) else c(v)


_IE_NUM = (
    lambda a, b: ap("+", _ie(a), _ie(b)),
    lambda a, b: ap("*", _ie(a), _ie(b)),
    lambda a, b: ap("/", _ie(a), _ie(b)),
    lambda a: ap("exp", _ie(a)),
)
_NP_NUM = (lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a / b, np.exp)


def _gelu_terms(x: Any, num: Any, sign: Any, absolute: Any, which: int) -> Any:
    """gelu(x) (which 0) or gelu'(x) (which 1): Phi(x) = (1 + sign(x) erf(|x| / sqrt 2)) / 2, gelu = x Phi,
    gelu' = Phi + x phi."""
    add, mul, _, _ = num
    erf, gauss = _erf_parts(mul(_SQRT_HALF, absolute(x)), num)  # gauss = exp(-x^2 / 2)
    cdf = mul(0.5, add(1.0, mul(sign(x), erf)))
    return mul(x, cdf) if which == 0 else add(cdf, mul(x, mul(_INV_SQRT_2PI, gauss)))


def _ie_sign(x: Any) -> Any:
    return ap("select", ap("<", x, c(0)), c(-1), c(1))


def gelu_index(x: Any, which: int) -> Any:
    """gelu(x) (which 0) or gelu'(x) (which 1) as the index form writes it, on the index expression `x` (the Java
    backend recognises these bodies and runs them in its runtime's vectorised loops: backends/java/kernels.py)."""
    return _gelu_terms(x, _IE_NUM, _ie_sign, lambda v: ap("abs", v), which)


defop("gelu", 1, doc="element-wise x * Phi(x), the exact (erf) form", elementwise=True, cheap_to_recompute=True)(
    unary_same
)
defop("gelu_grad", 2, doc="element-wise g * gelu'(x)  (g, x)", elementwise=True, differentiable=False,
      cheap_to_recompute=True)(binary_same)  # fmt: skip


def _np_gelu(x: np.ndarray, which: int) -> np.ndarray:
    # Python floats keep the array's precision (float32 or float64)
    return _gelu_terms(x, _NP_NUM, lambda v: np.where(v < 0, x.dtype.type(-1), x.dtype.type(1)), np.abs, which)


numpy_kernel("gelu")(lambda xs, a: _np_gelu(xs[0], 0))
numpy_kernel("gelu_grad")(lambda xs, a: xs[0] * _np_gelu(xs[1], 1))
index_form("gelu")(pointwise(lambda a, x: gelu_index(x, 0)))
index_form("gelu_grad")(pointwise(lambda a, g, x: ap("*", g, gelu_index(x, 1))))
# about twenty-five operations per element (the kernel printers and `evaluate` compute t, |x| / sqrt 2 and the
# exponential once: backends/cexpr.py), but one pass over memory: cheap to recompute (memory/remat.py)
flops_rule("gelu", "gelu_grad")(lambda types, out, a: 4 * out.numel)
vjp_rule("gelu")(lambda b, s, g: (_e(b, s, "gelu_grad", g, s.inputs[0]),))
eager_saves("gelu", which=(0,))


# ---- hard swish, x * relu6(x + 3) / 6 (MobileNetV3), and its gradient ----

defop("hard_swish", 1, doc="element-wise x * min(max(x + 3, 0), 6) / 6", elementwise=True, cheap_to_recompute=True)(
    unary_same
)
defop(
    "hard_swish_grad",
    2,
    doc="element-wise g * hard_swish'(x)  (g, x): 0 up to -3, x / 3 + 1/2 between, 1 from 3",
    elementwise=True,
    differentiable=False,
    cheap_to_recompute=True,
)(binary_same)


def _np_hard_swish_slope(x: np.ndarray) -> np.ndarray:
    return np.where(x <= -3, 0, np.where(x < 3, x / 3 + 0.5, 1)).astype(x.dtype)


numpy_kernel("hard_swish")(lambda xs, a: xs[0] * np.clip(xs[0] + 3, 0, 6) / 6)
numpy_kernel("hard_swish_grad")(lambda xs, a: xs[0] * _np_hard_swish_slope(xs[1]))


def _ie_hard_swish_slope(x: Any) -> Any:
    middle = ap("+", ap("/", x, c(3)), c(0.5))
    return ap("select", ap("<=", x, c(-3)), c(0), ap("select", ap("<", x, c(3)), middle, c(1)))


index_form("hard_swish")(
    pointwise(lambda a, x: ap("/", ap("*", x, ap("min", ap("max", ap("+", x, c(3)), c(0)), c(6))), c(6)))
)
index_form("hard_swish_grad")(pointwise(lambda a, g, x: ap("*", g, _ie_hard_swish_slope(x))))
flops_rule("hard_swish", "hard_swish_grad")(lambda types, out, a: 4 * out.numel)
vjp_rule("hard_swish")(lambda b, s, g: (_e(b, s, "hard_swish_grad", g, s.inputs[0]),))
eager_saves("hard_swish", which=(0,))  # PyTorch's hardswish_backward reads x
kink_points("hard_swish", at=((0, -3.0), (0, 3.0)))  # the slope jumps at -3 and 3: the oracles sample there
kink_points("hard_swish_grad", at=((1, -3.0), (1, 3.0)))


# ---- clip (torch.clamp, ONNX Clip), the op of relu6 and hard_sigmoid too, and SiLU (issue 34) ----
# clip {low, high}: min(max(x, low), high); its gradient passes on (low, high) only, 0 at the bounds, as torch 2.15
# computes torch.clamp's, F.hardtanh's (so F.relu6's) and F.hardsigmoid's (scripts/pytorch_norms.py measures it).
# Its kinks are listed at relu6's bounds, 0 and 6 (the registry's example call): the oracles sample those.


@defop("clip", 1, doc="element-wise min(max(x, low), high) (attrs low, high)", elementwise=True,
       cheap_to_recompute=True)  # fmt: skip
def clip(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    if not attrs["low"] <= attrs["high"]:
        raise ShapeError(f"clip: low {attrs['low']} is above high {attrs['high']}")
    return unary_same(types, attrs)


@defop("clip_grad", 2, doc="element-wise g where low < x < high, else 0  (g, x)", elementwise=True,
       differentiable=False, cheap_to_recompute=True)  # fmt: skip
def clip_grad(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    clip(types[1:], attrs)
    return binary_same(types, attrs)


def _np_clip(x: np.ndarray, a: dict) -> np.ndarray:
    return np.minimum(np.maximum(x, x.dtype.type(a["low"])), x.dtype.type(a["high"]))


def _np_clip_grad(g: np.ndarray, x: np.ndarray, a: dict) -> np.ndarray:
    inside = (x > x.dtype.type(a["low"])) & (x < x.dtype.type(a["high"]))
    return np.where(inside, g, 0).astype(g.dtype)


numpy_kernel("clip")(lambda xs, a: _np_clip(xs[0], a))
numpy_kernel("clip_grad")(lambda xs, a: _np_clip_grad(xs[0], xs[1], a))
index_form("clip")(pointwise(lambda a, x: ap("min", ap("max", x, c(a["low"])), c(a["high"]))))
index_form("clip_grad")(
    pointwise(lambda a, g, x: ap("select", ap("and", ap("<", c(a["low"]), x), ap("<", x, c(a["high"]))), g, c(0)))
)
flops_rule("clip", "clip_grad")(lambda types, out, a: 2 * out.numel)
vjp_rule("clip")(lambda b, s, g: (_e(b, s, "clip_grad", g, s.inputs[0], **s.a),))
eager_saves("clip", which=(0,))  # clamp_backward and hardtanh_backward read x
kink_points("clip", at=((0, 0.0), (0, 6.0)))
kink_points("clip_grad", at=((1, 0.0), (1, 6.0)))

# silu(x) = x sigmoid(x) (nn.SiLU); silu'(x) = s (1 + x (1 - s)) with s = sigmoid(x), PyTorch's silu_backward
defop("silu", 1, doc="element-wise x * sigmoid(x)", elementwise=True, cheap_to_recompute=True)(unary_same)
defop("silu_grad", 2, doc="element-wise g * s * (1 + x * (1 - s)), s = sigmoid(x)  (g, x)", elementwise=True,
      differentiable=False, cheap_to_recompute=True)(binary_same)  # fmt: skip


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    return (0.5 * (1 + np.tanh(0.5 * x))).astype(x.dtype)


numpy_kernel("silu")(lambda xs, a: xs[0] * _np_sigmoid(xs[0]))
numpy_kernel("silu_grad")(
    lambda xs, a: xs[0] * _np_sigmoid(xs[1]) * (1 + xs[1] * (1 - _np_sigmoid(xs[1])))
)  # fmt: skip
index_form("silu")(pointwise(lambda a, x: ap("*", x, ap("sigmoid", x))))
index_form("silu_grad")(
    pointwise(lambda a, g, x: ap("*", ap("*", g, ap("sigmoid", x)),
                                 ap("+", c(1), ap("*", x, ap("-", c(1), ap("sigmoid", x))))))
)  # fmt: skip
flops_rule("silu", "silu_grad")(lambda types, out, a: 4 * out.numel)
vjp_rule("silu")(lambda b, s, g: (_e(b, s, "silu_grad", g, s.inputs[0]),))
eager_saves("silu", which=(0,))  # silu_backward reads x
