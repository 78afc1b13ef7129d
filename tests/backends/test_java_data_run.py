"""Image folders, CSV files, augmentation, the test metrics and `predict --split` through `deepdsl run` and the
generated Java program (which loads each batch on a background thread): the same losses, metrics and predictions.
Also checks networks/examples/image_tabular.ddsl on CSV data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT
from java_env import JAVA_MARKS, java, java_json, javac

pytestmark = [*JAVA_MARKS, pytest.mark.slow]  # one javac run of three programs

IMAGES = """network Pictures
const N = 4
input x : [N, 3, 6, 7]
label y : [N] classes 7
layer cv = conv(4, kernel=3, pad=1)
layer fc = full(7)
net = fc o flatten o relu o cv
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train {
  data = images("pics")
  optimizer = sgd(lr=0.05, momentum=0.9)
  iterations = 9
  shuffle = true
  seed = 5
  augment = (flip(p=0.5), crop((6, 7), pad=(1, 2)), normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)))
}
"""


def pngs(root: Path) -> None:
    image = pytest.importorskip("PIL.Image", reason="the images extra (Pillow) is not installed")
    rng = np.random.default_rng(4)
    for split, count in (("train", 3), ("test", 2)):
        for c in range(7):
            (root / split / f"class{c}").mkdir(parents=True)
            for k in range(count):
                px = rng.integers(0, 256, size=(6, 7, 3), dtype=np.uint8)
                px[:, :, c % 3] //= 4  # something to learn
                image.fromarray(px).save(root / split / f"class{c}" / f"{k}.png")


def example_csv(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    header = [f"img{k}" for k in range(192)] + [f"feat{k}" for k in range(6)] + ["y"]
    lines = [",".join(header)]
    for r in range(rows):
        y = r % 10
        img = np.round(rng.random(192) * 0.5 + 0.05 * y, 4)
        feat = np.round(rng.normal(size=6) + (np.arange(6) == y % 6), 4)
        lines.append(",".join([*map(str, img), *map(str, feat), str(y)]))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("data_run")
    pngs(folder / "pics")
    (folder / "pictures.ddsl").write_text(IMAGES)
    example_csv(folder / "tab.csv", 40, 1)
    example_csv(folder / "tab_test.csv", 20, 2)
    sources = {"pictures": folder / "pictures.ddsl", "example": ROOT / "networks" / "examples" / "image_tabular.ddsl",
               "regression": ROOT / "networks" / "regression.ddsl"}  # fmt: skip
    for source in sources.values():
        r = CliRunner().invoke(cli, ["compile", str(source), "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    javac(folder, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


def test_images_with_augmentation_train_alike(cli, programs: Path) -> None:
    r = cli("run", str(programs / "pictures.ddsl"), "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", "Pictures", "--device", "cpu", cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-5)
    assert got["test_accuracy"] == want["test_accuracy"] and got["test_top5_accuracy"] == want["test_top5_accuracy"]
    again = java_json(programs / "build", "Pictures", "--device", "cpu", cwd=programs)
    assert again["losses"] == got["losses"]  # the background loading is deterministic


def test_the_augmentation_changes_the_batches(cli, programs: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.ddsl"
    plain.write_text(IMAGES.replace("  augment = (flip(p=0.5), crop((6, 7), pad=(1, 2)), normalize(", "  # (")
                     .replace('data = images("pics")', f'data = images("{programs / "pics"}")'))  # fmt: skip
    a = cli("run", str(plain), "--device", "cpu", "--json")
    b = cli("run", str(programs / "pictures.ddsl"), "--device", "cpu", "--json")
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert json.loads(a.stdout)["losses"][1:] != json.loads(b.stdout)["losses"][1:]


def test_predict_split(cli, programs: Path, tmp_path: Path) -> None:
    saved = tmp_path / "p.npz"
    r = cli("run", str(programs / "pictures.ddsl"), "--device", "cpu", "--save", str(saved))
    assert r.exit_code == 0, r.output
    for split, count in (("test", 14), ("train", 21)):
        out = tmp_path / f"{split}.npz"
        r = cli("predict", str(programs / "pictures.ddsl"), "--load", str(saved), "--device", "cpu", "-o", str(out),
                "--split", split, "--json")  # fmt: skip
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["split"] == split and json.loads(r.stdout)["samples"] == count
        jout = tmp_path / f"j{split}.npz"
        j = java(programs / "build", "Pictures", "--predict", str(jout), "--load", str(saved), "--data",
                 f"images:{programs / 'pics'}", "--split", split, "--device", "cpu", cwd=programs)  # fmt: skip
        assert j.returncode == 0, j.stderr
        assert f"(the {split} split)" in j.stdout
        np.testing.assert_allclose(np.load(jout)["predict"], np.load(out)["predict"], rtol=1e-5, atol=1e-6)
    bad = java(programs / "build", "Pictures", "--split", "test", cwd=programs)
    assert bad.returncode == 2 and "--split takes --predict OUT.npz" in bad.stderr
    bad = java(programs / "build", "Pictures", "--predict", "o.npz", "--load", str(saved), "--data", "synthetic",
               "--split", "val", cwd=programs)  # fmt: skip
    assert bad.returncode == 2 and "--split takes test or train, not 'val'" in bad.stderr
    default = tmp_path / "default.npz"
    r = cli("predict", str(programs / "pictures.ddsl"), "--load", str(saved), "--device", "cpu", "-o", str(default))
    assert r.exit_code == 0 and "(the test split)" in r.stdout
    np.testing.assert_array_equal(np.load(default)["predict"], np.load(tmp_path / "test.npz")["predict"])


def test_example_on_csv_data(cli, programs: Path) -> None:
    example = str(ROOT / "networks" / "examples" / "image_tabular.ddsl")
    flags = ["--data", f"csv:{programs / 'tab.csv'}", "--iters", "12"]
    r = cli("run", example, *flags, "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", "ImageTabular", *flags, "--device", "cpu", cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
    for key in ("test_loss", "test_accuracy", "test_top5_accuracy"):
        assert got[key] == pytest.approx(want[key], rel=1e-5), key
    assert want["losses"][-1] < want["losses"][0]


def test_regression_mae(cli, programs: Path) -> None:
    net = str(ROOT / "networks" / "regression.ddsl")
    r = cli("run", net, "--iters", "5", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", "Regression", "--iters", "5", "--device", "cpu", cwd=programs)
    assert got["test_mae"] == pytest.approx(want["test_mae"], rel=1e-5)
    assert "test_accuracy" not in got and "test_top5_accuracy" not in got
