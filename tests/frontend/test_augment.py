"""The train block's `augment` (frontend/train.py): what it accepts, the TrainConfig it gives, and its located
errors; the augmentation itself (data/augment.py) on hand-made images; the test metrics (top-5, MAE) against a
computation of their own; `predict --split`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, compile_text, error_text

from deepdsl.data.augment import augment

NET = """network T
const N = 4
input x : [N, 3, 8, 6]
label y : [N] classes 10
layer fc = full(10)
loss = softmax_cross_entropy(fc(flatten(x)), y)
predict = fc(flatten(x))
train {
  augment = %s
}
"""


def config(text: str):  # noqa: ANN201
    c = compile_text(NET % text)
    assert c.program is not None
    return c.program.train


def test_augment_config() -> None:
    cfg = config("(crop((8, 6), pad=2), flip, normalize((0.5, 0.25, 1), 0.5))")
    assert cfg.augment_input == "x"
    assert cfg.augment == (
        ("crop", (("size", (8, 6)), ("pad", (2, 2)))),
        ("flip", (("p", 0.5),)),
        ("normalize", (("mean", (0.5, 0.25, 1.0)), ("std", (0.5, 0.5, 0.5)))),
    )
    assert config("flip(p=0.25)").augment == (("flip", (("p", 0.25),)),)
    assert config("normalize(0.5, 0.2)").augment[0][0] == "normalize"


@pytest.mark.parametrize(
    "text, message, col",
    [
        ("crop(8, pad=2)", "crop's size (8, 8) must be the image input x's (H, W) = (8, 6)", 13),
        ("crop((8, 6), pad=9)", "crop's pad (9, 9) must be at most the image's (H, W) = (8, 6)", 13),
        ("(flip(), normalize(0.5, (1, 1)))", "normalize's std has 2 values, but the image input x has 3 channels", 22),
        ("(flip(), flip())", "'augment' gives flip() twice", 22),
        ("normalize((0.5, 0.5), (1, 1, 1))", "normalize's mean has 2 values, but the image input x has 3 channels", 13),
        ("normalize(0.5, 0)", "normalize's std values must be positive", 13),
        ("flip(p=2)", "argument 'p' of flip must be at most 1, got 2", 18),
        ("(flip(), 3)", "'augment' takes crop(size, pad=...), flip(p=0.5) and normalize(mean, std)", 22),
        ("relu", "'augment' takes crop(size, pad=...)", 13),
        ('normalize("a", 1)', "argument 'mean' of normalize must be a number or a tuple of numbers", 23),
    ],
)
def test_augment_errors_are_located(text: str, message: str, col: int) -> None:
    out = error_text(NET % text)
    assert message in out and f"t.ddsl:9:{col}:" in out, out


def test_the_step_names_stay_free() -> None:
    """crop, flip and normalize are names of the augment entry only: a network may define its own."""
    text = NET.replace("layer fc", "tensor flip(x[B, C]) -> [B, C] = x[B, C]\nlayer fc") % "(flip, crop((8, 6)))"
    assert config_of(text).augment[0][0] == "flip"


def config_of(text: str):  # noqa: ANN201
    c = compile_text(text)
    assert c.program is not None
    return c.program.train


def test_augment_needs_an_image_input() -> None:
    text = "network T\nconst N = 4\ninput x : [N, 12]\nlabel y : [N] classes 3\nlayer fc = full(3)\n"
    text += "loss = softmax_cross_entropy(fc(x), y)\ntrain {\n  augment = flip()\n}\n"
    out = error_text(text)
    assert "'augment' needs an image input [N, C, H, W]" in out and "t.ddsl:8:13:" in out


def test_augment_by_hand() -> None:
    x = np.arange(2 * 1 * 3 * 4, dtype=np.float32).reshape(2, 1, 3, 4)
    steps = (("crop", (("size", (3, 4)), ("pad", (1, 1)))),)
    out = augment(x, steps, 10, 3, train=True)
    from deepdsl.initializers import splitmix64_array, stream_seed

    for k in range(2):
        raw = splitmix64_array(stream_seed(f"augment/{10 + k}", 3), 2)
        dy, dx = int(raw[0] % np.uint64(3)), int(raw[1] % np.uint64(3))
        padded = np.pad(x[k, 0], 1)
        np.testing.assert_array_equal(out[k, 0], padded[dy : dy + 3, dx : dx + 4])
    np.testing.assert_array_equal(augment(x, steps, 10, 3, train=False), x)  # no crop on test batches
    flipped = augment(x, (("flip", (("p", 1.0),)),), 0, 1, train=True)
    np.testing.assert_array_equal(flipped, x[..., ::-1])
    assert np.array_equal(augment(x, (("flip", (("p", 0.0),)),), 0, 1, train=True), x)
    norm = augment(x, (("normalize", (("mean", (1.5,)), ("std", (0.5,)))),), 0, 1, train=False)
    np.testing.assert_array_equal(norm, (x - np.float32(1.5)) / np.float32(0.5))


def test_top5_and_mae_against_predictions(cli, tmp_path: Path) -> None:
    """The metrics of `eval --json` recomputed from `predict --split test` and the test labels."""
    from deepdsl.data.named import Field, load_samples

    mlp = str(ROOT / "networks" / "mlp.ddsl")
    saved = tmp_path / "m.npz"
    sets = ["--set", "N=16"]
    r = cli("run", mlp, *sets, "--data", "synthetic", "--iters", "3", "--save", str(saved), "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = cli("eval", mlp, *sets, "--data", "synthetic", "--load", str(saved), "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    out = tmp_path / "p.npz"
    r = cli("predict", mlp, *sets, "--data", "synthetic", "--load", str(saved), "--device", "cpu", "-o", str(out))
    assert r.exit_code == 0 and "(the test split)" in r.stdout, r.output
    scores = np.load(out)["predict"]
    y = load_samples("synthetic", {}, (Field("x", "input", (1, 28, 28)), Field("y", "label", (), 10)), 1).test
    assert y is not None and len(scores) == len(y["y"]) == 256
    top5 = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    want = np.mean([label in row for label, row in zip(y["y"], top5)])
    assert got["test_top5_accuracy"] == pytest.approx(want) and got["test_top5_accuracy"] >= got["test_accuracy"]
    assert got["test_accuracy"] == pytest.approx(np.mean(np.argmax(scores, axis=1) == y["y"]))

    reg = str(ROOT / "networks" / "regression.ddsl")
    saved = tmp_path / "r.npz"
    r = cli("run", reg, *sets, "--iters", "3", "--save", str(saved), "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    mae = json.loads(r.stdout)["test_mae"]
    r = cli("predict", reg, *sets, "--load", str(saved), "--device", "cpu", "-o", str(out), "--split", "test")
    assert r.exit_code == 0, r.output
    s = load_samples("synthetic", {}, (Field("x", "input", (64,)), Field("t", "input", (4,))), 1).test
    assert s is not None
    assert mae == pytest.approx(np.mean(np.abs(np.load(out)["predict"] - s["t"])), rel=1e-6)


@pytest.mark.parametrize("loss", ["l1(net(x), t)", "huber(net(x), t, delta=0.5)"])
def test_the_tensor_function_losses_report_the_mean_absolute_error(cli, tmp_path: Path, loss: str) -> None:
    # l1 and huber are scalar tensor functions (indexed statements), not ops of their own: still regressions
    text = (ROOT / "networks" / "regression.ddsl").read_text()
    assert "loss    = mse(net(x), t)" in text
    (tmp_path / "r.ddsl").write_text(text.replace("loss    = mse(net(x), t)", f"loss = {loss}"))
    r = cli("run", str(tmp_path / "r.ddsl"), "--set", "N=8", "--iters", "2", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["test_mae"] > 0


def test_predict_split_without_a_test_set(cli, tmp_path: Path) -> None:
    reg = str(ROOT / "networks" / "regression.ddsl")
    saved = tmp_path / "r.npz"
    assert cli("run", reg, "--iters", "0", "--save", str(saved)).exit_code == 0
    np.savez(tmp_path / "x.npz", x=np.zeros((5, 64), np.float32))
    base = ["predict", reg, "--load", str(saved), "--data", f"npz:{tmp_path / 'x.npz'}", "-o", str(tmp_path / "o.npz")]
    r = cli(*base, "--split", "test")
    assert r.exit_code == 1 and "the npz data has no test split to predict (--split train" in r.stderr
    r = cli(*base, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["split"] == "train" and json.loads(r.stdout)["samples"] == 5
    assert cli(*base, "--split", "val").exit_code == 2


def test_image_tabular_example_trains(cli) -> None:
    r = cli("run", str(ROOT / "networks" / "examples" / "image_tabular.ddsl"), "--iters", "20", "--device", "cpu",
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert np.mean(out["losses"][-5:]) < np.mean(out["losses"][:5])
    assert {"test_accuracy", "test_top5_accuracy"} <= set(out)
