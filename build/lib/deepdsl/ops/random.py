"""Ops that draw random numbers."""

from __future__ import annotations

from deepdsl.ir.registry import defop
from deepdsl.ops._helpers import unary_same

defop(
    "dropout", 1, elementwise=True,
    doc="inverted dropout: x * mask / (1 - p), the mask seeded by attrs site (the layer path) and the step; "
    "identity in inference",
)(unary_same)  # fmt: skip
