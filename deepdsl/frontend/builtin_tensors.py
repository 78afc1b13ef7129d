"""The built-in functions of tensors, none with parameters (shapes as in PyTorch): shapes and views (`flatten`,
`reshape`, `transpose`, `permute`, `concat`), `matmul`, `softmax` and `log_softmax` along an axis, slicing (`slice`,
`chunk`), reductions along axes (`sum`, `mean`, `max`) and explicit broadcasting (`expand`).

An axis counts from the end when negative (-1 is the last), as in Python and PyTorch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deepdsl.errors import DslArgumentError, DslShapeError, Span
from deepdsl.frontend.builtins import Apply, Args, ArgSpec, builtin, need_rank, origin_notes, view
from deepdsl.frontend.values import TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


@builtin("flatten")
def flatten(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "flatten", span)
    shape = (x.shape[0], math.prod(x.shape[1:]))
    return el.emit("reshape", xs, span, path, "flatten", shape=shape)


@builtin("concat", ArgSpec("axis", "int", 1, low=0), inputs=-1, layer=False)
def concat(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    if len(xs) < 2:
        raise DslArgumentError("concat needs at least two tensors", span)
    return el.emit("concat", xs, span, path, "concat", axis=a["axis"])


# ---- the Transformer's vocabulary: products, axes, shapes, row normalisation -------------------------------


def _axis(x: TensorVal, axis: int, what: str, span: Span) -> int:
    """`axis` of x, counted from the end when negative (-1 is the last)."""
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise DslShapeError(f"{what}: axis {axis} is out of range for {x.value.type} from {x.origin}", span)
    return axis % rank


@builtin("matmul", ArgSpec("transpose_a", "bool", False), ArgSpec("transpose_b", "bool", False), inputs=2,
         layer=False)  # fmt: skip
def matmul(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """op(a) @ op(b) over the last two axes; leading axes are batches (equal in both, or b 2-D: a weight)."""
    x, y = xs
    ta, tb = a["transpose_a"], a["transpose_b"]
    if len(x.shape) < 2 or len(y.shape) < 2:
        raise DslShapeError("matmul needs operands of at least 2 axes", span, notes=origin_notes(x, y))
    m, k = (x.shape[-1], x.shape[-2]) if ta else x.shape[-2:]
    k2, n = (y.shape[-1], y.shape[-2]) if tb else y.shape[-2:]
    if k != k2:
        sides = f"{'op(a)' if ta else 'a'} is [{m}, {k}], {'op(b)' if tb else 'b'} is [{k2}, {n}]"
        raise DslShapeError(f"matmul: inner sizes differ ({k} vs {k2}): {sides}", span, notes=origin_notes(x, y),
                            hint="transpose_a=true / transpose_b=true multiply by a transposed operand")  # fmt: skip
    attrs = {"transpose_a": ta, "transpose_b": tb}
    if len(x.shape) == 2 and len(y.shape) == 2:
        return el.emit("matmul", xs, span, path, "matmul", **attrs)
    lead = tuple(x.shape[:-2])
    if len(y.shape) == 2 and not ta:  # a batch of rows times one matrix: one GEMM over every row
        rows = view(el, x, (math.prod(x.shape[:-1]), k), span, path, "matmul")
        out = el.emit("matmul", (rows, y), span, path, "matmul", **attrs)
        return view(el, out, (*x.shape[:-1], n), span, path, "matmul")
    if tuple(y.shape[:-2]) != lead:
        raise DslShapeError(f"matmul: the batch axes differ ({x.value.type} and {y.value.type})", span,
                            notes=origin_notes(x, y))  # fmt: skip
    batch = math.prod(lead)
    x3 = view(el, x, (batch, *x.shape[-2:]), span, path, "matmul")
    y3 = view(el, y, (batch, *y.shape[-2:]), span, path, "matmul")
    out = el.emit("batch_matmul", (x3, y3), span, path, "matmul", **attrs)
    return view(el, out, (*lead, m, n), span, path, "matmul")


def _permute(el: Elaborator, x: TensorVal, perm: tuple[int, ...], span: Span, path: str, kind: str) -> TensorVal:
    if perm == tuple(range(len(perm))):
        return x
    return el.emit("transpose", (x,), span, path, kind, perm=perm)


@builtin("transpose", ArgSpec("a", "int", -2), ArgSpec("b", "int", -1))
def transpose(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Axes a and b swapped (torch.transpose); by default the last two."""
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "transpose", span)
    i, j = _axis(x, a["a"], "transpose", span), _axis(x, a["b"], "transpose", span)
    perm = list(range(len(x.shape)))
    perm[i], perm[j] = j, i
    return _permute(el, x, tuple(perm), span, path, "transpose")


@builtin("permute", ArgSpec("axes", "ints"))
def permute(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Output axis i is input axis axes[i] (torch.permute)."""
    (x,) = xs
    axes = tuple(_axis(x, k, "permute", span) for k in a["axes"])
    if len(axes) != len(x.shape) or sorted(axes) != list(range(len(x.shape))):
        raise DslShapeError(f"permute: {a['axes']} is not a permutation of the {len(x.shape)} axes of "
                            f"{x.value.type} from {x.origin}", span)  # fmt: skip
    return _permute(el, x, axes, span, path, "permute")


@builtin("reshape", ArgSpec("shape", "ints", low=-1))
def reshape(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """The same elements in another shape, a view; one size may be -1, inferred from the others."""
    (x,) = xs
    shape, total = list(a["shape"]), math.prod(x.shape)
    if 0 in shape or shape.count(-1) > 1:
        raise DslArgumentError("reshape: every size must be at least 1, and at most one may be -1", span)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape and total % known == 0:
        shape[shape.index(-1)] = total // known
    if math.prod(shape) != total:
        want = ", ".join(map(str, a["shape"]))
        holds = f"no size for -1 fits (not a multiple of {known:,})" if -1 in a["shape"] else f"holds {known:,}"
        raise DslShapeError(f"reshape: {x.value.type} from {x.origin} has {total:,} elements; [{want}] {holds}",
                            span, hint="the sizes of a reshape must multiply to the input's element count")  # fmt: skip
    return view(el, x, tuple(shape), span, path, "reshape")


def _softmax(op: str) -> Apply:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        # the registry op works on the rows of [R, K]: move the axis last (a transpose unless it is), view the
        # rest as rows (free), and undo both
        (x,) = xs
        need_rank(x, (2, 3, 4, 5, 6), op, span)
        axis, rank = _axis(x, a["axis"], op, span), len(x.shape)
        perm = tuple(k for k in range(rank) if k != axis) + (axis,)
        moved = _permute(el, x, perm, span, path, op)
        rows = view(el, moved, (math.prod(moved.shape[:-1]), moved.shape[-1]), span, path, op)
        out = view(el, el.emit(op, (rows,), span, path, op), tuple(moved.shape), span, path, op)
        return _permute(el, out, tuple(perm.index(k) for k in range(rank)), span, path, op)

    return apply


for _name in ("softmax", "log_softmax"):
    builtin(_name, ArgSpec("axis", "int", 1))(_softmax(_name))


# ---- slicing, reductions along axes and explicit broadcasting (issue 34) -----------------------------------


def _float_input(x: TensorVal, what: str, span: Span) -> None:
    if x.value.type.dtype.value != "f32":
        raise DslShapeError(f"{what} expects float data, got {x.value.type} from {x.origin}", span)


def _slice_along(el: Elaborator, x: TensorVal, axis: int, start: int, stop: int, span: Span, kind: str) -> TensorVal:
    if start == 0 and stop == x.shape[axis]:
        return x
    return el.emit("slice", (x,), span, "", kind, axis=axis, start=start, stop=stop)


@builtin("slice", ArgSpec("start", "int"), ArgSpec("end", "int"), ArgSpec("axis", "int", 1), layer=False)
def slice_(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """x[start:end] along axis; negative positions and axes count from the end (Python's), nothing is clipped."""
    (x,) = xs
    _float_input(x, "slice", span)
    axis = _axis(x, a["axis"], "slice", span)
    size = x.shape[axis]
    at = {}
    for key in ("start", "end"):
        v = a[key]
        at[key] = v + size if v < 0 else v
        if not 0 <= at[key] <= size:
            raise DslShapeError(f"slice: {key} {v} is out of range for axis {axis} of size {size} "
                                f"({x.value.type} from {x.origin})", span)  # fmt: skip
    if at["start"] >= at["end"]:
        shape = ", ".join(map(str, x.shape))
        raise DslShapeError(f"slice: {a['start']}:{a['end']} along axis {axis} of [{shape}] is empty", span,
                            hint="start must come before end (negative positions count from the end)")  # fmt: skip
    return _slice_along(el, x, axis, at["start"], at["end"], span, "slice")


@builtin("chunk", ArgSpec("i", "int", low=0), ArgSpec("parts", "int", low=1), ArgSpec("axis", "int", 1), layer=False)
def chunk(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Part i (from 0) of `parts` equal parts along axis (the language has no tuples of tensors to return all)."""
    (x,) = xs
    _float_input(x, "chunk", span)
    axis = _axis(x, a["axis"], "chunk", span)
    size, parts, i = x.shape[axis], a["parts"], a["i"]
    if size % parts:
        raise DslShapeError(f"chunk: axis {axis} of size {size} does not split into {parts} equal parts "
                            f"({x.value.type} from {x.origin})", span,
                            hint="slice(x, start, end, axis=...) takes any part")  # fmt: skip
    if i >= parts:
        raise DslArgumentError(f"chunk: part {i} of {parts} does not exist (parts count from 0)", span)
    step = size // parts
    return _slice_along(el, x, axis, i * step, (i + 1) * step, span, "chunk")


def _reduce_axes(x: TensorVal, axis: tuple[int, ...] | None, what: str, span: Span) -> tuple[int, ...]:
    """The axes a reduction runs over, each counted from the end when negative; all of them when left out."""
    if axis is None:
        return tuple(range(len(x.shape)))
    out: list[int] = []
    for k in axis:
        j = _axis(x, k, what, span)
        if j in out:
            raise DslArgumentError(f"{what}: axis {j} is given twice (as {k})", span)
        out.append(j)
    return tuple(sorted(out))


def _along_axes(what: str) -> Apply:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        (x,) = xs
        _float_input(x, what, span)
        axes = _reduce_axes(x, a["axis"], what, span)
        if not axes:  # a scalar reduced over all (no) axes is itself
            return x
        if what == "max":
            y = el.emit("max_axes", (x,), span, "", what, axes=axes)
        elif len(axes) == len(x.shape):
            y = el.emit("sum", (x,), span, "", what)
        else:
            y = el.emit("sum_axes", (x,), span, "", what, axes=axes)
        if what == "mean":
            y = el.emit("mul_scalar", (y,), span, "", what, value=1.0 / math.prod(x.shape[k] for k in axes))
        if a["keepdim"]:
            y = view(el, y, tuple(1 if k in axes else n for k, n in enumerate(x.shape)), span, "", what)
        return y

    return apply


for _name in ("sum", "mean", "max"):
    builtin(_name, ArgSpec("axis", "ints", None), ArgSpec("keepdim", "bool", False), layer=False)(_along_axes(_name))


@builtin("expand", ArgSpec("shape", "ints"), layer=False)
def expand(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Explicit broadcasting: the size-1 axes of x repeated to `shape` (same rank; -1 keeps an axis' size)."""
    (x,) = xs
    _float_input(x, "expand", span)
    want, have = a["shape"], x.shape
    if len(want) != len(have):
        hint = "expand keeps the rank: reshape first to add size-1 axes"
        raise DslShapeError(f"expand: {x.value.type} has {len(have)} axes, the shape {want} has {len(want)}", span,
                            notes=origin_notes(x), hint=hint)  # fmt: skip
    shape = []
    for k, (n, m) in enumerate(zip(have, want)):
        if m == -1:
            m = n
        if m < 1:
            raise DslArgumentError(f"expand: size {m} for axis {k}; a size is at least 1, or -1 (keep it)", span)
        if n != m and n != 1:
            raise DslShapeError(f"expand: axis {k} of {x.value.type} has size {n}, not 1, so it cannot grow to {m}",
                                span, notes=origin_notes(x))  # fmt: skip
        shape.append(m)
    if tuple(shape) == tuple(have):
        return x
    return el.emit("expand", (x,), span, "", "expand", shape=tuple(shape))
