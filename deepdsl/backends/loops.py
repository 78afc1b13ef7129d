"""The one loop-nest generator of the generated kernels, with a Java and a CUDA C dialect.

The Java kernels (backends/java/kernels.py) and the CUDA kernels (backends/cuda/kernels.py) print an index
expression the same way, and that way is here: index variables bound to names no other part of the kernel uses
(`bind`), a read at an affine index tested against its input's bounds only where the index can leave it (a read
outside is 0), a reduction as a local accumulator over nested loops, a mean's count written as the product of the
kernel's size names (so that one kernel serves every size), a subexpression used again held in a local
(cexpr.Locals), and the scalar functions in the dialect's words (cexpr.Dialect, as cexpr shares scalar printing).

Each backend's `Gen` subclasses `LoopGen` with only what its language does differently: how an element is
addressed (Java's arrays at offsets, `a0[p0 + i]`; CUDA's pointers, `in0[i]`), which names it reserves, and its own
kinds of loop (CUDA's reductions shared by a block's threads; Java's lane sums, its branch-free ReLU gradient and
the invariants it computes before a loop).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import ClassVar

from deepdsl.backends.cexpr import Dialect, Locals, apply, as_float
from deepdsl.backends.sizes import Sizes
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, Reduce, Var

Printed = tuple[str, str]  # an expression's text and its kind: "f" (a float) or "b" (a boolean)


def strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The row-major strides of `shape`, in elements."""
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= d
    return tuple(reversed(out))


@dataclass
class LoopGen:
    """The state of one kernel being printed: its index variables (ranges, names, ranges as text), its accumulators,
    and what it reads otherwise than from memory (locals, registers, hoisted invariants). A subclass is one dialect:
    it sets DIALECT and RESERVED and writes `usable`, `numbered` and `read`; it may add special forms through
    `special`, `special_reduce` and `special_args`."""

    DIALECT: ClassVar[Dialect]
    RESERVED: ClassVar[re.Pattern[str]]  # the names of the kernel's sizes, strides and buffers: no index takes one

    shapes: tuple[tuple[int, ...], ...]
    ranges: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    accumulators: int = 0
    flat: bool = False  # one loop over the flat index `e`: every read is the output's own element or a scalar
    registers: dict[int, str] = field(default_factory=dict)  # inputs held in a local (a group's earlier results)
    sizes: Sizes | None = None  # shape-generic: sizes read as names (backends/sizes.py), not numbers
    locals: Locals | None = None  # the body's shared subexpressions (None inside a reduction's body)
    bounds_of: dict[str, str] = field(default_factory=dict)  # index variable -> its range as text
    hoisted: dict[IE, Printed] = field(default_factory=dict)  # loop-invariant parts, computed before the loop

    # ---- the dialect's parts ----

    def usable(self, var: str) -> bool:
        """Whether index variable `var` can keep its name in the kernel's language."""
        raise NotImplementedError

    def numbered(self, base: str, k: int) -> str:
        """The k-th other name for an index variable whose name `base` is taken."""
        raise NotImplementedError

    def read(self, r: Read) -> str:
        """The text of a read of an input."""
        raise NotImplementedError

    def special(self, e: Apply, pre: list[str], indent: str, top: bool) -> Printed | None:
        """The dialect's own text of `e` before its arguments are printed, or None."""
        return None

    def special_args(self, e: Apply, args: list[Printed]) -> Printed | None:
        """The dialect's own text of `e` from its printed arguments, or None."""
        return None

    def special_reduce(self, e: Reduce, acc: str, pre: list[str], indent: str, top: bool) -> str | None:
        """The dialect's own loops of reduction `e` into accumulator `acc` (its text where it is used), or None."""
        return None

    def count_bounds(self, r: Reduce) -> list[str]:
        """The ranges of a sum's variables as text, after its loops are printed (count_of)."""
        return [self.range_of(var, size, r.body) for var, size in r.vars]

    # ---- shared ----

    def bind(self, var: str, size: int, bound: str | None = None) -> str:
        """The name of index variable `var` of range `size` in the kernel (`bound`: its range as text)."""
        name = var if self.usable(var) else "v"
        base, k = name, 2
        while name in self.taken or self.RESERVED.fullmatch(name):
            name, k = self.numbered(base, k), k + 1
        self.taken.add(name)
        self.names[var], self.ranges[var] = name, size
        self.bounds_of[var] = bound if bound is not None else str(size)
        return name

    def range_of(self, var: str, size: int, body: IE) -> str:
        return self.sizes.range_of(var, size, body) if self.sizes is not None else str(size)

    def count_of(self, e: Apply) -> str | None:
        """For `sum / n` where n is the number of the sum's terms and a shape-generic kernel names every range: the
        product of those names (so one kernel serves every size)."""
        if self.sizes is None or e.fn != "/" or not isinstance(e.args[0], Reduce) or not isinstance(e.args[1], Const):
            return None
        r = e.args[0]
        bounds = self.count_bounds(r)
        if r.kind != "sum" or e.args[1].value != math.prod(n for _, n in r.vars) or any(b.isdigit() for b in bounds):
            return None
        return " * ".join(bounds)

    def affine(self, a: Affine) -> str:
        return a.render(self.names)

    def bounds(self, a: Affine) -> tuple[int, int]:
        return a.bounds(self.ranges)

    def strided(self, r: Read) -> tuple[str, list[str]]:
        """A read at known sizes: its element offset (each index times its stride, the numbers multiplied out) and
        the tests that keep it inside its input (where an index can leave it)."""
        shape = self.shapes[r.input]
        terms: dict[str, int] = {}
        const = 0
        tests = []
        for a, dim, stride in zip(r.index, shape, strides(shape)):
            for var, c in a.terms:
                terms[var] = terms.get(var, 0) + c * stride
            const += a.const * stride
            lo, hi = self.bounds(a)
            text = self.affine(a)
            if lo < 0:
                tests.append(f"{text} >= 0")
            if hi >= dim:
                tests.append(f"{text} < {dim}")
        return self.affine(Affine(tuple((v, c) for v, c in terms.items() if c), const)), tests

    def generic_tests(self, r: Read) -> list[str]:
        """The bounds tests of a read in a shape-generic kernel, against its input's dims by name."""
        assert self.sizes is not None
        tests = []
        for j, (a, dim) in enumerate(zip(r.index, self.shapes[r.input])):
            lo, hi = self.bounds(a)
            text = self.affine(a)
            if lo < 0:
                tests.append(f"{text} >= 0")
            if hi >= dim:
                tests.append(f"{text} < {self.sizes.dim(r.input, j)}")
        return tests

    def guarded(self, tests: list[str], element: str) -> str:
        """`element` where `tests` hold, else 0."""
        return f"({' && '.join(tests)} ? {element} : {self.DIALECT.zero})" if tests else element

    def expr(self, e: IE, pre: list[str], indent: str, top: bool = True) -> Printed:
        """The text of `e` and its kind; reductions append their loops to `pre` (`top`: not inside a reduction)."""
        if isinstance(e, Const):
            return self.DIALECT.literal(e.value), "f"
        if isinstance(e, Var):
            return f"(float) {self.names[e.name]}", "f"
        if self.hoisted and e in self.hoisted:
            return self.hoisted[e]
        if isinstance(e, Read):
            return self.read(e), "f"
        held = self.locals.get(e) if self.locals is not None else None
        if held is not None:
            return held
        value = self.compound(e, pre, indent, top)
        return self.locals.hold(e, value, pre, indent, self.DIALECT) if self.locals is not None else value

    def compound(self, e: IE, pre: list[str], indent: str, top: bool = True) -> Printed:
        if isinstance(e, Reduce):
            outer, self.locals = self.locals, None  # a body's subexpressions may change with its variables
            try:
                return self.reduce(e, pre, indent, top), "f"
            finally:
                self.locals = outer
        assert isinstance(e, Apply)
        special = self.special(e, pre, indent, top)
        if special is not None:
            return special
        args = [self.expr(a, pre, indent, top) for a in e.args]
        special = self.special_args(e, args)
        if special is not None:
            return special
        count = self.count_of(e)
        if count is not None:  # a mean: the sum over the count of its terms, a size of the kernel
            return f"({args[0][0]} / (float) ({count}))", "f"
        return apply(e.fn, args, self.DIALECT)

    def start(self, e: Reduce) -> str:
        """The first value of reduction `e`'s accumulator: 0, or minus infinity for a maximum."""
        return self.DIALECT.zero if e.kind == "sum" else self.DIALECT.literal(-math.inf)

    def accumulate(self, e: Reduce, acc: str, value: str) -> str:
        """The statement adding `value` into `acc` (or keeping the larger, for a maximum)."""
        if e.kind == "sum":
            return f"{acc} += {value};"
        return f"{acc} = {self.DIALECT.functions['max'].format(acc, value)};"

    def reduce(self, e: Reduce, pre: list[str], indent: str, top: bool = True) -> str:
        acc = f"s{self.accumulators}"
        self.accumulators += 1
        special = self.special_reduce(e, acc, pre, indent, top)
        if special is not None:
            return special
        pre.append(f"{indent}float {acc} = {self.start(e)};")
        inner = indent
        for var, size in e.vars:
            bound = self.range_of(var, size, e.body)
            v = self.bind(var, size, bound)
            pre.append(f"{inner}for (int {v} = 0; {v} < {bound}; {v}++) {{")
            inner += "  "
        body_pre: list[str] = []
        value = as_float(self.expr(e.body, body_pre, inner, False), self.DIALECT)
        pre.extend(body_pre)
        pre.append(f"{inner}{self.accumulate(e, acc, value)}")
        for k in range(len(e.vars)):
            pre.append(f"{indent}{'  ' * (len(e.vars) - 1 - k)}}}")
        return acc
