"""The ONNX nodes of one statement of an inference program (`emit`), for `deepdsl export`: each of the language's
layers as its standard ONNX operator (element-wise ops, Conv and Gemm with the bias folded in, pooling, batch and
layer norm, softmax, reshapes, matmul, the activations and axis ops), an opset's missing operator as its
decomposition; the convolution family's folds are onnx_convs's, a tensor function's decomposition onnx_indexed's.
An op with no ONNX operator is an error naming the statement and its layer (`refuse`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from deepdsl.backends.onnx_convs import CONV_FAMILY, Folds, dilations, divisor_correction, emit_conv_family, folded_pads
from deepdsl.backends.onnx_indexed import Unsupported, lower_indexed
from deepdsl.backends.onnx_writer import DEFAULT_OPSET, Writer, users_of
from deepdsl.errors import DslProgramError
from deepdsl.ir import Graph, Stmt
from deepdsl.ir.analysis import index_form

_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "abs": "Abs", "neg": "Neg"}  # fmt: skip
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}
# x OP c, and (the r- forms) c OP x
_SCALAR = {"add_scalar": ("Add", False), "mul_scalar": ("Mul", False), "rsub_scalar": ("Sub", True),
           "rdiv_scalar": ("Div", True), "pow_scalar": ("Pow", False)}  # fmt: skip


def refuse(s: Stmt, why: str) -> DslProgramError:
    where = f" (layer '{s.layer}')" if s.layer else ""
    return DslProgramError(f"cannot export %{s.out.name} = {s.op}(...){where} to ONNX: {why}", s.span)


def layer_norms(g: Graph, users: dict, outputs: set, arrays: Mapping) -> dict[str, tuple[Stmt, str, str]]:
    """layer_norm as the language lowers it: rows = layer_norm_rows(x); bias_add(mul(rows, broadcast_channel(gamma)),
    beta), each step read only by the next and gamma, beta parameters: by the bias_add's output name."""
    made = {s.out.name: s for s in g.stmts}
    out: dict[str, tuple[Stmt, str, str]] = {}
    for s in g.stmts:
        if s.op != "bias_add" or s.inputs[1].name not in arrays:
            continue
        mul = made.get(s.inputs[0].name)
        if mul is None or mul.op != "mul" or len(users.get(mul.out.name, ())) != 1 or mul.out.name in outputs:
            continue
        rows, bc = (made.get(v.name) for v in mul.inputs)
        if rows is None or bc is None or rows.op != "layer_norm_rows" or bc.op != "broadcast_channel":
            continue
        if len(users[rows.out.name]) != 1 or len(users[bc.out.name]) != 1 or bc.inputs[0].name not in arrays:
            continue
        if rows.out.name in outputs or bc.out.name in outputs:
            continue
        out[s.out.name] = (rows, bc.inputs[0].name, s.inputs[1].name)
    return out


def group_norms(g: Graph, users: dict, outputs: set) -> dict[str, tuple[Stmt, Stmt, int]]:
    """group_norm and instance_norm as the language lowers them: x [N, C, ...] viewed as rows [N·G, D],
    layer_norm_rows, viewed back to x's shape, each step read only by the next: by the back view's output name,
    (the view into rows, the rows statement, G). Their scale and shift are a Mul and Add after it, as elsewhere."""
    made = {s.out.name: s for s in g.stmts}
    out: dict[str, tuple[Stmt, Stmt, int]] = {}
    for s in g.stmts:
        view = made.get(s.inputs[0].name) if s.op == "layer_norm_rows" else None
        readers = users.get(s.out.name, [])
        if view is None or view.op != "reshape" or len(users[view.out.name]) != 1 or len(readers) != 1:
            continue
        back, shape = readers[0], view.inputs[0].type.shape
        rows, n = s.out.type.shape, shape[0] if shape else 0
        if back.op != "reshape" or back.out.type.shape != shape or len(shape) < 2 or rows[0] % n:
            continue
        if {view.out.name, s.out.name} & outputs or shape[1] % (rows[0] // n):
            continue
        out[back.out.name] = (view, s, rows[0] // n)
    return out


def group_norm(w: Writer, back: Stmt, view: Stmt, rows: Stmt, groups: int) -> None:
    """As PyTorch exports nn.GroupNorm and nn.InstanceNorm: x reshaped to [N, G, -1], InstanceNormalization of
    those groups (a scale of ones and a shift of zeros), reshaped back to x's shape (the batch kept symbolic)."""
    x, out = view.inputs[0].name, back.out.name
    shape = view.inputs[0].type.shape
    where = rows.layer or "norm"
    w.node("Reshape", [x, w.const(where, np.asarray([0, groups, -1], np.int64))], f"{out}/groups", view)
    ones, zeros = (w.const(where, np.full(groups, v, np.float32)) for v in (1.0, 0.0))
    w.node("InstanceNormalization", [f"{out}/groups", ones, zeros], f"{out}/normed", rows, epsilon=float(rows.a["eps"]))
    w.node("Reshape", [f"{out}/normed", w.const(where, np.asarray([0, *shape[1:]], np.int64))], out, back)


def layer_norm(w: Writer, s: Stmt, rows: Stmt, gamma: str, beta: str, opset: int) -> None:
    """One LayerNormalization over the last axis (opset 17 on), else its decomposition, then the scale and shift."""
    x, eps = rows.inputs[0].name, float(rows.a["eps"])
    if opset >= 17:
        w.node("LayerNormalization", [x, gamma, beta], s.out.name, rows, axis=-1, epsilon=eps)
        return
    normed = _normalise_rows(w, rows, x, eps, opset)
    scaled = f"{s.out.name}/scaled"
    w.node("Mul", [normed, gamma], scaled, rows)
    w.node("Add", [scaled, beta], s.out.name, rows)


def _normalise_rows(w: Writer, s: Stmt, x: str, eps: float, opset: int, out: str | None = None) -> str:
    """(x - mean) / sqrt(var + eps) over the last axis in ReduceMean, Sub, Mul, Add, Sqrt, Div (as the TorchScript
    exporter writes a layer norm before opset 17)."""
    base = s.out.name

    def mean(v: str, name: str) -> None:
        if opset >= 18:
            w.node("ReduceMean", [v, w.const(base, np.asarray([-1], np.int64))], name, s, keepdims=1)
        else:
            w.node("ReduceMean", [v], name, s, axes=[-1], keepdims=1)

    mean(x, f"{base}/mean")
    w.node("Sub", [x, f"{base}/mean"], f"{base}/centred", s)
    w.node("Mul", [f"{base}/centred", f"{base}/centred"], f"{base}/squares", s)
    mean(f"{base}/squares", f"{base}/var")
    w.node("Add", [f"{base}/var", w.const(base, np.asarray(eps, np.float32))], f"{base}/var_eps", s)
    w.node("Sqrt", [f"{base}/var_eps"], f"{base}/std", s)
    result = out or f"{base}/normed"
    w.node("Div", [f"{base}/centred", f"{base}/std"], result, s)
    return result


def emit(
    w: Writer, s: Stmt, bias: Stmt | None, batch: int | None, folds: Folds | None = None, opset: int = DEFAULT_OPSET
) -> None:
    a = s.a
    xs = [v.name for v in s.inputs]
    out = bias.out.name if bias is not None else s.out.name
    extra = [bias.inputs[1].name] if bias is not None else []
    if folds is not None and s.out.name in folds.into:  # an explicit pad before it: read its input, add its pads
        xs[0] = folds.into[s.out.name][0]
    if s.op in CONV_FAMILY or s.op == "indexed" and divisor_correction(s) is not None:
        emit_conv_family(w, s, xs, out, extra, folds)
    elif s.op == "conv2d":
        kh, kw = s.inputs[1].type.shape[2:]
        w.node("Conv", [*xs, *extra], out, s, kernel_shape=[kh, kw], strides=list(a["stride"]),
               pads=folded_pads(s, folds), group=a["groups"], **dilations(a))  # fmt: skip
    elif s.op == "linear":
        w.node("Gemm", [*xs, *extra], out, s, transB=1)
    elif s.op == "resize_axis":  # upsample: one axis by an integer factor, as PyTorch's F.interpolate exports it
        rank = len(s.inputs[0].type.shape)
        scales = np.ones(rank, np.float32)
        scales[int(a["axis"])] = float(a["factor"])
        roi = w.const(s.layer or "resize", np.zeros(0, np.float32))
        coords = "align_corners" if a["mode"] == "bilinear_align_corners" else "half_pixel"
        mode = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"} if (
            a["mode"] == "nearest") else {"mode": "linear", "coordinate_transformation_mode": coords}  # fmt: skip
        w.node("Resize", [xs[0], roi, w.const(s.layer or "resize", scales)], out, s, **mode)
    elif s.op == "matmul" and not (a.get("transpose_a") or a.get("transpose_b")):
        w.node("MatMul", xs, out, s)
    elif s.op in ("matmul", "batch_matmul"):  # op(a) @ op(b), each op a transpose of the last two axes or none
        rank = len(s.inputs[0].type.shape)
        perm = [*range(rank - 2), rank - 1, rank - 2]
        ins = list(xs)
        for k, flag in enumerate(("transpose_a", "transpose_b")):
            if a.get(flag):
                ins[k] = f"{out}/{'ab'[k]}_t"
                w.node("Transpose", [xs[k]], ins[k], s, perm=perm)
        w.node("MatMul", ins, out, s)
    elif s.op == "transpose":
        w.node("Transpose", xs, out, s, perm=[int(p) for p in a["perm"]])
    elif s.op == "embedding":
        w.node("Gather", [xs[1], xs[0]], out, s, axis=0)
    elif s.op == "gelu":
        if opset >= 20:
            w.node("Gelu", xs, out, s)
        else:  # x * 0.5 * (1 + erf(x / sqrt 2)), as exporters write it before opset 20
            w.node("Div", [xs[0], w.const(s.layer or "gelu", np.asarray(np.sqrt(2.0), np.float32))], f"{out}/z", s)
            w.node("Erf", [f"{out}/z"], f"{out}/erf", s)
            w.node("Add", [f"{out}/erf", w.const(s.layer or "gelu", np.asarray(1.0, np.float32))], f"{out}/one", s)
            w.node("Mul", [xs[0], f"{out}/one"], f"{out}/x", s)
            w.node("Mul", [f"{out}/x", w.const(s.layer or "gelu", np.asarray(0.5, np.float32))], out, s)
    elif s.op == "layer_norm_rows":  # rows normalised without a scale and shift (group_norm, instance_norm)
        if opset >= 17:
            d = s.inputs[0].type.shape[-1]
            ones, zeros = (w.const(s.layer or "norm", np.full(d, v, np.float32)) for v in (1.0, 0.0))
            w.node("LayerNormalization", [xs[0], ones, zeros], out, s, axis=-1, epsilon=float(a["eps"]))
        else:
            _normalise_rows(w, s, xs[0], float(a["eps"]), opset, out)
    elif s.op == "broadcast_channel":
        shape = tuple(a["shape"])
        readers = w.users.get(s.out.name, [])
        c = s.inputs[0].type.shape[0]
        if readers and all(r.op in _BINARY for r in readers) and len(shape) >= 2:  # ONNX broadcasts [C, 1, ...]
            w.node("Reshape", [xs[0], w.const(s.layer or "broadcast", np.asarray([c] + [1] * (len(shape) - 2),
                                                                                  np.int64))], out, s)  # fmt: skip
        else:
            target = np.asarray([1, c] + [1] * (len(shape) - 2), np.int64)
            w.node("Reshape", [xs[0], w.const(s.layer or "broadcast", target)], f"{out}/c", s)
            w.node("Expand", [f"{out}/c", w.const(s.layer or "broadcast", np.asarray(shape, np.int64))], out, s)
    elif s.op == "bias_add":
        rank = len(s.inputs[0].type.shape)
        b = w.arrays.get(xs[1])
        if b is None or rank < 2:
            raise refuse(s, "a bias of a computed value")
        shaped = w.const(xs[1], np.asarray(b, np.float32).reshape(-1, *([1] * (rank - 2))))
        w.node("Add", [xs[0], shaped], out, s)
    elif s.op in _UNARY:
        w.node(_UNARY[s.op], xs, out, s)
    elif s.op in _BINARY:
        w.node(_BINARY[s.op], xs, out, s)
    elif s.op in _SCALAR:
        op, left = _SCALAR[s.op]
        c = w.const(s.layer or s.op, np.asarray(a["value"], np.float32))
        w.node(op, [c, xs[0]] if left else [xs[0], c], out, s)
    elif s.op == "leaky_relu":
        w.node("LeakyRelu", xs, out, s, alpha=float(a["slope"]))
    elif s.op in ("max_pool2d", "avg_pool2d"):
        kw = {"count_include_pad": 1} if s.op == "avg_pool2d" else {}
        w.node("MaxPool" if s.op == "max_pool2d" else "AveragePool", xs, out, s, kernel_shape=list(a["kernel"]),
               strides=list(a["stride"]), pads=folded_pads(s, folds), **kw)  # fmt: skip
    elif s.op == "global_avg_pool":
        w.node("GlobalAveragePool", xs, out, s)
    elif s.op == "reshape":
        src, dst = s.inputs[0].type.shape, s.out.type.shape
        if len(dst) == 2 and dst[0] == src[0]:
            w.node("Flatten", xs, out, s, axis=1)
        else:  # the batch kept symbolic: 0 (copy it) where it stays, -1 where it folds into the first axis
            keep = [0, *dst[1:]] if dst and src and dst[0] == src[0] == batch else list(dst)
            if batch and dst and src and dst[0] != src[0] and dst[0] % batch == 0 and src[0] % batch == 0:
                keep = [-1, *dst[1:]]
            w.node("Reshape", [xs[0], w.const(s.layer or "reshape", np.asarray(keep, np.int64))], out, s)
    elif s.op == "concat":
        w.node("Concat", xs, out, s, axis=int(a["axis"]))
    elif s.op in ("softmax", "log_softmax"):
        if len(s.inputs[0].type.shape) != 2:
            raise refuse(s, "ONNX's softmax before opset 13 is over the last axes; deepdsl's over axis 1")
        w.node("Softmax" if s.op == "softmax" else "LogSoftmax", xs, out, s, axis=1)
    elif s.op == "lrn":
        if a["size"] % 2 == 0:
            raise refuse(s, f"size {a['size']} is even: ONNX centres an even window differently (PyTorch)")
        w.node("LRN", xs, out, s, size=int(a["size"]), alpha=float(a["alpha"]), beta=float(a["beta"]),
               bias=float(a["k"]))  # fmt: skip
    elif s.op == "bn_apply":
        x, mean, var, *affine = xs
        if not affine:
            c = s.inputs[1].type.shape[0]
            hint = s.layer or "bn"
            affine = [w.const(hint, np.ones(c, np.float32)), w.const(hint, np.zeros(c, np.float32))]
        w.node("BatchNormalization", [x, affine[0], affine[1], mean, var], out, s, epsilon=float(a["eps"]))
    elif s.op in _AXIS_OPS:
        _emit_axis_op(w, s, xs, out)
    elif s.op == "fill":  # a constant: `normal` / `uniform` in inference (their mean), a filled tensor
        shape = tuple(a["shape"])
        if shape and shape[0] == batch and all(u.op in _BINARY for u in users_of(w.g).get(s.out.name, [])):
            shape = (1, *shape[1:])  # the batch axis broadcast by the element-wise ops that read it
        w.node("Identity", [w.const(s.layer or "fill", np.full(shape, a["value"], np.float32))], out, s)
    elif s.op in _ISSUE34:
        _emit_issue34(w, s, xs, out)
    elif s.op == "indexed" and _broadcast(s) is not None:
        w.node(_broadcast(s), [xs[r.input] for r in s.a["body"].args], out, s)  # type: ignore[arg-type]
    elif s.op == "indexed":
        try:
            lower_indexed(w, s, out, batch)
        except Unsupported as e:
            raise refuse(s, f"this tensor function has no decomposition into ONNX operators: {e}") from None
    elif (form := index_form(s)) is not None:  # an op with no ONNX operator of its own (adaptive pooling): its
        # index form decomposed as a tensor function's is
        try:
            lower_indexed(w, s.replace(op="indexed", attrs=(("out", form.out), ("body", form.body))), out, batch)
        except Unsupported as e:
            raise refuse(s, f"no ONNX operator, and its index form has no decomposition: {e}") from None
    else:
        raise refuse(s, "no ONNX operator is written for it")


# ---- slices, sums and maxima along axes, explicit broadcasting (the language's slice, sum, mean, max, expand) ----

_AXIS_OPS = ("slice", "sum", "sum_axes", "max_axes", "expand")


def _emit_axis_op(w: Writer, s: Stmt, xs: list[str], out: str) -> None:
    hint = s.layer or s.op

    def ints(values: list[int]) -> str:
        return w.const(hint, np.asarray(values, np.int64))

    if s.op == "slice":
        starts, ends, axes = ints([s.a["start"]]), ints([s.a["stop"]]), ints([s.a["axis"]])
        w.node("Slice", [xs[0], starts, ends, axes], out, s)
    elif s.op == "expand":  # 1 where x keeps its size (ONNX broadcasts it), so a different batch still fits
        grown = [m if n == 1 else 1 for n, m in zip(s.inputs[0].type.shape, s.out.type.shape)]
        w.node("Expand", [xs[0], ints(grown)], out, s)
    else:
        axes = list(range(s.inputs[0].type.rank)) if s.op == "sum" else list(s.a["axes"])
        op, since = ("ReduceMax", 18) if s.op == "max_axes" else ("ReduceSum", 13)  # axes an input from `since`
        if w.opset >= since:
            w.node(op, [xs[0], ints(axes)], out, s, keepdims=0)
        else:
            w.node(op, xs, out, s, axes=axes, keepdims=0)


# ---- activations and group / instance norm's pieces (issue 34) ----

_ISSUE34 = ("clip", "silu", "hard_swish")


def _emit_issue34(w: Writer, s: Stmt, xs: list[str], out: str) -> None:
    a, hint = s.a, s.layer or s.op
    if s.op == "clip":  # relu6 and hard_sigmoid too
        bounds = [w.const(hint, np.asarray(a[k], np.float32)) for k in ("low", "high")]
        w.node("Clip", [xs[0], *bounds], out, s)
    elif s.op == "silu":  # ONNX has no SiLU: x * Sigmoid(x)
        w.node("Sigmoid", xs, f"{out}/sigmoid", s)
        w.node("Mul", [xs[0], f"{out}/sigmoid"], out, s)
    elif s.op == "hard_swish":
        if w.opset < 14:
            raise refuse(s, f"ONNX's HardSwish is in opsets 14 and later, not {w.opset}")
        w.node("HardSwish", xs, out, s)


_INFIX = {"+": "Add", "-": "Sub", "*": "Mul", "/": "Div"}


def _broadcast(s: Stmt) -> str | None:
    """The ONNX operator of a tensor function that is `a[...] OP b[...]` with ONNX's broadcasting (each read's
    indices are the output's last ones, an index 0 where that input's size is 1), as `x[n, c, h, w] * k[c, 0, 0]`
    and the importer's broadcast constants are; else None."""
    from deepdsl.ir.indexexpr import Apply, Read

    body = s.a["body"]
    if not (isinstance(body, Apply) and body.fn in _INFIX and all(isinstance(r, Read) for r in body.args)):
        return None
    out = s.a["out"]
    for r in body.args:
        shape = s.inputs[r.input].type.shape
        if len(r.index) > len(out):
            return None
        for ix, (var, extent), size in zip(r.index, out[len(out) - len(r.index) :], shape):
            if not (ix.plain_var == var and size == extent or not ix.terms and ix.const == 0 and size == 1):
                return None
    return _INFIX[body.fn]
