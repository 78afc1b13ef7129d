"""Adaptive average pooling along one axis (PyTorch's nn.AdaptiveAvgPool2d is two of them, H then W).

    adaptive_pool_axis(x) {axis, size} -> x with axis `axis` of length `size`
    adaptive_pool_axis_backward(g) {axis, size} -> the gradient of x, axis `axis` back to length `size`

Output i of an axis of n inputs averages the inputs start(i) <= a < end(i), start(i) = ⌊i·n / o⌋ and
end(i) = ⌈(i + 1)·n / o⌉ (o outputs): windows of unequal length, overlapping where o does not divide n. Both ops
are the linear map `out[..., i, ...] = Σ_a w(i, a) · x[..., a, ...]` with w(i, a) = 1 / (end(i) − start(i)) in the
window and 0 outside (the backward op the transposed map). For integers a and i the window test needs no floor:
a ≥ ⌊i·n / o⌋ ⟺ (a + 1)·o > i·n and a < ⌈(i + 1)·n / o⌉ ⟺ a·o < (i + 1)·n; the window's length, a function of i
alone known when the op is written, is a balanced tree of selects over the runs of equal lengths (at most MAX_RUNS
runs, so that the kernels stay small: 7x7 from 13x13 or 6x6 from 13x13 has 7 and 6). So each op has an index form
(as ops/resize.py's maps, with the index variables as values), and the backends write its kernels.

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

# runs of windows of equal length along one axis, the select tree's leaves (every size up to 64 has at most 63)
MAX_RUNS = 256
MAX_SIZE = 65536  # outputs along one axis (finding the runs takes a pass over them when the op is written)


def _check(x: TensorType, a: dict[str, Any], what: str, backward: bool = False) -> int:
    need_float(x, what)
    axis, size = int(a["axis"]), int(a["size"])
    if not 0 <= axis < x.rank or size < 1:
        raise ShapeError(f"{what}: axis {axis} and size {size} do not fit {x}")
    n, o = (size, x.shape[axis]) if backward else (x.shape[axis], size)
    if o > MAX_SIZE:
        raise ShapeError(f"adaptive pooling into {o:,} outputs along axis {axis}; at most {MAX_SIZE:,} are supported")
    if len(runs(n, o)) > MAX_RUNS:
        raise ShapeError(f"adaptive pooling of {n} positions into {o} windows gives {len(runs(n, o))} runs of windows "
                         f"of equal length along axis {axis}; at most {MAX_RUNS} are supported")  # fmt: skip
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
    return _resized(g, _check(g, a, "adaptive_pool_axis_backward", backward=True), int(a["size"]))


def windows(n: int, o: int) -> list[tuple[int, int]]:
    """(start, end) of each of the o windows over n inputs (PyTorch's start_index and end_index)."""
    return [(i * n // o, -(-(i + 1) * n // o)) for i in range(o)]


def runs(n: int, o: int) -> list[tuple[int, int]]:
    """(first output, window length) of each run of consecutive outputs whose windows have the same length."""
    out: list[tuple[int, int]] = []
    for i, (s, e) in enumerate(windows(n, o)):
        if not out or out[-1][1] != e - s:
            out.append((i, e - s))
    return out


def _bounds(n: int, o: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(o, dtype=np.int64)
    return i * n // o, -(-(i + 1) * n // o)


@numpy_kernel("adaptive_pool_axis")
def _adaptive_np(xs: tuple, a: dict) -> np.ndarray:
    # each window's sum as a difference of running sums (in float64), divided by its length
    (x,) = xs
    axis, o = int(a["axis"]), int(a["size"])
    start, end = _bounds(x.shape[axis], o)
    v = np.moveaxis(x, axis, -1).astype(np.float64)
    sums = np.concatenate([np.zeros((*v.shape[:-1], 1)), np.cumsum(v, axis=-1)], axis=-1)
    y = (sums[..., end] - sums[..., start]) / (end - start)
    return np.ascontiguousarray(np.moveaxis(y, -1, axis).astype(x.dtype))


@numpy_kernel("adaptive_pool_axis_backward")
def _adaptive_backward_np(xs: tuple, a: dict) -> np.ndarray:
    # each output's g / length added over its window: + at the start, - at the end, running sums
    (g,) = xs
    axis, n = int(a["axis"]), int(a["size"])
    start, end = _bounds(n, g.shape[axis])
    v = np.moveaxis(g, axis, -1).astype(np.float64) / (end - start)
    marks = np.zeros((*v.shape[:-1], n + 1))
    np.add.at(marks, (..., start), v)
    np.subtract.at(marks, (..., end), v)
    return np.ascontiguousarray(np.moveaxis(np.cumsum(marks, axis=-1)[..., :n], -1, axis).astype(g.dtype))


def _weight(i: IE, a: IE, n: int, o: int) -> IE:
    """w(i, a) as a scalar expression of the index variables i (output) and a (input)."""
    inside = ap("and", ap(">", ap("*", ap("+", a, c(1)), c(o)), ap("*", i, c(n))),
                ap("<", ap("*", a, c(o)), ap("*", ap("+", i, c(1)), c(n))))  # fmt: skip
    return ap("select", inside, _inverse_length(i, runs(n, o)), c(0))


def _inverse_length(i: IE, rs: list[tuple[int, int]]) -> IE:
    """1 / the window length of output i, over the runs `rs`: a balanced tree of `i < first output of a run`."""
    if len(rs) == 1:
        return c(1.0 / rs[0][1])
    mid = len(rs) // 2
    return ap("select", ap("<", i, c(rs[mid][0])), _inverse_length(i, rs[:mid]), _inverse_length(i, rs[mid:]))


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
