"""Numbers as kernel arguments: kernels that differ only in a number are one kernel taking it as an argument.

A statement's kernel bakes the numbers of its index expression into its text (`0.9f * a0[...]`). Two statements whose
kernels read the same but for such a number (batch norm's running-variance update, whose factor momentum · n/(n-1)
depends on the layer's size; the 1/n of a per-channel mean's gradient) would otherwise be two kernels,
`RUNNING_UPDATE` and `RUNNING_UPDATE_2`. The emitter writes each kernel once with every number read from a scalar
input instead (`template`), records the numbers each statement has, and where the same template has met different
numbers it writes the kernel with those positions as scalar inputs (`lift`), which the calls pass as constant
buffers. A number that is the same at every use stays in the kernel's text, where it reads best. The divisor of a
mean (`sum / n`) is not a number here: the kernels already read it from their sizes (java/kernels.py `count_of`).
"""

from __future__ import annotations

from deepdsl.ir.indexexpr import IE, Apply, Const, Read, Reduce


def numbers(e: IE) -> list[float]:
    """The numbers of `e` in the order `lift` numbers them."""
    found: list[float] = []

    def go(x: IE, divisor: bool) -> None:
        if isinstance(x, Const) and not divisor:
            found.append(x.value)
        elif isinstance(x, Apply):
            for k, a in enumerate(x.args):
                go(a, k == 1 and x.fn == "/" and isinstance(x.args[0], Reduce))
        elif isinstance(x, Reduce):
            go(x.body, False)

    go(e, False)
    return found


def lift(e: IE, first: int, which: tuple[int, ...]) -> IE:
    """`e` with its k-th number (k in `which`, counted as `numbers` lists them) read from scalar input
    `first + which.index(k)`."""
    count = [0]

    def go(x: IE, divisor: bool) -> IE:
        if isinstance(x, Const) and not divisor:
            k = count[0]
            count[0] += 1
            return Read(first + which.index(k), ()) if k in which else x
        if isinstance(x, Apply):
            return Apply(x.fn, tuple(go(a, k == 1 and x.fn == "/" and isinstance(x.args[0], Reduce))
                                     for k, a in enumerate(x.args)))  # fmt: skip
        if isinstance(x, Reduce):
            return Reduce(x.kind, x.vars, go(x.body, False))
        return x

    return go(e, False)


def varying(seen: dict[object, set[tuple[float, ...]]]) -> dict[object, tuple[int, ...]]:
    """For each template met with different numbers, the positions where they differ."""
    out = {}
    for key, tuples in seen.items():
        if len(tuples) > 1:
            width = len(next(iter(tuples)))
            out[key] = tuple(k for k in range(width) if len({t[k] for t in tuples}) > 1)
    return out
