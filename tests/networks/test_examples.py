"""Every network under networks/examples/ (what practitioners write: a CIFAR ResNet, a U-Net, a Transformer
classifier, a siamese pair, an LSTM, a VAE, ...) checks, trains with its loss falling on the NumPy runner, and,
compiled to Java (`pytest -m slow`), gives the NumPy runner's losses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "tests" / "backends"))  # java_env

EXAMPLES = sorted((ROOT / "networks" / "examples").glob("*.ddsl"))
SMALLER = ["--set", "N=4"]  # every example names its batch N
STEPS = 12


def test_the_examples_are_there() -> None:
    # the everyday networks the issue on language breadth names, each written without workarounds
    names = {p.stem for p in EXAMPLES}
    assert {"cifar_resnet", "unet", "transformer_classifier", "siamese", "dcgan_generator", "lstm_classifier", "vae",
            "audio_1d", "groupnorm_swish", "image_tabular", "finetune"} <= names, names  # fmt: skip


HEAVY = {"cifar_resnet", "unet", "dcgan_generator"}  # their 12 NumPy steps take 10-20 s each: the slow tier's


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_checks(cli, path: Path) -> None:
    r = cli("check", str(path), "--layers")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.stem in HEAVY else p for p in EXAMPLES],
    ids=[p.stem for p in EXAMPLES],
)
def test_example_loss_falls(cli, path: Path) -> None:
    r = cli("run", str(path), *SMALLER, "--data", "synthetic", "--iters", str(STEPS), "--json")
    assert r.exit_code == 0, r.output
    losses = json.loads(r.stdout)["losses"]
    assert len(losses) == STEPS and np.isfinite(losses).all(), losses
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses


@pytest.mark.slow
@pytest.mark.java
def test_examples_in_java_give_the_numpy_runners_losses(cli, tmp_path: Path) -> None:
    from java_env import java_json, javac

    classes = {}
    for path in EXAMPLES:
        r = cli("compile", str(path), *SMALLER, "-o", str(tmp_path / "src"))
        assert r.exit_code == 0, r.output
        classes[path] = next(line.split()[1] for line in path.read_text().splitlines() if line.startswith("network "))
    src = tmp_path / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], tmp_path / "build")
    for path, name in classes.items():
        r = cli("run", str(path), *SMALLER, "--data", "synthetic", "--iters", "4", "--json")
        assert r.exit_code == 0, r.output
        want = json.loads(r.stdout)["losses"]
        got = java_json(
            tmp_path / "build", name, "--data", "synthetic", "--device", "cpu", "--iters", "4", cwd=tmp_path
        )
        np.testing.assert_allclose(got["losses"], want, rtol=2e-4, err_msg=path.stem)
