"""The built-ins that draw from the seeded random stream: `dropout` (a mask over its input), and `normal` and
`uniform` (samples of a shape, from no input). In training each call draws anew at each step from the stream of its
path (its `site`); in inference dropout is the identity and a sample is its mean (ops/random.py lowers them).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deepdsl.errors import DslArgumentError, DslShapeError, Span
from deepdsl.frontend.builtins import Args, ArgSpec, builtin
from deepdsl.frontend.values import TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


@builtin("dropout", ArgSpec("p", "float", 0.5, low=0.0, below=1.0))
def dropout(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    return el.emit("dropout", xs, span, path, "dropout", p=a["p"], site=path)


def _sample_shape(what: str, a: Args, span: Span) -> tuple[int, ...]:
    shape = tuple(a["shape"])
    if math.prod(shape) > 2**31 - 2**24:
        raise DslShapeError(f"{what}: the shape {list(shape)} has more elements than a tensor may hold", span)
    return shape


@builtin("normal", ArgSpec("shape", "ints", low=1), inputs=0)
def normal(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Standard normal samples of `shape`, drawn each training step from the seeded stream of the call's path;
    in inference their mean, 0 (ops/random.py)."""
    return el.emit("sample_normal", (), span, path, "normal", shape=_sample_shape("normal", a, span), site=path)


@builtin("uniform", ArgSpec("shape", "ints", low=1), ArgSpec("low", "float", 0.0), ArgSpec("high", "float", 1.0),
         inputs=0)  # fmt: skip
def uniform(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Samples uniform in [low, high) of `shape`, each training step; in inference their mean (low + high) / 2."""
    if not a["low"] < a["high"]:
        raise DslArgumentError(f"uniform: low={a['low']:g} must be below high={a['high']:g}", span)
    shape = _sample_shape("uniform", a, span)
    return el.emit("sample_uniform", (), span, path, "uniform", shape=shape, site=path, low=a["low"], high=a["high"])
