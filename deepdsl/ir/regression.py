"""The regression target of a network, for the test phase's mean absolute error (docs/formats.md, JSON outputs)."""

from __future__ import annotations

from deepdsl.ir.graph import Graph

__all__ = ["REGRESSION_LOSSES", "regression_target"]

# the loss ops that compare a prediction with a target of its own shape
REGRESSION_LOSSES = ("mse", "l1", "huber")


def regression_target(g: Graph) -> str | None:
    """The float `input` that a regression loss (`REGRESSION_LOSSES`) the loss depends on reads directly, where
    `predict` has that input's shape (`loss = mse(net(x), t)` with `predict = net(x)`: t); None otherwise. The test
    phase reports the mean absolute error of `predict` against it."""
    outputs = dict(g.outputs)
    if "predict" not in outputs or "loss" not in outputs:
        return None
    targets = {d.value.name: d for d in g.inputs if d.kind == "input" and d.classes is None}
    needed = {outputs["loss"].name}
    for st in reversed(g.stmts):
        if st.out.name in needed:
            needed.update(v.name for v in st.inputs)
    predict = outputs["predict"].type
    for st in g.stmts:
        if st.op in REGRESSION_LOSSES and st.out.name in needed:
            for v in reversed(st.inputs):  # the target is the second argument, by convention
                d = targets.get(v.name)
                if d is not None and d.value.type.shape == predict.shape and d.value.type.dtype == predict.dtype:
                    return d.value.name
    return None
