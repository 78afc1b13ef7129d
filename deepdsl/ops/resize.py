"""Upsampling by an integer factor along one axis, nearest or bilinear (PyTorch's `align_corners=False`, or with
mode `bilinear_align_corners` its `align_corners=True`).

    resize_axis(x) {axis, factor, mode} -> x with axis `axis` `factor` times longer
    resize_axis_backward(g) {axis, factor, mode, size} -> the gradient of x, axis `axis` of length `size`

Both are the linear map `out[..., i, ...] = Σ_a w(i, a) · x[..., a, ...]` along the axis, with the weights

    nearest:   w(i, a) = 1 where a = ⌊i / f⌋ (f·a ≤ i < f·a + f), else 0
    bilinear:  w(i, a) = max(0, 1 − |s(i) − a|),  s(i) = min(max((i + ½) / f − ½, 0), n − 1)
    bilinear_align_corners:  the same tent at s(i) = i · (n − 1) / (n·f − 1) (0 where n·f = 1): the first and last
                             elements of both axes lined up, as ONNX's coordinate_transformation_mode='align_corners'

(the tent of linear interpolation at PyTorch's source coordinate, clamped at the borders as it clamps); the
backward op is the transposed map. `upsample(factor)` on [N, C, H, W] is two of them, H then W, so that each
output element sums over one axis (n reads), not over both. Their index forms are these sums, written with the
index variables as values (an index expression reads at affine positions only, and ⌊i / f⌋ is not affine), so
the backends write their kernels from them; the NumPy kernels use the weight matrix.
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

MODES = ("nearest", "bilinear", "bilinear_align_corners")


def _check(x: TensorType, a: dict[str, Any], what: str) -> tuple[int, int]:
    need_float(x, what)
    axis, factor = int(a["axis"]), int(a["factor"])
    if not 0 <= axis < x.rank or factor < 1 or a["mode"] not in MODES:
        raise ShapeError(f"{what}: axis {axis}, factor {factor}, mode {a['mode']!r} do not fit {x}")
    return axis, factor


@defop("resize_axis", 1, doc="upsampling along attrs axis by an integer factor, nearest or bilinear (align_corners)")
def _resize(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    (x,) = types
    axis, factor = _check(x, a, "upsample")
    shape = list(x.shape)
    shape[axis] *= factor
    return TensorType(tuple(shape))


@defop("resize_axis_backward", 1, differentiable=False)
def _resize_backward(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    """d resize_axis / d x: the transposed map of the gradient, the axis back to attrs size"""
    (g,) = types
    axis, factor = _check(g, a, "resize_axis_backward")
    if g.shape[axis] != int(a["size"]) * factor:
        raise ShapeError(f"resize_axis_backward: gradient {g} does not fit size {a['size']} times {factor}")
    shape = list(g.shape)
    shape[axis] = int(a["size"])
    return TensorType(tuple(shape))


def weights(n: int, factor: int, mode: str) -> np.ndarray:
    """The map's matrix w(i, a), [n·factor, n], in float64 (the module docstring's formulas)."""
    i = np.arange(n * factor, dtype=np.float64)[:, None]
    a = np.arange(n, dtype=np.float64)[None, :]
    if mode == "nearest":
        return ((factor * a <= i) & (i < factor * a + factor)).astype(np.float64)
    if mode == "bilinear_align_corners":
        s = i * (n - 1) / max(n * factor - 1, 1)
    else:
        s = np.clip((i + 0.5) / factor - 0.5, 0.0, n - 1)
    return np.maximum(0.0, 1.0 - np.abs(s - a))


def _apply(x: np.ndarray, m: np.ndarray, axis: int) -> np.ndarray:
    y = np.tensordot(m.astype(x.dtype), x, axes=([1], [axis]))  # the new axis first
    return np.ascontiguousarray(np.moveaxis(y, 0, axis))


@numpy_kernel("resize_axis")
def _resize_np(xs: tuple, a: dict) -> np.ndarray:
    (x,) = xs
    axis, factor = int(a["axis"]), int(a["factor"])
    if a["mode"] == "nearest":
        return np.repeat(x, factor, axis=axis)
    return _apply(x, weights(x.shape[axis], factor, a["mode"]), axis)


@numpy_kernel("resize_axis_backward")
def _resize_backward_np(xs: tuple, a: dict) -> np.ndarray:
    (g,) = xs
    axis, factor = int(a["axis"]), int(a["factor"])
    return _apply(g, weights(int(a["size"]), factor, a["mode"]).T, axis)


def _weight(i: IE, a: IE, n: int, factor: int, mode: str) -> IE:
    """w(i, a) as a scalar expression of the index variables i (output) and a (input)."""
    if mode == "nearest":
        fa = ap("*", c(factor), a)
        return ap("select", ap("and", ap("<=", fa, i), ap("<", i, ap("+", fa, c(factor)))), c(1), c(0))
    if mode == "bilinear_align_corners":  # i · (n − 1) / (n·f − 1): exact at both ends, never past them
        s = ap("/", ap("*", i, c(n - 1)), c(max(n * factor - 1, 1)))
    else:
        s = ap("-", ap("/", ap("+", i, c(0.5)), c(factor)), c(0.5))
        s = ap("min", ap("max", s, c(0)), c(n - 1))
    return ap("max", c(0), ap("-", c(1), ap("abs", ap("-", s, a))))


def _form(backward: bool) -> Any:
    def form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> IE:
        axis, factor, mode = int(a["axis"]), int(a["factor"]), a["mode"]
        n = out.shape[axis] if backward else types[0].shape[axis]  # the short axis
        index = [Affine.var(f"i{k}") for k in range(out.rank)]
        index[axis] = Affine.var("r")
        i, short = (Var("r"), Var(f"i{axis}")) if backward else (Var(f"i{axis}"), Var("r"))
        body = ap("*", _weight(i, short, n, factor, mode), Read(0, tuple(index)))
        return Reduce("sum", (("r", types[0].shape[axis]),), body)

    return form


index_form("resize_axis")(_form(False))
index_form("resize_axis_backward")(_form(True))


@flops_rule("resize_axis", "resize_axis_backward")
def _resize_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 2 * out.numel * types[0].shape[int(a["axis"])]  # a multiply-add per term of the sum


@vjp_rule("resize_axis")
def _resize_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    size = x.type.shape[int(s.a["axis"])]
    return (_e(b, s, "resize_axis_backward", g, axis=s.a["axis"], factor=s.a["factor"], mode=s.a["mode"], size=size),)


eager_saves("resize_axis")  # PyTorch keeps no tensor for upsampling: its gradient needs only the sizes
