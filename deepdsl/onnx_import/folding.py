"""Folding the shape computations exporters write (`x.view(x.size(0), -1)`): Shape, Gather, Unsqueeze, Squeeze,
Cast and Concat computed on constants and known shapes at import time (`fold`), and a Constant node's value."""

from __future__ import annotations

import numpy as np

from deepdsl.onnx_import.reading import DTYPES, require_onnx, tensor_array
from deepdsl.onnx_import.writing import Node

# the shape computations exporters write (`x.view(x.size(0), -1)`): folded, on constants and known shapes only
FOLDED = ("Cast", "Gather", "Shape", "Squeeze", "Unsqueeze")


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
    if not xs or xs[0] is None:
        return None
    x = xs[0]
    if op == "Concat":
        return None if any(v is None for v in xs) else np.concatenate(xs, axis=int(attrs.get("axis", 0)))  # type: ignore
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
    return None
