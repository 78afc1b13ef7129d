"""The tied head of networks/examples/tied_lm.ddsl (`full(tied=tok)`) in the other backends: in the generated Java
program the table `tok.W` is one field, updated once, saved once, and the program's losses and trained table are the
NumPy runner's; the GPU runner (its CUDA kernels run on the CPU by cuda_emulator.py) gives the NumPy runner's
losses. No kernel is new: the head is a GEMM of the table, its gradient added to the embedding's scatter-add."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver
from helpers import ROOT
from java_env import JAVA_MARKS, java_json, javac

from deepdsl import api
from deepdsl.running import run_training

pytestmark = pytest.mark.slow  # a javac run and two short trainings; g++ building the kernels: about 10 s each

EXAMPLE = ROOT / "networks" / "examples" / "tied_lm.ddsl"


def _java(test):  # noqa: ANN001, ANN202
    for mark in JAVA_MARKS:
        test = mark(test)
    return test


@_java
def test_the_java_program_declares_updates_and_saves_the_table_once(cli, tmp_path: Path) -> None:  # noqa: ANN001
    src = tmp_path / "src"
    r = cli("compile", str(EXAMPLE), "-o", str(src))
    assert r.exit_code == 0, r.output
    java = (src / "TiedLM.java").read_text()
    assert java.count('param("tok.W"') == 1 and "head_W " not in java
    assert java.count("tok_W_m, tok_W_v, tok_W,") == 1  # Adam's one update of the table
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], tmp_path / "build")
    r = cli("run", str(EXAMPLE), "--iters", "6", "--json", "--save", str(tmp_path / "numpy.npz"))
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(tmp_path / "build", "TiedLM", "--iters", "6", "--device", "cpu", "--save",
                    str(tmp_path / "java.npz"), cwd=tmp_path)  # fmt: skip
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    saved = [np.load(tmp_path / f) for f in ("numpy.npz", "java.npz")]
    assert all([k for k in s.files if k.startswith("tok")] == ["tok.W"] for s in saved)
    assert not any(k.startswith("head") for s in saved for k in s.files)
    np.testing.assert_allclose(saved[1]["tok.W"], saved[0]["tok.W"], rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")
def test_the_gpu_runner_gives_the_numpy_runners_losses(tmp_path: Path) -> None:
    build = api.build(api.compile_file(EXAMPLE, {"N": 4}).program)
    want = run_training(build, iters=3, data_flag="synthetic", device="cpu")
    driver = EmulatedDriver(tmp_path)
    got = run_training(build, iters=3, data_flag="synthetic", device="cpu", driver=driver)
    assert got["device"] == "cuda" and driver.launches > 0
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
