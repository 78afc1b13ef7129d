"""Adaptive average pooling along one axis (PyTorch's nn.AdaptiveAvgPool2d is two of them, H then W).

    adaptive_pool_axis(x) {axis, size} -> x with axis `axis` of length `size`
    adaptive_pool_axis_backward(g) {axis, size} -> the gradient of x, axis `axis` back to length `size`

Output i of an axis of n inputs averages the inputs start(i) <= a < end(i), start(i) = ⌊i·n / o⌋ and
end(i) = ⌈(i + 1)·n / o⌉ (o outputs): windows of unequal length, overlapping where o does not divide n. Both ops
are the linear map `out[..., i, ...] = Σ_a w(i, a) · x[..., a, ...]` with w(i, a) = 1 / (end(i) − start(i)) in the
window and 0 outside (the backward op the transposed map). For integers a and i the window test needs no floor:
a ≥ ⌊i·n / o⌋ ⟺ (a + 1)·o > i·n and a < ⌈(i + 1)·n / o⌉ ⟺ a·o < (i + 1)·n; the window's length, a function of i
alone known when the op is written, is a chain of selects over the runs of equal lengths. So each op has an index
form (as ops/resize.py's maps, with the index variables as values), and the backends write its kernels.

The built-in `adaptive_avg_pool` uses these only where the windows differ: where o divides n it is avg_pool2d.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.indexexpr import IE, Affine, Read, Reduce, Var
from deepdsl.ir.registry import defop, eager_saves, flops_rule, index_form, numpy_kernel, vjp_rule
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_float
from deepdsl.ops._index_forms import ap, c


def _check(x: TensorType, a: dict[str, Any], what: str) -> int:
    need_float(x, what)
    axis, size = int(a["axis"]), int(a["size"])
    if not 0 <= axis < x.rank or size < 1:
        raise ShapeError(f"{what}: axis {axis} and size {size} do not fit {x}")
    return axis


def _resized(x: TensorType, axis: int, size: int) -> TensorType:
    shape = list(x.shape)
    shape[axis] = size
    return TensorType(tuple(shape))


@defop("adaptive_pool_axis", 1, doc="adaptive average pooling along attrs axis to attrs size outputs")
def _adaptive(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    (x,) = types
    return _resized(x, _check(x, a, "adaptive_pool_axis"), int(a["size"]))


@defop("adaptive_pool_axis_backward", 1, differentiable=False)
def _adaptive_backward(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    """d adaptive_pool_axis / d x: the transposed map of the gradient, the axis back to attrs size"""
    (g,) = types
    return _resized(g, _check(g, a, "adaptive_pool_axis_backward"), int(a["size"]))


def windows(n: int, o: int) -> list[tuple[int, int]]:
    """(start, end) of each of the o windows over n inputs (PyTorch's start_index and end_index)."""
    return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]


def weights(n: int, o: int) -> np.ndarray:
    """The map's matrix w(i, a), [o, n], in float64."""
    w = np.zeros((o, n))
    for i, (s, e) in enumerate(windows(n, o)):
        w[i, s:e] = 1.0 / (e - s)
    return w


def _apply(x: np.ndarray, m: np.ndarray, axis: int) -> np.ndarray:
    y = np.tensordot(m.astype(x.dtype), x, axes=([1], [axis]))  # the new axis first
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


numpy_kernel("adaptive_pool_axis")(lambda xs, a: _apply(xs[0], weights(xs[0].shape[a["axis"]], a["size"]), a["axis"]))
numpy_kernel("adaptive_pool_axis_backward")(
    lambda xs, a: _apply(xs[0], weights(a["size"], xs[0].shape[a["axis"]]).T, a["axis"])
)


def _weight(i: IE, a: IE, n: int, o: int) -> IE:
    """w(i, a) as a scalar expression of the index variables i (output) and a (input)."""
    inside = ap("and", ap(">", ap("*", ap("+", a, c(1)), c(o)), ap("*", i, c(n))),
                ap("<", ap("*", a, c(o)), ap("*", ap("+", i, c(1)), c(n))))  # fmt: skip
    lengths = [e - s for s, e in windows(n, o)]
    scale: IE = c(1.0 / lengths[-1])
    for k in range(o - 1, 0, -1):  # the runs of equal lengths, from the last: i < k picks the earlier run
        if lengths[k - 1] != lengths[k]:
            scale = ap("select", ap("<", i, c(k)), c(1.0 / lengths[k - 1]), scale)
    return ap("select", inside, scale, c(0))


def _form(backward: bool) -> Any:
    def form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> IE:
        axis = int(a["axis"])
        n, o = (out.shape[axis], types[0].shape[axis]) if backward else (types[0].shape[axis], out.shape[axis])
        index = [Affine.var(f"i{k}") for k in range(out.rank)]
        index[axis] = Affine.var("r")
        i, inp = (Var("r"), Var(f"i{axis}")) if backward else (Var(f"i{axis}"), Var("r"))
        body = ap("*", _weight(i, inp, n, o), Read(0, tuple(index)))
        return Reduce("sum", (("r", types[0].shape[axis]),), body)

    return form


index_form("adaptive_pool_axis")(_form(False))
index_form("adaptive_pool_axis_backward")(_form(True))


@flops_rule("adaptive_pool_axis", "adaptive_pool_axis_backward")
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 2 * out.numel * types[0].shape[int(a["axis"])]  # a multiply-add per term of the sum


@vjp_rule("adaptive_pool_axis")
def _vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    return (_e(b, s, "adaptive_pool_axis_backward", g, axis=s.a["axis"], size=x.type.shape[int(s.a["axis"])]),)


# PyTorch's adaptive_avg_pool2d keeps its input for the backward pass (_adaptive_avg_pool2d_backward(grad, self))
eager_saves("adaptive_pool_axis", which=(0,))
