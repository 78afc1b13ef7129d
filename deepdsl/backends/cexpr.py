"""The one printer of scalar expressions for the generated kernels, in two C-like dialects: Java and CUDA C.

The Java kernels (backends/java/kernels.py) and the CUDA kernels (backends/cuda/kernels.py) walk an index
expression the same way (reads, reductions and loops are theirs); what a scalar function or an operator reads as
in each language is here, as a table per dialect, so that the two kernels of one statement compute the same
thing by construction. An expression's text comes with its kind: "f" (a float) or "b" (a boolean), since both
languages keep comparisons boolean.

A subexpression that occurs more than once in a kernel's body (GELU's `1 / (1 + p |x| / sqrt 2)` six times, its
exponential twice) is computed once into a local before the statement (`Locals`); the index expression is a tree,
so without this the text, and the work, would grow with every use.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from deepdsl.ir.indexexpr import IE

INFIX = frozenset({"+", "-", "*", "/"})
COMPARE = frozenset({"==", "!=", "<", "<=", ">", ">="})


@dataclass(frozen=True)
class Dialect:
    """How one language writes the scalar functions: each a format of its arguments `{0}`, `{1}`, ..."""

    name: str
    literal: Callable[[float], str]  # a float32 constant
    functions: dict[str, str]  # fn -> format (neg, ^, exp, log, tanh, sqrt, rsqrt, sigmoid, abs, max, min)
    compare: str  # a comparison, `{0} {op} {1}`
    negate: str  # logical not
    one: str  # 1 and 0 as floats (a boolean used as a number)
    zero: str
    declare: dict[str, str] = field(default_factory=lambda: {"f": "float", "b": "boolean"})  # a local of each kind


def as_float(arg: tuple[str, str], d: Dialect) -> str:
    text, kind = arg
    return f"({text} ? {d.one} : {d.zero})" if kind == "b" else text


def as_bool(arg: tuple[str, str], d: Dialect) -> str:
    text, kind = arg
    return text if kind == "b" else (f"({text} != {d.zero})" if d.name == "cuda" else f"{text} != {d.zero}")


def apply(fn: str, args: list[tuple[str, str]], d: Dialect) -> tuple[str, str]:
    """The text and kind of scalar function `fn` applied to already printed arguments."""
    if fn in INFIX:
        return f"({as_float(args[0], d)} {fn} {as_float(args[1], d)})", "f"
    if fn in COMPARE:
        return d.compare.format(as_float(args[0], d), as_float(args[1], d), op=fn), "b"
    if fn in ("and", "or"):
        return f"({as_bool(args[0], d)} {'&&' if fn == 'and' else '||'} {as_bool(args[1], d)})", "b"
    if fn == "not":
        return d.negate.format(as_bool(args[0], d)), "b"
    if fn == "select":
        return f"({as_bool(args[0], d)} ? {as_float(args[1], d)} : {as_float(args[2], d)})", "f"
    if fn not in d.functions:
        raise ValueError(f"no {d.name} form for the scalar function {fn!r}")
    return d.functions[fn].format(*(as_float(a, d) for a in args)), "f"


JAVA_FUNCTIONS = {
    "neg": "-{0}", "^": "(float) Math.pow({0}, {1})", "exp": "(float) Math.exp({0})", "log": "(float) Math.log({0})",
    "tanh": "(float) Math.tanh({0})", "sqrt": "(float) Math.sqrt({0})", "rsqrt": "(1f / (float) Math.sqrt({0}))",
    "sigmoid": "(0.5f * (1f + (float) Math.tanh(0.5f * {0})))", "abs": "Math.abs({0})", "max": "Math.max({0}, {1})",
    "min": "Math.min({0}, {1})",
}  # fmt: skip
CUDA_FUNCTIONS = {
    "neg": "(-{0})", "^": "powf({0}, {1})", "exp": "expf({0})", "log": "logf({0})", "tanh": "tanhf({0})",
    "sqrt": "sqrtf({0})", "rsqrt": "(1.0f / sqrtf({0}))", "sigmoid": "(0.5f * (1.0f + tanhf(0.5f * {0})))",
    "abs": "fabsf({0})", "max": "fmaxf({0}, {1})", "min": "fminf({0}, {1})",
}  # fmt: skip


def java_dialect(literal: Callable[[float], str]) -> Dialect:
    return Dialect("Java", literal, JAVA_FUNCTIONS, "{0} {op} {1}", "!({0})", "1f", "0f")


def cuda_dialect(literal: Callable[[float], str]) -> Dialect:
    locals_ = {"f": "const float", "b": "const bool"}
    return Dialect("cuda", literal, CUDA_FUNCTIONS, "({0} {op} {1})", "!{0}", "1.0f", "0.0f", locals_)


# ---- subexpressions used more than once: one local each ----


@dataclass
class Locals:
    """The locals of one kernel body: which subexpressions are shared (`indexexpr.shared_subexpressions`), and the local
    that already holds each one printed so far. `taken` are the names the kernel uses otherwise; it grows with
    every local made here. A printer asks `held` before printing a node and calls `hold` after."""

    shared: frozenset[IE]
    taken: set[str]
    held: dict[IE, tuple[str, str]] = field(default_factory=dict)
    prefix: str = "c"

    def get(self, e: IE) -> tuple[str, str] | None:
        return self.held.get(e)

    def hold(self, e: IE, value: tuple[str, str], pre: list[str], indent: str, d: Dialect) -> tuple[str, str]:
        """`value`, the printed `e`; when `e` is shared, a local holding it (declared into `pre`) instead."""
        if e not in self.shared:
            return value
        text, kind = value
        if not re.fullmatch(r"[A-Za-z_]\w*", text):  # an accumulator is a local already
            k = len(self.held)
            while f"{self.prefix}{k}" in self.taken:
                k += 1
            name = f"{self.prefix}{k}"
            self.taken.add(name)
            pre.append(f"{indent}{d.declare[kind]} {name} = {_unwrap(text)};")
            text = name
        self.held[e] = (text, kind)
        return text, kind


def _unwrap(text: str) -> str:
    """`text` without one pair of parentheses around all of it."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for k, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and k < len(text) - 1:
            return text
    return text[1:-1]
