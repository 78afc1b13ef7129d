"""Import rules for Gemm and MatMul: a constant weight as a `full` layer (MatMul + Add of a constant vector, as
exporters write a linear layer, is one `full`; on [N, T, D] the rows go through one `full`, viewed back; a weight
that is an embedding's table, a head tied to it: `full(tied=...)`), and MatMul of two computed tensors (attention's
q kᵀ and weights v) as `matmul`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.rule_support import Renamed, dims, per_batch
from deepdsl.onnx_import.writing import Node, call

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def full_layer(imp: Importer, node: Any, where: Node, x: str, w: np.ndarray, b: np.ndarray | None,
               sources: list[str]) -> None:  # fmt: skip
    """`full` with weight `w` [out, in] and optional bias [out], computed from the constants named `sources` (the
    weight's first); a head whose weight is an embedding's table, `full(tied=...)`, with its bias alone."""
    kw = {} if b is not None else {"bias": "false"}
    tok = tied_embedding(imp, w)
    if tok is not None:
        name = imp.layer(node, where, call(where, "full", [], {**kw, "tied": tok}), {} if b is None else {"b": b},
                         sources[1:])  # fmt: skip
        imp.tied.append((name, tok))
        imp.bind(node, f"{name}({x})", name)
        return
    params = {"W": w} if b is None else {"W": w, "b": b}
    name = imp.layer(node, where, call(where, "full", [str(w.shape[0])], kw), params, sources)
    imp.bind(node, f"{name}({x})", name)


def tied_embedding(imp: Importer, w: np.ndarray) -> str | None:
    """The embedding layer imported before whose table [V, D] is, value for value, this weight [out, in] (a head tied
    to it: GPT-2's logits = h @ wte.T), else None; never with --no-share, nor for a table of one value throughout.
    Equal values, not one initialiser: the very same initialiser read transposed (a Gemm with transB=1, as deepdsl
    exports the head) gives them, and so does the copy of the table's transpose that both PyTorch exporters write
    as an initialiser of its own for the head's MatMul; a [V, D] of varying values equal to a table is that table."""
    if not imp.share or w.ndim != 2 or not w.size or np.ptp(w) == 0:
        return None
    w32 = np.asarray(w, np.float32)
    return next((name for name, t in imp.tables.items() if t.shape == w32.shape and np.array_equal(t, w32)), None)


def _bias_vector(c: np.ndarray, m: int) -> np.ndarray | None:
    """`c` as a vector [m] when it broadcasts along the batch only ([m], [1, m] or a scalar), else None."""
    if c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1):
        return None
    try:
        return np.broadcast_to(c, (1, m)).reshape(m).astype(np.float32)
    except ValueError:
        return None


def gemm(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    b = imp.const(node.input[1])
    if b is None:
        raise where.refuse("B must be an initialiser (a constant weight)")
    if int(attrs.get("transA", 0)):
        raise where.refuse("transA=1: the language's `full` takes its input as [batch, features]")
    if len(imp.shape(node.input[0], where)) != 2 or b.ndim != 2:
        raise where.refuse("A and B must be matrices")
    w = b if int(attrs.get("transB", 0)) else b.T
    w = w * np.float32(attrs.get("alpha", 1.0))
    c = imp.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and c is None:
        raise where.refuse("C must be an initialiser (a constant bias)")
    bias = None
    if c is not None:
        bias = _bias_vector(c, w.shape[0])
        if bias is None:
            raise where.refuse(f"C of shape {list(c.shape)} differs between samples; deepdsl's bias is one vector")
        bias = bias * np.float32(attrs.get("beta", 1.0))
    full_layer(imp, node, where, x, w, bias, [i for i in node.input[1:] if i])


def matmul(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    w = imp.const(node.input[1])
    if w is None:
        matmul_computed(imp, node, where)
        return
    shape = imp.shape(node.input[0], where)
    if len(shape) < 2 or w.ndim != 2:
        raise where.refuse("deepdsl imports MatMul of a [batch, ..., features] input by a matrix")
    bias = None
    sources = [node.input[1]]
    users = imp.readers.get(node.output[0], [])
    graph_out = {o.name for o in imp.graph.output}
    if len(users) == 1 and users[0][1].op_type == "Add" and node.output[0] not in graph_out:
        j, add = users[0]  # MatMul + Add of a constant vector, as exporters write a linear layer: one `full`
        other = [i for i in add.input if i != node.output[0]]
        c = imp.const(other[0]) if len(other) == 1 else None
        bias = _bias_vector(c, w.shape[1]) if c is not None else None
        if bias is not None:
            imp.absorbed.add(j)
            node = Renamed(node, add.output[0])
            sources.append(other[0])
    if len(shape) > 2:
        matmul_rows(imp, node, where, x, shape, w.T, bias, sources)
        return
    full_layer(imp, node, where, x, w.T, bias, sources)


def matmul_computed(imp: Importer, node: Any, where: Node) -> None:
    """MatMul of two computed tensors (attention's q kᵀ and weights v): `matmul`, over equal batch axes."""
    sa, sb = imp.shape(node.input[0], where), imp.shape(node.input[1], where)
    if len(sa) < 2 or len(sb) < 2 or (len(sb) > 2 and sa[:-2] != sb[:-2]):
        raise where.refuse(f"it multiplies {list(sa)} by {list(sb)}; deepdsl's matmul takes equal batch axes "
                           "(or a 2-D right operand)")  # fmt: skip
    imp.bind(node, f"matmul({imp.tensor(node.input[0], where)}, {imp.tensor(node.input[1], where)})")


def matmul_rows(imp: Importer, node: Any, where: Node, x: str, shape: tuple, w: np.ndarray, bias: Any,
                sources: list[str]) -> None:  # fmt: skip
    """A constant weight applied to the last axis of a rank > 2 input (a Linear on [N, T, D]): the rows through one
    `full`, viewed back."""
    rows = int(np.prod(shape[:-1]))
    flat = imp.names.make(f"{where.base}_rows", "rows")
    out_name = node.output[0]
    multiples = per_batch(imp)
    if node.input[0] in multiples:  # the rows scale with the batch as the input does
        per = multiples[node.input[0]]
        multiples[f"{out_name}#rows"] = None if per is None else rows // shape[0] * per
    imp.body.append(f"{flat} = reshape({x}, {dims(imp, (rows, shape[-1]), f'{out_name}#rows')})")

    class _Out:  # the `full` writes a temporary; the view back takes the node's output
        output = [f"{out_name}#rows"]
        op_type = node.op_type

    full_layer(imp, _Out, where, flat, w, bias, sources)
    imp.bind(node, f"reshape({imp.env[_Out.output[0]]}, {dims(imp, (*shape[:-1], w.shape[0]), out_name)})")
