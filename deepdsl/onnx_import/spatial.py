"""Import rules for the operators over an image's H and W: Conv (groups, strides, symmetric pads; dilations and
asymmetric pads where the language has them), ConvTranspose (`conv_transpose`, `output_padding=`), MaxPool and
AveragePool (`ceil_mode=true` where it changes the output), GlobalAveragePool, and Resize by one integer factor of
H and W (`upsample`, nearest or bilinear; two Resizes, as deepdsl exports upsample, taken as one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslShapeError
from deepdsl.frontend.convs import pool_geometry
from deepdsl.ir.types import MAX_ELEMENTS
from deepdsl.onnx_import.rule_support import Renamed, computed_zeros, folded_norm
from deepdsl.onnx_import.writing import Node, call, pair

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def int_list(attrs: dict, key: str, default: list[int]) -> list[int]:
    return [int(v) for v in attrs.get(key, default)]


def _lifted(attrs: dict) -> dict:
    """A 1-D window op's attributes as the 2-D op's on [N, C, 1, L] (as the language's conv1d and pools are)."""
    ones = {"kernel_shape": 1, "strides": 1, "dilations": 1}
    out = dict(attrs)
    for key, one in ones.items():
        if key in attrs:
            out[key] = [one, *attrs[key]]
    if "pads" in attrs:
        out["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    if "strides" not in attrs:
        out["strides"] = [1, 1]
    return out


def _spatial(imp: Importer, node: Any, where: Node, attrs: dict, kernel: tuple[int, int]) -> tuple[tuple, tuple]:
    """(stride, pads as (top, left, bottom, right)) of a 2-D window op (or a 1-D one, `_lifted`, on [N, C, 1, L]),
    auto_pad's SAME_UPPER, SAME_LOWER and VALID spelled out as ONNX defines them."""
    strides = tuple(int_list(attrs, "strides", [1, 1]))
    pads = int_list(attrs, "pads", [0, 0, 0, 0])
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        h, w = (1, *imp.shape(node.input[0], where)[2:])[-2:]
        pads = []
        for size, k, s in zip((h, w), kernel, strides):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            pads.append(total)
        before = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in pads]
        pads = [before[0], before[1], pads[0] - before[0], pads[1] - before[1]]
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    if len(pads) != 4 or len(strides) != 2:
        raise where.refuse("only 2-D windows are supported (an NCHW input)")
    return strides, tuple(pads)


def _pad_1d(pad: tuple[int, ...]) -> dict[str, str]:
    """The `pad=` of a 1-D window op from the 2-D op's (top, left, bottom, right) on [N, C, 1, L]: `(left, right)`,
    one number where they agree, nothing where both are 0."""
    if pad[1] == pad[3]:
        return {"pad": str(pad[1])} if pad[1] else {}
    return {"pad": f"({pad[1]}, {pad[3]})"}


def _dilation(where: Node, attrs: dict, fn: str) -> str | None:
    """A convolution's dilation as the `dilation=` value, None where it is 1."""
    d = tuple(int_list(attrs, "dilations", [1, 1]))
    if d == (1, 1):
        return None
    return pair(d)


def conv(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    w = imp.const(node.input[1])
    if w is None:
        raise where.refuse("the weight must be an initialiser (a constant)")
    rank = len(imp.shape(node.input[0], where))
    if w.ndim != rank or rank not in (3, 4):
        raise where.refuse(f"only 1-D and 2-D convolutions are supported (weight of rank {w.ndim})")
    if rank == 3:  # nn.Conv1d: the language's conv1d, a view of conv on [N, C, 1, L]
        attrs, w = _lifted(attrs), w[:, :, None, :]
    b = imp.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and b is None:
        raise where.refuse("the bias must be an initialiser (a constant)")
    if b is not None and computed_zeros(imp, node.input[2]):  # no bias in the model: the exporter's zeros
        b = None
    kernel = (int(w.shape[2]), int(w.shape[3]))
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != kernel:
        raise where.refuse(f"kernel_shape {list(attrs['kernel_shape'])} differs from the weight's {list(kernel)}")
    stride, pad = _spatial(imp, node, where, attrs, kernel)
    kw = {"kernel": pair(kernel)}
    if stride != (1, 1):
        kw["stride"] = pair(stride)
    if pad[:2] != pad[2:]:  # conv's pad=(top, left, bottom, right)
        kw["pad"] = f"({', '.join(map(str, pad))})"
    elif pad[:2] != (0, 0):
        kw["pad"] = pair(pad[:2])
    dilation = _dilation(where, attrs, "conv")
    if dilation is not None:
        kw["dilation"] = dilation
    fn, args = "conv", [str(w.shape[0])]
    if rank == 3:  # the same in conv1d's terms: one kernel size, stride and dilation, pad (left, right)
        fn, args, w = "conv1d", [str(w.shape[0]), str(kernel[1])], w[:, :, 0, :]
        dilation1 = int_list(attrs, "dilations", [1, 1])[1]
        kw = {}
        if stride[1] != 1:
            kw["stride"] = str(stride[1])
        kw.update(_pad_1d(pad))
        if dilation1 != 1:
            kw["dilation"] = str(dilation1)
    groups = int(attrs.get("group", 1))
    if groups != 1:
        kw["groups"] = str(groups)
    if b is None:
        kw["bias"] = "false"
    params = {"W": w} if b is None else {"W": w, "b": b.reshape(-1)}
    sources = [i for i in node.input[1 : 2 if b is None else 3] if i]
    folded = folded_norm(imp, node)
    own = node.input[1].removesuffix(".weight")  # the dynamo exporter names a folded node after its batch norm
    if folded and own != node.input[1] and "/" not in where.base:  # the convolution's module names it instead
        where = dataclasses.replace(where, base=own)
    name = imp.layer(node, where, call(where, fn, args, kw), params, sources)
    if folded and name not in imp.folded_norms:
        imp.folded_norms.append(name)
    imp.bind(node, f"{name}({x})", name)


@dataclass(frozen=True)
class _Axis:
    """One axis of an ONNX pooling: the input's size, the window, the stride, the padding at the start and at the
    end, and the output's size (ONNX shape inference's, which is ONNX Runtime's)."""

    name: str  # H or W, for messages
    size: int
    kernel: int
    stride: int
    begin: int
    end: int
    out: int

    def onnx_windows(self, divisor: str) -> list[tuple[int, int, int]]:
        """Each output's window as ONNX computes it: the input it reads (first, last + 1) and, for an average, what
        it divides by: with count_include_pad (`divisor` "pad") the window's part before the end of the padding,
        without ("real") the elements it reads."""
        out = []
        for i in range(self.out):
            start = i * self.stride - self.begin
            lo, hi = max(start, 0), min(start + self.kernel, self.size)
            by = {"pad": min(start + self.kernel, self.size + self.end) - start, "real": hi - lo}.get(divisor, 0)
            out.append((lo, hi, by))
        return out

    def language_windows(self, before: int, after: int, count: int, divisor: str) -> list[tuple[int, int, int]]:
        """The same of the language's pool padded by (before, after) with `count` outputs: an average divides by the
        window's part inside the padded input, the window's size but where ceil mode's last window hangs past it
        (frontend/convs.py's divisor correction)."""
        out = []
        for i in range(count):
            start = i * self.stride - before
            lo, hi = max(start, 0), min(start + self.kernel, self.size)
            out.append((lo, hi, min(start + self.kernel, self.size + after) - start if divisor else 0))
        return out


def _differs(fn: str, axes: tuple[_Axis, _Axis], pad: tuple[int, ...], ceil: bool, divisor: str) -> str | None:
    """Why the language's `fn` with `pad` (top, left, bottom, right) and `ceil` reads other windows than the ONNX
    pooling (or divides them otherwise), None where it reads the very same ones."""
    try:
        sizes, _ = pool_geometry(fn, (axes[0].size, axes[1].size), (axes[0].kernel, axes[1].kernel),
                                 (axes[0].stride, axes[1].stride), pad, ceil, None, "its input")  # type: ignore[arg-type]  # fmt: skip
    except DslShapeError as e:
        return e.message
    for a, count, before, after in zip(axes, sizes, pad[:2], pad[2:]):
        if count != a.out:
            return f"{count} output{'s' if count != 1 else ''} along {a.name}, not ONNX's {a.out}"
        theirs, ours = a.onnx_windows(divisor), a.language_windows(before, after, count, divisor)
        for i, (t, o) in enumerate(zip(theirs, ours)):
            if t != o:  # the windows start alike (the same padding at the start): only an average's divisor differs
                return f"output {i} along {a.name} averages over {o[2]} values, ONNX's over {t[2]}"
    return None


def _written(pad: tuple[int, ...], ceil: bool) -> dict[str, str]:
    kw = {}
    if pad[:2] != pad[2:]:
        kw["pad"] = f"({', '.join(map(str, pad))})"
    elif pad[:2] != (0, 0):
        kw["pad"] = pair(pad[:2])
    if ceil:
        kw["ceil_mode"] = "true"
    return kw


def _pool_form(fn: str, where: Node, axes: tuple[_Axis, _Axis], divisor: str, what: str) -> tuple[tuple, bool]:
    """The pad (top, left, bottom, right) and ceil mode of the language's pool that reads the very windows the ONNX
    pooling reads and, for an average, divides each by the same count. Tried in turn: the padding at the start on
    both sides, in floor then in ceil mode (where the padding at the end exceeds the start's, ceil mode's last
    window is ONNX's: a 1-D pool in ceil mode as deepdsl exports it, TensorFlow's SAME), then ONNX's pads as (top,
    left, bottom, right), in floor then in ceil mode; ceil mode is one setting for both axes, so a form must hold
    along both. Refused with why each form differs (`what`: the pads, the window and the strides, as the message
    names them)."""
    for a in axes:  # each window is listed below: bounded first (a hostile model's pads or sizes would be billions)
        if a.size > MAX_ELEMENTS or a.out > MAX_ELEMENTS or a.kernel > MAX_ELEMENTS:
            raise where.refuse(f"{what}: {max(a.size, a.out, a.kernel):,} positions along {a.name}; the backends take "
                               f"at most {MAX_ELEMENTS:,}")  # fmt: skip
        if a.begin > a.kernel or a.end > a.kernel or a.begin < 0 or a.end < 0 or a.stride < 1:
            raise where.refuse(f"{what}: padding of more than a window (or negative), or a stride below 1, along "
                               f"{a.name}; the language's pools have none")  # fmt: skip
    for a in axes:
        empty = next((i for i, (lo, hi, _) in enumerate(a.onnx_windows(divisor)) if lo >= hi), None)
        if empty is not None:
            raise where.refuse(f"{what}: output {empty} along {a.name} is a window past the input (padding alone); "
                               "the language's pools have none")  # fmt: skip
    sym = (axes[0].begin, axes[1].begin) * 2
    onnx_pads = (axes[0].begin, axes[1].begin, axes[0].end, axes[1].end)
    why: list[str] = []
    for pad in dict.fromkeys((sym, onnx_pads)):
        floor = _differs(fn, axes, pad, False, divisor)
        if floor is None:
            return pad, False
        ceil = _differs(fn, axes, pad, True, divisor)
        if ceil is None:
            return pad, True
        form = ", ".join(f"{k}={v}" for k, v in _written(pad, False).items()) or "no padding"
        if ceil == floor:
            why.append(f"{form}, either ceil_mode: {floor}")
        else:
            why += [f"{form}: {floor}", f"{form}, ceil_mode=true: {ceil}"]
    raise where.refuse(f"{what}: no {fn} of the language reads the same windows ({'; '.join(why)})")


def pool(fn: str) -> Callable[..., None]:
    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        x = imp.tensor(node.input[0], where)
        shape = imp.shape(node.input[0], where)
        if len(shape) not in (3, 4):
            raise where.refuse("only 1-D and 2-D pooling is supported (an [N, C, L] or NCHW input)")
        one_d = len(shape) == 3
        if one_d:  # max_pool1d / avg_pool1d: the 2-D pool on [N, C, 1, L]
            attrs, shape = _lifted(attrs), (*shape[:2], 1, shape[2])
        kernel = tuple(int_list(attrs, "kernel_shape", []))
        if len(kernel) != 2:
            raise where.refuse(f"kernel_shape {list(kernel)}: only 2-D windows are supported")
        stride, pads = _spatial(imp, node, where, attrs, kernel)  # type: ignore[arg-type]
        if any(d != 1 for d in int_list(attrs, "dilations", [1, 1])):
            raise where.refuse(f"dilations {int_list(attrs, 'dilations', [1, 1])}: the language has no dilated windows")
        if int(attrs.get("storage_order", 0)):
            raise where.refuse("storage_order=1 is not supported")
        imp.only_output(node, where)
        divisor = ""
        if fn == "avg_pool":
            divisor = "pad" if int(attrs.get("count_include_pad", 0)) else "real"
            if divisor == "real" and any(pads[:2]):
                raise where.refuse(f"count_include_pad=0 with padding {list(pads)}: the language's avg_pool counts "
                                   "the padding at the start")  # fmt: skip
        out = (1, *imp.shape(node.output[0], where)[2:])[-2:]
        axes = tuple(_Axis(n, *a) for n, a in zip("HW", zip(shape[2:], kernel, stride, pads[:2], pads[2:], out)))
        auto = attrs.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else str(auto)
        what = f"pads {list(pads)}" + (f" (auto_pad {auto})" if auto != "NOTSET" else "")
        what += f", kernel {list(kernel)}, strides {list(stride)}" + (", ceil_mode=1" if attrs.get("ceil_mode") else "")
        pad, ceil = _pool_form(fn, where, axes, divisor, what)  # type: ignore[arg-type]
        if one_d:  # in the 1-D pool's terms: one window, stride, pad (left, right)
            kw = {"stride": str(stride[1])} if stride[1] != kernel[1] else {}
            kw.update(_pad_1d(pad))
            if ceil:
                kw["ceil_mode"] = "true"
            imp.bind(node, call(where, f"{fn}1d", [x, str(kernel[1])], kw))
            return
        kw = _written(pad, ceil)
        if stride != kernel:
            kw = {"stride": pair(stride), **kw}
        imp.bind(node, call(where, fn, [x, pair(kernel)], kw))  # type: ignore[arg-type]

    return rule


def global_avg(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    if len(imp.shape(node.input[0], where)) != 4:
        raise where.refuse("only an NCHW input is supported")
    imp.bind(node, f"global_avg_pool({imp.tensor(node.input[0], where)})")


def conv_transpose(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    w = imp.const(node.input[1])
    if w is None or w.ndim != 4:
        raise where.refuse("the weight must be a constant of rank 4 (a 2-D transposed convolution)")
    b = imp.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and b is None:
        raise where.refuse("the bias must be a constant")
    if "output_shape" in attrs:
        raise where.refuse("output_shape is given; deepdsl computes the size from the pads (export with padding)")
    auto = attrs.get("auto_pad", b"NOTSET")
    if (auto.decode() if isinstance(auto, bytes) else str(auto)) not in ("NOTSET", "VALID"):
        raise where.refuse(f"auto_pad={auto!r} is not supported")
    groups = int(attrs.get("group", 1))
    kernel = (int(w.shape[2]), int(w.shape[3]))
    stride = tuple(int_list(attrs, "strides", [1, 1]))
    pads = int_list(attrs, "pads", [0, 0, 0, 0])
    if pads[0] != pads[2] or pads[1] != pads[3]:
        raise where.refuse(f"pads {pads} are asymmetric; a transposed convolution pads both sides alike")
    kw = {"kernel": pair(kernel)}
    if stride != (1, 1):
        kw["stride"] = pair(stride)  # type: ignore[arg-type]
    if (pads[0], pads[1]) != (0, 0):
        kw["pad"] = pair((pads[0], pads[1]))
    out_pad = tuple(int_list(attrs, "output_padding", [0, 0]))
    if out_pad != (0, 0):
        kw["output_padding"] = pair(out_pad)  # type: ignore[arg-type]
    dil = tuple(int_list(attrs, "dilations", [1, 1]))
    if dil != (1, 1):
        kw["dilation"] = pair(dil)  # type: ignore[arg-type]
    if groups != 1:
        kw["groups"] = str(groups)
    if b is None:
        kw["bias"] = "false"
    params = {"W": w} if b is None else {"W": w, "b": b.reshape(-1)}
    out = int(w.shape[1]) * groups
    sources = [i for i in node.input[1:3] if i]
    name = imp.layer(node, where, call(where, "conv_transpose", [str(out)], kw), params, sources)
    imp.bind(node, f"{name}({x})", name)


def resize(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """Resize by one integer factor on H and W: `upsample(x, factor, mode=...)` (nearest as PyTorch's
    nn.Upsample(mode='nearest') exports it, linear as mode='bilinear', with align_corners=true where its coordinates
    are 'align_corners')."""
    shape = imp.shape(node.input[0], where)
    out = imp.shape(node.output[0], where)
    if len(shape) != 4 or shape[:2] != out[:2]:
        raise where.refuse("deepdsl imports a Resize of H and W of [N, C, H, W] only")
    fh, fw = out[2] // shape[2], out[3] // shape[3]
    x = imp.tensor(node.input[0], where)
    users = imp.readers.get(node.output[0], [])
    if fh > 1 and fw == 1 and out[2] == fh * shape[2] and len(users) == 1 and users[0][1].op_type == "Resize":
        j, then = users[0]  # H, then W by the same factor and mode (as deepdsl exports upsample): one upsample
        final = imp.shapes.get(then.output[0])
        same = {a.name: a for a in then.attribute} == {a.name: a for a in node.attribute}
        if same and final == (*out[:3], fh * out[3]) and node.output[0] not in {o.name for o in imp.graph.output}:
            imp.absorbed.add(j)
            node, out, fw = Renamed(then, then.output[0]), final, fh
    if fh != fw or fh < 1 or out[2] != fh * shape[2] or out[3] != fw * shape[3]:
        raise where.refuse(f"it resizes {list(shape[2:])} to {list(out[2:])}; deepdsl's upsample takes one integer "
                           "factor for both axes")  # fmt: skip

    def text(key: str, default: str) -> str:
        v = attrs.get(key, default)
        return v.decode() if isinstance(v, bytes) else str(v)

    mode, coords = text("mode", "nearest"), text("coordinate_transformation_mode", "half_pixel")
    if fh == 1:
        imp.env[node.output[0]] = x
        return
    if mode == "nearest":
        nearest = text("nearest_mode", "round_prefer_floor")
        # an integer factor: output i reads input floor(i / f) where the coordinates and the rounding agree
        half = coords in ("half_pixel", "pytorch_half_pixel") and nearest in ("round_prefer_floor", "round_prefer_ceil")
        if not (coords == "asymmetric" and nearest == "floor" or half):
            raise where.refuse(f"nearest with coordinate_transformation_mode='{coords}', nearest_mode='{nearest}' "
                               "does not repeat each pixel as deepdsl's upsample does")  # fmt: skip
        imp.bind(node, f'upsample({x}, {fh}, mode="nearest")')
    elif mode == "linear":
        if coords not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise where.refuse(f"linear with coordinate_transformation_mode='{coords}': deepdsl's bilinear upsample "
                               "is PyTorch's, align_corners=False (half_pixel) or True (align_corners)")  # fmt: skip
        corners = ", align_corners=true" if coords == "align_corners" else ""
        imp.bind(node, f'upsample({x}, {fh}, mode="bilinear"{corners})')
    else:
        raise where.refuse(f"mode '{mode}': deepdsl upsamples nearest or bilinear")
