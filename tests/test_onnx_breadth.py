"""ONNX breadth (issue 33): every gap of a model in one error; the import rules for the operators of the models a
user brings (the `.ddsl` text each writes, and where the language has the built-ins, ONNX Runtime's outputs); two
data inputs; the export of every op the language has."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx import Net, close  # noqa: E402

from deepdsl.errors import DslError  # noqa: E402
from deepdsl.frontend.builtins import BUILTINS  # noqa: E402
from deepdsl.onnx_import import import_model  # noqa: E402


def needs(*names: str) -> pytest.MarkDecorator:
    """Skip where this build lacks a built-in the imported text calls (other branches add them this round)."""
    missing = [n for n in names if n not in BUILTINS]
    return pytest.mark.skipif(bool(missing), reason=f"built-in {', '.join(missing)} not in this build")


def text_of(tmp_path: Path, model, batch: int | None = 2, loss: bool = False) -> str:  # noqa: ANN001
    """The .ddsl text the import writes, not compiled (it may call built-ins this build lacks)."""
    onnx.save(model, tmp_path / "m.onnx")
    return import_model(tmp_path / "m.onnx", batch, loss).text


def graph(nodes: list, inputs: list, out: tuple, inits: dict | None = None, opset: int = 17):  # noqa: ANN201
    """A model of `nodes` (helper.make_node) with inputs [(name, shape)], output (name, shape), initialisers."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
    y = helper.make_tensor_value_info(out[0], TensorProto.FLOAT, out[1])
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    g = helper.make_graph(nodes, "torch_jit", ins, [y], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


# ---- all gaps at once ----


def many_gaps():  # noqa: ANN201
    """Two unsupported operator types (Erf twice, a custom Foo-free HardMax), an asymmetric pad the language
    cannot say yet of an otherwise supported Conv, and supported nodes between them."""
    n = Net([1, 2, 6, 6])
    h = n.node("Erf", ["input"], "a")
    h = n.node("Relu", [h], "r")
    h = n.node("Erf", [h], "b")
    h = n.conv(h, "c", 2, 2, 3, pads=[0, 0, 1, 1], dilations=[1, 1], strides=[1, 1], auto_pad="NOTSET")
    h = n.node("Hardmax", [h], "h")
    y = helper.make_tensor_value_info(h, TensorProto.FLOAT, ["N", 2, 5, 5])
    g = helper.make_graph(n.nodes, "g", [n.x], [y], n.inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_every_gap_is_listed_in_one_error_grouped_by_op_type(cli, tmp_path: Path) -> None:
    onnx.save(many_gaps(), tmp_path / "m.onnx")
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"), "--no-loss")
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output and not (tmp_path / "n.ddsl").exists() and not (tmp_path / "n.npz").exists()
    out = r.output
    assert "4 nodes cannot be imported (opset 13)" in out, out
    for name, op in (("/a/Erf", "Erf"), ("/b/Erf", "Erf"), ("/h/Hardmax", "Hardmax")):
        assert f"node '{name}' ({op}, opset 13): this operator is not supported" in out, out
    if "pad=(" not in str(BUILTINS["conv"].args):  # the 4-tuple pad is another branch's: without it, a gap
        assert re.search(r"node '/c/Conv' \(Conv, opset 13\): .*asymmetric", out), out
    # grouped: both Erf nodes under one heading, before the Conv's and Hardmax's
    assert out.index("Erf (2 nodes)") < out.index("/a/Erf") < out.index("/b/Erf") < out.index("Hardmax (1 node)")


def test_one_gap_is_the_one_line_error(tmp_path: Path) -> None:
    n = Net([1, 2, 6, 6])
    y = helper.make_tensor_value_info(n.node("Erf", ["input"], "a"), TensorProto.FLOAT, ["N", 2, 6, 6])
    m = helper.make_model(helper.make_graph(n.nodes, "g", [n.x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(DslError, match=r"node '/a/Erf' \(Erf, opset 13\): this operator is not supported"):
        text_of(tmp_path, m)


# ---- export: every network in networks/ and every op, ONNX Runtime against deepdsl ----

from conftest import ROOT  # noqa: E402
from helpers import REDUCED  # noqa: E402
from test_onnx import OPSETS  # noqa: E402

from deepdsl import api  # noqa: E402
from deepdsl.autodiff import infer_program  # noqa: E402
from deepdsl.backends.onnx_export import export_graph  # noqa: E402
from deepdsl.interop import initial_arrays  # noqa: E402

ALL_NETWORKS = sorted(p.stem for p in (ROOT / "networks").glob("*.ddsl"))
SIZES = {**{k: v[0] for k, v in REDUCED.items()}, "vit_tiny": {"N": 2}, "gpt_tiny": {"N": 2, "T": 16},
         "autoencoder": {"N": 4}, "regression": {"N": 4}}  # fmt: skip
BIG = ("alexnet", "overfeat", "vgg16", "googlenet", "resnet50")


def feeds_for(program, rng: np.random.Generator) -> dict[str, np.ndarray]:  # noqa: ANN001
    """A value for each input of the inference program: tokens for an `int vocab` input, else normal draws."""
    out = {}
    for d in infer_program(program.graph).inputs:
        t = d.value.type
        if t.dtype.name == "I64":
            vocab = 8  # fewer than any network's vocabulary
            out[d.value.name] = rng.integers(0, vocab, t.shape).astype(np.int64)
        else:
            out[d.value.name] = rng.standard_normal(t.shape).astype(np.float32)
    return out


def run_deepdsl(program, arrays: dict, feeds: dict) -> np.ndarray:  # noqa: ANN001
    from deepdsl.backends.numpy_runner import run

    b = api.build(program)
    assert b.infer is not None
    return run(b.infer, feeds, arrays).outputs["predict"]


def run_ort(model, feeds: dict) -> np.ndarray:  # noqa: ANN001
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})[0]


@pytest.mark.parametrize("opset", sorted({13, 17, OPSETS[-1]}))
@pytest.mark.parametrize("net", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in ALL_NETWORKS])
def test_every_network_exports_and_ort_equals_deepdsl(net: str, opset: int) -> None:
    program = api.compile_file(str(ROOT / "networks" / f"{net}.ddsl"), SIZES.get(net, {})).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays, opset)
    onnx.checker.check_model(model, full_check=True)
    feeds = feeds_for(program, np.random.default_rng(1))
    close(run_ort(model, feeds), run_deepdsl(program, arrays, feeds))
    ops = {nd.op_type for nd in model.graph.node}
    if net == "vit_tiny":
        assert {"Transpose", "MatMul", "Softmax"} <= ops
        assert ("LayerNormalization" in ops) == (opset >= 17) and ("Gelu" in ops) == (opset >= 20)
        assert "Erf" in ops or opset >= 20
    if net == "gpt_tiny":
        assert "Gather" in ops and "Where" in ops  # the embedding, the causal mask
