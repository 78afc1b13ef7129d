"""The built-ins along axes (slice, chunk, sum, mean, max, expand) in the generated Java program: the example
network networks/examples/axis_ops.ddsl trained by the CPU device gives the NumPy runner's losses, and by the CUDA
device (on the stand-in driver whose kernels are the program's own .cu compiled for the CPU, as
test_java_cuda.py runs it) the CPU device's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import TILED, emulate, fake_driver, kernel_names
from helpers import ROOT
from java_env import JAVA_MARKS, java_json, javac, jcuda_jars

pytestmark = [*JAVA_MARKS, pytest.mark.slow]  # javac, a JVM per device and the kernels built for the CPU

SOURCE = ROOT / "networks" / "examples" / "axis_ops.ddsl"
ITERS = "12"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("axis_ops")
    shutil.copy(SOURCE, folder / "axis_ops.ddsl")
    src = folder / "src"
    r = CliRunner().invoke(cli, ["compile", str(folder / "axis_ops.ddsl"), "-o", str(src), "--ptx", "--arch", "sm_90"])
    assert r.exit_code == 0, r.output
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


def test_the_cpu_device_gives_the_numpy_runners_losses(cli, program: Path) -> None:
    r = cli("run", str(program / "axis_ops.ddsl"), "--iters", ITERS, "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(program / "build", "AxisOps", "--iters", ITERS, "--device", "cpu", cwd=program)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)


@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++")
def test_the_cuda_device_gives_the_cpu_devices_losses(program: Path) -> None:
    unit = (program / "src" / "AxisOps.cu").read_text()
    kernels = kernel_names(unit)
    # the squeeze-excitation product is one kernel, which reads the [N, C, 1, 1] scale in place
    assert "expandMul" in kernels, kernels
    work = program / "AxisOps"
    work.mkdir(exist_ok=True)
    emulate(unit, kernels, work, [k for k in kernels if k not in TILED])
    fake = fake_driver(program / "fake")
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake), "DEEPDSL_FAKE_CUDA_KERNELS": str(work / "emulated.so")}
    cp = f"{program / 'build'}:{program / 'src'}:{jcuda_jars()}/*"
    r = subprocess.run(["java", "-cp", cp, "AxisOps", "--iters", "3", "--device", "cuda", "--json"], cwd=program,
                       capture_output=True, text=True, timeout=600, env=env, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = java_json(program / "build", "AxisOps", "--iters", "3", "--device", "cpu", cwd=program)
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
