"""The Transformer built-ins (issue 20): layer norm's lowering against PyTorch's formula and finite differences,
GELU against the exact erf, batched matmul for every transpose, and softmax over any axis."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import check_op_gradient, compile_text, error_text, op_graph

import deepdsl.ops  # noqa: F401
from deepdsl.autodiff import gradient_program, lower
from deepdsl.backends.numpy_runner import run
from deepdsl.ir import REGISTRY
from deepdsl.ir.types import TensorType
from deepdsl.ops.indexed import evaluate
from deepdsl.passes.dce import dce

RNG = np.random.default_rng(7)


def _layer_norm_reference(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """torch.nn.functional.layer_norm over the last axis: the biased variance."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _lowered(op: str, inputs: list, attrs: dict) -> tuple:
    b, values, _ = op_graph(op, inputs, attrs)
    params = {v.name: np.asarray(x, dtype=np.float64) for v, x in zip(values, inputs)}
    return b.build(), params


def test_layer_norm_lowering_computes_pytorchs_layer_norm() -> None:
    x, g, b = RNG.standard_normal((5, 7)), RNG.standard_normal(7), RNG.standard_normal(7)
    graph, params = _lowered("layer_norm", [x, g, b], {"eps": 1e-5})
    forward = lower(graph, "train")
    assert "layer_norm" not in {s.op for s in forward.stmts}
    r = np.ones((5, 7))
    got = run(forward, {"r": r}, params, dtype=np.float64).outputs["loss"]
    assert got == pytest.approx(float(np.sum(_layer_norm_reference(x, g, b, 1e-5))), rel=1e-12)


def test_layer_norm_gradients_match_finite_differences() -> None:
    x, g, b = RNG.standard_normal((4, 6)), RNG.standard_normal(6), RNG.standard_normal(6)
    graph, params = _lowered("layer_norm", [x, g, b], {"eps": 1e-5})
    grads = gradient_program(graph)
    feeds = {"r": RNG.standard_normal((4, 6))}
    out = run(grads, feeds, params, dtype=np.float64).outputs
    for name, value in params.items():
        flat = value.reshape(-1)
        for idx in range(flat.size):
            h = 1e-6
            shifted = []
            for sign in (1, -1):
                p = dict(params)
                p[name] = flat.copy()
                p[name][idx] += sign * h
                p[name] = p[name].reshape(value.shape)
                shifted.append(run(grads, feeds, p, dtype=np.float64).outputs["loss"])
            numeric = (shifted[0] - shifted[1]) / (2 * h)
            assert out[f"grad:{name}"].reshape(-1)[idx] == pytest.approx(numeric, abs=1e-6), (name, idx)


def test_gelu_is_the_exact_erf_form() -> None:
    x = np.linspace(-6, 6, 241)
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    assert np.abs(REGISTRY["gelu"].numpy((x,), {}) - exact).max() < 1e-6
    assert REGISTRY["gelu"].numpy((x.astype(np.float32),), {}).dtype == np.float32


def test_gelu_gradient_is_phi_plus_x_times_the_density() -> None:
    """gelu_grad is Phi(x) + x phi(x) (not the derivative of the erf polynomial): within 1e-7 of the exact value,
    and within 6e-7 of the slope of gelu's own kernel by float64 central differences."""
    x = np.linspace(-8, 8, 16001)
    exact = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi)
                      for v in x])  # fmt: skip
    g = RNG.standard_normal(x.shape)
    got = REGISTRY["gelu_grad"].numpy((g, x), {})
    assert np.abs(got - g * exact).max() < 1e-7 * np.abs(g).max()
    h = 1e-5
    slope = (REGISTRY["gelu"].numpy((x + h,), {}) - REGISTRY["gelu"].numpy((x - h,), {})) / (2 * h)
    assert np.abs(got / g - slope).max() < 6e-7
    # the index form (what fusion composes; `evaluate` computes its shared t and exponential once) is the same
    t = TensorType(x.shape)
    form = REGISTRY["gelu_grad"].index_form((t, t), t, {})
    np.testing.assert_allclose(evaluate(form, (("i0", x.size),), (g, x), np.float64), got, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_batch_matmul_gradients_for_every_transpose(ta: bool, tb: bool) -> None:
    a = RNG.standard_normal((2, 4, 3) if ta else (2, 3, 4))
    b = RNG.standard_normal((2, 5, 4) if tb else (2, 4, 5))
    check_op_gradient("batch_matmul", [a, b], {"transpose_a": ta, "transpose_b": tb})


NET = """
network T
const N = 2
input x : [N, 3, 4, 5]
label y : [N] classes 10
{body}
loss = softmax_cross_entropy(full(reshape(out, (N, -1)), 10), y)
"""


def _probe(body: str) -> object:
    """The forward graph of NET with `body`, its output the value bound to `out`."""
    g = compile_text(NET.format(body=body)).program.graph
    flat = next(s for s in g.stmts if s.op == "reshape" and tuple(s.a["shape"]) == (2, 60))  # reshape(out, ...)
    return dce(g.replace(outputs=(("probe", flat.inputs[0]),)))


def _run(g: object, x: np.ndarray) -> np.ndarray:
    feeds = {"x": x, "y": np.zeros(2, dtype=np.int64)}
    params = {p.value.name: np.zeros(p.value.type.shape) for p in g.params}
    return run(g, feeds, params, dtype=np.float64).outputs["probe"]


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1])
def test_softmax_over_any_axis(axis: int) -> None:
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g = _probe(f"out = softmax(x, axis={axis})")
    got = _run(g, x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=axis, keepdims=True), rtol=1e-6)


def test_matmul_batches_and_weights() -> None:
    body = "a = reshape(x, (N, 3, 20))\nout = matmul(matmul(a, a, transpose_b=true), a)"
    g = _probe(body)
    x = RNG.standard_normal((2, 3, 4, 5))
    a = x.reshape(2, 3, 20)
    got = _run(g, x)
    np.testing.assert_allclose(got, a @ a.transpose(0, 2, 1) @ a, rtol=1e-10)


@pytest.mark.parametrize(
    "body, message",
    [
        ("out = permute(x, (0, 2, 2, 1))", "permute: (0, 2, 2, 1) is not a permutation of the 4 axes"),
        ("out = transpose(x, 1, 4)", "transpose: axis 4 is out of range for f32[2,3,4,5]"),
        ("out = reshape(x, (N, -1, -1))", "reshape: every size must be at least 1, and at most one may be -1"),
        ("out = reshape(x, (N, -1, 7))", "[2, -1, 7] no size for -1 fits (not a multiple of 14)"),
        ("out = softmax(x, axis=-5)", "softmax: axis -5 is out of range"),
        ("out = matmul(x, x)", "matmul: inner sizes differ (5 vs 4): a is [4, 5], b is [4, 5]"),
        ("out = matmul(x, x, transpose_b=true)", None),  # the same operands, transposed: fine
        ("out = matmul(x, reshape(x, (6, 5, 4)))", "matmul: the batch axes differ (f32[2,3,4,5] and f32[6,5,4])"),
        ("out = layer_norm(x, eps=0)", "argument 'eps' of layer_norm must be at least"),
    ],
)
def test_mistakes_with_the_transformer_built_ins_are_diagnostics(body: str, message: str | None) -> None:
    if message is None:
        assert compile_text(NET.format(body=body)).program is not None
    else:
        assert message in error_text(NET.format(body=body))
