"""Inputs for the kernel oracles that can see sign, zero and kink bugs.

Random positive inputs let a wrong kernel pass: ReLU turned into the identity agrees with ReLU wherever x > 0.
`draw` gives every floating input of an op both signs, exact zeros and the op's kinks (the registry's `kinks`:
the points themselves, where the value is checked, and points a little either side), unless the op's domain
needs positive values there (`POSITIVE`: a log, a divisor) or no negative ones (`NONNEGATIVE`: a variance,
whose 0 is where a dropped eps shows). Scalars (step counts, learning rates, loss gradients) are drawn positive,
away from 0: a step count of 0 divides by zero in Adam's bias correction.
"""

from __future__ import annotations

import numpy as np

from deepdsl.ir.registry import OpDef
from deepdsl.ir.types import DType, TensorType

# inputs whose values must be positive for the op to be defined (or finite): op -> input indices
POSITIVE: dict[str, tuple[int, ...]] = {
    "div": (1,), "rdiv_scalar": (0,), "log": (0,), "pow_scalar": (0,), "cross_entropy": (0,),
    # Adam's second moment: at 0 the step is lr * m / eps (eps 1e-8), too large for float32 kernels to agree
    "adam_step": (2,), "adam_step_scheduled": (2,),
    # [optim] AdamW's second moment as Adam's; RMSprop's square average (at 0 the step is lr * g / eps)
    "adamw_step": (2,), "adamw_step_scheduled": (2,), "rmsprop_plain": (2,), "rmsprop_plain_scheduled": (2,),
    "rmsprop_momentum": (3,),
}  # fmt: skip
# inputs that are never negative, 0 included (a variance, a squared norm, a square root's argument): 0 is where
# a dropped eps shows
NONNEGATIVE: dict[str, tuple[int, ...]] = {
    "sqrt": (0,), "bn_apply": (2,), "bn_train_apply": (2,), "bn_train_backward": (3,), "clip_scale": (0,),
    "bn_invstd": (0,),
}  # fmt: skip

KINK_STEP = 1e-3  # how far either side of a kink the extra samples lie (finite differences stay further away)


def special_values(kinks: tuple[float, ...]) -> list[float]:
    """0, both signs of a moderate value, and each kink with its neighbours either side."""
    out = [0.0, -1.5, 1.5]
    for k in kinks:
        out += [k, k - KINK_STEP, k + KINK_STEP]
    return [*out, -0.0, 0.25, -0.25]


def draw(
    t: TensorType,
    rng: np.random.Generator,
    *,
    kinks: tuple[float, ...] = (),
    positive: bool = False,
    nonnegative: bool = False,
    ints: tuple[int, int] = (1, 5),
    dtype: type = np.float64,
) -> np.ndarray:
    """One input of type `t`: integers in [ints) for an I64 input; else standard normal values of both signs with
    the special values (zeros, kinks) at random places; `positive`, values in [0.1, 2.1); `nonnegative`, the
    absolute values of those of both signs (zeros among them)."""
    if t.dtype is DType.I64:
        return rng.integers(*ints, t.shape).astype(np.int64)
    if positive or t.rank == 0:
        return (rng.random(t.shape) * 2 + 0.1).astype(dtype)
    x = rng.standard_normal(t.numel)
    special = special_values(kinks)[: max(t.numel // 2, 1)]
    x[rng.permutation(t.numel)[: len(special)]] = special
    return (np.abs(x) if nonnegative else x).reshape(t.shape).astype(dtype)


def op_inputs(op: OpDef, types: tuple[TensorType, ...], rng: np.random.Generator, *, dtype: type = np.float64,
              ints: tuple[int, int] = (1, 5)) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Inputs of every type of `op`'s call, each drawn by `draw` with that input's kinks and domain."""
    positive, nonnegative = POSITIVE.get(op.name, ()), NONNEGATIVE.get(op.name, ())
    return tuple(
        draw(
            t,
            rng,
            kinks=tuple(v for i, v in op.kinks if i == k),
            positive=k in positive,
            nonnegative=k in nonnegative,
            ints=ints,
            dtype=dtype,
        )  # fmt: skip
        for k, t in enumerate(types)
    )


def away_from_kinks(x: np.ndarray, kinks: tuple[float, ...], margin: float) -> np.ndarray:
    """`x` with each value within `margin` of a kink pushed to `margin` from it (keeping its side): central finite
    differences with a step below `margin` never straddle a kink, where the derivative is undefined."""
    x = x.copy()
    for k in kinks:
        near = np.abs(x - k) < margin
        x[near] = k + np.where(x[near] >= k, margin, -margin)
    return x
