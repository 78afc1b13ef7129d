"""Helpers the op families use to write an op's registry `index_form`: an expression over its output's indices
i0, i1, ... (`ir.analysis.out_vars`), which fusion composes and the backends write as loops.

An input whose shape equals the output's is read at the same index; a per-channel input ([C] against
an output [N, C, ...]) at i1; a scalar input ([]) at no index. Private to `deepdsl.ops`: everything else reads
index forms through `deepdsl.ir.analysis`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepdsl.ir.analysis import out_vars
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read
from deepdsl.ir.types import TensorType


def read(k: int, t: TensorType, out: TensorType) -> IE:
    """Input k, of type `t`, read where the element of `out` being computed needs it."""
    if t.shape == out.shape:
        return Read(k, tuple(Affine.var(v) for v in out_vars(out)))
    if t.shape == ():
        return Read(k, ())
    if out.rank >= 2 and t.shape == (out.shape[1],):
        return Read(k, (Affine.var("i1"),))
    raise ValueError(f"no broadcast of {t} to {out}")


def pointwise(fn: Callable[..., IE]) -> Callable[[tuple[TensorType, ...], TensorType, dict[str, Any]], IE]:
    """Turn fn(attrs, *input reads) -> IE into an index form."""

    def form(types: tuple[TensorType, ...], out: TensorType, attrs: dict[str, Any]) -> IE:
        return fn(attrs, *(read(k, t, out) for k, t in enumerate(types)))

    return form


def c(v: float) -> IE:
    return Const(float(v))


def ap(fn: str, *args: IE) -> IE:
    return Apply(fn, tuple(args))
