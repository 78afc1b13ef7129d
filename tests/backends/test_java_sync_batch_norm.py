"""The Java program's synchronised batch norm (issue 32, `compile --data-parallel --sync-batch-norm`): the step
issues each batch norm's statistics all-reduce where it is made and waits for it at once (the runtime's
allReduceStart / allReduceWait, MPI through JNA on the CPU device); two Java ranks under `mpiexec -n 2` give the
NumPy runner's two synchronised ranks within rounding; micro-batches are refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from dp_nets import RESIDUAL
from helpers import ROOT
from java_env import JAVA_MARKS, javac, jna_jar, launch_env, mpi

from deepdsl.cli import cli

pytestmark = JAVA_MARKS


def _compile(folder: Path, *flags: str) -> Path:
    folder.mkdir(exist_ok=True)
    source = folder / "tiny.ddsl"
    source.write_text(RESIDUAL)
    r = CliRunner().invoke(cli, ["compile", str(source), "--data-parallel", *flags, "-o", str(folder / "out")])
    assert r.exit_code == 0, r.output
    return folder / "out"


def test_the_step_waits_for_each_statistics_all_reduce_where_it_starts(tmp_path: Path) -> None:
    text = (_compile(tmp_path, "--sync-batch-norm") / "TinyRes.java").read_text()
    calls = re.findall(r"allReduce(Start|Wait)\((\d+), ", text)
    buckets = sorted({int(b) for _, b in calls})
    # the buckets waited for right where they start: three batch norms' forward and backward statistics, numbered
    # after the gradient buckets and the state bucket
    blocking = [int(b) for k, (kind, b) in enumerate(calls[:-1]) if kind == "Start" and calls[k + 1] == ("Wait", b)]
    assert len(buckets) > 6 and [b for b in blocking if b >= buckets[-6]] == buckets[-6:]
    assert all(calls.count(("Start", str(b))) == calls.count(("Wait", str(b))) == 1 for b in buckets)
    assert "protected boolean syncsBatchNorm()" in text
    plain = (_compile(tmp_path / "plain") / "TinyRes.java").read_text()
    assert "syncsBatchNorm" not in plain


@pytest.mark.slow
def test_two_java_ranks_equal_the_numpy_runners_two_ranks(tmp_path: Path) -> None:
    out = _compile(tmp_path, "--sync-batch-norm")
    javac(out, [*out.glob("*.java"), *(out / "deepdsl" / "runtime").glob("*.java")], out / "build")
    mpiexec, lib = mpi()
    env = launch_env(PATH=f"{lib.parent / 'bin'}:{os.environ.get('PATH', '')}")
    java = ["java", "-cp", f"{out / 'build'}:{jna_jar()}", "TinyRes", "--device", "cpu", "--threads", "1",
            "--data", "synthetic", "--iters", "3"]  # fmt: skip
    r = subprocess.run([mpiexec, "-n", "2", *java, "--save", str(tmp_path / "java.npz")], capture_output=True,
                       text=True, timeout=300, env=env, cwd=tmp_path, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*java, "--micro-batches", "2"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path, check=False)  # fmt: skip
    assert r.returncode == 1 and "--micro-batches 2: this program synchronises batch norm" in r.stderr, r.stderr
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "deepdsl", "run", str(tmp_path / "tiny.ddsl"),
                        "--sync-batch-norm", "--data", "synthetic", "--iters", "3", "--save",
                        str(tmp_path / "numpy.npz")], capture_output=True, text=True, timeout=300,
                       env=launch_env(PYTHONPATH=str(ROOT), PATH=env["PATH"]), check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "java.npz") as j, np.load(tmp_path / "numpy.npz") as n:
        assert set(j.files) == set(n.files)
        for k in n.files:
            if n[k].dtype == np.float32:
                np.testing.assert_allclose(j[k], n[k], rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(n[k]).max())),
                                           err_msg=k)  # fmt: skip
