"""The generic op of tensor functions: out[idx] = body, a scalar index expression over its inputs.

Its NumPy kernel evaluates the body over the whole index grid with broadcasting (reads outside an
input are zero); its gradient is another `indexed` statement derived symbolically (ir/index_grad.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir import index_grad
from deepdsl.ir.indexexpr import IE, Apply, Const, Read, Reduce, Var, reads, renumber, shared_subexpressions
from deepdsl.ir.registry import defop, eager_saves, flops_rule, numpy_kernel, storage, vjp_rule
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import emit_like as _e


@defop("indexed", None)
def indexed(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """attrs: out ((index, size), ...) and body (an IE). Each read must match its input's rank."""
    for r in reads(attrs["body"]):
        if r.input >= len(types):
            raise ShapeError(f"indexed body reads input {r.input}, only {len(types)} given")
        if len(r.index) != types[r.input].rank:
            raise ShapeError(f"indexed body reads {types[r.input]} with {len(r.index)} indices")
    return TensorType(tuple(size for _, size in attrs["out"]))


_UFUNC = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "^": np.power,
    "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "and": np.logical_and, "or": np.logical_or, "not": np.logical_not, "neg": np.negative,
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs, "max": np.maximum, "min": np.minimum,
}  # fmt: skip


def evaluate(e: IE, out: tuple[tuple[str, int], ...], xs: tuple[np.ndarray, ...], dtype: Any) -> np.ndarray:
    """The value of `e` at every point of the grid of `out` (one axis per output index); a subexpression used more
    than once outside the reductions is computed once."""
    top = {name: (i, size) for i, (name, size) in enumerate(out)}
    shared = shared_subexpressions(e)
    done: dict[IE, np.ndarray] = {}

    def go(e: IE, axes: dict[str, tuple[int, int]], ndim: int) -> np.ndarray:
        if axes is not top or e not in shared:
            return compute(e, axes, ndim)
        if e not in done:
            done[e] = compute(e, axes, ndim)
        return done[e]

    def compute(e: IE, axes: dict[str, tuple[int, int]], ndim: int) -> np.ndarray:
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=dtype)
        if isinstance(e, Var):
            return _grid(axes[e.name], ndim)
        if isinstance(e, Read):
            x = xs[e.input]
            idx, ok = [], np.asarray(True)
            for dim, a in zip(x.shape, e.index):
                v = np.asarray(a.const)
                for name, c in a.terms:
                    v = v + c * _grid(axes[name], ndim)
                ok = ok & (v >= 0) & (v < dim)
                idx.append(np.clip(v, 0, dim - 1))
            value = x[tuple(idx)] if idx else x[()]
            return np.where(ok, value, 0).astype(dtype)
        if isinstance(e, Reduce):
            inner = dict(axes)
            for k, (name, size) in enumerate(e.vars):
                inner[name] = (ndim + k, size)
            n2 = ndim + len(e.vars)
            body = go(e.body, inner, n2)
            body = body.reshape(body.shape + (1,) * (n2 - body.ndim))
            shape = tuple(body.shape[i] if i < ndim else e.vars[i - ndim][1] for i in range(n2))
            body = np.broadcast_to(body, shape)
            red = tuple(range(ndim, n2))
            return body.sum(axis=red) if e.kind == "sum" else body.max(axis=red)
        assert isinstance(e, Apply)
        args = [go(a, axes, ndim) for a in e.args]
        if e.fn == "select":
            return np.where(args[0], args[1], args[2]).astype(dtype)
        if e.fn == "rsqrt":
            return 1 / np.sqrt(args[0])
        if e.fn == "sigmoid":
            return 0.5 * (1 + np.tanh(0.5 * args[0]))
        return _UFUNC[e.fn](*args)

    try:
        value = go(e, top, len(out))
    finally:  # go and compute refer to each other, a cycle only the garbage collector frees: let go of the arrays
        done.clear()  # they reach (the inputs, the shared values) now, not at the next collection
        xs = ()
    shape = tuple(size for _, size in out)
    value = value.reshape(value.shape + (1,) * (len(shape) - value.ndim)) if value.ndim < len(shape) else value
    return np.array(np.broadcast_to(value, shape), dtype=dtype, order="C")  # ascontiguousarray makes 0-d 1-d


def _grid(axis: tuple[int, int], ndim: int) -> np.ndarray:
    pos, size = axis
    shape = [1] * ndim
    shape[pos] = size
    return np.arange(size).reshape(shape)


@numpy_kernel("indexed")
def _indexed_np(xs: tuple, a: dict) -> np.ndarray:
    dtype = next((x.dtype for x in xs if x.dtype.kind == "f"), np.float32)
    return evaluate(a["body"], a["out"], xs, dtype)


@flops_rule("indexed")
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    def work(e: IE) -> int:
        if isinstance(e, Apply):
            return 1 + sum(work(x) for x in e.args)
        if isinstance(e, Reduce):
            n = 1
            for _, size in e.vars:
                n *= size
            return n * (1 + work(e.body))
        return 0

    return out.numel * max(1, work(a["body"]))


@vjp_rule("indexed")
def _indexed_vjp(b: Any, s: Any, g: Any) -> tuple:
    inputs = (*s.inputs, g)
    grads = []
    for k, x in enumerate(s.inputs):
        found = index_grad.gradient_body(s.a["body"], s.a["out"], k, x.type.shape, len(s.inputs))
        if found is None:
            grads.append(None)
            continue
        body, out = found
        used = index_grad.used_inputs(body)
        body = renumber(body, {old: new for new, old in enumerate(used)})
        grads.append(_e(b, s, "indexed", *(inputs[i] for i in used), out=out, body=body))
    return tuple(grads)


# a fused statement is an indexed one that the optimiser composed from element-wise ops and reductions
defop("fused", None, doc="element-wise ops and reductions composed into one kernel; attrs out, body, ops",
      differentiable=False)(indexed)  # fmt: skip
numpy_kernel("fused")(_indexed_np)
flops_rule("fused")(_flops)


def apply_epilogue(primary: np.ndarray, extras: tuple[np.ndarray, ...], epilogue: IE) -> np.ndarray:
    """An op's result passed through its fused element-wise epilogue (Read(0) is the result itself)."""
    out = tuple((f"i{k}", n) for k, n in enumerate(primary.shape))
    return evaluate(epilogue, out, (primary, *extras), primary.dtype)


# eager autograd keeps every input of a tensor function (its gradient may read any of them)
eager_saves("indexed", which=("all",))


def _reduces(e: IE) -> bool:
    return isinstance(e, Reduce) or (isinstance(e, Apply) and any(_reduces(a) for a in e.args))


def _body_storage(attrs: dict[str, Any]) -> str:
    """--precision bf16: a body without a reduction is an element-wise chain, stored bf16; one that reduces fp32."""
    body = attrs.get("body")
    return "fp32" if body is None or _reduces(body) else "bf16_out"


storage(_body_storage, "fused", "indexed")
