"""ONNX breadth (issue 33): every gap of a model in one error; the import rules for the operators of the models a
user brings (the `.ddsl` text each writes, and where the language has the built-ins, ONNX Runtime's outputs); two
data inputs; the export of every op the language has."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx import Net, close  # noqa: E402

from deepdsl.backends.numpy_runner import run  # noqa: E402
from deepdsl.errors import DslError  # noqa: E402
from deepdsl.onnx_import import import_model  # noqa: E402


def text_of(tmp_path: Path, model, batch: int | None = 2, loss: bool = False) -> str:  # noqa: ANN001
    """The .ddsl text the import writes, not compiled."""
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
    """Two unsupported operator types (Erf twice, Hardmax), a Conv with asymmetric pads (which the language says:
    no gap) and supported nodes between them."""
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
    assert "3 nodes cannot be imported (opset 13)" in out, out
    for name, op in (("/a/Erf", "Erf"), ("/b/Erf", "Erf"), ("/h/Hardmax", "Hardmax")):
        assert f"node '{name}' ({op}, opset 13): this operator is not supported" in out, out
    assert "/c/Conv" not in out, out  # its asymmetric pads are the language's pad=(top, left, bottom, right)
    # grouped: both Erf nodes under one heading, before Hardmax's
    assert out.index("Erf (2 nodes)") < out.index("/a/Erf") < out.index("/b/Erf") < out.index("Hardmax (1 node)")


def test_one_gap_is_the_one_line_error(tmp_path: Path) -> None:
    n = Net([1, 2, 6, 6])
    y = helper.make_tensor_value_info(n.node("Erf", ["input"], "a"), TensorProto.FLOAT, ["N", 2, 6, 6])
    m = helper.make_model(helper.make_graph(n.nodes, "g", [n.x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(DslError, match=r"node '/a/Erf' \(Erf, opset 13\): this operator is not supported"):
        text_of(tmp_path, m)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax"])
def test_a_reduction_over_the_batch_or_of_nothing_is_refused(tmp_path: Path, op: str) -> None:
    """ReduceSum / ReduceMax over the batch axis (a network's samples mixed), or with noop_with_empty_axes and no
    axes (the identity ONNX means by it), is a one-line error naming the node; the axes attribute form (opset 11)."""
    cases = (({"axes": [0, 1]}, "over the batch axis", [1, 1, 6, 6]),
             ({"noop_with_empty_axes": 1}, "reduces nothing", ["N", 2, 6, 6]))  # fmt: skip
    for attrs, why, shape in cases:
        n = Net([1, 2, 6, 6])
        opset = 11 if "axes" in attrs else 18
        y = helper.make_tensor_value_info(n.node(op, ["input"], "r", **attrs), TensorProto.FLOAT, shape)
        m = helper.make_model(
            helper.make_graph(n.nodes, "g", [n.x], [y]), opset_imports=[helper.make_opsetid("", opset)]
        )
        with pytest.raises(DslError, match=rf"node '/r/{op}' \({op}, opset {opset}\): .*{why}"):
            text_of(tmp_path, m)


# ---- export: every network in networks/ and every op, ONNX Runtime against deepdsl ----

from helpers import REDUCED, ROOT  # noqa: E402
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


def check_any_batch(model, feeds: dict, want: np.ndarray) -> None:  # noqa: ANN001
    """The model declares its batch symbolic (N): ONNX Runtime runs it at another batch, one sample and three, and each
    sample's output is the exported batch's (a class token's broadcast baked the batch in: Concat failed at 3)."""
    for rows in ((0,), (1, 0, 1)):
        got = run_ort(model, {k: np.ascontiguousarray(v[list(rows)]) for k, v in feeds.items()})
        close(got, want[list(rows)])


@pytest.mark.parametrize("opset", sorted({13, 17, OPSETS[-1]}))
@pytest.mark.parametrize("net", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in ALL_NETWORKS])
def test_every_network_exports_and_ort_equals_deepdsl(net: str, opset: int) -> None:
    program = api.compile_file(str(ROOT / "networks" / f"{net}.ddsl"), SIZES.get(net, {})).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays, opset)
    onnx.checker.check_model(model, full_check=True)
    feeds = feeds_for(program, np.random.default_rng(1))
    want = run_deepdsl(program, arrays, feeds)
    close(run_ort(model, feeds), want)
    if opset == 17:  # the batch's export does not depend on the opset (the default suite's four minutes)
        check_any_batch(model, feeds, want)
    ops = {nd.op_type for nd in model.graph.node}
    if net == "vit_tiny":
        assert {"Transpose", "MatMul", "Softmax"} <= ops
        assert ("LayerNormalization" in ops) == (opset >= 17) and ("Gelu" in ops) == (opset >= 20)
        assert "Erf" in ops or opset >= 20
    if net == "gpt_tiny":
        assert "Gather" in ops and "Where" in ops  # the embedding, the causal mask


EXAMPLES = sorted(p.stem for p in (ROOT / "networks" / "examples").glob("*.ddsl"))


@pytest.mark.parametrize("net", EXAMPLES)
def test_every_example_network_exports_and_ort_equals_deepdsl(net: str) -> None:
    # what practitioners write (networks/examples/): recurrent layers, group norm and adaptive pooling (its index
    # form decomposed), 1-D convolutions, sampling (its inference mean), two inputs, token ids, ...
    program = api.compile_file(str(ROOT / "networks" / "examples" / f"{net}.ddsl"), {"N": 2}).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays, 17)
    onnx.checker.check_model(model, full_check=True)
    feeds = feeds_for(program, np.random.default_rng(1))
    want = run_deepdsl(program, arrays, feeds)
    close(run_ort(model, feeds), want)
    check_any_batch(model, feeds, want)
    read = {i for nd in model.graph.node for i in nd.input}  # no initialiser the runtime would warn of and drop
    assert not [i.name for i in model.graph.initializer if i.name not in read]


# ---- import: the operators of transformers, mobile networks and U-Nets ----


def ort_feeds(model, feeds: dict) -> np.ndarray:  # noqa: ANN001
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def import_and_compare(tmp_path: Path, model, feeds: dict, loss: bool = True) -> str:  # noqa: ANN001
    """Import at the feeds' batch, compile, run the NumPy runner: ONNX Runtime's output within TOL; the text."""
    batch = next(iter(feeds.values())).shape[0]
    onnx.save(model, tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", batch, loss)
    program = api.compile_source(got.text, "imported.ddsl").program
    ours = {d.value.name: v for d, v in zip(infer_program(program.graph).inputs, feeds.values())}
    close(run_deepdsl(program, got.arrays, ours), ort_feeds(model, feeds))
    return got.text


def f32(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


RNG = np.random.default_rng(33)


def encoder_block(opset: int, erf_gelu: bool) -> object:
    """One pre-norm attention block as exporters write nn.TransformerEncoderLayer: LayerNormalization, q, k, v by
    MatMul + Add on [N, T, D], heads by Reshape and Transpose, q kᵀ (MatMul of two computed tensors), a scale,
    Softmax over the last axis, the heads joined, a residual Add, GELU (Gelu, or its Erf form), the first
    token by Gather, a Gemm head."""
    t, d, h = 5, 8, 2
    init = {"ln.w": 1 + f32(d), "ln.b": f32(d), "head.w": f32(3, d), "head.b": f32(3), "scale": np.float32(0.5),
            "heads": np.asarray([0, t, h, d // h], np.int64), "joined": np.asarray([0, t, d], np.int64),
            "zero": np.asarray(0, np.int64), "sqrt2": np.float32(np.sqrt(2)), "one": np.float32(1),
            "half": np.float32(0.5)}  # fmt: skip
    nodes = [helper.make_node("LayerNormalization", ["x", "ln.w", "ln.b"], ["n"], name="/ln/LayerNormalization",
                              axis=-1, epsilon=1e-5)]  # fmt: skip
    for role in "qkv":
        init[f"{role}.w"], init[f"{role}.b"] = f32(d, d), f32(d)
        nodes += [helper.make_node("MatMul", ["n", f"{role}.w"], [f"{role}0"], name=f"/{role}/MatMul"),
                  helper.make_node("Add", [f"{role}0", f"{role}.b"], [f"{role}1"], name=f"/{role}/Add"),
                  helper.make_node("Reshape", [f"{role}1", "heads"], [f"{role}2"], name=f"/{role}/Reshape"),
                  helper.make_node("Transpose", [f"{role}2"], [role], name=f"/{role}/Transpose",
                                   perm=[0, 2, 3, 1] if role == "k" else [0, 2, 1, 3])]  # fmt: skip
    nodes += [
        helper.make_node("MatMul", ["q", "k"], ["s0"], name="/attn/MatMul"),
        helper.make_node("Mul", ["s0", "scale"], ["s"], name="/attn/Mul"),
        helper.make_node("Softmax", ["s"], ["p"], name="/attn/Softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o0"], name="/attn/MatMul_1"),
        helper.make_node("Transpose", ["o0"], ["o1"], name="/attn/Transpose", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o1", "joined"], ["o"], name="/attn/Reshape"),
        helper.make_node("Add", ["x", "o"], ["r"], name="/Add"),
    ]
    if erf_gelu:
        nodes += [helper.make_node("Div", ["r", "sqrt2"], ["g0"], name="/gelu/Div"),
                  helper.make_node("Erf", ["g0"], ["g1"], name="/gelu/Erf"),
                  helper.make_node("Add", ["g1", "one"], ["g2"], name="/gelu/Add"),
                  helper.make_node("Mul", ["r", "g2"], ["g3"], name="/gelu/Mul"),
                  helper.make_node("Mul", ["g3", "half"], ["g"], name="/gelu/Mul_1")]  # fmt: skip
    else:
        nodes.append(helper.make_node("Gelu", ["r"], ["g"], name="/gelu/Gelu"))
    nodes += [helper.make_node("Gather", ["g", "zero"], ["c"], name="/Gather", axis=1),
              helper.make_node("Gemm", ["c", "head.w", "head.b"], ["y"], name="/head/Gemm", transB=1)]  # fmt: skip
    return graph(nodes, [("x", ["N", t, d])], ("y", ["N", 3]), init, opset)


@pytest.mark.parametrize(("opset", "erf"), [(17, True), (OPSETS[-1], False)])
def test_an_attention_block_imports_and_equals_ort(tmp_path: Path, opset: int, erf: bool) -> None:
    if not erf and opset < 20:
        pytest.skip("this ONNX Runtime has no opset 20 (Gelu)")
    model = encoder_block(opset, erf)
    text = import_and_compare(tmp_path, model, {"x": f32(3, 5, 8, scale=1.0)})
    assert "layer ln = layer_norm()" in text and "gelu(r)" in text and "Erf" not in text
    assert "permute(" in text and "softmax(s, axis=-1)" in text, text
    assert "s0 = matmul(q_2, k_2)" in text and "matmul(p, v_2)" in text
    assert "reshape(" in text and "full(8)" in text


def decomposed_layer_norm(opset: int) -> object:
    """nn.LayerNorm as the TorchScript exporter writes it before opset 17."""
    d = 6
    axes = {"axes": [-1]} if opset < 18 else {}
    extra = [] if opset < 18 else ["axes"]
    init = {"two": np.float32(2), "eps": np.float32(1e-5), "w": 1 + f32(d), "b": f32(d), "fc.w": f32(4, d),
            "fc.b": f32(4)}  # fmt: skip
    if opset >= 18:
        init["axes"] = np.asarray([-1], np.int64)
    nodes = [
        helper.make_node("ReduceMean", ["x", *extra], ["m"], name="/ln/ReduceMean", **axes),
        helper.make_node("Sub", ["x", "m"], ["c"], name="/ln/Sub"),
        helper.make_node("Pow", ["c", "two"], ["sq"], name="/ln/Pow"),
        helper.make_node("ReduceMean", ["sq", *extra], ["var"], name="/ln/ReduceMean_1", **axes),
        helper.make_node("Add", ["var", "eps"], ["ve"], name="/ln/Add"),
        helper.make_node("Sqrt", ["ve"], ["sd"], name="/ln/Sqrt"),
        helper.make_node("Div", ["c", "sd"], ["nrm"], name="/ln/Div"),
        helper.make_node("Mul", ["nrm", "w"], ["sc"], name="/ln/Mul"),
        helper.make_node("Add", ["sc", "b"], ["ln"], name="/ln/Add_1"),
        helper.make_node("Gemm", ["ln", "fc.w", "fc.b"], ["y"], name="/fc/Gemm", transB=1),
    ]
    return graph(nodes, [("x", ["N", d])], ("y", ["N", 4]), init, opset)


@pytest.mark.parametrize("opset", [13, 18])
def test_the_decomposed_layer_norm_is_one_layer_norm(tmp_path: Path, opset: int) -> None:
    text = import_and_compare(tmp_path, decomposed_layer_norm(opset), {"x": f32(3, 6, scale=2.0)})
    assert "= layer_norm()" in text and "sqrt(" not in text and "ReduceMean" not in text


def unet_like(opset: int) -> object:
    """Down by a strided conv, up by ConvTranspose (stride 2, padding) and by Resize (nearest as nn.Upsample
    exports it, and bilinear without align_corners), a skip joined by Concat."""
    init = {"d.w": f32(4, 2, 3, 3), "d.b": f32(4), "u.w": f32(4, 3, 4, 4), "u.b": f32(3),
            "scales": np.asarray([1, 1, 2, 2], np.float32), "o.w": f32(2, 9, 1, 1)}  # fmt: skip
    roi = [""] if opset >= 13 else ["roi"]
    if opset < 13:
        init["roi"] = np.zeros(0, np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "d.w", "d.b"], ["d"], name="/down/Conv", kernel_shape=[3, 3], pads=[1] * 4,
                         strides=[2, 2]),
        helper.make_node("Relu", ["d"], ["dr"], name="/down/Relu"),
        helper.make_node("ConvTranspose", ["dr", "u.w", "u.b"], ["u"], name="/up/ConvTranspose", kernel_shape=[4, 4],
                         strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Resize", ["dr", *roi, "scales"], ["rn"], name="/near/Resize", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Resize", ["dr", *roi, "scales"], ["rl"], name="/lin/Resize", mode="linear",
                         coordinate_transformation_mode="pytorch_half_pixel"),
        helper.make_node("Add", ["rn", "rl"], ["r"], name="/Add"),
        helper.make_node("Concat", ["u", "x", "r"], ["cat"], name="/Concat", axis=1),
        helper.make_node("Conv", ["cat", "o.w"], ["y"], name="/out/Conv", kernel_shape=[1, 1]),
    ]  # fmt: skip
    return graph(nodes, [("x", ["N", 2, 8, 8])], ("y", ["N", 2, 8, 8]), init, opset)


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_a_unet_with_conv_transpose_and_resize_imports(tmp_path: Path, opset: int) -> None:
    text = import_and_compare(tmp_path, unet_like(opset), {"x": f32(2, 2, 8, 8, scale=1.0)}, loss=False)
    assert "conv_transpose(3, kernel=4, stride=2, pad=1)" in text
    assert 'upsample(dr, 2, mode="nearest")' in text and 'upsample(dr, 2, mode="bilinear")' in text


def test_two_inputs_import(tmp_path: Path) -> None:
    init = {"c.w": f32(3, 2, 3, 3), "m.w": f32(4, 5), "m.b": f32(4), "h.w": f32(2, 7), "h.b": f32(2)}
    nodes = [
        helper.make_node("Conv", ["image", "c.w"], ["c"], name="/c/Conv", kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("GlobalAveragePool", ["c"], ["p"], name="/pool/GlobalAveragePool"),
        helper.make_node("Flatten", ["p"], ["f"], name="/Flatten"),
        helper.make_node("Gemm", ["meta", "m.w", "m.b"], ["m"], name="/m/Gemm", transB=1),
        helper.make_node("Concat", ["f", "m"], ["cat"], name="/Concat", axis=1),
        helper.make_node("Gemm", ["cat", "h.w", "h.b"], ["y"], name="/h/Gemm", transB=1),
    ]
    model = graph(nodes, [("image", ["N", 2, 6, 6]), ("meta", ["N", 5])], ("y", ["N", 2]), init)
    text = import_and_compare(tmp_path, model, {"image": f32(3, 2, 6, 6), "meta": f32(3, 5)})
    assert "input image : [N, 2, 6, 6]" in text and "input meta : [N, 5]" in text


def test_a_class_token_concatenated_is_a_parameter(tmp_path: Path) -> None:
    """torchvision's ViT: the class token [1, 1, D] expanded to the batch (by a shape the exporter computes), put
    before the tokens: a tensor function with the token as its one trainable parameter."""
    init = {"cls": f32(1, 1, 4), "shape": np.asarray([-1, 1, 1], np.int64), "minus": np.asarray([-1], np.int64),
            "pos": f32(1, 4, 4), "fc.w": f32(2, 4), "fc.b": f32(2), "zero": np.asarray(0, np.int64)}  # fmt: skip
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"], name="/Shape"),
        helper.make_node("Gather", ["sh", "zero"], ["n0"], name="/Gather_n", axis=0),
        helper.make_node("Unsqueeze", ["n0", "minus"], ["n1"], name="/Unsqueeze"),
        helper.make_node("Abs", ["minus"], ["one"], name="/Abs"),
        helper.make_node("Concat", ["n1", "one", "one"], ["target"], name="/Concat_shape", axis=0),
        helper.make_node("Expand", ["cls", "target"], ["tok"], name="/Expand"),
        helper.make_node("Concat", ["tok", "x"], ["t"], name="/Concat", axis=1),
        helper.make_node("Add", ["t", "pos"], ["tp"], name="/Add"),
        helper.make_node("Gather", ["tp", "zero"], ["c"], name="/Gather", axis=1),
        helper.make_node("Gemm", ["c", "fc.w", "fc.b"], ["y"], name="/fc/Gemm", transB=1),
    ]
    model = graph(nodes, [("x", ["N", 3, 4])], ("y", ["N", 2]), init)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 4, scale=1.0)})
    onnx.save(model, tmp_path / "m.onnx")
    arrays = import_model(tmp_path / "m.onnx", 2).arrays
    assert arrays["Concat.k0"].shape == (1, 1, 4)  # one token, not one per sample
    assert "param k0[1, 1, 4]" in text


# ---- the text each rule for the mobile and transformer built-ins writes, and the import against ONNX Runtime ----


def one(op: str, attrs: dict | None = None, inits: dict | None = None, shape: tuple = (2, 4, 6, 6),
        extra: list | None = None, opset: int = 17, rank: int | None = None) -> object:  # fmt: skip
    """`y = op(x, *extra)` on an input of `shape`, y of `rank` (the input's) symbolic sizes."""
    outs = ["y"] if op != "Split" else ["first", "y"]  # a Split's second part is the output
    node = helper.make_node(op, ["x", *(extra or [])], outs, name=f"/m/{op}", **(attrs or {}))
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *shape[1:]])]
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{k}" for k in range(rank or len(shape))])
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()]
    m = helper.make_model(helper.make_graph([node], "torch_jit", ins, [y], init),
                          opset_imports=[helper.make_opsetid("", opset)])  # fmt: skip
    m.ir_version = 8
    return m


W3 = f32(4, 4, 3, 3)
TEXT_CASES = {
    "relu6": (one("Clip", inits={"lo": np.float32(0), "hi": np.float32(6)}, extra=["lo", "hi"]), "relu6(x)", ["relu6"]),
    "clip": (
        one("Clip", inits={"lo": np.float32(-1), "hi": np.float32(1.5)}, extra=["lo", "hi"]),
        "clip(x, -1.0, 1.5)",
        ["clip"],
    ),
    "hard_swish": (one("HardSwish", opset=14), "hard_swish(x)", ["hard_swish"]),
    "hard_sigmoid": (one("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}), "hard_sigmoid(x)", ["hard_sigmoid"]),
    "hard_sigmoid_onnx": (one("HardSigmoid"), "hard_sigmoid(x, alpha=0.2)", ["hard_sigmoid"]),
    "mean_c": (one("ReduceMean", {"axes": [1], "keepdims": 0}, rank=3), "mean(x, axis=1, keepdim=false)", ["mean"]),
    "mean_hw_keep": (one("ReduceMean", {"axes": [-1]}, shape=(2, 4, 6)), "mean(x, axis=2, keepdim=true)", ["mean"]),
    "slice": (
        one(
            "Slice",
            inits={"s": np.asarray([1], np.int64), "e": np.asarray([-1], np.int64), "a": np.asarray([3], np.int64)},
            extra=["s", "e", "a"],
        ),
        "slice(x, 1, 5, axis=3)",
        ["slice"],
    ),  # fmt: skip
    "split": (
        one("Split", {"axis": 1}, inits={"sizes": np.asarray([1, 3], np.int64)}, extra=["sizes"]),
        "slice(x, 1, 4, axis=1)",
        ["slice"],
    ),
    "dilation": (
        one("Conv", {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 2, 2, 2]}, {"w": W3}, extra=["w"]),
        "conv(4, kernel=3, pad=2, dilation=2, bias=false)",
        [],
    ),  # fmt: skip
    "asymmetric_pad": (
        one("Conv", {"kernel_shape": [3, 3], "pads": [0, 0, 1, 1], "strides": [2, 2]}, {"w": W3}, extra=["w"]),
        "conv(4, kernel=3, stride=2, pad=(0, 0, 1, 1), bias=false)",
        [],
    ),
    "ceil_mode": (
        one("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, shape=(2, 4, 7, 7)),
        "max_pool(x, 2, ceil_mode=true)",
        [],
    ),
    "expand": (
        one("Expand", inits={"s": np.asarray([2, 4, 6, 6], np.int64)}, shape=(2, 4, 1, 1), extra=["s"]),
        "expand(x, (N, 4, 6, 6))",
        ["expand"],
    ),
    # padding at the end beyond the start's: ceil mode's last window where it is ONNX's (TensorFlow's SAME, a 1-D
    # pool in ceil mode as deepdsl exports it, end pads past half the window), else the pads as (t, l, b, r)
    "same_upper_pool": (
        one("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, shape=(2, 4, 8, 8)),
        "max_pool(x, 3, stride=2, ceil_mode=true)",
        [],
    ),
    "end_pads_pool": (
        one("MaxPool", {"kernel_shape": [1, 3], "strides": [1, 2], "pads": [0, 0, 0, 1]}, shape=(2, 4, 1, 10)),
        "max_pool(x, (1, 3), stride=(1, 2), ceil_mode=true)",
        [],
    ),
    "end_pads_past_half_the_window": (
        one("MaxPool", {"kernel_shape": [5, 5], "strides": [2, 2], "pads": [1, 1, 3, 3]}, shape=(2, 4, 8, 8)),
        "max_pool(x, 5, stride=2, pad=1, ceil_mode=true)",
        [],
    ),
    "same_lower_pool": (  # the padding at the end: none of its windows reads it
        one("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}, shape=(2, 4, 8, 8)),
        "max_pool(x, 3, stride=2, pad=1)",
        [],
    ),
    "same_upper_pool_4": (  # k=4, stride 1: ceil mode gives 5 of 6; the pads as they are
        one("MaxPool", {"kernel_shape": [4, 4], "auto_pad": "SAME_UPPER"}, shape=(2, 4, 6, 6)),
        "max_pool(x, 4, stride=1, pad=(1, 1, 2, 2))",
        [],
    ),
    "same_upper_avg_exclude_pad": (  # TensorFlow's SAME average: ceil mode divides by the elements too
        one("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, shape=(2, 4, 8, 8)),
        "avg_pool(x, 3, stride=2, ceil_mode=true)",
        [],
    ),
    "end_pads_avg_counted": (  # ceil mode would divide the last window by 2, ONNX by 3: the pads as they are
        one(
            "AveragePool",
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1], "count_include_pad": 1},
            shape=(2, 4, 8, 8),
        ),
        "avg_pool(x, 3, stride=2, pad=(0, 0, 1, 1))",
        [],
    ),  # fmt: skip
}


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_the_text_each_rule_writes(tmp_path: Path, case: str) -> None:
    model, want, _ = TEXT_CASES[case]
    text = text_of(tmp_path, model, batch=2)
    assert want in text, text


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_each_rule_imports_and_equals_ort(tmp_path: Path, case: str) -> None:
    model, _, _ = TEXT_CASES[case]
    shape = [d.dim_value or 2 for d in model.graph.input[0].type.tensor_type.shape.dim]
    import_and_compare(tmp_path, model, {"x": f32(*shape, scale=3.0)}, loss=False)


POOLS_REFUSED = {
    "end_pads_past_half_the_window": (
        one("MaxPool", {"kernel_shape": [3, 3], "pads": [0, 0, 2, 2]}, shape=(2, 4, 6, 6)),
        r"pads \[0, 0, 2, 2\], kernel \[3, 3\], strides \[1, 1\]: no max_pool of the language reads the same windows "
        r"\(no padding, either ceil_mode: 4 outputs along H, not ONNX's 6; pad=\(0, 0, 2, 2\), either ceil_mode: "
        r"max_pool: padding 2 is more than half the window 3\)",
    ),
    "avg_end_pads_counted_past_half": (  # ceil mode's last window: 2 values; ONNX counts the padding: 3
        one("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 2, 2], "count_include_pad": 1},
            shape=(2, 4, 8, 8)),
        r"no avg_pool of the language reads the same windows \(no padding: 3 outputs along H, not ONNX's 4; "
        r"no padding, ceil_mode=true: output 3 along H averages over 2 values, ONNX's over 3; "
        r"pad=\(0, 0, 2, 2\), either ceil_mode: avg_pool: padding 2 is more than half the window 3\)",
    ),
    "avg_exclude_pad_at_the_start": (
        one("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}, shape=(2, 4, 8, 8)),
        r"count_include_pad=0 with padding \[1, 1, 0, 0\]: the language's avg_pool counts the padding at the start",
    ),
    "window_past_the_input": (
        one("MaxPool", {"kernel_shape": [2, 1], "strides": [3, 3], "ceil_mode": 1}, shape=(2, 4, 3, 4)),
        r"ceil_mode=1: output 1 along H is a window past the input \(padding alone\); the language's pools have none",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(POOLS_REFUSED))
def test_a_pool_the_language_cannot_say_is_refused_with_why(tmp_path: Path, case: str) -> None:
    """Each form tried (the start's padding on both sides, ONNX's pads; floor and ceil mode) and why it differs."""
    model, message = POOLS_REFUSED[case]
    with pytest.raises(
        DslError, match=r"node '/m/(Max|Average)Pool' \((Max|Average)Pool, opset 17\): " + ".*" + message
    ):
        text_of(tmp_path, model)


def test_silu_and_a_gate_broadcast(tmp_path: Path) -> None:
    """x * sigmoid(x) is silu; an SE block's [N, C, 1, 1] gate times [N, C, H, W] expands the gate."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="/act/Sigmoid"),
             helper.make_node("Mul", ["x", "s"], ["a"], name="/act/Mul"),
             helper.make_node("GlobalAveragePool", ["a"], ["g"], name="/se/GlobalAveragePool"),
             helper.make_node("Mul", ["a", "g"], ["y"], name="/se/Mul")]  # fmt: skip
    model = graph(nodes, [("x", ["N", 3, 4, 4])], ("y", ["N", 3, 4, 4]))
    text = text_of(tmp_path, model)
    assert "a = silu(x)" in text and "a * expand(g, (N, 3, 4, 4))" in text, text


def test_a_constant_that_grows_an_axis_of_size_one(tmp_path: Path) -> None:
    """Mul of [N, 2, 1, 4] by a constant [1, 1, 3, 4] (rows of a pooling matrix against a column): a tensor function
    whose result is [N, 2, 3, 4], reading the input's one position along the grown axis; ONNX Runtime's output.
    The batch axis never grows (tests/test_onnx.py's refusals)."""
    node = helper.make_node("Mul", ["x", "k"], ["y"], name="/pool/Mul")
    model = graph([node], [("x", ["N", 2, 1, 4])], ("y", ["N", 2, 3, 4]), {"k": f32(1, 1, 3, 4)})
    text = import_and_compare(tmp_path, model, {"x": f32(2, 2, 1, 4)}, loss=False)
    assert "return t[i0, i1, 0, i3] * k[0, 0, i2, i3]" in text, text


# ---- round trip: every network in networks/ exported, imported again: the same parameters and outputs ----


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("net", [pytest.param(n, marks=pytest.mark.slow) if n in BIG else n for n in ALL_NETWORKS])
def test_every_network_round_trips(tmp_path: Path, net: str, opset: int) -> None:
    program = api.compile_file(str(ROOT / "networks" / f"{net}.ddsl"), SIZES.get(net, {})).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays, opset)
    onnx.save(model, tmp_path / "m.onnx")
    feeds = feeds_for(program, np.random.default_rng(2))
    got = import_model(tmp_path / "m.onnx", next(iter(feeds.values())).shape[0])
    again = api.compile_source(got.text, "again.ddsl").program
    assert again.graph.parameter_count == program.graph.parameter_count
    ours = {d.value.name: v for d, v in zip(infer_program(again.graph).inputs, feeds.values())}
    close(run_deepdsl(again, got.arrays, ours), run_deepdsl(program, arrays, feeds))
    if net == "gpt_tiny":  # token ids, the embedding, the causal mask as the language writes them
        assert "int vocab 65" in got.text and "embedding(65, 64)" in got.text and "i3 <= i2 ?" in got.text
    if net == "vit_tiny":  # the class token and the position embedding: parameters again
        assert "layer_norm(" in got.text and "matmul(" in got.text and "softmax(" in got.text


EXAMPLE_OPS = {"audio_1d": {"MaxPool"}, "axis_ops": {"ReduceSum", "ReduceMax"}, "siamese": {"Abs"}, "vae": {"Exp"},
               "groupnorm_swish": {"Transpose", "InstanceNormalization"},
               "transformer_classifier": {"Transpose"}}  # fmt: skip


@pytest.mark.parametrize("net", list(EXAMPLE_OPS))
def test_example_networks_round_trip(tmp_path: Path, net: str) -> None:
    """Examples whose exports hold a MaxPool padded at the end only (audio_1d: a 1-D pool in ceil mode, imported in
    ceil mode again), ReduceSum and ReduceMax (axis_ops), Abs and one encoder's weights read by both images' nodes
    (siamese: one layer again, called twice), Exp (vae: the sampling's inference mean, exp(log_var / 2) beside it),
    a tensor function reading its input's axes in another order (transformer_classifier's mean over positions,
    groupnorm_swish's adaptive pooling: a Transpose, not a Gather by positions), group norms (groupnorm_swish: as
    PyTorch writes them) and a pooling matrix broadcast against a column (groupnorm_swish): imported again, the
    same outputs, and the same parameter count but where a constant becomes a parameter (groupnorm_swish's two
    [3, 7] pooling matrices, as every constant a Mul broadcasts is)."""
    program = api.compile_file(str(ROOT / "networks" / "examples" / f"{net}.ddsl"), {"N": 2}).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays, 17)
    ops = {nd.op_type for nd in model.graph.node}
    assert EXAMPLE_OPS[net] <= ops
    computed = {nd.output[0] for nd in model.graph.node} | {i.name for i in model.graph.input}
    assert not [nd.name for nd in model.graph.node if nd.op_type == "Gather" and nd.input[0] in computed]
    onnx.save(model, tmp_path / "m.onnx")
    feeds = feeds_for(program, np.random.default_rng(2))
    got = import_model(tmp_path / "m.onnx", 2)
    again = api.compile_source(got.text, "again.ddsl").program
    extra = 2 * 21 if net == "groupnorm_swish" else 0
    assert again.graph.parameter_count == program.graph.parameter_count + extra
    assert sum(a.size for a in got.arrays.values()) == sum(a.size for a in arrays.values()) + extra
    ours = {d.value.name: v for d, v in zip(infer_program(again.graph).inputs, feeds.values())}
    close(run_deepdsl(again, got.arrays, ours), run_deepdsl(program, arrays, feeds))
    if net == "audio_1d":  # max_pool1d(..., 3, stride=2, ceil_mode=true), exported as pads [0, 0, 0, 1]
        pool = next(nd for nd in model.graph.node if nd.op_type == "MaxPool")
        assert list(next(a for a in pool.attribute if a.name == "pads").ints) == [0, 0, 0, 1]
        assert "max_pool(h_7, (1, 3), stride=(1, 2), ceil_mode=true)" in got.text, got.text
    if net == "siamese":  # the encoder's three layers, each called for the left and the right image
        assert got.text.count("layer encoder_cv1 = conv(16, kernel=5)") == 1 and "encoder_cv1_2" not in got.text
        assert "encoder_cv1(left)" in got.text and "encoder_cv1(right)" in got.text
        assert sorted(got.arrays) == sorted(k.replace("encoder.", "encoder_") for k in arrays)


GEMMS = {  # the second Gemm's weight, bias and attributes; the first reads fc.w and fc.b
    "shared": (("fc.w", "fc.b"), {}, 1),
    "other_bias": (("fc.w", "fc.b2"), {}, 2),  # equal values under another name: two parameters in the model
    "other_alpha": (("fc.w", "fc.b"), {"alpha": 0.5}, 2),  # the same initialisers, another weight
}


@pytest.mark.parametrize("case", list(GEMMS))
def test_one_weight_read_by_two_nodes_is_one_layer_called_twice(cli, tmp_path: Path, case: str) -> None:
    """Two Gemm nodes reading the very same initialisers for weight and bias (a module applied twice, as PyTorch
    exports it): one `layer` line, called for each input, its parameters stored once, and the program trains. A
    share of some parameters only, or of all with other attributes: a layer each."""
    (w, b), attrs, layers = GEMMS[case]
    init = {"fc.w": f32(3, 4), "fc.b": f32(3), "head.w": f32(2, 3), "head.b": f32(2)}
    init["fc.b2"] = init["fc.b"].copy()
    nodes = [
        helper.make_node("Gemm", ["a", "fc.w", "fc.b"], ["ha"], name="/fc/Gemm", transB=1),
        helper.make_node("Gemm", ["b", w, b], ["hb"], name="/fc/Gemm_1", transB=1, **attrs),
        helper.make_node("Sub", ["ha", "hb"], ["d"], name="/Sub"),
        helper.make_node("Gemm", ["d", "head.w", "head.b"], ["y"], name="/head/Gemm", transB=1),
    ]
    model = graph(nodes, [("a", ["N", 4]), ("b", ["N", 4])], ("y", ["N", 2]), init)
    text = import_and_compare(tmp_path, model, {"a": f32(2, 4, scale=1.0), "b": f32(2, 4, scale=1.0)})
    assert text.count("= full(3)") == layers, text
    assert ("fc(a)" in text and "fc(b)" in text) == (layers == 1), text
    assert ("layer fc = full(3)   # one set of weights for 2 nodes" in text) == (layers == 1), text
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"), "--batch", "4")
    assert r.exit_code == 0, r.output
    assert ("note: one set of weights for several nodes, as the model reads one initialiser there: fc (2 nodes)"
            in r.output) == (layers == 1), r.output  # fmt: skip
    stored = set(np.load(tmp_path / "n.npz"))
    assert stored == {"fc.W", "fc.b", "head.W", "head.b"} | ({"fc_2.W", "fc_2.b"} if layers == 2 else set())
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "copies.ddsl"), "--no-share")
    assert r.exit_code == 0 and "note:" not in r.output, r.output
    assert set(np.load(tmp_path / "copies.npz")) == {"fc.W", "fc.b", "fc_2.W", "fc_2.b", "head.W", "head.b"}
    r = cli("run", str(tmp_path / "n.ddsl"), "--load", str(tmp_path / "n.npz"), "--iters", "2", "--device", "cpu",
            "--data", "synthetic", "--save", str(tmp_path / "s.npz"))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert not np.array_equal(np.load(tmp_path / "s.npz")["fc.W"], np.load(tmp_path / "n.npz")["fc.W"])  # trained


def test_untrained_layers_merged_by_the_exporter_stay_apart(tmp_path: Path) -> None:
    """PyTorch's exporters merge initialisers of equal values: two freshly initialised layer norms then read one
    scale of ones and one shift of zeros (and zero biases one zero vector). Such constants say nothing of the
    model's modules: a layer each, not one tied layer; a parameterless node never counts as shared."""
    init = {"ones": np.ones(4, np.float32), "zeros": np.zeros(4, np.float32)}
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ones", "zeros"], ["a"], name="/ln1/LayerNormalization"),
        helper.make_node("Relu", ["a"], ["r"], name="/Relu"),
        helper.make_node("LayerNormalization", ["r", "ones", "zeros"], ["y"], name="/ln2/LayerNormalization"),
    ]
    model = graph(nodes, [("x", ["N", 4])], ("y", ["N", 4]), init)  # fmt: skip
    text = import_and_compare(tmp_path, model, {"x": f32(2, 4, scale=2.0)}, loss=False)
    assert text.count("= layer_norm()") == 2 and "one set of weights" not in text, text


def test_a_weight_folded_for_each_use_is_still_one_layer(tmp_path: Path) -> None:
    """An exporter may write the computation of a weight once for each use (a Reshape by a shape of its own name, a
    Transpose: MatMul by Wᵀ, then Add): the import follows the folded nodes back to the one initialiser."""
    init = {"w": f32(12), "fc.b": f32(3), "s1": np.asarray([3, 4], np.int64), "s2": np.asarray([3, 4], np.int64),
            "head.w": f32(2, 3), "head.b": f32(2)}  # fmt: skip
    nodes = []
    for side, shape, k in (("a", "s1", ""), ("b", "s2", "_1")):  # PyTorch's names: /fc/MatMul, /fc/MatMul_1
        nodes += [helper.make_node("Reshape", ["w", shape], [f"w_{side}"], name=f"/fc/Reshape{k}"),
                  helper.make_node("Transpose", [f"w_{side}"], [f"wt_{side}"], name=f"/fc/Transpose{k}", perm=[1, 0]),
                  helper.make_node("MatMul", [side, f"wt_{side}"], [f"m_{side}"], name=f"/fc/MatMul{k}"),
                  helper.make_node("Add", [f"m_{side}", "fc.b"], [f"h_{side}"], name=f"/fc/Add{k}")]  # fmt: skip
    nodes += [helper.make_node("Sub", ["h_a", "h_b"], ["d"], name="/Sub"),
              helper.make_node("Gemm", ["d", "head.w", "head.b"], ["y"], name="/head/Gemm", transB=1)]  # fmt: skip
    model = graph(nodes, [("a", ["N", 4]), ("b", ["N", 4])], ("y", ["N", 2]), init)
    text = import_and_compare(tmp_path, model, {"a": f32(2, 4, scale=1.0), "b": f32(2, 4, scale=1.0)})
    assert text.count("= full(3)") == 1 and "fc(a)" in text and "fc(b)" in text, text


# ---- external data as PyTorch's dynamo exporter writes it ----


def test_external_data_as_dynamo_writes_it_loads_from_the_models_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.onnx.export(dynamo=True) keeps each large initialiser in `m.onnx.data` beside `m.onnx` (location,
    offset, length; small ones inline): the import reads it from the model's folder whatever the working directory,
    and never from the working directory."""
    nodes = [helper.make_node("Conv", ["x", "c.w", "c.b"], ["c"], name="/c/Conv", kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c"], ["r"], name="/Relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="/Flatten"),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], name="/fc/Gemm", transB=1)]  # fmt: skip
    model = graph(nodes, [("x", ["N", 3, 8, 8])], ("y", ["N", 5]),
                  {"c.w": f32(4, 3, 3, 3), "c.b": f32(4), "fc.w": f32(5, 144), "fc.b": f32(5)})  # fmt: skip
    folder = tmp_path / "model"
    folder.mkdir()
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # onnx moves the data out of the model it saves
    onnx.save_model(saved, folder / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.onnx.data", size_threshold=256)  # fmt: skip
    stored = onnx.load(folder / "m.onnx", load_external_data=False)
    external = {t.name: {e.key: e.value for e in t.external_data} for t in stored.graph.initializer if t.external_data}
    assert external["fc.w"]["location"] == "m.onnx.data" and "offset" in external["fc.w"] and "c.b" not in external
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    x = f32(2, 3, 8, 8, scale=1.0)
    got = import_model(folder / "m.onnx", 2)
    program = api.compile_source(got.text, "m.ddsl").program
    close(run_deepdsl(program, got.arrays, {"x": x}), ort_feeds(model, {"x": x}))
    np.testing.assert_array_equal(got.arrays["fc.W"], numpy_helper.to_array(model.graph.initializer[2]))
    # the model alone in another folder, its data file in the working directory: not read from there
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "m.onnx").write_bytes((folder / "m.onnx").read_bytes())
    (elsewhere / "m.onnx.data").write_bytes((folder / "m.onnx.data").read_bytes())
    with pytest.raises(DslError, match="m.onnx.data"):
        import_model(alone / "m.onnx", 2)


UP_DOWN = """network UpDown

const N = 2
input x : [N, 3, 8, 8]
input t : [N, 2, 8, 8]

def net(x) {
  d = relu(conv(x, 4, kernel=3, stride=2, pad=1, name="down"))
  u = conv_transpose(d, 4, kernel=4, stride=2, pad=1, name="up")
  n = upsample(d, 2, mode="nearest")
  b = upsample(d, 2, mode="bilinear") + n + upsample(d, 2, mode="bilinear", align_corners=true)
  return conv(concat(u, b), 2, kernel=1, name="out")
}

layer model = net
loss = mse(model(x), t)
predict = model(x)
"""


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_conv_transpose_and_upsample_export_and_round_trip(tmp_path: Path, opset: int) -> None:
    program = api.compile_source(UP_DOWN, "updown.ddsl").program
    arrays = {k: v + np.float32(0.1) for k, v in initial_arrays(program).items()}  # biases not all zero
    model = export_graph(infer_program(program.graph), arrays, opset)
    ops = [nd.op_type for nd in model.graph.node]
    assert "ConvTranspose" in ops and ops.count("Resize") == 6
    feeds = {"x": f32(2, 3, 8, 8, scale=1.0)}
    want = run_deepdsl(program, arrays, feeds)
    close(run_ort(model, feeds), want)
    onnx.save(model, tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", 2, loss=False)
    assert "upsample(" in got.text and "conv_transpose(4, kernel=4, stride=2, pad=1)" in got.text
    assert 'mode="bilinear", align_corners=true)' in got.text, got.text
    again = api.compile_source(got.text, "again.ddsl").program
    assert again.graph.parameter_count == program.graph.parameter_count
    close(run_deepdsl(again, got.arrays, feeds), want)


# ---- tensor functions with reductions: the body over the grid grown by the reduced indices, then Reduce* ----

REDUCTIONS = """network Reductions
const N = 2
input x : [N, 4, 5]
input t : [N, 3]
tensor gram(x[B, C, P]) -> [b, i, j] = sum[p] x[b, i, p] * x[b, j, p]
tensor row_norm(x[B, C, P]) -> [b, c, p] {
  param g[P] = constant(1.5)
  mu[b, c] = sum[q] x[b, c, q] / P
  var[b, c] = sum[q] (x[b, c, q] - mu[b, c]) ^ 2 / P
  return g[p] * (x[b, c, p] - mu[b, c]) / sqrt(var[b, c] + 1e-5)
}
tensor peak(x[B, C, P]) -> [b, c] = max[p] x[b, c, p] + sum[k: 3] (k + 1) * x[b, c, k]
tensor shifted(x[B, C, P]) -> [b, p: P] = sum[c, q: 2] x[b, c, p - q]
tensor constant_sum(x[B, C, P]) -> [b, c] = x[b, c, 0] * sum[k: 4] k
f = full(concat(flatten(gram(x)), flatten(row_norm(x)), peak(x), shifted(x), constant_sum(x)), 3)
loss = mse(f, t)
predict = f
"""


@pytest.mark.parametrize("opset", [13, 17, 18])
def test_tensor_functions_with_reductions_export(opset: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    program = api.compile_source(REDUCTIONS, "reductions.ddsl").program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays, opset=opset)
    ops = {n.op_type for n in model.graph.node}
    assert {"ReduceSum", "ReduceMax"} <= ops, ops
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 5)).astype(np.float32)
    feeds = {"x": x, "t": np.zeros((2, 3), np.float32)}
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})[0]
    b = api.build(program)
    want = run(b.infer, {d.value.name: feeds[d.value.name] for d in b.infer.inputs}, arrays).outputs["predict"]
    close(got, want)
