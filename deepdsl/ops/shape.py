"""Shape ops: reshape (flatten is a view of it) and concat."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from deepdsl.ir.registry import defop, flops_rule, java_call, numpy_kernel, storage, vjp_rule
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import emit_like as _e


@defop("reshape", 1, view=True, cheap_to_recompute=True)
def reshape(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """A view with the same elements in another shape. attrs: shape."""
    (x,) = types
    shape = tuple(attrs["shape"])
    if math.prod(shape) != x.numel:
        raise ShapeError(f"cannot reshape {x} to [{', '.join(map(str, shape))}]")
    return TensorType(shape, x.dtype)


@defop("concat", None)
def concat(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Join along attrs["axis"]; every other dimension must agree."""
    axis = attrs["axis"]
    first = types[0]
    if not 0 <= axis < first.rank:
        raise ShapeError(f"concat: axis {axis} is out of range for {first}")
    for t in types[1:]:
        if t.rank != first.rank:
            raise ShapeError(f"concat: {first} and {t} differ in rank")
        for i, (a, b) in enumerate(zip(first.shape, t.shape)):
            if i != axis and a != b:
                raise ShapeError(f"concat along axis {axis}: {first} and {t} differ in axis {i} ({a} vs {b})")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in types)
    return TensorType(tuple(shape), first.dtype)


@defop("slice", 1)
def slice_(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """x[..., start:stop, ...] along attrs axis (the gradient of concat)."""
    (x,) = types
    axis, start, stop = attrs["axis"], attrs["start"], attrs["stop"]
    if not (0 <= axis < x.rank and 0 <= start < stop <= x.shape[axis]):
        raise ShapeError(f"slice {start}:{stop} along axis {axis} does not fit {x}")
    shape = list(x.shape)
    shape[axis] = stop - start
    return TensorType(tuple(shape), x.dtype)


numpy_kernel("reshape")(lambda xs, a: xs[0].reshape(a["shape"]))
numpy_kernel("concat")(lambda xs, a: np.concatenate(xs, axis=a["axis"]))


@numpy_kernel("slice")
def _slice(xs: tuple, a: dict) -> np.ndarray:
    index = [slice(None)] * xs[0].ndim
    index[a["axis"]] = slice(a["start"], a["stop"])
    return np.ascontiguousarray(xs[0][tuple(index)])


@flops_rule("reshape")
def _no_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 0


@flops_rule("concat", "slice")
def _copy_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return out.numel


@vjp_rule("reshape")
def _reshape_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, "reshape", g, shape=s.inputs[0].type.shape),)


@vjp_rule("concat")
def _concat_vjp(b: Any, s: Any, g: Any) -> tuple:
    axis, start, out = s.a["axis"], 0, []
    for x in s.inputs:
        stop = start + x.type.shape[axis]
        out.append(_e(b, s, "slice", g, axis=axis, start=start, stop=stop))
        start = stop
    return tuple(out)


@vjp_rule("slice")
def _slice_vjp(b: Any, s: Any, g: Any) -> tuple:
    (x,) = s.inputs
    return (_e(b, s, "pad_axis", g, axis=s.a["axis"], start=s.a["start"], size=x.type.shape[s.a["axis"]]),)


@defop("pad_axis", 1, differentiable=False)
def pad_axis(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Zeros of size attrs size along attrs axis with x placed at attrs start (the gradient of slice)."""
    (x,) = types
    shape = list(x.shape)
    shape[attrs["axis"]] = attrs["size"]
    return TensorType(tuple(shape), x.dtype)


@numpy_kernel("pad_axis")
def _pad_axis(xs: tuple, a: dict) -> np.ndarray:
    (x,) = xs
    shape = list(x.shape)
    shape[a["axis"]] = a["size"]
    out = np.zeros(shape, dtype=x.dtype)
    index = [slice(None)] * x.ndim
    index[a["axis"]] = slice(a["start"], a["start"] + x.shape[a["axis"]])
    out[tuple(index)] = x
    return out


flops_rule("pad_axis")(_copy_flops)


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("concat", "Buf[] ins, int axis", cls="CpuShapes")
java_call("slice", "Buf x, int axis, int start, int stop", cls="CpuShapes")
java_call("pad_axis", "Buf x, int axis, int size, int start", cls="CpuShapes")

# --precision bf16: copies store their (first) input's element type
storage("follow", "concat", "slice", "pad_axis")
