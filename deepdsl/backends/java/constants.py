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

import math
from typing import Any

import numpy as np

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


def _same(a: float, b: float) -> bool:
    """Whether `a` and `b` are one float32 (as the kernels and their constant fields hold them)."""
    return bool(np.float32(a) == np.float32(b))


def _running_update(attrs: dict[str, Any], value: float) -> str | None:
    """Batch norm's running statistics (ops/norm.py, the one maker of `running_update`): the mean moves by the
    momentum, the variance by momentum * n / (n - 1), n the values per channel (`bn_var_momentum_n401408`)."""
    momentum, correction = float(attrs.get("momentum", math.nan)), float(attrs.get("correction", math.nan))
    if correction == 1.0 and _same(value, momentum):
        return "bn_momentum"
    if correction > 1.0 and _same(value, momentum * correction):
        return f"bn_var_momentum_n{round(correction / (correction - 1))}"
    return "bn_keep" if _same(value, 1 - momentum) else None  # what the statistic keeps of itself


# ops whose numbers a kernel may take as arguments, and what each number is, by the statement's attributes
_MEANINGS = {"running_update": _running_update}


def number_name(op: str, attrs: dict[str, Any], value: float) -> str:
    """The name of a number a kernel takes as an argument, after what made it: the op's meaning of it
    (`bn_momentum`, `bn_var_momentum_n3136`), else the attribute it is (`<op>_<attribute>`), else the op and
    the number (`<op>_k0_5`)."""
    meaning = _MEANINGS.get(op)
    named = meaning(attrs, value) if meaning is not None else None
    if named is not None:
        return named
    for key, v in attrs.items():
        if isinstance(v, int | float) and not isinstance(v, bool) and _same(value, v):
            return f"{op}_{key}"
    text = f"{np.float32(value)}".replace(".", "_").replace("e-", "e_minus_").replace("-", "minus_")
    return f"{op}_k{text}"


def constant_name(value: float, shape: tuple[int, ...], seed: bool) -> str:
    """The name of a constant tensor hoisted out of the step (passes/motion.py): `dloss` for the backward pass's
    seed (d loss / d loss = 1, a scalar read only by the gradient), else its value (`one`, `zeros`, `c0_5`)."""
    if seed:
        return "dloss"
    plural = "s" if shape else ""
    if value in (0.0, 1.0):
        return ("zero" if value == 0.0 else "one") + plural
    return "c" + f"{np.float32(value)}".replace(".", "_").replace("-", "minus_")
