"""The eager baseline of `deepdsl memcheck` (DESIGN §5): what an eager autograd framework holds at the start of
the backward pass.

That is every tensor some op's backward needs, as PyTorch keeps them (each op's `saves` in the registry: a
convolution its input, a ReLU its output, a batch norm its input and statistics, ...), counted once per
tensor, plus the parameters, the gradients of those that train, the optimizer state and the model state.
Parameters an op keeps are already counted as parameters.
"""

from __future__ import annotations

from deepdsl.ir import REGISTRY, Graph


def saved_bytes(forward: Graph) -> int:
    """Bytes of the tensors eager autograd keeps for the backward pass of the forward graph `forward`."""
    params = {q.value.name for q in forward.params}
    base: dict[str, str] = {}  # a view keeps its base's storage (of the same size)
    kept: dict[str, int] = {}
    extra = 0
    for s in forward.stmts:
        op = REGISTRY[s.op]
        base[s.out.name] = base.get(s.inputs[0].name, s.inputs[0].name) if op.view else s.out.name
        if op.saves is None:
            continue
        which = range(len(s.inputs)) if op.saves.which == ("all",) else op.saves.which
        for w in which:
            v = s.out if w == "out" else s.inputs[w]  # type: ignore[index]
            if v.name not in params:
                kept[base.get(v.name, v.name)] = v.type.nbytes
        if op.saves.extra is not None:
            extra += op.saves.extra(tuple(v.type for v in s.inputs), s.out.type, s.a)
    return sum(kept.values()) + extra


def eager_peak_bytes(forward: Graph, train: Graph) -> int:
    """Saved tensors + parameters + gradients + optimizer and model state of the training program `train`."""
    params = sum(q.value.type.nbytes for q in train.params if q.kind == "param")
    updated = {name for name, _ in train.updates}  # the parameters with a gradient (a frozen one has none)
    grads = sum(q.value.type.nbytes for q in train.params if q.kind == "param" and q.value.name in updated)
    others = sum(q.value.type.nbytes for q in train.params if q.kind in ("state", "opt"))
    return saved_bytes(forward) + params + grads + others
