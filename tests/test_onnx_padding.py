"""Pad on import, each mode a tensor function: constant (a value, negative pads that crop, opset 18's axes), reflect
and edge (nn.ReflectionPad*, nn.ReplicationPad*, as both PyTorch exporters write them) and wrap; each equal to ONNX
Runtime, its gradient the pad's adjoint, one function for the nodes that pad alike, and what the language cannot say
exactly (a pad past what its mode reads, the batch, a crop in reflect mode) a diagnostic naming the node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402
from test_onnx_breadth import f32, graph, import_and_compare, text_of  # noqa: E402

from deepdsl import api  # noqa: E402
from deepdsl.autodiff import gradients, lower, replay  # noqa: E402
from deepdsl.backends.numpy_runner import run  # noqa: E402
from deepdsl.errors import DslError  # noqa: E402
from deepdsl.ir import GraphBuilder  # noqa: E402
from deepdsl.onnx_import import import_model  # noqa: E402


def pad_model(mode: str, pads: list, shape: list, opset: int = 13, value: float | None = None,
              axes: list | None = None, relu: bool = True):  # fmt: skip  # noqa: ANN201
    """x -> Pad(mode) -> Relu (or y = the Pad alone), the pads (and value, axes) as initialisers."""
    out = list(shape)
    for a, b, e in zip(axes or range(len(shape)), pads[: len(pads) // 2], pads[len(pads) // 2 :]):
        out[a] += b + e
    init = {"pads": np.asarray(pads, np.int64)}
    ins = ["x", "pads"]
    if value is not None or axes is not None:
        init["value"] = np.asarray(value or 0.0, np.float32)
        ins.append("value")
    if axes is not None:
        init["axes"] = np.asarray(axes, np.int64)
        ins.append("axes")
    nodes = [helper.make_node("Pad", ins, ["p" if relu else "y"], name="/pad/Pad", mode=mode)]
    nodes += [helper.make_node("Relu", ["p"], ["y"], name="/Relu")] if relu else []
    return graph(nodes, [("x", ["N", *shape[1:]])], ("y", ["N", *out[1:]]), init, opset)


@pytest.mark.parametrize(
    ("opset", "pads", "value", "axes"),
    [(13, [0, 0, 1, 2, 0, 0, 2, 1], 0.0, None),  # nn.ZeroPad2d((2, 1, 1, 2))
     (13, [0, 0, -1, 2, 0, 1, 0, -2], 1.5, None),  # a value, cropping
     (18, [1, 1, 0, 2], -2.0, [2, -1])],  # opset 18's axes
    ids=["zero", "value_and_crop", "axes"],
)  # fmt: skip
def test_constant_pad(tmp_path: Path, opset: int, pads: list, value: float, axes: list | None) -> None:
    model = pad_model("constant", pads, [2, 3, 4, 5], opset, value, axes if axes else None)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 4, 5, scale=2.0)}, loss=False)
    assert "# Pad" in text and (" ? " in text) == (value != 0), text


MODES = {  # id: (mode, pads, input shape, opset, the text of one read)
    "reflection_pad2d_3": ("reflect", [0, 0, 3, 3, 0, 0, 3, 3], [2, 3, 5, 6], 13, "t[i0, i1, 3 - i2, 3 - i3]"),
    "reflect_asymmetric": ("reflect", [0, 0, 1, 0, 0, 0, 2, 3], [2, 2, 4, 5], 13, "t[i0, i1, 7 - i2, 8 - i3]"),
    "reflection_pad1d": ("reflect", [0, 0, 2, 0, 0, 1], [2, 3, 6], 11, "t[i0, i1, 2 - i2]"),
    "replication_pad2d": ("edge", [0, 0, 1, 2, 0, 0, 2, 1], [2, 3, 4, 5], 13, "t[i0, i1, 3, 4]"),
    "edge_past_the_axis": ("edge", [0, 0, 0, 5, 0, 0, 0, 0], [2, 3, 2, 2], 13, "t[i0, i1, i2, 0]"),
    "edge_both_sides": ("edge", [0, 0, 1, 1, 0, 0, 1, 1], [2, 3, 3, 3], 11, "t[i0, i1, 0, 0]"),
    "reflect_axes_18": ("reflect", [1, 2], [2, 3, 4, 5], 18, "t[i0, i1, i2, 1 - i3]"),
    "reflection_pad3d": ("reflect", [0, 0, 1, 1, 1, 0, 0, 1, 1, 1], [1, 2, 3, 3, 4], 13, "t[i0, i1, 1 - i2, 1 - i3"),
    "wrap_19": ("wrap", [0, 0, 1, 2, 0, 0, 2, 1], [2, 3, 4, 5], 19, "t[i0, i1, i2 + 3, i3 + 3]"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(MODES))
def test_reflect_edge_and_wrap_pads(tmp_path: Path, case: str) -> None:
    """Each mode's nested selects read what ONNX Runtime pads with; one statement, no `?` on an unpadded axis."""
    mode, pads, shape, opset, read = MODES[case]
    axes = [-1] if case == "reflect_axes_18" else None
    x = f32(*shape, scale=2.0)
    text = import_and_compare(tmp_path, pad_model(mode, pads, shape, opset, axes=axes), {"x": x}, loss=False)
    assert f"tensor {mode}_pad_fn(" in text and f", {mode}" in text and read in text, text


def test_pads_alike_are_one_function(tmp_path: Path) -> None:
    """A ResNet generator's blocks pad alike (ReflectionPad2d(1) twice): one tensor function, called by both."""
    init = {"pads": np.asarray([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "crop": np.asarray([0, 0, -1, -1] * 2, np.int64)}
    nodes = [helper.make_node("Pad", ["x", "pads"], ["a"], name="/b1/Pad", mode="reflect"),
             helper.make_node("Pad", ["a", "crop"], ["c"], name="/crop/Pad", mode="constant"),
             helper.make_node("Tanh", ["c"], ["t"], name="/Tanh"),
             helper.make_node("Pad", ["t", "pads"], ["y"], name="/b2/Pad", mode="reflect")]  # fmt: skip
    model = graph(nodes, [("x", ["N", 2, 4, 4])], ("y", ["N", 2, 6, 6]), init)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 2, 4, 4)}, loss=False)
    assert text.count("tensor reflect_pad_fn") == 1 and text.count("= reflect_pad_fn(") == 2, text


def _pad_of(mode: str, x: np.ndarray, pads: list) -> np.ndarray:
    half = len(pads) // 2
    return np.pad(x, list(zip(pads[:half], pads[half:])), mode={"edge": "edge", "reflect": "reflect"}[mode])


@pytest.mark.parametrize("case", ["reflection_pad2d_3", "reflect_asymmetric", "replication_pad2d"])
def test_the_gradient_is_the_pads_adjoint(tmp_path: Path, case: str) -> None:
    """The loss mse(pad(x), target)'s gradient to x, in float64, against NumPy's pad's adjoint (each element of x
    pushed through np.pad alone): every padded copy of an element adds its gradient back."""
    mode, pads, shape, _, _ = MODES[case]
    onnx.save(pad_model(mode, pads, shape, relu=False), tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", shape[0], False)
    g = lower(api.compile_source(got.text, "imported.ddsl").program.graph, "train")
    b = GraphBuilder(g.name)
    for d in g.inputs:
        b.add_input(d)
    loss = replay(g, b)[g.output("loss").name]
    b.output("loss", loss)
    b.output("dx", gradients(b, loss, {"x"})["x"])
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape)
    target = rng.standard_normal(_pad_of(mode, x, pads).shape)
    dx = run(b.build(), {"x": x, "target": target}, {}, dtype=np.float64).outputs["dx"]
    dout = 2 * (_pad_of(mode, x, pads) - target) / target.size  # mse's gradient to the padded output
    want = np.zeros(x.size)
    for k in range(x.size):
        e = np.zeros(x.size)
        e[k] = 1.0
        want[k] = float(np.sum(_pad_of(mode, e.reshape(shape), pads) * dout))
    np.testing.assert_allclose(dx.reshape(-1), want, rtol=1e-12, atol=1e-14)


REFUSED = {  # id: (mode, pads, input shape, opset, why)
    "reflect_the_axis": ("reflect", [0, 0, 4, 0, 0, 0, 0, 0], [2, 3, 4, 5], 13,
                         "mode 'reflect' pads axis 2 of size 4 by 4: a reflected pad must be smaller than the axis"),
    "reflect_a_single": ("reflect", [0, 0, 1, 0, 0, 0, 0, 0], [2, 3, 1, 5], 13, "pads axis 2 of size 1 by 1"),
    "the_batch": ("edge", [1, 0, 0, 0, 0, 0, 0, 0], [2, 3, 4, 5], 13, "it pads the batch axis"),
    "reflect_crop": ("reflect", [0, 0, -1, 1, 0, 0, 1, 1], [2, 3, 4, 5], 13,
                     "crop axis 2 in mode 'reflect'; deepdsl crops in constant mode"),
    "wrap_twice": ("wrap", [0, 0, 5, 0, 0, 0, 0, 0], [2, 3, 4, 5], 19, "deepdsl wraps at most once"),
    "four_axes": ("edge", [0, 1, 1, 1, 1, 0, 1, 1, 1, 1], [1, 2, 2, 2, 2], 13,
                  "along 4 axes reads the input at 81 places; deepdsl imports at most 27"),
    "crop_past_the_axis": ("constant", [0, 0, -(2**40), 0, 0, 0, 2**40, 0], [2, 3, 4, 5], 13,
                           "crop axis 2 of size 4 by 1099511627776"),
    "huge": ("edge", [0, 0, 2**40, 0, 0, 0, 0, 0], [2, 3, 4, 5], 13, "elements; at most"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_a_pad_cannot_say_is_refused(tmp_path: Path, case: str) -> None:
    mode, pads, shape, opset, why = REFUSED[case]
    with pytest.raises(DslError, match=f"'/pad/Pad' \\(Pad, opset {opset}\\): .*{why}"):
        text_of(tmp_path, pad_model(mode, pads, shape, opset, relu=False))
