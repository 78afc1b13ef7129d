"""Importing this package fills the op registry: one module per family of ops."""

from deepdsl.ops import (  # noqa: F401
    adaptive_pool,
    axes,
    collective,
    conv,
    elementwise,
    embedding,
    indexed,
    layer_norm,
    linalg,
    loss,
    lrn,
    norm,
    optim,
    pool,
    precision,
    random,
    reduce,
    resize,
    shape,
)
