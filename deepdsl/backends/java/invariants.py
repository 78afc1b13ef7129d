"""Loop-invariant parts of a kernel's body, computed once before the loop that does not change them.

In a flat kernel, the parts that read only scalars (an optimizer's settings, Adam's `1 - beta1 ^ t`) are the same
for every element; in a shaped kernel, the parts that do not use the output's last index (a layer norm's
`rsqrt(var[t] + eps)` and `mean[t]` over a row of channels) are the same along its innermost loop. The JIT
cannot move them itself: every buffer is a float[], so for all it knows a store to the output changes what a
read returns, and it reads (and computes) them again each step, which also keeps the loop from vectorising.

NOTE: moving a read before the loop is sound because a kernel's output overlaps none of its inputs except one
it reads in place, element for element (memory/check.py), and that read is at the output's own index: it uses
the loop's index, so it is never moved.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from deepdsl.backends.cexpr import Dialect
from deepdsl.ir.indexexpr import IE, Apply, Const, Read, Reduce, Var

if TYPE_CHECKING:
    from deepdsl.backends.java.kernels import Gen


def mentions(e: IE, var: str) -> bool:
    """Whether `e` reads at an index using `var` or uses `var` as a value."""
    if isinstance(e, Var):
        return e.name == var
    if isinstance(e, Read):
        return any(v == var for a in e.index for v, _ in a.terms)
    if isinstance(e, Apply):
        return any(mentions(a, var) for a in e.args)
    if isinstance(e, Reduce):
        return mentions(e.body, var)
    return False


def per_element(e: IE, registers: dict[int, str]) -> bool:
    """Whether `e` changes from one element of a flat kernel to the next: it reads a tensor at an index (or, in a
    group, one of the `registers` holding an earlier result) or uses an index variable."""
    if isinstance(e, Read):
        return bool(e.index) or e.input in registers
    if isinstance(e, Apply):
        return any(per_element(a, registers) for a in e.args)
    return isinstance(e, Var | Reduce)


def hoist(g: Gen, body: IE, invariant: Callable[[IE], bool], indent: str, dialect: Dialect) -> list[str]:
    """The declarations, at `indent`, of locals holding the largest parts of `body` that `invariant` accepts
    (other than constants), with `g` set to print each of them by its local's name (h0, h1, ...)."""
    lines: list[str] = []

    def walk(x: IE) -> None:
        if isinstance(x, Const) or x in g.hoisted:
            return
        if invariant(x):
            text, kind = g.expr(x, lines, indent)
            k = 0
            while f"h{k}" in g.taken:
                k += 1
            g.taken.add(f"h{k}")
            lines.append(f"{indent}{dialect.declare[kind]} h{k} = {text};")
            g.hoisted[x] = (f"h{k}", kind)
        elif isinstance(x, Apply):  # a reduction's body changes with its variables: it stays whole
            for a in x.args:
                walk(a)

    walk(body)
    return lines
