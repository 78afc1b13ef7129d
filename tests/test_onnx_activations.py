"""The activations the language has no built-in for, imported as element-wise tensor functions of their ONNX
formulas (Elu, Selu, Celu, Softplus, Softsign, Mish, ThresholdedRelu, Neg, Reciprocal), and PRelu as one whose
parameter is the slope: each equal to ONNX Runtime, one function written for each formula however many nodes use
it, and the slope trained."""

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
