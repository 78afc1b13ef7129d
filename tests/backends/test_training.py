"""End to end on the NumPy runner: whole-network gradients, learning, resuming, non-finite losses."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from helpers import HEADER, REDUCED, ROOT, STEP, compile_text, feeds_and_params, with_slow

from deepdsl import api
from deepdsl.autodiff import gradient_program
from deepdsl.backends.numpy_runner import run
from deepdsl.data.named import Samples, fields_of, load_samples
from deepdsl.trainer import Trainer

TENSOR_NET = (
    HEADER
    + """
tensor row_norm(x[B, D]) -> [n, d] {
  param g[D] = constant(1)
  param h[D] = constant(0)
  mu[n]  = sum[d] x[n, d] / D
  var[n] = sum[d] (x[n, d] - mu[n]) ^ 2 / D
  return g[d] * (x[n, d] - mu[n]) / sqrt(var[n] + 1e-5) + h[d]
}
tensor swish(x[B, D]) -> [n, d] = x[n, d] * sigmoid(x[n, d])
layer c = conv(4, kernel=3, pad=1)
layer f1 = full(16)
layer f2 = full(10)
net = f2 o swish o row_norm o f1 o flatten o relu o c
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
"""
)


def check_network_gradient(graph, tensors: int, seed: int = 0) -> float:  # noqa: ANN001
    """Symbolic gradients of the whole training loss against central differences (float64)."""
    g = gradient_program(graph)
    loss_only = gradient_program(graph).replace(outputs=(("loss", g.output("loss")),))
    rng = np.random.default_rng(seed)
    feeds, params = feeds_and_params(g, rng)
    out = run(g, feeds, params, np.float64).outputs
    trainable = [p.value.name for p in g.params if p.kind == "param"]
    chosen = [trainable[0], trainable[-1], *rng.choice(trainable, size=max(0, tensors - 2), replace=False)]
    worst = 0.0
    for name in chosen:
        flat = params[name].reshape(-1)
        idx = int(rng.integers(flat.size))
        values = []
        for sign in (1, -1):
            a = flat.copy()
            a[idx] += sign * STEP
            values.append(float(run(loss_only, feeds, {**params, name: a.reshape(params[name].shape)},
                                    np.float64).outputs["loss"]))  # fmt: skip
        numeric = (values[0] - values[1]) / (2 * STEP)
        symbolic = float(out[f"grad:{name}"].reshape(-1)[idx])
        err = abs(numeric - symbolic) / max(1e-4, abs(numeric), abs(symbolic))
        assert err < 1e-4, f"d loss / d {name}[{idx}]: symbolic {symbolic}, numeric {numeric}"
        worst = max(worst, err)
    return worst


@pytest.mark.parametrize("name", with_slow(sorted(REDUCED)))
def test_network_gradient_matches_finite_differences(name: str, compiled) -> None:  # noqa: ANN001
    sets, tensors = REDUCED[name]
    check_network_gradient(compiled(name, sets).program.graph, tensors)


def test_tensor_function_network_gradient_matches_finite_differences() -> None:
    check_network_gradient(compile_text(TENSOR_NET).program.graph, 7)


def _trainer(compiled, name: str, sets: dict, **train) -> Trainer:  # noqa: ANN001, ANN003
    p = compiled(name, sets).program
    if train:
        p = dataclasses.replace(p, train=dataclasses.replace(p.train, **train))
    return Trainer(api.build(p), load_samples("synthetic", {}, fields_of(p.graph.inputs), 1))


@pytest.mark.parametrize("name", with_slow(sorted(set(REDUCED) - {"small"})))  # small: dropout makes 5 steps noisy
def test_loss_decreases_on_synthetic_data(name: str, compiled) -> None:  # noqa: ANN001
    """A few steps on one fixed synthetic batch (10 classes) lower the loss."""
    sets, _ = REDUCED[name]
    sgd = ("sgd", (("lr", 0.01), ("momentum", 0.0), ("weight_decay", 0.0), ("clip", 1.0)))
    t = _trainer(compiled, name, {**sets, "N": 8, "K": 10}, optimizer=sgd)
    t.data = Samples({name: a[:8] for name, a in t.data.train.items()})
    losses = t.train(5).losses
    assert losses[-1] < losses[0], losses


def test_save_load_continue_gives_the_same_losses(tmp_path, compiled) -> None:  # noqa: ANN001
    """SMALL: besides parameters and momentum, batch norm's running statistics and the step counter (which seeds
    the dropout masks) must go through the file."""
    straight = _trainer(compiled, "small", {}).train(6).losses
    first = _trainer(compiled, "small", {})
    head = first.train(3).losses
    first.save(str(tmp_path / "mid.npz"))
    second = _trainer(compiled, "small", {})
    second.load(str(tmp_path / "mid.npz"))
    tail = second.train(3).losses
    assert head + tail == straight


def test_a_non_finite_loss_names_the_first_statement(cli, tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "bad.ddsl"
    f.write_text(HEADER + "layer fc = full(10)\nh = log(fc(flatten(x)) - 1000)\nloss = mse(h, h)\n")
    r = cli("run", str(f), "--iters", "2", "--save", str(tmp_path / "out.npz"))
    assert r.exit_code == 1
    assert "iteration 1: statement" in r.stderr and "log(...)" in r.stderr and "produced a NaN or Inf" in r.stderr
    assert "h = log(fc(flatten(x)) - 1000)" in r.stderr  # the source line, with a caret
    assert not (tmp_path / "out.npz").exists()


def test_run_json_reports_the_design_fields(cli) -> None:  # noqa: ANN001
    r = cli(
        "run", str(ROOT / "networks" / "mlp.ddsl"), "--set", "N=16", "--iters", "3", "--data", "synthetic", "--json"
    )
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["device"] == "cpu" and len(obj["losses"]) == 3
    assert 0.0 <= obj["test_accuracy"] <= 1.0
    assert obj["peak_bytes"] > 0 and obj["seconds_per_iter"] > 0


def test_run_reports_progress_and_accuracy(cli, tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "mlp.npz"
    r = cli("run", str(ROOT / "networks" / "mlp.ddsl"), "--set", "N=16", "--iters", "2", "--data", "synthetic",
            "--save", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "device: cpu" in r.stdout and "iter 2/2  loss" in r.stdout and "images/s" in r.stdout
    # a network whose first input is not [N, C, H, W] counts samples
    rows = cli("run", str(ROOT / "networks" / "regression.ddsl"), "--iters", "1", "--data", "synthetic")
    assert rows.exit_code == 0 and "samples/s" in rows.stdout and "images/s" not in rows.stdout, rows.output
    assert "test accuracy:" in r.stdout
    saved = np.load(out)
    assert "fc1.W" in saved.files and "opt/fc1.W/momentum" in saved.files


def test_save_is_checked_before_training_and_iters_0_tests_nothing(cli, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    mlp = str(ROOT / "networks" / "mlp.ddsl")
    r = cli("run", mlp, "--set", "N=2", "--iters", "2", "--data", "synthetic", "--save", str(tmp_path / "no" / "p.npz"))
    assert r.exit_code == 1 and f"folder '{tmp_path / 'no'}' does not exist" in r.stderr
    assert "iter" not in r.stdout  # refused before the first step, not after the last

    def no_test(self, batches=None):  # noqa: ANN001, ANN202
        raise AssertionError("--iters 0 ran the test set")

    monkeypatch.setattr(Trainer, "test", no_test)
    r = cli(
        "run", mlp, "--set", "N=2", "--iters", "0", "--data", "synthetic", "--save", str(tmp_path / "p.npz"), "--json"
    )
    assert r.exit_code == 0, r.output
    assert "test_accuracy" not in json.loads(r.stdout) and "fc1.W" in np.load(tmp_path / "p.npz").files


def test_synthetic_says_its_seed(cli) -> None:  # noqa: ANN001
    """--data synthetic:SEED is the synthetic data's own seed, and the header line says so."""
    mlp, sets = str(ROOT / "networks" / "mlp.ddsl"), ("--set", "N=2", "--iters", "1", "--device", "cpu")
    five = cli("run", mlp, *sets, "--data", "synthetic:5")
    assert five.exit_code == 0 and "data synthetic (seed 5)" in five.stdout.splitlines()[0]
    default = cli("run", mlp, *sets, "--data", "synthetic")
    assert "data synthetic (seed 1)" in default.stdout.splitlines()[0]  # the program's seed
    assert five.stdout.splitlines()[1] != default.stdout.splitlines()[1]  # other data, another loss
    r = cli("run", mlp, *sets, "--data", "synthetic:five")
    assert r.exit_code == 2 and "needs an integer seed" in r.stderr


def test_load_checks_names_and_shapes(cli, tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.npz"
    np.savez(bad, **{"fc1.W": np.zeros((3, 3), np.float32)})
    r = cli("run", str(ROOT / "networks" / "mlp.ddsl"), "--iters", "1", "--data", "synthetic", "--load", str(bad))
    assert r.exit_code == 1
    assert "fc1.W" in r.stderr


def test_eval_and_predict_use_a_trained_network(cli, tmp_path) -> None:  # noqa: ANN001
    """`eval` reports the test loss of saved parameters without training (what `run` reported after training);
    `predict` writes `predict` for every sample of the data, a batch's worth at a time, the last one partial."""
    net = str(ROOT / "networks" / "regression.ddsl")
    saved = tmp_path / "reg.npz"
    r = cli("run", net, "--set", "N=8", "--iters", "4", "--device", "cpu", "--save", str(saved), "--json")
    assert r.exit_code == 0, r.output
    trained = json.loads(r.stdout)
    r = cli("eval", net, "--set", "N=8", "--load", str(saved), "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == {"device": "cpu", "precision": "fp32",
                                    "test_loss": pytest.approx(trained["test_loss"], rel=1e-6),
                                    "test_mae": pytest.approx(trained["test_mae"], rel=1e-6)}  # fmt: skip
    x = np.random.default_rng(1).random((11, 64), np.float32)
    np.savez(tmp_path / "x.npz", x=x, y=np.zeros(11, np.int64))  # arrays predict does not read are ignored
    out = tmp_path / "out.npz"
    r = cli("predict", net, "--set", "N=8", "--load", str(saved), "--data", f"npz:{tmp_path / 'x.npz'}", "-o",
            str(out), "--device", "cpu")  # fmt: skip
    assert r.exit_code == 0, r.output
    p = np.load(saved)
    hidden = np.maximum(x @ p["fc1.W"].T + p["fc1.b"], 0)
    np.testing.assert_allclose(np.load(out)["predict"], hidden @ p["fc2.W"].T + p["fc2.b"], rtol=1e-5, atol=1e-6)
    r = cli("eval", net, "--load", str(saved), "--data", f"npz:{tmp_path / 'x.npz'}")
    assert r.exit_code == 1 and "an array 'y' that names no input or label" in r.stderr  # eval reads every input


def test_a_train_block_path_is_relative_to_its_ddsl_file(cli, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """As include is; --data stays relative to the current directory."""
    sub = tmp_path / "nets"
    sub.mkdir()
    rng = np.random.default_rng(0)
    np.savez(sub / "d.npz", x=rng.random((8, 1, 28, 28), dtype=np.float32), y=np.arange(8) % 10)
    mlp = (ROOT / "networks" / "mlp.ddsl").read_text().replace('mnist("../data/mnist")', 'npz("d.npz")')
    assert 'npz("d.npz")' in mlp
    (sub / "net.ddsl").write_text(mlp)
    monkeypatch.chdir(tmp_path)
    r = cli("run", "nets/net.ddsl", "--set", "N=2", "--iters", "1", "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = cli("run", "nets/net.ddsl", "--set", "N=2", "--iters", "1", "--device", "cpu", "--data", "npz:d.npz")
    assert r.exit_code == 1 and "npz data file not found: 'd.npz'" in r.stderr
    monkeypatch.chdir(sub)
    assert cli("run", "net.ddsl", "--set", "N=2", "--iters", "1", "--data", "npz:d.npz").exit_code == 0
