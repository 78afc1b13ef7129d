"""lstm and gru in the generated Java program: networks/examples/lstm_classifier.ddsl (an LSTM feeding a GRU) and
a GRU without biases that returns every step of 20 (sliced out of blocks of 5) into an LSTM, trained a few steps
on the CPU device, give the NumPy runner's losses; memcheck plans the example."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT
from java_env import JAVA_MARKS, java_json, javac

pytestmark = [*JAVA_MARKS, pytest.mark.slow]  # one javac run of two programs (about 15 s)

EXAMPLE = ROOT / "networks" / "examples" / "lstm_classifier.ddsl"
GRU_SEQ = """network GruSeq
const N = 4
input x : [N, 20, 3]
input t : [N, 20, 2]
layer g = gru(6, bias=false)
layer l = lstm(2)
loss = mse(l(g(x)), t)
predict = l(g(x))
train { optimizer = sgd(lr=0.5, momentum=0.9) }
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("recurrent")
    (folder / "gru_seq.ddsl").write_text(GRU_SEQ)
    for path in (EXAMPLE, folder / "gru_seq.ddsl"):
        r = CliRunner().invoke(cli, ["compile", str(path), "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


@pytest.mark.parametrize("path, cls", [(EXAMPLE, "LstmClassifier"), (None, "GruSeq")])
def test_losses_equal_the_numpy_runner(cli, programs: Path, path: Path | None, cls: str) -> None:
    path = path or programs / "gru_seq.ddsl"
    r = cli("run", str(path), "--iters", "10", "--data", "synthetic", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", cls, "--iters", "10", "--device", "cpu", "--data", "synthetic", cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert want["losses"][-1] < want["losses"][0]  # it learns


def test_memcheck_plans_the_example(cli) -> None:
    r = cli("memcheck", str(EXAMPLE))
    assert r.exit_code == 0, r.output
    assert "rnn2" in r.output and "peak" in r.output
