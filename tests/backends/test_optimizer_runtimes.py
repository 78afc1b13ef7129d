"""AdamW, RMSprop and Nesterov SGD, `freeze` and `lr_mult` in every runtime: the GPU runner (its kernels compiled
for the CPU) and the generated Java program (its CPU device, and its CUDA device on the stand-in driver) give the
NumPy runner's losses, and the Java program's --alpha sets RMSprop's smoothing constant as `deepdsl run --alpha`
does."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import TILED, EmulatedDriver, emulate, fake_driver, kernel_names
from java_env import JAVA_MARKS, java_json, javac, jcuda_jars

from deepdsl import api
from deepdsl.running import run_training

NET = """network NAME
input x : [8, 2, 6, 6]
label y : [8] classes 4
layer cv = conv(4, kernel=3)
layer bn = batch_norm()
layer h = full(8)
layer fc = full(4)
net = fc o relu o h o flatten o relu o bn o cv
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train {
  data = synthetic(seed=2)
  iterations = 6
  TRAIN
}
"""
# class -> the train block's settings: each optimizer, a schedule, freeze and lr_mult
CASES = {
    "AdamW": "optimizer = adamw(lr=0.01, weight_decay=0.05)",
    "RmsMomentum": "optimizer = rmsprop(momentum=0.8, weight_decay=0.01)\n  lr = warmup(cosine(0.01), steps=2)",
    "RmsFrozen": 'optimizer = rmsprop(lr=0.005)\n  freeze = ("cv", "bn.gamma")\n  lr_mult = (("h", 4), ("fc.b", 0))',
    "Nesterov": 'optimizer = sgd(lr=0.05, momentum=0.9, weight_decay=0.001, nesterov=true)\n  lr_mult = ("cv", 0.5)',
    # fine-tunes from a file Nesterov saved: its momentum state of cv is skipped
    "NesterovFrozen": 'optimizer = sgd(lr=0.05, momentum=0.9, weight_decay=0.001, nesterov=true)\n  freeze = "cv"',
}


def _text(name: str) -> str:
    return NET.replace("NAME", name).replace("TRAIN", CASES[name])


def _numpy(name: str, *flags: str) -> dict:
    program = api.compile_source(_text(name), f"{name}.ddsl").program
    if flags:
        from deepdsl.run_settings import with_settings

        program = with_settings(program, {flags[0].removeprefix("--"): float(flags[1])})
    return run_training(api.build(program), device="cpu", data_flag="synthetic")


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")
@pytest.mark.parametrize(  # NesterovFrozen slow for the default's 4 minutes: RmsFrozen keeps frozen tensors there
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "NesterovFrozen" else n for n in CASES]
)
def test_the_gpu_runner_gives_the_numpy_runners_losses(name: str, tmp_path: Path) -> None:
    build = api.build(api.compile_source(_text(name), f"{name}.ddsl").program)
    want = run_training(build, device="cpu", data_flag="synthetic")
    got = run_training(build, device="cpu", data_flag="synthetic", driver=EmulatedDriver(tmp_path / "gpu"))
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert want["losses"][-1] != pytest.approx(want["losses"][0])


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case compiled and built by one javac. The PTX the CUDA device loads is compiled by the test that runs
    it (`_with_ptx`): NVRTC takes a second a program, and the default suite runs one of them on the CUDA device."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("optimizers")
    for name in CASES:
        (folder / f"{name}.ddsl").write_text(_text(name))
        r = CliRunner().invoke(cli, ["compile", str(folder / f"{name}.ddsl"), "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


def _with_ptx(programs: Path, name: str) -> None:
    """`name` compiled again with --ptx for sm_90, its PTX put beside its sources (on the CUDA device's class path):
    the program and kernels of the fixture's compile, with the module the device loads."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    out = programs / "ptx" / name
    r = CliRunner().invoke(cli, ["compile", str(programs / f"{name}.ddsl"), "-o", str(out), "--ptx", "--arch", "sm_90"])
    assert r.exit_code == 0, r.output
    for suffix in (".java", ".cu"):  # the same program as the one built
        assert (out / f"{name}{suffix}").read_text() == (programs / "src" / f"{name}{suffix}").read_text()
    shutil.copy(out / f"{name}.sm_90.ptx", programs / "src")


def _java(fn):  # noqa: ANN001, ANN202
    for mark in JAVA_MARKS:
        fn = mark(fn)
    return fn


@_java
@pytest.mark.parametrize("name", list(CASES))
def test_the_java_program_gives_the_numpy_runners_losses(programs: Path, name: str) -> None:
    got = java_json(programs / "build", name, "--data", "synthetic", "--device", "cpu", cwd=programs)
    want = _numpy(name)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got.get("learning_rates") == want.get("learning_rates")


@_java
def test_the_java_programs_alpha_flag_is_deepdsl_runs(programs: Path) -> None:
    got = java_json(programs / "build", "RmsFrozen", "--data", "synthetic", "--device", "cpu", "--alpha", "0.5",
                    cwd=programs)  # fmt: skip
    want = _numpy("RmsFrozen", "--alpha", "0.5")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["losses"] != pytest.approx(_numpy("RmsFrozen")["losses"], rel=1e-3)


@_java
@pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++")
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n != "RmsFrozen" else n for n in CASES])
def test_the_java_cuda_device_gives_the_cpu_devices_losses(programs: Path, name: str) -> None:
    """The CUDA device on the stand-in driver (fake_libcuda.c) running the program's own kernels, compiled for the
    CPU (as tests/backends/test_java_cuda.py does)."""
    _with_ptx(programs, name)
    unit = (programs / "src" / f"{name}.cu").read_text()
    kernels = kernel_names(unit)
    work = programs / name
    work.mkdir(exist_ok=True)
    emulate(unit, kernels, work, [k for k in kernels if k not in TILED])
    fake = fake_driver(programs / "fake")
    env = {"LD_LIBRARY_PATH": str(fake), "DEEPDSL_FAKE_CUDA_KERNELS": str(work / "emulated.so")}
    cp = f"{programs / 'build'}:{programs / 'src'}:{jcuda_jars()}/*"
    cmd = ["java", "-cp", cp, name, "--data", "synthetic", "--device", "cuda", "--json"]
    import os

    r = subprocess.run(cmd, cwd=programs, capture_output=True, text=True, timeout=600, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = java_json(programs / "build", name, "--data", "synthetic", "--device", "cpu", cwd=programs)
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)


@_java
def test_the_java_program_fine_tunes_from_a_run_saved_without_freeze(programs: Path, tmp_path: Path) -> None:
    trained, tuned = tmp_path / "trained.npz", tmp_path / "tuned.npz"
    args = ("--data", "synthetic", "--device", "cpu")
    java_json(programs / "build", "Nesterov", *args, "--save", str(trained), cwd=programs)
    got = java_json(programs / "build", "NesterovFrozen", *args, "--load", str(trained), "--save", str(tuned),
                    cwd=programs)  # fmt: skip
    before, after = np.load(trained), np.load(tuned)
    assert "opt/cv.W/momentum" in before.files and "opt/cv.W/momentum" not in after.files
    np.testing.assert_array_equal(after["cv.W"], before["cv.W"])
    assert not np.array_equal(after["fc.W"], before["fc.W"]) and np.isfinite(got["losses"]).all()
    # the NumPy runner loads the same file the same way and gives the same losses
    program = api.compile_source(_text("NesterovFrozen"), "NesterovFrozen.ddsl").program
    want = run_training(api.build(program), device="cpu", data_flag="synthetic", load=str(trained))
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
