"""Importing this package fills the op registry: one module per family of ops."""

from deepdsl.ops import conv, elementwise, indexed, linalg, loss, norm, pool, random, shape  # noqa: F401
