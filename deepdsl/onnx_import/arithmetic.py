"""Import rules for arithmetic: Add, Sub, Mul and Div (with a constant: a literal, or a tensor function holding it;
of two computed tensors: the language's operators, a [N, C, 1, 1] gate `expand`ed to the other's shape), Sqrt
and Pow."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.rule_support import broadcast_read, dims, module_parameter, signature
from deepdsl.onnx_import.writing import Node, need, num

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


_ARITH = {"Add": ("+", np.add), "Sub": ("-", np.subtract), "Mul": ("*", np.multiply), "Div": ("/", np.divide)}


def arith(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    sym, fold = _ARITH[node.op_type]
    a, b = node.input[0], node.input[1]
    ca, cb = imp.const(a), imp.const(b)
    if ca is not None and cb is not None:
        try:
            with np.errstate(all="ignore"):
                imp.consts[node.output[0]] = fold(ca, cb).astype(np.result_type(ca, cb))
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise where.refuse(f"it cannot be folded: {exc}") from None
        return
    if ca is None and cb is None:
        sa, sb = imp.shape(a, where), imp.shape(b, where)
        if sa != sb and broadcast_binary(imp, node, where, sym):
            return
        if sa != sb:
            raise where.refuse(f"it broadcasts {list(sa)} with {list(sb)}; the language's {sym} needs equal shapes")
        imp.bind(node, f"{imp.tensor(a, where)} {sym} {imp.tensor(b, where)}")
        return
    t, c, left = (b, ca, True) if ca is not None else (a, cb, False)
    assert c is not None
    x, shape = imp.tensor(t, where), imp.shape(t, where)
    try:
        out = tuple(np.broadcast_shapes(shape, c.shape))
        if len(out) != len(shape) or out[:1] != shape[:1]:  # a new axis, or the batch grown: not the input's grid
            raise ValueError
    except ValueError:
        raise where.refuse(f"the constant of shape {list(c.shape)} would broadcast the input {list(shape)}") from None
    if c.size == 0 or not np.issubdtype(c.dtype, np.floating) and not np.issubdtype(c.dtype, np.integer):
        raise where.refuse(f"the constant holds {c.dtype}")
    flat = c.reshape(-1).astype(np.float32)
    # one number: a literal, unless a module's parameter holds it (a fresh ConvNeXt layer scale, 1e-6 throughout)
    named = c.size > 1 and module_parameter(imp, a if left else b, where)
    if np.all(flat == flat[0]) and out == shape and not named:
        try:
            v = num(flat[0])
        except ValueError:
            raise where.refuse(f"the constant {flat[0]} is not finite") from None
        imp.bind(node, f"{v} {sym} {x}" if left else f"{x} {sym} {v}")
        return
    # a constant tensor broadcast over the input: a tensor function with the constant as its parameter; where the
    # constant is larger along an axis of size 1 of the input (the rows of a pooling matrix against a column), the
    # function's result grows along it and reads the input's one position there
    kc = c.reshape(c.shape[len(c.shape) - len(shape) :] if c.ndim > len(shape) else c.shape).astype(np.float32)
    idx = [f"i{d}" for d in range(len(shape))]
    name = imp.names.make(where.base, node.op_type.lower())
    fn = imp.names.make(f"{name}_fn", "fn")
    xk = f"t[{', '.join('0' if n != shape[d] else idx[d] for d, n in enumerate(out))}]"
    kk = broadcast_read("k", kc.shape, len(shape))
    expr = f"{kk} {sym} {xk}" if left else f"{xk} {sym} {kk}"
    imp.tensor_fns += [
        f"tensor {fn}({signature(len(shape))}) -> [{', '.join(idx)}] {{   # {node.op_type} of a constant, broadcast",
        f"  param k[{', '.join(map(str, kc.shape))}] = constant(0)",
        f"  return {expr}",
        "}",
        "",
    ]
    imp.layers.append(f"layer {name} = {fn}")
    imp.store(f"{name}.k", kc, where)
    imp.bind(node, f"{name}({x})", name)


def broadcast_binary(imp: Importer, node: Any, where: Node, sym: str) -> bool:
    """Two computed tensors of one rank where one has size 1 on axes the other has larger (an SE block's
    [N, C, 1, 1] gate): the smaller one `expand`ed to the larger one's shape. False where that is not the case."""
    a, b = node.input[0], node.input[1]
    sa, sb = imp.shape(a, where), imp.shape(b, where)
    if len(sa) != len(sb):
        return False
    try:
        out = tuple(np.broadcast_shapes(sa, sb))
    except ValueError:
        return False
    need(where, "expand")
    xa, xb = imp.tensor(a, where), imp.tensor(b, where)
    if sa != out:
        xa = f"expand({xa}, {dims(imp, out, node.output[0])})"
    if sb != out:
        xb = f"expand({xb}, {dims(imp, out, node.output[0])})"
    imp.bind(node, f"{xa} {sym} {xb}")
    return True


def sqrt(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    imp.bind(node, f"sqrt({imp.tensor(node.input[0], where)})")


def pow_(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    e = imp.const(node.input[1])
    if e is None or e.size != 1:
        raise where.refuse("the exponent must be one constant number")
    x, v = imp.tensor(node.input[0], where), float(e.reshape(-1)[0])
    imp.bind(node, f"{x} * {x}" if v == 2 else f"sqrt({x})" if v == 0.5 else f"{x} ^ {num(v)}")
