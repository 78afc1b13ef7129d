"""Pooling over NCHW windows (floor mode; avg_pool counts padding in the divisor)."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.registry import defop
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import need_float, need_rank, window_out


def _pool(what: str):  # noqa: ANN202
    def rule(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
        (x,) = types
        need_float(x, what)
        need_rank(x, (4,), what, " ([N, C, H, W])")
        (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
        if ph * 2 > kh or pw * 2 > kw:
            raise ShapeError(f"{what}: padding {max(ph, pw)} is more than half the window {max(kh, kw)}")
        n, c, h, w = x.shape
        return TensorType((n, c, window_out(h, kh, sh, ph, what), window_out(w, kw, sw, pw, what)))

    rule.__doc__ = f"{what}: attrs kernel (kh, kw), stride (sh, sw), pad (ph, pw)."
    return rule


defop("max_pool2d", 1)(_pool("max_pool"))
defop("avg_pool2d", 1)(_pool("avg_pool"))


@defop("global_avg_pool", 1)
def global_avg_pool(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """[N, C, H, W] -> [N, C, 1, 1]."""
    (x,) = types
    need_rank(x, (4,), "global_avg_pool", " ([N, C, H, W])")
    return TensorType((x.shape[0], x.shape[1], 1, 1))
