"""The train and infer programs: optimizer updates, batch-norm statistics and dropout, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import HEADER, compile_text

from deepdsl.autodiff import gradient_program, infer_program, train_program
from deepdsl.backends.numpy_runner import run
from deepdsl.initializers import uniform_array
from deepdsl.ops.random import mask_seed

NET = HEADER + "layer f = full(10)\nloss = softmax_cross_entropy(f(flatten(x)), y)\npredict = f(flatten(x))\n"
RNG = np.random.default_rng(3)


def _setup(text: str):  # noqa: ANN202
    graph = compile_text(text).program.graph
    params = {p.value.name: RNG.standard_normal(p.value.type.shape) * 0.1 for p in graph.params}
    feeds = {"x": RNG.random((4, 3, 8, 8)), "y": RNG.integers(0, 10, 4)}
    return graph, params, feeds


def _grads(graph, params, feeds):  # noqa: ANN001, ANN202
    out = run(gradient_program(graph), feeds, params, np.float64).outputs
    return {k[5:]: v for k, v in out.items() if k.startswith("grad:")}


def _step(graph, optimizer, params, feeds, state=None):  # noqa: ANN001, ANN202
    g = train_program(graph, optimizer)
    arrays = {p.value.name: np.zeros(p.value.type.shape) for p in g.params} | params | (state or {})
    return run(g, feeds, arrays, np.float64).updates


def test_sgd_with_momentum_and_weight_decay_follows_pytorch() -> None:
    graph, params, feeds = _setup(NET)
    grads = _grads(graph, params, feeds)
    opt = ("sgd", (("lr", 0.1), ("momentum", 0.9), ("weight_decay", 0.01), ("clip", 0.0)))
    v0 = {f"opt/{k}/momentum": RNG.standard_normal(v.shape) for k, v in params.items()}
    up = _step(graph, opt, params, feeds, v0)
    for name, w in params.items():
        v = 0.9 * v0[f"opt/{name}/momentum"] + grads[name] + 0.01 * w
        np.testing.assert_allclose(up[f"opt/{name}/momentum"], v, rtol=1e-12)
        np.testing.assert_allclose(up[name], w - 0.1 * v, rtol=1e-12)


def test_global_norm_clipping_scales_every_gradient() -> None:
    graph, params, feeds = _setup(NET)
    grads = _grads(graph, params, feeds)
    norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
    clip = norm / 4
    up = _step(graph, ("sgd", (("lr", 1.0), ("momentum", 0.0), ("weight_decay", 0.0), ("clip", clip))), params, feeds)
    for name, w in params.items():
        np.testing.assert_allclose(up[name], w - grads[name] * clip / (norm + 1e-6), rtol=1e-10)


def test_adam_follows_pytorch_with_bias_correction() -> None:
    graph, params, feeds = _setup(NET)
    grads = _grads(graph, params, feeds)
    opt = ("adam", (("lr", 0.01), ("beta1", 0.9), ("beta2", 0.999), ("eps", 1e-8)))
    m0 = {f"opt/{k}/m": RNG.standard_normal(v.shape) for k, v in params.items()}
    v0 = {f"opt/{k}/v": RNG.random(v.shape) for k, v in params.items()}
    state = m0 | v0 | {"opt/step": np.asarray(4.0)}
    up = _step(graph, opt, params, feeds, state)
    assert float(up["opt/step"]) == 5.0
    for name, w in params.items():
        m = 0.9 * m0[f"opt/{name}/m"] + 0.1 * grads[name]
        v = 0.999 * v0[f"opt/{name}/v"] + 0.001 * grads[name] ** 2
        expect = w - 0.01 * (m / (1 - 0.9**5)) / (np.sqrt(v / (1 - 0.999**5)) + 1e-8)
        np.testing.assert_allclose(up[name], expect, rtol=1e-10)


BN_NET = HEADER + "layer bn = batch_norm(momentum=0.2)\nh = bn(x)\nloss = mse(h, h * 0.5)\npredict = flatten(h)\n"


def test_batch_norm_uses_batch_statistics_in_training_and_updates_running_ones() -> None:
    graph, params, feeds = _setup(BN_NET)
    up = _step(graph, ("sgd", (("lr", 0.0), ("momentum", 0.0), ("weight_decay", 0.0), ("clip", 0.0))), params, feeds)
    x = feeds["x"]
    mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    n = x.size // x.shape[1]
    np.testing.assert_allclose(up["bn.running_mean"], 0.8 * params["bn.running_mean"] + 0.2 * mean, rtol=1e-12)
    np.testing.assert_allclose(up["bn.running_var"], 0.8 * params["bn.running_var"] + 0.2 * var * n / (n - 1),
                               rtol=1e-12)  # fmt: skip


def test_batch_norm_uses_running_statistics_in_inference() -> None:
    graph, params, feeds = _setup(BN_NET)
    params["bn.running_var"] = np.abs(params["bn.running_var"]) + 0.5
    out = run(infer_program(graph), {"x": feeds["x"]}, params, np.float64).outputs["predict"]
    bc = (1, -1, 1, 1)
    expect = (feeds["x"] - params["bn.running_mean"].reshape(bc)) / np.sqrt(params["bn.running_var"].reshape(bc) + 1e-5)
    expect = expect * params["bn.gamma"].reshape(bc) + params["bn.beta"].reshape(bc)
    np.testing.assert_allclose(out, expect.reshape(4, -1), rtol=1e-12)


DROP_NET = HEADER + "layer d = dropout(0.25)\nh = d(flatten(x))\nloss = mse(h, h * 0.5)\npredict = h\n"


@pytest.mark.parametrize("step", [0, 7])
def test_dropout_masks_are_reproducible_and_inverted(step: int) -> None:
    graph, params, feeds = _setup(DROP_NET)
    g = gradient_program(graph)
    mask_stmt = next(s for s in g.stmts if s.op == "dropout_mask")
    out = run(g.replace(outputs=(("mask", mask_stmt.out),)), {**feeds, "step": np.asarray(step)}, params).outputs
    u = uniform_array(mask_seed("d", 1, step), 4 * 192).reshape(4, 192)
    np.testing.assert_array_equal(out["mask"], np.where(u >= 0.25, np.float32(1 / 0.75), np.float32(0)))
    assert 0.6 < np.mean(out["mask"] > 0) < 0.9


def test_dropout_is_the_identity_in_inference() -> None:
    graph, params, feeds = _setup(DROP_NET)
    out = run(infer_program(graph), {"x": feeds["x"]}, params, np.float64).outputs["predict"]
    np.testing.assert_array_equal(out, feeds["x"].reshape(4, -1))
