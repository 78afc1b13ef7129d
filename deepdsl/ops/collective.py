"""Data-parallel statements (passes/data_parallel.py): a gradient bucket packed and its sum all-reduce started,
the wait for it, and the views of the reduced gradients; and the dropout mask of a shard at its global position.

The NumPy kernels here compute what the statements mean in one process with one rank: the pack (the bucket's
tensors, flattened and concatenated in order, times the scale input 1/(ranks x micro-batches)), the wait as the
identity and the slices as views. The communication itself is the runner's: each runner performs
`allreduce_start` / `allreduce_wait` around these kernels (distributed/executor.py for the NumPy runner; the Java
runtime's data-parallel classes), so no Java call or CUDA rule is registered for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepdsl.initializers import normal_array, uniform_array
from deepdsl.ir.graph import Graph, Value
from deepdsl.ir.registry import defop, flops_rule, java_call, numpy_kernel
from deepdsl.ir.types import DType, ShapeError, TensorType
from deepdsl.ops.random import mask_seed, sample_seed

COLLECTIVE_OPS = ("allreduce_start", "allreduce_wait", "bucket_slice")
STATS = "stats"  # the kind of a batch norm's statistics all-reduce (sync_batch_norm): blocking, inside the step


@defop(
    "allreduce_start", None, differentiable=False,
    doc="pack a gradient bucket (inputs after the scale, flattened, in order) times the scale f32[] into one "
        "flat buffer and start its SUM all-reduce across ranks (attrs bucket, kind, names, sizes)",
)  # fmt: skip
def allreduce_start(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    if len(types) < 2 or types[0] != TensorType(()):
        raise ShapeError("allreduce_start takes the scale f32[] and at least one tensor")
    sizes = tuple(attrs["sizes"])
    if len(sizes) != len(types) - 1 or any(t.numel != n for t, n in zip(types[1:], sizes)):
        raise ShapeError(f"allreduce_start: sizes {sizes} do not match the inputs")
    if any(t.dtype != DType.F32 for t in types[1:]):
        raise ShapeError("allreduce_start: a bucket holds float32 tensors only")
    if len(tuple(attrs["names"])) != len(sizes):
        raise ShapeError("allreduce_start: one name per tensor")
    return TensorType((sum(sizes),))


@defop(
    "allreduce_wait", 1, view=True, differentiable=False,
    doc="wait for the all-reduce its bucket's allreduce_start began; a view: the reduced sums in that buffer",
)  # fmt: skip
def allreduce_wait(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    (b,) = types
    if b.rank != 1 or b.dtype != DType.F32:
        raise ShapeError(f"allreduce_wait takes a bucket f32[n], got {b}")
    return b


@defop(
    "bucket_slice", 1, view=True, differentiable=False,
    doc="a view of elements [offset, offset + numel) of a reduced bucket in attrs shape (attrs offset, shape, name)",
)  # fmt: skip
def bucket_slice(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    (b,) = types
    shape = tuple(attrs["shape"])
    offset = attrs["offset"]
    if b.rank != 1 or not 0 <= offset <= offset + math.prod(shape) <= b.numel:
        raise ShapeError(f"bucket_slice at {offset} of [{', '.join(map(str, shape))}] does not fit {b}")
    return TensorType(shape)


@numpy_kernel("allreduce_start")
def _pack(xs: tuple, a: dict) -> np.ndarray:
    scale = np.float32(xs[0])
    flat = np.concatenate([np.asarray(x, np.float32).reshape(-1) for x in xs[1:]])
    return flat * scale


numpy_kernel("allreduce_wait")(lambda xs, a: xs[0])


@numpy_kernel("bucket_slice")
def _slice(xs: tuple, a: dict) -> np.ndarray:
    shape = tuple(a["shape"])
    return xs[0][a["offset"] : a["offset"] + math.prod(shape)].reshape(shape)


flops_rule("allreduce_start")(lambda types, out, a: out.numel)  # the scaling; the sum is the network's
flops_rule("allreduce_wait", "bucket_slice")(lambda types, out, a: 0)


AT_OPS = {"dropout_mask": "dropout_mask_at", "random_normal": "random_normal_at", "random_uniform": "random_uniform_at"}


def _at_rule(what: str):  # noqa: ANN202
    def rule(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
        if types != (TensorType((), DType.I64), TensorType((), DType.I64)):
            raise ShapeError(f"{what} takes the scalar step and the shard's sample offset, got {types}")
        shape = tuple(attrs["shape"])
        if not shape:
            raise ShapeError(f"{what} needs a batch axis")
        return TensorType(shape)

    return rule


for _op, _at in AT_OPS.items():
    defop(
        _at, 2, differentiable=False, cheap_to_recompute=_op == "dropout_mask",
        doc=f"{_op} of one shard of the global batch: its draws from sample position offset (i64[]) on, so the "
            "shards of a data-parallel step draw what one process with the whole batch draws",
    )(_at_rule(_at))  # fmt: skip


def _start(a: dict, xs: tuple, per_draw: int = 1) -> tuple[tuple[int, ...], int, int]:
    shape = tuple(a["shape"])
    return shape, math.prod(shape), int(xs[1]) * math.prod(shape[1:]) * per_draw


@numpy_kernel("dropout_mask_at")
def _dropout_mask_at(xs: tuple, a: dict) -> np.ndarray:
    shape, n, first = _start(a, xs)
    u = uniform_array(mask_seed(a["site"], a["seed"], int(xs[0])), n, first)
    keep = (u >= a["p"]).reshape(shape)
    return np.where(keep, 1.0 / (1.0 - a["p"]), 0.0).astype(np.float32)


@numpy_kernel("random_normal_at")
def _random_normal_at(xs: tuple, a: dict) -> np.ndarray:
    shape, n, first = _start(a, xs)
    return normal_array(sample_seed(a["site"], a["seed"], int(xs[0])), n, first).reshape(shape).astype(np.float32)


@numpy_kernel("random_uniform_at")
def _random_uniform_at(xs: tuple, a: dict) -> np.ndarray:
    shape, n, first = _start(a, xs)
    u = uniform_array(sample_seed(a["site"], a["seed"], int(xs[0])), n, first)
    low, high = float(a["low"]), float(a["high"])
    return (low + (high - low) * u).reshape(shape).astype(np.float32)


flops_rule(*AT_OPS.values())(lambda types, out, a: out.numel)

# the Java runtime's (Rng.java; the CPU device's: the CUDA device refuses them for now), the shard's offset passed
# as a long as the step is
java_call("dropout_mask_at", "long step, long offset, float p, long seed, String site", cls="Rng")
java_call("random_normal_at", "long step, long offset, long seed, String site", cls="Rng")
java_call("random_uniform_at", "long step, long offset, float low, float high, long seed, String site", cls="Rng")


# ---- what runners read of a data-parallel program ----


@dataclass(frozen=True)
class Bucket:
    """One all-reduce: its number, kind ("grad", "state", or "stats": a batch norm's statistics, blocking, under
    sync_batch_norm), and the tensors it holds in order."""

    index: int
    kind: str
    values: tuple[Value, ...]
    names: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return sum(v.type.nbytes for v in self.values)


def is_data_parallel(g: Graph) -> bool:
    """Whether `g` was made by the data-parallel pass (it takes the input `dp/scale`)."""
    return any(d.kind == "scale" for d in g.inputs)


def data_dependent(g: Graph) -> set[str]:
    varying = {d.value.name for d in g.inputs if d.kind in ("input", "label", "step", "offset")}
    for s in g.stmts:
        if any(v.name in varying for v in s.inputs):
            varying.add(s.out.name)
    return varying


def closure(g: Graph, seeds: set[int]) -> set[int]:
    post = set(seeds)
    names = {g.stmts[i].out.name for i in post}
    for i, s in enumerate(g.stmts):
        if i not in post and any(v.name in names for v in s.inputs):
            post.add(i)
            names.add(s.out.name)
    return post


def post_statements(g: Graph) -> frozenset[str]:
    """The statements of a data-parallel program that run once per step after the reductions (out names): what
    reads an `allreduce_wait` of a gradient or state bucket (transitively; a batch-norm statistics wait, kind
    "stats", is part of the forward or backward pass, sync_batch_norm), and the data-independent statements that
    make an update (Adam's step counter) with what reads them. Every other statement runs once per micro-batch;
    none of them reads a post statement's value."""
    varying = data_dependent(g)
    producers = {v.name for _, v in g.updates}
    seeds = {
        i for i, s in enumerate(g.stmts)
        if (s.op == "allreduce_wait" and s.a["kind"] != STATS)
        or (s.out.name in producers and s.out.name not in varying)
    }  # fmt: skip
    return frozenset(g.stmts[i].out.name for i in closure(g, seeds))


def buckets_of(g: Graph) -> tuple[Bucket, ...]:
    """The buckets of a data-parallel program, from its allreduce_start statements, in start order."""
    return tuple(
        Bucket(s.a["bucket"], s.a["kind"], s.inputs[1:], tuple(s.a["names"])) for s in g.stmts
        if s.op == "allreduce_start"
    )  # fmt: skip
