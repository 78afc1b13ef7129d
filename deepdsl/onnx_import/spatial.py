"""Import rules for the operators over an image's H and W: Conv (groups, strides, symmetric pads; dilations and
asymmetric pads where the language has them), ConvTranspose (`conv_transpose`, `output_padding=`), MaxPool and
AveragePool (`ceil_mode=true` where it changes the output), GlobalAveragePool, and Resize by one integer factor of
H and W (`upsample`, nearest or bilinear; two Resizes, as deepdsl exports upsample, taken as one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deepdsl.onnx_import.rule_support import Renamed
from deepdsl.onnx_import.writing import Node, call, pair

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def int_list(attrs: dict, key: str, default: list[int]) -> list[int]:
    return [int(v) for v in attrs.get(key, default)]


def _spatial(
    imp: Importer, node: Any, where: Node, attrs: dict, kernel: tuple[int, int], conv: bool = False
) -> tuple[tuple, tuple]:
    """(stride, pad) of a 2-D window op, refusing what the language cannot say; a convolution's pad may be
    asymmetric (top, left, bottom, right) where the language takes that 4-tuple, its dilation is `_dilation`."""
    strides = tuple(int_list(attrs, "strides", [1, 1]))
    pads = int_list(attrs, "pads", [0, 0, 0, 0])
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        h, w = imp.shape(node.input[0], where)[2:]
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
    if pads[0] != pads[2] or pads[1] != pads[3]:
        if conv:  # conv's pad=(top, left, bottom, right)
            return strides, tuple(pads)
        raise where.refuse(f"pads {pads} are asymmetric; the language's pools pad both sides alike")
    if not conv and any(d != 1 for d in int_list(attrs, "dilations", [1, 1])):
        raise where.refuse(f"dilations {int_list(attrs, 'dilations', [1, 1])}: the language has no dilated windows")
    return strides, (pads[0], pads[1])


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
    if w.ndim != 4 or len(imp.shape(node.input[0], where)) != 4:
        raise where.refuse(f"only 2-D convolutions are supported (weight of rank {w.ndim})")
    b = imp.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and b is None:
        raise where.refuse("the bias must be an initialiser (a constant)")
    kernel = (int(w.shape[2]), int(w.shape[3]))
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != kernel:
        raise where.refuse(f"kernel_shape {list(attrs['kernel_shape'])} differs from the weight's {list(kernel)}")
    stride, pad = _spatial(imp, node, where, attrs, kernel, conv=True)
    kw = {"kernel": pair(kernel)}
    if stride != (1, 1):
        kw["stride"] = pair(stride)
    if len(pad) == 4:
        kw["pad"] = f"({', '.join(map(str, pad))})"
    elif pad != (0, 0):
        kw["pad"] = pair(pad)
    dilation = _dilation(where, attrs, "conv")
    if dilation is not None:
        kw["dilation"] = dilation
    groups = int(attrs.get("group", 1))
    if groups != 1:
        kw["groups"] = str(groups)
    if b is None:
        kw["bias"] = "false"
    params = {"W": w} if b is None else {"W": w, "b": b.reshape(-1)}
    name = imp.layer(node, where, call(where, "conv", [str(w.shape[0])], kw), params)
    imp.bind(node, f"{name}({x})", name)


def pool(fn: str) -> Callable[..., None]:
    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        x = imp.tensor(node.input[0], where)
        shape = imp.shape(node.input[0], where)
        if len(shape) != 4:
            raise where.refuse("only 2-D pooling is supported (an NCHW input)")
        kernel = tuple(int_list(attrs, "kernel_shape", []))
        if len(kernel) != 2:
            raise where.refuse(f"kernel_shape {list(kernel)}: only 2-D windows are supported")
        stride, pad = _spatial(imp, node, where, attrs, kernel)  # type: ignore[arg-type]
        if int(attrs.get("storage_order", 0)):
            raise where.refuse("storage_order=1 is not supported")
        imp.only_output(node, where)
        if fn == "avg_pool" and pad != (0, 0) and not int(attrs.get("count_include_pad", 0)):
            raise where.refuse("count_include_pad=0 with padding: the language's avg_pool counts the padding")
        ceil = False
        if int(attrs.get("ceil_mode", 0)):
            floor = [(s + 2 * p - kk) // st + 1 for s, p, kk, st in zip(shape[2:], pad, kernel, stride)]
            if tuple(floor) != imp.shape(node.output[0], where)[2:]:
                ceil = True
        kw = {}
        if stride != kernel:
            kw["stride"] = pair(stride)
        if pad != (0, 0):
            kw["pad"] = pair(pad)
        if ceil:
            kw["ceil_mode"] = "true"
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
    name = imp.layer(node, where, call(where, "conv_transpose", [str(out)], kw), params)
    imp.bind(node, f"{name}({x})", name)


def resize(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """Resize by one integer factor on H and W: `upsample(x, factor, mode=...)` (nearest as PyTorch's
    nn.Upsample(mode='nearest') exports it, linear without align_corners as mode='bilinear')."""
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
        if coords not in ("half_pixel", "pytorch_half_pixel"):
            raise where.refuse(f"linear with coordinate_transformation_mode='{coords}' (align_corners?): deepdsl's "
                               "bilinear upsample is PyTorch's align_corners=False")  # fmt: skip
        imp.bind(node, f'upsample({x}, {fh}, mode="bilinear")')
    else:
        raise where.refuse(f"mode '{mode}': deepdsl upsamples nearest or bilinear")
