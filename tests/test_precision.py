"""`precision = fp32 | tf32 | bf16` (the train block) and `--precision` (run, memcheck, compile): parsed, checked,
said on the device line and in every --json; tf32 on the NumPy runner runs as fp32 and says so."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from deepdsl import api
from deepdsl.cli import cli
from deepdsl.errors import DslError
from deepdsl.running import run_training

NET = """network P
const N = 4
input x : [N, 6]
label y : [N] classes 3
layer fc = full(3)
loss = softmax_cross_entropy(fc(x), y)
predict = fc(x)
train {{
  data = synthetic(seed=2)
  optimizer = sgd(lr=0.1)
  iterations = 2
  {extra}
}}
"""


def _program(extra: str = ""):  # noqa: ANN202
    return api.compile_source(NET.format(extra=extra), "p.ddsl").program


@pytest.mark.parametrize("written", ["bf16", '"bf16"'])
def test_the_train_block_names_a_precision(written: str) -> None:
    assert _program(f"precision = {written}").train.precision == "bf16"
    assert _program().train.precision == "fp32"
    assert api.build(_program("precision = tf32")).precision == "tf32"
    assert api.build(_program("precision = tf32"), api.Options(precision="fp32")).precision == "fp32"  # the flag wins


def test_an_unknown_precision_is_a_diagnostic_with_a_hint() -> None:
    with pytest.raises(DslError) as err:
        _program("precision = bf61")
    assert "'precision' must be one of fp32, tf32, bf16, got 'bf61'" in err.value.message
    assert err.value.hint == "did you mean 'bf16'?"
    with pytest.raises(DslError, match="got an expression"):
        _program("precision = 1 + 2")


def test_tf32_on_the_numpy_runner_runs_fp32_and_says_so() -> None:
    lines: list[str] = []
    got = run_training(api.build(_program("precision = tf32")), iters=1, device="cpu", report=lines.append)
    assert got["precision"] == "fp32" and "no TF32 math" in got["precision_note"]
    assert lines[0].endswith("precision fp32 (tf32 asked: the NumPy runner has no TF32 math and runs it as fp32)")
    plain = run_training(api.build(_program()), iters=1, device="cpu")
    assert plain["precision"] == "fp32" and "precision_note" not in plain
    assert got["losses"] == plain["losses"]  # what ran is fp32: the same numbers


def test_the_cli_flag_reaches_run_and_memcheck(tmp_path) -> None:  # noqa: ANN001
    net = tmp_path / "p.ddsl"
    net.write_text(NET.format(extra=""))
    r = CliRunner().invoke(cli, ["run", str(net), "--precision", "tf32", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["precision"] == "fp32" and "precision_note" in json.loads(r.output)
    m = CliRunner().invoke(cli, ["memcheck", str(net), "--json", "--precision", "bf16"])
    assert m.exit_code == 0, m.output
    assert json.loads(m.output)["precision"] == "bf16"
    bad = CliRunner().invoke(cli, ["run", str(net), "--precision", "fp16"])
    assert bad.exit_code == 2 and "'fp16' is not one of 'fp32', 'tf32', 'bf16'" in bad.output
