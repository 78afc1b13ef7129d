"""Import rules for the operators that reshape a tensor or work along its axes: Flatten and Reshape (`flatten`, or
`reshape` to the shape ONNX infers: heads split and joined), Transpose (`permute`), Concat (of computed tensors, or
with constants through a tensor function), Slice and Split (`slice`), Expand, ReduceMean (`global_avg_pool`
over H and W, else `mean` over any axes but the batch), ReduceSum and ReduceMax. Pad is `padding.py`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.folding import fold
from deepdsl.onnx_import.rule_support import dims, inputs_const, positive_axis, signature
from deepdsl.onnx_import.writing import Node, call, need

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def flatten(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    rank = len(imp.shape(node.input[0], where))
    axis = int(attrs.get("axis", 1))
    if (axis + rank if axis < 0 else axis) != 1:
        reshape_any(imp, node, where)
        return
    imp.bind(node, f"flatten({imp.tensor(node.input[0], where)})")


def reshape(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    shape = imp.shape(node.input[0], where)
    target = imp.const(node.input[1])
    if target is None:
        raise where.refuse("the shape must be a constant (an initialiser or a Constant node)")
    t = [int(v) for v in target.reshape(-1)]
    if int(attrs.get("allowzero", 0)) and 0 in t:
        raise where.refuse(f"shape {t} with allowzero=1 makes an axis of size 0")
    rest = int(np.prod(shape[1:]))
    first_ok = t[0] in (0, shape[0]) or (imp.model_batch is not None and t[0] == imp.model_batch)
    if len(t) == 2 and (first_ok and t[1] in (-1, rest) or t[0] == -1 and t[1] == rest):
        imp.bind(node, f"flatten({imp.tensor(node.input[0], where)})")
        return
    reshape_any(imp, node, where)


def reshape_any(imp: Importer, node: Any, where: Node) -> None:
    """A Reshape to any shape (heads split and joined): `reshape(x, (...))` with the shape ONNX infers."""
    out = imp.shape(node.output[0], where)
    imp.bind(node, f"reshape({imp.tensor(node.input[0], where)}, {dims(imp, out, node.output[0])})")


def transpose(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    rank = len(imp.shape(node.input[0], where))
    perm = [int(p) for p in attrs.get("perm", list(range(rank))[::-1])]
    x = imp.tensor(node.input[0], where)
    if perm == list(range(rank)):
        imp.env[node.output[0]] = x
        return
    imp.bind(node, f"permute({x}, ({', '.join(map(str, perm))}))")


def concat(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    value = fold("Concat", attrs, [imp.const(i) for i in node.input], None, where)
    if value is not None:  # a shape being put together
        imp.consts[node.output[0]] = value
        return
    rank = len(imp.shape(node.input[0], where))
    axis = int(attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if axis == 0:
        raise where.refuse("axis=0 would concatenate batches")
    if any(imp.const(i) is not None for i in node.input):
        concat_constants(imp, node, where, axis)
        return
    xs = [imp.tensor(i, where) for i in node.input]
    if len(xs) == 1:
        imp.env[node.output[0]] = xs[0]
        return
    imp.bind(node, call(where, "concat", xs, {} if axis == 1 else {"axis": str(axis)}))


def concat_constants(imp: Importer, node: Any, where: Node, axis: int) -> None:
    """Concat of computed tensors and constants (a class token put before the patches): a tensor function whose
    parameters hold the constants, each reduced to size 1 along the axes it repeats over (the batch), so that the
    class token is one trainable vector as in the model."""
    shapes = [imp.shape(i, where) for i in node.input]
    rank = len(shapes[0])
    computed = [i for i in node.input if imp.const(i) is None]
    if not computed:
        raise where.refuse("every input is a constant")
    idx = [f"i{d}" for d in range(rank)]
    name = imp.names.make(where.base, "concat")
    fn = imp.names.make(f"{name}_fn", "fn")
    args, params, reads = [], [], []
    at = 0
    for j, (i, shape) in enumerate(zip(node.input, shapes)):
        c = imp.const(i)
        read_idx = [f"{idx[d]} - {at}" if d == axis and at else idx[d] for d in range(rank)]
        if c is None:
            t = f"t{len(args)}"
            args.append(f"{t}[{', '.join(f'S{j}_{d}' for d in range(rank))}]")
            reads.append((at, shape[axis], f"{t}[{', '.join(read_idx)}]"))
        else:
            c = np.broadcast_to(np.asarray(c, np.float32), shape)
            for d in range(rank):  # the axes it repeats over: one copy
                if d != axis and c.shape[d] > 1 and (c == c.take([0], axis=d)).all():
                    c = c.take([0], axis=d)
            p = f"k{len(params)}"
            params.append((p, c))
            ks = ["0" if c.shape[d] == 1 and shape[d] > 1 else read_idx[d] for d in range(rank)]
            reads.append((at, shape[axis], f"{p}[{', '.join(ks)}]"))
        at += shape[axis]
    expr = reads[-1][2]
    for start, size, r in reversed(reads[:-1]):
        expr = f"{idx[axis]} < {start + size} ? {r} : ({expr})"
    outs = ", ".join(f"{idx[d]}: {at}" if d == axis else idx[d] for d in range(rank))
    imp.tensor_fns += [f"tensor {fn}({', '.join(args)}) -> [{outs}] {{   # Concat with constants"]
    imp.tensor_fns += [f"  param {p}[{', '.join(map(str, c.shape))}] = constant(0)" for p, c in params]
    imp.tensor_fns += [f"  return {expr}", "}", ""]
    imp.layers.append(f"layer {name} = {fn}")
    for p, c in params:
        imp.store(f"{name}.{p}", c, where)
    imp.bind(node, f"{name}({', '.join(imp.tensor(i, where) for i in computed)})", name)


def _slice_text(x: str, start: int, end: int, axis: int) -> str:  # after need(where, "slice")
    return f"slice({x}, {start}, {end}, axis={axis})"


def slice_(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "slice")
    shape = imp.shape(node.input[0], where)
    if imp.opset < 10 or len(node.input) == 1:
        starts, ends = attrs.get("starts", []), attrs.get("ends", [])
        axes, steps = attrs.get("axes"), None
    else:
        starts, ends, axes, steps = (inputs_const(imp, node, where, 1) + [None, None])[:4]
    axes_l = list(range(len(np.ravel(starts)))) if axes is None else [int(a) for a in np.ravel(axes)]
    steps_l = [1] * len(axes_l) if steps is None else [int(v) for v in np.ravel(steps)]
    if any(st < 1 for st in steps_l):
        raise where.refuse(f"steps {steps_l}: deepdsl imports slices forward (a step of 1 or more)")
    x = imp.tensor(node.input[0], where)
    cuts: dict[int, tuple[int, int, int]] = {}  # axis -> (start, end, step), in range
    for a, s, e, st in zip(axes_l, np.ravel(starts), np.ravel(ends), steps_l):
        a = positive_axis(a, len(shape))
        n = shape[a]
        s, e = int(max(min(int(s), 2**62), -(2**62))), int(max(min(int(e), 2**62), -(2**62)))
        s, e = (s + n if s < 0 else s), (e + n if e < 0 else e)
        s, e = min(max(s, 0), n), min(max(e, 0), n)
        if a == 0:
            if (s, e, st) == (0, n, 1):
                continue
            raise where.refuse("it slices the batch axis")
        if e <= s:
            raise where.refuse(f"it takes nothing of axis {a} ({s} to {e})")
        if (s, e, st) != (0, n, 1):
            cuts[a] = (s, e, st)
    if any(
        st != 1 for _, _, st in cuts.values()
    ):  # every st-th element (a Swin patch merge's x[:, 0::2]): a tensor function
        strided(imp, node, where, shape, cuts)
        return
    for a, (s, e, _) in cuts.items():
        x = _slice_text(x, s, e, a)
    if x == imp.tensor(node.input[0], where):
        imp.env[node.output[0]] = x
    else:
        imp.bind(node, x)


def strided(imp: Importer, node: Any, where: Node, shape: tuple[int, ...], cuts: dict) -> None:
    """A Slice with steps: a tensor function reading `step * i + start` along each cut axis, its range given."""
    rank = len(shape)
    idx = [f"i{d}" for d in range(rank)]
    reads, ranges = list(idx), list(idx)
    for a, (s, e, st) in cuts.items():
        reads[a] = " + ".join(p for p in (f"{st} * {idx[a]}" if st != 1 else idx[a], str(s) if s else "") if p)
        ranges[a] = f"{idx[a]}: {-(-(e - s) // st)}"
    fn = imp.names.make(f"{imp.names.clean(where.base, 'slice')}_fn", "fn")
    imp.tensor_fns += [f"tensor {fn}({signature(rank)}) -> [{', '.join(ranges)}] = t[{', '.join(reads)}]   # Slice", ""]
    imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")


def split(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "slice")
    shape = imp.shape(node.input[0], where)
    axis = positive_axis(int(attrs.get("axis", 0)), len(shape))
    if axis == 0:
        raise where.refuse("it splits the batch axis")
    sizes = attrs.get("split")
    if sizes is None and len(node.input) > 1 and node.input[1]:
        sizes = imp.const(node.input[1])
        if sizes is None:
            raise where.refuse("the split sizes must be constant")
    n = shape[axis]
    outs = list(node.output)
    if sizes is None:
        each = -(-n // len(outs))
        sizes = [min(each, n - j * each) for j in range(len(outs))]
    x = imp.tensor(node.input[0], where)
    at = 0
    for o, size in zip(outs, (int(v) for v in np.ravel(sizes))):
        if o:
            name = imp.names.make(o, "part")
            imp.body.append(f"{name} = {_slice_text(x, at, at + size, axis)}")
            imp.env[o] = name
        at += size


def split_to_sequence(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """SplitToSequence, as the dynamo exporter writes torch.split / chunk without its optimiser: the parts' bounds
    along the axis, kept for the SequenceAt nodes that pick them (`sequence_at`); nothing is written here."""
    shape = imp.shape(node.input[0], where)
    axis = positive_axis(int(attrs.get("axis", 0)), len(shape))
    if axis == 0:
        raise where.refuse("it splits the batch axis")
    n, given = shape[axis], len(node.input) > 1 and bool(node.input[1])
    split = imp.const(node.input[1]) if given else None
    if given and split is None:
        raise where.refuse("the split sizes must be constant")
    if split is None and not int(attrs.get("keepdims", 1)):
        raise where.refuse("a split into single positions without keeping the axis (keepdims=0, torch.unbind)")
    if split is None or np.ndim(split) == 0:  # parts of one size, the last one smaller
        each = 1 if split is None else int(split)
        if each < 1:
            raise where.refuse(f"a split of size {each}")
        bounds: tuple[int, ...] | int = each
    else:
        sizes = [int(v) for v in np.ravel(split)]
        if min(sizes, default=0) < 0 or sum(sizes) != n:
            raise where.refuse(f"split sizes {sizes[:8]} for an axis of {n}")
        bounds = tuple(int(v) for v in np.cumsum([0, *sizes]))
    imp.sequences[node.output[0]] = (imp.tensor(node.input[0], where), axis, tuple(shape), bounds)


def sequence_at(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """SequenceAt at a constant position of a SplitToSequence's parts: that part, a `slice`."""
    need(where, "slice")
    seq, at = imp.sequences.get(node.input[0]), imp.const(node.input[1])
    if seq is None:
        raise where.refuse("deepdsl imports SequenceAt of a SplitToSequence only")
    if at is None or np.size(at) != 1 or at.dtype.kind not in "iu":
        raise where.refuse("the position must be a constant integer")
    x, axis, shape, bounds = seq
    n = shape[axis]
    count = -(-n // bounds) if isinstance(bounds, int) else len(bounds) - 1
    pos = int(np.ravel(at)[0])
    pos += count if pos < 0 else 0
    if not 0 <= pos < count:
        raise where.refuse(f"position {int(np.ravel(at)[0])} of {count} parts")
    start, end = (pos * bounds, min(n, pos * bounds + bounds)) if isinstance(bounds, int) else bounds[pos : pos + 2]
    # ONNX's shape inference gives parts of unequal sizes no shape: the part's is known here
    imp.shapes[node.output[0]] = (*shape[:axis], end - start, *shape[axis + 1 :])
    if (start, end) == (0, n):
        imp.env[node.output[0]] = x
        return
    name = imp.names.make(node.output[0], "part")
    imp.body.append(f"{name} = {_slice_text(x, start, end, axis)}")
    imp.env[node.output[0]] = name


def expand(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    out = imp.shape(node.output[0], where)
    src = imp.shape(node.input[0], where)
    x = imp.tensor(node.input[0], where)
    if tuple(src) == tuple(out):
        imp.env[node.output[0]] = x
        return
    need(where, "expand")
    if len(src) != len(out):
        raise where.refuse(f"it expands rank {len(src)} to rank {len(out)}; deepdsl's expand keeps the rank")
    imp.bind(node, f"expand({x}, {dims(imp, out, node.output[0])})")


def reduce_mean(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """The mean over H and W of an NCHW tensor (as exporters write adaptive average pooling to 1x1), else `mean`
    along the axes."""
    rank = len(imp.shape(node.input[0], where))
    got = _reduced_axes(imp, node, where, attrs, rank)
    if rank != 4 or got != [2, 3]:
        _along_axes(imp, node, where, attrs, "mean", got)
        return
    pooled = f"global_avg_pool({imp.tensor(node.input[0], where)})"
    imp.bind(node, pooled if int(attrs.get("keepdims", 1)) else f"flatten({pooled})")


def reduce_axes(fn: str) -> Callable[..., None]:
    """ReduceSum / ReduceMax: `sum(x, axis=..., keepdim=...)` / `max(...)` over any axes but the batch."""

    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        rank = len(imp.shape(node.input[0], where))
        _along_axes(imp, node, where, attrs, fn, _reduced_axes(imp, node, where, attrs, rank))

    return rule


def _reduced_axes(imp: Importer, node: Any, where: Node, attrs: dict, rank: int) -> list[int] | None:
    """A Reduce node's axes, counted from the front and sorted (an attribute, or from opset 13/18 an input); None for
    every axis (none given)."""
    axes = attrs.get("axes")
    if len(node.input) > 1 and node.input[1]:  # opset 18 (ReduceSum: 13): the axes are an input
        axes = imp.const(node.input[1])
        if axes is None:
            raise where.refuse("the axes must be a constant")
    if axes is None or np.size(axes) == 0:  # none given: every axis, or none at all where noop_with_empty_axes says
        if int(attrs.get("noop_with_empty_axes", 0)):
            raise where.refuse("noop_with_empty_axes=1 with no axes: it reduces nothing")
        return None
    return sorted(int(a) + (rank if int(a) < 0 else 0) for a in np.ravel(axes)) if axes is not None else None


def _along_axes(imp: Importer, node: Any, where: Node, attrs: dict, fn: str, got: list[int] | None) -> None:
    """`fn(x, axis=..., keepdim=...)` over any axes but the batch."""
    rank = len(imp.shape(node.input[0], where))
    axes = list(range(rank)) if got is None else got
    if 0 in axes:
        raise where.refuse({"mean": "it averages", "sum": "it sums", "max": "it takes the maximum"}[fn]
                            + " over the batch axis")  # fmt: skip
    keep = "true" if int(attrs.get("keepdims", 1)) else "false"
    axis = str(axes[0]) if len(axes) == 1 else f"({', '.join(map(str, axes))})"
    imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)}, axis={axis}, keepdim={keep})")
