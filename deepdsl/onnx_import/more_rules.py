"""Import rules for the operators of the models users bring beyond the classic CNNs (issue 33): transformers
(Transpose, MatMul of two computed tensors, Softmax over the last axis, LayerNormalization, Gelu, Reshape to any
shape, Gather of one position), mobile networks (Clip, HardSwish, HardSigmoid, a [N, C, 1, 1] gate broadcast by
Mul, ReduceMean over any axes), U-Nets (ConvTranspose, Resize), and Slice, Split, Sqrt, Pow, Expand. Each writes
`.ddsl` text through the importer, calling the language's built-ins (`slice`, `mean`, `expand`, `relu6`, `clip`,
`hard_swish`, `hard_sigmoid`, `silu`, `conv_transpose(output_padding=)`). Patterns that span several nodes (the Erf
form of GELU, the decomposed layer norm, x * sigmoid(x)) are in patterns.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.writing import Node, call, need, num

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def dims(imp: Importer, shape: tuple[int, ...]) -> str:
    """A shape as the language writes it, its first axis in terms of the batch N where it is N or a multiple of it
    (so that `--batch` changes it too)."""
    n = imp.n
    parts = [str(d) for d in shape]
    if shape and n > 1 and shape[0] % n == 0:
        parts[0] = "N" if shape[0] == n else f"N * {shape[0] // n}"
    elif shape and n == 1 and shape[0] == 1:
        parts[0] = "N"
    return f"({', '.join(parts)})"


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _inputs_const(imp: Importer, node: Any, where: Node, start: int) -> list[np.ndarray | None]:
    """The node's inputs from `start` on as constants (None where absent); a computed one is refused."""
    out: list[np.ndarray | None] = []
    for name in node.input[start:]:
        if not name:
            out.append(None)
            continue
        c = imp.const(name)
        if c is None:
            raise where.refuse(f"its input '{name}' must be a constant")
        out.append(c)
    return out


def transpose(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    rank = len(imp.shape(node.input[0], where))
    perm = [int(p) for p in attrs.get("perm", list(range(rank))[::-1])]
    x = imp.tensor(node.input[0], where)
    if perm == list(range(rank)):
        imp.env[node.output[0]] = x
        return
    imp.bind(node, f"permute({x}, ({', '.join(map(str, perm))}))")


def matmul_computed(imp: Importer, node: Any, where: Node) -> None:
    """MatMul of two computed tensors (attention's q kᵀ and weights v): `matmul`, over equal batch axes."""
    sa, sb = imp.shape(node.input[0], where), imp.shape(node.input[1], where)
    if len(sa) < 2 or len(sb) < 2 or (len(sb) > 2 and sa[:-2] != sb[:-2]):
        raise where.refuse(f"it multiplies {list(sa)} by {list(sb)}; deepdsl's matmul takes equal batch axes "
                           "(or a 2-D right operand)")  # fmt: skip
    imp.bind(node, f"matmul({imp.tensor(node.input[0], where)}, {imp.tensor(node.input[1], where)})")


def matmul_rows(imp: Importer, node: Any, where: Node, x: str, shape: tuple, w: np.ndarray, bias: Any) -> None:
    """A constant weight applied to the last axis of a rank > 2 input (a Linear on [N, T, D]): the rows through one
    `full`, viewed back."""
    from deepdsl.onnx_import.rules import full_layer

    rows = int(np.prod(shape[:-1]))
    flat = imp.names.make(f"{where.base}_rows", "rows")
    imp.body.append(f"{flat} = reshape({x}, {dims(imp, (rows, shape[-1]))})")
    out_name = node.output[0]

    class _Out:  # the `full` writes a temporary; the view back takes the node's output
        output = [f"{out_name}#rows"]
        op_type = node.op_type

    full_layer(imp, _Out, where, flat, w, bias)
    imp.bind(node, f"reshape({imp.env[_Out.output[0]]}, {dims(imp, (*shape[:-1], w.shape[0]))})")


def softmax_last(imp: Importer, node: Any, where: Node, attrs: dict, fn: str) -> bool:
    """Softmax over the last axis of a rank > 2 input (attention's weights): `softmax(x, axis=-1)`; False where
    the node is something else."""
    rank = len(imp.shape(node.input[0], where))
    axis = int(attrs.get("axis", -1 if imp.opset >= 13 else 1))
    if rank <= 2 or _axis(axis, rank) != rank - 1:
        return False
    imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)}, axis=-1)")
    return True


def layer_norm_layer(imp: Importer, node: Any, where: Node, x: str, gamma: np.ndarray, beta: np.ndarray,
                     eps: float) -> None:  # fmt: skip
    kw = {} if np.float32(eps) == np.float32(1e-5) else {"eps": num(eps)}
    name = imp.layer(node, where, call(where, "layer_norm", [], kw), {"gamma": gamma, "beta": beta})
    imp.bind(node, f"{name}({x})", name)


def layer_normalization(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    shape = imp.shape(node.input[0], where)
    axis = _axis(int(attrs.get("axis", -1)), len(shape))
    if axis != len(shape) - 1:
        raise where.refuse(f"axis={attrs.get('axis')} normalises over several axes; the language's layer_norm is "
                           "over the last axis")  # fmt: skip
    imp.only_output(node, where)
    scale, bias = (_inputs_const(imp, node, where, 1) + [None])[:2]
    d = shape[-1]
    gamma = np.ones(d, np.float32) if scale is None else np.broadcast_to(scale, (d,))
    beta = np.zeros(d, np.float32) if bias is None else np.broadcast_to(bias, (d,))
    layer_norm_layer(imp, node, where, imp.tensor(node.input[0], where), gamma, beta, float(attrs.get("epsilon", 1e-5)))


def gelu(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    approx = attrs.get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    if approx != "none":
        raise where.refuse(f"approximate='{approx}': the language's gelu is the exact (erf) form")
    imp.bind(node, f"gelu({imp.tensor(node.input[0], where)})")


def reshape_any(imp: Importer, node: Any, where: Node) -> None:
    """A Reshape to any shape (heads split and joined): `reshape(x, (...))` with the shape ONNX infers."""
    out = imp.shape(node.output[0], where)
    imp.bind(node, f"reshape({imp.tensor(node.input[0], where)}, {dims(imp, out)})")


def sqrt(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    imp.bind(node, f"sqrt({imp.tensor(node.input[0], where)})")


def pow_(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    e = imp.const(node.input[1])
    if e is None or e.size != 1:
        raise where.refuse("the exponent must be one constant number")
    x, v = imp.tensor(node.input[0], where), float(e.reshape(-1)[0])
    imp.bind(node, f"{x} * {x}" if v == 2 else f"sqrt({x})" if v == 0.5 else f"{x} ^ {num(v)}")


def clip(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    if imp.opset < 11 or len(node.input) > 1:
        low, high = (_inputs_const(imp, node, where, 1) + [None, None])[:2]
        lo = None if low is None else float(low.reshape(-1)[0])
        hi = None if high is None else float(high.reshape(-1)[0])
    else:
        lo, hi = attrs.get("min"), attrs.get("max")
    x = imp.tensor(node.input[0], where)
    if lo == 0 and hi == 6:
        need(where, "relu6")
        imp.bind(node, f"relu6({x})")
    elif lo == 0 and hi is None:
        imp.bind(node, f"relu({x})")
    elif lo is None or hi is None:
        raise where.refuse("a Clip with one bound only (other than min=0): deepdsl's clip takes both")
    else:
        need(where, "clip")
        imp.bind(node, f"clip({x}, {num(lo)}, {num(hi)})")


def hard_sigmoid(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "hard_sigmoid")
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    kw = []
    if np.float32(alpha) != np.float32(1 / 6):
        kw.append(f"alpha={num(alpha)}")
    if np.float32(beta) != np.float32(0.5):
        kw.append(f"beta={num(beta)}")
    imp.bind(node, f"hard_sigmoid({', '.join([imp.tensor(node.input[0], where), *kw])})")


def hard_swish(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "hard_swish")
    imp.bind(node, f"hard_swish({imp.tensor(node.input[0], where)})")


def broadcast_binary(imp: Importer, node: Any, where: Node, sym: str) -> bool:
    """Two computed tensors of one rank where one has size 1 on axes the other has larger (an SE block's
    [N, C, 1, 1] gate): the smaller one `expand`ed to the larger one's shape. False where that is not the case."""
    a, b = node.input[0], node.input[1]
    sa, sb = imp.shape(a, where), imp.shape(b, where)
    if len(sa) != len(sb):
        return False
    try:
        out = tuple(np.broadcast_shapes(sa, sb))
    except ValueError:
        return False
    need(where, "expand")
    xa, xb = imp.tensor(a, where), imp.tensor(b, where)
    if sa != out:
        xa = f"expand({xa}, {dims(imp, out)})"
    if sb != out:
        xb = f"expand({xb}, {dims(imp, out)})"
    imp.bind(node, f"{xa} {sym} {xb}")
    return True


def reduce_mean_axes(imp: Importer, node: Any, where: Node, attrs: dict, got: list[int] | None) -> None:
    """`mean(x, axis=..., keepdim=...)` over any axes but the batch."""
    rank = len(imp.shape(node.input[0], where))
    axes = list(range(rank)) if got is None else got
    if 0 in axes:
        raise where.refuse("it averages over the batch axis")
    keep = "true" if int(attrs.get("keepdims", 1)) else "false"
    axis = str(axes[0]) if len(axes) == 1 else f"({', '.join(map(str, axes))})"
    imp.bind(node, f"mean({imp.tensor(node.input[0], where)}, axis={axis}, keepdim={keep})")


def _slice_text(x: str, start: int, end: int, axis: int) -> str:  # after need(where, "slice")
    return f"slice({x}, {start}, {end}, axis={axis})"


def slice_(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "slice")
    shape = imp.shape(node.input[0], where)
    if imp.opset < 10 or len(node.input) == 1:
        starts, ends = attrs.get("starts", []), attrs.get("ends", [])
        axes, steps = attrs.get("axes"), None
    else:
        starts, ends, axes, steps = (_inputs_const(imp, node, where, 1) + [None, None])[:4]
    axes_l = list(range(len(np.ravel(starts)))) if axes is None else [int(a) for a in np.ravel(axes)]
    if steps is not None and any(int(s) != 1 for s in np.ravel(steps)):
        raise where.refuse(f"steps {np.ravel(steps).tolist()}: deepdsl's slice takes every element (step 1)")
    x = imp.tensor(node.input[0], where)
    for a, s, e in zip(axes_l, np.ravel(starts), np.ravel(ends)):
        a = _axis(a, len(shape))
        n = shape[a]
        s, e = int(s), int(e)
        s, e = (s + n if s < 0 else s), (e + n if e < 0 else e)
        s, e = min(max(s, 0), n), min(max(e, 0), n)
        if a == 0:
            if (s, e) == (0, n):
                continue
            raise where.refuse("it slices the batch axis")
        if e <= s:
            raise where.refuse(f"it takes nothing of axis {a} ({s} to {e})")
        if (s, e) != (0, n):
            x = _slice_text(x, s, e, a)
    if x == imp.tensor(node.input[0], where):
        imp.env[node.output[0]] = x
    else:
        imp.bind(node, x)


def split(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "slice")
    shape = imp.shape(node.input[0], where)
    axis = _axis(int(attrs.get("axis", 0)), len(shape))
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
    imp.bind(node, f"expand({x}, {dims(imp, out)})")


def gather_position(imp: Importer, node: Any, where: Node, attrs: dict) -> None:
    """One constant position along an axis of a computed tensor (a class token `x[:, 0]`): a tensor function
    that reads it."""
    shape = imp.shape(node.input[0], where)
    axis = _axis(int(attrs.get("axis", 0)), len(shape))
    index = imp.const(node.input[1])
    if index is None or index.size != 1 or index.ndim != 0:
        raise where.refuse("deepdsl imports a Gather from a computed tensor at one constant position only")
    at = int(index.reshape(-1)[0])
    at = at + shape[axis] if at < 0 else at
    if not 0 <= at < shape[axis]:
        raise where.refuse(f"position {at} of axis {axis}")
    idx = [f"i{d}" for d in range(len(shape))]
    reads = ", ".join(str(at) if d == axis else idx[d] for d in range(len(shape)))
    name = imp.names.make(where.base, "gather")
    fn = imp.names.make(f"{name}_fn", "fn")
    sizes = ", ".join(f"S{d}" for d in range(len(shape)))
    outs = ", ".join(idx[d] for d in range(len(shape)) if d != axis)
    imp.tensor_fns += [f"tensor {fn}(t[{sizes}]) -> [{outs}] = t[{reads}]   # Gather of position {at}", ""]
    imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")


def conv_transpose(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    from deepdsl.onnx_import.rules import int_list
    from deepdsl.onnx_import.writing import pair

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
            from deepdsl.onnx_import.rules import Renamed

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


def embedding(imp: Importer, node: Any, where: Node, attrs: dict) -> None:
    """A Gather of rows of a constant table [V, D] by integer token ids (nn.Embedding): an `embedding` layer."""
    table = imp.const(node.input[0])
    assert table is not None
    if int(attrs.get("axis", 0)) != 0 or table.ndim != 2 or node.input[1] not in imp.env:
        raise where.refuse("deepdsl imports a Gather from a constant as rows of a [vocab, dim] table by token ids "
                           "(an embedding)")  # fmt: skip
    v, d = (int(n) for n in table.shape)
    name = imp.layer(node, where, f"embedding({v}, {d})", {"W": table})
    imp.bind(node, f"{name}({imp.tensor(node.input[1], where)})", name)


_MASKS = {"<=": np.less_equal, "<": np.less, ">=": np.greater_equal, ">": np.greater, "==": np.equal}


def where_mask(imp: Importer, node: Any, where: Node) -> None:
    """Where(a constant condition, x, a number) whose condition compares the last two axes' indices (a causal mask
    `j <= i`): a tensor function with that condition, as the language writes masked attention."""
    cond, x, other = node.input
    c, fill = imp.const(cond), imp.const(other)
    if c is None or fill is None or fill.size != 1 or imp.const(x) is not None:
        raise where.refuse("deepdsl imports a Where of a constant mask, a computed tensor and one number only")
    shape = imp.shape(x, where)
    rank = len(shape)
    if rank < 2:
        raise where.refuse("the mask must be over the last two axes")
    full = np.broadcast_to(np.asarray(c, bool), shape)
    rows, cols = np.arange(shape[-2])[:, None], np.arange(shape[-1])[None, :]
    found = next((sym for sym, f in _MASKS.items() if (full == f(cols, rows)).all()), None)
    if found is None:
        raise where.refuse("its mask is not a comparison of the last two axes' indices (as a causal mask is)")
    v = float(fill.reshape(-1)[0])
    value = "-inf" if v == -np.inf else "inf" if v == np.inf else num(v)
    idx = [f"i{d}" for d in range(rank)]
    name = imp.names.make(where.base, "mask")
    fn = imp.names.make(f"{name}_fn", "fn")
    sizes = ", ".join(f"S{d}" for d in range(rank))
    read = f"t[{', '.join(idx)}]"
    imp.tensor_fns += [f"tensor {fn}(t[{sizes}]) -> [{', '.join(idx)}] = {idx[-1]} {found} {idx[-2]} ? {read} : "
                       f"{value}   # Where of a mask", ""]  # fmt: skip
    imp.bind(node, f"{fn}({imp.tensor(x, where)})")
