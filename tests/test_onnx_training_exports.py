"""Importing a PyTorch model to train it: both PyTorch exporters fold each batch norm that follows a convolution into
it in eval mode (the import says so, naming the convolutions and how to export with the norms kept), and the dynamo
exporter without its optimiser (`optimize=False`, which keeps them) writes a `bias=False` convolution's bias as
`Expand(CastLike(0))`: folded, and no bias, so the parameters are PyTorch's. The models are built here as the
exporters write them (PyTorch is not a dependency); scripts/pytorch_onnx_models.py --keep-norms runs the real ones."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx_breadth import import_and_compare, text_of  # noqa: E402

from deepdsl.errors import DslError  # noqa: E402

RNG = np.random.default_rng(7)
X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])


def model(nodes: list, inits: dict, out_shape: list, producer: str = "pytorch"):  # noqa: ANN201
    y = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, out_shape)
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    m = helper.make_model(helper.make_graph(nodes, "main_graph", [X], [y], init),
                          opset_imports=[helper.make_opsetid("", 18)], producer_name=producer)  # fmt: skip
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def weight(name: str = "conv.weight") -> dict:
    return {name: (RNG.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)}


def unoptimised_dynamo(bias: np.ndarray | None) -> object:
    """nn.Conv2d(3, 4, 3, bias=False) then nn.BatchNorm2d(4), as `torch.onnx.export(dynamo=True, optimize=False)`
    writes them: the bias a zero cast like the input and expanded to [C] (or, with `bias`, an initialiser)."""
    inits = weight() | {"bn.weight": RNG.uniform(0.5, 1.5, 4).astype(np.float32),
                        "bn.bias": RNG.uniform(-0.2, 0.2, 4).astype(np.float32),
                        "bn.running_mean": RNG.uniform(-0.1, 0.1, 4).astype(np.float32),
                        "bn.running_var": RNG.uniform(0.5, 1.5, 4).astype(np.float32)}  # fmt: skip
    nodes = [
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0.0, np.float32))),
        helper.make_node("CastLike", ["zero", "x"], ["zero_like"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([4], np.int64))),
        helper.make_node("Expand", ["zero_like", "c"], ["zero_bias"]),
    ]
    if bias is not None:
        inits["conv.bias"] = bias
    b = "zero_bias" if bias is None else "conv.bias"
    nodes += [
        helper.make_node("Conv", ["x", "conv.weight", b], ["h"], pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["h", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"], ["y"]
        ),  # fmt: skip
    ]
    return model(nodes, inits, ["N", 4, 6, 6])


def test_an_unoptimised_dynamo_export_has_no_bias_where_the_model_has_none(tmp_path: Path) -> None:
    feeds = {"x": RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)}
    text = import_and_compare(tmp_path, unoptimised_dynamo(None), feeds, loss=False)
    assert "conv(4, kernel=3, pad=1, bias=false)" in text and "batch_norm()" in text, text


def test_a_zero_bias_held_as_an_initialiser_stays_a_parameter(tmp_path: Path) -> None:
    feeds = {"x": RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)}
    text = import_and_compare(tmp_path, unoptimised_dynamo(np.zeros(4, np.float32)), feeds, loss=False)
    assert "conv(4, kernel=3, pad=1)" in text and "bias=false" not in text, text


def test_a_cast_like_of_a_computed_tensor_is_the_tensor(tmp_path: Path) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("CastLike", ["r", "x"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["y"])]  # fmt: skip
    text = import_and_compare(tmp_path, model(nodes, {}, ["N", 3, 6, 6]),
                              {"x": RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)}, loss=False)  # fmt: skip
    assert "CastLike" not in text and "sigmoid" in text, text


def folded(form: str) -> object:
    """A convolution holding a folded batch norm as each exporter writes it, or a plain one: `dynamo` (its node
    metadata's innermost module the BatchNorm2d), `torchscript` (the weight it computed named onnx::Conv_NNN), and
    `plain` / `other_producer` (no fold: a module's own weight; the same name written by another tool)."""
    name = "onnx::Conv_17" if form in ("torchscript", "other_producer") else "stem.weight"
    conv = helper.make_node("Conv", ["x", name, "b"], ["y"], pads=[1, 1, 1, 1], name="node_Conv_3")
    hierarchy = ["torchvision.models.resnet.ResNet", "torch.nn.modules.conv.Conv2d", "aten.conv2d.default"]
    if form == "dynamo":
        hierarchy[1] = "torch.nn.modules.batchnorm.BatchNorm2d"
    if form in ("dynamo", "plain"):
        scopes = repr(["", "bn1" if form == "dynamo" else "stem", "conv2d"])
        helper.set_metadata_props(conv, {"pkg.torch.onnx.class_hierarchy": repr(hierarchy),
                                         "pkg.torch.onnx.name_scopes": scopes})  # fmt: skip
    return model([conv], weight(name) | {"b": np.full(4, 0.1, np.float32)}, ["N", 4, 6, 6],
                 producer="other" if form == "other_producer" else "pytorch")  # fmt: skip


@pytest.mark.parametrize("form", ["dynamo", "torchscript", "plain", "other_producer"])
def test_a_batch_norm_folded_into_a_convolution_is_said(cli, tmp_path: Path, form: str) -> None:
    onnx.save(folded(form), tmp_path / "m.onnx")
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"), "--no-loss", "--batch", "2")
    assert r.exit_code == 0, r.output
    said = "hold a batch norm that PyTorch's exporter folded into them" in r.output
    assert said == (form in ("dynamo", "torchscript")), r.output
    if said:
        assert "1 convolutions (" in r.output and "optimize=False" in r.output, r.output
        assert "do_constant_folding=False" in r.output, r.output
    if form == "dynamo":  # named after the convolution's module (its weight), not the batch norm it holds
        assert "layer stem = conv(4" in (tmp_path / "n.ddsl").read_text(), (tmp_path / "n.ddsl").read_text()
    assert text_of(tmp_path, folded(form))  # the same network either way: the note only says how it was made


def split_model(split: np.ndarray | None, positions: list[int], axis: int = 1, keepdims: int = 1) -> object:
    """x [N, 6, 4, 4] -> SplitToSequence -> SequenceAt at each position -> Concat along the axis (a reordering)."""
    inits = {"at": np.asarray(0, np.int64)} | ({"split": split} if split is not None else {})
    nodes = [helper.make_node("SplitToSequence", ["x6", *(["split"] if split is not None else [])], ["seq"],
                              axis=axis, keepdims=keepdims)]  # fmt: skip
    parts = []
    for k, p in enumerate(positions):
        inits[f"p{k}"] = np.asarray(p, np.int64)
        nodes.append(helper.make_node("SequenceAt", ["seq", f"p{k}"], [f"part{k}"]))
        parts.append(f"part{k}")
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=1))
    x6 = helper.make_tensor_value_info("x6", TensorProto.FLOAT, ["N", 6, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "C", 4, 4][: 4 if keepdims else 3])
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    m = helper.make_model(helper.make_graph(nodes, "main_graph", [x6], [y], init),
                          opset_imports=[helper.make_opsetid("", 18)])  # fmt: skip
    m.ir_version = 8
    return m


@pytest.mark.parametrize("split, positions", [(np.asarray(3, np.int64), [1, 0]),  # torch.chunk(x, 2, 1)
                                              (np.asarray([2, 2, 2], np.int64), [2, -3, 1]),
                                              (None, [5, 0, 3])])  # fmt: skip
def test_split_to_sequence_parts_are_slices(tmp_path: Path, split: np.ndarray | None, positions: list) -> None:
    feeds = {"x6": RNG.standard_normal((2, 6, 4, 4)).astype(np.float32)}
    text = import_and_compare(tmp_path, split_model(split, positions), feeds, loss=False)
    assert "slice(" in text and "Sequence" not in text, text


@pytest.mark.parametrize("model, message", [
    (lambda: split_model(np.asarray(3, np.int64), [2]), "position 2 of 2 parts"),
    (lambda: split_model(np.asarray(1, np.int64), [0], axis=0), "it splits the batch axis"),
    (lambda: split_model(np.asarray([1, 2], np.int64), [0]), "Sum of split values not equal"),  # ONNX's check
    (lambda: split_model(None, [0], keepdims=0), "keepdims=0"),
])  # fmt: skip
def test_what_split_to_sequence_cannot_say_is_refused(tmp_path: Path, model, message: str) -> None:  # noqa: ANN001
    with pytest.raises(DslError, match=re.escape(message)):
        text_of(tmp_path, model())


def test_gather_nd_and_one_input_max_of_constants_fold(tmp_path: Path) -> None:
    """Swin's relative-position bias as the unoptimised dynamo export writes it: a table read by GatherND at an index
    buffer passed through a one-input Max, added to a computed tensor."""
    table = RNG.standard_normal((5, 3)).astype(np.float32)
    index = np.asarray([[4], [0], [2], [-1]], np.int64)
    nodes = [helper.make_node("Max", ["index"], ["index_max"]),
             helper.make_node("GatherND", ["table", "index_max"], ["bias"]),
             helper.make_node("Add", ["x3", "bias"], ["y"])]  # fmt: skip
    x3 = helper.make_tensor_value_info("x3", TensorProto.FLOAT, ["N", 4, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 3])
    m = helper.make_model(helper.make_graph(nodes, "main_graph", [x3], [y], [
        numpy_helper.from_array(table, "table"), numpy_helper.from_array(index, "index")]),
        opset_imports=[helper.make_opsetid("", 18)])  # fmt: skip
    m.ir_version = 8
    import_and_compare(tmp_path, m, {"x3": RNG.standard_normal((2, 4, 3)).astype(np.float32)}, loss=False)
    bad = numpy_helper.from_array(np.asarray([[5]], np.int64), "index")
    m.graph.initializer[1].CopyFrom(bad)
    with pytest.raises(DslError, match="indices out of range for an axis of 5"):
        text_of(tmp_path, m)


@pytest.mark.parametrize("name, trained", [("block.layer_scale", True), ("onnx::Mul_5", False), ("scale", False)])
def test_a_fresh_layer_scale_is_a_parameter(tmp_path: Path, name: str, trained: bool) -> None:
    """ConvNeXt's layer scale, 1e-6 throughout when fresh: a module's parameter (its initialiser's name a module
    path) stays trainable; the same values in a constant an exporter made are a literal."""
    nodes = [helper.make_node("Mul", ["x", name], ["y"])]
    m = model(nodes, {name: np.full((3, 1, 1), 1e-6, np.float32)}, ["N", 3, 6, 6])
    text = import_and_compare(tmp_path, m, {"x": RNG.standard_normal((2, 3, 6, 6)).astype(np.float32)}, loss=False)
    assert ("param k[3, 1, 1]" in text) == trained and ("1e-06 * x" in text or "x * 1e-06" in text) != trained, text


def test_a_group_norm_whose_weights_are_cast_like_it(tmp_path: Path) -> None:
    """nn.GroupNorm(2, 4) as the unoptimised dynamo export writes it: its weight and bias cast like the tensor they
    meet (a CastLike reading the normalised tensor for its type alone, beside the Mul that reads its values), fresh
    (ones and zeros, the module's own initialisers): one trainable group_norm(2)."""
    inits = {"gn.weight": np.ones((4, 1, 1), np.float32), "gn.bias": np.zeros((4, 1, 1), np.float32),
             "ones": np.ones(2, np.float32), "zeros": np.zeros(2, np.float32),
             "groups": np.asarray([0, 2, -1], np.int64), "back": np.asarray([0, 4, 6, 6], np.int64)}  # fmt: skip
    nodes = [helper.make_node("Reshape", ["x4", "groups"], ["g"]),
             helper.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["gn"], epsilon=1e-5),
             helper.make_node("Reshape", ["gn", "back"], ["y"]),
             helper.make_node("CastLike", ["gn.weight", "y"], ["w"]), helper.make_node("Mul", ["y", "w"], ["s"]),
             helper.make_node("CastLike", ["gn.bias", "s"], ["b"]),
             helper.make_node("Add", ["s", "b"], ["out"])]  # fmt: skip
    x4 = helper.make_tensor_value_info("x4", TensorProto.FLOAT, ["N", 4, 6, 6])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4, 6, 6])
    init = [numpy_helper.from_array(v, k) for k, v in inits.items()]
    m = helper.make_model(helper.make_graph(nodes, "main_graph", [x4], [out], init),
                          opset_imports=[helper.make_opsetid("", 18)])  # fmt: skip
    m.ir_version = 8
    text = import_and_compare(tmp_path, m, {"x4": RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)}, loss=False)
    assert "= group_norm(2)" in text and "CastLike" not in text, text
