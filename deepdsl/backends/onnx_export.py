"""`deepdsl export`: an inference program as an ONNX model, its parameters and model state as initialisers.

    export_graph(g, arrays, opset) -> onnx.ModelProto

`g` is the elaborated inference program (`autodiff.infer_program` of the forward graph), not the optimised one:
its statements are the language's layers (conv2d, bias_add, linear, bn_apply, pooling, element-wise ops), each of
which is one ONNX operator, so the exported graph reads like the network and every later ONNX tool (an
optimiser, a runtime's own fusions) sees plain operators. The optimised program holds `fused` statements whose
body is an arbitrary index expression; lowering those back would only undo the fusion. A convolution or `linear`
followed by its `bias_add` becomes one Conv or Gemm with a bias. The batch dimension is symbolic (`N`) in the
model's input and output, as exporters write it. `onnx` is imported only when a model is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepdsl.backends import onnx_recurrent
from deepdsl.backends.onnx_indexed import Unsupported, lower_indexed
from deepdsl.errors import DslProgramError
from deepdsl.ir import Graph, Stmt
from deepdsl.ir.analysis import index_form
from deepdsl.ir.types import DType
from deepdsl.version import __version__

MIN_OPSET = 11
DEFAULT_OPSET = 17
ONNX_EXTRA = "pip install 'deepdsl[onnx]'"

_UNARY = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log", "sqrt": "Sqrt",
          "abs": "Abs", "neg": "Neg"}  # fmt: skip
_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div"}
# x OP c, and (the r- forms) c OP x
_SCALAR = {"add_scalar": ("Add", False), "mul_scalar": ("Mul", False), "rsub_scalar": ("Sub", True),
           "rdiv_scalar": ("Div", True), "pow_scalar": ("Pow", False)}  # fmt: skip


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise DslProgramError(f"reading and writing ONNX needs the onnx package: {ONNX_EXTRA}") from None
    return onnx


class _Writer:
    def __init__(self, g: Graph, arrays: Mapping[str, np.ndarray]):
        self.onnx = _onnx()
        self.g = g
        self.arrays = arrays
        self.nodes: list[Any] = []
        self.inits: dict[str, np.ndarray] = {}
        self.count = 0
        self.names: set[str] = set()
        self.opset = DEFAULT_OPSET  # export_graph sets the one asked for
        self.users: dict[str, list[Stmt]] = {}

    def const(self, hint: str, value: np.ndarray) -> str:
        self.count += 1
        name = f"{hint}/const{self.count}"
        self.inits[name] = value
        return name

    def node(self, op: str, inputs: list[str], output: str, s: Stmt, **attrs: Any) -> None:
        """A node named after its layer (`cv1`), or `layer/Op`, `layer/Op_2`, ... where that is taken."""
        base = s.layer or op
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}/{op}" if k == 2 else f"{base}/{op}_{k - 1}"
        self.names.add(name)
        # where it comes from, the file without its folder (a model is shared; the folder is the user's business)
        where = f"{os.path.basename(s.span.file)}:{s.span.line}:{s.span.col} " if s.span else ""
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [output], name=name,
                                                     doc_string=f"{where}{s.op}", **attrs))  # fmt: skip


def _users(g: Graph) -> dict[str, list[Stmt]]:
    users: dict[str, list[Stmt]] = {}
    for s in g.stmts:
        for v in s.inputs:
            users.setdefault(v.name, []).append(s)
    return users


def _refuse(s: Stmt, why: str) -> DslProgramError:
    where = f" (layer '{s.layer}')" if s.layer else ""
    return DslProgramError(f"cannot export %{s.out.name} = {s.op}(...){where} to ONNX: {why}", s.span)


def export_graph(g: Graph, arrays: Mapping[str, np.ndarray], opset: int = DEFAULT_OPSET) -> Any:
    """The ONNX model of inference program `g` with parameter and state values `arrays` (by name)."""
    onnx = _onnx()
    from onnx import TensorProto, helper, numpy_helper

    newest = int(onnx.defs.onnx_opset_version())
    if not MIN_OPSET <= opset <= newest:
        raise DslProgramError(f"--opset {opset}: deepdsl exports opsets {MIN_OPSET} to {newest}")
    w = _Writer(g, arrays)
    w.opset = opset
    users = _users(g)
    outputs = {v.name for _, v in g.outputs}
    with_bias: dict[str, Stmt] = {}  # a conv2d / linear result -> the bias_add that alone reads it
    made = {s.out.name: s for s in g.stmts}
    for s in g.stmts:
        src = made.get(s.inputs[0].name) if s.op == "bias_add" else None
        if src is not None and src.op in ("conv2d", "linear", *_CONV_FAMILY) and len(users[src.out.name]) == 1:
            if src.out.name not in outputs:
                with_bias[src.out.name] = s
    folded = {b.out.name for b in with_bias.values()}
    norms = _layer_norms(g, users, outputs, arrays)  # the bias_add ending a layer norm -> (its rows, gamma, beta)
    for rows, *_ in norms.values():
        folded |= {rows.out.name, *(v.name for v in users[rows.out.name][0].inputs[1:]),
                   users[rows.out.name][0].out.name}  # fmt: skip
    folds = _conv_folds(g, users, outputs)
    batch = g.inputs[0].value.type.shape[0] if g.inputs else None
    recurrent = onnx_recurrent.find(g, users)  # each lstm / gru layer: one ONNX LSTM or GRU node
    inside = {name for app in recurrent.values() for name in app.stmts}
    w.users = users
    for s in g.stmts:
        if s.out.name in recurrent:
            onnx_recurrent.emit(w, recurrent[s.out.name], s, arrays)
        if s.out.name in folded or s.out.name in inside or s.out.name in folds.skip:
            continue
        if s.out.name in norms:
            _layer_norm(w, s, *norms[s.out.name], opset)
            continue
        _emit(w, s, with_bias.get(s.out.name), batch, folds, opset)
    for p in g.params:
        if p.kind not in ("param", "state"):
            raise DslProgramError(f"cannot export the {p.kind} tensor '{p.value.name}' to ONNX")
        if p.value.name not in arrays:
            raise DslProgramError(f"no value for the parameter '{p.value.name}'")
        w.inits[p.value.name] = np.asarray(arrays[p.value.name], np.float32)
    for app in recurrent.values():  # their weights went into the LSTM / GRU nodes, reordered
        for name in onnx_recurrent.PARAMS:
            w.inits.pop(f"{app.layer}.{name}", None)

    def info(name: str, shape: tuple[int, ...], dtype: DType = DType.F32) -> Any:
        dims: list[Any] = list(shape)
        if dims and dims[0] == batch:
            dims[0] = "N"
        return helper.make_tensor_value_info(name, TensorProto.FLOAT if dtype is DType.F32 else TensorProto.INT64,
                                             dims)  # fmt: skip

    inputs = [info(d.value.name, d.value.type.shape, d.value.type.dtype) for d in g.inputs if d.kind == "input"]
    if len(inputs) != len(g.inputs):
        raise DslProgramError("the inference program reads a label or step; only float inputs can be exported")
    outs = []
    made = {o for n in w.nodes for o in n.output}
    for name, v in g.outputs:
        if v.name in made:  # the node that computes it writes the output's name
            for n in w.nodes:
                n.input[:] = [name if i == v.name else i for i in n.input]
                n.output[:] = [name if o == v.name else o for o in n.output]
        elif v.name != name:  # an input or a parameter returned as it is
            w.nodes.append(helper.make_node("Identity", [v.name], [name], name=f"{name}/Identity"))
        outs.append(info(name, v.type.shape))
    inits = [numpy_helper.from_array(np.array(a, order="C"), name) for name, a in w.inits.items()]  # 0-d stays 0-d
    graph = helper.make_graph(w.nodes, g.name, inputs, outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="deepdsl",
                              producer_version=__version__)  # fmt: skip
    model.ir_version = min(model.ir_version, _ir_version(opset))
    onnx.checker.check_model(model, full_check=True)
    return model


def _ir_version(opset: int) -> int:
    """The IR version of the ONNX release that introduced `opset` (runtimes refuse a newer IR than they know)."""
    from onnx import helper

    for _release, ir, op, *_ in helper.VERSION_TABLE:
        if op == opset:
            return int(ir)
    return int(helper.VERSION_TABLE[-1][1])


def _layer_norms(g: Graph, users: dict, outputs: set, arrays: Mapping) -> dict[str, tuple[Stmt, str, str]]:
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


def _layer_norm(w: _Writer, s: Stmt, rows: Stmt, gamma: str, beta: str, opset: int) -> None:
    """One LayerNormalization over the last axis (opset 17 on), else its decomposition, then the scale and shift."""
    x, eps = rows.inputs[0].name, float(rows.a["eps"])
    if opset >= 17:
        w.node("LayerNormalization", [x, gamma, beta], s.out.name, rows, axis=-1, epsilon=eps)
        return
    normed = _normalise_rows(w, rows, x, eps, opset)
    scaled = f"{s.out.name}/scaled"
    w.node("Mul", [normed, gamma], scaled, rows)
    w.node("Add", [scaled, beta], s.out.name, rows)


def _normalise_rows(w: _Writer, s: Stmt, x: str, eps: float, opset: int, out: str | None = None) -> str:
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


def _emit(
    w: _Writer, s: Stmt, bias: Stmt | None, batch: int | None, folds: _Folds | None = None, opset: int = DEFAULT_OPSET
) -> None:
    a = s.a
    xs = [v.name for v in s.inputs]
    out = bias.out.name if bias is not None else s.out.name
    extra = [bias.inputs[1].name] if bias is not None else []
    if folds is not None and s.out.name in folds.into:  # an explicit pad before it: read its input, add its pads
        xs[0] = folds.into[s.out.name][0]
    if s.op in _CONV_FAMILY or s.op == "indexed" and _divisor_correction(s) is not None:
        _emit_conv_family(w, s, xs, out, extra, folds)
    elif s.op == "conv2d":
        kh, kw = s.inputs[1].type.shape[2:]
        w.node("Conv", [*xs, *extra], out, s, kernel_shape=[kh, kw], strides=list(a["stride"]),
               pads=_folded_pads(s, folds), group=a["groups"], **_dilations(a))  # fmt: skip
    elif s.op == "linear":
        w.node("Gemm", [*xs, *extra], out, s, transB=1)
    elif s.op == "resize_axis":  # upsample: one axis by an integer factor, as PyTorch's F.interpolate exports it
        rank = len(s.inputs[0].type.shape)
        scales = np.ones(rank, np.float32)
        scales[int(a["axis"])] = float(a["factor"])
        roi = w.const(s.layer or "resize", np.zeros(0, np.float32))
        mode = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"} if (
            a["mode"] == "nearest") else {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}  # fmt: skip
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
            raise _refuse(s, "a bias of a computed value")
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
               strides=list(a["stride"]), pads=_folded_pads(s, folds), **kw)  # fmt: skip
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
            raise _refuse(s, "ONNX's softmax before opset 13 is over the last axes; deepdsl's over axis 1")
        w.node("Softmax" if s.op == "softmax" else "LogSoftmax", xs, out, s, axis=1)
    elif s.op == "lrn":
        if a["size"] % 2 == 0:
            raise _refuse(s, f"size {a['size']} is even: ONNX centres an even window differently (PyTorch)")
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
        if shape and shape[0] == batch and all(u.op in _BINARY for u in _users(w.g).get(s.out.name, [])):
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
            raise _refuse(s, f"this tensor function has no decomposition into ONNX operators: {e}") from None
    elif (form := index_form(s)) is not None:  # an op with no ONNX operator of its own (adaptive pooling): its
        # index form decomposed as a tensor function's is
        try:
            lower_indexed(w, s.replace(op="indexed", attrs=(("out", form.out), ("body", form.body))), out, batch)
        except Unsupported as e:
            raise _refuse(s, f"no ONNX operator, and its index form has no decomposition: {e}") from None
    else:
        raise _refuse(s, "no ONNX operator is written for it")


# ---- slices, sums and maxima along axes, explicit broadcasting (the language's slice, sum, mean, max, expand) ----

_AXIS_OPS = ("slice", "sum", "sum_axes", "max_axes", "expand")


def _emit_axis_op(w: _Writer, s: Stmt, xs: list[str], out: str) -> None:
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


def _emit_issue34(w: _Writer, s: Stmt, xs: list[str], out: str) -> None:
    a, hint = s.a, s.layer or s.op
    if s.op == "clip":  # relu6 and hard_sigmoid too
        bounds = [w.const(hint, np.asarray(a[k], np.float32)) for k in ("low", "high")]
        w.node("Clip", [xs[0], *bounds], out, s)
    elif s.op == "silu":  # ONNX has no SiLU: x * Sigmoid(x)
        w.node("Sigmoid", xs, f"{out}/sigmoid", s)
        w.node("Mul", [xs[0], f"{out}/sigmoid"], out, s)
    elif s.op == "hard_swish":
        if w.opset < 14:
            raise _refuse(s, f"ONNX's HardSwish is in opsets 14 and later, not {w.opset}")
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


# ---- the convolution family (issues 33 and 34): frontend/convs.py's lowerings written back as ONNX's attributes ----
#
# conv_transpose (conv2d_backward_data in an inference program) is ConvTranspose, its output padding the rows its
# output has past the convolution's reach (and an explicit zero pad after it); an explicit pad before a Conv,
# MaxPool (-inf) or AveragePool (zeros, which count_include_pad counts) is that node's pads, asymmetric where they
# are; a pooling's ceil mode is the padding at the end it amounts to, and avg_pool's divisor correction for a window
# hanging past that padding a Mul by a constant. The exported model computes what deepdsl computes (ceil_mode=0,
# the windows spelled out by the pads).

_CONV_FAMILY = ("conv2d_backward_data",)


@dataclass(frozen=True)
class _Folds:
    skip: frozenset[str]  # explicit pads folded into the node next to them
    into: Mapping[str, tuple[str, tuple[int, int, int, int]]]  # reader -> (its ONNX input, (top, left, bottom, right))
    output_padding: Mapping[str, tuple[str, tuple[int, int]]]  # conv2d_backward_data -> (the pad's output, its rows)


def _dilations(a: Mapping[str, Any]) -> dict[str, list[int]]:
    return {"dilations": [int(d) for d in a["dilation"]]} if "dilation" in a else {}


def _folded_pads(s: Stmt, folds: _Folds | None) -> list[int]:
    ph, pw = s.a["pad"]
    t, lft, b, r = folds.into[s.out.name][1] if folds is not None and s.out.name in folds.into else (0, 0, 0, 0)
    return [ph + t, pw + lft, ph + b, pw + r]


def _explicit_pad(s: Stmt) -> tuple[tuple[int, int, int, int], float] | None:
    """((top, left, bottom, right), fill) of a statement that is frontend/convs.py's pad_explicitly: x [N, C, H, W]
    placed at (top, left) in zeros, or in -inf (a select of the inside); else None."""
    from deepdsl.ir.indexexpr import Apply, Const, Read, Var

    if s.op != "indexed" or len(s.inputs) != 1 or len(s.a["out"]) != 4 or len(s.inputs[0].type.shape) != 4:
        return None
    body, fill = s.a["body"], 0.0
    if isinstance(body, Apply) and body.fn == "select" and body.args[2] == Const(float("-inf")):
        body, fill = body.args[1], float("-inf")
    names = [v for v, _ in s.a["out"]]
    plain = isinstance(body, Read) and all(ix.terms == ((v, 1),) for ix, v in zip(body.index, names))
    if not plain or body.input != 0:
        return None
    shifts = [-ix.const for ix in body.index]
    (_, _, h, w), (_, _, oh, ow) = s.inputs[0].type.shape, s.out.type.shape
    t, lft = shifts[2], shifts[3]
    pads = (t, lft, oh - h - t, ow - w - lft)
    if shifts[:2] != [0, 0] or min(pads) < 0:
        return None
    if fill != 0:  # the select's test must be the inside of x, as convs.pad_explicitly writes it
        hv, wv = names[2], names[3]
        inside = Apply("and", (
            Apply("and", (Apply(">=", (Var(hv), Const(t))), Apply("<", (Var(hv), Const(t + h))))),
            Apply("and", (Apply(">=", (Var(wv), Const(lft))), Apply("<", (Var(wv), Const(lft + w))))),
        ))  # fmt: skip
        if s.a["body"].args[0] != inside:
            return None
    return pads, fill


def _conv_folds(g: Graph, users: Mapping[str, list[Stmt]], outputs: set[str]) -> _Folds:
    skip: set[str] = set()
    into: dict[str, tuple[str, tuple[int, int, int, int]]] = {}
    output_padding: dict[str, tuple[str, tuple[int, int]]] = {}
    made = {s.out.name: s for s in g.stmts}
    for s in g.stmts:
        found = _explicit_pad(s)
        readers = users.get(s.out.name, [])
        if found is None or s.out.name in outputs or len(readers) != 1:
            continue
        pads, fill = found
        r = readers[0]
        if r.inputs[0].name == s.out.name and (
            r.op in ("conv2d", "avg_pool2d") and fill == 0 or r.op == "max_pool2d" and fill != 0
        ):
            skip.add(s.out.name)
            into[r.out.name] = (s.inputs[0].name, pads)
            continue
        src = made.get(s.inputs[0].name)
        if (src is not None and src.op == "conv2d_backward_data" and fill == 0 and pads[:2] == (0, 0)
                and len(users[src.out.name]) == 1 and src.out.name not in outputs):  # fmt: skip
            skip.add(s.out.name)
            output_padding[src.out.name] = (s.out.name, (pads[2], pads[3]))
    return _Folds(frozenset(skip), into, output_padding)


def _divisor_correction(s: Stmt) -> np.ndarray | None:
    """The factors [1, 1, OH, OW] of a statement x[n, c, h, w] * f(h, w) (avg_pool's divisor correction in ceil
    mode, frontend/convs.py), f reading nothing; else None."""
    from deepdsl.ir.indexexpr import Apply, Read, reads
    from deepdsl.ops.indexed import evaluate

    if s.op != "indexed" or len(s.inputs) != 1 or len(s.a["out"]) != 4:
        return None
    body, names = s.a["body"], [v for v, _ in s.a["out"]]
    if not (isinstance(body, Apply) and body.fn == "*" and isinstance(body.args[0], Read)):
        return None
    x, factor = body.args
    if x.input != 0 or any(ix.terms != ((v, 1),) or ix.const for ix, v in zip(x.index, names)) or reads(factor):
        return None
    if s.inputs[0].type.shape != s.out.type.shape:
        return None
    grid = tuple((v, n if k >= 2 else 1) for k, (v, n) in enumerate(s.a["out"]))
    values = np.asarray(evaluate(factor, grid, (), np.float32), np.float32)
    return np.broadcast_to(values, tuple(n for _, n in grid)).copy()


def _emit_conv_family(w: _Writer, s: Stmt, xs: list[str], out: str, extra: list[str], folds: _Folds | None) -> None:
    a = s.a
    if s.op == "indexed":  # avg_pool's divisor correction
        factors = _divisor_correction(s)
        w.node("Mul", [xs[0], w.const(s.layer or "avg_pool", factors)], out, s)  # type: ignore[arg-type]
        return
    # conv2d_backward_data: ConvTranspose with the same weight layout [C, out / groups, kh, kw]
    g = s.inputs[0].type.shape
    _, _, kh, kw = s.inputs[1].type.shape
    (sh, sw), (ph, pw) = a["stride"], a["pad"]
    dh, dw = a.get("dilation", (1, 1))
    natural = ((g[2] - 1) * sh - 2 * ph + dh * (kh - 1) + 1, (g[3] - 1) * sw - 2 * pw + dw * (kw - 1) + 1)
    op = [a["in_shape"][2] - natural[0], a["in_shape"][3] - natural[1]]
    if folds is not None and s.out.name in folds.output_padding:
        out, more = folds.output_padding[s.out.name]
        op = [op[0] + more[0], op[1] + more[1]]
    w.node("ConvTranspose", [*xs, *extra], out, s, kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw],
           dilations=[dh, dw], group=a["groups"], output_padding=op)  # fmt: skip
