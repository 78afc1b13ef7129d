"""lstm and gru through ONNX, checked by ONNX Runtime: `deepdsl export` writes each layer as one LSTM / GRU node
(weights in ONNX's gate order), and `deepdsl import` reads LSTM and GRU nodes written with onnx.helper the way
PyTorch exports nn.LSTM / nn.GRU (batch_first=True: the Transpose in front, Squeeze / Transpose / Reshape / Gather
behind, zero initial states), layout=1, stacked layers and the last hidden state Y_h; what the language cannot say is
refused with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from deepdsl import api  # noqa: E402
from deepdsl.autodiff import infer_program  # noqa: E402
from deepdsl.backends.numpy_runner import run  # noqa: E402
from deepdsl.backends.onnx_export import export_graph  # noqa: E402
from deepdsl.errors import DslError  # noqa: E402
from deepdsl.interop import initial_arrays  # noqa: E402
from deepdsl.onnx_import import import_model  # noqa: E402

EXAMPLE = ROOT / "networks" / "examples" / "lstm_classifier.ddsl"
RNG = np.random.default_rng(11)
N, T, D, H = 3, 5, 4, 6


def ort_run(model, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def deepdsl_run(program, arrays: dict, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    b = api.build(program)
    return run(b.infer, {b.infer.inputs[0].value.name: x}, arrays).outputs["predict"]


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * max(1.0, float(np.abs(want).max())))


# ---- export ----

# 20 steps: the steps are sliced out of blocks of 5 (frontend/recurrent.py _StepRows)

OTHER = """network Other
const N = 3
input x : [N, 20, 4]
label y : [N] classes 2
layer a = gru(6, bias=false)
layer c = lstm(4, sequences=false)
loss = softmax_cross_entropy(full(c(a(x)), 2), y)
predict = c(a(x))
"""


@pytest.mark.parametrize("source", ["example", "other"])
def test_export_writes_lstm_and_gru_nodes_that_ort_runs(tmp_path: Path, source: str) -> None:
    program = (api.compile_file(EXAMPLE) if source == "example" else api.compile_source(OTHER, "other.ddsl")).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays)
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("LSTM") + ops.count("GRU") == 2 and "Slice" not in ops
    if source == "example":
        gru = next(n for n in model.graph.node if n.op_type == "GRU")
        assert helper.get_attribute_value(next(a for a in gru.attribute if a.name == "linear_before_reset")) == 1
        # the parameters live in the nodes' reordered weights only
        assert not {"rnn.W_ih", "rnn2.W_hh"} & {i.name for i in model.graph.initializer}
    x = RNG.standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
    assert_close(ort_run(model, x), deepdsl_run(program, arrays, x))
    # and back: importing the export gives the same parameters, by name, and outputs
    onnx.save(model, tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", x.shape[0], loss=source == "example")
    again = api.compile_source(got.text, "again.ddsl").program
    used = [a.size for k, a in arrays.items() if source == "example" or not k.startswith("full")]
    assert again.graph.parameter_count == sum(used)
    if source == "example":
        assert "lstm(32)" in got.text and "gru(32, sequences=false)" in got.text
        for name in ("W_ih", "W_hh", "b_ih", "b_hh"):
            np.testing.assert_array_equal(got.arrays[f"rnn.{name}"], arrays[f"rnn.{name}"])
            np.testing.assert_array_equal(got.arrays[f"rnn2.{name}"], arrays[f"rnn2.{name}"])
    assert_close(deepdsl_run(again, got.arrays, x), deepdsl_run(program, arrays, x))


# ---- import of models written as PyTorch writes them ----


class Model:
    def __init__(self, x_shape: list, opset: int = 17) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.x_shape = x_shape
        self.opset = opset
        self.k = 0

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list, n_out: int = 1, **attrs) -> list[str]:  # noqa: ANN003
        self.k += 1
        outs = [f"/rnn/{op}_{self.k}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"/rnn/{op}_{self.k}", **attrs))
        return outs

    def squeeze(self, x: str, axis: int) -> str:
        if self.opset >= 13:
            return self.node("Squeeze", [x, self.init(f"axes{self.k}", np.asarray([axis], np.int64))])[0]
        return self.node("Squeeze", [x], axes=[axis])[0]

    def model(self, out: str, out_shape: list) -> object:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, self.x_shape)
        y = helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)
        g = helper.make_graph(self.nodes, "main_graph", [x], [y], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8
        onnx.checker.check_model(m, full_check=True)
        return m


def recurrent(m: Model, op: str, x: str, d: int, h: int, bias: bool = True, n_out: int = 2, states: bool = True,
              rng: np.random.Generator = RNG, **attrs) -> list[str]:  # noqa: ANN003  # fmt: skip
    g = (4 if op == "LSTM" else 3) * h
    ins = [x, m.init(f"W{m.k}", rng.uniform(-0.7, 0.7, (1, g, d)).astype(np.float32)),
           m.init(f"R{m.k}", rng.uniform(-0.7, 0.7, (1, g, h)).astype(np.float32))]  # fmt: skip
    ins.append(m.init(f"B{m.k}", rng.uniform(-0.7, 0.7, (1, 2 * g)).astype(np.float32)) if bias else "")
    if states:  # zero initial states, as the exporters write them
        zero = m.init(f"h0_{m.k}", np.zeros((1, N, h), np.float32))
        ins += ["", zero] + ([zero] if op == "LSTM" else [])
    if op == "GRU":
        attrs.setdefault("linear_before_reset", 1)
    return m.node(op, ins, n_out, hidden_size=h, **attrs)


def imported_equals_ort(tmp_path: Path, model, loss: bool = False, reference=None) -> str:  # noqa: ANN001
    """The model imported gives ORT's output (of `reference` where given: ORT runs no layout=1 recurrent node)."""
    onnx.save(model, tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", N, loss)
    program = api.compile_source(got.text, "imported.ddsl").program
    x = RNG.standard_normal((N, T, D)).astype(np.float32)
    assert_close(deepdsl_run(program, got.arrays, x), ort_run(reference or model, x))
    return got.text


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("opset", [11, 17])
def test_torchscript_pattern_every_step(tmp_path: Path, op: str, opset: int) -> None:
    """x -> Transpose [1, 0, 2] -> LSTM -> Y [T, 1, N, H] -> Squeeze 1 -> Transpose [1, 0, 2] -> [N, T, H]."""
    m = Model(["N", T, D], opset)
    xt = m.node("Transpose", ["x"], perm=[1, 0, 2])[0]
    y, _ = recurrent(m, op, xt, D, H)
    out = m.node("Transpose", [m.squeeze(y, 1)], perm=[1, 0, 2])[0]
    text = imported_equals_ort(tmp_path, m.model(out, ["N", T, H]))
    assert f"{op.lower()}({H})" in text and "Transpose" not in text


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_torchscript_zero_states_sized_from_the_transposed_input(tmp_path: Path, op: str) -> None:
    """As torch.onnx.export(dynamo=False) writes nn.LSTM: the zero states an Expand of a zero to [1, N, H], N read
    by a Shape of the transposed input, so that the Transpose has a Shape reader beside the recurrent node."""
    m = Model(["N", T, D], 17)
    xt = m.node("Transpose", ["x"], perm=[1, 0, 2])[0]
    n = m.node("Gather", [m.node("Shape", [xt])[0], m.init("one", np.asarray(1, np.int64))], axis=0)[0]
    n = m.node("Unsqueeze", [n, m.init("zero_axis", np.asarray([0], np.int64))])[0]
    size = m.node("Concat", [m.init("lead", np.asarray([1], np.int64)), n, m.init("hidden", np.asarray([H], np.int64))],
                  axis=0)[0]  # fmt: skip
    zero = m.node("Expand", [m.init("zero", np.zeros((1, 1, 1), np.float32)), size])[0]
    g = (4 if op == "LSTM" else 3) * H
    ins = [xt, m.init("W", RNG.uniform(-0.7, 0.7, (1, g, D)).astype(np.float32)),
           m.init("R", RNG.uniform(-0.7, 0.7, (1, g, H)).astype(np.float32)),
           m.init("B", RNG.uniform(-0.7, 0.7, (1, 2 * g)).astype(np.float32)), "", zero]  # fmt: skip
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    y = m.node(op, ins + ([zero] if op == "LSTM" else []), 2, hidden_size=H, **extra)[0]
    out = m.node("Transpose", [m.squeeze(y, 1)], perm=[1, 0, 2])[0]
    text = imported_equals_ort(tmp_path, m.model(out, ["N", T, H]))
    assert f"{op.lower()}({H})" in text and "Transpose" not in text


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_dynamo_pattern_last_step_then_gemm(tmp_path: Path, op: str) -> None:
    """Y -> Transpose [0, 2, 1, 3] -> Reshape [T, N, H] -> Transpose [1, 0, 2] -> Gather(-1, axis 1) -> Gemm."""
    m = Model([N, T, D])
    xt = m.node("Transpose", ["x"], perm=[1, 0, 2])[0]
    y = recurrent(m, op, xt, D, H, n_out=1, layout=0)[0]
    y = m.node("Transpose", [y], perm=[0, 2, 1, 3])[0]
    y = m.node("Reshape", [y, m.init("shape", np.asarray([T, N, H], np.int64))])[0]
    y = m.node("Transpose", [y], perm=[1, 0, 2])[0]
    last = m.node("Gather", [y, m.init("last", np.asarray(-1, np.int64))], axis=1)[0]
    out = m.node("Gemm", [last, m.init("fc.weight", RNG.standard_normal((3, H)).astype(np.float32)),
                          m.init("fc.bias", RNG.standard_normal(3).astype(np.float32))], transB=1)[0]  # fmt: skip
    text = imported_equals_ort(tmp_path, m.model(out, [N, 3]), loss=True)
    assert f"{op.lower()}({H}, sequences=false)" in text


def stacked(layout: int) -> object:
    """A GRU (no bias; with layout 1 reading x as it is, else through a Transpose) feeding two stacked LSTMs (time
    major between them, as num_layers=2 exports), whose Y_h is squeezed to [N, H]."""
    rng = np.random.default_rng(3)
    m = Model(["N", T, D], 14)
    if layout == 1:
        y = recurrent(m, "GRU", "x", D, H, bias=False, n_out=1, states=False, rng=rng, layout=1)[0]  # [N, T, 1, H]
        y = m.squeeze(y, 2)
    else:
        xt = m.node("Transpose", ["x"], perm=[1, 0, 2])[0]
        y = recurrent(m, "GRU", xt, D, H, bias=False, n_out=1, states=False, rng=rng)[0]  # [T, 1, N, H]
        y = m.node("Transpose", [m.squeeze(y, 1)], perm=[1, 0, 2])[0]
    yt = m.node("Transpose", [y], perm=[1, 0, 2])[0]
    y1 = recurrent(m, "LSTM", yt, H, 5, n_out=1, rng=rng)[0]
    y1 = m.squeeze(y1, 1)  # [T, N, 5], read by the next layer as it is
    _, yh = recurrent(m, "LSTM", y1, 5, 2, rng=rng)
    return m.model(m.squeeze(yh, 0), ["N", 2])


@pytest.mark.parametrize("layout", [0, 1])
def test_last_hidden_state_stacked_layers_without_bias_and_layout_one(tmp_path: Path, layout: int) -> None:
    text = imported_equals_ort(tmp_path, stacked(layout), loss=True, reference=stacked(0))
    assert "gru(6, bias=false)" in text and "lstm(5)" in text and "lstm(2, sequences=false)" in text


@pytest.mark.parametrize(
    "case, message",
    [
        ("bidirectional", "direction=bidirectional: the language's lstm runs forward only"),
        ("reverse", "direction=reverse"),
        ("clip", "clip=3.0"),
        ("initial_h", "initial_h is not a constant zero"),
        ("peepholes", "peepholes (P)"),
        ("before_reset", "linear_before_reset=0"),
        ("cell_used", "Y_c (the last cell state) is used"),
        ("activations", "activations ['Relu', 'Tanh', 'Tanh']"),
        ("time_major_input", "its input X is time major (layout 0) but not a Transpose [1, 0, 2]"),
        ("other_reader", "is not read as deepdsl can say it"),
    ],
)
def test_what_the_language_cannot_say_is_refused(tmp_path: Path, case: str, message: str) -> None:
    m = Model(["N", T, D])
    op = "GRU" if case == "before_reset" else "LSTM"
    xt = "x" if case == "time_major_input" else m.node("Transpose", ["x"], perm=[1, 0, 2])[0]
    attrs: dict = {}
    if case in ("bidirectional", "reverse"):
        attrs["direction"] = case
    if case == "clip":
        attrs["clip"] = 3.0
    if case == "before_reset":
        attrs["linear_before_reset"] = 0
    if case == "activations":
        attrs["activations"] = ["Relu", "Tanh", "Tanh"]
    dirs = 2 if case == "bidirectional" else 1
    g = (4 if op == "LSTM" else 3) * H
    ins = [xt, m.init("W", np.zeros((dirs, g, D), np.float32)), m.init("R", np.zeros((dirs, g, H), np.float32)), ""]
    if case == "initial_h":
        ins += ["", m.init("h0", np.ones((1, N, H), np.float32))]
    if case == "peepholes":
        ins += ["", "", "", m.init("P", np.ones((1, 3 * H), np.float32))]
    outs = m.node(op, ins, 3 if case == "cell_used" else 1, hidden_size=H, **attrs)
    if case == "bidirectional":  # Y [T, 2, N, H]
        out, shape = outs[0], [T, 2, "N", H]
    elif case == "other_reader":  # [T, N, H] into a Relu
        out, shape = m.node("Relu", [m.squeeze(outs[0], 1)])[0], [T, "N", H]
    else:
        out = m.node("Transpose", [m.squeeze(outs[0], 1)], perm=[1, 0, 2])[0]
        shape = [T, "N", H] if case == "time_major_input" else ["N", T, H]  # x [N, T, D] read as [T, N, D]
    if case == "cell_used":  # Y_c [1, N, H] added to every step
        out = m.node("Add", [out, m.node("Transpose", [outs[2]], perm=[1, 0, 2])[0]])[0]
    model = m.model(out, shape)
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(DslError) as err:
        import_model(tmp_path / "m.onnx", N, loss=False)
    assert message in str(err.value)
    assert "(LSTM, opset 17)" in str(err.value) or "(GRU, opset 17)" in str(err.value)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_dynamo_unoptimised_reshape_to_a_shape_computed_from_y(tmp_path: Path, op: str) -> None:
    """torch.onnx.export(dynamo=True, optimize=False): the Reshape's shape is computed from a Shape of Y's Transpose
    (which then has two readers, the Shape reading its shape alone)."""
    m = Model([N, T, D])
    xt = m.node("Transpose", ["x"], perm=[1, 0, 2])[0]
    y = recurrent(m, op, xt, D, H, n_out=1, layout=0)[0]
    y = m.node("Transpose", [y], perm=[0, 2, 1, 3])[0]
    lead = m.node("Slice", [m.node("Shape", [y])[0], m.init("s0", np.asarray([0], np.int64)),
                            m.init("s2", np.asarray([2], np.int64))])[0]  # fmt: skip
    shape = m.node("Concat", [lead, m.init("h", np.asarray([H], np.int64))], axis=0)[0]
    y = m.node("Transpose", [m.node("Reshape", [y, shape])[0]], perm=[1, 0, 2])[0]
    last = m.node("Gather", [y, m.init("last", np.asarray(-1, np.int64))], axis=1)[0]
    text = imported_equals_ort(tmp_path, m.model(last, [N, H]))
    assert f"{op.lower()}({H}, sequences=false)" in text
