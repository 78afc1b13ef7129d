"""Folding the shape computations exporters write (`x.view(x.size(0), -1)`): Shape, Gather, Unsqueeze, Squeeze,
Cast and Concat computed on constants and known shapes at import time (`fold`), and a Constant node's value."""

from __future__ import annotations

import functools
import math

import numpy as np

from deepdsl.ir.types import MAX_ELEMENTS
from deepdsl.onnx_import.reading import DTYPES, require_onnx, tensor_array
from deepdsl.onnx_import.writing import Node

# the shape computations exporters write (`x.view(x.size(0), -1)`): folded, on constants and known shapes only
FOLDED = ("Cast", "Gather", "Shape", "Squeeze", "Unsqueeze")

# operators with no rule of their own that exporters apply to shapes and constants (a mask's ConstantOfShape,
# Equal and Where, a head size's Mod): folded where every input is known, else refused
FOLD_ONLY = ("ConstantOfShape", "Equal", "Where", "Mod", "Range", "Not", "Less", "Greater", "Neg", "Min",
             "Max", "Floor", "Ceil", "Reciprocal", "ReduceProd", "ScatterND", "CastLike", "GatherND")  # fmt: skip

# every operator `fold` computes on known inputs (those with a rule for computed tensors too)
FOLDABLE = frozenset((*FOLDED, *FOLD_ONLY, "Concat", "Slice", "Expand", "Add", "Sub", "Mul", "Div", "Sqrt", "Pow",
                      "Abs", "Reshape", "Identity", "Transpose"))  # fmt: skip

_ELEMENTWISE = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Equal": np.equal, "Less": np.less,
    "Greater": np.greater, "Min": np.minimum, "Max": np.maximum, "Pow": np.power,
}  # fmt: skip
_UNARY = {"Not": np.logical_not, "Neg": np.negative, "Abs": np.abs, "Floor": np.floor, "Ceil": np.ceil,
          "Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Identity": lambda v: v}  # fmt: skip


def _size(shape: list[int], where: Node) -> list[int]:
    """`shape` of a constant to be made here, refused where it is negative or past MAX_ELEMENTS."""
    if any(d < 0 for d in shape) or math.prod(shape) > MAX_ELEMENTS:
        raise where.refuse(f"it makes a constant of shape {shape[:8]}; at most {MAX_ELEMENTS:,} elements")
    return shape


def numpy_helper_value(attrs: dict, where: Node) -> np.ndarray | None:
    """The value of a Constant node with attributes `attrs`; None for a kind not supported (a sparse tensor)."""
    if "value" in attrs:
        return tensor_array(attrs["value"], f"{where.file}: node '{where.name}' (Constant): its value", require_onnx())
    if len(attrs) == 1 and next(iter(attrs)) in ("value_float", "value_floats", "value_int", "value_ints"):
        key, v = next(iter(attrs.items()))
        return np.asarray(v, dtype=np.float32 if "float" in key else np.int64)
    return None


def fold(
    op: str, attrs: dict, xs: list[np.ndarray | None], shape: tuple[int, ...] | None, where: Node
) -> np.ndarray | None:
    """The value of a shape computation: Shape of a tensor of `shape` (at the imported batch), Gather, Unsqueeze,
    Squeeze, Cast and Concat of constants `xs`; None where an input is not known. What cannot be computed (an index
    out of range, a Cast to a string) is refused at the node `where`."""
    try:
        return _fold(op, attrs, xs, shape, where)
    except (ValueError, IndexError, TypeError) as exc:  # numpy's: shapes that do not concatenate, an axis too far
        raise where.refuse(f"it cannot be computed: {str(exc)[:300]}") from None


def _fold(
    op: str, attrs: dict, xs: list[np.ndarray | None], shape: tuple[int, ...] | None, where: Node
) -> np.ndarray | None:
    if op == "Shape":
        return None if shape is None else np.asarray(shape, np.int64)[int(attrs.get("start", 0)) : attrs.get("end")]
    if op == "ConstantOfShape":
        if not xs or xs[0] is None:
            return None
        value = attrs.get("value")
        fill = tensor_array(value, f"{where.file}: node '{where.name}'", require_onnx()) if value is not None else (
            np.zeros(1, np.float32))  # fmt: skip
        return np.full(_size([int(v) for v in xs[0].reshape(-1)], where), fill.reshape(-1)[0], dtype=fill.dtype)
    if not xs or xs[0] is None:
        return None
    x = xs[0]
    if op in ("Max", "Min"):  # of one input or more (the dynamo exporter's unoptimised max() of an index buffer)
        if any(v is None for v in xs):
            return None
        return functools.reduce(_ELEMENTWISE[op], xs).astype(np.result_type(*xs))
    if op in _ELEMENTWISE or op in ("Div", "Mod", "Where"):
        if len(xs) < (3 if op == "Where" else 2) or any(v is None for v in xs):
            return None
        with np.errstate(all="ignore"):
            if op == "Where":
                return np.where(xs[0], xs[1], xs[2])
            if op == "Div":
                kind = np.result_type(xs[0], xs[1]).kind
                return (np.floor_divide if kind in "iu" else np.divide)(xs[0], xs[1])
            if op == "Mod":
                return (np.fmod if int(attrs.get("fmod", 0)) else np.mod)(xs[0], xs[1])
            return _ELEMENTWISE[op](xs[0], xs[1]).astype(np.result_type(xs[0], xs[1])) if op not in (
                "Equal", "Less", "Greater") else _ELEMENTWISE[op](xs[0], xs[1])  # fmt: skip
    if op in _UNARY:
        with np.errstate(all="ignore"):
            return np.asarray(_UNARY[op](x))
    if op == "Range":
        if len(xs) < 3 or any(v is None for v in xs):
            return None
        start, limit, delta = (v.reshape(-1)[0] for v in xs)  # type: ignore[union-attr]
        if delta == 0 or abs((limit - start) / delta) > MAX_ELEMENTS:
            raise where.refuse(f"a Range from {start} to {limit} by {delta}")
        return np.arange(start, limit, delta, dtype=np.result_type(*xs))
    if op == "ScatterND":  # a mask built by slice assignment (Swin's shifted windows), on constants
        if len(xs) < 3 or any(v is None for v in xs[:3]) or attrs.get("reduction", b"none") not in (b"none", "none"):
            return None
        out, index = np.array(x), xs[1].astype(np.int64)
        k = index.shape[-1]
        if index.dtype.kind not in "iu" or k > out.ndim or xs[2].shape != index.shape[:-1] + out.shape[k:]:
            raise where.refuse(f"indices of shape {list(index.shape)} do not fit data {list(out.shape)}")
        flat = index.reshape(-1, k)
        if flat.size and ((flat < -np.asarray(out.shape[:k])).any() or (flat >= np.asarray(out.shape[:k])).any()):
            raise where.refuse("an index out of range")
        out[tuple(flat.T)] = xs[2].reshape(-1, *out.shape[k:])
        return out
    if op == "ReduceProd":
        return np.asarray(np.prod(x, keepdims=bool(int(attrs.get("keepdims", 1)))))
    if op == "Slice":
        starts, ends = (xs + [None, None])[1:3]
        axes = xs[3] if len(xs) > 3 and xs[3] is not None else None
        steps = xs[4] if len(xs) > 4 and xs[4] is not None else None
        if len(xs) == 1:
            starts, ends, axes = attrs.get("starts"), attrs.get("ends"), attrs.get("axes")
        if starts is None or ends is None:
            return None
        index = [slice(None)] * x.ndim
        axes_l = range(len(np.ravel(starts))) if axes is None else [int(a) for a in np.ravel(axes)]
        steps_l = [1] * len(np.ravel(starts)) if steps is None else [int(v) for v in np.ravel(steps)]
        for a, b, e, st in zip(axes_l, np.ravel(starts), np.ravel(ends), steps_l):
            big = 2**62
            index[a] = slice(int(max(min(b, big), -big)), int(max(min(e, big), -big)), st)
        return x[tuple(index)]
    if op == "Expand":
        if len(xs) < 2 or xs[1] is None:
            return None
        return np.array(x * np.ones(_size([int(v) for v in xs[1].reshape(-1)], where), dtype=x.dtype))
    if op == "Reshape":
        if len(xs) < 2 or xs[1] is None:
            return None
        target = [int(v) for v in xs[1].reshape(-1)]
        target = [x.shape[i] if v == 0 and not int(attrs.get("allowzero", 0)) else v for i, v in enumerate(target)]
        return x.reshape(target)
    if op == "Transpose":
        return np.transpose(x, attrs.get("perm"))
    if op == "Concat":
        return None if any(v is None for v in xs) else np.concatenate(xs, axis=int(attrs.get("axis", 0)))  # type: ignore
    if op == "GatherND":
        return None if len(xs) < 2 or xs[1] is None else _gather_nd(x, xs[1], attrs, where)
    if op == "Gather":
        if len(xs) < 2 or xs[1] is None:
            return None
        axis, index = int(attrs.get("axis", 0)), xs[1]
        if not -x.ndim <= axis < x.ndim:
            raise where.refuse(f"axis={axis} is out of range for a constant of rank {x.ndim}")
        size = x.shape[axis]
        if index.dtype.kind not in "iu" or index.size and not (-size <= index.min() and index.max() < size):
            raise where.refuse(f"indices {index.reshape(-1)[:8].tolist()} out of range for an axis of {size}")
        return np.take(x, index, axis=axis)
    if op in ("Unsqueeze", "Squeeze"):
        axes = attrs["axes"] if "axes" in attrs else xs[1] if len(xs) > 1 else None
        if op == "Squeeze":
            return np.squeeze(x, axis=None if axes is None else tuple(int(v) for v in np.ravel(axes)))
        if axes is None:
            return None
        rank = x.ndim + len(np.ravel(axes))
        for a in sorted(int(v) + (rank if int(v) < 0 else 0) for v in np.ravel(axes)):
            x = np.expand_dims(x, a)
        return x
    if op == "Cast":
        to = int(attrs.get("to", 0))
        if to not in DTYPES:
            from onnx import TensorProto

            kind = TensorProto.DataType.Name(to) if to in TensorProto.DataType.values() else f"type {to}"
            raise where.refuse(f"a Cast to {kind}: deepdsl folds Casts to numbers only")
        return x.astype(np.dtype(DTYPES[to]).newbyteorder("="))
    if op == "CastLike" and xs[1] is not None:  # to the second input's type (its values unused)
        return x.astype(xs[1].dtype)
    return None


def _gather_nd(x: np.ndarray, index: np.ndarray, attrs: dict, where: Node) -> np.ndarray:
    """GatherND of constants (the dynamo exporter's unoptimised relative-position bias of Swin: a parameter table
    read at a constant index), batch_dims 0: the slices of `x` at each row of the index's last axis."""
    if int(attrs.get("batch_dims", 0)):
        raise where.refuse("GatherND with batch_dims: deepdsl folds batch_dims=0 only")
    k = index.shape[-1] if index.ndim else 0
    if index.dtype.kind not in "iu" or not 1 <= k <= x.ndim:
        raise where.refuse(f"indices of shape {list(index.shape)[:8]} into a tensor of rank {x.ndim}")
    _size([*index.shape[:-1], *x.shape[k:]], where)
    rows = index.reshape(-1, k)
    for d in range(k):
        if rows.size and not (-x.shape[d] <= rows[:, d].min() and rows[:, d].max() < x.shape[d]):
            raise where.refuse(f"indices out of range for an axis of {x.shape[d]}")
    return x[tuple(rows[:, d] for d in range(k))].reshape(*index.shape[:-1], *x.shape[k:])
