"""docs/java.md's "Changing the generated program", done: each edit made on a generated class, compiled with javac and
run on the CPU device and on the emulated CUDA device (the stand-in libcuda.so.1 of test_java_cuda), with the
effect it should have. One compile of the network; each edit is a copy of the class under its own name."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import TILED, emulate, fake_driver, kernel_names
from java_env import JAVA_MARKS, javac, jcuda_jars

pytestmark = [
    *JAVA_MARKS,
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++"),
]

TINY = """network Tiny

const N = 8

input x : [N, 1, 6, 6]
label y : [N] classes 4

layer fc1 = full(16)
layer fc2 = full(4)
net = fc2 o {act} o fc1 o flatten

loss    = softmax_cross_entropy(net(x), y)
predict = net(x)

train {{
  data      = synthetic(seed=3)
  optimizer = sgd(lr=0.1, momentum=0.9)
}}
"""

# the edits as docs/java.md writes them (the norm printed every step here, not every 100, for a short run)
LEAKY_JAVA = [
    (
        "Math.max((a0[p0 + i0 * no1 + i1] + a1[p1 + i1]), 0.0f)",
        "((a0[p0 + i0 * no1 + i1] + a1[p1 + i1]) > 0 ? (a0[p0 + i0 * no1 + i1] + a1[p1 + i1])"
        " : 0.01f * (a0[p0 + i0 * no1 + i1] + a1[p1 + i1]))",
    ),
    ("Kernel.whenPositive(a1[p1 + e], a0[p0 + e])", "(a1[p1 + e] > 0.0f ? a0[p0 + e] : 0.01f * a0[p0 + e])"),
]
LEAKY_CUDA = [("fmaxf((in0[e] + in1[i1]), 0.0f)",
               "((in0[e] + in1[i1]) > 0 ? (in0[e] + in1[i1]) : 0.01f * (in0[e] + in1[i1]))"),
              ("((in1 > 0.0f) ? in0 : 0.0f)", "((in1 > 0.0f) ? in0 : 0.01f * in0)")]  # fmt: skip
NORM = '      if (iteration % 1 == 0) System.out.println("fc1 output norm " + dev.read(fc1_out).norm());\n'
DATA = """
  @Override
  protected void batch(long iteration, Long shuffleSeed) {  // fills the fields x and y
    java.util.Arrays.fill(x.a, x.off, x.off + x.numel(), 0.5f);  // your samples
    for (int i = 0; i < y.numel(); i++) y.a[y.off + i] = i % 4;  // and their classes
  }
"""


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the generated program has {text.count(old)} of {old!r}"
    return text.replace(old, new)


def _renamed(text: str, name: str) -> str:
    """The class under another name (its settings, and so its Tiny.cu, stay the network's)."""
    for old in ("public final class Tiny ", "public Tiny()", "Tiny::new"):
        text = _edit(text, old, old.replace("Tiny", name))
    return text


@pytest.fixture(scope="module")
def edited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("customise")
    (folder / "tiny.ddsl").write_text(TINY.format(act="relu"))
    (folder / "leaky.ddsl").write_text(TINY.format(act="leaky_relu"))
    src = folder / "src"
    r = CliRunner().invoke(cli, ["compile", str(folder / "tiny.ddsl"), "-o", str(src), "--ptx", "--arch", "sm_90"])
    assert r.exit_code == 0, r.output
    java = (src / "Tiny.java").read_text()
    lr = _edit(java, 'setting("lr", 0.1f)', 'setting("lr", 0.05f)')
    leaky = java
    for old, new in LEAKY_JAVA:
        leaky = _edit(leaky, old, new)
    call = "      dev.run(BIAS_ADD_RELU, fc1_out, fc1_out, fc1_b);\n"
    norm = java.replace(call, call + NORM, 1)  # in trainStep, the first of the two steps
    assert norm.count(NORM) == 1
    main = re.search(r"\n  public static void main\(String\[\] args\) \{\n.*?\n  \}\n", java, re.S)
    assert main is not None
    data = java.replace(main[0], main[0] + DATA, 1)
    for name, text in {"TinyLr": lr, "TinyLeaky": leaky, "TinyNorm": norm, "TinyData": data}.items():
        (src / f"{name}.java").write_text(_renamed(text, name))
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    cu = (src / "Tiny.cu").read_text()
    leaky_cu = cu
    for old, new in LEAKY_CUDA:
        leaky_cu = _edit(leaky_cu, old, new)
    for name, unit in {"base": cu, "leaky": leaky_cu}.items():
        (folder / name).mkdir()
        kernels = kernel_names(unit)
        emulate(unit, kernels, folder / name, [k for k in kernels if k not in TILED])
    fake_driver(folder / "fake")
    rng = np.random.default_rng(0)
    np.savez(folder / "mine.npz", x=np.full((8, 1, 6, 6), 0.5, np.float32), y=np.arange(8) % 4,
             x_test=rng.random((8, 1, 6, 6), np.float32), y_test=rng.integers(0, 4, 8))  # fmt: skip
    return folder


def _java(folder: Path, cls: str, device: str, *args: str, kernels: str = "base") -> str:
    cp = f"{folder / 'build'}:{folder / 'src'}:{jcuda_jars()}/*"
    env = {**os.environ, "LD_LIBRARY_PATH": str(folder / "fake"),
           "DEEPDSL_FAKE_CUDA_KERNELS": str(folder / kernels / "emulated.so")}  # fmt: skip
    cmd = ["java", "-cp", cp, cls, "--data", "synthetic", "--iters", "3", "--device", device, *args]
    r = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _losses(folder: Path, cls: str, device: str, *args: str, kernels: str = "base") -> list[float]:
    out = _java(folder, cls, device, *args, "--json", kernels=kernels)
    return json.loads(out.splitlines()[-1])["losses"]  # the JSON object is the last line (after a print's)


def _numpy(cli, folder: Path, source: str, *args: str) -> list[float]:  # noqa: ANN001
    r = cli("run", str(folder / source), "--iters", "3", "--json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["losses"]


def test_changing_the_learning_rate(edited: Path) -> None:
    want = _losses(edited, "Tiny", "cpu", "--lr", "0.05")
    assert not np.allclose(want, _losses(edited, "Tiny", "cpu"), rtol=1e-4)
    for device in ("cpu", "cuda"):
        np.testing.assert_allclose(_losses(edited, "TinyLr", device), want, rtol=1e-4)


def test_swapping_a_relu_for_a_leaky_relu(cli, edited: Path) -> None:  # noqa: ANN001
    want = _numpy(cli, edited, "leaky.ddsl", "--data", "synthetic")  # the network written with a leaky ReLU
    np.testing.assert_allclose(_losses(edited, "TinyLeaky", "cpu"), want, rtol=1e-4)
    np.testing.assert_allclose(_losses(edited, "TinyLeaky", "cuda", kernels="leaky"), want, rtol=1e-4)


@pytest.mark.slow  # 3 s, for the default's 4 minutes
def test_printing_a_layers_output_norm(edited: Path) -> None:
    printed = {}
    for device in ("cpu", "cuda"):
        lines = _java(edited, "TinyNorm", device).splitlines()
        printed[device] = [float(line.split()[-1]) for line in lines if line.startswith("fc1 output norm ")]
        assert len(printed[device]) == 3 and all(n > 0 for n in printed[device])
    np.testing.assert_allclose(printed["cuda"], printed["cpu"], rtol=1e-4)
    np.testing.assert_allclose(_losses(edited, "TinyNorm", "cpu"), _losses(edited, "Tiny", "cpu"), rtol=0)


@pytest.mark.slow  # 3 s, for the default's 4 minutes
def test_plugging_in_a_data_source(cli, edited: Path) -> None:  # noqa: ANN001
    want = _numpy(cli, edited, "tiny.ddsl", "--data", f"npz:{edited / 'mine.npz'}")  # the same samples from a file
    for device in ("cpu", "cuda"):
        np.testing.assert_allclose(_losses(edited, "TinyData", device), want, rtol=1e-4)
