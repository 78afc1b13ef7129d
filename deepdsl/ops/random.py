"""Dropout: inverted dropout in training with a reproducible mask, the identity in inference.

The mask of a dropout site at a step is drawn from SplitMix64 (deepdsl.initializers) seeded with
`stream_seed(site + "#dropout", seed) XOR ((step + 1) * 0xD1B54A32D192ED03 mod 2^64)`: element i is
kept, scaled by 1 / (1 - p), when its uniform u_i >= p. The Java runtime draws the same masks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.initializers import stream_seed, uniform_array
from deepdsl.ir.registry import defop, eager_saves, flops_rule, java_call, lowering, numpy_kernel
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import unary_same

STEP_MIX = 0xD1B54A32D192ED03

defop(
    "dropout", 1, elementwise=True,
    doc="inverted dropout (attrs p, site); lowered to dropout_mask * x in training and to x in inference",
)(unary_same)  # fmt: skip


@defop("dropout_mask", 1, differentiable=False, cheap_to_recompute=True)  # one draw per element
def dropout_mask(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """0 or 1 / (1 - p) per element of attrs shape, from the step (input) and attrs site, p, seed."""
    if types[0].shape != ():
        raise ShapeError(f"dropout_mask takes the scalar step, got {types[0]}")
    return TensorType(tuple(attrs["shape"]))


@lowering("dropout")
def _lower_dropout(b: Any, s: Any, ctx: Any) -> Any:
    (x,) = s.inputs
    if not ctx.train or s.a["p"] == 0.0:
        return x
    mask = _e(b, s, "dropout_mask", ctx.step, p=s.a["p"], site=s.a["site"], seed=ctx.seed, shape=x.type.shape)
    return _e(b, s, "mul", x, mask)


def mask_seed(site: str, seed: int, step: int) -> int:
    return stream_seed(site + "#dropout", seed) ^ (((step + 1) * STEP_MIX) % 2**64)


@numpy_kernel("dropout_mask")
def _dropout_mask(xs: tuple, a: dict) -> np.ndarray:
    shape = tuple(a["shape"])
    u = uniform_array(mask_seed(a["site"], a["seed"], int(xs[0])), int(np.prod(shape)))
    keep = (u >= a["p"]).reshape(shape)
    return np.where(keep, 1.0 / (1.0 - a["p"]), 0.0).astype(np.float32)


@flops_rule("dropout_mask")
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return out.numel


eager_saves("dropout", extra=lambda types, out, a: out.numel)  # eager autograd keeps a one-byte mask per element


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("dropout_mask", "long step, float p, long seed, String site", cls="Rng")
