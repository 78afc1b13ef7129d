"""ONNX's LSTM and GRU nodes as the language's `lstm` and `gru` (batch first), with the nodes exporters write around
them.

An LSTM or GRU node becomes one layer whose parameters are PyTorch's (NAME.W_ih, NAME.W_hh, NAME.b_ih, NAME.b_hh),
the gate blocks reordered from ONNX's (LSTM i, o, f, c; GRU z, r, h) to PyTorch's (i, f, g, o; r, z, n) and B split
into b_ih and b_hh. What the language cannot say is refused with the reason: a reverse or bidirectional direction,
clip, other activations, input_forget, peepholes, sequence lengths, initial states that are not zeros, a GRU with
linear_before_reset=0 (the language's is PyTorch's, =1).

The language's layers read and write batch first ([N, T, ·]); ONNX's take time first (layout 0) unless layout=1.
So the values around a node are followed as PyTorch writes them (torch.onnx.export of nn.LSTM/nn.GRU with
batch_first=True, both the TorchScript and the dynamo exporter, and `deepdsl export`):

- the input X: a Transpose [1, 0, 2] of a batch-first tensor (read by recurrent nodes only, so nothing is written
  for it), or the time-major result of an earlier recurrent node (a stacked, num_layers > 1 network), or with
  layout=1 any [N, T, D] tensor;
- Y [T, 1, N, H]: a Squeeze of axis 1, or a Transpose [0, 2, 1, 3] and a Reshape, gives [T, N, H]; a Transpose
  [1, 0, 2] of that is the layer's [N, T, H] result (`sequences=true`), and a Gather of its last step along axis 1
  (`y[:, -1]`) makes the layer `sequences=false`; a [T, N, H] read by the next recurrent node feeds it directly;
- Y_h [1, N, H] (the last hidden state): a Squeeze of axis 0, a Gather of index 0 or -1 along axis 0, or a Reshape
  to [N, H] gives the `sequences=false` result.

Every node of such a chain is absorbed into the layer; a chain that goes anywhere else is refused, naming where.
`ConstantOfShape` of a constant shape (the TorchScript exporter's zero initial states) is folded to a constant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.folding import numpy_helper_value
from deepdsl.onnx_import.rule_support import value_readers
from deepdsl.onnx_import.writing import Node, call

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer

SUPPORTED = ("ConstantOfShape", "GRU", "LSTM", "Transpose")
# the PyTorch gate block at each ONNX position: LSTM i, o, f, c <- i, f, g, o; GRU z, r, h <- r, z, n
_ONNX_ORDER = {"LSTM": (0, 3, 1, 2), "GRU": (1, 0, 2)}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _time_major(imp: Importer) -> dict[str, str]:
    """ONNX values that are a time-major view ([T, N, ·]) of a batch-first tensor of the written file, by name."""
    found: dict[str, str] | None = getattr(imp, "_recurrent_time_major", None)
    if found is None:
        found = {}
        imp._recurrent_time_major = found  # type: ignore[attr-defined]
    return found


def _is_output(imp: Importer, name: str) -> bool:
    return name in {o.name for o in imp.graph.output}


def _const(imp: Importer, name: str, where: Node) -> np.ndarray | None:
    """The value of `name` if it is a constant: an initialiser, one folded already, or a Constant node's (which the
    graph may list after the node that reads it: an exporter's Squeeze axes, a Gather index)."""
    if not name:
        return None
    c = imp.const(name)
    if c is None:
        c = imp.folded.get(name)  # a shape computed from the known shapes (folded before any rule ran)
    if c is not None:
        return c
    for node in imp.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            attrs = {a.name: imp.onnx.helper.get_attribute_value(a) for a in node.attribute}
            return numpy_helper_value(attrs, where)
    return None


def _attr(node: Any, key: str, default: Any, imp: Importer) -> Any:
    for a in node.attribute:
        if a.name == key:
            v = imp.onnx.helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else [s.decode() if isinstance(s, bytes) else s for s in v] \
                if isinstance(v, list) else v  # fmt: skip
    return default


def _axes(imp: Importer, node: Any, where: Node) -> list[int] | None:
    """A Squeeze's axes (an attribute before opset 13, an input since)."""
    if len(node.input) > 1 and node.input[1]:
        c = _const(imp, node.input[1], where)
        return None if c is None else [int(v) for v in np.ravel(c)]
    axes = _attr(node, "axes", None, imp)
    return None if axes is None else [int(v) for v in axes]


# ---- following the values around a node ----


def _follow(imp: Importer, name: str, form: str, n: int, t: int, h: int) -> tuple[str, str, list[int]] | None:
    """Follow ONNX value `name` of `form` (layout 0: "Y" [T, 1, N, H], "Yh" [1, N, H]; layout 1: "Y1" [N, T, 1, H],
    "Yh1" [N, 1, H]; on the way "TN1H" [T, N, 1, H], "TNH" [T, N, H], "NTH" [N, T, H]) through the nodes that read
    it, one at a time, to where it is the layer's result: ("NTH", value, nodes), ("NH", value, nodes) (the last
    step, [N, H]) or ("TNH", value, nodes) read by recurrent nodes only; None where it goes anywhere else. `nodes`
    are the indices of the nodes passed (absorbed into the layer)."""
    passed: list[int] = []
    while True:
        readers = value_readers(imp, name)  # a Shape of Y (the unoptimised dynamo Reshape) reads none
        if (
            form == "TNH"
            and readers
            and not _is_output(imp, name)
            and all(r.op_type in ("LSTM", "GRU") and r.input[0] == name for _, r in readers)
        ):
            return ("TNH", name, passed)
        if _is_output(imp, name) or len(readers) != 1:
            return ("NTH", name, passed) if form == "NTH" else None
        j, node = readers[0]
        step = _step(imp, j, node, name, form, (n, t, h))
        if step is None:
            return ("NTH", name, passed) if form == "NTH" else None
        passed.append(j)
        name, form = node.output[0], step
        if form == "NH":
            return ("NH", name, passed)


def _step(imp: Importer, j: int, node: Any, name: str, form: str, sizes: tuple[int, int, int]) -> str | None:
    """The form of `node`'s output when it reads `name` of `form` as PyTorch's exports do; None otherwise."""
    n, t, h = sizes
    where = imp._where(j, node)
    op, out = node.op_type, (node.output[0] if node.output else "")
    if op == "Squeeze":
        axes = _axes(imp, node, where)
        rank = len(imp.shape(name, where))
        got = tuple(sorted(a % rank for a in axes)) if axes is not None else ()
        return {("Y", (1,)): "TNH", ("TN1H", (2,)): "TNH", ("Yh", (0,)): "NH", ("Y1", (2,)): "NTH",
                ("Yh1", (1,)): "NH"}.get((form, got))  # fmt: skip
    if op == "Transpose":
        perm = tuple(int(p) for p in _attr(node, "perm", [], imp))
        return {("Y", (0, 2, 1, 3)): "TN1H", ("TNH", (1, 0, 2)): "NTH"}.get((form, perm))
    if op == "Reshape":
        if _const(imp, node.input[1], where) is None or imp.shapes.get(out) is None:
            return None
        return {("Y", (t, n, h)): "TNH", ("TN1H", (t, n, h)): "TNH", ("Yh", (n, h)): "NH", ("Y1", (n, t, h)): "NTH",
                ("Yh1", (n, h)): "NH"}.get((form, tuple(imp.shapes[out])))  # fmt: skip
    if op == "Gather" and form in ("NTH", "Yh"):
        index = _const(imp, node.input[1], where)
        axis = int(_attr(node, "axis", 0, imp))
        if index is None or index.ndim != 0:
            return None
        if form == "NTH" and axis in (1, -2) and int(index) in (-1, t - 1):
            return "NH"
        if form == "Yh" and axis in (0, -3) and int(index) in (-1, 0):
            return "NH"
    return None


def _refuse_chain(where: Node, what: str) -> Exception:
    return where.refuse(
        f"its output {what} is not read as deepdsl can say it: the language's recurrent layers are batch first, "
        "so it must reach [N, T, H] (Squeeze / Transpose / Reshape as PyTorch exports batch_first=True) or the "
        "last step [N, H], or feed the next LSTM / GRU"
    )


# ---- the rules ----


def _recurrent(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    op = node.op_type
    gates = 4 if op == "LSTM" else 3
    direction = attrs.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else str(direction)
    if direction != "forward":
        raise where.refuse(f"direction={direction}: the language's {op.lower()} runs forward only (one direction)")
    if "clip" in attrs:
        raise where.refuse(f"clip={attrs['clip']}: the language's {op.lower()} does not clip its gates")
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in attrs.get("activations", [])]
    if acts and acts != _DEFAULT_ACTIVATIONS[op][: len(acts)] or len(acts) not in (0, len(_DEFAULT_ACTIVATIONS[op])):
        raise where.refuse(f"activations {acts}: the language's {op.lower()} uses {_DEFAULT_ACTIVATIONS[op]}")
    if op == "LSTM" and int(attrs.get("input_forget", 0)):
        raise where.refuse("input_forget=1 (coupled input and forget gates) is not the language's lstm")
    if op == "GRU" and not int(attrs.get("linear_before_reset", 0)):
        raise where.refuse("linear_before_reset=0: the language's gru is PyTorch's, which applies the reset gate "
                           "after the hidden state's linear map (linear_before_reset=1)")  # fmt: skip
    layout = int(attrs.get("layout", 0))
    ins = list(node.input) + [""] * (8 - len(node.input))
    w, r = _const(imp, ins[1], where), _const(imp, ins[2], where)
    if w is None or r is None:
        raise where.refuse("W and R must be initialisers (constants)")
    if w.ndim != 3 or r.ndim != 3 or w.shape[0] != 1 or r.shape[0] != 1:
        raise where.refuse(f"W {list(w.shape)} and R {list(r.shape)}: deepdsl imports one direction "
                           "([1, G, ·] weights)")  # fmt: skip
    h = int(attrs.get("hidden_size", r.shape[2]))
    if w.shape[1] != gates * h or r.shape[1:] != (gates * h, h):
        raise where.refuse(f"W {list(w.shape)} and R {list(r.shape)} do not fit hidden_size={h}")
    b = _const(imp, ins[3], where) if ins[3] else None
    if ins[3] and (b is None or b.shape != (1, 2 * gates * h)):
        raise where.refuse(f"B must be a constant of shape [1, {2 * gates * h}]")
    if ins[4]:
        raise where.refuse("sequence_lens: the language's sequences are all of the full length T")
    states = {5: "initial_h", 6: "initial_c"} if op == "LSTM" else {5: "initial_h"}
    for i, what in states.items():
        if ins[i]:
            c = _const(imp, ins[i], where)
            if c is None or np.any(c != 0):
                raise where.refuse(f"{what} is not a constant zero: the language's {op.lower()} starts from zero "
                                   "states")  # fmt: skip
    if op == "LSTM" and ins[7]:
        p = _const(imp, ins[7], where)
        if p is None or np.any(p != 0):
            raise where.refuse("peepholes (P): the language's lstm has none")
    # the input, batch first
    x_name = ins[0]
    tm = _time_major(imp)
    if layout == 1:
        x = imp.tensor(x_name, where)
    elif x_name in tm:
        x = tm[x_name]
    else:
        raise where.refuse("its input X is time major (layout 0) but not a Transpose [1, 0, 2] of a batch-first "
                           "[N, T, D] tensor: the language's recurrent layers read [N, T, D]")  # fmt: skip
    shape = imp.shape(x_name, where)
    if len(shape) != 3:
        raise where.refuse(f"its input X has rank {len(shape)}, not 3")
    t, n = (shape[1], shape[0]) if layout == 1 else (shape[0], shape[1])
    # where the outputs go
    outs = list(node.output) + [""] * (3 - len(node.output))
    used = [o if o and (o in imp.readers or _is_output(imp, o)) else "" for o in outs]
    if op == "LSTM" and used[2]:
        raise where.refuse("its output Y_c (the last cell state) is used; deepdsl's lstm returns hidden states only")
    if used[0] and used[1]:
        raise where.refuse("both Y and Y_h are used; deepdsl imports one of them (every step, or the last)")
    if not used[0] and not used[1]:
        raise where.refuse("none of its outputs is used")
    if used[0]:
        found = _follow(imp, used[0], "Y1" if layout == 1 else "Y", n, t, h)
        if found is None:
            raise _refuse_chain(where, f"Y '{used[0]}'")
    else:
        found = _follow(imp, used[1], "Yh1" if layout == 1 else "Yh", n, t, h)
        if found is None:
            raise _refuse_chain(where, f"Y_h '{used[1]}'")
    form, result, passed = found
    sequences = form != "NH"
    pytorch = _ONNX_ORDER[op]

    def torch_order(a: np.ndarray) -> np.ndarray:
        blocks = [a[k * h : (k + 1) * h] for k in range(gates)]
        out = [blocks[0]] * gates
        for onnx_pos, torch_pos in enumerate(pytorch):
            out[torch_pos] = blocks[onnx_pos]
        return np.concatenate(out, axis=0)

    params = {"W_ih": torch_order(w[0]), "W_hh": torch_order(r[0])}
    kw = {}
    if not sequences:
        kw["sequences"] = "false"
    if b is None:
        kw["bias"] = "false"
    else:
        params |= {"b_ih": torch_order(b[0, : gates * h]), "b_hh": torch_order(b[0, gates * h :])}
    name = imp.layer(node, where, call(where, op.lower(), [str(h)], kw), params, [i for i in node.input[1:4] if i])
    imp.absorbed.update(passed)
    value = f"{name}({x})"
    target = _Bound(result)
    imp.bind(target, value, name)
    if form == "TNH":  # read by the next recurrent node, time major
        tm[result] = imp.env.pop(result)


class _Bound:
    """What Importer.bind needs of a node: the output it names (the end of the followed chain)."""

    def __init__(self, out: str) -> None:
        self.output = [out]
        self.op_type = "Recurrent"


def _transpose(fallback: Callable[..., None] | None) -> Callable[..., None]:
    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        perm = [int(p) for p in attrs.get("perm", [])]
        readers = value_readers(imp, node.output[0])
        # read as X by recurrent nodes (and by Shape nodes, which the TorchScript exporter writes to size the zero
        # initial states: they fold from the shape alone)
        to_rnn = any(r.op_type in ("LSTM", "GRU") for _, r in readers) and all(
            r.op_type in ("LSTM", "GRU") and r.input[0] == node.output[0] or r.op_type == "Shape" for _, r in readers
        )
        if perm == [1, 0, 2] and to_rnn and node.input[0] in imp.env and not _is_output(imp, node.output[0]):
            _time_major(imp)[node.output[0]] = imp.tensor(node.input[0], where)  # the recurrent node reads it
            return
        if fallback is not None:
            fallback(imp, k, node, where, attrs)
            return
        raise where.refuse(f"perm={perm}: deepdsl imports a Transpose only as the time-major view an LSTM or GRU "
                           "reads (perm [1, 0, 2] of [N, T, D])")  # fmt: skip

    return rule


def _constant_of_shape(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    shape = _const(imp, node.input[0], where)
    if shape is None:
        raise where.refuse("the shape must be a constant (or computed from known shapes)")
    value = numpy_helper_value({"value": attrs["value"]}, where) if "value" in attrs else np.zeros(1, np.float32)
    if value is None or value.size != 1:
        raise where.refuse("its value must be one number")
    dims = [int(d) for d in np.ravel(shape)]
    if any(d < 0 for d in dims) or int(np.prod(dims)) > 1 << 24:
        raise where.refuse(f"shape {dims}: deepdsl folds constants of at most 2^24 elements")
    imp.consts[node.output[0]] = np.full(dims, value.reshape(-1)[0], dtype=value.dtype)


def rules(existing: dict[str, Callable[..., None]]) -> dict[str, Callable[..., None]]:
    """The rules of this module, to add to rules.RULES: a Transpose an existing rule handles stays its (this one
    takes only the time-major view a recurrent node reads), ConstantOfShape only where none exists."""
    out: dict[str, Callable[..., None]] = {"LSTM": _recurrent, "GRU": _recurrent,
                                           "Transpose": _transpose(existing.get("Transpose"))}  # fmt: skip
    if "ConstantOfShape" not in existing:
        out["ConstantOfShape"] = _constant_of_shape
    return out
