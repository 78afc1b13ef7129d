"""The activations the language has no built-in for, imported as element-wise tensor functions of their ONNX
formulas (Elu, Selu, Celu, Softplus, Softsign, Mish, ThresholdedRelu, Neg, Reciprocal), and PRelu as one whose
parameter is the slope: each equal to ONNX Runtime, one function written for each formula however many nodes use
it, and the slope trained; and what Swin-T, ConvNeXt and GPT-2 exported hold besides (Pad: test_onnx_padding.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402
from test_onnx_breadth import f32, graph, import_and_compare  # noqa: E402

CASES = {
    "Elu": {"alpha": 0.7},
    "Selu": {},
    "Celu": {"alpha": 2.0},
    "Softplus": {},
    "Softsign": {},
    "Mish": {},
    "ThresholdedRelu": {"alpha": 0.5},
    "Neg": {},
}


@pytest.mark.parametrize("op", list(CASES))
def test_an_activation_is_its_formula(tmp_path: Path, op: str) -> None:
    """Two nodes of the op (the second after a Tanh): one tensor function, called twice; ONNX Runtime's outputs on
    values from -60 to 60 (Softplus and Mish do not overflow)."""
    nodes = [helper.make_node(op, ["x"], ["a"], name=f"/a/{op}", **CASES[op]),
             helper.make_node("Tanh", ["a"], ["b"], name="/Tanh"),
             helper.make_node(op, ["b"], ["y"], name=f"/b/{op}", **CASES[op])]  # fmt: skip
    model = graph(nodes, [("x", ["N", 3, 4])], ("y", ["N", 3, 4]), opset=18 if op == "Mish" else 17)  # Mish: 18
    x = f32(2, 3, 4, scale=3.0)
    x[0, 0, :] = [-60.0, -20.0, 20.0, 60.0]
    text = import_and_compare(tmp_path, model, {"x": x}, loss=False)
    assert text.count("tensor ") == 1 and f"# {op}" in text, text


def test_reciprocal(tmp_path: Path) -> None:
    model = graph(
        [helper.make_node("Reciprocal", ["x"], ["y"], name="/Reciprocal")], [("x", ["N", 5])], ("y", ["N", 5])
    )
    x = (np.sign(f32(2, 5)) * (0.5 + np.abs(f32(2, 5)))).astype(np.float32)  # away from 0
    assert "1 / t[i0, i1]" in import_and_compare(tmp_path, model, {"x": x}, loss=False)


@pytest.mark.parametrize("slope", [(3, 1), (1,)], ids=["per_channel", "one"])
def test_prelu_trains_its_slope(cli, tmp_path: Path, slope: tuple) -> None:
    """nn.PReLU(3) on [N, 3, 4] (its weight [3, 1] as the exporters write it) and nn.PReLU() (one slope): ONNX
    Runtime's outputs, and `deepdsl run` changes the slope."""
    nodes = [helper.make_node("PRelu", ["x", "w"], ["a"], name="/act/PRelu"),
             helper.make_node("Flatten", ["a"], ["f"], name="/Flatten"),
             helper.make_node("Gemm", ["f", "head.w", "head.b"], ["y"], name="/head/Gemm", transB=1)]  # fmt: skip
    init = {"w": (0.1 + np.abs(f32(*slope))).astype(np.float32), "head.w": f32(2, 12), "head.b": f32(2)}
    model = graph(nodes, [("x", ["N", 3, 4])], ("y", ["N", 2]), init)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 4, scale=3.0)})
    assert "layer act = act_fn" in text and "param a[" in text, text
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"), "--batch", "4")
    assert r.exit_code == 0, r.output
    r = cli("run", str(tmp_path / "n.ddsl"), "--load", str(tmp_path / "n.npz"), "--iters", "2", "--device", "cpu",
            "--data", "synthetic", "--save", str(tmp_path / "s.npz"))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert not np.array_equal(np.load(tmp_path / "s.npz")["act.a"], np.load(tmp_path / "n.npz")["act.a"])


# ---- what Swin-T and ConvNeXt exported by the dynamo exporter hold besides ----


def test_a_strided_slice(tmp_path: Path) -> None:
    """x[:, :, 0::2, 1::2] (Swin's patch merging): a tensor function reading every second element."""
    init = {"s": np.asarray([0, 1], np.int64), "e": np.asarray([6, 6], np.int64), "a": np.asarray([2, 3], np.int64),
            "st": np.asarray([2, 2], np.int64)}  # fmt: skip
    node = helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="/merge/Slice")
    model = graph([node], [("x", ["N", 4, 6, 6])], ("y", ["N", 4, 3, 3]), init)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 4, 6, 6)}, loss=False)
    assert "t[i0, i1, 2 * i2, 2 * i3 + 1]" in text, text


def test_a_mask_built_by_scatter_is_folded(tmp_path: Path) -> None:
    """ScatterND of constants (Swin's shifted-window mask, built by slice assignment) is computed at import."""
    init = {"zeros": np.zeros((4, 5), np.float32), "where": np.asarray([[1], [3]], np.int64),
            "rows": np.full((2, 5), -100.0, np.float32)}  # fmt: skip
    nodes = [helper.make_node("ScatterND", ["zeros", "where", "rows"], ["mask"], name="/mask/ScatterND"),
             helper.make_node("Add", ["x", "mask"], ["y"], name="/Add")]  # fmt: skip
    model = graph(nodes, [("x", ["N", 4, 5])], ("y", ["N", 4, 5]), init)
    import_and_compare(tmp_path, model, {"x": f32(2, 4, 5)}, loss=False)


def test_a_gather_of_every_position_in_order_is_a_view(tmp_path: Path) -> None:
    """The dynamo exporter's as_strided of a contiguous tensor: the whole tensor flattened (its batch folded in),
    then a Gather by 0, 1, 2, ... in the output's shape: a reshape."""
    init = {"flat": np.asarray([-1], np.int64), "order": np.arange(24, dtype=np.int64).reshape(2, 12)}
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["f"], name="/Reshape"),
             helper.make_node("Gather", ["f", "order"], ["y"], name="/as_strided", axis=0)]  # fmt: skip
    model = graph(nodes, [("x", [2, 3, 2, 2])], ("y", [2, 12]), init)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 2, 2)}, loss=False)
    assert "reshape(" in text and "tensor " not in text, text


# ---- what a GPT-2 exported from PyTorch holds besides ----


def test_gelu_in_its_tanh_form(tmp_path: Path) -> None:
    """Gelu(approximate='tanh') (GPT-2's gelu_new): its formula as a tensor function."""
    node = helper.make_node("Gelu", ["x"], ["y"], name="/mlp/Gelu", approximate="tanh")
    model = graph([node], [("x", ["N", 3, 4])], ("y", ["N", 3, 4]), opset=20)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 4, scale=3.0)}, loss=False)
    assert "tanh(0.7978845608028654 *" in text, text


def test_masked_fill_writes_the_number_first(tmp_path: Path) -> None:
    """att.masked_fill(causal == 0, -inf) exports Where(mask, -inf, att): the mask negated, `j <= i`."""
    upper = ~np.tril(np.ones((4, 4), bool)).reshape(1, 1, 4, 4)
    nodes = [helper.make_node("Where", ["upper", "minf", "x"], ["m"], name="/attn/Where"),
             helper.make_node("Softmax", ["m"], ["y"], name="/attn/Softmax", axis=-1)]  # fmt: skip
    model = graph(nodes, [("x", ["N", 2, 4, 4])], ("y", ["N", 2, 4, 4]),
                  {"upper": upper, "minf": np.asarray(-np.inf, np.float32)})  # fmt: skip
    text = import_and_compare(tmp_path, model, {"x": f32(2, 2, 4, 4, scale=2.0)}, loss=False)
    assert "i3 <= i2 ? t[i0, i1, i2, i3] : -inf" in text, text


# ---- 1-D convolutions and pools (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d) ----


def test_one_dimensional_conv_and_pools(tmp_path: Path) -> None:
    """Conv on [N, C, L] with a stride, dilation, groups and asymmetric pads; MaxPool with auto_pad SAME_UPPER;
    AveragePool in ceil mode: conv1d, max_pool1d and avg_pool1d (their weights as nn.Conv1d's), ONNX Runtime's."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="/c1/Conv", kernel_shape=[3], strides=[2],
                              pads=[2, 1], dilations=[2], group=2),
             helper.make_node("MaxPool", ["c"], ["m"], name="/pool/MaxPool", kernel_shape=[3], strides=[2],
                              auto_pad="SAME_UPPER"),
             helper.make_node("AveragePool", ["m"], ["a"], name="/avg/AveragePool", kernel_shape=[2], strides=[2],
                              ceil_mode=1, count_include_pad=1),
             helper.make_node("Flatten", ["a"], ["f"], name="/Flatten"),
             helper.make_node("Gemm", ["f", "head.w", "head.b"], ["y"], name="/head/Gemm", transB=1)]  # fmt: skip
    init = {"w": f32(6, 2, 3), "b": f32(6), "head.w": f32(3, 6 * 3), "head.b": f32(3)}
    model = graph(nodes, [("x", ["N", 4, 20])], ("y", ["N", 3]), init)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 4, 20, scale=2.0)})
    assert "conv1d(6, 3, stride=2, pad=(2, 1), dilation=2, groups=2)" in text, text
    assert "max_pool1d(" in text and "avg_pool1d(" in text and "ceil_mode=true" in text, text


# ---- names: the dynamo exporter's module scopes ----


def test_a_dynamo_export_names_layers_after_its_modules(tmp_path: Path) -> None:
    """PyTorch's dynamo exporter names nodes by op (`node_Conv_82`) and gives the module path in each node's
    metadata: the layer is named after the innermost module (`features.1.0.block.0` -> `features_1_0_block_0`),
    as the TorchScript exporter's `/features/.../Conv` names it; metadata that is no list of names is ignored."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="node_Conv_82", kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"], name="node_relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="node_Conv_83", kernel_shape=[1, 1])]  # fmt: skip
    scopes = ["['', 'features', 'features.1', 'features.1.0.block.0', 'conv2d']", "['', 'relu']", "x" * 10_000]
    for nd, value in zip(nodes, scopes):
        entry = nd.metadata_props.add()
        entry.key, entry.value = "pkg.torch.onnx.name_scopes", value
    model = graph(nodes, [("x", ["N", 2, 5, 5])], ("y", ["N", 3, 3, 3]), {"w": f32(4, 2, 3, 3), "w2": f32(3, 4, 1, 1)})
    text = import_and_compare(tmp_path, model, {"x": f32(2, 2, 5, 5)}, loss=False)
    assert "layer features_1_0_block_0 = conv(4, kernel=3, bias=false)" in text, text
    assert "layer node_Conv_83 = conv(3, kernel=1, bias=false)" in text, text
