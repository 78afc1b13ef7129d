"""`lstm` and `gru` layers as ONNX's LSTM and GRU operators, for `deepdsl export`.

The language unrolls a recurrent layer into statements (frontend/recurrent.py): a view of x [N, T, D] as rows, the
input GEMM with NAME.W_ih, per step a slice, from step 1 on a GEMM with NAME.W_hh, and `indexed` statements for
the gates; then a concat of every step's h (sequences=true) or the last h. Here each application of such a layer
is found by its parameters (NAME.W_ih [G, D] beside NAME.W_hh [G, H], G = 4H: LSTM, 3H: GRU) and its statements
(those the layer emitted, from the view of x to the layer's result), and written as one ONNX node:

    Transpose(x, [1, 0, 2]) -> LSTM / GRU (time major: ONNX Runtime's CPU kernels take layout 0 only)
    sequences: Y [T, 1, N, H] -> Reshape [T, N, H] -> Transpose -> [N, T, H];  else Y_h [1, N, H] -> Reshape [N, H]

with the weights reordered from PyTorch's gate order to ONNX's (LSTM i, f, g, o -> i, o, f, c; GRU r, z, n ->
z, r, h), B = [b_ih; b_hh], and GRU's linear_before_reset=1 (PyTorch's n gate: r scales W_hn h + b_hn).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepdsl.ir import Graph, Stmt, Value

# the ONNX gate order as blocks of PyTorch's: LSTM i, o, f, c from i, f, g, o; GRU z, r, h from r, z, n
ONNX_ORDER = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2)}
PARAMS = ("W_ih", "W_hh", "b_ih", "b_hh")


@dataclass(frozen=True)
class Application:
    """One use of a recurrent layer: its statements' outputs, the first of them, its input and its result."""

    kind: str
    layer: str
    hidden: int
    stmts: frozenset[str]
    first: str
    x: Value
    result: Value
    bias: bool


def reorder(w: np.ndarray, kind: str, hidden: int) -> np.ndarray:
    """PyTorch's gate blocks (along axis 0) in ONNX's order."""
    blocks = [w[k * hidden : (k + 1) * hidden] for k in range(len(ONNX_ORDER[kind]))]
    return np.concatenate([blocks[k] for k in ONNX_ORDER[kind]], axis=0)


def find(g: Graph, users: Mapping[str, list[Stmt]]) -> dict[str, Application]:
    """Every application of an lstm or gru layer in `g`, by the output name of its first statement."""
    shapes = {p.value.name: p.value.type.shape for p in g.params}
    made = {s.out.name: s for s in g.stmts}
    starts: dict[str, tuple[str, int]] = {}  # the view of x of each application -> (kind, hidden)
    for s in g.stmts:
        w = s.inputs[1].name if s.op == "linear" else ""
        if not (w == f"{s.layer}.W_ih" and f"{s.layer}.W_hh" in shapes):
            continue
        rows = made.get(s.inputs[0].name)
        if rows is None or rows.op != "reshape" or rows.layer != s.layer or len(rows.inputs[0].type.shape) != 3:
            continue
        gates, hidden = shapes[f"{s.layer}.W_hh"]
        kind = {4 * hidden: "lstm", 3 * hidden: "gru"}.get(gates)
        if kind is not None:
            starts[rows.out.name] = (kind, hidden)
    found: dict[str, Application] = {}
    for first, (kind, hidden) in starts.items():
        app = _collect(g, made[first], kind, hidden, users, shapes, set(starts) - {first})
        if app is not None:
            found[first] = app
    return found


def _collect(g: Graph, rows: Stmt, kind: str, hidden: int, users: Mapping[str, list[Stmt]],
             shapes: Mapping[str, tuple[int, ...]], others: set[str]) -> Application | None:  # fmt: skip
    """The statements of the application that starts with the view of x `rows`: those of its layer reachable from
    it without passing another application's start (a shared layer applied to its own result); its result the one
    of them read outside them (or a program output). None where the statements are not one such layer."""
    layer = rows.layer
    members = {rows.out.name}
    frontier = [rows.out.name]
    while frontier:
        for u in users.get(frontier.pop(), []):
            if u.layer == layer and u.out.name not in members and u.out.name not in others:
                members.add(u.out.name)
                frontier.append(u.out.name)
    outputs = {v.name for _, v in g.outputs}
    leaving = [s for s in g.stmts if s.out.name in members and (
        s.out.name in outputs or any(u.out.name not in members for u in users.get(s.out.name, [])))]  # fmt: skip
    if len(leaving) != 1:
        return None
    result = leaving[0].out
    n, steps, _ = rows.inputs[0].type.shape
    if result.type.shape not in ((n, steps, hidden), (n, hidden)):
        return None
    return Application(kind, layer, hidden, frozenset(members), rows.out.name, rows.inputs[0], result,
                       f"{layer}.b_ih" in shapes)  # fmt: skip


def emit(w: Any, app: Application, s: Stmt, arrays: Mapping[str, np.ndarray]) -> None:
    """The ONNX nodes of `app` (w an onnx_writer.Writer), named after the layer; `s` its first statement."""
    h, kind, layer = app.hidden, app.kind, app.layer
    n, steps, _ = app.x.type.shape
    x_t = f"{app.first}/time_major"
    w.node("Transpose", [app.x.name], x_t, s, perm=[1, 0, 2])

    def weight(name: str) -> np.ndarray:
        return np.asarray(arrays[f"{layer}.{name}"], np.float32)

    ins = [x_t, w.const(f"{layer}.W", reorder(weight("W_ih"), kind, h)[None]),
           w.const(f"{layer}.R", reorder(weight("W_hh"), kind, h)[None])]  # fmt: skip
    if app.bias:
        b = np.concatenate([reorder(weight("b_ih"), kind, h), reorder(weight("b_hh"), kind, h)])
        ins.append(w.const(f"{layer}.B", b[None]))
    attrs: dict[str, Any] = {"hidden_size": h}
    if kind == "gru":
        attrs["linear_before_reset"] = 1
    y = f"{app.first}/Y"
    w.node(kind.upper(), ins, y, s, **attrs)
    node = w.nodes[-1]
    sequences = len(app.result.type.shape) == 3
    if sequences:
        seq = f"{app.first}/steps"
        w.node("Reshape", [y, w.const(layer, np.asarray([steps, -1, h], np.int64))], seq, s)
        w.node("Transpose", [seq], app.result.name, s, perm=[1, 0, 2])
    else:
        node.output[:] = ["", y]  # Y_h, the last step's hidden state [1, N, H]
        w.node("Reshape", [y, w.const(layer, np.asarray([-1, h], np.int64))], app.result.name, s)
