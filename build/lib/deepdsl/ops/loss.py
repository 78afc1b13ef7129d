"""Softmax, the losses, and the inference-only argmax / accuracy."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.registry import defop
from deepdsl.ir.types import DType, ShapeError, TensorType
from deepdsl.ops._helpers import need_float, need_rank


def _softmax(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    need_float(x, "softmax")
    need_rank(x, (2,), "softmax", " ([N, K]; flatten first)")
    return x


defop("softmax", 1, doc="exp(x - max) / sum exp(x - max) over axis 1")(_softmax)
defop("log_softmax", 1, doc="x - max - log sum exp(x - max) over axis 1")(_softmax)


def _class_loss(what: str):  # noqa: ANN202
    def rule(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
        x, y = types
        need_float(x, what)
        need_rank(x, (2,), what, " ([N, K] scores)")
        if y.dtype is not DType.I64 or y.shape != (x.shape[0],):
            raise ShapeError(f"{what}: labels must be int [{x.shape[0]}] for scores {x}, got {y}")
        return TensorType(())

    return rule


defop("softmax_cross_entropy", 2, doc="mean over the batch of -log softmax(x)[label]")(
    _class_loss("softmax_cross_entropy")
)
defop("cross_entropy", 2, doc="mean over the batch of -log p[label] for probabilities p")(_class_loss("cross_entropy"))
defop("accuracy", 2, doc="fraction of rows whose largest score is at the label")(_class_loss("accuracy"))


@defop("mse", 2)
def mse(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Mean of (pred - target)^2 over every element."""
    a, b = types
    if a.shape != b.shape:
        raise ShapeError(f"mse: prediction {a} and target {b} differ in shape")
    return TensorType(())


@defop("argmax", 1)
def argmax(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Index of the largest score per row: [N, K] -> int [N]."""
    (x,) = types
    need_rank(x, (2,), "argmax")
    return TensorType((x.shape[0],), DType.I64)
