"""Symbolic gradients of indexed statements (DESIGN §2.5).

For `out[o] = E(o)`, the gradient with respect to input k is

    dX[p] = Σ over every read X[A(o, r)] in E:  Σ_{o, r : A(o, r) = p}  g[o] · ∂E/∂read (o, r)

where r are the reduction variables around the read. The constraint A(o, r) = p is the Kronecker
delta of the derivative of an access; it is removed by inverting the index expression: each index
position solves one variable with coefficient ±1 (`i + kh = p` gives `i = p - kh`), the variables left
over are summed, and a position that cannot be solved stays as an indicator. A solved variable keeps
its range as an indicator, and reads outside a tensor are zero, so the result is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, Reduce, Var, affine_add, affine_scale, reads

ZERO, ONE = Const(0.0), Const(1.0)


# ---- smart constructors: fold the constants a derivative produces ----


def add(a: IE, b: IE) -> IE:
    if a == ZERO:
        return b
    if b == ZERO:
        return a
    return Apply("+", (a, b))


def mul(a: IE, b: IE) -> IE:
    if ZERO in (a, b):
        return ZERO
    if a == ONE:
        return b
    if b == ONE:
        return a
    return Apply("*", (a, b))


def neg(a: IE) -> IE:
    return ZERO if a == ZERO else Apply("neg", (a,))


def select(c: IE, a: IE, b: IE) -> IE:
    return ZERO if a == ZERO and b == ZERO else Apply("select", (c, a, b))


def _partial(e: Apply, i: int) -> IE:
    """∂ e / ∂ e.args[i], as an expression in e's arguments."""
    a = e.args
    fn = e.fn
    if fn == "+":
        return ONE
    if fn == "-":
        return ONE if i == 0 else Const(-1.0)
    if fn == "*":
        return a[1 - i]
    if fn == "/":
        return Apply("/", (ONE, a[1])) if i == 0 else neg(Apply("/", (a[0], Apply("*", (a[1], a[1])))))
    if fn == "^":
        if i == 0:
            return mul(a[1], Apply("^", (a[0], Apply("-", (a[1], ONE)))))
        return mul(e, Apply("log", (a[0],)))
    if fn == "neg":
        return Const(-1.0)
    if fn == "exp":
        return e
    if fn == "log":
        return Apply("/", (ONE, a[0]))
    if fn == "sqrt":
        return Apply("/", (Const(0.5), e))
    if fn == "rsqrt":
        return mul(Const(-0.5), Apply("^", (a[0], Const(-1.5))))
    if fn == "tanh":
        return Apply("-", (ONE, Apply("*", (e, e))))
    if fn == "sigmoid":
        return Apply("*", (e, Apply("-", (ONE, e))))
    if fn == "abs":
        return select(Apply(">", (a[0], ZERO)), ONE, select(Apply("<", (a[0], ZERO)), Const(-1.0), ZERO))
    if fn in ("max", "min"):
        first = Apply(">=" if fn == "max" else "<=", (a[0], a[1]))
        return select(first, ONE, ZERO) if i == 0 else select(first, ZERO, ONE)
    if fn == "select":
        return ZERO if i == 0 else select(a[0], ONE, ZERO) if i == 1 else select(a[0], ZERO, ONE)
    return ZERO  # comparisons and logic are piecewise constant


@dataclass(frozen=True)
class Occurrence:
    read: Read
    path: tuple[int, ...]  # child positions from the root to the read
    bound: tuple[tuple[str, int], ...]  # the reduction variables around it, outermost first


def occurrences(e: IE, k: int) -> list[Occurrence]:
    out: list[Occurrence] = []

    def go(e: IE, path: tuple[int, ...], bound: tuple[tuple[str, int], ...]) -> None:
        if isinstance(e, Read) and e.input == k:
            out.append(Occurrence(e, path, bound))
        elif isinstance(e, Apply):
            for i, a in enumerate(e.args):
                go(a, (*path, i), bound)
        elif isinstance(e, Reduce):
            go(e.body, (*path, 0), bound + e.vars)

    go(e, (), ())
    return out


def derivative(e: IE, path: tuple[int, ...]) -> IE:
    """∂ e / ∂ (the read at `path`), its reduction variables left free."""
    if not path:
        return ONE
    if isinstance(e, Reduce):
        inner = derivative(e.body, path[1:])
        if e.kind == "sum":
            return inner
        return select(Apply("==", (e.body, e)), inner, ZERO)  # max: only where the body attains it
    assert isinstance(e, Apply)
    i = path[0]
    return mul(_partial(e, i), derivative(e.args[i], path[1:]))


# ---- substitution of an index variable by an affine expression ----


def affine_value(a: Affine) -> IE:
    out: IE = Const(float(a.const)) if a.const or not a.terms else ZERO
    for name, c in a.terms:
        term: IE = Var(name) if c == 1 else Apply("*", (Const(float(c)), Var(name)))
        out = add(out, term)
    return out


def substitute(e: IE, var: str, value: Affine) -> IE:
    if isinstance(e, Var):
        return affine_value(value) if e.name == var else e
    if isinstance(e, Read):
        return Read(e.input, tuple(_subst_affine(a, var, value) for a in e.index))
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(substitute(a, var, value) for a in e.args))
    if isinstance(e, Reduce):
        if any(v == var for v, _ in e.vars):  # shadowed
            return e
        return Reduce(e.kind, e.vars, substitute(e.body, var, value))
    return e


def _subst_affine(a: Affine, var: str, value: Affine) -> Affine:
    coeff = dict(a.terms).get(var, 0)
    if not coeff:
        return a
    rest = Affine(tuple((n, c) for n, c in a.terms if n != var), a.const)
    return affine_add(rest, affine_scale(value, coeff))


# ---- the gradient of one input ----


def gradient_body(
    body: IE, out: tuple[tuple[str, int], ...], k: int, shape: tuple[int, ...], g_input: int
) -> tuple[IE, tuple[tuple[str, int], ...]] | None:
    """The body and output indices of d loss / d input k, reading the output gradient as input `g_input`."""
    occ = occurrences(body, k)
    if not occ:
        return None
    taken = _names(body) | {n for n, _ in out}
    ps = []
    for j in range(len(shape)):
        name = f"p{j}"
        while name in taken:
            name += "_"
        ps.append(name)
    g_read = Read(g_input, tuple(Affine.var(n) for n, _ in out))
    total: IE = ZERO
    for o in occ:
        term = mul(g_read, derivative(body, o.path))
        ranges = dict(out) | dict(o.bound)
        free = [n for n, _ in out] + [n for n, _ in o.bound]
        conds: list[IE] = []
        index = list(o.read.index)
        for j in range(len(index)):
            a = index[j]
            var = next((n for n, c in a.terms if abs(c) == 1 and n in free), None)
            if var is None:  # cannot invert this position: keep the delta as an indicator
                conds.append(Apply("==", (affine_value(a), Var(ps[j]))))
                continue
            c = dict(a.terms)[var]
            rest = Affine(tuple((n, cc) for n, cc in a.terms if n != var), a.const)
            solved = affine_scale(affine_add(Affine.var(ps[j]), rest, -1), c)  # var = c * (p - rest), c = ±1
            free.remove(var)
            term = substitute(term, var, solved)
            conds = [substitute(x, var, solved) for x in conds]
            index = [_subst_affine(x, var, solved) for x in index]
            if solved.plain_var == ps[j] and ranges[var] == shape[j]:
                continue  # var = p_j over the same range: always in range
            v = affine_value(solved)
            conds.append(Apply("and", (Apply(">=", (v, ZERO)), Apply("<", (v, Const(float(ranges[var])))))))
        for cond in conds:
            term = select(cond, term, ZERO)
        if free:
            term = Reduce("sum", tuple((n, ranges[n]) for n in free), term)
        total = add(total, term)
    return total, tuple(zip(ps, shape))


def _names(e: IE) -> set[str]:
    out: set[str] = set()
    if isinstance(e, Var):
        out.add(e.name)
    elif isinstance(e, Read):
        for a in e.index:
            out.update(n for n, _ in a.terms)
    elif isinstance(e, Apply):
        for a in e.args:
            out |= _names(a)
    elif isinstance(e, Reduce):
        out.update(n for n, _ in e.vars)
        out |= _names(e.body)
    return out


def used_inputs(e: IE) -> list[int]:
    return sorted({r.input for r in reads(e)})
