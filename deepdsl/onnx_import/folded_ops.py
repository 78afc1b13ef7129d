"""Import rules for Constant, Identity and the operators folding.py computes (Shape, Gather, Squeeze, Unsqueeze,
Cast, Where, ...) of constants and known shapes; where such a node reads a computed tensor: a Gather of rows of a
constant table (an `embedding`), a Gather of one position (a class token) or of every position in order (a view),
a Where of a causal mask, a Squeeze or Unsqueeze as a view, a Cast to float."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.folding import fold, numpy_helper_value
from deepdsl.onnx_import.rule_support import positive_axis, signature
from deepdsl.onnx_import.shapes import reshape_any
from deepdsl.onnx_import.writing import Node, num

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def identity(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    c = imp.const(node.input[0])
    if c is not None:
        imp.consts[node.output[0]] = c
    else:
        imp.env[node.output[0]] = imp.tensor(node.input[0], where)


def constant(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    value = numpy_helper_value(attrs, where)
    if value is None:
        raise where.refuse(f"a constant given as {', '.join(attrs) or 'nothing'} is not supported")
    imp.consts[node.output[0]] = value


def folded(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    shape = imp.shape(node.input[0], where) if node.op_type == "Shape" else None
    value = fold(node.op_type, attrs, [imp.const(i) for i in node.input], shape, where)
    if value is None and node.op_type == "Gather" and imp.const(node.input[0]) is not None:
        embedding(imp, node, where, attrs)
        return
    if value is None and node.op_type == "Gather" and imp.const(node.input[0]) is None:
        gather_position(imp, node, where, attrs)
        return
    if value is None and node.op_type == "Where":
        where_mask(imp, node, where)
        return
    if value is None and node.op_type in ("Squeeze", "Unsqueeze") and imp.const(node.input[0]) is None:
        reshape_any(imp, node, where)  # axes of size 1 taken away or put in: a view
        return
    if value is None and node.op_type == "Cast" and imp.const(node.input[0]) is None:
        if int(attrs.get("to", 0)) == 1:  # to float: what a computed tensor is already
            imp.env[node.output[0]] = imp.tensor(node.input[0], where)
            return
    if value is None and node.op_type == "CastLike":
        cast_like(imp, node, where)
        return
    if value is None:
        raise where.refuse(f"deepdsl imports {node.op_type} of constants and shapes only (as exporters compute "
                           "shapes)")  # fmt: skip
    imp.consts[node.output[0]] = np.asarray(value)


def cast_like(imp: Importer, node: Any, where: Node) -> None:
    """CastLike to the type of a computed tensor (PyTorch's dynamo exporter without its optimiser writes one for
    each convolution's zero bias): a constant cast to float32, or a computed tensor as it is, since every computed
    tensor deepdsl imports is float32 (integer token ids are read by embeddings alone, `rule_support.vocabulary`); a
    CastLike to a constant's type is folded before this rule."""
    x = imp.const(node.input[0])
    if x is not None:
        imp.consts[node.output[0]] = x.astype(np.float32)
    else:
        imp.env[node.output[0]] = imp.tensor(node.input[0], where)


def gather_position(imp: Importer, node: Any, where: Node, attrs: dict) -> None:
    """One constant position along an axis of a computed tensor (a class token `x[:, 0]`): a tensor function
    that reads it."""
    shape = imp.shape(node.input[0], where)
    axis = positive_axis(int(attrs.get("axis", 0)), len(shape))
    index = imp.const(node.input[1])
    whole = axis > 0 or shape[0] != imp.n  # along the batch itself it would pick samples: never a view
    in_order = index is not None and index.ndim > 0 and index.size == shape[axis]  # sizes first: no huge arange
    if in_order and whole and np.array_equal(index.reshape(-1), np.arange(shape[axis])):  # type: ignore[union-attr]
        reshape_any(imp, node, where)  # every position in order (PyTorch's as_strided of a contiguous tensor): a view
        return
    if index is None or index.size != 1 or index.ndim != 0:
        raise where.refuse("deepdsl imports a Gather from a computed tensor at one constant position, or at every "
                           "position in order (a view)")  # fmt: skip
    at = int(index.reshape(-1)[0])
    at = at + shape[axis] if at < 0 else at
    if not 0 <= at < shape[axis]:
        raise where.refuse(f"position {at} of axis {axis}")
    idx = [f"i{d}" for d in range(len(shape))]
    reads = ", ".join(str(at) if d == axis else idx[d] for d in range(len(shape)))
    name = imp.names.make(where.base, "gather")
    fn = imp.names.make(f"{name}_fn", "fn")
    outs = ", ".join(idx[d] for d in range(len(shape)) if d != axis)
    imp.tensor_fns += [f"tensor {fn}({signature(len(shape))}) -> [{outs}] = t[{reads}]   # Gather of position {at}", ""]
    imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")


def embedding(imp: Importer, node: Any, where: Node, attrs: dict) -> None:
    """A Gather of rows of a constant table [V, D] by integer token ids (nn.Embedding): an `embedding` layer."""
    table = imp.const(node.input[0])
    assert table is not None
    if int(attrs.get("axis", 0)) != 0 or table.ndim != 2 or node.input[1] not in imp.env:
        raise where.refuse("deepdsl imports a Gather from a constant as rows of a [vocab, dim] table by token ids "
                           "(an embedding)")  # fmt: skip
    v, d = (int(n) for n in table.shape)
    name = imp.layer(node, where, f"embedding({v}, {d})", {"W": table})
    imp.tables.setdefault(name, imp.arrays[f"{name}.W"])  # a head whose weight is this table is tied to it (linear.py)
    imp.bind(node, f"{name}({imp.tensor(node.input[1], where)})", name)


_MASKS = {"<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater, "==": np.equal}


def where_mask(imp: Importer, node: Any, where: Node) -> None:
    """Where(a constant condition, x, a number) whose condition compares the last two axes' indices (a causal mask
    `j <= i`): a tensor function with that condition, as the language writes masked attention. Where(mask, a
    number, x) (`masked_fill(mask == 0, -inf)`, GPT-2's) is the same with the mask negated."""
    cond, x, other = node.input
    c, fill = imp.const(cond), imp.const(other)
    if c is not None and fill is None and imp.const(x) is not None:  # the number first: keep x where the mask is not
        c, fill, x = ~np.asarray(c, bool), imp.const(x), other
    if c is None or fill is None or fill.size != 1 or imp.const(x) is not None:
        raise where.refuse("deepdsl imports a Where of a constant mask, a computed tensor and one number only")
    shape = imp.shape(x, where)
    rank = len(shape)
    if rank < 2:
        raise where.refuse("the mask must be over the last two axes")
    full = np.broadcast_to(np.asarray(c, bool), shape)
    rows, cols = np.arange(shape[-2])[:, None], np.arange(shape[-1])[None, :]
    found = next((sym for sym, f in _MASKS.items() if (full == f(cols, rows)).all()), None)
    if found is None:
        raise where.refuse("its mask is not a comparison of the last two axes' indices (as a causal mask is)")
    v = float(fill.reshape(-1)[0])
    value = "-inf" if v == -np.inf else "inf" if v == np.inf else num(v)
    idx = [f"i{d}" for d in range(rank)]
    name = imp.names.make(where.base, "mask")
    fn = imp.names.make(f"{name}_fn", "fn")
    read = f"t[{', '.join(idx)}]"
    imp.tensor_fns += [f"tensor {fn}({signature(rank)}) -> [{', '.join(idx)}] = {idx[-1]} {found} {idx[-2]} ? {read} : "
                       f"{value}   # Where of a mask", ""]  # fmt: skip
    imp.bind(node, f"{fn}({imp.tensor(x, where)})")
