"""The convolution family's lowerings that compose registry ops (issues 33 and 34): asymmetric padding as an
explicit pad (an `indexed` statement, so it fuses and every backend writes its kernel) before a symmetrically padded
convolution or pooling; pooling's ceil mode as padding at the end (with avg_pool's divisor corrected where a window
hangs past the padded input, as PyTorch divides); conv_transpose's output padding past its stride as zero rows at
the end; and the 1-D layers as views of the 2-D ones on [N, C, 1, L].

Each function takes the elaborator and emits statements under the caller's layer; none makes parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepdsl.errors import DslArgumentError, DslShapeError, Span
from deepdsl.frontend.values import TensorVal
from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Var
from deepdsl.ir.types import INT_MAX

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator

Pads = tuple[int, int, int, int]  # (top, left, bottom, right), ONNX's pads order for 2-D: begins, then ends
_AXES = ("n", "c", "h", "w")


def pads(what: str, value: tuple[int, ...], span: Span, rank: int = 2) -> Pads:
    """A `pad=` argument as (top, left, bottom, right): an int (every side), a pair (h, w) (both sides of each),
    or (top, left, bottom, right); on a 1-D layer an int or (left, right)."""
    if rank == 1:
        if len(value) not in (1, 2):
            raise DslArgumentError(f"{what}: pad must be an integer or a pair (left, right), got {value}", span)
        left, right = (value[0], value[0]) if len(value) == 1 else value
        return (0, left, 0, right)
    if len(value) == 1:
        return (value[0],) * 4  # type: ignore[return-value]
    if len(value) == 2:
        return (value[0], value[1], value[0], value[1])
    if len(value) == 4:
        return tuple(value)  # type: ignore[return-value]
    raise DslArgumentError(
        f"{what}: pad must be an integer, a pair (h, w) or (top, left, bottom, right), got {len(value)} values {value}",
        span,
    )


def pad_explicitly(
    el: Elaborator, x: TensorVal, before: tuple[int, int], after: tuple[int, int], fill: float, span: Span, path: str,
    what: str,
) -> TensorVal:  # fmt: skip
    """x [N, C, H, W] with `before` (rows, columns) and `after` added around its image, valued `fill` (0, or -inf
    for max pooling); x itself where nothing is added."""
    if not any(before) and not any(after):
        return x
    n, c, h, w = x.shape
    (t, lft), (b, r) = before, after
    if max(h + t + b, w + lft + r) > INT_MAX:  # the generated programs index in ints
        raise DslShapeError(f"{what}: {x.origin} padded by ({t}, {lft}, {b}, {r}) is {h + t + b} x {w + lft + r}; at "
                            f"most {INT_MAX:,} (2^31 - 1) along an axis", span)  # fmt: skip
    out = (("n", n), ("c", c), ("h", h + t + b), ("w", w + lft + r))
    index = (Affine.var("n"), Affine.var("c"), Affine((("h", 1),), -t), Affine((("w", 1),), -lft))
    body = Read(0, index)  # reads outside x are zero
    if fill != 0:
        inside = Apply("and", (
            Apply("and", (Apply(">=", (Var("h"), Const(t))), Apply("<", (Var("h"), Const(t + h))))),
            Apply("and", (Apply(">=", (Var("w"), Const(lft))), Apply("<", (Var("w"), Const(lft + w))))),
        ))  # fmt: skip
        body = Apply("select", (inside, body, Const(fill)))
    return el.emit("indexed", (x,), span, path, what, out=out, body=body)


def pool_geometry(
    what: str, size: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int], p: Pads, ceil_mode: bool,
    span: Span, origin: str,
) -> tuple[tuple[int, int], tuple[int, int]]:  # fmt: skip
    """(output size, extra padding at the end) of a pooling along H and W with PyTorch's rules: floor or ceil
    division, and in ceil mode no window that starts past the input and its padding at the start; the extra
    padding is what the last ceil-mode window reads past the padding at the end."""
    outs, extra = [], []
    for axis, (d, k, s, before, after) in enumerate(zip(size, kernel, stride, p[:2], p[2:])):
        if before * 2 > k or after * 2 > k:
            raise DslShapeError(f"{what}: padding {max(before, after)} is more than half the window {k}", span)
        span_len = d + before + after
        if span_len < k:
            raise DslShapeError(f"{what}: a window of {k} with padding ({before}, {after}) does not fit the size {d} "
                                f"of {origin} along axis {axis + 2}", span)  # fmt: skip
        o = (span_len - k + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (o - 1) * s >= d + before:  # the last window would start in the padding at the end
            o -= 1
        outs.append(o)
        extra.append(max(0, (o - 1) * s + k - span_len))
    return (outs[0], outs[1]), (extra[0], extra[1])


def pool(
    el: Elaborator, op: str, what: str, x: TensorVal, kernel: tuple[int, int], stride: tuple[int, int], p: Pads,
    ceil_mode: bool, span: Span, path: str,
) -> TensorVal:  # fmt: skip
    """max_pool2d / avg_pool2d with any padding and ceil mode: the padding both sides share stays the op's own
    (its kernels and cuDNN's), the rest and ceil mode's extra rows are an explicit pad (-inf for max pooling, 0 for
    an average); an average whose window hangs past the padding at the end divides by the window's part inside the
    padded input (PyTorch's count_include_pad divisor) rather than the window's size."""
    (_, extra) = pool_geometry(what, x.shape[2:], kernel, stride, p, ceil_mode, span, x.origin)
    ph, pw = min(p[0], p[2]), min(p[1], p[3])
    before = (p[0] - ph, p[1] - pw)
    after = (p[2] - ph + extra[0], p[3] - pw + extra[1])
    fill = float("-inf") if op == "max_pool2d" else 0.0
    xp = pad_explicitly(el, x, before, after, fill, span, path, what)
    y = el.emit(op, (xp,), span, path, what, kernel=kernel, stride=stride, pad=(ph, pw))
    if op != "avg_pool2d" or not any(extra):
        return y
    # kernel size / the window's length inside the padded input: min(k, H + top + bottom - o * s) along each axis
    n, c, oh, ow = y.shape
    factors = []
    for var, d, k, s, total in zip(("h", "w"), x.shape[2:], kernel, stride, (p[0] + p[2], p[1] + p[3])):
        inside = Apply("min", (Const(k), Apply("-", (Const(d + total), Apply("*", (Var(var), Const(s)))))))
        factors.append(Apply("/", (Const(k), inside)))
    body = Apply("*", (Read(0, tuple(Affine.var(a) for a in _AXES)), Apply("*", tuple(factors))))
    return el.emit("indexed", (y,), span, path, what, out=tuple(zip(_AXES, (n, c, oh, ow))), body=body)


def as_image(el: Elaborator, x: TensorVal, span: Span, path: str, what: str) -> TensorVal:
    """[N, C, L] viewed as [N, C, 1, L]."""
    n, c, length = x.shape
    return el.emit("reshape", (x,), span, path, what, shape=(n, c, 1, length))


def as_sequence(el: Elaborator, y: TensorVal, span: Span, path: str, what: str) -> TensorVal:
    """[N, C, 1, L] viewed as [N, C, L]."""
    n, c, _, length = y.shape
    return el.emit("reshape", (y,), span, path, what, shape=(n, c, length))
