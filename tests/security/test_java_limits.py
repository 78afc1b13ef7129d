"""The generated Java program's side of issue 15: usage errors, an empty test set, NaN test inputs, --help."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from deep_networks import SMALL
from helpers import JAVAC

from deepdsl.frontend.train import MAX_ITERATIONS

pytestmark = [
    pytest.mark.java,
    pytest.mark.skipif(shutil.which("javac") is None or shutil.which("java") is None, reason="no JDK on PATH"),
]

NET = (
    SMALL.replace("network T", "network Lim")
    + "layer f = full(2)\nloss = softmax_cross_entropy(f(x), y)\npredict = f(x)\n"
    + "train {\n  data = synthetic\n  optimizer = sgd(lr=0.01)\n  iterations = 2\n}\n"
)


@pytest.fixture(scope="module")
def program(tmp_path_factory):  # noqa: ANN001, ANN201
    """The network compiled to Java and built for the CPU (no JCuda): the folder and its build folder."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("lim")
    (folder / "lim.ddsl").write_text(NET)
    r = CliRunner().invoke(cli, ["compile", str(folder / "lim.ddsl"), "-o", str(folder / "out")])
    assert r.exit_code == 0, r.output
    build = folder / "build"
    javac = [*JAVAC, "-encoding", "UTF-8", "-nowarn", "-d", str(build), "-sourcepath", str(folder / "out"),
             str(folder / "out" / "Lim.java")]  # fmt: skip
    done = subprocess.run(javac, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return folder, build


def java(build, main: str, *args: str) -> subprocess.CompletedProcess:  # noqa: ANN001
    return subprocess.run(["java", "-cp", str(build), main, *args], capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip


def _npz(folder, x_test: np.ndarray, y_test: np.ndarray):  # noqa: ANN001, ANN202
    rng = np.random.default_rng(0)
    path = folder / f"d{len(x_test)}.npz"
    np.savez(path, x=rng.uniform(-1, 1, (8, 4)).astype(np.float32), y=rng.integers(0, 2, 8), x_test=x_test,
             y_test=y_test)  # fmt: skip
    return path


def test_java_flags_and_test_sets(program) -> None:  # noqa: ANN001
    folder, build = program
    for args in (["--save", ""], ["--load", ""], ["--data", "synthetic:-1"], ["--data", "foo:x"]):
        r = java(build, "Lim", "--iters", "1", *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
    r = java(build, "Lim", "--help")
    assert r.returncode == 0
    lines = r.stdout.strip().splitlines()
    assert lines and len(lines) == len(set(lines)) and "--data" in r.stdout
    # an empty test set: a clear error, not "/ by zero"
    empty = _npz(folder, np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    r = java(build, "Lim", "--data", f"npz:{empty}", "--device", "cpu")
    assert r.returncode == 1, r.stderr
    assert "the test data holds no samples" in r.stderr
    # all-NaN test inputs are answered wrongly, not 100% right
    nan = _npz(folder, np.full((4, 4), np.nan, np.float32), np.zeros(4, np.int64))
    r = java(build, "Lim", "--data", f"npz:{nan}", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "test accuracy: 0.00%" in r.stdout


INT_MAX = 2**31 - 1
EDGE = f"""network E{"d" * 127}
const N = 1
const BIG = 4611686018427387903
input x{"i" * 127} : [N, 2, 1, 1]
label y : [N] classes 2
h1 = conv(x{"i" * 127}, 2, kernel=1, stride={INT_MAX})
h2 = max_pool(x{"i" * 127}, (1, {INT_MAX}), pad=(0, {INT_MAX // 2}), stride={INT_MAX})
h3 = avg_pool(x{"i" * 127}, (1, {INT_MAX}), pad=(0, {INT_MAX // 2}), stride=({INT_MAX}, 1))
h4 = lrn(x{"i" * 127}, size={INT_MAX})
layer fc = full(2)
loss = softmax_cross_entropy(fc(flatten(h1 + h2 + h3 + h4)), y)
predict = fc(flatten(h1))
train {{
  data = npz("{"d" * 4000}.npz")
  iterations = {MAX_ITERATIONS}
  test_every = {INT_MAX}
  test_iterations = {INT_MAX}
  save = "w.npz"
  save_every = {INT_MAX}
  seed = {2**62 - 1}
}}
"""


@pytest.mark.slow
def test_check_accepts_javac(tmp_path) -> None:  # noqa: ANN001
    """What check accepts compiles with javac (issue 36): a network at the edge of every limit check keeps (a stride,
    a pool window and its padded extent, an LRN size, the train block's counts at 2^31 - 1, a seed at 2^62 - 1,
    names of 128 characters, a 4,000-character path), and the ONNX models whose imports javac refused (an input
    named System, 100,000-character names), imported; one past each edge is refused by check (test_limits.py)."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    onnx = pytest.importorskip("onnx")
    from test_onnx_hostile import input_system, long_names

    run = CliRunner().invoke
    (tmp_path / "edge.ddsl").write_text(EDGE)
    sources = [tmp_path / "edge.ddsl"]
    for make in (input_system, long_names):
        onnx.save(make(), tmp_path / f"{make.__name__}.onnx")
        sources.append(tmp_path / f"{make.__name__}.ddsl")
        r = run(cli, ["import", str(tmp_path / f"{make.__name__}.onnx"), "-o", str(sources[-1]), "--no-loss"])
        assert r.exit_code == 0, r.output
    for source in sources:
        assert run(cli, ["check", str(source)]).exit_code == 0
        r = run(cli, ["compile", str(source), "-o", str(tmp_path / "out")])
        assert r.exit_code == 0, r.output
    mains = sorted((tmp_path / "out").glob("*.java"))
    assert len(mains) == 3
    javac = [*JAVAC, "-encoding", "UTF-8", "-nowarn", "-d", str(tmp_path / "build"), "-sourcepath",
             str(tmp_path / "out"), *map(str, mains)]  # fmt: skip
    done = subprocess.run(javac, capture_output=True, text=True, cwd=tmp_path, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
