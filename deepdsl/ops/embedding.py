"""Embedding lookup over integer token ids, and its gradient (a scatter-add into the table).

    embedding(tokens int [..., ], W [V, D]) -> [..., D]      out[..., d] = W[tokens[...], d]
    embedding_backward(tokens, g [..., D]) {vocab=V} -> [V, D]   dW[v, d] = sum of g[..., d] where tokens[...] == v

Both index forms are written as a one-hot reduction (`sum[v] tokens[...] == v ? W[v, d] : 0`), since an index
expression reads only at affine positions: the backends (Java loops, CUDA kernels) write them like any other
index form, so no library kernel is needed. That costs V reads per element instead of one; for the
character-level vocabularies this op is for (tens to a few hundred ids) it is small beside the matrix products
around it. The NumPy kernels are the direct gather and scatter-add (`np.add.at`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.indexexpr import IE, Affine, Const, Read, Reduce, Var
from deepdsl.ir.registry import defop, eager_saves, flops_rule, index_form, numpy_kernel, vjp_rule
from deepdsl.ir.types import DType, ShapeError, TensorType
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._index_forms import ap


def _need_tokens(t: TensorType, what: str) -> None:
    if t.dtype is not DType.I64:
        raise ShapeError(f"{what} expects integer token ids (an `input ... int vocab V`), got float data {t}")


@defop("embedding", 2, doc="rows of the table W [V, D] picked by integer token ids: [...] -> [..., D]")
def _embedding(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    tokens, w = types
    _need_tokens(tokens, "embedding")
    if w.dtype is not DType.F32 or w.rank != 2:
        raise ShapeError(f"embedding: the table must be a float [vocab, dim] tensor, got {w}")
    return TensorType((*tokens.shape, w.shape[1]))


@defop("embedding_backward", 2, differentiable=False)
def _embedding_backward(types: tuple[TensorType, ...], a: dict[str, Any]) -> TensorType:
    """d embedding / d W: the gradient rows summed into the rows of their tokens  (tokens, g) -> [vocab, D]"""
    tokens, g = types
    _need_tokens(tokens, "embedding_backward")
    if g.shape[:-1] != tokens.shape:
        raise ShapeError(f"embedding_backward: gradient {g} does not fit tokens {tokens}")
    return TensorType((int(a["vocab"]), g.shape[-1]))


@numpy_kernel("embedding")
def _embedding_np(xs: tuple, a: dict) -> np.ndarray:
    tokens, w = xs
    return w[tokens]


@numpy_kernel("embedding_backward")
def _embedding_backward_np(xs: tuple, a: dict) -> np.ndarray:
    tokens, g = xs
    d = g.shape[-1]
    out = np.zeros((int(a["vocab"]), d), dtype=g.dtype)
    np.add.at(out, tokens.reshape(-1), g.reshape(-1, d))
    return out


@index_form("embedding")
def _embedding_form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> IE:
    tokens, w = types
    lead = tuple(Affine.var(f"i{k}") for k in range(tokens.rank))
    hit = ap("==", Read(0, lead), Var("v"))
    row = Read(1, (Affine.var("v"), Affine.var(f"i{tokens.rank}")))
    return Reduce("sum", (("v", w.shape[0]),), ap("select", hit, row, Const(0.0)))


@index_form("embedding_backward")
def _embedding_backward_form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> IE:
    tokens, g = types
    rs = tuple((f"r{k}", n) for k, n in enumerate(tokens.shape))
    lead = tuple(Affine.var(v) for v, _ in rs)
    hit = ap("==", Read(0, lead), Var("i0"))
    return Reduce("sum", rs, ap("select", hit, Read(1, (*lead, Affine.var("i1"))), Const(0.0)))


@flops_rule("embedding")
def _embedding_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return out.numel  # one copy per element (the one-hot form's compares are index work)


@flops_rule("embedding_backward")
def _embedding_backward_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return types[1].numel  # one addition per gradient element


@vjp_rule("embedding")
def _embedding_vjp(b: Any, s: Any, g: Any) -> tuple:
    tokens, w = s.inputs
    return (None, _e(b, s, "embedding_backward", tokens, g, vocab=w.type.shape[0]))


eager_saves("embedding", which=(0,))  # PyTorch keeps the indices
