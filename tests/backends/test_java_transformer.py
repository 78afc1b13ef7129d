"""The Transformer built-ins in the generated Java program: causal multi-head attention (matmul, permute, reshape,
the fused masked softmax), networks/vit_tiny.ddsl and networks/gpt_tiny.ddsl on a text (both slow) give the NumPy
runner's losses on the Java CPU device."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT
from java_env import JAVA_MARKS, java_json, javac
from sequence_nets import story
from transformer_nets import causal_attention

pytestmark = JAVA_MARKS

GPT_TINY = (ROOT / "networks" / "gpt_tiny.ddsl").read_text()
# class -> (source text, --set, iterations, --data: synthetic, or text:story.txt that the test writes beside it)
PROGRAMS = {
    "Causal": (causal_attention(), [], 6, "synthetic"),
    "ViTTiny": ((ROOT / "networks" / "vit_tiny.ddsl").read_text(), ["--set", "N=2"], 4, "synthetic"),
    "GPTTiny": (GPT_TINY, ["--set", "N=2", "--set", "T=32"], 4, "text:story.txt"),
}


def _program(folder: Path, name: str) -> Path:
    """Program `name` of PROGRAMS compiled to Java in folder/name/ and built by javac into its build/."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    text, sets, _, _ = PROGRAMS[name]
    (folder / f"{name}.ddsl").write_text(text)
    (folder / "story.txt").write_text(story(), encoding="utf-8")
    src = folder / "src"
    r = CliRunner().invoke(cli, ["compile", str(folder / f"{name}.ddsl"), *sets, "-o", str(src)])
    assert r.exit_code == 0, r.output
    javac(src, [src / f"{name}.java", *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


@pytest.mark.parametrize(
    "name", ["Causal", pytest.param("ViTTiny", marks=pytest.mark.slow), pytest.param("GPTTiny", marks=pytest.mark.slow)]
)
def test_losses_equal_the_numpy_runner(cli, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    folder = _program(tmp_path, name)
    _, sets, iters, data = PROGRAMS[name]
    monkeypatch.chdir(folder)  # text:story.txt is read from here by both
    r = cli("run", str(folder / f"{name}.ddsl"), *sets, "--data", data, "--iters", str(iters), "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(folder / "build", name, "--data", data, "--device", "cpu", "--iters", str(iters),
                    cwd=folder)  # fmt: skip
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert "maskedSoftmax" in (folder / "src" / f"{name}.java").read_text()
