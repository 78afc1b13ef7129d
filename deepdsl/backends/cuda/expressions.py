"""Index expressions as CUDA C (backends/loops.py's printer in CUDA's dialect), with the meaning of
`ops.indexed.evaluate`: a read outside its input is 0, `Reduce` sums or maximises over its ranges, comparisons are C
booleans; a body whose outermost work is a reduction may share it among a block's threads (`dd_block_sum` /
`dd_block_max`). Float constants are float32 literals; a value's storage is a C type (`ctype_of`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from deepdsl.backends import cexpr
from deepdsl.backends.cexpr import cuda_dialect
from deepdsl.backends.loops import LoopGen
from deepdsl.ir.indexexpr import (
    IE,
    Affine,
    Read,
    Reduce,
)  # fmt: skip
from deepdsl.ir.types import DType

_KEYWORDS = {"e", "t", "out", "auto", "int", "float", "double", "long", "if", "else", "for", "while", "do", "return",
             "char", "short", "signed", "unsigned", "const", "void", "case", "switch", "break", "continue", "goto",
             "static", "struct", "union", "enum", "register", "extern", "volatile", "new", "delete", "this",
             "class", "template", "typename", "default", "sizeof", "inline", "bool", "true", "false"}  # fmt: skip


def float_literal(v: float) -> str:
    """The C float literal of `v` rounded to float32."""
    with np.errstate(over="ignore"):
        f = np.float32(v)
    if math.isnan(f):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(f):
        return "__int_as_float(0x7f800000)" if f > 0 else "__int_as_float(0xff800000)"
    text = str(f)  # the shortest decimal that reads back as this float32
    return f"{text}f" if any(ch in text for ch in ".e") else f"{text}.0f"


CUDA = cuda_dialect(float_literal)


@dataclass
class Gen(LoopGen):
    """A CUDA kernel being printed (backends/loops.py): reads through the kernel's pointer arguments (`in0[i]`, a
    flat kernel's `in0[e]`), integer inputs cast to float, and a body whose outermost work is a reduction shared by
    the block's threads where `cooperative`."""

    DIALECT = CUDA
    RESERVED = re.compile(r"(in|s|no|sto)\d+|(n|st)\d+_\d+")

    taken: set[str] = field(default_factory=lambda: set(_KEYWORDS))
    own: tuple[tuple[Affine, ...], tuple[int, ...]] | None = None  # the output's index and shape (read as [e])
    ctypes: tuple[str, ...] = ()
    cooperative: bool = False  # top-level reductions are shared by the block's threads

    def usable(self, var: str) -> bool:
        return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var) is not None and not var.startswith("dd_")

    def numbered(self, base: str, k: int) -> str:
        return f"{base}_{k}"

    def read(self, r: Read) -> str:
        if r.input in self.registers:
            return self.registers[r.input]
        cast = "(float) " if self.ctypes and self.ctypes[r.input] != "float" else ""
        if self.flat:
            return f"{cast}in{r.input}[{'e' if r.index else '0'}]"
        if self.own and r.index == self.own[0] and self.shapes[r.input] == self.own[1]:
            return f"{cast}in{r.input}[e]"  # the output's own element
        if self.sizes is not None:  # each axis's index times its stride, tested against its dim
            element = f"{cast}in{r.input}[{self.sizes.offset(r.input, r.index, self.names)}]"
            return self.guarded(self.generic_tests(r), element)
        offset, tests = self.strided(r)
        return self.guarded(tests, f"{cast}in{r.input}[{offset}]")

    def special_reduce(self, e: Reduce, acc: str, pre: list[str], indent: str, top: bool) -> str | None:
        """A reduction at the top of a cooperative kernel: the block's threads share its flattened range, then
        combine their sums (dd_block_sum / dd_block_max)."""
        if not (self.cooperative and top):
            return None
        pre.append(f"{indent}float {acc} = {self.start(e)};")
        total = math.prod(n for _, n in e.vars)
        bounds = [self.range_of(var, size, e.body) for var, size in e.vars]
        pre.append(f"{indent}for (int t = threadIdx.x; t < {c_product(bounds)}; t += blockDim.x) {{")
        inner = indent + "  "
        rest = total
        for k, (var, size) in enumerate(e.vars):
            rest //= size
            v = self.bind(var, size)
            after = c_product(bounds[k + 1 :])
            div = (f"t / ({after})" if " " in after else f"t / {after}") if rest > 1 else "t"
            if size * rest < total:
                pre.append(f"{inner}int {v} = {div} % {bounds[k]};")
            else:
                pre.append(f"{inner}int {v} = {div};")
        body_pre: list[str] = []
        value = as_float(self.expr(e.body, body_pre, inner, False))
        pre.extend(body_pre)
        pre.append(f"{inner}{self.accumulate(e, acc, value)}")
        pre.append(f"{indent}}}")
        pre.append(f"{indent}{acc} = dd_block_{e.kind}({acc});")
        return acc


def c_product(factors: list[str]) -> str:
    """`a * b * 4` with the numbers multiplied out; "1" for none."""
    number = math.prod(int(f) for f in factors if f.isdigit())
    names = [f for f in factors if not f.isdigit()]
    return " * ".join(names + ([str(number)] if number != 1 or not names else []))


def as_float(arg: tuple[str, str]) -> str:
    return cexpr.as_float(arg, CUDA)


def cuda_expr(e: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...]) -> str:
    """The C expression of a reduction-free `e` at output indices named as in `out` (for tests and reading)."""
    g = Gen(shapes)
    for var, size in out:
        g.bind(var, size)
    pre: list[str] = []
    text = as_float(g.expr(e, pre, ""))
    if pre:
        raise ValueError("cuda_expr takes an expression without reductions")
    return text


def ctype_of(dtype: DType) -> str:
    """The C type a value is stored as: float, bf16 storage (library.cu dd_bf16: --precision bf16) or int64."""
    return {DType.F32: "float", DType.BF16: "dd_bf16"}.get(dtype, "long long")
