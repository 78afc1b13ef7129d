"""One rule per ONNX operator (`RULES`; `SUPPORTED` lists them): each writes the node as `.ddsl` lines through the
importer, or refuses it, naming the node, its op type and the opset, where the language cannot say exactly what it
computes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import import more_rules
from deepdsl.onnx_import.folding import FOLD_ONLY, FOLDED, fold, numpy_helper_value
from deepdsl.onnx_import.writing import Node, attr, call, num, pair

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


SUPPORTED = (
    "Add", "AveragePool", "BatchNormalization", "Concat", "Constant", "Conv", "Div", "Dropout", "Flatten", "Gemm",
    "GlobalAveragePool", "Identity", "LRN", "LeakyRelu", "LogSoftmax", "MatMul", "MaxPool", "Mul", "ReduceMean",
    "Relu", "Reshape", "Sigmoid", "Softmax", "Sub", "Tanh",
    # issue 33
    "Clip", "ConvTranspose", "Expand", "Gelu", "HardSigmoid", "HardSwish", "LayerNormalization", "Pow", "Resize",
    "Slice", "Split", "Sqrt", "Transpose",
)  # fmt: skip


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


def _conv(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
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


def full_layer(imp: Importer, node: Any, where: Node, x: str, w: np.ndarray, b: np.ndarray | None) -> None:
    """`full` with weight `w` [out, in] and optional bias [out]."""
    kw = {} if b is not None else {"bias": "false"}
    params = {"W": w} if b is None else {"W": w, "b": b}
    name = imp.layer(node, where, call(where, "full", [str(w.shape[0])], kw), params)
    imp.bind(node, f"{name}({x})", name)


def _bias_vector(c: np.ndarray, m: int) -> np.ndarray | None:
    """`c` as a vector [m] when it broadcasts along the batch only ([m], [1, m] or a scalar), else None."""
    if c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1):
        return None
    try:
        return np.broadcast_to(c, (1, m)).reshape(m).astype(np.float32)
    except ValueError:
        return None


def _gemm(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    b = imp.const(node.input[1])
    if b is None:
        raise where.refuse("B must be an initialiser (a constant weight)")
    if int(attrs.get("transA", 0)):
        raise where.refuse("transA=1: the language's `full` takes its input as [batch, features]")
    if len(imp.shape(node.input[0], where)) != 2 or b.ndim != 2:
        raise where.refuse("A and B must be matrices")
    w = b if int(attrs.get("transB", 0)) else b.T
    w = w * np.float32(attrs.get("alpha", 1.0))
    c = imp.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and c is None:
        raise where.refuse("C must be an initialiser (a constant bias)")
    bias = None
    if c is not None:
        bias = _bias_vector(c, w.shape[0])
        if bias is None:
            raise where.refuse(f"C of shape {list(c.shape)} differs between samples; deepdsl's bias is one vector")
        bias = bias * np.float32(attrs.get("beta", 1.0))
    full_layer(imp, node, where, x, w, bias)


def _matmul(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    w = imp.const(node.input[1])
    if w is None:
        more_rules.matmul_computed(imp, node, where)
        return
    shape = imp.shape(node.input[0], where)
    if len(shape) < 2 or w.ndim != 2:
        raise where.refuse("deepdsl imports MatMul of a [batch, ..., features] input by a matrix")
    bias = None
    users = imp.readers.get(node.output[0], [])
    graph_out = {o.name for o in imp.graph.output}
    if len(users) == 1 and users[0][1].op_type == "Add" and node.output[0] not in graph_out:
        j, add = users[0]  # MatMul + Add of a constant vector, as exporters write a linear layer: one `full`
        other = [i for i in add.input if i != node.output[0]]
        c = imp.const(other[0]) if len(other) == 1 else None
        bias = _bias_vector(c, w.shape[1]) if c is not None else None
        if bias is not None:
            imp.absorbed.add(j)
            node = Renamed(node, add.output[0])
    if len(shape) > 2:
        more_rules.matmul_rows(imp, node, where, x, shape, w.T, bias)
        return
    full_layer(imp, node, where, x, w.T, bias)


@dataclass
class Renamed:
    """A node whose result is another node's output (the Add folded into a MatMul)."""

    node: Any
    out: str

    def __getattr__(self, key: str) -> Any:
        return getattr(self.node, key)

    @property
    def output(self) -> list[str]:
        return [self.out]


_ARITH = {"Add": ("+", np.add), "Sub": ("-", np.subtract), "Mul": ("*", np.multiply), "Div": ("/", np.divide)}


def _arith(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    sym, fold = _ARITH[node.op_type]
    a, b = node.input[0], node.input[1]
    ca, cb = imp.const(a), imp.const(b)
    if ca is not None and cb is not None:
        try:
            with np.errstate(all="ignore"):
                imp.consts[node.output[0]] = fold(ca, cb).astype(np.result_type(ca, cb))
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise where.refuse(f"it cannot be folded: {exc}") from None
        return
    if ca is None and cb is None:
        sa, sb = imp.shape(a, where), imp.shape(b, where)
        if sa != sb and more_rules.broadcast_binary(imp, node, where, sym):
            return
        if sa != sb:
            raise where.refuse(f"it broadcasts {list(sa)} with {list(sb)}; the language's {sym} needs equal shapes")
        imp.bind(node, f"{imp.tensor(a, where)} {sym} {imp.tensor(b, where)}")
        return
    t, c, left = (b, ca, True) if ca is not None else (a, cb, False)
    assert c is not None
    x, shape = imp.tensor(t, where), imp.shape(t, where)
    try:
        if np.broadcast_shapes(shape, c.shape) != shape:
            raise ValueError
    except ValueError:
        raise where.refuse(f"the constant of shape {list(c.shape)} would broadcast the input {list(shape)}") from None
    if c.size == 0 or not np.issubdtype(c.dtype, np.floating) and not np.issubdtype(c.dtype, np.integer):
        raise where.refuse(f"the constant holds {c.dtype}")
    flat = c.reshape(-1).astype(np.float32)
    if np.all(flat == flat[0]):  # one number: a literal
        try:
            v = num(flat[0])
        except ValueError:
            raise where.refuse(f"the constant {flat[0]} is not finite") from None
        imp.bind(node, f"{v} {sym} {x}" if left else f"{x} {sym} {v}")
        return
    # a constant tensor broadcast over the input: a tensor function with the constant as its parameter
    kc = c.reshape(c.shape[len(c.shape) - len(shape) :] if c.ndim > len(shape) else c.shape).astype(np.float32)
    idx = [f"i{d}" for d in range(len(shape))]
    at = idx[len(shape) - kc.ndim :]
    k_idx = ", ".join("0" if kc.shape[d] == 1 else at[d] for d in range(kc.ndim))
    sizes = ", ".join(f"S{d}" for d in range(len(shape)))
    name = imp.names.make(where.base, node.op_type.lower())
    fn = imp.names.make(f"{name}_fn", "fn")
    xk, kk = f"t[{', '.join(idx)}]", f"k[{k_idx}]"
    expr = f"{kk} {sym} {xk}" if left else f"{xk} {sym} {kk}"
    imp.tensor_fns += [
        f"tensor {fn}(t[{sizes}]) -> [{', '.join(idx)}] {{   # {node.op_type} of a constant, broadcast",
        f"  param k[{', '.join(map(str, kc.shape))}] = constant(0)",
        f"  return {expr}",
        "}",
        "",
    ]
    imp.layers.append(f"layer {name} = {fn}")
    imp.store(f"{name}.k", kc, where)
    imp.bind(node, f"{name}({x})", name)


def _unary(fn: str) -> Callable[..., None]:
    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")

    return rule


def _leaky(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    alpha = float(attrs.get("alpha", 0.01))
    kw = {} if np.float32(alpha) == np.float32(0.01) else {"slope": num(alpha)}
    imp.bind(node, call(where, "leaky_relu", [imp.tensor(node.input[0], where)], kw))


def _pool(fn: str) -> Callable[..., None]:
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


def _global_avg(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    if len(imp.shape(node.input[0], where)) != 4:
        raise where.refuse("only an NCHW input is supported")
    imp.bind(node, f"global_avg_pool({imp.tensor(node.input[0], where)})")


def _reduce_mean(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """The mean over H and W of an NCHW tensor (as exporters write adaptive average pooling to 1x1)."""
    rank = len(imp.shape(node.input[0], where))
    axes = attrs.get("axes")
    if len(node.input) > 1 and node.input[1]:  # opset 18: the axes are an input
        axes = imp.const(node.input[1])
        if axes is None:
            raise where.refuse("the axes must be a constant")
    got = sorted(int(a) + (rank if int(a) < 0 else 0) for a in np.ravel(axes)) if axes is not None else None
    if rank != 4 or got != [2, 3]:
        more_rules.reduce_mean_axes(imp, node, where, attrs, got)
        return
    pooled = f"global_avg_pool({imp.tensor(node.input[0], where)})"
    imp.bind(node, pooled if int(attrs.get("keepdims", 1)) else f"flatten({pooled})")


def _batch_norm(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    stats = [imp.const(i) for i in node.input[1:5]]
    if len(stats) != 4 or any(s is None for s in stats):
        raise where.refuse("scale, B, mean and var must be initialisers (constants)")
    if int(attrs.get("training_mode", 0)):
        raise where.refuse("training_mode=1 is not supported; export the model in inference (eval) mode")
    imp.only_output(node, where)
    if len(imp.shape(node.input[0], where)) not in (2, 4):
        raise where.refuse("deepdsl's batch_norm takes [N, C, H, W] or [N, D]")
    scale, bias, mean, var = (np.asarray(s, np.float32).reshape(-1) for s in stats)  # type: ignore[arg-type]
    kw = {}
    eps, momentum = attr(attrs.get("epsilon", 1e-5)), attr(attrs.get("momentum", 0.9))
    if np.float32(eps) != np.float32(1e-5):
        kw["eps"] = num(eps)
    if np.float32(1 - momentum) != np.float32(0.1):
        kw["momentum"] = num(1 - momentum)  # ONNX keeps `momentum` of the old statistics, deepdsl (PyTorch) the new
    params = {"gamma": scale, "beta": bias, "running_mean": mean, "running_var": var}
    name = imp.layer(node, where, call(where, "batch_norm", [], kw), params)
    imp.bind(node, f"{name}({x})", name)


def _flatten(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    rank = len(imp.shape(node.input[0], where))
    axis = int(attrs.get("axis", 1))
    if (axis + rank if axis < 0 else axis) != 1:
        more_rules.reshape_any(imp, node, where)
        return
    imp.bind(node, f"flatten({imp.tensor(node.input[0], where)})")


def _reshape(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
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
    more_rules.reshape_any(imp, node, where)


def _concat(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
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
        more_rules.concat_constants(imp, node, where, axis)
        return
    xs = [imp.tensor(i, where) for i in node.input]
    if len(xs) == 1:
        imp.env[node.output[0]] = xs[0]
        return
    imp.bind(node, call(where, "concat", xs, {} if axis == 1 else {"axis": str(axis)}))


def _softmax(fn: str) -> Callable[..., None]:
    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        if more_rules.softmax_last(imp, node, where, attrs, fn):
            return
        rank = len(imp.shape(node.input[0], where))
        axis = int(attrs.get("axis", -1 if imp.opset >= 13 else 1))
        if rank != 2 or (axis + rank if axis < 0 else axis) != 1:
            raise where.refuse(f"axis={axis} of a rank-{rank} input: the language's {fn} is over axis 1 of [N, K]")
        imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")

    return rule


def _lrn(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    size = int(attrs["size"])
    if size % 2 == 0:
        raise where.refuse(f"size={size}: ONNX centres an even window differently from the language (PyTorch)")
    kw = {}
    if size != 5:
        kw["size"] = str(size)
    for key, ours, default in (("alpha", "alpha", 1e-4), ("beta", "beta", 0.75), ("bias", "k", 1.0)):
        v = float(attrs.get(key, default))
        if np.float32(v) != np.float32(default):
            kw[ours] = num(v)
    imp.bind(node, call(where, "lrn", [imp.tensor(node.input[0], where)], kw))


def _dropout(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    imp.only_output(node, where)
    ratio = float(attrs.get("ratio", 0.5))
    if len(node.input) > 1 and node.input[1]:
        r = imp.const(node.input[1])
        if r is None or r.size != 1:
            raise where.refuse("the ratio must be a constant number")
        ratio = float(r.reshape(-1)[0])
    if len(node.input) > 2 and node.input[2]:
        mode = imp.const(node.input[2])
        if mode is None or mode.size != 1 or bool(mode.reshape(-1)[0]):
            raise where.refuse("training_mode must be a constant false (export the model in eval mode)")
    if not 0 <= ratio < 1:
        raise where.refuse(f"ratio {ratio} lies outside [0, 1)")
    if ratio == 0:
        imp.env[node.output[0]] = x
        return
    imp.bind(node, call(where, "dropout", [x], {} if ratio == 0.5 else {"p": num(ratio)}))


def _identity(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    c = imp.const(node.input[0])
    if c is not None:
        imp.consts[node.output[0]] = c
    else:
        imp.env[node.output[0]] = imp.tensor(node.input[0], where)


def _constant(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    value = numpy_helper_value(attrs, where)
    if value is None:
        raise where.refuse(f"a constant given as {', '.join(attrs) or 'nothing'} is not supported")
    imp.consts[node.output[0]] = value


def _folded(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    shape = imp.shape(node.input[0], where) if node.op_type == "Shape" else None
    value = fold(node.op_type, attrs, [imp.const(i) for i in node.input], shape, where)
    if value is None and node.op_type == "Gather" and imp.const(node.input[0]) is not None:
        more_rules.embedding(imp, node, where, attrs)
        return
    if value is None and node.op_type == "Gather" and imp.const(node.input[0]) is None:
        more_rules.gather_position(imp, node, where, attrs)
        return
    if value is None and node.op_type == "Where":
        more_rules.where_mask(imp, node, where)
        return
    if value is None and node.op_type in ("Squeeze", "Unsqueeze") and imp.const(node.input[0]) is None:
        more_rules.reshape_any(imp, node, where)  # axes of size 1 taken away or put in: a view
        return
    if value is None and node.op_type == "Cast" and imp.const(node.input[0]) is None:
        if int(attrs.get("to", 0)) == 1:  # to float: what a computed tensor is already
            imp.env[node.output[0]] = imp.tensor(node.input[0], where)
            return
    if value is None:
        raise where.refuse(f"deepdsl imports {node.op_type} of constants and shapes only (as exporters compute "
                           "shapes)")  # fmt: skip
    imp.consts[node.output[0]] = np.asarray(value)


RULES: dict[str, Callable[..., None]] = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "Add": _arith, "Sub": _arith, "Mul": _arith, "Div": _arith,
    "Relu": _unary("relu"), "Sigmoid": _unary("sigmoid"), "Tanh": _unary("tanh"), "LeakyRelu": _leaky,
    "MaxPool": _pool("max_pool"), "AveragePool": _pool("avg_pool"), "GlobalAveragePool": _global_avg,
    "ReduceMean": _reduce_mean, "BatchNormalization": _batch_norm, "Flatten": _flatten, "Reshape": _reshape,
    "Concat": _concat,
    "Softmax": _softmax("softmax"), "LogSoftmax": _softmax("log_softmax"), "LRN": _lrn, "Dropout": _dropout,
    "Identity": _identity, "Constant": _constant, **{op: _folded for op in (*FOLDED, *FOLD_ONLY)},
    # issue 33: transformers, mobile networks, U-Nets (more_rules.py)
    "Transpose": more_rules.transpose, "LayerNormalization": more_rules.layer_normalization, "Gelu": more_rules.gelu,
    "Sqrt": more_rules.sqrt, "Pow": more_rules.pow_, "Clip": more_rules.clip, "HardSigmoid": more_rules.hard_sigmoid,
    "HardSwish": more_rules.hard_swish, "Slice": more_rules.slice_, "Split": more_rules.split,
    "Expand": more_rules.expand, "ConvTranspose": more_rules.conv_transpose, "Resize": more_rules.resize,
}  # fmt: skip


assert set(RULES) == set(SUPPORTED) | set(FOLDED) | set(FOLD_ONLY)

# LSTM and GRU, and the nodes exporters write around them (deepdsl/onnx_import/recurrent.py)
from deepdsl.onnx_import import recurrent as _recurrent  # noqa: E402

RULES.update(_recurrent.rules(RULES))
SUPPORTED = tuple(sorted({*SUPPORTED, *_recurrent.SUPPORTED}))
