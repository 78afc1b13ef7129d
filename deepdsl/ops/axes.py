"""Ops along axes behind the language's `expand`, `max(x, axis)` and the gradients of the sums along axes.

- `expand`: explicit broadcasting; size-1 axes repeated to attrs shape. An index form that reads x at 0 along
  the repeated axes, inlined into its element-wise readers, so `x * expand(s, ...)` is one loop.
- `max_axes`: the maximum over attrs axes (an index form with a max reduction); its gradient goes to the arg
  max, shared evenly between tied elements (PyTorch's `amax`, and `max()` with no dim).
- `equal_mask`: 1 where two tensors are equal, else 0 (the arg max of max_axes's gradient).

`sum_axes` (ops/reduce.py) is the sum along axes; `slice` (ops/shape.py) is the slice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.analysis import out_vars
from deepdsl.ir.indexexpr import IE, Affine, Read, Reduce
from deepdsl.ir.registry import defop, eager_saves, flops_rule, index_form, numpy_kernel, vjp_rule
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops import reduce as _reduce  # noqa: F401 — sum_axes, which the gradients here emit
from deepdsl.ops._helpers import binary_same
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._index_forms import ap, c, pointwise


def expanded_axes(x: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, ...]:
    """The axes along which `expand` repeats x (size 1 in x, larger in `shape`)."""
    return tuple(k for k, (n, m) in enumerate(zip(x, shape)) if n == 1 and m != 1)


@defop("expand", 1, doc="x repeated along its size-1 axes to attrs shape (explicit broadcasting)",
       inline_into_readers=True)  # fmt: skip
def _expand(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    (x,) = types
    shape = tuple(a["shape"])
    if len(shape) != x.rank or any(n != m and n != 1 for n, m in zip(x.shape, shape)) or min(shape, default=1) < 1:
        raise ShapeError(f"expand: {x} does not grow to [{', '.join(map(str, shape))}] (only size-1 axes grow)")
    return TensorType(shape, x.dtype)


numpy_kernel("expand")(lambda xs, a: np.broadcast_to(xs[0], tuple(a["shape"])).copy())
flops_rule("expand")(lambda types, out, a: out.numel)


@index_form("expand")
def _expand_form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> IE:
    grown = set(expanded_axes(types[0].shape, out.shape))
    return Read(0, tuple(Affine((), 0) if k in grown else Affine.var(v) for k, v in enumerate(out_vars(out))))


def _keep_shape(x: TensorType, axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if k in axes else n for k, n in enumerate(x.shape))


def _reshaped(b: Any, s: Any, v: Any, shape: tuple[int, ...]) -> Any:
    return v if v.type.shape == shape else _e(b, s, "reshape", v, shape=shape)


def _summed(b: Any, s: Any, v: Any, axes: tuple[int, ...]) -> Any:
    """v summed over `axes` (every axis: the scalar sum)."""
    return _e(b, s, "sum", v) if len(axes) == v.type.rank else _e(b, s, "sum_axes", v, axes=axes)


def spread(b: Any, s: Any, v: Any, axes: tuple[int, ...], x: TensorType) -> Any:
    """v, a reduction of a tensor of type x over `axes` (kept axes in order), repeated back to x's shape."""
    kept = _reshaped(b, s, v, _keep_shape(x, axes))
    return kept if kept.type.shape == x.shape else _e(b, s, "expand", kept, shape=x.shape)


@vjp_rule("expand")
def _expand_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    axes = expanded_axes(x.type.shape, s.out.type.shape)
    return (_reshaped(b, s, _summed(b, s, g, axes), x.type.shape) if axes else g,)


# ---- the maximum along axes ----


@defop("max_axes", 1, doc="the maximum over attrs axes; the other axes stay, in order")
def _max_axes(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    (x,) = types
    axes = tuple(a["axes"])
    if not axes or any(not 0 <= k < x.rank for k in axes) or len(set(axes)) != len(axes):
        raise ShapeError(f"max_axes: axes {axes} do not fit {x}")
    return TensorType(tuple(n for k, n in enumerate(x.shape) if k not in axes), x.dtype)


numpy_kernel("max_axes")(lambda xs, a: np.asarray(np.max(xs[0], axis=tuple(a["axes"]))))
flops_rule("max_axes")(lambda types, out, a: types[0].numel)


@index_form("max_axes")
def _max_axes_form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> IE:
    x, axes = types[0], tuple(a["axes"])
    kept = [k for k in range(x.rank) if k not in axes]
    index = tuple(Affine.var(f"i{kept.index(k)}") if k in kept else Affine.var(f"r{k}") for k in range(x.rank))
    return Reduce("max", tuple((f"r{k}", x.shape[k]) for k in sorted(axes)), Read(0, index))


@vjp_rule("max_axes")
def _max_axes_vjp(b: Any, s: Any, g: Any) -> tuple:
    # the gradient goes to the maximal elements, shared evenly where several are equal (torch.amax's rule)
    (x,) = s.inputs
    axes = tuple(s.a["axes"])
    # (g / count spread back to x's shape, all element-wise, so that fusion makes it one loop with the mask)
    mask = _e(b, s, "equal_mask", x, spread(b, s, s.out, axes, x.type))
    count = _summed(b, s, mask, axes)
    share = _e(b, s, "div", spread(b, s, g, axes, x.type), spread(b, s, count, axes, x.type))
    return (_e(b, s, "mul", mask, share),)


eager_saves("max_axes", which=(0, "out"))  # PyTorch's amax backward reads x and the result


defop("equal_mask", 2, doc="element-wise 1 where x == y, else 0", elementwise=True, differentiable=False,
      cheap_to_recompute=True)(binary_same)  # fmt: skip
numpy_kernel("equal_mask")(lambda xs, a: (xs[0] == xs[1]).astype(xs[0].dtype))
flops_rule("equal_mask")(lambda types, out, a: out.numel)
index_form("equal_mask")(pointwise(lambda a, x, y: ap("select", ap("==", x, y), c(1), c(0))))


@vjp_rule("sum_axes")
def _sum_axes_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    return (spread(b, s, g, tuple(s.a["axes"]), x.type),)
