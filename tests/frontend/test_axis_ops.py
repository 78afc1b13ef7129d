"""The built-ins along axes (issue 34): `slice`, `chunk`, `sum`/`mean`/`max` along axes, `expand`, and a tensor
function's local tensors with declared index ranges. Their values against NumPy, their located errors, their
gradients, the fusion of `x * expand(s, ...)`, and their ONNX export."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op_gradient, compile_text, error_text

from deepdsl.backends.numpy_runner import run
from deepdsl.interop import initial_arrays

HEAD = "network T\ninput x : [2, 3, 4, 5]\ninput t : [2, 4]\n"
LOSS = "loss = mse(full(flatten(x), 4), t)\n"
RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)


def predict(expr: str, x: np.ndarray = X, head: str = HEAD) -> np.ndarray:
    """The value of `predict = expr` on input x, from the NumPy runner."""
    c = compile_text(head + LOSS + f"predict = {expr}\n")
    feeds = {"x": x, "t": np.zeros((2, 4), np.float32)}
    return run(c.program.graph, feeds, initial_arrays(c.program)).outputs["predict"]


@pytest.mark.parametrize(
    "expr, want",
    [
        ("slice(x, 1, 3)", lambda x: x[:, 1:3]),
        ("slice(x, 0, 2, axis=-1)", lambda x: x[..., 0:2]),
        ("slice(x, -3, -1, axis=2)", lambda x: x[:, :, -3:-1]),
        ("slice(x, 1, -1, axis=3)", lambda x: x[..., 1:-1]),
        ("slice(x, 0, 3)", lambda x: x),
        ("chunk(x, 1, 3)", lambda x: x[:, 1:2]),
        ("chunk(x, 1, 2, axis=2)", lambda x: x[:, :, 2:4]),
        ("sum(x)", lambda x: np.sum(x)),
        ("sum(x, axis=1)", lambda x: np.sum(x, axis=1)),
        ("sum(x, axis=(-1, 1), keepdim=true)", lambda x: np.sum(x, axis=(1, 3), keepdims=True)),
        ("sum(x, keepdim=true)", lambda x: np.sum(x, keepdims=True)),
        ("mean(x)", lambda x: np.mean(x)),
        ("mean(x, axis=(2, 3), keepdim=true)", lambda x: np.mean(x, axis=(2, 3), keepdims=True)),
        ("max(x)", lambda x: np.max(x)),
        ("max(x, axis=1)", lambda x: np.max(x, axis=1)),
        ("max(x, axis=(0, 2), keepdim=true)", lambda x: np.max(x, axis=(0, 2), keepdims=True)),
        ("expand(mean(x, axis=(2, 3), keepdim=true), (2, 3, 4, 5))",
         lambda x: np.broadcast_to(x.mean(axis=(2, 3), keepdims=True), x.shape)),
        ("x * expand(max(x, axis=1, keepdim=true), (-1, 3, -1, -1))", lambda x: x * x.max(axis=1, keepdims=True)),
        ("sum(x, axis=(0, 1, 2, 3))", lambda x: np.sum(x)),
    ],
)  # fmt: skip
def test_values_equal_numpys(expr: str, want) -> None:  # noqa: ANN001
    got = predict(expr)
    expected = want(X.astype(np.float64))
    assert got.shape == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_the_names_are_ordinary_outside_tensor_bodies_and_reductions_inside() -> None:
    text = HEAD + "tensor rowsum(x[B, D]) -> [b] = sum[d] max(x[b, d], 0)\n"
    got = predict("rowsum(reshape(x, (2, 60))) + sum(reshape(x, (2, 60)), axis=1)", head=text)
    np.testing.assert_allclose(got, np.maximum(X.reshape(2, 60), 0).sum(1) + X.reshape(2, 60).sum(1), rtol=1e-5)


def test_slice_and_sum_compose_as_functions() -> None:
    got = predict("(sum(axis=-1) o slice(1, 2))(x)")
    np.testing.assert_allclose(got, X[:, 1:2].sum(-1), rtol=1e-5)


@pytest.mark.parametrize(
    "expr, message",
    [
        ("slice(x, 2, 2)", "slice: 2:2 along axis 1 of [2, 3, 4, 5] is empty"),
        ("slice(x, 2, 1)", "slice: 2:1 along axis 1 of [2, 3, 4, 5] is empty"),
        ("slice(x, 0, 4)", "slice: end 4 is out of range for axis 1 of size 3"),
        ("slice(x, -4, 2)", "slice: start -4 is out of range for axis 1 of size 3"),
        ("slice(x, 0, 1, axis=4)", "slice: axis 4 is out of range"),
        ("slice(x, 0, 1, axis=-5)", "slice: axis -5 is out of range"),
        ("chunk(x, 0, 2)", "chunk: axis 1 of size 3 does not split into 2 equal parts"),
        ("chunk(x, 3, 3)", "chunk: part 3 of 3 does not exist (parts count from 0)"),
        ("chunk(x, 0, 0)", "argument 'parts' of chunk must be at least 1"),
        ("sum(x, axis=(1, -3))", "sum: axis 1 is given twice"),
        ("mean(x, axis=7)", "mean: axis 7 is out of range"),
        ("max(x, axis=(0, 1.5))", "argument 'axis' of max must be an integer or a tuple of integers"),
        ("sum(x, keepdim=1)", "argument 'keepdim' of sum must be true or false"),
        ("expand(x, (2, 3, 4))", "expand: f32[2,3,4,5] has 4 axes, the shape (2, 3, 4) has 3"),
        ("expand(x, (2, 6, 4, 5))", "expand: axis 1 of f32[2,3,4,5] has size 3, not 1, so it cannot grow to 6"),
        ("expand(x, (2, 0, 4, 5))", "expand: size 0 for axis 1; a size is at least 1, or -1 (keep it)"),
        ("expand(x, (2, -2, 4, 5))", "expand: size -2 for axis 1; a size is at least 1, or -1 (keep it)"),
        ("x * sum(x, axis=1, keepdim=true)", "`*` needs tensors of one shape, got f32[2,3,4,5] and f32[2,1,4,5]"),
    ],
)  # fmt: skip
def test_mistakes_are_located_errors(expr: str, message: str) -> None:
    out = error_text(HEAD + LOSS + f"predict = {expr}\n")
    assert message in out, out
    assert "t.ddsl:5:" in out and "Traceback" not in out


def test_an_integer_tensor_is_refused() -> None:
    text = "network T\ninput tok : [2, 3] int vocab 5\ninput t : [2, 4]\nloss = mse(full(sum(tok, axis=1), 4), t)\n"
    assert "sum expects float data" in error_text(text)


# ---- gradients (the ops' own cases are in tests/ops/test_grads.py CASES) ----


def test_max_shares_its_gradient_evenly_between_ties() -> None:
    from deepdsl.autodiff import gradients
    from deepdsl.ir import GraphBuilder, Init, ParamDef, TensorType, Value

    b = GraphBuilder("T")
    x = b.add_param(ParamDef(Value("x", TensorType((2, 3))), Init("constant", (0.0,))))
    loss = b.emit("sum", b.emit("max_axes", x, axes=(1,)))
    b.output("loss", loss)
    b.output("dx", gradients(b, loss, {"x"})["x"])
    values = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    got = run(b.build(), {}, {"x": values}, dtype=np.float64).outputs["dx"]
    np.testing.assert_allclose(got, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])


@pytest.mark.parametrize(
    "expr",
    ["sum(x, axis=(1, 3), keepdim=true)", "mean(x, axis=2)", "max(x, axis=(0, 3))", "max(x)", "slice(x, 1, -1, axis=3)",
     "chunk(x, 1, 2, axis=2)", "expand(sum(x, axis=1, keepdim=true), (2, 3, 4, 5)) * x", "mean(x)"],
)  # fmt: skip
def test_gradients_of_the_builtins_match_finite_differences(expr: str) -> None:
    # the statements the built-in emits, differentiated together against central differences
    c = compile_text(HEAD + LOSS + f"predict = {expr}\n")
    g = c.program.graph
    out = dict(g.outputs)["predict"]
    keep = _between(g, "x", out.name)

    def build(b, values):  # noqa: ANN001, ANN202
        env = {"x": values[0]}
        for s in keep:
            env[s.out.name] = b.emit(s.op, *(env[v.name] for v in s.inputs), **s.a)
        return env[out.name]

    check_op_gradient(expr, [RNG.standard_normal((2, 3, 4, 5))], {}, build=build)


def _between(g, source: str, target: str) -> list:  # noqa: ANN001
    """The statements from input `source` to value `target`, in order."""
    reach = {source}
    out = []
    for s in g.stmts:
        if any(v.name in reach for v in s.inputs):
            reach.add(s.out.name)
            out.append(s)
    need = {target}
    for s in reversed(out):
        if s.out.name in need:
            need |= {v.name for v in s.inputs}
    return [s for s in out if s.out.name in need]


# ---- fusion: explicit broadcasting costs no kernel of its own ----

SE = """network SE
input x : [2, 4, 3, 3]
label y : [2] classes 5
def se(x) {
  s = sigmoid(full(relu(full(sum(x, axis=(2, 3)), 2)), 4))
  return x * expand(reshape(s, (2, 4, 1, 1)), (2, 4, 3, 3))
}
loss = softmax_cross_entropy(full(flatten(se(x)), 5), y)
"""


def test_a_product_with_an_expanded_scale_is_one_kernel() -> None:
    from deepdsl import api
    from deepdsl.backends.cuda import translation

    c = api.compile_source(SE, "se.ddsl", stop_at="plan")
    assert "expand" not in [s.op for s in c.opt.stmts]
    # the product reads x and the [N, C, 1, 1] scale itself: one loop, no [N, C, H, W] copy of the scale
    product = next(s for s in c.opt.stmts if s.out.type.shape == (2, 4, 3, 3))
    assert product.op == "fused" and [v.type.shape for v in product.inputs] == [(2, 4, 3, 3), (2, 4, 1, 1)]
    prog = translation.program(c.plan)
    assert any(k.startswith("expand_mul__") for k in prog.kernels), prog.kernels
    assert not any(k.startswith("expand__") for k in prog.kernels), prog.kernels


# ---- a tensor function's local tensors may declare their index ranges ----

GROUPS = (
    HEAD
    + """
tensor group_mean(x[B, C, H, W]) -> [n, c, h, w] {
  mu[n, g: 3] = sum[k: 1, h, w] x[n, g + k, h, w] / (H * W)
  return x[n, c, h, w] - mu[n, c]
}
"""
)


def test_a_local_tensor_with_a_declared_range() -> None:
    got = predict("group_mean(x)", head=GROUPS)
    np.testing.assert_allclose(got, X - X.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "local, message, where",
    [
        ("mu[n, g] = sum[h, w] x[n, 0, h, w]", "cannot tell the range of index 'g'", "5:9"),
        ("mu[n, g: 2, g] = sum[h, w] x[n, g, h, w]", "index 'g' appears twice", "5:15"),
        ("mu[n, x: 2] = sum[h, w] x[n, 0, h, w]", "'x' names a tensor and cannot be an index", "5:9"),
        ("mu[n, g: 2] = sum[h, w] x[n, g, h, w]", "index 'c' ranges over 3 in x[...] but over 2 in mu[...]", "6:26"),
        ("mu[n, g: 0] = sum[h, w] x[n, g, h, w]", "an index range must be at least 1", "5:12"),
    ],
)  # fmt: skip
def test_a_local_tensors_ranges_are_checked(local: str, message: str, where: str) -> None:
    text = HEAD + "tensor f(x[B, C, H, W]) -> [n, c, h, w] {\n  " + local + "\n  return x[n, c, h, w] - mu[n, c]\n}\n"
    out = error_text(text + LOSS + "predict = f(x)\n")
    assert message in out and f"t.ddsl:{where}" in out, out


# ---- ONNX export ----


@pytest.mark.parametrize(
    "expr, nodes",
    [
        ("slice(x, 1, -1, axis=3)", {"Slice"}),
        ("sum(x, axis=(1, 3), keepdim=true)", {"ReduceSum"}),
        ("mean(x, axis=2)", {"ReduceSum", "Mul"}),
        ("max(x, axis=1)", {"ReduceMax"}),
        ("x * expand(max(x, axis=1, keepdim=true), (2, 3, 4, 5))", {"Expand", "ReduceMax"}),
        ("sum(x)", {"ReduceSum"}),
    ],
)
def test_export_to_onnx_and_run(tmp_path, expr: str, nodes: set) -> None:  # noqa: ANN001
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from deepdsl import api
    from deepdsl.autodiff import infer_program
    from deepdsl.backends.onnx_export import export_graph

    c = api.compile_source(HEAD + LOSS + f"predict = {expr}\n", "t.ddsl")
    g = infer_program(c.program.graph)
    arrays = {p.value.name: np.zeros(p.value.type.shape, np.float32) for p in g.params}
    model = export_graph(g, arrays)
    assert nodes <= {n.op_type for n in model.graph.node}, [n.op_type for n in model.graph.node]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": X})
    np.testing.assert_allclose(got, predict(expr), rtol=1e-5, atol=1e-6)


def test_a_group_norms_means_need_a_declared_range() -> None:
    # the range of g cannot be read off `x[n, g * 3 + k, h, w]` (not a plain access): it is declared
    head = (
        "network T\ninput x : [2, 6, 4, 5]\ninput t : [2, 4]\n"
        + """
tensor group_centre(x[B, C, H, W]) -> [n, c, h, w] {
  mu[n, g: 2] = sum[k: C / 2, h, w] x[n, g * (C / 2) + k, h, w] / (C / 2 * H * W)
  return x[n, c, h, w] - mu[n, c / (C / 2)]
}
"""
    )
    x = RNG.standard_normal((2, 6, 4, 5)).astype(np.float32)
    got = predict("group_centre(x)", x=x, head=head)
    groups = x.reshape(2, 2, 3, 4, 5)
    want = (groups - groups.mean(axis=(2, 3, 4), keepdims=True)).reshape(x.shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- the memory plan (memcheck's): the example network's step inside a poisoned arena ----


@pytest.mark.parametrize("remat", ["none", "cheap", "full"])
def test_the_example_runs_inside_its_poisoned_plan(remat: str) -> None:
    from helpers import ROOT, feeds_and_params

    from deepdsl import api
    from deepdsl.backends.numpy_runner import run_plan
    from deepdsl.memory import plan
    from deepdsl.memory.check import check_plan
    from deepdsl.memory.remat import rematerialise
    from deepdsl.memory.report import total_peak

    g = api.compile_file(ROOT / "networks" / "examples" / "axis_ops.ddsl", stop_at="opt").opt
    p = check_plan(plan(rematerialise(g, remat, small=0)))
    feeds, params = feeds_and_params(g, np.random.default_rng(0))
    plain = run(g, feeds, params)
    planned = run_plan(p, feeds, params, poison=True)
    assert (planned.peak_bytes, planned.arena_bytes) == (total_peak(p), p.arena_bytes)
    for k, v in plain.outputs.items():
        np.testing.assert_allclose(planned.outputs[k], v, rtol=1e-6)
    for k, v in plain.updates.items():
        np.testing.assert_allclose(planned.updates[k], v, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_reductions_export_at_each_opset(opset: int) -> None:
    # ReduceSum takes its axes as an input from opset 13, ReduceMax from 18: an attribute before
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from deepdsl import api
    from deepdsl.autodiff import infer_program
    from deepdsl.backends.onnx_export import export_graph

    expr = "sum(x, axis=(0, 2)) + max(x, axis=(0, 2))"
    c = api.compile_source(HEAD + LOSS + f"predict = {expr}\n", "t.ddsl")
    g = infer_program(c.program.graph)
    model = export_graph(g, {p.value.name: np.zeros(p.value.type.shape, np.float32) for p in g.params}, opset)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"x": X})
    np.testing.assert_allclose(got, predict(expr), rtol=1e-5, atol=1e-5)
