"""The losses, loss terms and sampling of issue 34 in the generated Java program: networks/examples/vae.ddsl
(`normal`, a scalar tensor function, `rec + kl`) and a network of the new losses and `uniform`, trained by the Java
program on the CPU device with the NumPy runner's losses, terms and test loss."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT
from java_env import JAVA_MARKS, java, java_json, javac

pytestmark = [*JAVA_MARKS, pytest.mark.slow]  # one javac run of two programs

VAE = ROOT / "networks" / "examples" / "vae.ddsl"
SMALL = ["--set", "N=8", "--set", "D=32", "--set", "H=16", "--set", "Z=4"]
LOSSES = """network Losses
const N = 8
input x : [N, 12]
input t : [N, 4]
label y : [N] classes 4
layer fc1 = full(16)
layer fc2 = full(4)
s = fc2(tanh(fc1(x)) + uniform((N, 16), low=-0.1, high=0.25))
ce = softmax_cross_entropy(s, y, label_smoothing=0.1, weight=(1, 2, 0.5, 1.5))
nl = nll(log_softmax(s), y, weight=(1, 1, 2, 1))
b = bce_with_logits(s, sigmoid(t))
r = huber(s, t, delta=0.5) + l1(s, t)
loss = ce + nl + 0.5 * b + r
predict = s
train { optimizer = sgd(lr=0.05, momentum=0.9) iterations = 6 seed = 3 }
"""


# labels the data may hold as -100 (nll's ignore_index), weighted classes
IGNORED = """network Ignored
const N = 8
input x : [N, 12]
label y : [N] classes 4
layer fc = full(4)
loss = nll(log_softmax(fc(x)), y, weight=(1, 2, 1, 0.5))
predict = fc(x)
train { iterations = 4 seed = 2 }
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("losses")
    (folder / "losses.ddsl").write_text(LOSSES)
    (folder / "ignored.ddsl").write_text(IGNORED)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 16)
    y[::3] = -100
    np.savez(folder / "ignored.npz", x=rng.standard_normal((16, 12)).astype(np.float32), y=y,
             x_test=rng.standard_normal((8, 12)).astype(np.float32), y_test=y[:8])  # fmt: skip
    for file, sets in ((VAE, SMALL), (folder / "losses.ddsl", []), (folder / "ignored.ddsl", [])):
        r = CliRunner().invoke(cli, ["compile", str(file), *sets, "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


@pytest.mark.parametrize("name, cls, sets, terms", [("vae", "VAE", SMALL, ("rec", "kl")),
                                                    ("losses", "Losses", [], ("ce", "nl", "b", "r"))])  # fmt: skip
def test_java_losses_and_terms_equal_the_numpy_runner(cli, programs: Path, name: str, cls: str, sets: list,
                                                      terms: tuple) -> None:  # noqa: ANN001  # fmt: skip
    file = VAE if name == "vae" else programs / "losses.ddsl"
    r = cli("run", str(file), *sets, "--data", "synthetic", "--iters", "5", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", cls, "--iters", "5", "--device", "cpu", "--data", "synthetic", cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert list(got["loss_terms"]) == list(want["loss_terms"]) == list(terms)
    for term in terms:
        np.testing.assert_allclose(got["loss_terms"][term], want["loss_terms"][term], rtol=1e-4, atol=1e-6)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    text = java(programs / "build", cls, "--iters", "2", "--device", "cpu", "--data", "synthetic", cwd=programs)
    assert text.returncode == 0, text.stderr
    assert all(f"  {t} " in text.stdout for t in terms)


@pytest.fixture(scope="module")
def cuda_programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The VAE and the losses network compiled with --ptx, their kernels built for the CPU (cuda_emulator.py) and
    the stand-in driver, as tests/backends/test_java_cuda.py runs the CUDA device without a GPU."""
    import shutil

    from click.testing import CliRunner
    from cuda_emulator import TILED, emulate, fake_driver, kernel_names

    from deepdsl.cli import cli

    if shutil.which("g++") is None or shutil.which("gcc") is None:
        pytest.skip("no gcc/g++")
    folder = tmp_path_factory.mktemp("losses_cuda")
    (folder / "losses.ddsl").write_text(LOSSES)
    src = folder / "src"
    for file, sets, cls in ((VAE, SMALL, "VAE"), (folder / "losses.ddsl", [], "Losses")):
        r = CliRunner().invoke(cli, ["compile", str(file), *sets, "-o", str(src), "--ptx", "--arch", "sm_90"])
        assert r.exit_code == 0, r.output
        unit = (src / f"{cls}.cu").read_text()
        kernels = kernel_names(unit)
        (folder / cls).mkdir()
        emulate(unit, kernels, folder / cls, [k for k in kernels if k not in TILED])
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    fake_driver(folder / "fake")
    return folder


@pytest.mark.parametrize("cls", ["VAE", "Losses"])
def test_the_cuda_device_draws_and_reports_as_the_cpu_device(cuda_programs: Path, cls: str) -> None:
    import os
    import subprocess

    from java_env import jcuda_jars

    folder = cuda_programs
    env = {**os.environ, "LD_LIBRARY_PATH": str(folder / "fake"),
           "DEEPDSL_FAKE_CUDA_KERNELS": str(folder / cls / "emulated.so")}  # fmt: skip
    cp = f"{folder / 'build'}:{folder / 'src'}:{jcuda_jars()}/*"
    args = ["--iters", "3", "--data", "synthetic", "--json"]
    r = subprocess.run(["java", "-cp", cp, cls, *args, "--device", "cuda"], cwd=folder, capture_output=True,
                       text=True, timeout=600, env=env, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = java_json(folder / "build", cls, *args[:-1], "--device", "cpu", cwd=folder)
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    for term, values in want["loss_terms"].items():
        np.testing.assert_allclose(got["loss_terms"][term], values, rtol=1e-4, atol=1e-6)


def test_the_java_program_accepts_ignored_labels_as_the_numpy_runner(cli, programs: Path) -> None:  # noqa: ANN001
    data = ["--data", f"npz:{programs / 'ignored.npz'}"]
    r = cli("run", str(programs / "ignored.ddsl"), *data, "--iters", "4", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", "Ignored", "--iters", "4", "--device", "cpu", *data, cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    bad = programs / "bad.npz"
    with np.load(programs / "ignored.npz") as z:
        arrays = dict(z)
    arrays["y"][1] = -7
    np.savez(bad, **arrays)
    j = java(programs / "build", "Ignored", "--iters", "1", "--data", f"npz:{bad}", cwd=programs)
    assert j.returncode == 1 and "label -7 of sample 1 is outside [0, 4)" in j.stderr
