"""Shape inference at a fixed batch: ONNX's own over the model's skeleton, again and again with the shape
computations exporters write (Shape, Gather, Concat, ...) folded into constants until none is left, so that a
Reshape to a computed shape has one (`infer_shapes`); the importer's, and `rule_support.per_batch`'s at a second
batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.onnx_import.folding import FOLDABLE, fold, numpy_helper_value
from deepdsl.onnx_import.reading import DTYPES, skeleton

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def infer_shapes(imp: Importer, inputs: set[str], n: int) -> tuple[dict[str, tuple[int, ...]], dict[str, np.ndarray]]:
    """Every value's shape with the batch fixed at `n`: ONNX shape inference over the model's skeleton, again
    with the shape computations (Shape, Gather, Concat, ...) folded into constants until none is left, so
    that a Reshape to a computed shape has one; and those folded constants."""
    onnx = imp.onnx
    from onnx import numpy_helper

    folded: dict[str, np.ndarray] = {}
    for _ in range(len(imp.graph.node) + 1):
        m = skeleton(imp.model)
        del m.graph.value_info[:]
        for vi in (*m.graph.input, *m.graph.output):
            if vi.name in inputs:
                vi.type.tensor_type.shape.dim[0].dim_value = n
            elif vi.name not in imp.consts and vi.type.tensor_type.shape.dim:
                vi.type.tensor_type.shape.dim[0].Clear()  # the output's batch follows from the input's
        m.graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in folded.items())
        try:
            m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        except Exception as exc:  # noqa: BLE001 — onnx raises its own error kinds
            raise DslProgramError(f"'{imp.file}': ONNX shape inference fails at batch {n}: {exc}") from None
        shapes: dict[str, tuple[int, ...]] = {}
        types = {vi.name: vi.type.tensor_type.elem_type for vi in (*m.graph.value_info, *m.graph.input)}
        for vi in (*m.graph.value_info, *m.graph.input, *m.graph.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
        for name, a in (*imp.consts.items(), *folded.items()):
            shapes[name] = a.shape
        more = _fold_shapes(imp, shapes, folded, types)
        if not more:
            return shapes, folded
        folded.update(more)
    raise AssertionError("shape folding did not converge")


def _fold_shapes(imp: Importer, shapes: dict[str, tuple[int, ...]], folded: dict[str, np.ndarray], types: dict) -> dict:
    """The shape computations that can be folded now and were not yet, by output name (a CastLike of a constant
    to a computed tensor's type, from shape inference, as a Cast: patterns read the dynamo exporter's)."""
    known = {**imp.consts, **folded}
    more: dict[str, np.ndarray] = {}
    for k, node in enumerate(imp.graph.node):
        if node.op_type not in FOLDABLE | {"Constant"} or not node.output or node.output[0] in known:
            continue
        where = imp._where(k, node)
        attrs = imp._attrs(node, where)
        op = node.op_type
        if op == "CastLike" and len(node.input) > 1 and types.get(node.input[1]) in DTYPES:
            op, attrs = "Cast", {"to": types[node.input[1]]}
        if op == "Constant":
            value = numpy_helper_value(attrs, where)
        else:
            shape = shapes.get(node.input[0]) if node.input else None
            value = fold(op, attrs, [known.get(i) for i in node.input[: 1 if op == "Cast" else None]], shape, where)
        if value is not None:
            known[node.output[0]] = more[node.output[0]] = np.asarray(value)
    return more
