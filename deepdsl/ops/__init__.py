"""Importing this package fills the op registry: one module per family of ops."""

from deepdsl.ops import (  # noqa: F401
    adaptive_pool,
    axes,
    collective,
    conv,
    elementwise,
    embedding,
    indexed,
    linalg,
    loss,
    norm,
    optim,
    pool,
    random,
    reduce,
    resize,
    shape,
)
