"""Scalar index expressions: the bodies of `indexed` statements (DESIGN §2.5).

A tensor is a function from indices to a scalar. `Read(k, index)` reads input k of the statement at
affine positions (out-of-range reads are zero: that is padding); `Reduce` sums or maximises its body
over index variables with known ranges.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Affine:
    """sum(coeff * var) + const over index variables."""

    terms: tuple[tuple[str, int], ...]
    const: int = 0

    @staticmethod
    def var(name: str) -> Affine:
        return Affine(((name, 1),), 0)

    @property
    def plain_var(self) -> str | None:
        """The variable when the index is exactly one variable (`x[n, d]`), else None."""
        if self.const == 0 and len(self.terms) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0]
        return None

    def __str__(self) -> str:
        return self.render({}, times="*")

    def render(self, names: Mapping[str, str], times: str = " * ") -> str:
        """The index as source text, each variable under its name in `names` (itself when absent)."""
        parts = []
        for var, c in self.terms:
            v = names.get(var, var)
            parts.append(v if c == 1 else f"-{v}" if c == -1 else f"{c}{times}{v}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")

    def bounds(self, ranges: Mapping[str, int]) -> tuple[int, int]:
        """The least and greatest value of the index when each variable runs over range(ranges[var])."""
        lo = hi = self.const
        for var, c in self.terms:
            top = c * (ranges[var] - 1)
            lo, hi = lo + min(0, top), hi + max(0, top)
        return lo, hi


def affine_add(a: Affine, b: Affine, sign: int = 1) -> Affine:
    terms = dict(a.terms)
    for name, c in b.terms:
        terms[name] = terms.get(name, 0) + sign * c
    return Affine(tuple(sorted((n, c) for n, c in terms.items() if c)), a.const + sign * b.const)


def affine_scale(a: Affine, k: int) -> Affine:
    return Affine(tuple((n, c * k) for n, c in a.terms if c * k), a.const * k)


@dataclass(frozen=True)
class IE:
    pass


@dataclass(frozen=True)
class Const(IE):
    value: float


@dataclass(frozen=True)
class Var(IE):
    name: str  # an index variable used as a value (`i == j ? 1 : 0`)


@dataclass(frozen=True)
class Read(IE):
    input: int
    index: tuple[Affine, ...]


@dataclass(frozen=True)
class Apply(IE):
    fn: str  # + - * / ^ neg, comparisons, and or not, select, exp log sqrt rsqrt tanh sigmoid abs max min
    args: tuple[IE, ...]


@dataclass(frozen=True)
class Reduce(IE):
    kind: str  # "sum" or "max"
    vars: tuple[tuple[str, int], ...]  # (index variable, range)
    body: IE


# name -> arity of the scalar functions allowed in bodies
FUNCTIONS: dict[str, int] = {
    "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "sigmoid": 1, "abs": 1, "max": 2, "min": 2,
}  # fmt: skip

_INFIX = {"+", "-", "*", "/", "^", "==", "!=", "<", "<=", ">", ">=", "and", "or"}


def format_ie(e: IE, names: tuple[str, ...] = ()) -> str:
    """Text form; `names` gives the printed name of each input (default `$0`, `$1`, ...)."""

    def nm(k: int) -> str:
        return names[k] if k < len(names) else f"${k}"

    def go(e: IE) -> str:
        if isinstance(e, Const):
            return f"{e.value:g}"
        if isinstance(e, Var):
            return e.name
        if isinstance(e, Read):
            return f"{nm(e.input)}[{', '.join(map(str, e.index))}]"
        if isinstance(e, Reduce):
            vs = ", ".join(f"{v}:{n}" for v, n in e.vars)
            return f"({e.kind}[{vs}] {go(e.body)})"
        assert isinstance(e, Apply)
        if e.fn in _INFIX and len(e.args) == 2:
            return f"({go(e.args[0])} {e.fn} {go(e.args[1])})"
        if e.fn == "neg":
            return f"-{go(e.args[0])}"
        if e.fn == "select":
            return f"({go(e.args[0])} ? {go(e.args[1])} : {go(e.args[2])})"
        return f"{e.fn}({', '.join(go(a) for a in e.args)})"

    return go(e)


def reads(e: IE) -> list[Read]:
    """Every Read in `e`, in order."""
    out: list[Read] = []

    def go(e: IE) -> None:
        if isinstance(e, Read):
            out.append(e)
        elif isinstance(e, Apply):
            for a in e.args:
                go(a)
        elif isinstance(e, Reduce):
            go(e.body)

    go(e)
    return out


def renumber(e: IE, mapping: dict[int, int]) -> IE:
    """`e` with every Read(k) reading input mapping[k] instead."""
    if isinstance(e, Read):
        return Read(mapping[e.input], e.index)
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(renumber(a, mapping) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.kind, e.vars, renumber(e.body, mapping))
    return e


def shared_subexpressions(e: IE) -> frozenset[IE]:
    """The compound subexpressions (an Apply or a Reduce) that occur more than once in `e` outside every
    reduction's body, which the kernel printers (backends/cexpr.py `Locals`) and `ops.indexed.evaluate` compute
    once. Inside a body they are left alone: a reduction's variables may change them from one term to the next,
    and a printer's local there would be declared inside the loop. Equal nodes are one (IE is a frozen value)."""
    counts: Counter[IE] = Counter()

    def walk(x: IE) -> None:
        if not isinstance(x, Apply | Reduce):
            return
        counts[x] += 1
        if counts[x] == 1 and isinstance(x, Apply):  # a repeated node's parts are counted once, through it
            for a in x.args:
                walk(a)

    walk(e)
    return frozenset(x for x, n in counts.items() if n > 1)
