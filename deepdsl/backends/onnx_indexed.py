"""A tensor function (`indexed`: out[idx] = body) as standard ONNX operators, for `deepdsl export`.

The body is evaluated over the output's index grid the way the NumPy kernel evaluates it (ops/indexed.evaluate),
each value a tensor that broadcasts to the grid: an index variable or anything computed from indices alone (a
causal mask `j <= i`, a condition `t == 0`) is a constant computed here; a read of an input is the input itself
where it lines up with the grid (`x[b, t, c]`, `pos[t, c]`: a Reshape at most), else a Gather of the flattened
input by constant positions (`x[b, t - 1, c]`, `x[b, 0, c]`), the batch axis kept symbolic when the read passes it
through, and a Where that makes reads outside the input zero (the language's padding); the arithmetic, the
comparisons, `select` and the scalar functions are ONNX's element-wise operators. A reduction over an index
(`sum`/`max` inside the body) has no decomposition here: it is refused with that reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepdsl.ir import Stmt
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, Reduce, Var
from deepdsl.ir.types import DType

_ARITH = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div", "^": "Pow", "max": "Max", "min": "Min"}
_COMPARE = {"==": "Equal", "<": "Less", "<=": "LessOrEqual", ">": "Greater", ">=": "GreaterOrEqual"}
_UNARY = {"neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "abs": "Abs", "sigmoid": "Sigmoid"}
_NP = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide, "^": np.power, "max": np.maximum,
    "min": np.minimum, "==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
    ">=": np.greater_equal, "and": np.logical_and, "or": np.logical_or, "not": np.logical_not, "neg": np.negative,
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "abs": np.abs,
    "rsqrt": lambda v: 1 / np.sqrt(v), "sigmoid": lambda v: 0.5 * (1 + np.tanh(0.5 * v)),
    "select": lambda c, a, b: np.where(c, a, b),
}  # fmt: skip


class Unsupported(Exception):
    """The body holds something with no decomposition here (the message says what)."""


@dataclass(frozen=True)
class _Val:
    """A value over the grid: a constant (`const`) or an ONNX tensor (`name`) of static `shape` (rank of the grid,
    or 0), the batch axis at its exported size; `boolean` for a comparison's result."""

    shape: tuple[int, ...]
    name: str | None = None
    const: np.ndarray | None = None
    boolean: bool = False


class _Lowering:
    def __init__(self, w: Any, s: Stmt, batch: int | None):
        self.w, self.s, self.batch = w, s, batch
        self.out = tuple(s.a["out"])
        self.rank = len(self.out)
        self.axis = {name: k for k, (name, _) in enumerate(self.out)}
        self.k = 0
        self.done: dict[IE, _Val] = {}

    # ---- ONNX nodes and constants ----

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], boolean: bool = False, **attrs: Any) -> _Val:
        self.k += 1
        name = f"{self.s.out.name}/{op.lower()}{self.k}"
        self.w.node(op, inputs, name, self.s, **attrs)
        return _Val(shape, name=name, boolean=boolean)

    def constant(self, value: np.ndarray, dtype: Any = np.float32) -> str:
        return self.w.const(self.s.layer or "indexed", np.ascontiguousarray(np.asarray(value, dtype)))

    def tensor(self, v: _Val, boolean: bool) -> str:
        """`v` as an ONNX tensor name of float type (or bool where `boolean`), cast where it is the other."""
        if v.const is not None:
            return self.constant(v.const != 0 if boolean else v.const, np.bool_ if boolean else np.float32)
        assert v.name is not None
        if v.boolean == boolean:
            return v.name
        to = self.w.onnx.TensorProto.BOOL if boolean else self.w.onnx.TensorProto.FLOAT
        return self.node("Cast", [v.name], v.shape, boolean, to=to).name  # type: ignore[return-value]

    # ---- the body ----

    def grid(self, var: str) -> np.ndarray:
        if var not in self.axis:
            raise Unsupported(f"the index '{var}' is not one of the output's")
        pos = self.axis[var]
        shape = [1] * self.rank
        shape[pos] = self.out[pos][1]
        return np.arange(self.out[pos][1]).reshape(shape)

    def value(self, e: IE) -> _Val:
        if e not in self.done:
            self.done[e] = self._value(e)
        return self.done[e]

    def _value(self, e: IE) -> _Val:
        if isinstance(e, Const):
            return _Val((), const=np.asarray(e.value, np.float64))
        if isinstance(e, Var):
            g = self.grid(e.name)
            return _Val(g.shape, const=g.astype(np.float64))
        if isinstance(e, Read):
            return self.read(e)
        if isinstance(e, Reduce):
            raise Unsupported(f"a {e.kind} over an index inside the body has no decomposition into ONNX operators")
        assert isinstance(e, Apply)
        args = [self.value(a) for a in e.args]
        if all(a.const is not None for a in args) and e.fn in _NP:
            with np.errstate(all="ignore"):
                c = np.asarray(_NP[e.fn](*[a.const for a in args]))
            return _Val(c.shape, const=c)
        shape = tuple(np.broadcast_shapes(*(a.shape for a in args)))
        if e.fn in _ARITH:
            return self.node(_ARITH[e.fn], [self.tensor(a, False) for a in args], shape)
        if e.fn in _COMPARE:
            return self.node(_COMPARE[e.fn], [self.tensor(a, False) for a in args], shape, True)
        if e.fn == "!=":
            eq = self.node("Equal", [self.tensor(a, False) for a in args], shape, True)
            return self.node("Not", [eq.name], shape, True)  # type: ignore[list-item]
        if e.fn in ("and", "or"):
            return self.node(e.fn.capitalize(), [self.tensor(a, True) for a in args], shape, True)
        if e.fn == "not":
            return self.node("Not", [self.tensor(args[0], True)], shape, True)
        if e.fn == "select":
            c, a, b = args
            return self.node("Where", [self.tensor(c, True), self.tensor(a, False), self.tensor(b, False)], shape)
        if e.fn == "rsqrt":
            root = self.node("Sqrt", [self.tensor(args[0], False)], shape)
            return self.node("Reciprocal", [root.name], shape)  # type: ignore[list-item]
        if e.fn in _UNARY:
            return self.node(_UNARY[e.fn], [self.tensor(args[0], False)], shape)
        raise Unsupported(f"the function '{e.fn}' has no ONNX operator here")

    def read(self, r: Read) -> _Val:
        x = self.s.inputs[r.input]
        shape = x.type.shape
        name = x.name
        if x.type.dtype is not DType.F32:
            name = self.node("Cast", [name], shape, to=self.w.onnx.TensorProto.FLOAT).name  # type: ignore[assignment]
        if not r.index:  # a scalar
            return _Val((), name=name)
        # lined up: each index one variable of the grid, in the grid's order, over the input's whole axis
        plain = [a.plain_var for a in r.index]
        if all(v in self.axis for v in plain):
            pos = [self.axis[v] for v in plain]  # type: ignore[index]
            if pos == sorted(set(pos)) and all(self.out[p][1] == n for p, n in zip(pos, shape)):
                full = tuple(shape[pos.index(k)] if k in pos else 1 for k in range(self.rank))
                if pos == list(range(self.rank - len(pos), self.rank)):  # the last axes: ONNX broadcasts it
                    return _Val(tuple(shape), name=name)
                keep = [0 if k == 0 and pos[0] == 0 else full[k] for k in range(self.rank)]  # 0: the batch as is
                return self.node("Reshape", [name, self.constant(keep, np.int64)], full)
        # anything else: a Gather of the flattened input by constant positions (the batch passed through if it is)
        first = r.index[0].plain_var
        passes = (self.batch is not None and first == self.out[0][0] and self.out[0][1] == shape[0] == self.batch
                  and all(first not in dict(a.terms) for a in r.index[1:]))  # fmt: skip
        axes = r.index[1:] if passes else r.index
        dims = shape[1:] if passes else shape
        flat, ok = np.zeros([1] * self.rank, np.int64), np.ones([1] * self.rank, bool)
        stride = math.prod(dims)
        for a, n in zip(axes, dims):
            stride //= n
            v = self.affine(a)
            ok = ok & (v >= 0) & (v < n)
            flat = flat + np.clip(v, 0, n - 1) * stride
        flat, ok = np.broadcast_arrays(flat, ok)
        if passes:  # the grid less its batch axis
            flat, ok = flat[0], ok[0]
        rows = self.node("Reshape", [name, self.constant([0, -1] if passes else [-1], np.int64)],
                         (shape[0], math.prod(dims)) if passes else (math.prod(dims),))  # fmt: skip
        got_shape = (shape[0], *flat.shape) if passes else flat.shape
        got = self.node("Gather", [rows.name, self.constant(flat, np.int64)], got_shape, axis=1 if passes else 0)  # type: ignore[list-item]
        if ok.all():
            return got
        return self.node("Where", [self.constant(ok, np.bool_), got.name, self.constant(0.0)], got_shape)  # type: ignore[list-item]

    def affine(self, a: Affine) -> np.ndarray:
        v = np.full([1] * self.rank, a.const, np.int64)
        for var, c in a.terms:
            v = v + c * self.grid(var)
        return v


def lower_indexed(w: Any, s: Stmt, out: str, batch: int | None) -> None:
    """Write the nodes of tensor function `s` with its result named `out`; raises Unsupported (with the reason)."""
    low = _Lowering(w, s, batch)
    v = low.value(s.a["body"])
    want = tuple(n for _, n in low.out)
    if v.const is not None:
        value = np.broadcast_to(v.const, want).astype(np.float32)
        w.node("Identity", [low.constant(value)], out, s)
        return
    name = low.tensor(v, False)
    shape = (1,) * (len(want) - len(v.shape)) + tuple(v.shape)
    if shape != want:  # Expand to the grid, 1 where the value has the axis already (the batch stays symbolic)
        target = [1 if have == n else n for have, n in zip(shape, want)]
        w.node("Expand", [name, low.constant(target, np.int64)], out, s)
    elif low.k and w.nodes[-1].output[0] == name:  # the last node made it: it writes the result's name
        w.nodes[-1].output[0] = out
    else:
        w.node("Identity", [name], out, s)
