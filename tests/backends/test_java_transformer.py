"""The Transformer built-ins in the generated Java program: causal multi-head attention (matmul, permute, reshape,
the fused masked softmax) and networks/vit_tiny.ddsl (slow) give the NumPy runner's losses on the Java CPU
device."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from java_env import JAVA_MARKS, java_json, javac
from transformer_nets import causal_attention

pytestmark = JAVA_MARKS

# class -> (source text, --set, iterations)
PROGRAMS = {
    "Causal": (causal_attention(), [], 6),
    "ViTTiny": ((ROOT / "networks" / "vit_tiny.ddsl").read_text(), ["--set", "N=2"], 4),
}


def _program(folder: Path, name: str) -> Path:
    """Program `name` of PROGRAMS compiled to Java in folder/name/ and built by javac into its build/."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    text, sets, _ = PROGRAMS[name]
    (folder / f"{name}.ddsl").write_text(text)
    src = folder / "src"
    r = CliRunner().invoke(cli, ["compile", str(folder / f"{name}.ddsl"), *sets, "-o", str(src)])
    assert r.exit_code == 0, r.output
    javac(src, [src / f"{name}.java", *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


@pytest.mark.parametrize("name", ["Causal", pytest.param("ViTTiny", marks=pytest.mark.slow)])
def test_losses_equal_the_numpy_runner(cli, tmp_path: Path, name: str) -> None:  # noqa: ANN001
    folder = _program(tmp_path, name)
    _, sets, iters = PROGRAMS[name]
    r = cli("run", str(folder / f"{name}.ddsl"), *sets, "--data", "synthetic", "--iters", str(iters), "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(folder / "build", name, "--data", "synthetic", "--device", "cpu", "--iters", str(iters),
                    cwd=folder)  # fmt: skip
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert "maskedSoftmax" in (folder / "src" / f"{name}.java").read_text()
