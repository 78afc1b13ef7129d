"""A tensor function (`indexed`: out[idx] = body) as standard ONNX operators, for `deepdsl export`.

The body is evaluated over the output's index grid the way the NumPy kernel evaluates it (ops/indexed.evaluate),
each value a tensor that broadcasts to the grid: an index variable or anything computed from indices alone (a
causal mask `j <= i`, a condition `t == 0`) is a constant computed here; a read of an input is the input itself
where it lines up with the grid (`x[b, t, c]`, `pos[t, c]`: a Reshape at most), else a Gather of the flattened
input by constant positions (`x[b, t - 1, c]`, `x[b, 0, c]`), the batch axis kept symbolic when the read passes it
through, and a Where that makes reads outside the input zero (the language's padding); the arithmetic, the
comparisons, `select` and the scalar functions are ONNX's element-wise operators. A reduction over indices
(`sum[k]` / `max[k]` inside the body) evaluates its body over the grid grown by those indices (new last axes),
then ReduceSum / ReduceMax over them.
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
        self.done: dict[tuple, _Val] = {}
        self.ranges: list[tuple[int, int]] = [(0, n) for _, n in self.out]  # (start, size) of each grid axis

    # ---- ONNX nodes and constants ----

    def node(self, op: str, inputs: list[str], shape: tuple[int, ...], boolean: bool = False, **attrs: Any) -> _Val:
        self.k += 1
        name = f"{self.s.out.name}/{op.lower()}{self.k}"
        self.w.node(op, inputs, name, self.s, **attrs)
        return _Val(shape, name=name, boolean=boolean)

    def constant(self, value: np.ndarray, dtype: Any = np.float32) -> str:
        return self.w.const(self.s.layer or "indexed", np.array(value, dtype, order="C"))  # 0-d stays 0-d

    def target(self, shape: tuple[int, ...], want: tuple[int, ...]) -> str:
        """The shape input of an Expand of a value of `shape` to `want` (the same rank): 1 where the value has the axis
        already (ONNX broadcasts it), else the axis's size; where the value grows along the batch axis (the grid's
        first, at the batch's exported size), the model's input's batch at run time (Shape, Gather), so that the
        model runs at any batch, as its symbolic N says (a class token broadcast to the batch)."""
        target = [1 if have == n else n for have, n in zip(shape, want)]
        if not self.grows_batch(shape, want):
            return self.constant(target, np.int64)
        dims = self.node("Shape", [self.w.g.inputs[0].value.name], (len(self.w.g.inputs[0].value.type.shape),))
        batch = self.node("Gather", [dims.name, self.constant([0], np.int64)], (1,), axis=0)  # type: ignore[list-item]
        if len(target) == 1:
            return batch.name  # type: ignore[return-value]
        rest = self.constant(target[1:], np.int64)
        return self.node("Concat", [batch.name, rest], (len(target),), axis=0).name  # type: ignore[list-item, return-value]

    def grows_batch(self, shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
        """Whether a value of `shape` broadcast to `want` grows along the batch axis (the grid's first, of the batch's
        exported size, the model's input's first)."""
        return (self.batch is not None and self.batch > 1 and bool(want) and want[0] == self.batch and shape[0] == 1
                and bool(self.w.g.inputs))  # fmt: skip

    def on_grid(self, v: _Val, want: tuple[int, ...]) -> tuple[str, tuple[int, ...]]:
        """`v` as a float tensor of `want`'s rank, and its shape: a constant broadcast to `want` but along a batch axis
        it does not vary on (kept 1, for `target` to grow at run time)."""
        shape = (1,) * (len(want) - len(v.shape)) + tuple(v.shape)
        if v.const is None:
            return self.tensor(v, False), shape
        at = (shape[0], *want[1:]) if self.grows_batch(shape, want) else want
        return self.constant(np.broadcast_to(np.reshape(v.const, shape), at)), at

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
        start, size = self.ranges[pos]
        shape[pos] = size
        return (start + np.arange(size)).reshape(shape)

    def full(self, pos: int, n: int) -> bool:
        """Whether grid axis `pos` runs over all of an axis of size `n` now."""
        return self.ranges[pos] == (0, n)

    def value(self, e: IE) -> _Val:
        key = (e, tuple(self.ranges))
        if key not in self.done:
            self.done[key] = self._value(e)
        return self.done[key]

    def _value(self, e: IE) -> _Val:
        if isinstance(e, Const):
            return _Val((), const=np.asarray(e.value, np.float64))
        if isinstance(e, Var):
            g = self.grid(e.name)
            return _Val(g.shape, const=g.astype(np.float64))
        if isinstance(e, Read):
            return self.read(e)
        if isinstance(e, Reduce):
            return self.reduce(e)
        assert isinstance(e, Apply)
        if e.fn == "select":  # a condition of indices alone may split the grid: the branches then go by parts
            cond = self.value(e.args[0])
            split = self.pieces(e, cond.const) if cond.const is not None else None
            if split is not None:
                return split
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

    def reduce(self, e: Reduce) -> _Val:
        """`sum[k] body` / `max[k] body`: the body over the grid grown by the reduced indices (new last axes), made
        full along them (a body that does not read k is the same for every k), then ReduceSum / ReduceMax over them."""
        if any(v in self.axis for v, _ in e.vars):
            raise Unsupported(f"the reduced index '{next(v for v, _ in e.vars if v in self.axis)}' shadows another")
        saved = (self.out, self.axis, self.rank, list(self.ranges))
        self.out = (*self.out, *e.vars)
        self.axis = {name: k for k, (name, _) in enumerate(self.out)}
        self.rank = len(self.out)
        self.ranges = [*self.ranges, *((0, n) for _, n in e.vars)]
        try:
            body = self.value(e.body)
            rank, want = self.rank, tuple(size for _, size in self.ranges)
        finally:
            self.out, self.axis, self.rank, self.ranges = saved
        axes = list(range(self.rank, rank))
        shape = (1,) * (rank - len(body.shape)) + tuple(body.shape)
        grown = tuple(want[k] if k in axes else n for k, n in enumerate(shape))
        if body.const is not None:
            c = np.broadcast_to(np.asarray(body.const).reshape(shape), grown)
            return _Val(
                grown[: self.rank], const=c.sum(axis=tuple(axes)) if e.kind == "sum" else c.max(axis=tuple(axes))
            )
        name = self.tensor(body, False)
        if shape != grown:  # Expand keeps an axis where the target says 1: only the reduced axes grow
            target = [want[k] if k in axes and shape[k] == 1 else 1 for k in range(rank)]
            name = self.node("Expand", [name, self.constant(target, np.int64)], grown).name  # type: ignore[assignment]
        op, since = ("ReduceSum", 13) if e.kind == "sum" else ("ReduceMax", 18)  # axes an input from `since`
        out = grown[: self.rank]
        if self.w.opset >= since:
            return self.node(op, [name, self.constant(axes, np.int64)], out, keepdims=0)
        return self.node(op, [name], out, axes=axes, keepdims=0)

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
            if len(set(pos)) == len(pos) and all(self.full(p, n) for p, n in zip(pos, shape)):
                if pos != sorted(pos):  # the axes in another order (`x[b, t, c]` on a grid b, c, t): a Transpose
                    perm = sorted(range(len(pos)), key=pos.__getitem__)
                    shape, pos = tuple(shape[k] for k in perm), sorted(pos)
                    name = self.node("Transpose", [name], shape, perm=perm).name  # type: ignore[assignment]
                full = tuple(shape[pos.index(k)] if k in pos else 1 for k in range(self.rank))
                if pos == list(range(self.rank - len(pos), self.rank)):  # the last axes: ONNX broadcasts it
                    return _Val(tuple(shape), name=name)
                keep = [0 if k == 0 and pos[0] == 0 else full[k] for k in range(self.rank)]  # 0: the batch as is
                return self.node("Reshape", [name, self.constant(keep, np.int64)], full)
        # a shifted window (`x[b, t - 1, c]` over part of the grid): a Slice, then lined up
        shifted = [(a.terms[0][0], a.const) if len(a.terms) == 1 and a.terms[0][1] == 1 else None for a in r.index]
        if all(v is not None and v[0] in self.axis for v in shifted):
            pos = [self.axis[v[0]] for v in shifted]  # type: ignore[index]
            spans = [(self.ranges[p][0] + v[1], self.ranges[p][1]) for p, v in zip(pos, shifted)]  # type: ignore[index]
            if pos == list(range(self.rank - len(pos), self.rank)) and pos == sorted(set(pos)) and all(
                    0 <= lo and lo + size <= n for (lo, size), n in zip(spans, shape)):  # fmt: skip
                cut = [k for k, ((lo, size), n) in enumerate(zip(spans, shape)) if (lo, size) != (0, n)]
                if not cut:  # the whole input, lined up with the grid's last axes
                    return _Val(tuple(shape), name=name)
                if 0 not in cut:
                    starts = self.constant([spans[k][0] for k in cut], np.int64)
                    ends = self.constant([spans[k][0] + spans[k][1] for k in cut], np.int64)
                    got = tuple(size for _, size in spans)
                    return self.node("Slice", [name, starts, ends, self.constant(cut, np.int64)], got)
        # one position on some axes (`x[b, 0, c]`, a class token), lined up on the others: a Gather per position
        fixed = [k for k, a in enumerate(r.index) if not a.terms]
        if fixed and all(0 <= r.index[k].const < shape[k] for k in fixed):
            rest = [k for k in range(len(shape)) if k not in fixed]
            pos = [self.axis.get(plain[k] or "", -1) for k in rest]
            if all(p >= 0 for p in pos) and pos == sorted(set(pos)) and pos == list(range(len(pos))):
                if all(self.full(p, shape[k]) for p, k in zip(pos, rest)) and len(pos) == self.rank:
                    for k in reversed(fixed):  # the later axes first: the earlier ones keep their numbers
                        idx = self.constant(np.asarray(r.index[k].const), np.int64)
                        name = self.node("Gather", [name, idx], (), axis=k).name  # type: ignore[assignment]
                    return _Val(tuple(shape[k] for k in rest), name=name)
        # anything else: a Gather of the flattened input by constant positions (the batch passed through if it is)
        first = r.index[0].plain_var
        passes = (self.batch is not None and first == self.out[0][0] and self.full(0, shape[0])
                  and shape[0] == self.batch and all(first not in dict(a.terms) for a in r.index[1:]))  # fmt: skip
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

    def pieces(self, e: Apply, cond: np.ndarray) -> _Val | None:
        """`c ? a : b` with a condition of one grid axis alone that holds on runs of it (`t == 0`): each branch
        over its run of that axis, Concat along it; None where the condition is not of that kind."""
        axes = [k for k in range(len(cond.shape)) if cond.shape[k] > 1]
        rank = len(cond.shape)
        if len(axes) != 1 or rank != self.rank:
            return None
        a = axes[0]
        flags = np.asarray(cond != 0).reshape(-1)
        runs: list[tuple[int, int, bool]] = []
        for j, f in enumerate(flags):
            if runs and runs[-1][2] == bool(f):
                runs[-1] = (runs[-1][0], j + 1, bool(f))
            else:
                runs.append((j, j + 1, bool(f)))
        if len(runs) < 2 or len(runs) > 4:
            return None
        saved = self.ranges[a]
        parts = []
        try:
            for lo, hi, which in runs:
                self.ranges[a] = (saved[0] + lo, hi - lo)
                v = self.value(e.args[1] if which else e.args[2])
                want = tuple(size for _, size in self.ranges)
                name, shape = self.on_grid(v, want)
                if shape != want:
                    name = self.node("Expand", [name, self.target(shape, want)], want).name  # type: ignore[assignment]
                parts.append(name)
        finally:
            self.ranges[a] = saved
        return self.node("Concat", parts, tuple(size for _, size in self.ranges), axis=a)

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
    name, shape = low.on_grid(v, want)
    if shape != want:  # Expand to the grid, 1 where the value has the axis already (the batch stays symbolic)
        w.node("Expand", [name, low.target(shape, want)], out, s)
    elif low.k and w.nodes[-1].output[0] == name:  # the last node made it: it writes the result's name
        w.nodes[-1].output[0] = out
    else:
        w.node("Identity", [name], out, s)
