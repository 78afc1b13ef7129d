"""Dropout: inverted dropout in training with a reproducible mask, the identity in inference.

The mask of a dropout site at a step is drawn from SplitMix64 (deepdsl.initializers) seeded with
`stream_seed(site + "#dropout", seed) XOR ((step + 1) * 0xD1B54A32D192ED03 mod 2^64)`: element i is
kept, scaled by 1 / (1 - p), when its uniform u_i >= p. The Java runtime draws the same masks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.initializers import normal_array, stream_seed, uniform_array
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


# ---- sampling in the graph: normal(shape) and uniform(shape, low, high) (issue 34) ----
#
# `sample_normal` and `sample_uniform` are what the front end writes (no input); lowered for training to
# `random_normal` / `random_uniform`, which read the step, and for inference to their mean (a `fill`): normal's 0,
# uniform's (low + high) / 2, so that predict and the test loss are deterministic, as dropout is the identity there.
# The draws of call site `site` at a step come from SplitMix64 seeded with
# `stream_seed(site + "#sample", seed) XOR ((step + 1) * STEP_MIX mod 2^64)`: element i (row-major) of a normal
# is Box-Muller on uniforms 2i and 2i + 1 (deepdsl/initializers.py, normal_array), of a uniform
# `low + (high - low) * u_i` in float64, each rounded once to float32. The Java runtime (Rng.java) and the CUDA
# kernels draw the same numbers.


def _sample_rule(what: str):  # noqa: ANN202
    def rule(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
        if types and types[0].shape != ():
            raise ShapeError(f"{what} takes the scalar step, got {types[0]}")
        shape = tuple(attrs["shape"])
        if not shape or min(shape) < 1:
            raise ShapeError(f"{what}: every size of the shape must be at least 1, got {list(shape)}")
        return TensorType(shape)

    return rule


defop("sample_normal", 0, differentiable=False, doc="standard normal samples of attrs shape (attrs site); lowered to "
      "random_normal in training and to 0 in inference")(_sample_rule("normal"))  # fmt: skip
defop("sample_uniform", 0, differentiable=False, doc="samples uniform in [low, high) of attrs shape (attrs site); "
      "lowered to random_uniform in training and to (low + high) / 2 in inference")(
    _sample_rule("uniform"))  # fmt: skip
defop("random_normal", 1, differentiable=False, doc="standard normal draws of attrs shape from the step (input) and "
      "attrs site, seed")(_sample_rule("random_normal"))  # fmt: skip
defop("random_uniform", 1, differentiable=False, doc="uniform draws in [low, high) of attrs shape from the step "
      "(input) and attrs site, seed, low, high")(_sample_rule("random_uniform"))  # fmt: skip


def sample_seed(site: str, seed: int, step: int) -> int:
    return stream_seed(site + "#sample", seed) ^ (((step + 1) * STEP_MIX) % 2**64)


def _lower_sample(kind: str):  # noqa: ANN202
    def rule(b: Any, s: Any, ctx: Any) -> Any:
        a = s.a
        if not ctx.train:
            mean = 0.0 if kind == "normal" else (a["low"] + a["high"]) / 2
            return _e(b, s, "fill", value=mean, shape=tuple(a["shape"]))
        extra = {} if kind == "normal" else {"low": a["low"], "high": a["high"]}
        return _e(b, s, f"random_{kind}", ctx.step, shape=tuple(a["shape"]), site=a["site"], seed=ctx.seed, **extra)

    return rule


lowering("sample_normal")(_lower_sample("normal"))
lowering("sample_uniform")(_lower_sample("uniform"))


@numpy_kernel("random_normal")
def _random_normal(xs: tuple, a: dict) -> np.ndarray:
    shape = tuple(a["shape"])
    z = normal_array(sample_seed(a["site"], a["seed"], int(xs[0])), int(np.prod(shape)))
    return z.reshape(shape).astype(np.float32)


@numpy_kernel("random_uniform")
def _random_uniform(xs: tuple, a: dict) -> np.ndarray:
    shape = tuple(a["shape"])
    u = uniform_array(sample_seed(a["site"], a["seed"], int(xs[0])), int(np.prod(shape)))
    low, high = float(a["low"]), float(a["high"])
    return (low + (high - low) * u).reshape(shape).astype(np.float32)


flops_rule("random_normal", "random_uniform")(_flops)
java_call("random_normal", "long step, long seed, String site", cls="Rng")
java_call("random_uniform", "long step, float low, float high, long seed, String site", cls="Rng")
