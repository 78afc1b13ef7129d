"""The CUDA kernels of the token and image ops (embedding and its scatter-add, the per-position loss, the
transposed convolution, upsampling, divided indices), run on the CPU by the emulator of cuda_emulator.py through
the GPU runner: the NumPy runner's losses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver
from sequence_nets import BIGRAM, CLASSIFIER, DIVIDED, IMAGES, story

from deepdsl import api
from deepdsl.running import run_training

pytestmark = [
    pytest.mark.slow,  # g++ builds each program's kernels (about 10 s each)
    pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU"),
]


@pytest.mark.parametrize("name", ["bigram", "classifier", "images", "divided"])
def test_the_gpu_runner_gives_the_numpy_runners_losses(name: str, tmp_path: Path) -> None:
    text = {"bigram": BIGRAM, "classifier": CLASSIFIER, "images": IMAGES, "divided": DIVIDED}[name]
    (tmp_path / "story.txt").write_text(story())
    build = api.build(api.compile_source(text, str(tmp_path / f"{name}.ddsl")).program)
    data = None if name == "bigram" else "synthetic"
    want = run_training(build, iters=3, data_flag=data, device="cpu")
    driver = EmulatedDriver(tmp_path)
    got = run_training(build, iters=3, data_flag=data, device="cpu", driver=driver)
    assert got["device"] == "cuda" and driver.launches > 0
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
