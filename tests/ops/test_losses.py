"""The losses of issue 34 (`bce_with_logits`, `l1`, `huber`, `nll`, `label_smoothing=` and `weight=` on the
cross-entropies), several named loss terms, scalar tensor functions and in-graph sampling (`normal`, `uniform`):
their values against independent NumPy formulas of PyTorch's definitions, their errors, and what `run` reports.
(The gradients are in tests/ops/test_grads.py; scripts/pytorch_losses.py compares with PyTorch itself.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import compile_text, error_text

from deepdsl.backends.numpy_runner import run

RNG = np.random.default_rng(34)
N, D, K = 6, 5, 4


def _log_softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _net(loss: str, extra: str = "", label: str = f"label y : [{N}] classes {K}") -> str:
    # the scores s are x·Wᵀ + b of fc, whose parameters the test sets, so that s is known exactly
    return (f"network L\nconst N = {N}\ninput x : [N, {D}]\ninput t : [N, {K}]\n{label}\nlayer fc = full({K})\n"
            f"s = fc(x)\n{extra}loss = {loss}\npredict = s\n")  # fmt: skip


def _value(loss: str, y: np.ndarray | None = None, t: np.ndarray | None = None, extra: str = "") -> tuple:
    g = compile_text(_net(loss, extra)).program.graph
    x, w, b = RNG.standard_normal((N, D)), RNG.standard_normal((K, D)), RNG.standard_normal(K)
    feeds = {"x": x, "t": t if t is not None else RNG.standard_normal((N, K))}
    if any(d.value.name == "y" for d in g.inputs):
        feeds["y"] = y if y is not None else RNG.integers(0, K, N)
    out = run(g, feeds, {"fc.W": w, "fc.b": b}, dtype=np.float64).outputs["loss"]
    return float(out), x @ w.T + b, feeds


def test_l1_is_the_mean_absolute_error() -> None:
    got, s, f = _value("l1(s, t)")
    assert got == pytest.approx(np.mean(np.abs(s - f["t"])), rel=1e-12)


@pytest.mark.parametrize("delta", [1.0, 0.3, 2.5])
def test_huber_is_quadratic_inside_delta_and_linear_outside(delta: float) -> None:
    got, s, f = _value(f"huber(s, t, delta={delta})" if delta != 1.0 else "huber(s, t)")
    d = np.abs(s - f["t"])
    want = np.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)).mean()
    assert got == pytest.approx(want, rel=1e-12)


def test_bce_with_logits_is_stable_for_large_logits() -> None:
    t = RNG.uniform(0, 1, (N, K))
    got, s, f = _value("bce_with_logits(s * 40, t)", t=t)
    x = s * 40
    want = np.mean(np.maximum(x, 0) - x * t + np.log1p(np.exp(-np.abs(x))))
    assert np.isfinite(got) and got == pytest.approx(want, rel=1e-12)


def _nll_reference(lp: np.ndarray, y: np.ndarray, weight=None, ignore: int = -100, eps: float = 0.0) -> float:  # noqa: ANN001
    w = np.ones(lp.shape[1]) if weight is None else np.asarray(weight, dtype=np.float64)
    keep = y != ignore
    yy = np.where(keep, y, 0)
    picked = -(keep * w[yy] * lp[np.arange(len(y)), yy]).sum()
    smooth = -(keep[:, None] * w[None, :] * lp).sum()
    return float(((1 - eps) * picked + eps / lp.shape[1] * smooth) / (keep * w[yy]).sum())


def test_nll_is_the_mean_over_the_labels_that_are_not_ignored() -> None:
    y = np.array([0, 3, -100, 1, 2, -100])
    got, s, _ = _value("nll(log_softmax(s), y)", y=y)
    assert got == pytest.approx(_nll_reference(_log_softmax(s), y), rel=1e-12)


def test_nll_with_an_ignore_index_inside_the_classes_and_weights() -> None:
    y = np.array([0, 3, 2, 1, 2, 2])
    got, s, _ = _value("nll(log_softmax(s), y, ignore_index=2, weight=(1, 2, 0.5, 3))", y=y)
    assert got == pytest.approx(_nll_reference(_log_softmax(s), y, (1, 2, 0.5, 3), ignore=2), rel=1e-12)


@pytest.mark.parametrize("eps, weight", [(0.0, (1, 2, 0.5, 3)), (0.2, None), (0.1, (1, 2, 0.5, 3))])
def test_softmax_cross_entropy_with_label_smoothing_and_class_weights(eps: float, weight: tuple | None) -> None:
    args = (f", label_smoothing={eps}" if eps else "") + (f", weight={weight}" if weight else "")
    got, s, f = _value(f"softmax_cross_entropy(s, y{args})")
    assert got == pytest.approx(_nll_reference(_log_softmax(s), f["y"], weight, eps=eps), rel=1e-10)


def test_cross_entropy_of_probabilities_with_label_smoothing_and_class_weights() -> None:
    got, s, f = _value("cross_entropy(softmax(s), y, label_smoothing=0.3, weight=(2, 1, 1, 0.5))")
    assert got == pytest.approx(_nll_reference(_log_softmax(s), f["y"], (2, 1, 1, 0.5), eps=0.3), rel=1e-10)


def test_plain_softmax_cross_entropy_keeps_its_one_statement() -> None:
    g = compile_text(_net("softmax_cross_entropy(s, y)")).program.graph
    assert [s.op for s in g.stmts][-1] == "softmax_cross_entropy"


@pytest.mark.parametrize(
    "loss, message",
    [
        ("l1(s, x)", "l1: prediction f32[6,4] and target f32[6,5] differ in shape"),
        ("huber(s, t, delta=0)", "argument 'delta' of huber must be"),
        ("bce_with_logits(s, y)", "bce_with_logits: the target must be float"),
        ("nll(s, t)", "nll: labels must be int [6]"),
        ("softmax_cross_entropy(s, y, weight=(1, 2))", "weight= gives 2 class weights, but there are 4 classes"),
        ("softmax_cross_entropy(s, y, weight=(1, -2, 1, 1))", "'weight' of softmax_cross_entropy must be at least 0"),
        ("softmax_cross_entropy(s, y, label_smoothing=1.5)", "argument 'label_smoothing' of softmax_cross_entropy"),
        ('softmax_cross_entropy(s, y, weight="a")', "argument 'weight' of softmax_cross_entropy must be"),
    ],
)
def test_loss_errors_are_located(loss: str, message: str) -> None:
    text = error_text(_net(loss))
    assert message in text
    assert "t.ddsl:8:" in text  # the loss line


# ---- several loss terms, scalar tensor functions ----

TERMS = f"""network Terms
const N = {N}
input x : [N, {D}]
label y : [N] classes {K}
layer fc = full({K})
s = fc(x)
tensor mean_square(a[B, C]) -> [] = sum[n, k] a[n, k] ^ 2 / (B * C)
ce = softmax_cross_entropy(s, y)
reg = mean_square(s)
loss = ce + 0.5 * reg
predict = s
train {{ iterations = 3 seed = 1 }}
"""


def test_a_scalar_tensor_function_is_a_loss_term() -> None:
    g = compile_text(TERMS).program.graph
    x, w, b = RNG.standard_normal((N, D)), RNG.standard_normal((K, D)), RNG.standard_normal(K)
    y = RNG.integers(0, K, N)
    out = run(g, {"x": x, "y": y}, {"fc.W": w, "fc.b": b}, dtype=np.float64).outputs
    s = x @ w.T + b
    ce = -_log_softmax(s)[np.arange(N), y].mean()
    assert float(out["loss"]) == pytest.approx(ce + 0.5 * np.mean(s * s), rel=1e-12)
    assert float(out["loss:ce"]) == pytest.approx(ce, rel=1e-12)
    assert float(out["loss:reg"]) == pytest.approx(np.mean(s * s), rel=1e-12)


def test_run_reports_each_named_term(cli, tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "terms.ddsl"
    f.write_text(TERMS)
    r = cli("run", str(f), "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert list(out["loss_terms"]) == ["ce", "reg"]
    for k, loss in enumerate(out["losses"]):
        assert loss == pytest.approx(out["loss_terms"]["ce"][k] + 0.5 * out["loss_terms"]["reg"][k], rel=1e-5)
    text = cli("run", str(f), "--device", "cpu").output
    assert "  ce " in text and "  reg " in text


def test_a_loss_of_one_op_reports_no_terms(cli, tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "one.ddsl"
    f.write_text(TERMS.replace("loss = ce + 0.5 * reg", "loss = ce"))
    out = json.loads(cli("run", str(f), "--json", "--device", "cpu").stdout)
    assert "loss_terms" not in out


def test_a_tensor_function_with_no_output_index_must_reduce_every_index() -> None:
    text = error_text(TERMS.replace("sum[n, k] a[n, k] ^ 2", "a[n, k] ^ 2"))
    assert "unknown index 'n'" in text or "'n'" in text


# ---- sampling ----

SAMPLE = f"""network Sample
const N = {N}
input x : [N, {D}]
layer fc = full({K})
z = normal((N, {K}))
u = uniform((N, {K}), low=-2, high=3)
h = fc(x) + z + u
loss = mse(h, h * 0)
predict = h
train {{ iterations = 2 seed = 7 }}
"""


def test_normal_and_uniform_draw_from_the_seeded_stream_each_step() -> None:
    from deepdsl import api
    from deepdsl.initializers import normal_array, uniform_array
    from deepdsl.ops.random import sample_seed

    b = api.build(compile_text(SAMPLE).program)
    draws = {}
    for step in (0, 1):
        g = b.train
        stmts = [s for s in g.stmts if s.op in ("random_normal", "random_uniform")]
        assert sorted(s.op for s in stmts) == ["random_normal", "random_uniform"]
        for s in stmts:
            from deepdsl.ir import REGISTRY

            value = REGISTRY[s.op].numpy((np.asarray(step, dtype=np.int64),), s.a)
            seed = sample_seed(s.a["site"], s.a["seed"], step)
            if s.op == "random_normal":
                want = normal_array(seed, N * K).reshape(N, K).astype(np.float32)
            else:
                want = (-2 + 5 * uniform_array(seed, N * K)).reshape(N, K).astype(np.float32)
            np.testing.assert_array_equal(value, want)
            draws[(s.op, step)] = value
    assert not np.array_equal(draws[("random_normal", 0)], draws[("random_normal", 1)])
    u = draws[("random_uniform", 0)]
    assert u.min() >= -2 and u.max() < 3


def test_sampling_is_its_mean_in_inference() -> None:
    from deepdsl import api

    b = api.build(compile_text(SAMPLE).program)
    assert b.infer is not None
    assert not any(s.op.startswith("random_") for s in b.infer.stmts)
    x = RNG.standard_normal((N, D)).astype(np.float32)
    from deepdsl.backends.numpy_runner import run as run_graph
    from deepdsl.trainer import Trainer

    arrays = Trainer(b, __import__("deepdsl.data.named", fromlist=["Samples"]).Samples({})).arrays
    got = run_graph(b.infer, {"x": x}, arrays).outputs["predict"]
    want = x @ arrays["fc.W"].T + arrays["fc.b"] + 0.5  # normal's mean 0, uniform(-2, 3)'s 0.5
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "expr, message",
    [
        ("normal(x)", "argument 'shape' of normal must be"),
        ("normal((N, 0))", "at least 1"),
        ("uniform((N, 4), low=3, high=1)", "uniform: low=3 must be below high=1"),
    ],
)
def test_sampling_errors_are_located(expr: str, message: str) -> None:
    text = error_text(SAMPLE.replace(f"normal((N, {K}))", expr))
    assert message in text and "t.ddsl:5:" in text


# ---- ignored labels in the data ----

IGNORED = f"""network Ignored
const N = 4
input x : [N, {D}]
label y : [N] classes {K}
layer fc = full({K})
loss = nll(log_softmax(fc(x)), y)
predict = fc(x)
train {{ iterations = 2 seed = 1 }}
"""


def _npz(path, y) -> None:  # noqa: ANN001
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.standard_normal((8, D)).astype(np.float32), y=np.asarray(y, dtype=np.int64))


def test_data_may_hold_the_ignored_label_of_nll(cli, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "ignored.ddsl").write_text(IGNORED)
    _npz(tmp_path / "d.npz", [0, -100, 3, 1, -100, 2, 2, 1])
    r = cli("run", str(tmp_path / "ignored.ddsl"), "--data", f"npz:{tmp_path / 'd.npz'}", "--json", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert all(np.isfinite(json.loads(r.stdout)["losses"]))
    _npz(tmp_path / "bad.npz", [0, -99, 3, 1, -100, 2, 2, 1])  # any other value outside [0, K) is still refused
    r = cli("run", str(tmp_path / "ignored.ddsl"), "--data", f"npz:{tmp_path / 'bad.npz'}", "--device", "cpu")
    assert r.exit_code == 1 and "label -99 of sample 1 is outside [0, 4)" in r.output


def test_without_an_ignore_index_the_labels_stay_in_their_classes(cli, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "plain.ddsl").write_text(
        IGNORED.replace("nll(log_softmax(fc(x)), y)", "softmax_cross_entropy(fc(x), y)")
    )
    _npz(tmp_path / "d.npz", [0, -100, 3, 1, 0, 2, 2, 1])
    r = cli("run", str(tmp_path / "plain.ddsl"), "--data", f"npz:{tmp_path / 'd.npz'}", "--device", "cpu")
    assert r.exit_code == 1 and "label -100 of sample 1 is outside [0, 4)" in r.output


def test_uniform_with_a_number_is_still_the_initialiser() -> None:
    text = SAMPLE.replace("layer fc = full(4)", "layer fc = full(4, init=uniform(0.05))").replace(
        "uniform((N, 4), low=-2, high=3)", "uniform(shape=(N, 4), low=-2, high=3)"
    )
    g = compile_text(text).program.graph
    assert next(p for p in g.params if p.value.name == "fc.W").init.kind == "uniform"
    assert [s.op for s in g.stmts].count("sample_uniform") == 1


def test_no_iterations_report_empty_terms(cli, tmp_path) -> None:  # noqa: ANN001
    # as the Java program does: the terms are named even when no step ran
    f = tmp_path / "terms.ddsl"
    f.write_text(TERMS)
    out = json.loads(cli("run", str(f), "--json", "--device", "cpu", "--iters", "0").stdout)
    assert out["loss_terms"] == {"ce": [], "reg": []}
