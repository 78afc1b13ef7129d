"""Issue 34's built-ins in the generated Java program: the groupnorm_swish example (group_norm, silu, adaptive
pooling with overlapping windows) and a network of the rest (instance_norm, hard_swish, relu6, batch_norm on
[N, C, L], `full` on [N, C, L], clip, hard_sigmoid, adaptive pooling along H alone) train on the CPU device with
the NumPy runner's losses and the bytes memcheck plans, and on the CUDA device (the stand-in driver whose kernels are
the program's own .cu compiled for the CPU, as tests/backends/test_java_cuda.py runs it) with the CPU device's."""

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

pytestmark = [
    *JAVA_MARKS,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++"),
]

ACTS = """network Acts

const N = 4

input x : [N, 3, 6, 6]
label y : [N] classes 5

layer cv = conv(6, kernel=3, pad=1)
layer inn = instance_norm(affine=true)
layer bn = batch_norm
layer seq = full(8)
layer fc = full(5)

def body(x) {
  a = relu6(hard_swish(inn(cv(x))))
  b = bn(reshape(a, (N, 6, 36)))
  c = hard_sigmoid(clip(seq(b), -1, 2))
  return fc(flatten(adaptive_avg_pool(reshape(c, (N, 6, 4, 2)), (3, 2))))
}

loss = softmax_cross_entropy(body(x), y)
predict = body(x)

train { optimizer = sgd(lr=0.05, momentum=0.9) iterations = 10 seed = 1 }
"""
NETWORKS = {"GroupNormSwish": "groupnorm_swish.ddsl", "Acts": "acts.ddsl"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("java_norms")
    (folder / "acts.ddsl").write_text(ACTS)
    shutil.copy(ROOT / "networks" / "examples" / "groupnorm_swish.ddsl", folder)
    src = folder / "src"
    for name, source in NETWORKS.items():
        r = CliRunner().invoke(cli, ["compile", str(folder / source), "-o", str(src), "--ptx", "--arch", "sm_90"])
        assert r.exit_code == 0, r.output
        unit = (src / f"{name}.cu").read_text()
        kernels = kernel_names(unit)
        (folder / name).mkdir()
        emulate(unit, kernels, folder / name, [k for k in kernels if k not in TILED])
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    fake_driver(folder / "fake")
    return folder


@pytest.mark.parametrize("name", list(NETWORKS))
def test_the_cpu_device_trains_as_the_numpy_runner_in_the_planned_bytes(cli, programs: Path, name: str) -> None:  # noqa: ANN001
    source = str(programs / NETWORKS[name])
    r = cli("run", source, "--data", "synthetic", "--iters", "5", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", name, "--data", "synthetic", "--device", "cpu", "--iters", "5", cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    plan = json.loads(cli("memcheck", source, "--json").stdout)
    assert (got["peak_bytes"], got["arena_bytes"]) == (want["peak_bytes"], want["arena_bytes"])
    assert (want["peak_bytes"], want["arena_bytes"]) == (plan["peak_bytes"], plan["arena_bytes"])


@pytest.mark.parametrize("name", list(NETWORKS))
def test_the_cuda_device_gives_the_cpu_devices_losses(programs: Path, name: str) -> None:
    env = {**os.environ, "LD_LIBRARY_PATH": str(programs / "fake"),
           "DEEPDSL_FAKE_CUDA_KERNELS": str(programs / name / "emulated.so")}  # fmt: skip
    cp = f"{programs / 'build'}:{programs / 'src'}:{jcuda_jars()}/*"
    cmd = ["java", "-cp", cp, name, "--data", "synthetic", "--iters", "3", "--device", "cuda", "--json"]
    r = subprocess.run(cmd, cwd=programs, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = java_json(programs / "build", name, "--data", "synthetic", "--device", "cpu", "--iters", "3", cwd=programs)
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
