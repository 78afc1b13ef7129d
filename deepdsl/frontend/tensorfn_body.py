"""One definition of a `tensor` function (a local tensor or the result) lowered to one `indexed` statement.

The body becomes a scalar index expression (`ir.indexexpr`) over the statement's inputs: names of the signature's
sizes and of consts read as numbers, every access an affine index (a divided index `x[h / 2]` a sum over its
quotient, so that every read stays affine). The range of each index variable is given explicitly (`i: H - K + 1`)
or read off the plain accesses that use it (`x[n, d]` gives d the size of x's second dimension).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deepdsl.errors import (
    DslArgumentError,
    DslNameError,
    DslProgramError,
    DslShapeError,
    DslTypeError,
    Note,
    Span,
    did_you_mean,
)
from deepdsl.frontend import ast
from deepdsl.frontend.values import Env, TensorVal, describe
from deepdsl.ir import indexexpr as ie

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


@dataclass
class _Stmt:
    """One indexed statement being lowered: its inputs, binders and the readings of each index."""

    tensors: dict[str, TensorVal]
    inputs: list[TensorVal] = field(default_factory=list)
    readings: dict[str, list[tuple[int, Span, str]]] = field(default_factory=dict)
    binders: dict[str, str] = field(default_factory=dict)  # source name -> unique name
    used: set[str] = field(default_factory=set)
    sizes: dict[str, int] = field(default_factory=dict)  # reduction variable -> its range
    # q = ⌊numerator / k⌋ of an index `a / k` or `a % k`: (q, numerator, k, the divisor's position); see _quotients
    quotients: list[tuple[str, ie.Affine, int, Span]] = field(default_factory=list)
    access_start: int = 0  # the first quotient of the access being converted (one access shares equal ones)

    def quotient(self, numerator: ie.Affine, k: int, span: Span) -> str:
        for name, num, kk, _ in self.quotients[self.access_start :]:
            if (num, kk) == (numerator, k):
                return name
        name = f"q{len(self.quotients)}"
        while name in self.used:
            name += "_"
        self.used.add(name)
        self.quotients.append((name, numerator, k, span))
        return name

    def input_index(self, name: str) -> int:
        t = self.tensors[name]
        for k, existing in enumerate(self.inputs):
            if existing.value == t.value:
                return k
        self.inputs.append(t)
        return len(self.inputs) - 1

    def bind(self, name: str) -> str:
        unique, k = name, 1
        while unique in self.used:
            k += 1
            unique = f"{name}_{k}"
        self.used.add(unique)
        self.binders[name] = unique
        return unique


def lower(
    el: Elaborator, env: Env, tensors: dict[str, TensorVal], outs: tuple[ast.IndexRange, ...], body: ast.IExpr,
    path: str, what: str, span: Span,
) -> TensorVal:  # fmt: skip
    st = _Stmt(tensors)
    explicit: dict[str, tuple[int, Span]] = {}
    names = []
    for r in outs:
        if r.name in st.binders:
            raise DslNameError(f"index '{r.name}' appears twice", r.span)
        if r.name in tensors:
            raise DslNameError(f"'{r.name}' names a tensor and cannot be an index", r.span)
        unique = st.bind(r.name)
        names.append((unique, r))
        if r.size is not None:
            explicit[unique] = (el.eval_int(r.size, env, "an index range", low=1), r.span)
    expr = _convert(el, env, st, body, explicit, dict(st.binders))
    out = tuple((unique, _range(st, unique, r.name, explicit, r.span)) for unique, r in names)
    expr = _fill_ranges(expr, st, explicit)
    if st.quotients:
        expr = _quotients(expr, st, dict(out))
    return el.emit("indexed", tuple(st.inputs), span, path, what, out=out, body=expr)


def _range(st: _Stmt, unique: str, name: str, explicit: dict[str, tuple[int, Span]], span: Span) -> int:
    if unique in explicit:
        return explicit[unique][0]
    readings = st.readings.get(unique, [])
    if not readings:
        raise DslShapeError(
            f"cannot tell the range of index '{name}': it is never used plainly in an access like x[..., {name}, ...]",
            span, hint=f"give its range where it is bound, e.g. `{name}: 3` in the signature's output or in sum[...]",
        )  # fmt: skip
    size, first_span, first = readings[0]
    for other, ospan, tname in readings[1:]:
        if other != size:
            raise DslShapeError(
                f"index '{name}' ranges over {size} in {first} but over {other} in {tname}", ospan,
                notes=[Note(f"{first} reads it here", first_span)],
            )  # fmt: skip
    return size


def _fill_ranges(e: ie.IE, st: _Stmt, explicit: dict[str, tuple[int, Span]]) -> ie.IE:
    if isinstance(e, ie.Reduce):
        return ie.Reduce(e.kind, tuple((v, st.sizes[v]) for v, _ in e.vars), _fill_ranges(e.body, st, explicit))
    if isinstance(e, ie.Apply):
        return ie.Apply(e.fn, tuple(_fill_ranges(a, st, explicit) for a in e.args))
    return e


def _quotients(e: ie.IE, st: _Stmt, out: dict[str, int]) -> ie.IE:
    """Every read at an index holding a quotient q = ⌊a / k⌋ (of `a / k` or `a % k` = a − k·q) as a sum over q:
    `x[..., a / k, ...]` is `sum[q] (k·q <= a and a < k·q + k) ? x[..., q, ...] : 0`. Exactly one q meets the
    condition (or none in range: the read is 0, as a read outside x is), so this is exact, and every index stays
    affine (what the gradients, fusion and kernels rely on); the price is a sum over q's range per read. q runs
    over the values ⌊a / k⌋ takes, shifted to start at 0, and clipped to the axis where q is the whole index."""
    from deepdsl.ir.index_grad import affine_value, substitute

    info = {q: (num, k) for q, num, k, _ in st.quotients}

    def wrap(r: ie.Read, ranges: dict[str, int]) -> ie.IE:
        used = [q for q in info if any(q in dict(a.terms) for a in r.index)]
        if not used:
            return r
        pending = {q: info[q][0] for q in used}
        body: ie.IE = r
        conds: list[ie.IE] = []
        vars_ = []
        ranges = dict(ranges)
        for q in used:
            num, k = pending[q], info[q][1]
            lo, hi = num.bounds(ranges)
            first, last = lo // k, hi // k
            assert isinstance(body, ie.Read)
            position = next((j for j, a in enumerate(body.index) if a == ie.Affine.var(q)), None)
            if position is not None:  # q is the index itself: only q inside the axis reads anything
                first, last = max(first, 0), min(last, st.inputs[r.input].shape[position] - 1)
            if last < first:
                return ie.Const(0.0)
            shifted = ie.Affine(((q, 1),), first)
            body = substitute(body, q, shifted)
            pending = {p: _shift(a, q, first) for p, a in pending.items()}
            kq = affine_value(ie.affine_scale(shifted, k))
            value = affine_value(num)
            above = ie.Apply("<", (value, ie.Apply("+", (kq, ie.Const(float(k))))))
            conds.append(ie.Apply("and", (ie.Apply("<=", (kq, value)), above)))
            vars_.append((q, last - first + 1))
            ranges[q] = last - first + 1
        cond = conds[0]
        for c in conds[1:]:
            cond = ie.Apply("and", (cond, c))
        return ie.Reduce("sum", tuple(vars_), ie.Apply("select", (cond, body, ie.Const(0.0))))

    def go(e: ie.IE, ranges: dict[str, int]) -> ie.IE:
        if isinstance(e, ie.Read):
            return wrap(e, ranges)
        if isinstance(e, ie.Apply):
            return ie.Apply(e.fn, tuple(go(a, ranges) for a in e.args))
        if isinstance(e, ie.Reduce):
            return ie.Reduce(e.kind, e.vars, go(e.body, ranges | dict(e.vars)))
        return e

    return go(e, dict(out))


def _shift(a: ie.Affine, var: str, by: int) -> ie.Affine:
    """`a` with `var` replaced by `var + by`."""
    c = dict(a.terms).get(var, 0)
    return ie.Affine(a.terms, a.const + c * by)


def _convert(
    el: Elaborator, env: Env, st: _Stmt, e: ast.IExpr, explicit: dict[str, tuple[int, Span]], scope: dict[str, str]
) -> ie.IE:
    def go(e: ast.IExpr, scope: dict[str, str]) -> ie.IE:
        if isinstance(e, ast.INum):
            return ie.Const(float(e.value))
        if isinstance(e, ast.IName):
            if e.name in scope:
                return ie.Var(scope[e.name])
            return ie.Const(float(_scalar(el, env, st, e.name, e.span, scope)))
        if isinstance(e, ast.IAccess):
            if e.tensor not in st.tensors:
                raise DslNameError(
                    f"unknown tensor '{e.tensor}'", e.span, hint=did_you_mean(e.tensor, list(st.tensors))
                )
            t = st.tensors[e.tensor]
            if len(e.indices) != len(t.shape):
                raise DslShapeError(
                    f"'{e.tensor}' has rank {len(t.shape)} ({t.value.type}) but is read with {len(e.indices)} indices",
                    e.span,
                )
            st.access_start = len(st.quotients)
            index = tuple(_affine(el, env, st, i, scope) for i in e.indices)
            for axis, a in enumerate(index):
                if a.plain_var is not None:
                    st.readings.setdefault(a.plain_var, []).append((t.shape[axis], e.span, f"{e.tensor}[...]"))
            return ie.Read(st.input_index(e.tensor), index)
        if isinstance(e, ast.ICall):
            arity = ie.FUNCTIONS.get(e.func)
            if arity is None:
                raise DslNameError(
                    f"unknown scalar function '{e.func}'", e.span, hint=did_you_mean(e.func, list(ie.FUNCTIONS))
                    or f"the functions are: {', '.join(ie.FUNCTIONS)}",
                )  # fmt: skip
            if len(e.args) != arity:
                raise DslArgumentError(f"{e.func} takes {arity} argument(s), got {len(e.args)}", e.span)
            return ie.Apply(e.func, tuple(go(a, scope) for a in e.args))
        if isinstance(e, ast.IUnary):
            return ie.Apply("neg" if e.op == "-" else "not", (go(e.operand, scope),))
        if isinstance(e, ast.IBinary):
            if e.op == "%":
                raise DslTypeError("'%' is not a scalar operator in tensor bodies", e.span)
            left, right = go(e.left, scope), go(e.right, scope)
            if e.op == "/" and isinstance(right, ie.Const) and right.value == 0:
                raise DslProgramError("division by zero in a tensor body", e.right.span)
            return ie.Apply(e.op, (left, right))
        if isinstance(e, ast.ICond):
            return ie.Apply("select", (go(e.cond, scope), go(e.then, scope), go(e.other, scope)))
        if isinstance(e, ast.IReduce):
            inner = dict(scope)
            bound = []
            for r in e.indices:
                if r.name in st.tensors:
                    raise DslNameError(f"'{r.name}' names a tensor and cannot be an index", r.span)
                unique = st.bind(r.name)
                inner[r.name] = unique
                if r.size is not None:
                    explicit[unique] = (el.eval_int(r.size, env, "an index range", low=1), r.span)
                bound.append((unique, r))
            body = go(e.body, inner)
            for unique, r in bound:
                st.sizes[unique] = _range(st, unique, r.name, explicit, r.span)
            return ie.Reduce(e.kind, tuple((u, 0) for u, _ in bound), body)
        raise AssertionError(e)

    return go(e, scope)


def _scalar(el: Elaborator, env: Env, st: _Stmt, name: str, span: Span, scope: dict[str, str]) -> float:
    if name in st.tensors:
        raise DslTypeError(f"'{name}' is a tensor; read an element with {name}[...]", span)
    try:
        v = env.lookup(name)
    except KeyError:
        if name == "inf":  # a masked score: `j <= i ? s[b, i, j] : -inf`
            return math.inf
        known = list(scope) + list(st.tensors) + [k for k, v in env.values.items() if isinstance(v, int)]
        raise DslNameError(f"unknown name '{name}' in a tensor body", span, hint=did_you_mean(name, known)) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DslTypeError(f"'{name}' is {describe(v)}, not a number", span)
    return v


def _affine(el: Elaborator, env: Env, st: _Stmt, e: ast.IExpr, scope: dict[str, str]) -> ie.Affine:
    def bad() -> DslTypeError:
        return DslTypeError(
            "an index must be affine in the index variables (like i + kh, 2 * i - 1 or a constant), or one divided "
            "by an integer constant (h / 2, h % 2)",
            e.span,
        )

    if isinstance(e, ast.INum):
        if not e.is_int:
            raise bad()
        return ie.Affine((), int(e.value))
    if isinstance(e, ast.IName):
        if e.name in scope:
            return ie.Affine.var(scope[e.name])
        v = _scalar(el, env, st, e.name, e.span, scope)
        if not isinstance(v, int):
            raise bad()
        return ie.Affine((), v)
    if isinstance(e, ast.IUnary) and e.op == "-":
        return ie.affine_scale(_affine(el, env, st, e.operand, scope), -1)
    if isinstance(e, ast.IBinary) and e.op in ("+", "-"):
        a, b = _affine(el, env, st, e.left, scope), _affine(el, env, st, e.right, scope)
        return ie.affine_add(a, b, 1 if e.op == "+" else -1)
    if isinstance(e, ast.IBinary) and e.op == "*":
        a, b = _affine(el, env, st, e.left, scope), _affine(el, env, st, e.right, scope)
        if not a.terms:
            return ie.affine_scale(b, a.const)
        if not b.terms:
            return ie.affine_scale(a, b.const)
    if isinstance(e, ast.IBinary) and e.op in ("/", "%"):  # integer division (floor) and its remainder
        a, b = _affine(el, env, st, e.left, scope), _affine(el, env, st, e.right, scope)
        if b.terms or b.const < 1:
            raise DslTypeError(f"an index can be divided only by a positive integer constant, not {b}", e.right.span)
        if not a.terms:
            return ie.Affine((), a.const // b.const if e.op == "/" else a.const % b.const)
        q = ie.Affine.var(st.quotient(a, b.const, e.span))
        return q if e.op == "/" else ie.affine_add(a, ie.affine_scale(q, b.const), -1)
    raise bad()
