"""The built-in pooling layers, none with parameters: `max_pool` and `avg_pool` on [N, C, H, W] images and their
1-D forms `max_pool1d` and `avg_pool1d` on [N, C, L] sequences, `global_avg_pool` (on either), `adaptive_avg_pool`,
and `upsample`, which resizes an image.

Asymmetric padding and ceil mode are composed in frontend/convs.py, and a 1-D layer is the 2-D one on the view
[N, C, 1, L] (issue 34).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepdsl.errors import DslArgumentError, Span
from deepdsl.frontend import convs
from deepdsl.frontend.builtins import Apply, Args, ArgSpec, builtin, need_rank
from deepdsl.frontend.values import TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


def _pool(op: str, what: str) -> Apply:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        (x,) = xs
        one_d = what.endswith("1d")
        hint = f"{what} works on " + ("[N, C, L] sequences" if one_d else "[N, C, H, W] images")
        need_rank(x, (3,) if one_d else (4,), what, span, hint)
        stride = a["stride"] if a["stride"] is not None else a["kernel"]
        p = convs.pads(what, a["pad"], span, rank=1 if one_d else 2)
        if one_d:  # a view of the 2-D pooling on [N, C, 1, L] with (1, k) windows
            kernel, stride = (1, a["kernel"]), (1, stride)
            y = convs.pool(el, op, what, convs.as_image(el, x, span, path, what), kernel, stride, p,
                           a["ceil_mode"], span, path)  # fmt: skip
            return convs.as_sequence(el, y, span, path, what)
        if p[:2] == p[2:] and not a["ceil_mode"]:
            return el.emit(op, (x,), span, path, what, kernel=a["kernel"], stride=stride, pad=p[:2])
        return convs.pool(el, op, what, x, a["kernel"], stride, p, a["ceil_mode"], span, path)

    return apply


# the 2-D layers take a pair (or one int for both axes) for kernel and stride, the 1-D ones an int
for _op, _what, _size in (
    ("max_pool2d", "max_pool", "pair"),
    ("avg_pool2d", "avg_pool", "pair"),
    ("max_pool2d", "max_pool1d", "int"),
    ("avg_pool2d", "avg_pool1d", "int"),
):
    builtin(
        _what,
        ArgSpec("kernel", _size, low=1),
        ArgSpec("stride", _size, None, low=1),
        ArgSpec("pad", "ints", 0, low=0),
        ArgSpec("ceil_mode", "bool", False),
    )(_pool(_op, _what))


@builtin("global_avg_pool")
def global_avg_pool(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # [N, C, H, W] -> [N, C, 1, 1]; [N, C, L] -> [N, C, 1] (PyTorch's AdaptiveAvgPool1d(1)), a view of the 2-D one
    need_rank(xs[0], (3, 4), "global_avg_pool", span)
    if len(xs[0].shape) == 3:
        y = el.emit("global_avg_pool", (convs.as_image(el, xs[0], span, path, "global_avg_pool"),), span, path,
                    "global_avg_pool")  # fmt: skip
        return convs.as_sequence(el, y, span, path, "global_avg_pool")
    return el.emit("global_avg_pool", xs, span, path, "global_avg_pool")


@builtin("upsample", ArgSpec("factor", "int", low=1), ArgSpec("mode", "str", "nearest"),
         ArgSpec("align_corners", "bool", False))  # fmt: skip
def upsample(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # [N, C, H, W] -> [N, C, f·H, f·W] (PyTorch's F.interpolate(scale_factor=f), align_corners as given): along H,
    # then along W (ops/resize.py; align_corners=true is its mode bilinear_align_corners)
    (x,) = xs
    need_rank(x, (4,), "upsample", span, "upsample works on [N, C, H, W] images")
    if a["mode"] not in ("nearest", "bilinear"):
        raise DslArgumentError(f'upsample: mode must be "nearest" or "bilinear", got {a["mode"]!r}', span)
    mode = a["mode"]
    if a["align_corners"]:
        if mode != "bilinear":
            why = "it moves the source coordinates of an interpolation; nearest has none, as in PyTorch"
            raise DslArgumentError(f'upsample: align_corners=true needs mode="bilinear" ({why})', span)
        mode = "bilinear_align_corners"
    for axis in (2, 3):
        x = el.emit("resize_axis", (x,), span, path, "upsample", axis=axis, factor=a["factor"], mode=mode)
    return x


@builtin("adaptive_avg_pool", ArgSpec("size", "pair", low=1))
def adaptive_avg_pool(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.AdaptiveAvgPool2d(size): output (i, j) averages rows ⌊i·H/oh⌋ .. ⌈(i+1)·H/oh⌉ - 1 and the same of the
    columns. Where oh divides H and ow divides W, avg_pool2d (global_avg_pool to 1x1); else the separable map along
    each axis (ops/adaptive_pool.py), whose windows differ in length and may overlap."""
    (x,) = xs
    need_rank(x, (4,), "adaptive_avg_pool", span, "adaptive_avg_pool works on [N, C, H, W] images")
    (h, w), (oh, ow) = x.shape[2:], a["size"]
    if (oh, ow) == (1, 1):
        return el.emit("global_avg_pool", xs, span, path, "adaptive_avg_pool")
    if h % oh == 0 and w % ow == 0:
        k = (h // oh, w // ow)
        return el.emit("avg_pool2d", xs, span, path, "adaptive_avg_pool", kernel=k, stride=k, pad=(0, 0))
    for axis, size in ((2, oh), (3, ow)):
        if x.shape[axis] != size:
            x = el.emit("adaptive_pool_axis", (x,), span, path, "adaptive_avg_pool", axis=axis, size=size)
    return x
