"""ONNX in and out, checked by ONNX Runtime: every network exported with its initial parameters gives ORT the
output deepdsl's inference program gives; importing that export gives the same parameter count and outputs;
models written with onnx.helper the way exporters write them import, run and equal ORT; what the language cannot
say is refused, naming the node; an imported model trains in Java with the NumPy runner's losses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import REDUCED, ROOT, with_slow

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

TOL = 1e-4


def ort_output(model, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def deepdsl_output(program, arrays: dict, x: np.ndarray) -> np.ndarray:  # noqa: ANN001
    """What `deepdsl run` tests with: the optimised inference program of the network's Build."""
    b = api.build(program)
    assert b.infer is not None
    feeds = {d.value.name: x for d in b.infer.inputs}
    return run(b.infer, feeds, arrays).outputs["predict"]


def close(got: np.ndarray, want: np.ndarray) -> float:
    """Equal within TOL, relative to the output's scale; returns the largest difference."""
    assert got.shape == want.shape
    scale = max(1.0, float(np.max(np.abs(want))))
    diff = float(np.max(np.abs(got - want)))
    assert diff <= TOL * scale, f"largest difference {diff} (outputs up to {scale})"
    return diff


def imported(tmp_path: Path, model, batch: int | None = None, loss: bool = True):  # noqa: ANN001, ANN201
    """The model written, imported and compiled: (program, arrays, text)."""
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    got = import_model(path, batch, loss)
    program = api.compile_source(got.text, "imported.ddsl").program
    return program, got.arrays, got.text


# ---- every network: export, ORT, import ----

NETWORKS = ["mlp", "lenet", "alexnet", "overfeat", "vgg16", "googlenet", "resnet50"]


@pytest.mark.parametrize("net", with_slow(NETWORKS))
def test_network_round_trip(compiled, tmp_path: Path, net: str) -> None:
    sets = REDUCED[net][0]
    program = compiled(net, sets).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays)
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
    want = deepdsl_output(program, arrays, x)
    close(ort_output(model, x), want)
    if net == "lenet":  # nodes named after their layers, each with its source position
        names = [nd.name for nd in model.graph.node]
        assert names == ["cv1", "mp", "cv2", "mp/MaxPool", "net.flatten1", "fc1", "net.relu1", "fc2"]
        assert model.graph.node[0].doc_string == "lenet.ddsl:13:13 conv2d"
        assert [o.name for o in model.graph.output] == ["predict"] and model.graph.node[-1].output == ["predict"]
    # import of the export: the same parameters (count and values) and the same outputs
    again, again_arrays, _ = imported(tmp_path, model, batch=x.shape[0])
    assert again.graph.parameter_count == program.graph.parameter_count
    assert sorted(a.size for a in again_arrays.values()) == sorted(a.size for a in arrays.values())
    close(deepdsl_output(again, again_arrays, x), want)


# ---- models written the way exporters write them ----

RNG = np.random.default_rng(7)


class Net:
    """A graph under construction with PyTorch's naming (`/features/features.0/Conv`, `features.0.weight`)."""

    def __init__(self, shape: list, name: str = "torch_jit") -> None:
        self.nodes: list = []
        self.inits: list = []
        self.name = name
        self.x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch_size", *shape[1:]])
        self.k = 0

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list, path: str, n_out: int = 1, **attrs) -> str:  # noqa: ANN003
        self.k += 1
        outs = [f"/{path}/{op}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"/{path}/{op}", **attrs))
        return outs[0]

    def conv(self, x: str, path: str, cin: int, cout: int, k: int, bias: bool = True, **attrs) -> str:  # noqa: ANN003
        w = self.init(f"{path}.weight", RNG.standard_normal((cout, cin // attrs.get("group", 1), k, k)) * 0.3)
        ins = [x, w] + ([self.init(f"{path}.bias", RNG.standard_normal(cout) * 0.1)] if bias else [])
        return self.node("Conv", ins, path, kernel_shape=[k, k], **attrs)

    def bn(self, x: str, path: str, c: int, **attrs) -> str:  # noqa: ANN003
        ins = [self.init(f"{path}.weight", 1 + 0.2 * RNG.standard_normal(c)),
               self.init(f"{path}.bias", 0.1 * RNG.standard_normal(c)),
               self.init(f"{path}.running_mean", 0.1 * RNG.standard_normal(c)),
               self.init(f"{path}.running_var", 1 + 0.5 * RNG.random(c))]  # fmt: skip
        return self.node("BatchNormalization", [x, *ins], path, **attrs)

    def model(self, out: str, opset: int, out_shape: list) -> object:
        for t in self.inits:  # float64 draws stored as float32, as exporters store weights
            if t.data_type == TensorProto.DOUBLE:
                t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
        y = helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch_size", *out_shape])
        g = helper.make_graph(self.nodes, self.name, [self.x], [y], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="pytorch")
        m.ir_version = 7 if opset <= 15 else 8
        onnx.checker.check_model(m, full_check=True)
        return m


def resnet_like(opset: int) -> object:
    """Conv+BN+Relu chains, a residual Add, a strided 1x1 shortcut, MaxPool with pads, GlobalAveragePool,
    Flatten and a Gemm head."""
    n = Net([1, 3, 16, 16])
    h = n.node("Relu", [n.bn(n.conv("input", "conv1", 3, 8, 3, bias=False, pads=[1, 1, 1, 1], strides=[2, 2]),
                             "bn1", 8)], "relu")  # fmt: skip
    h = n.node("MaxPool", [h], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    a = n.node("Relu", [n.bn(n.conv(h, "layer1.0.conv1", 8, 8, 3, bias=False, pads=[1, 1, 1, 1]), "layer1.0.bn1", 8)],
               "layer1/layer1.0/relu")  # fmt: skip
    a = n.bn(n.conv(a, "layer1.0.conv2", 8, 16, 3, bias=False, pads=[1, 1, 1, 1]), "layer1.0.bn2", 16, epsilon=1e-3)
    s = n.bn(n.conv(h, "layer1.0.downsample.0", 8, 16, 1, bias=False), "layer1.0.downsample.1", 16, momentum=0.8)
    h = n.node("Relu", [n.node("Add", [a, s], "layer1/layer1.0")], "layer1/layer1.0/relu_1")
    h = n.node("Flatten", [n.node("GlobalAveragePool", [h], "avgpool")], "flatten", axis=1)
    w = n.init("fc.weight", RNG.standard_normal((10, 16)).astype(np.float32) * 0.3)
    b = n.init("fc.bias", RNG.standard_normal(10).astype(np.float32))
    out = n.node("Gemm", [h, w, b], "fc", alpha=1.0, beta=1.0, transB=1)
    return n.model(out, opset, [10])


def inception_like(opset: int) -> object:
    """LRN, an inception block's four branches joined by Concat (grouped conv, AveragePool counting padding),
    Dropout, a Reshape to [batch, features], MatMul + Add, constants added and multiplied, and Softmax at the end."""
    n = Net([1, 4, 12, 12], name="inception")
    h = n.node("Relu", [n.conv("input", "stem", 4, 8, 3, pads=[1, 1, 1, 1])], "stem")
    h = n.node("LRN", [h], "lrn", size=5, alpha=1e-4, beta=0.75, bias=2.0)
    b1 = n.node("Relu", [n.conv(h, "b1", 8, 4, 1)], "b1")
    b2 = n.node("LeakyRelu", [n.conv(n.conv(h, "b2a", 8, 4, 1), "b2b", 4, 4, 3, pads=[1, 1, 1, 1], group=2)], "b2",
                alpha=0.2)  # fmt: skip
    b3 = n.node("Sigmoid", [n.conv(h, "b3", 8, 2, 5, pads=[2, 2, 2, 2])], "b3")
    b4 = n.node("AveragePool", [h], "b4", kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                count_include_pad=1)  # fmt: skip
    h = n.node("Concat", [b1, b2, b3, b4], "concat", axis=1)  # 4 + 4 + 2 + 8 = 18 channels
    h = n.node("MaxPool", [h], "pool", kernel_shape=[2, 2], strides=[2, 2])
    scale = n.init("scale", (1 + 0.1 * RNG.standard_normal((18, 1, 1))).astype(np.float32))
    h = n.node("Mul", [h, scale], "scale")  # a per-channel constant: a tensor function with the constant
    h = n.node("Sub", [h, n.init("half", np.asarray(0.5, np.float32))], "shift")  # one number: a literal
    drop = [h] if opset < 12 else [h, n.init("ratio", np.asarray(0.3, np.float32))]
    h = n.node("Dropout", drop, "dropout", **({"ratio": 0.3} if opset < 12 else {}))
    h = n.node("Reshape", [h, n.init("shape", np.asarray([-1, 18 * 36], np.int64))], "reshape")
    h = n.node("Tanh", [h], "tanh")
    w = n.init("head.weight", (RNG.standard_normal((18 * 36, 6)) * 0.1).astype(np.float32))
    h = n.node("MatMul", [h, w], "head")
    h = n.node("Add", [n.init("head.bias", RNG.standard_normal(6).astype(np.float32)), h], "head")
    h = n.node("Identity", [h], "identity")
    out = n.node("Softmax", [h], "softmax", axis=1)
    return n.model(out, opset, [6])


def ort_opsets() -> list[int]:
    """Opsets 11, 13 (Softmax and Dropout changed) and the newest both onnx and ONNX Runtime know."""
    newest = onnx.defs.onnx_opset_version()
    for v in range(newest, 11, -1):
        try:
            ort.InferenceSession(resnet_like(v).SerializeToString(), providers=["CPUExecutionProvider"])
            return sorted({11, 13, v})
        except Exception:  # noqa: BLE001, S112 — this ORT does not run opset v yet
            continue
    return [11, 13]


OPSETS = ort_opsets()


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("make", [resnet_like, inception_like], ids=["resnet_like", "inception_like"])
def test_exporter_style_models_import_and_equal_ort(tmp_path: Path, make, opset: int) -> None:  # noqa: ANN001
    model = make(opset)
    if opset == 11:  # as exporters of that time wrote it: every initialiser listed as a graph input too
        model.graph.input.extend(
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in model.graph.initializer
        )
        onnx.checker.check_model(model, full_check=True)
    program, arrays, text = imported(tmp_path, model, batch=3)
    x = RNG.standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
    close(deepdsl_output(program, arrays, x), ort_output(model, x))
    # readable: one layer line per parameterised node, named after it
    if make is resnet_like:
        assert "layer conv1 = conv(8, kernel=3, stride=2, pad=1, bias=false)" in text
        assert "layer layer1_layer1_0 = batch_norm(eps=0.001)" not in text  # the BN node is named layer1.0.bn2
        assert "batch_norm(eps=0.001)" in text and "batch_norm(momentum=0.2)" in text
        assert "layer fc = full(10)" in text and "const N = 3" in text
        assert text.count("\nlayer ") == 9  # 4 convs, 4 batch norms, fc
    else:
        assert "lrn(" in text and "k=2.0" in text and "concat(" in text and "dropout(" in text
        assert "cross_entropy(" in text and "softmax_cross_entropy(" not in text  # it ends in Softmax


@pytest.mark.parametrize("opset", [11, 13])
def test_a_flatten_computed_from_the_shape_is_folded(tmp_path: Path, opset: int) -> None:
    """`x.view(x.size(0), -1)` as the TorchScript exporter writes it: Shape, Gather, Unsqueeze, Concat, Reshape."""
    n = Net([1, 2, 4, 4])
    h = n.node("Relu", [n.conv("input", "c", 2, 3, 3)], "relu")
    size = n.node("Gather", [n.node("Shape", [h], "shape"), n.init("zero", np.asarray(0, np.int64))], "gather", axis=0)
    if opset < 13:
        size = n.node("Unsqueeze", [size], "unsqueeze", axes=[0])
    else:
        size = n.node("Unsqueeze", [size, n.init("axes", np.asarray([0], np.int64))], "unsqueeze")
    shape = n.node("Concat", [size, n.init("minus_one", np.asarray([-1], np.int64))], "concat", axis=0)
    h = n.node("Reshape", [h, shape], "view")
    w, b = n.init("fc.weight", RNG.standard_normal((5, 12)).astype(np.float32)), n.init("fc.bias", np.ones(5))
    model = n.model(n.node("Gemm", [h, w, b], "fc", transB=1), opset, [5])
    program, arrays, text = imported(tmp_path, model, batch=2)
    assert "flatten(" in text and "Shape" not in text
    x = RNG.standard_normal((2, 2, 4, 4)).astype(np.float32)
    close(deepdsl_output(program, arrays, x), ort_output(model, x))


@pytest.mark.parametrize(("opset", "keepdims"), [(13, 1), (13, 0), (18, 1)])
def test_reduce_mean_over_h_and_w_is_global_avg_pool(tmp_path: Path, opset: int, keepdims: int) -> None:
    n = Net([1, 2, 5, 5])
    h = n.conv("input", "c", 2, 3, 3)
    if opset < 18:
        h = n.node("ReduceMean", [h], "pool", axes=[-2, -1], keepdims=keepdims)
    else:
        h = n.node("ReduceMean", [h, n.init("axes", np.asarray([2, 3], np.int64))], "pool", keepdims=keepdims)
    h = h if not keepdims else n.node("Flatten", [h], "flatten")
    w, b = n.init("fc.weight", RNG.standard_normal((4, 3)).astype(np.float32)), n.init("fc.bias", np.zeros(4))
    model = n.model(n.node("Gemm", [h, w, b], "fc", transB=1), opset, [4])
    program, arrays, text = imported(tmp_path, model, batch=2)
    assert "global_avg_pool(" in text
    x = RNG.standard_normal((2, 2, 5, 5)).astype(np.float32)
    close(deepdsl_output(program, arrays, x), ort_output(model, x))


def test_the_imported_parameters_are_the_initialisers(tmp_path: Path) -> None:
    model = resnet_like(13)
    _, arrays, _ = imported(tmp_path, model)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(arrays["conv1.W"], inits["conv1.weight"])
    np.testing.assert_array_equal(arrays["layer1_0_bn2.running_var"], inits["layer1.0.bn2.running_var"])
    np.testing.assert_array_equal(arrays["fc.W"], inits["fc.weight"])  # transB=1: already [out, in]


def test_symbolic_batch_is_const_n(tmp_path: Path) -> None:
    _, _, text = imported(tmp_path, resnet_like(13))
    assert "const N = 1   # the model's batch was symbolic" in text
    assert text.splitlines()[1] == "network m"  # PyTorch's generic graph name torch_jit: named after m.onnx
    assert "input x : [N, 3, 16, 16]" in text  # the model names it `input`, a reserved word
    program, _, _ = imported(tmp_path, resnet_like(13), batch=5)
    assert program.graph.inputs[0].value.type.shape == (5, 3, 16, 16)
    model = resnet_like(13)
    model.graph.name = "Network"  # the Java runtime's base class: the network takes another name
    assert imported(tmp_path, model)[2].splitlines()[1] == "network NetworkNet"


# ---- the command line ----


def test_cli_import_run_and_export(cli, tmp_path: Path) -> None:
    model = resnet_like(13)
    onnx.save(model, tmp_path / "m.onnx")
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "net.ddsl"), "--params", str(tmp_path / "p.npz"),
            "--batch", "4")  # fmt: skip
    assert r.exit_code == 0, r.output
    names = set(np.load(tmp_path / "p.npz"))
    assert {"conv1.W", "bn1.gamma", "bn1.running_mean", "fc.W", "fc.b"} <= names
    r = cli("run", str(tmp_path / "net.ddsl"), "--load", str(tmp_path / "p.npz"), "--iters", "1", "--device", "cpu",
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert np.isfinite(json.loads(r.stdout)["losses"][0])
    # export what was imported, with the imported weights: ORT gives the original model's output
    r = cli("export", str(tmp_path / "net.ddsl"), "--load", str(tmp_path / "p.npz"), "-o", str(tmp_path / "back.onnx"),
            "--opset", "13")  # fmt: skip
    assert r.exit_code == 0, r.output
    back = onnx.load(tmp_path / "back.onnx")
    onnx.checker.check_model(back, full_check=True)
    assert back.opset_import[0].version == 13
    x = RNG.standard_normal((4, 3, 16, 16)).astype(np.float32)
    close(ort_output(back, x), ort_output(model, x))


def test_a_broadcast_constant_exports_back(cli, tmp_path: Path) -> None:
    """The importer's tensor function for a per-channel constant is one ONNX Mul again."""
    model = inception_like(13)
    onnx.save(model, tmp_path / "m.onnx")
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "i.ddsl"), "--batch", "2")
    assert r.exit_code == 0, r.output
    r = cli("export", str(tmp_path / "i.ddsl"), "--load", str(tmp_path / "i.npz"), "-o", str(tmp_path / "back.onnx"))
    assert r.exit_code == 0, r.output
    back = onnx.load(tmp_path / "back.onnx")
    assert [nd.op_type for nd in back.graph.node].count("Mul") == 1
    x = RNG.standard_normal((2, 4, 12, 12)).astype(np.float32)
    close(ort_output(back, x), ort_output(model, x))


def test_no_loss_imports_any_output(cli, tmp_path: Path) -> None:
    n = Net([1, 3, 8, 8])
    out = n.node("Relu", [n.conv("input", "c", 3, 4, 3)], "r")
    model = n.model(out, 13, [4, 6, 6])
    with pytest.raises(DslError, match="--no-loss"):
        imported(tmp_path, model)
    program, arrays, text = imported(tmp_path, model, batch=2, loss=False)
    assert "label" not in text and "mse(" in text
    x = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
    close(deepdsl_output(program, arrays, x), ort_output(model, x))
    (tmp_path / "n.ddsl").write_text(text)
    r = cli("run", str(tmp_path / "n.ddsl"), "--iters", "1", "--device", "cpu")  # no label: the target is an input
    assert r.exit_code == 0 and "test loss:" in r.output, r.output  # synthetic data makes it (data/named.py)


def test_export_refuses_what_onnx_cannot_say(compiled) -> None:
    from helpers import SMALL

    program = api.compile_source(SMALL, "small.ddsl").program  # its tensor function swish: Mul and Sigmoid
    model = export_graph(infer_program(program.graph), initial_arrays(program))
    x = RNG.standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
    close(ort_output(model, x), deepdsl_output(program, initial_arrays(program), x))
    gram = SMALL.replace("tensor swish(x[B, D]) -> [n, d] = x[n, d] * sigmoid(x[n, d])",
                         "tensor swish(x[B, D]) -> [n, d] = x[n, d] * (sum[k: D] x[n, k])")  # fmt: skip
    assert gram != SMALL
    reduced = api.compile_source(gram, "small.ddsl").program  # a sum inside a tensor function: ReduceSum
    model = export_graph(infer_program(reduced.graph), initial_arrays(reduced))
    assert "ReduceSum" in {n.op_type for n in model.graph.node}
    close(ort_output(model, x), deepdsl_output(reduced, initial_arrays(reduced), x))
    with pytest.raises(DslError, match="--opset 10"):
        export_graph(infer_program(program.graph), initial_arrays(program), opset=10)


# ---- refusals: a clear error, never a traceback, never a different network ----


def _one_node(op: str, inputs: list, attrs: dict, opset: int = 13, shape: tuple = (1, 2, 6, 6), rank: int = 4):  # noqa: ANN201
    n = Net(list(shape))
    ins = [n.init(f"w{k}", v) if isinstance(v, np.ndarray) else v for k, v in enumerate(inputs)]
    out = n.node(op, ["input", *ins], "node", **attrs)
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, [f"d{i}" for i in range(rank)])
    g = helper.make_graph(n.nodes, "g", [n.x], [y], n.inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


REFUSED = {
    "unsupported": (_one_node("Erf", [], {}), r"node '/node/Erf' \(Erf, opset 13\): this operator is not supported"),
    "exclude_pad": (_one_node("AveragePool", [], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}), "count_include_pad"),
    "lrn_even": (_one_node("LRN", [], {"size": 4}), "even window"),
    "lrn_bias": (_one_node("LRN", [], {"size": 3, "bias": 0.0}), "k=0.0: the language's lrn takes >= 1e-30"),
    "old_opset": (_one_node("Relu", [], {}, opset=10), "opset 10; deepdsl imports opsets 11 to"),
    "softmax_4d": (_one_node("Softmax", [], {"axis": 1}), "over axis 1 of"),
    "shape_of_data": (
        _one_node("Gather", [np.asarray([0], np.int64)], {}),
        "Gather from a computed tensor at one constant",
    ),
    "broadcast": (_one_node("Add", [np.ones((2, 1, 2, 6, 6), np.float32)], {}, rank=5), "would broadcast the input"),
    "broadcast_batch": (
        _one_node("Mul", [np.arange(144, dtype=np.float32).reshape(2, 2, 6, 6)], {}),
        "would broadcast",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_language_cannot_say_is_refused(cli, tmp_path: Path, case: str) -> None:
    model, message = REFUSED[case]
    onnx.save(model, tmp_path / "m.onnx")
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"), "--no-loss")
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and "internal error" not in r.output
    assert any(__import__("re").search(message, line) for line in r.output.splitlines()), r.output
    assert not (tmp_path / "n.ddsl").exists()
    if case == "unsupported":
        assert "hint: deepdsl imports Abs, Add, AveragePool, BatchNormalization" in r.output


def test_a_file_that_is_not_onnx_is_an_error(cli, tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"\x00garbage\xff" * 10)
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"))
    assert r.exit_code == 1 and "is not an ONNX model" in r.output, r.output


def test_without_onnx_the_error_names_the_extra(cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    (tmp_path / "m.onnx").write_bytes(b"")
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"))
    assert r.exit_code == 1 and "pip install 'deepdsl[onnx]'" in r.output, r.output
    r = cli("export", str(ROOT / "networks" / "mlp.ddsl"), "-o", str(tmp_path / "m.onnx"))
    assert r.exit_code == 1 and "pip install 'deepdsl[onnx]'" in r.output, r.output


def test_usage_errors_exit_2(cli, tmp_path: Path) -> None:
    onnx.save(resnet_like(13), tmp_path / "m.onnx")
    for args in (["import", str(tmp_path / "m.onnx")], ["import", str(tmp_path / "m.onnx"), "-o", "n.ddsl",
                 "--batch", "0"], ["export", str(ROOT / "networks" / "mlp.ddsl")]):  # fmt: skip
        r = cli(*args)
        assert r.exit_code == 2, r.output
    for command in ("import", "export"):
        r = cli(command, "--help")
        assert r.exit_code == 0 and "Usage:" in r.stdout
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.npz"))
    assert r.exit_code == 1 and "both be written to" in r.output, r.output
    r = cli("export", str(ROOT / "networks" / "mlp.ddsl"), "-o", str(tmp_path / "m.onnx"), "--opset", "10")
    assert r.exit_code == 1 and "deepdsl exports opsets 11 to" in r.output, r.output


def test_export_of_trained_parameters(cli, tmp_path: Path) -> None:
    """`run --save` then `export --load`: the optimizer state in the file is ignored, the trained weights go out."""
    mlp = str(ROOT / "networks" / "mlp.ddsl")
    r = cli("run", mlp, "--set", "N=4", "--iters", "2", "--data", "synthetic", "--device", "cpu", "--save",
            str(tmp_path / "s.npz"))  # fmt: skip
    assert r.exit_code == 0, r.output
    r = cli("export", mlp, "--set", "N=4", "--load", str(tmp_path / "s.npz"), "-o", str(tmp_path / "m.onnx"))
    assert r.exit_code == 0, r.output
    program = api.compile_file(mlp, {"N": 4}).program
    saved = dict(np.load(tmp_path / "s.npz"))
    arrays = {name: saved[name] for name in initial_arrays(program)}
    assert any(not np.array_equal(a, initial_arrays(program)[n]) for n, a in arrays.items())  # it trained
    x = RNG.standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
    close(ort_output(onnx.load(tmp_path / "m.onnx"), x), deepdsl_output(program, arrays, x))


def test_the_imported_text_is_stable(golden, tmp_path: Path) -> None:
    """What `deepdsl import` writes for the inception-like model, line for line (tests/golden/onnx/)."""
    _, _, text = imported(tmp_path, inception_like(13), batch=2)
    golden(ROOT / "tests" / "golden" / "onnx" / "inception_like.ddsl", text)
