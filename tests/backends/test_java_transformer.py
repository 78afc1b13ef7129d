"""The Transformer built-ins in the generated Java program: causal multi-head attention (matmul, permute, reshape,
the fused masked softmax) gives the NumPy runner's losses on the Java CPU device."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from java_env import JAVA_MARKS, java_json, javac
from transformer_nets import causal_attention

pytestmark = JAVA_MARKS

# (class, source text, --set)
PROGRAMS = {"Causal": (causal_attention(), [])}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every program of PROGRAMS compiled to Java, all of it by one javac run into build/."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("java")
    for name, (text, sets) in PROGRAMS.items():
        (folder / f"{name}.ddsl").write_text(text)
        r = CliRunner().invoke(cli, ["compile", str(folder / f"{name}.ddsl"), *sets, "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_losses_equal_the_numpy_runner(cli, programs: Path, name: str) -> None:  # noqa: ANN001
    _, sets = PROGRAMS[name]
    r = cli("run", str(programs / f"{name}.ddsl"), *sets, "--data", "synthetic", "--iters", "6", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", name, "--data", "synthetic", "--device", "cpu", "--iters", "6", cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert "maskedSoftmax" in (programs / "src" / f"{name}.java").read_text()
