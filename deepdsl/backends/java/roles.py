"""The names of a step's temporaries, by layer and role: `cv1_out` (a forward result), `cv1_dW`, `fc1_dx` (the
gradient's), `bn1_channel_mean` (another op of the layer)."""

from __future__ import annotations

from deepdsl.backends.java.names import abbreviated, identifier
from deepdsl.ir import Graph, Stmt


def _role(ops: list[str]) -> str:
    """What a fused statement's result is called: its last op without the words of how it broadcasts
    (`broadcast_channel_add` -> `add`, `pow_scalar` -> `pow`)."""
    last = ops[-1].removeprefix("broadcast_channel_").removesuffix("_scalar")
    return last or ops[-1]


# what a statement's result is, by its op: in the forward pass, and as part of the gradient
_FORWARD_ROLES = {"conv2d": "out", "linear": "out", "matmul": "out", "batch_matmul": "out", "max_pool2d": "out",
                  "avg_pool2d": "out", "global_avg_pool": "out", "lrn": "out", "layer_norm_rows": "norm",
                  "softmax": "out", "log_softmax": "out", "concat": "out", "softmax_cross_entropy": "loss",
                  "cross_entropy": "loss", "mse": "loss", "reshape": "out"}  # fmt: skip
_BACKWARD_ROLES = {"conv2d_backward_filter": "dW", "conv2d_backward_data": "dx", "channel_sum": "db",
                   "max_pool2d_backward": "dx", "avg_pool2d_backward": "dx", "global_avg_pool_backward": "dx",
                   "lrn_backward": "dx", "layer_norm_rows_backward": "dx", "bn_train_backward": "dx",
                   "softmax_backward": "dx", "log_softmax_backward": "dx", "softmax_cross_entropy_backward": "dscores",
                   "cross_entropy_backward": "dp", "reshape": "dx", "sum_axes": "db"}  # fmt: skip


def _layer_part(layer: str, prefix: str = "", short: dict[str, str] | None = None) -> str:
    """The part of a layer path that names a temporary: `model.stage2.block1.conv1` -> `stage2_block1_conv1`,
    without the prefix the parameters' names share (`model.max_pool1` -> `max_pool1`) and with repeated blocks
    written short (`stage2.bottleneck1.conv_bn1.bn` -> `s2_b1_cb1_bn`, names.block_abbreviations)."""
    parts = [p for p in abbreviated(layer.removeprefix(prefix), short or {}).split(".") if p]
    return "_".join(parts[1:] if len(parts) >= 3 and not prefix else parts)


def ancestors(g: Graph, values: list[str]) -> set[str]:
    producer = {s.out.name: s for s in g.stmts}
    found: set[str] = set()
    todo = list(values)
    while todo:
        name = todo.pop()
        if name in found or name not in producer:
            continue
        found.add(name)
        todo += [v.name for v in producer[name].inputs]
    return found


def forward_values(g: Graph, result: str | None) -> set[str]:
    """The results `result` depends on (the forward pass of a training step); every result without one."""
    return ancestors(g, [g.output(result).name]) if result is not None else {s.out.name for s in g.stmts}


def gradient_values(g: Graph, result: str | None) -> set[str]:
    """The results of a training step's backward pass: what the parameters' updates need beyond the forward pass."""
    if result is None:
        return set()
    params = {p.value.name for p in g.params if p.kind == "param"}
    return ancestors(g, [v.name for name, v in g.updates if name in params]) - forward_values(g, result)


def temp_names(g: Graph, result: str | None, prefix: str = "", short: dict[str, str] | None = None) -> dict[str, str]:
    """The name each result of a step would like, by its layer and its role there: `cv1_out` (the forward
    result), `cv1_dW`, `cv1_db`, `fc1_dx` (gradients), `bn1_channel_mean` (another op of the layer). With `result`
    (the training step's loss), the statements the loss does not depend on are the gradient's."""
    gradient = gradient_values(g, result)
    names = {}
    state_buckets = {s.out.name for s in g.stmts if s.op == "allreduce_wait" and s.a.get("kind") == "state"}
    for s in g.stmts:
        backward = s.out.name in gradient
        fused = s.op == "fused" and bool(s.a.get("ops"))
        what = _role(list(s.a["ops"])) if fused else s.op
        if backward:  # noqa: SIM108
            role = _BACKWARD_ROLES.get(s.op, "d_" + what)
            if s.op == "matmul":
                role = "dW" if s.a.get("transpose_a") else "dx"
        else:  # a fused forward result is its layer's output (`relu1_out`)
            role = "out" if fused else _FORWARD_ROLES.get(s.op, what)
        where = _layer_part(s.layer, prefix, short)
        names[s.out.name] = identifier(f"{where}_{role}" if where else role)
        if s.op in _BUCKET_ROLES or s.op == "bucket_slice":  # data parallelism: `bucket0`, `fc3_dW_reduced`
            names[s.out.name] = identifier(_bucket_name(s, prefix, short, s.inputs[0].name in state_buckets))
    return names


_BUCKET_ROLES = {"allreduce_start": "", "allreduce_wait": "_reduced"}


def _bucket_name(s: Stmt, prefix: str, short: dict[str, str] | None, state: bool) -> str:
    """A data-parallel statement's result: a bucket by its number, a reduced gradient by its parameter (`fc3.W`
    -> `fc3_dW_reduced`), a slice of the state bucket (`state`) by what it holds (`loss_reduced`,
    `bn1_running_mean_reduced`)."""
    if s.op in _BUCKET_ROLES:
        return f"bucket{s.a['bucket']}{_BUCKET_ROLES[s.op]}"
    name = abbreviated(str(s.a["name"]).removeprefix(prefix), short or {}).split(":")
    *where, last = name[0].split(".")
    if state or len(name) > 1 or not where:
        return "_".join([*where, last, *name[1:], "reduced"])
    return "_".join([*where, f"d{last}", "reduced"])
