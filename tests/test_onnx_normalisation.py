"""Group and instance normalisation on import (and, last, a symbolic batch's multiples): PyTorch's nn.GroupNorm as
both its exporters decompose it (a Reshape into groups, InstanceNormalization, a Reshape back, a Mul and Add per
channel), deepdsl's own export of `group_norm` and `instance_norm` (the same form) and InstanceNormalization
nodes: each one `group_norm` or `instance_norm` layer, trainable where the model scales and shifts per channel,
equal to ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402
from test_onnx import close  # noqa: E402
from test_onnx_breadth import f32, feeds_for, graph, import_and_compare, ort_feeds, run_deepdsl  # noqa: E402

from deepdsl import api  # noqa: E402
from deepdsl.autodiff import infer_program  # noqa: E402
from deepdsl.backends.onnx_export import export_graph  # noqa: E402
from deepdsl.interop import initial_arrays  # noqa: E402
from deepdsl.onnx_import import import_model  # noqa: E402


def torch_group_norm(groups: int, c: int, scale: float = 1.0, eps: float = 1e-5) -> object:
    """nn.GroupNorm(groups, c) on [N, c, 3, 4] as the TorchScript exporter writes it: Reshape to [0, G, -1],
    InstanceNormalization with a scale of ones [G] (times `scale`) and zeros, Reshape to the input's Shape, Mul by
    the weight [c, 1, 1], Add the bias [c, 1, 1]; a ReLU after it."""
    init = {"grouped": np.asarray([0, groups, -1], np.int64), "ones": np.full(groups, scale, np.float32),
            "zeros": np.zeros(groups, np.float32), "w": 1 + f32(c, 1, 1), "b": f32(c, 1, 1)}  # fmt: skip
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["r"], name="/gn/Reshape"),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["i"], name="/gn/InstanceNormalization",
                              epsilon=eps),
             helper.make_node("Shape", ["x"], ["s"], name="/gn/Shape"),
             helper.make_node("Reshape", ["i", "s"], ["v"], name="/gn/Reshape_1"),
             helper.make_node("Mul", ["v", "w"], ["m"], name="/gn/Mul"),
             helper.make_node("Add", ["m", "b"], ["a"], name="/gn/Add"),
             helper.make_node("Relu", ["a"], ["y"], name="/act/Relu")]  # fmt: skip
    return graph(nodes, [("x", ["N", c, 3, 4])], ("y", ["N", c, 3, 4]), init, 13)


@pytest.mark.parametrize(
    ("groups", "layer"), [(2, "group_norm(2, eps=0.001)"), (4, "instance_norm(eps=0.001, affine=true)")]
)
def test_pytorch_group_norm_is_one_layer(tmp_path: Path, groups: int, layer: str) -> None:
    model = torch_group_norm(groups, 4, eps=1e-3)
    text = import_and_compare(tmp_path, model, {"x": f32(3, 4, 3, 4, scale=2.0)}, loss=False)
    assert f"layer gn = {layer}" in text and "y = relu(gn_out)" in text, text
    assert "Reshape" not in text and "reshape(" not in text, text


def test_a_scale_per_group_is_folded_into_the_channels(tmp_path: Path) -> None:
    """The normalisation's own scale (per group) times the weight per channel: one gamma."""
    text = import_and_compare(tmp_path, torch_group_norm(2, 4, scale=0.5), {"x": f32(2, 4, 3, 4)}, loss=False)
    assert "layer gn = group_norm(2)" in text, text


@pytest.mark.parametrize(("values", "names", "layer"), [
    ("ones", ("s", "b"), "instance_norm()"), ("random", ("s", "b"), "instance_norm(affine=true)"),
    ("ones", ("inorm.weight", "inorm.bias"), "instance_norm(affine=true)"),
    ("ones", ("up.weight", "up.bias"), "instance_norm()"),  # another module's, merged in by the exporter
])  # fmt: skip
def test_instance_normalization(tmp_path: Path, values: str, names: tuple, layer: str) -> None:
    """PyTorch's InstanceNorm2d without affine (its default) writes a scale of ones and zeros as constants of the
    exporter's (`val_3`, a Constant node): no parameters; a fresh affine=True one's ones and zeros are the module's
    own initialisers (`inorm.weight`): trained; another module's ones (an exporter merging equal initialisers gives
    them to a non-affine norm) are not."""
    scale, bias = (np.ones(3, np.float32), np.zeros(3, np.float32)) if values == "ones" else (f32(3), f32(3))
    node = helper.make_node("InstanceNormalization", ["x", *names], ["y"], name="/inorm/InstanceNormalization")
    model = graph([node], [("x", ["N", 3, 5, 5])], ("y", ["N", 3, 5, 5]), dict(zip(names, (scale, bias))))
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 5, 5, scale=3.0)}, loss=False)
    assert f"layer inorm = {layer}" in text, text


NORMS = """
network Norms
const N = 2
input x : [N, 4, 5, 6]
label y : [N] classes 3
layer gn = group_norm(2, eps=0.001)
layer inorm = instance_norm()
layer ia = instance_norm(affine=true)
layer rows = group_norm(4)
layer fc = full(3)
h = fc(relu(rows(flatten(ia(relu(inorm(gn(x))))))))
loss = softmax_cross_entropy(h, y)
predict = h
"""


@pytest.mark.parametrize("opset", [13, 17])
def test_deepdsl_exports_group_and_instance_norms_as_pytorch_does(tmp_path: Path, opset: int) -> None:
    """group_norm on [N, C, H, W] and on [N, D], instance_norm with and without a scale and shift: exported as
    PyTorch writes them (InstanceNormalization of the groups, no LayerNormalization), ONNX Runtime's outputs
    deepdsl's, and imported again the same layers, parameter count and outputs, trained parameters included."""
    program = api.compile_source(NORMS, "norms.ddsl").program
    rng = np.random.default_rng(5)
    arrays = {k: v + rng.standard_normal(v.shape).astype(np.float32) * 0.3 for k, v in initial_arrays(program).items()}
    model = export_graph(infer_program(program.graph), arrays, opset)
    ops = [nd.op_type for nd in model.graph.node]
    assert ops.count("InstanceNormalization") == 4 and "LayerNormalization" not in ops, ops
    feeds = feeds_for(program, rng)
    want = run_deepdsl(program, arrays, feeds)
    close(ort_feeds(model, {"x": feeds["x"]}), want)
    onnx.save(model, tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", 2)
    for layer in ("group_norm(2, eps=0.001)", "instance_norm()", "instance_norm(affine=true)", "group_norm(4)"):
        assert f"= {layer}\n" in got.text, got.text
    again = api.compile_source(got.text, "again.ddsl").program
    assert again.graph.parameter_count == program.graph.parameter_count
    ours = {d.value.name: v for d, v in zip(infer_program(again.graph).inputs, feeds.values())}
    close(run_deepdsl(again, got.arrays, ours), want)


def test_a_symbolic_batch_imported_at_one_keeps_its_multiples(tmp_path: Path) -> None:
    """A model whose batch is symbolic imports at N = 1, where a Reshape to [N·4, 8] and one to [4, 8] look alike:
    a second shape inference at another batch tells them apart, so the file says `N * 4` and runs at any N once its
    `const N` is edited (here 3, against ONNX Runtime at 3)."""
    init = {"rows": np.asarray([-1, 8], np.int64), "back": np.asarray([-1, 4, 5], np.int64), "w": f32(5, 8),
            "b": f32(5)}  # fmt: skip
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["r"], name="/Reshape"),
             helper.make_node("Gemm", ["r", "w", "b"], ["g"], name="/fc/Gemm", transB=1),
             helper.make_node("Reshape", ["g", "back"], ["y"], name="/Reshape_1")]  # fmt: skip
    model = graph(nodes, [("x", ["N", 4, 8])], ("y", ["N", 4, 5]), init)
    onnx.save(model, tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", None, False)
    assert "const N = 1" in got.text and "reshape(x, (N * 4, 8))" in got.text, got.text
    again = api.compile_source(got.text.replace("const N = 1", "const N = 3"), "again.ddsl").program
    x = f32(3, 4, 8)
    close(
        run_deepdsl(again, got.arrays, {"x": x, "target": np.zeros((3, 4, 5), np.float32)}), ort_feeds(model, {"x": x})
    )


def test_batch_norm_on_sequences(tmp_path: Path) -> None:
    """BatchNormalization on [N, C, L] (nn.BatchNorm1d over a sequence, where no convolution absorbs it)."""
    init = {"g": 1 + f32(3), "b": f32(3), "m": f32(3), "v": (0.5 + np.abs(f32(3))).astype(np.float32)}
    node = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], name="/bn/BatchNormalization")
    model = graph([node], [("x", ["N", 3, 7])], ("y", ["N", 3, 7]), init)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 3, 7, scale=2.0)}, loss=False)
    assert "layer bn = batch_norm()" in text, text


# ---- ONNX's GroupNormalization (the dynamo exporter's nn.GroupNorm from opset 21) ----


def group_normalization(opset: int, groups: int, c: int = 4, per: int | None = None, head: bool = False,
                        **attrs: int) -> object:  # fmt: skip
    """x [N, c, 3, 5] -> GroupNormalization(num_groups=groups) -> Relu (-> Flatten -> Gemm to 3 classes with
    `head`); scale and bias of `per` values (opset 18: one per group, 21: one per channel). Not checked by onnx's
    checker, which refuses opset 18's form as deprecated (ONNX Runtime runs it)."""
    from onnx import TensorProto

    per = per or (groups if opset < 21 else c)
    init = {"scale": 1 + f32(per), "bias": f32(per), "head.w": f32(3, c * 15), "head.b": f32(3)}
    nodes = [helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["g"], name="/gn/GroupNormalization",
                              num_groups=groups, epsilon=1e-3, **attrs),
             helper.make_node("Relu", ["g"], ["r" if head else "y"], name="/act/Relu")]  # fmt: skip
    if head:
        nodes += [helper.make_node("Flatten", ["r"], ["f"], name="/Flatten"),
                  helper.make_node("Gemm", ["f", "head.w", "head.b"], ["y"], name="/head/Gemm", transB=1)]  # fmt: skip
    else:
        init = {k: v for k, v in init.items() if not k.startswith("head")}
    g = helper.make_graph(nodes, "torch_jit", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3] if head else ["N", c, 3, 5])],
                          [onnx.numpy_helper.from_array(v, k) for k, v in init.items()])  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize(
    ("opset", "groups", "layer"),
    [(18, 2, "group_norm(2, eps=0.001)"), (21, 2, "group_norm(2, eps=0.001)"),
     (21, 4, "instance_norm(eps=0.001, affine=true)"), (21, 1, "group_norm(1, eps=0.001)")],
)  # fmt: skip
def test_group_normalization_is_a_group_norm(tmp_path: Path, opset: int, groups: int, layer: str) -> None:
    """The output's shape (which ONNX's shape inference does not give) is its input's; opset 18's scale per group
    and opset 21's per channel both ONNX Runtime's outputs."""
    model = group_normalization(opset, groups)
    text = import_and_compare(tmp_path, model, {"x": f32(2, 4, 3, 5, scale=2.0)}, loss=False)
    assert f"layer gn = {layer}" in text and "y = relu(gn_out)" in text, text


def test_group_normalization_trains_its_scale_and_bias(cli, tmp_path: Path) -> None:
    """Opset 18's per-group scale comes in repeated over each group's channels as gamma [C]; `deepdsl run` trains
    gamma and beta (each channel apart, as nn.GroupNorm does)."""
    model = group_normalization(18, 2, head=True)
    import_and_compare(tmp_path, model, {"x": f32(2, 4, 3, 5, scale=2.0)})
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "n.ddsl"), "--batch", "4")
    assert r.exit_code == 0, r.output
    before = np.load(tmp_path / "n.npz")
    scale = onnx.numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(before["gn.gamma"], np.repeat(scale, 2))
    r = cli("run", str(tmp_path / "n.ddsl"), "--load", str(tmp_path / "n.npz"), "--iters", "2", "--device", "cpu",
            "--data", "synthetic", "--save", str(tmp_path / "s.npz"))  # fmt: skip
    assert r.exit_code == 0, r.output
    after = np.load(tmp_path / "s.npz")
    for p in ("gn.gamma", "gn.beta"):
        assert not np.array_equal(after[p], before[p]), p


@pytest.mark.parametrize(
    ("opset", "groups", "per", "attrs", "why"),
    [(21, 3, None, {}, "num_groups=3 does not divide the 4 channels"),
     (21, 0, 4, {}, "num_groups=0 does not divide the 4 channels"),
     (21, 2, 2, {}, "scale and bias of 2 and 2 values: GroupNormalization takes one for each of the 4 channels"),
     (18, 2, 4, {}, "scale and bias of 4 and 4 values: .* each of the 2 groups"),
     (21, 2, None, {"stash_type": 10}, "stash_type=10: deepdsl computes the statistics in float32")],
    ids=["groups", "zero_groups", "per_group_at_21", "per_channel_at_18", "stash_type"],
)  # fmt: skip
def test_what_a_group_normalization_cannot_say_is_refused(tmp_path: Path, opset: int, groups: int,
                                                          per: int | None, attrs: dict, why: str) -> None:  # fmt: skip
    from test_onnx_breadth import text_of

    from deepdsl.errors import DslError

    with pytest.raises(DslError, match=f"'/gn/GroupNormalization' \\(GroupNormalization, opset {opset}\\): {why}"):
        text_of(tmp_path, group_normalization(opset, groups, per=per, **attrs))
