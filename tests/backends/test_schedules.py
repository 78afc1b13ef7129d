"""Learning-rate schedules and checkpoints of the train block: the rate of every iteration from a direct formula,
the same sequence (and losses) on the NumPy runner, the GPU runner (kernels on the CPU) and the Java program, and
`save` / `save_every` writing the parameter file at the end and every K iterations on each."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver
from java_env import JAVA_MARKS, java, java_json, javac

from deepdsl import api
from deepdsl.errors import DslError
from deepdsl.running import run_training

NET = """network Sched
input x : [8, 16]
label y : [8] classes 4
layer fc1 = full(16)
layer fc = full(4)
loss = softmax_cross_entropy(fc(relu(fc1(x))), y)
predict = fc(relu(fc1(x)))
train {
  optimizer = OPTIMIZER
  lr = SCHEDULE
  iterations = 14
  save = "ck.npz"
  save_every = 5
}
"""
SCHEDULE = "warmup(step(cosine(0.2, total=9, min=0.01), every=3, gamma=0.5), steps=4)"


def direct(k: int) -> float:
    """SCHEDULE written out: 4 warmup steps up to the base's first rate, then the base from its own start."""
    if k < 4:
        return 0.2 * (k + 1) / 4

    def cosine(j: int) -> float:
        return 0.01 + (0.2 - 0.01) * (1 + math.cos(math.pi * j / 9)) / 2 if j < 9 else 0.01

    j = k - 4
    return cosine(j) * 0.5 ** (j // 3)


def _net(optimizer: str = "sgd(momentum=0.9, weight_decay=0.001)", schedule: str = SCHEDULE) -> str:
    return NET.replace("OPTIMIZER", optimizer).replace("SCHEDULE", schedule)


def _build(text: str) -> api.Build:
    return api.build(api.compile_source(text, "sched.ddsl").program)


def test_the_rates_follow_the_direct_formula_and_reach_the_update(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    build = _build(_net())
    got = run_training(build, device="cpu", data_flag="synthetic")
    assert got["learning_rates"] == [float(np.float32(direct(k))) for k in range(14)]
    # the rate is the step's input: a schedule that is the optimizer's constant gives the constant run's losses
    constant = run_training(_build(_net("sgd(lr=0.05, momentum=0.9)", "0.05").replace("  lr = 0.05\n", "")),
                            device="cpu", data_flag="synthetic")  # fmt: skip
    same = run_training(_build(_net("sgd(momentum=0.9)", "step(0.05, every=100)")), device="cpu", data_flag="synthetic")
    np.testing.assert_allclose(same["losses"], constant["losses"], rtol=1e-6)
    assert "learning_rates" not in constant
    assert got["losses"] != pytest.approx(same["losses"])


def test_a_resumed_run_continues_its_schedule(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    build = _build(_net("adam()"))
    whole = run_training(build, device="cpu", data_flag="synthetic", iters=8)
    first = run_training(build, device="cpu", data_flag="synthetic", iters=5, save=str(tmp_path / "a.npz"))
    rest = run_training(build, device="cpu", data_flag="synthetic", iters=3, load=str(tmp_path / "a.npz"))
    assert first["learning_rates"] + rest["learning_rates"] == whole["learning_rates"]
    np.testing.assert_allclose(first["losses"] + rest["losses"], whole["losses"], rtol=1e-6)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ("optimizer = sgd(lr=0.1)\n  lr = cosine(0.1)", "the learning rate is given twice"),
        ("lr = step(0.1)", "step needs its argument 'every'"),
        ("lr = cosine(-0.1)", "must be at least 0"),
        ('lr = mnist("d")', "'lr' must be a learning rate or a schedule"),
        ("save_every = 5", "`save_every` needs `save`"),
    ],
)
def test_bad_schedules_are_errors_at_their_line(train: str, message: str) -> None:
    text = NET.split("train {")[0] + "train {\n  " + train + "\n}\n"
    with pytest.raises(DslError) as err:
        api.compile_source(text, "bad.ddsl")
    assert message in err.value.message and err.value.span is not None and err.value.span.line >= 8, err.value


def _blow_up() -> str:
    """A schedule that ruins the parameters after step 6: the run stops at a non-finite value, before its final
    save, so the file holds the checkpoint of step 5."""
    return _net("sgd()", "step(0.01, every=6, gamma=1e37)").replace("iterations = 14", "iterations = 12")


def _checkpoint_at_5(path: Path) -> dict[str, np.ndarray]:
    f = np.load(path)
    assert int(f["opt/iteration"]) == 5
    return {k: f[k] for k in f.files}


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")
def test_the_gpu_runner_takes_the_same_rates_and_checkpoints(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    build = _build(_net())
    want = run_training(build, device="cpu", data_flag="synthetic", iters=6)
    got = run_training(build, device="cpu", data_flag="synthetic", iters=6, driver=EmulatedDriver(tmp_path / "gpu"))
    assert got["device"] == "cuda" and got["learning_rates"] == want["learning_rates"]
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    bad = _build(_blow_up())
    with pytest.raises(DslError):
        run_training(bad, device="cpu", data_flag="synthetic", driver=EmulatedDriver(tmp_path / "gpu2"))
    on_gpu = _checkpoint_at_5(tmp_path / "ck.npz")
    (tmp_path / "ck.npz").unlink()
    with pytest.raises(DslError):
        run_training(bad, device="cpu", data_flag="synthetic")
    for name, a in _checkpoint_at_5(tmp_path / "ck.npz").items():
        np.testing.assert_allclose(on_gpu[name], a, rtol=1e-5, atol=1e-7, err_msg=name)


def _java(fn):  # noqa: ANN001, ANN202
    for mark in JAVA_MARKS:
        fn = mark(fn)
    return fn


@_java
def test_the_java_program_takes_the_same_rates_and_checkpoints(cli, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)  # the train block's save is relative to the working directory
    (tmp_path / "sched.ddsl").write_text(_net())
    (tmp_path / "blow.ddsl").write_text(_blow_up().replace("network Sched", "network Blow"))
    for name in ("sched", "blow"):
        r = cli("compile", str(tmp_path / f"{name}.ddsl"), "-o", str(tmp_path / "src"))
        assert r.exit_code == 0, r.output
    src = tmp_path / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], tmp_path / "build")
    got = java_json(tmp_path / "build", "Sched", "--data", "synthetic", "--device", "cpu", cwd=tmp_path)
    r = cli("run", str(tmp_path / "sched.ddsl"), "--data", "synthetic", "--device", "cpu", "--json",
            "--save", str(tmp_path / "python.npz"))  # fmt: skip
    want = json.loads(r.stdout)
    assert got["learning_rates"] == want["learning_rates"] == [float(np.float32(direct(k))) for k in range(14)]
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    j = java(tmp_path / "build", "Blow", "--data", "synthetic", "--device", "cpu", cwd=tmp_path)
    assert j.returncode == 1 and "not finite" in j.stderr, j.stderr
    java_file = _checkpoint_at_5(tmp_path / "ck.npz")
    (tmp_path / "ck.npz").unlink()
    r = cli("run", str(tmp_path / "blow.ddsl"), "--data", "synthetic", "--device", "cpu")
    assert r.exit_code == 1
    for name, a in _checkpoint_at_5(tmp_path / "ck.npz").items():
        np.testing.assert_allclose(java_file[name], a, rtol=1e-5, atol=1e-7, err_msg=name)


@_java
def test_the_java_programs_lr_flag_is_the_schedules_base_rate(cli, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sched.ddsl").write_text(_net())
    (tmp_path / "half.ddsl").write_text(_net(schedule=SCHEDULE.replace("cosine(0.2,", "cosine(0.1,")))
    r = cli("compile", str(tmp_path / "sched.ddsl"), "-o", str(tmp_path / "src"))
    assert r.exit_code == 0, r.output
    src = tmp_path / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], tmp_path / "build")
    got = java_json(tmp_path / "build", "Sched", "--data", "synthetic", "--device", "cpu", "--iters", "6", "--lr",
                    "0.1", cwd=tmp_path)  # fmt: skip
    r = cli("run", str(tmp_path / "half.ddsl"), "--data", "synthetic", "--device", "cpu", "--iters", "6", "--json")
    want = json.loads(r.stdout)
    assert got["learning_rates"] == want["learning_rates"]
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
