"""The CUDA kernels of lstm and gru (the gates' `indexed` statements and their gradients, the slices of the input
projection, the concat of the steps), run on the CPU by the emulator of cuda_emulator.py through the GPU runner:
the NumPy runner's losses on networks/examples/lstm_classifier.ddsl."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver
from helpers import ROOT

from deepdsl import api
from deepdsl.running import run_training

pytestmark = [
    pytest.mark.slow,  # g++ builds the program's kernels
    pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU"),
]


def test_the_gpu_runner_gives_the_numpy_runners_losses(tmp_path: Path) -> None:
    path = ROOT / "networks" / "examples" / "lstm_classifier.ddsl"
    build = api.build(api.compile_file(path, {"N": 4, "H": 8}).program)
    want = run_training(build, iters=3, data_flag="synthetic", device="cpu")
    driver = EmulatedDriver(tmp_path)
    got = run_training(build, iters=3, data_flag="synthetic", device="cpu", driver=driver)
    assert got["device"] == "cuda" and driver.launches > 0
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
