"""Contiguous axes of a shaped kernel as one axis: fewer loops and less index arithmetic, longer inner loops.

`collapse(body, out, shapes)` merges two adjacent index variables `a`, `b` (ranges `na`, `nb`) into one variable
`a` of range `na * nb`, and repeats while a pair qualifies. The pair is adjacent output axes `j`, `j + 1` with
`j >= 1` (axis 0 stays: the runtime splits a shaped kernel's output by its rows), or adjacent variables of one
reduction's `vars`. It qualifies when, in the scope of the pair (the whole body for output axes, the reduction's
body for its variables):

- neither variable is used as a value (`Var`) nor bound by another reduction (the output's variables by none);
- every read either uses neither variable, or reads them plainly on adjacent axes `k`, `k + 1` of its input, in
  that order (`x[.., a, b, ..]`, coefficient 1, no offset), at their full extent (`shape[k] == na`,
  `shape[k + 1] == nb`) and uses them on no other axis;
- every read anywhere in the body of an input merged at `k`, `k + 1` reads those two axes that way (the input's
  two axes become one, so every read of it must index them as the pair).

Then the merge is exact: `a` outer and `b` inner with `b` of full extent is the row-major position
`a * nb + b` in the output and in each such input (its stride at `k` is `nb` times its stride at `k + 1`), that
position runs over `0 .. na * nb - 1` in the nested loops' order (a reduction adds its terms in the same order),
no bounds test is needed (full extent, no offset), and a read that uses neither variable is the same value for
every position. A transposed read (`x[.., b, a]`), a shifted or padded one (`x[.., a + 1, b]`), a strided one
(`2 * a`), a slice (`shape[k] != na`) or a read of one variable alone refuses the pair.

The result carries, for the output and each input, which original axes each of its axes covers, so that a printer
reads a merged size at run time as the product of the buffer's dims (the kernel stays shape-generic).
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdsl.ir.indexexpr import IE, Affine, Apply, Read, Reduce, Var, reads

Axes = tuple[tuple[int, ...], ...]  # for each axis of the collapsed buffer, the original axes it covers


@dataclass(frozen=True)
class Collapsed:
    body: IE
    out: tuple[tuple[str, int], ...]
    shapes: tuple[tuple[int, ...], ...]
    out_axes: Axes
    in_axes: tuple[Axes, ...]


def collapse(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...]) -> Collapsed:
    """`body` over `out` with every qualifying pair of adjacent axes merged (see the module's docstring)."""
    c = Collapsed(
        body,
        out,
        shapes,
        tuple((j,) for j in range(len(out))),
        tuple(tuple((j,) for j in range(len(s))) for s in shapes),
    )
    while True:
        step = _merge_once(c)
        if step is None:
            return c
        c = step


def _merge_once(c: Collapsed) -> Collapsed | None:
    for j in range(1, len(c.out) - 1):
        (a, na), (b, nb) = c.out[j], c.out[j + 1]
        merged = _merge(c, c.body, a, na, b, nb)
        if merged is not None:
            body, shapes, in_axes = merged
            out = (*c.out[:j], (a, na * nb), *c.out[j + 2 :])
            out_axes = (*c.out_axes[:j], c.out_axes[j] + c.out_axes[j + 1], *c.out_axes[j + 2 :])
            return Collapsed(body, out, shapes, out_axes, in_axes)
    bound = [v for r in _reductions(c.body) for v, _ in r.vars]
    for r in _reductions(c.body):
        for k in range(len(r.vars) - 1):
            (a, na), (b, nb) = r.vars[k], r.vars[k + 1]
            if bound.count(a) > 1 or bound.count(b) > 1:  # a name bound twice: its reads are not all this scope's
                continue
            merged = _merge(c, r.body, a, na, b, nb)
            if merged is not None:
                vars_ = (*r.vars[:k], (a, na * nb), *r.vars[k + 2 :])
                body, shapes, in_axes = merged
                return Collapsed(_replace(body, r, vars_), c.out, shapes, c.out_axes, in_axes)
    return None


def pair_axes(scope: IE, every: list[Read], a: str, na: int, b: str, nb: int,
              shapes: tuple[tuple[int, ...], ...]) -> dict[int, int] | None:  # fmt: skip
    """The axis `k` at which each input reading `a`, `b` in `scope` reads them as one contiguous pair, or None
    where some read (or use) refuses the pair; `every` is every read of the whole body."""
    if _uses_var(scope, {a, b}) or _rebinds(scope, {a, b}):
        return None
    at: dict[int, int] = {}
    for r in reads(scope):
        used = [k for k, x in enumerate(r.index) if any(v in (a, b) for v, _ in x.terms)]
        if not used:
            continue
        k = used[0]
        shape = shapes[r.input]
        plain = used == [k, k + 1] and r.index[k].plain_var == a and r.index[k + 1].plain_var == b
        if not plain or shape[k] != na or shape[k + 1] != nb or at.setdefault(r.input, k) != k:
            return None
    for r in every:  # every read of a merged input indexes the two axes as the pair
        k = at.get(r.input)
        if k is not None and (r.index[k].plain_var != a or r.index[k + 1].plain_var != b):
            return None
    return at


def _merge(c: Collapsed, scope: IE, a: str, na: int, b: str, nb: int):  # noqa: ANN202
    at = pair_axes(scope, reads(c.body), a, na, b, nb, c.shapes)
    if at is None:
        return None
    shapes = list(c.shapes)
    in_axes = list(c.in_axes)
    for i, k in at.items():
        s, ax = shapes[i], in_axes[i]
        shapes[i] = (*s[:k], s[k] * s[k + 1], *s[k + 2 :])
        in_axes[i] = (*ax[:k], ax[k] + ax[k + 1], *ax[k + 2 :])

    def go(x: IE) -> IE:
        if isinstance(x, Read) and x.input in at:
            k = at[x.input]
            return Read(x.input, (*x.index[:k], Affine.var(a), *x.index[k + 2 :]))
        if isinstance(x, Apply):
            return Apply(x.fn, tuple(go(y) for y in x.args))
        if isinstance(x, Reduce):
            return Reduce(x.kind, x.vars, go(x.body))
        return x

    return go(c.body), tuple(shapes), tuple(in_axes)


def _reductions(e: IE) -> list[Reduce]:
    if isinstance(e, Reduce):
        return [e, *_reductions(e.body)]
    if isinstance(e, Apply):
        return [r for x in e.args for r in _reductions(x)]
    return []


def _replace(e: IE, r: Reduce, vars_: tuple[tuple[str, int], ...]) -> IE:
    """`e` (reads already merged) with the reduction that binds `r`'s variables now over `vars_`."""
    if isinstance(e, Reduce):
        if e.kind == r.kind and e.vars == r.vars:
            return Reduce(e.kind, vars_, e.body)
        return Reduce(e.kind, e.vars, _replace(e.body, r, vars_))
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(_replace(x, r, vars_) for x in e.args))
    return e


def _uses_var(e: IE, names: set[str]) -> bool:
    if isinstance(e, Var):
        return e.name in names
    if isinstance(e, Apply):
        return any(_uses_var(x, names) for x in e.args)
    return isinstance(e, Reduce) and _uses_var(e.body, names)


def _rebinds(e: IE, names: set[str]) -> bool:
    if isinstance(e, Reduce):
        return any(v in names for v, _ in e.vars) or _rebinds(e.body, names)
    return isinstance(e, Apply) and any(_rebinds(x, names) for x in e.args)
