"""Ops that draw random numbers."""

from __future__ import annotations

from deepdsl.ir.registry import defop
from deepdsl.ops._helpers import unary_same

# Inverted dropout; attrs: p, site (the layer path, which seeds its mask). Identity in inference.
defop("dropout", 1, elementwise=True, pure=False)(unary_same)
