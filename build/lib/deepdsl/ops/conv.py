"""2-D convolution (cross-correlation, NCHW), weight [out, in/groups, kh, kw]."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.registry import defop
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import need_float, need_rank, window_out


@defop("conv2d", 2)
def conv2d(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """attrs: stride (sh, sw), pad (ph, pw), groups."""
    x, w = types
    need_float(x, "conv")
    need_rank(x, (4,), "conv", " ([N, C, H, W])")
    (sh, sw), (ph, pw), g = attrs["stride"], attrs["pad"], attrs["groups"]
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    if c % g or f % g:
        raise ShapeError(f"conv: groups={g} must divide both the input channels ({c}) and the output channels ({f})")
    if cg * g != c:
        raise ShapeError(f"conv: weight {w} expects {cg * g} input channels, the input {x} has {c}")
    return TensorType((n, f, window_out(h, kh, sh, ph, "conv"), window_out(wd, kw, sw, pw, "conv")))
