"""`deepdsl export`: an inference program as an ONNX model, its parameters and model state as initialisers.

    export_graph(g, arrays, opset) -> onnx.ModelProto

`g` is the elaborated inference program (`autodiff.infer_program` of the forward graph), not the optimised one:
its statements are the language's layers (conv2d, bias_add, linear, bn_apply, pooling, element-wise ops), each of
which is one ONNX operator, so the exported graph reads like the network and every later ONNX tool (an
optimiser, a runtime's own fusions) sees plain operators. The optimised program holds `fused` statements whose
body is an arbitrary index expression; lowering those back would only undo the fusion. A convolution or `linear`
followed by its `bias_add` becomes one Conv or Gemm with a bias. The batch dimension is symbolic (`N`) in the
model's input and output, as exporters write it. `onnx` is imported only when a model is written.

This module decides which statements fold into another's node and assembles and checks the model; a
statement's nodes are onnx_nodes's (an lstm / gru layer's onnx_recurrent's), all written through onnx_writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from deepdsl.backends import onnx_recurrent
from deepdsl.backends.onnx_convs import CONV_FAMILY, conv_folds
from deepdsl.backends.onnx_nodes import emit, group_norm, group_norms, layer_norm, layer_norms
from deepdsl.backends.onnx_writer import DEFAULT_OPSET, Writer, require_onnx, users_of
from deepdsl.errors import DslProgramError
from deepdsl.ir import Graph, Stmt
from deepdsl.ir.types import DType
from deepdsl.version import __version__

MIN_OPSET = 11


def export_graph(g: Graph, arrays: Mapping[str, np.ndarray], opset: int = DEFAULT_OPSET) -> Any:
    """The ONNX model of inference program `g` with parameter and state values `arrays` (by name)."""
    onnx = require_onnx()
    from onnx import TensorProto, helper, numpy_helper

    newest = int(onnx.defs.onnx_opset_version())
    if not MIN_OPSET <= opset <= newest:
        raise DslProgramError(f"--opset {opset}: deepdsl exports opsets {MIN_OPSET} to {newest}")
    w = Writer(g, arrays)
    w.opset = opset
    users = users_of(g)
    outputs = {v.name for _, v in g.outputs}
    with_bias: dict[str, Stmt] = {}  # a conv2d / linear result -> the bias_add that alone reads it
    made = {s.out.name: s for s in g.stmts}
    for s in g.stmts:
        src = made.get(s.inputs[0].name) if s.op == "bias_add" else None
        if src is not None and src.op in ("conv2d", "linear", *CONV_FAMILY) and len(users[src.out.name]) == 1:
            if src.out.name not in outputs:
                with_bias[src.out.name] = s
    folded = {b.out.name for b in with_bias.values()}
    norms = layer_norms(g, users, outputs, arrays)  # the bias_add ending a layer norm -> (its rows, gamma, beta)
    for rows, *_ in norms.values():
        folded |= {rows.out.name, *(v.name for v in users[rows.out.name][0].inputs[1:]),
                   users[rows.out.name][0].out.name}  # fmt: skip
    groups = group_norms(g, users, outputs)  # the view back ending a group norm -> (its view, rows, groups)
    for view, rows, _ in groups.values():
        folded |= {view.out.name, rows.out.name}
    folds = conv_folds(g, users, outputs)
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
            layer_norm(w, s, *norms[s.out.name], opset)
            continue
        if s.out.name in groups:
            group_norm(w, s, *groups[s.out.name])
            continue
        emit(w, s, with_bias.get(s.out.name), batch, folds, opset)
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
    read = {i for n in w.nodes for i in n.input}  # a parameter whose node took a reshaped copy (bias_add's) is not
    inits = [numpy_helper.from_array(np.array(a, order="C"), name) for name, a in w.inits.items()  # 0-d stays 0-d
             if name in read]  # fmt: skip
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
