"""The import rule for Pad: each mode a tensor function over the padded output, the input read at affine positions.

- constant (nn.ZeroPad2d, F.pad; negative pads crop): the input shifted by the pads at the start; a read outside it
  is 0 in the language, so another pad value is a `select` on where the input lies;
- reflect (nn.ReflectionPad1d/2d/3d) and edge (nn.ReplicationPad*): along each padded axis a `select` on the
  index's range, the begin pad p reading `t[p - i]` (reflect) or `t[0]` (edge), the end pad the mirror image; the
  axes' selects nested, so the function is one statement whose reads stay affine (its gradient, derived like any
  other's, adds each read back where it came from);
- wrap (opset 19, circular padding): the same, the pads reading the other end of the axis.

Everything is bounded before the text is built: the output's elements (MAX_ELEMENTS), a crop of less than the axis,
a reflected pad of less than the axis (ONNX Runtime and PyTorch refuse more), a wrapped one of at most the axis, and
at most MAX_READS reads in the nested selects."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.ir.types import MAX_ELEMENTS
from deepdsl.onnx_import.rule_support import inputs_const, positive_axis, signature
from deepdsl.onnx_import.writing import Node, num

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer

MODES = ("constant", "reflect", "edge", "wrap")
MAX_READS = 27  # the reads of a mode's nested selects: three padded axes (nn.ReflectionPad3d), both sides each


def pad(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """Pad of a computed tensor (opset 2's attribute pads, opset 11's inputs, opset 18's axes) in any of ONNX's
    modes, as a tensor function; what the language cannot say exactly (padding the batch, a pad past what the mode
    reads) is refused."""
    shape = imp.shape(node.input[0], where)
    mode = attrs.get("mode", b"constant")
    mode = mode.decode(errors="replace") if isinstance(mode, bytes) else str(mode)
    if mode not in MODES:
        raise where.refuse(f"mode '{mode[:40]}': ONNX's Pad modes are {', '.join(MODES)}")
    got = inputs_const(imp, node, where, 1) if len(node.input) > 1 else [np.asarray(attrs.get("pads", []))]
    pads, value, axes = (got + [None, None, None])[:3]
    if pads is None:
        raise where.refuse("the pads must be given")
    rank = len(shape)
    axes_l = list(range(rank)) if axes is None else [positive_axis(int(a), rank) for a in np.ravel(axes)]
    if any(not 0 <= a < rank for a in axes_l) or len(set(axes_l)) != len(axes_l):
        raise where.refuse(f"axes {[int(a) for a in np.ravel(axes)][:8]} for an input of rank {rank}")
    flat = [int(v) for v in np.ravel(pads)]
    if len(flat) != 2 * len(axes_l):
        raise where.refuse(f"{len(flat)} pads for {len(axes_l)} axes")
    begin, end = [0] * rank, [0] * rank
    for a, b, e in zip(axes_l, flat[: len(axes_l)], flat[len(axes_l) :]):
        begin[a], end[a] = b, e
    if begin[0] or end[0]:
        raise where.refuse("it pads the batch axis")
    for d in range(rank):
        if min(begin[d], end[d]) <= -shape[d]:
            raise where.refuse(f"the pads {flat[:8]} crop axis {d} of size {shape[d]} by {-min(begin[d], end[d])}")
        if mode != "constant":
            _check_axis(mode, where, d, shape[d], begin[d], end[d], flat)
    out = [n + b + e for n, b, e in zip(shape, begin, end)]
    if min(out) < 1:
        raise where.refuse(f"the pads {flat[:8]} leave an axis of size {min(out)}")
    if math.prod(out) > MAX_ELEMENTS:
        raise where.refuse(f"the pads {flat[:8]} make {math.prod(out):,} elements; at most {MAX_ELEMENTS:,}")
    idx = [f"i{d}" for d in range(rank)]
    ranges = ", ".join(idx[d] if (begin[d], end[d]) == (0, 0) else f"{idx[d]}: {out[d]}" for d in range(rank))
    if mode == "constant":
        body = _constant(attrs, value, where, shape, begin, end)
    else:
        body = _from_the_input(mode, where, shape, begin, end)
    key = ("Pad", ranges, body)
    if key not in imp.functions:  # written once for the nodes that pad alike (a ResNet generator's blocks)
        fn = imp.functions[key] = imp.names.make(f"{mode}_pad_fn" if mode != "constant" else "pad_fn", "fn")
        note = f"Pad {flat}" if mode == "constant" else f"Pad {flat}, {mode}"
        imp.tensor_fns += [f"tensor {fn}({signature(rank)}) -> [{ranges}] = {body}   # {note}", ""]
    imp.bind(node, f"{imp.functions[key]}({imp.tensor(node.input[0], where)})")


def _shifted(i: str, by: int) -> str:
    """The index `i - by`, as the language writes it."""
    return i if not by else f"{i} {'-' if by > 0 else '+'} {abs(by)}"


def _constant(attrs: dict, value: Any, where: Node, shape: tuple[int, ...], begin: list[int], end: list[int]) -> str:
    """The input shifted by the pads at the start; the pad value, where it is not 0, a `select` on where it lies."""
    fill = float(np.ravel(value)[0]) if value is not None and np.size(value) else float(attrs.get("value", 0.0))
    if np.isnan(fill):
        raise where.refuse("the pad value is NaN")
    rank = len(shape)
    idx = [f"i{d}" for d in range(rank)]
    body = f"t[{', '.join(_shifted(idx[d], begin[d]) for d in range(rank))}]"
    if fill == 0:
        return body
    inside = " and ".join(f"{idx[d]} >= {begin[d]} and {idx[d]} < {begin[d] + shape[d]}"
                          for d in range(rank) if begin[d] > 0 or end[d] > 0)  # fmt: skip
    text = num(fill) if np.isfinite(fill) else "inf" if fill > 0 else "-inf"  # -inf before a max pool
    return f"{inside} ? {body} : {text}" if inside else body


def _pieces(mode: str, i: str, n: int, b: int, e: int) -> list[tuple[str | None, str]]:
    """Along one axis of size n padded by b and e: (the condition on the output index i, the input index read), the
    last piece without a condition."""
    inside = _shifted(i, b)
    if not (b or e):
        return [(None, inside)]
    before = {"reflect": f"{b} - {i}", "edge": "0", "wrap": _shifted(i, b - n)}[mode]
    after = {"reflect": f"{2 * (n - 1) + b} - {i}", "edge": str(n - 1), "wrap": _shifted(i, b + n)}[mode]
    pieces = [(f"{i} < {b}", before)] if b else []
    return pieces + ([(f"{i} < {b + n}", inside), (None, after)] if e else [(None, inside)])


def _check_axis(mode: str, where: Node, d: int, n: int, b: int, e: int, flat: list[int]) -> None:
    """Refuse what reflect, edge or wrap cannot read along axis d of size n: a crop, a pad past the axis."""
    if min(b, e) < 0:
        raise where.refuse(f"the pads {flat[:8]} crop axis {d} in mode '{mode}'; deepdsl crops in constant mode")
    if mode == "reflect" and max(b, e) >= n:
        raise where.refuse(f"mode 'reflect' pads axis {d} of size {n} by {max(b, e)}: a reflected pad must be "
                           "smaller than the axis (ONNX Runtime and PyTorch refuse it too)")  # fmt: skip
    if mode == "wrap" and max(b, e) > n:
        raise where.refuse(f"mode 'wrap' pads axis {d} of size {n} by {max(b, e)}: deepdsl wraps at most once")


def _from_the_input(mode: str, where: Node, shape: tuple[int, ...], begin: list[int], end: list[int]) -> str:
    """reflect, edge and wrap: each output element reads one input element; along each padded axis a `select` on
    the output index's range picks the read, the axes' selects nested."""
    pieces = [_pieces(mode, f"i{d}", shape[d], begin[d], end[d]) for d in range(len(shape))]
    padded = [d for d, p in enumerate(pieces) if len(p) > 1]  # the selects nest over these alone: a few
    reads = math.prod(len(pieces[d]) for d in padded)
    if reads > MAX_READS:
        raise where.refuse(f"mode '{mode}' along {len(padded)} axes reads the input at {reads:,} places; deepdsl "
                           f"imports at most {MAX_READS} (three axes padded at both ends)")  # fmt: skip

    def nest(k: int, index: tuple[str, ...]) -> str:
        """The selects of padded axes k, k+1, ..., the indices of the axes before them fixed in `index`."""
        if k == len(padded):
            return f"t[{', '.join(index)}]"
        d = padded[k]
        *conditional, (_, last) = pieces[d]
        text = nest(k + 1, (*index[:d], last, *index[d + 1 :]))
        for cond, read in reversed(conditional):
            text = f"{cond} ? {_wrapped(nest(k + 1, (*index[:d], read, *index[d + 1 :])))} : {_wrapped(text)}"
        return text

    return nest(0, tuple(p[0][1] for p in pieces))  # an axis not padded reads its own index


def _wrapped(text: str) -> str:
    return f"({text})" if " ? " in text else text
