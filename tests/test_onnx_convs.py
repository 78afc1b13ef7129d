"""ONNX export of the convolution family (issues 33 and 34): dilations, asymmetric pads, ConvTranspose with its
output padding, ceil-mode pooling and the 1-D layers, each as ONNX's attributes; onnxruntime computes what the
NumPy runner computes. Import of Resize in linear mode with align_corners coordinates (`upsample(...,
align_corners=true)`), as PyTorch's exporters write F.interpolate(align_corners=True), and what it refuses."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from deepdsl import api  # noqa: E402
from deepdsl.autodiff import infer_program  # noqa: E402
from deepdsl.backends.numpy_runner import run  # noqa: E402
from deepdsl.backends.onnx_export import export_graph  # noqa: E402
from deepdsl.interop import initial_arrays  # noqa: E402

HEAD = "network T\nconst N = 2\ninput x : [N, 3, 13, 12]\nlabel y : [N] classes 4\n"


def _export(body: str) -> dict:
    text = HEAD + body + "\nloss = softmax_cross_entropy(full(flatten(h), 4), y)\npredict = h\n"
    program = api.compile_source(text, "t.ddsl").program
    arrays = initial_arrays(program)
    rng = np.random.default_rng(3)
    arrays = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in arrays.items()}  # biases not zero
    model = export_graph(infer_program(program.graph), arrays)
    onnx.checker.check_model(model, full_check=True)
    x = rng.standard_normal((2, 3, 13, 12)).astype(np.float32)
    b = api.build(program)
    want = run(b.infer, {d.value.name: x for d in b.infer.inputs}, arrays).outputs["predict"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    return {nd.op_type: {a.name: onnx.helper.get_attribute_value(a) for a in nd.attribute} for nd in model.graph.node}


def test_conv_dilations_and_asymmetric_pads() -> None:
    nodes = _export("h = conv(x, 4, kernel=3, dilation=(2, 1), pad=(1, 0, 3, 2), stride=2)")
    assert nodes["Conv"]["dilations"] == [2, 1] and nodes["Conv"]["pads"] == [1, 0, 3, 2]
    assert "Pad" not in nodes and len(nodes) == 1  # the explicit pad and the bias folded into the Conv


@pytest.mark.parametrize(
    ("args", "output_padding"),
    [("stride=2, pad=1, dilation=2, output_padding=1", [1, 1]), ("stride=(3, 2), output_padding=(2, 1)", [2, 1])],
)
def test_conv_transpose_with_output_padding(args: str, output_padding: list) -> None:
    nodes = _export(f"h = conv_transpose(x, 2, kernel=3, {args})")
    assert nodes["ConvTranspose"]["output_padding"] == output_padding and len(nodes) == 1


@pytest.mark.parametrize(
    ("body", "op", "pads"),
    [
        ("h = max_pool(x, 3, stride=2, pad=(1, 0, 0, 1), ceil_mode=true)", "MaxPool", [1, 0, 1, 1]),
        ("h = avg_pool(x, 2, ceil_mode=true)", "AveragePool", [0, 0, 1, 0]),  # 13 rows: a last window of one
        ("h = avg_pool(x, 3, stride=2, pad=1, ceil_mode=true)", "AveragePool", [1, 1, 1, 2]),  # 12 columns
    ],
)
def test_ceil_mode_and_asymmetric_pools(body: str, op: str, pads: list) -> None:
    nodes = _export(body)
    assert nodes[op]["pads"] == pads
    assert ("Mul" in nodes) == (op == "AveragePool")  # the divisor of a last window past the padding


def test_1d_layers_export_through_reshapes() -> None:
    nodes = _export(
        "s = reshape(x, (N, 3, 156))\n"
        "h = avg_pool1d(max_pool1d(conv1d(s, 4, 3, pad=(2, 0), dilation=2), 3, stride=2, ceil_mode=true), 2, "
        "ceil_mode=true)"
    )
    assert nodes["Conv"]["dilations"] == [1, 2] and nodes["Conv"]["pads"] == [0, 2, 0, 0]


# ---- Resize, linear, align_corners ----


@pytest.mark.parametrize(("opset", "by"), [(11, "sizes"), (13, "scales"), (19, "scales")])
def test_resize_with_aligned_corners_imports(tmp_path, opset: int, by: str) -> None:  # noqa: ANN001
    """F.interpolate(scale_factor=2, mode='bilinear', align_corners=True): ONNX Runtime's output, trained through
    (the upsample has no parameters: the gradient of the resize is checked in tests/ops)."""
    from onnx import helper
    from test_onnx_breadth import f32, graph, import_and_compare

    init = {"roi": np.zeros(0, np.float32), "scales": np.asarray([1, 1, 2, 2], np.float32),
            "none": np.zeros(0, np.float32), "sizes": np.asarray([2, 3, 8, 10], np.int64)}  # fmt: skip
    ins = ["x", "roi", "scales"] if by == "scales" else ["x", "roi", "none", "sizes"]  # opset 11: scales empty
    nodes = [helper.make_node("Resize", ins, ["r"], name="/up/Resize", mode="linear",
                              coordinate_transformation_mode="align_corners"),
             helper.make_node("Conv", ["r", "w"], ["y"], name="/c/Conv", kernel_shape=[3, 3])]  # fmt: skip
    init = {k: v for k, v in init.items() if k in ins} | {"w": f32(2, 3, 3, 3)}
    model = graph(nodes, [("x", ["N", 3, 4, 5])], ("y", ["N", 2, 6, 8]), init, opset)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 4, 5, scale=2.0)}, loss=False)
    assert 'upsample(x, 2, mode="bilinear", align_corners=true)' in text, text


def test_a_resize_upsample_cannot_say_is_refused(tmp_path) -> None:  # noqa: ANN001
    from onnx import helper
    from test_onnx_breadth import graph, text_of

    from deepdsl.errors import DslError

    init = {"roi": np.zeros(0, np.float32), "scales": np.asarray([1, 1, 2, 2], np.float32)}
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="/up/Resize", mode="linear",
                            coordinate_transformation_mode="asymmetric")  # fmt: skip
    model = graph([node], [("x", ["N", 3, 4, 5])], ("y", ["N", 3, 8, 10]), init, 13)
    with pytest.raises(DslError, match="'/up/Resize'.*linear with coordinate_transformation_mode='asymmetric'"):
        text_of(tmp_path, model)
