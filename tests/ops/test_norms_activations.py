"""Issue 34: the activations relu6, clip, hard_sigmoid, hard_swish and silu; group_norm, instance_norm, batch_norm on
[N, C, L]; `full` over the last axis of any rank; adaptive_avg_pool. Each built-in against an independent NumPy
formula of PyTorch's module (forward, in float64), its gradients (to the input and every parameter) against central
differences, the gradient at the activations' kinks against PyTorch's convention (torch 2.15: no middle piece at
the bounds; scripts/pytorch_norms.py compares with torch itself), and the located errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, compile_text, error_text

from deepdsl.autodiff import gradients, lower, replay
from deepdsl.backends.numpy_runner import run
from deepdsl.ir import GraphBuilder

RNG = np.random.default_rng(34)


def network(shape: tuple[int, ...], body: str, out: tuple[int, ...] | None = None) -> str:
    """A network with input x of `shape`, the layers and `h = ...` of `body`, loss mse(h, t), predict h."""
    dims = ", ".join(map(str, shape))
    target = ", ".join(map(str, out or shape))
    return f"network T\ninput x : [{dims}]\ninput t : [{target}]\n{body}\nloss = mse(h, t)\npredict = h\n"


def _program(text: str):  # noqa: ANN202
    """The training forward pass with `predict`, and the gradients of the loss to x and to every parameter."""
    g = lower(compile_text(text).program.graph, "train")
    b = GraphBuilder(g.name)
    for d in g.inputs:
        b.add_input(d)
    for p in g.params:
        b.add_param(p)
    vmap = replay(g, b)
    loss = vmap[g.output("loss").name]
    b.output("loss", loss)
    b.output("predict", vmap[g.output("predict").name])
    wrt = ["x", *(p.value.name for p in g.params if p.kind == "param")]
    grads = gradients(b, loss, set(wrt))
    for name in wrt:
        if name in grads:
            b.output(f"grad:{name}", grads[name])
    return b.build(), g


def _arrays(g, x: np.ndarray) -> tuple[dict, dict]:  # noqa: ANN001
    params = {}
    for p in g.params:
        shape = p.value.type.shape
        if p.kind == "param":
            params[p.value.name] = RNG.standard_normal(shape) * 0.5 + (1.0 if p.value.name.endswith("gamma") else 0)
        else:  # running statistics
            params[p.value.name] = np.ones(shape) if p.value.name.endswith("var") else np.zeros(shape)
    t = RNG.standard_normal(next(d.value.type.shape for d in g.inputs if d.value.name == "t"))
    return {"x": x, "t": t}, params


def forward(text: str, x: np.ndarray, params: dict | None = None) -> tuple[np.ndarray, dict]:
    prog, g = _program(text)
    feeds, drawn = _arrays(g, x)
    params = drawn if params is None else params
    return run(prog, feeds, params, dtype=np.float64).outputs["predict"], params


def check_gradients(text: str, x: np.ndarray, samples: int = 12, tol: float = 1e-6) -> None:
    """Every gradient of the network's loss (to x and to each parameter) against central differences, float64."""
    prog, g = _program(text)
    feeds, params = _arrays(g, x)
    out = run(prog, feeds, params, dtype=np.float64).outputs
    values = {"x": feeds["x"], **{k: v for k, v in params.items() if f"grad:{k}" in out}}
    assert "grad:x" in out and len(values) == len([k for k in out if k.startswith("grad:")])

    def loss(name: str, value: np.ndarray) -> float:
        f, p = dict(feeds), dict(params)
        (f if name == "x" else p)[name] = value
        return float(run(prog, f, p, dtype=np.float64).outputs["loss"])

    for name, value in values.items():
        flat = value.reshape(-1)
        for idx in RNG.choice(flat.size, size=min(samples, flat.size), replace=False):
            h = 1e-6
            shifted = []
            for sign in (1, -1):
                v = flat.copy()
                v[idx] += sign * h
                shifted.append(loss(name, v.reshape(value.shape)))
            numeric = (shifted[0] - shifted[1]) / (2 * h)
            got = out[f"grad:{name}"].reshape(-1)[idx]
            assert abs(got - numeric) <= tol * max(1.0, abs(numeric)), f"d{name}[{idx}]: {got} vs {numeric}"


# ---- activations ----

KINKS = np.array([-7.0, -3.0, -2.5, -0.5, 0.0, 0.5, 1.0, 2.5, 3.0, 5.5, 6.0, 8.0])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


# name, call, PyTorch's forward, PyTorch's slope (torch 2.15: at a bound, the outer piece)
ACTIVATIONS = {
    "relu6": ("relu6", lambda x: np.clip(x, 0, 6), lambda x: ((x > 0) & (x < 6)).astype(float)),
    "clip": ("clip(-0.5, 2.5)", lambda x: np.clip(x, -0.5, 2.5), lambda x: ((x > -0.5) & (x < 2.5)).astype(float)),
    "hard_sigmoid": ("hard_sigmoid", lambda x: np.clip(x + 3, 0, 6) / 6, lambda x: ((x > -3) & (x < 3)) / 6.0),
    "hard_sigmoid_onnx": (  # ONNX's HardSigmoid defaults: alpha 0.2, beta 0.5, bounds -2.5 and 2.5
        "hard_sigmoid(alpha=0.2, beta=0.5)",
        lambda x: np.clip(0.2 * x + 0.5, 0, 1),
        lambda x: ((x > -2.5) & (x < 2.5)) * 0.2,
    ),
    "hard_swish": (
        "hard_swish",
        lambda x: x * np.clip(x + 3, 0, 6) / 6,
        lambda x: np.where(x <= -3, 0.0, np.where(x < 3, x / 3 + 0.5, 1.0)),
    ),
    "silu": ("silu", lambda x: x * _sigmoid(x), lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x)))),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_forward_and_slope_at_its_kinks_follow_pytorch(name: str) -> None:
    call, want, slope = ACTIVATIONS[name]
    x = np.stack([KINKS, -KINKS, KINKS * 0.5])
    text = network((3, 12), f"h = {call}(x)")
    prog, g = _program(text)
    feeds, params = _arrays(g, x)
    out = run(prog, feeds, params, dtype=np.float64).outputs
    np.testing.assert_allclose(out["predict"], want(x), rtol=1e-12, atol=1e-12)
    # d mse / d x = 2 (h - t) / numel * slope: the slope at the kinks themselves is PyTorch's
    np.testing.assert_allclose(out["grad:x"], 2 * (want(x) - feeds["t"]) / x.size * slope(x), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradients_match_finite_differences(name: str) -> None:
    call = ACTIVATIONS[name][0]
    x = RNG.standard_normal((4, 9)) * 4
    x[np.abs(x - np.round(x * 2) / 2) < 1e-3] += 1e-2  # away from the kinks (all at halves)
    check_gradients(network((4, 9), f"layer fc = full(9)\nh = {call}(fc(x))"), x)


def test_hard_sigmoid_is_written_with_pytorchs_exact_bounds() -> None:
    # alpha clip(x + beta / alpha, 0, 1 / alpha): with the defaults, F.hardsigmoid's min(max(x + 3, 0), 6) / 6, so
    # -3 and 3 are the bounds exactly (0.2 x + 0.5 would miss them by a rounding)
    g = compile_text(network((2, 4), "h = hard_sigmoid(x)")).program.graph
    ops = [(s.op, dict(s.a)) for s in g.stmts if s.op != "mse"]
    assert ops == [("add_scalar", {"value": 3.0}), ("clip", {"low": 0.0, "high": 6.0}),
                   ("mul_scalar", {"value": 1 / 6})]  # fmt: skip


# ---- group norm, instance norm, batch norm on [N, C, L] ----


def _group_norm(x: np.ndarray, groups: int, eps: float, gamma=None, beta=None) -> np.ndarray:  # noqa: ANN001
    """nn.GroupNorm: each sample's channels in `groups` groups, each normalised with its biased variance."""
    n, c = x.shape[:2]
    v = x.reshape(n, groups, -1)
    y = ((v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + eps)).reshape(x.shape)
    if gamma is not None:
        shape = (1, c) + (1,) * (x.ndim - 2)
        y = y * gamma.reshape(shape) + beta.reshape(shape)
    return y


@pytest.mark.parametrize(
    ("shape", "call", "groups", "affine"),
    [
        ((3, 6, 4, 5), "group_norm(3)", 3, True),
        ((2, 8, 7), "group_norm(2, eps=1e-3)", 2, True),  # [N, C, L]
        ((4, 6), "group_norm(6, affine=false)", 6, False),  # [N, C]
        ((2, 4, 3, 5), "instance_norm", 4, False),
        ((2, 5, 6), "instance_norm(affine=true)", 5, True),  # nn.InstanceNorm1d
    ],
)
def test_group_and_instance_norm_forward(shape: tuple, call: str, groups: int, affine: bool) -> None:
    eps = 1e-3 if "eps" in call else 1e-5
    x = RNG.standard_normal(shape) * 2 + 1
    got, params = forward(network(shape, f"layer nm = {call}\nh = nm(x)"), x)
    assert sorted(params) == (["nm.beta", "nm.gamma"] if affine else [])
    want = _group_norm(x, groups, eps, params.get("nm.gamma"), params.get("nm.beta"))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_group_norm_and_instance_norm_gradients() -> None:
    x = RNG.standard_normal((2, 4, 3, 3))
    check_gradients(network((2, 4, 3, 3), "layer cv = conv(6, kernel=1)\nlayer gn = group_norm(3)\nh = gn(cv(x))",
                            (2, 6, 3, 3)), x)  # fmt: skip
    x = RNG.standard_normal((3, 4, 5))
    check_gradients(network((3, 4, 5), "layer nm = instance_norm(affine=true)\nh = nm(x)"), x)


def test_batch_norm_on_sequences_is_batchnorm1d() -> None:
    # training: each channel over the batch and the positions, biased variance; running var unbiased (N L - 1)
    x = RNG.standard_normal((4, 3, 5)) * 2 + 0.5
    text = network((4, 3, 5), "layer bn = batch_norm\nh = bn(x)")
    got, params = forward(text, x)
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    want = (x - mean[None, :, None]) / np.sqrt(var[None, :, None] + 1e-5)
    want = want * params["bn.gamma"][None, :, None] + params["bn.beta"][None, :, None]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    g = compile_text(text).program.graph
    prog = lower(g, "train")
    feeds, _ = _arrays(g, x)
    updates = run(prog, feeds, params, dtype=np.float64).updates
    np.testing.assert_allclose(updates["bn.running_var"], 0.9 + 0.1 * x.var(axis=(0, 2), ddof=1), rtol=1e-12)
    check_gradients(text, x)


# ---- full over the last axis ----


@pytest.mark.parametrize("shape", [(2, 5, 7), (2, 3, 4, 6)])
def test_full_over_the_last_axis_is_nn_linear(shape: tuple) -> None:
    x = RNG.standard_normal(shape)
    text = network(shape, "layer fc = full(4)\nh = fc(x)", (*shape[:-1], 4))
    got, params = forward(text, x)
    np.testing.assert_allclose(got, x @ params["fc.W"].T + params["fc.b"], rtol=1e-12, atol=1e-12)
    assert params["fc.W"].shape == (4, shape[-1])
    check_gradients(text, x)


# ---- adaptive average pooling ----


def _adaptive(x: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """nn.AdaptiveAvgPool2d, as PyTorch's loop: rows floor(i H / oh) .. ceil((i + 1) H / oh) - 1, and columns."""
    n, c, h, w = x.shape
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        r0, r1 = math.floor(i * h / oh), math.ceil((i + 1) * h / oh)
        for j in range(ow):
            c0, c1 = math.floor(j * w / ow), math.ceil((j + 1) * w / ow)
            out[:, :, i, j] = x[:, :, r0:r1, c0:c1].mean(axis=(2, 3))
    return out


@pytest.mark.parametrize(
    ("hw", "size", "ops"),
    [
        ((8, 6), "(4, 3)", {"avg_pool2d"}),  # divides: avg_pool2d
        ((5, 7), "1", {"global_avg_pool"}),
        ((7, 5), "3", {"adaptive_pool_axis"}),  # overlapping windows of unequal length
        ((5, 6), "(3, 2)", {"adaptive_pool_axis"}),  # H's windows overlap, W's divide
        ((3, 2), "(5, 4)", {"adaptive_pool_axis"}),  # more outputs than inputs
    ],
)
def test_adaptive_avg_pool_is_pytorchs(hw: tuple, size: str, ops: set) -> None:
    oh, ow = (int(size), int(size)) if size.isdigit() else tuple(int(v) for v in size.strip("()").split(","))
    shape = (2, 3, *hw)
    x = RNG.standard_normal(shape)
    text = network(shape, f"h = adaptive_avg_pool(x, {size})", (2, 3, oh, ow))
    g = compile_text(text).program.graph
    assert {s.op for s in g.stmts} - {"mse"} == ops
    got, _ = forward(text, x)
    np.testing.assert_allclose(got, _adaptive(x, oh, ow), rtol=1e-12, atol=1e-12)
    check_gradients(text, x)


# ---- errors, each at the call ----


@pytest.mark.parametrize(
    ("shape", "body", "message"),
    [
        ((2, 6, 4, 4), "h = group_norm(x, 4)", "group_norm: groups=4 does not divide the 6 channels"),
        ((2, 6), "h = instance_norm(x)", "instance_norm expects a 3-D or 4-D or 5-D or 6-D input"),
        ((2, 6, 1, 1), "h = instance_norm(x)", "has one position per channel"),
        ((2, 6, 3, 3, 3), "h = batch_norm(x)", "batch_norm expects a 2-D or 3-D or 4-D input"),
        ((2, 6), "h = clip(x, 2, 1)", "clip: low=2.0 is above high=1.0"),
        ((2, 6), "h = hard_sigmoid(x, alpha=0)", "argument 'alpha' of hard_sigmoid must be at least"),
        ((2, 6, 5), "h = adaptive_avg_pool(x, 2)", "adaptive_avg_pool expects a 4-D input"),
        (
            (1, 1, 250, 2),
            "h = adaptive_avg_pool(x, (378, 2))",
            "gives 257 runs of windows of equal length along axis 2",
        ),
        ((1, 1, 4, 4), "h = adaptive_avg_pool(x, (4, 70000))", "into 70,000 outputs along axis 3; at most 65,536"),
        ((2, 6, 5, 5), "h = adaptive_avg_pool(x, 0)", "argument 'size' of adaptive_avg_pool must be at least 1"),
    ],
)
def test_errors_name_the_call(shape: tuple, body: str, message: str) -> None:
    text = network(shape, body)
    err = error_text(text)
    assert message in err, err
    assert "t.ddsl:4:" in err.splitlines()[0], err  # the line of the call


def test_one_label_per_sample_after_full_on_images_hints_at_flatten() -> None:
    text = ("network T\ninput x : [4, 1, 8, 8]\nlabel y : [4] classes 10\nlayer cv = conv(4, kernel=3)\n"
            "layer fc = full(10)\nloss = softmax_cross_entropy(fc(cv(x)), y)\n")  # fmt: skip
    err = error_text(text)
    assert "one label per sample needs [N, K] scores, got f32[4,4,6,10] from full 'fc'" in err
    assert "use `flatten` first" in err


# ---- the example network ----

EXAMPLE = ROOT / "networks" / "examples" / "groupnorm_swish.ddsl"


def test_the_groupnorm_swish_example_checks_and_trains(cli) -> None:  # noqa: ANN001
    r = cli("check", str(EXAMPLE), "--layers")
    assert r.exit_code == 0, r.output
    assert "group_norm" in r.output and "silu" in r.output and "adaptive_avg_pool" in r.output
    r = cli("run", str(EXAMPLE), "--data", "synthetic", "--iters", "12", "--json")
    assert r.exit_code == 0, r.output
    losses = json.loads(r.stdout)["losses"]
    assert np.all(np.isfinite(losses)) and min(losses[-3:]) < losses[0], losses


def test_the_example_compiles_to_java_and_cuda(cli, tmp_path: Path) -> None:  # noqa: ANN001
    r = cli("compile", str(EXAMPLE), "-o", str(tmp_path))
    assert r.exit_code == 0, r.output
    java = next(tmp_path.glob("*.java")).read_text()
    assert "layerNormRows" in java  # group norm's rows op, the runtime's kernel on either device


# ---- ONNX export, checked by ONNX Runtime ----

EXPORTED = """network Exported
input x : [2, 4, 6, 6]
layer cv = conv(8, kernel=3, pad=1)
layer gn = group_norm(2)
layer inn = instance_norm(affine=true)
layer fc = full(5)
def body(x) {
  a = silu(gn(cv(x)))
  b = hard_swish(inn(relu6(a)))
  return fc(hard_sigmoid(clip(b, -0.5, 1.5), alpha=0.2))
}
predict = body(x)
loss = mse(body(x), body(x))
"""


def test_export_of_the_activations_and_norms_equals_onnx_runtime() -> None:
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from deepdsl import api
    from deepdsl.autodiff import infer_program
    from deepdsl.backends.onnx_export import export_graph
    from deepdsl.interop import initial_arrays

    program = compile_text(EXPORTED).program
    arrays = {k: v + RNG.standard_normal(v.shape).astype(np.float32) * 0.1 for k, v in initial_arrays(program).items()}
    model = export_graph(infer_program(program.graph), arrays)
    ops = {n.op_type for n in model.graph.node}
    assert {"Clip", "HardSwish", "Sigmoid", "InstanceNormalization", "Mul"} <= ops  # the norms as PyTorch writes them
    x = (RNG.standard_normal((2, 4, 6, 6)) * 2).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    b = api.build(program)
    want = run(b.infer, {"x": x}, arrays).outputs["predict"]
    assert got.shape == want.shape == (2, 8, 6, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_export_refuses_what_onnx_has_no_operator_for() -> None:
    pytest.importorskip("onnx")
    from deepdsl.autodiff import infer_program
    from deepdsl.backends.onnx_export import export_graph
    from deepdsl.errors import DslError
    from deepdsl.interop import initial_arrays

    program = compile_text(network((2, 3, 7, 5), "h = hard_swish(x)")).program
    with pytest.raises(DslError, match="HardSwish is in opsets 14 and later, not 13"):
        export_graph(infer_program(program.graph), initial_arrays(program), opset=13)


def test_the_general_adaptive_pool_exports_from_its_index_form() -> None:
    # ONNX has no adaptive pooling operator: the op's index form (overlapping windows) is written as a tensor
    # function's is, and ONNX Runtime gives the NumPy runner's output
    ort = pytest.importorskip("onnxruntime")
    from deepdsl.autodiff import infer_program
    from deepdsl.backends.numpy_runner import run
    from deepdsl.backends.onnx_export import export_graph
    from deepdsl.interop import initial_arrays

    program = compile_text(network((2, 3, 7, 5), "h = adaptive_avg_pool(x, 3)", (2, 3, 3, 3))).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays)
    x = RNG.standard_normal((2, 3, 7, 5)).astype(np.float32)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = run(infer_program(program.graph), {"x": x}, arrays).outputs["predict"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
