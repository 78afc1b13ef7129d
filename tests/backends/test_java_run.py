"""The generated Java programs run with plain `java` on the CPU device and agree with the NumPy runner: the
same losses from the same seed and data, the same initial parameters, parameter files that move both ways,
save -> load -> continue equal to an uninterrupted run, and the device flags."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, SMALL
from java_env import JAVA_MARKS, java, java_json, javac, openblas_classpath

pytestmark = JAVA_MARKS


# (class, source, --set): LeNet at a reduced batch; its learning rate lowered to 0.001, since at 0.01 its loss
# swings (2.5, 8.8, 3.4, 5.5, ...) and float32 rounding differences grow about a hundredfold per step there
NETWORKS = {
    "MLP": ("mlp.ddsl", ["--set", "N=16"]),
    "LeNet": ("lenet_slow.ddsl", ["--set", "N=8"]),
    "Small": ("small.ddsl", []),
    "Autoencoder": ("autoencoder.ddsl", ["--set", "N=8"]),  # no label: the loss compares the input with itself
    "Regression": ("regression.ddsl", ["--set", "N=8"]),  # a second input, t, the regression target
    "NoPredict": ("no_predict.ddsl", []),  # a loss and no predict: evalStep without an inference program
}
NO_PREDICT = """network NoPredict
const N = 4
input x : [N, 3]
label y : [N] classes 2
layer fc = full(2)
loss = softmax_cross_entropy(fc(relu(x)), y)
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every program of NETWORKS compiled to Java, and all of it compiled by one javac run into build/."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("java")
    (folder / "small.ddsl").write_text(SMALL)
    (folder / "no_predict.ddsl").write_text(NO_PREDICT)
    (folder / "mlp.ddsl").write_text((ROOT / "networks" / "mlp.ddsl").read_text())
    lenet = (ROOT / "networks" / "lenet.ddsl").read_text()
    assert "lr=0.01," in lenet
    (folder / "lenet_slow.ddsl").write_text(lenet.replace("lr=0.01,", "lr=0.001,"))
    for name in ("autoencoder", "regression"):
        (folder / f"{name}.ddsl").write_text((ROOT / "networks" / f"{name}.ddsl").read_text())
    for source, sets in NETWORKS.values():
        r = CliRunner().invoke(cli, ["compile", str(folder / source), *sets, "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


def python_run(cli, folder: Path, name: str, *args: str) -> dict:
    source, sets = NETWORKS[name]
    r = cli("run", str(folder / source), *sets, "--data", "synthetic", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def java_run(folder: Path, name: str, *args: str) -> dict:
    return java_json(folder / "build", name, "--data", "synthetic", "--device", "cpu", *args, cwd=folder)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_losses_equal_the_numpy_runner(cli, programs: Path, name: str) -> None:
    want = python_run(cli, programs, name, "--iters", "5")
    got = java_run(programs, name, "--iters", "5")
    assert got["device"] == "cpu"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    # the bytes one step holds mean the same in all three: what memcheck counts (persistent storage and the arena)
    source, sets = NETWORKS[name]
    r = cli("memcheck", str(programs / source), *sets, "--json")
    plan = json.loads(r.stdout)
    assert (got["peak_bytes"], got["arena_bytes"]) == (want["peak_bytes"], want["arena_bytes"])
    assert (want["peak_bytes"], want["arena_bytes"]) == (plan["peak_bytes"], plan["arena_bytes"])
    assert got.get("test_accuracy") == pytest.approx(want.get("test_accuracy"), abs=0.02)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert set(got) == set(want)


# (java: LeNet on the Java SGEMM is test_losses_equal_the_numpy_runner[LeNet] too; slow for the default's 4 minutes)
@pytest.mark.parametrize("blas", ["openblas", pytest.param("java", marks=pytest.mark.slow)])
def test_lenet_on_either_sgemm_equals_the_numpy_runner(cli, programs: Path, blas: str) -> None:
    """--blas: the convolutions' and linear layers' products through OpenBLAS or the Java SGEMM, the device line
    says which; both give the NumPy runner's losses."""
    want = python_run(cli, programs, "LeNet", "--iters", "5")
    cp = f"{programs / 'build'}:{openblas_classpath()}"
    cmd = ["java", "-cp", cp, "LeNet", "--data", "synthetic", "--device", "cpu", "--iters", "5", "--blas", blas]
    r = subprocess.run([*cmd, "--json"], cwd=programs, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert ("GEMM OpenBLAS 0.3.31, " if blas == "openblas" else "GEMM Java SGEMM, ") in r.stderr.splitlines()[0]
    np.testing.assert_allclose(json.loads(r.stdout)["losses"], want["losses"], rtol=1e-4)


def test_blas_flag_without_the_jars(programs: Path) -> None:
    """Without the OpenBLAS jars: auto takes the Java SGEMM, openblas is an error naming what to install."""
    args = ("--data", "synthetic", "--iters", "1", "--device", "cpu")
    r = java(programs / "build", "MLP", *args, cwd=programs)
    assert r.returncode == 0 and "GEMM Java SGEMM, " in r.stdout.splitlines()[0], r.stdout + r.stderr
    r = java(programs / "build", "MLP", *args, "--blas", "openblas", cwd=programs)
    assert r.returncode == 1 and "iter" not in r.stdout
    assert r.stderr.startswith("error: --blas openblas: the OpenBLAS classes are not on the class path")
    assert "org.bytedeco:openblas:0.3.31-1.5.13" in r.stderr and "org.bytedeco:javacpp:1.5.13" in r.stderr
    r = java(programs / "build", "MLP", *args, "--blas", "mkl", cwd=programs)
    assert r.returncode == 2 and "--blas takes openblas, java or auto, not 'mkl'" in r.stderr


def test_every_input_is_read_from_the_data_by_name(cli, programs: Path) -> None:
    """Regression's target `t` comes from the npz file's array `t` (the Java program used to train on zeros
    there); a file without it is an error naming it, at start, in both runtimes."""
    rng = np.random.default_rng(2)
    x, t = rng.random((24, 64), np.float32), rng.random((24, 4), np.float32)
    np.savez(programs / "reg.npz", x=x, t=t, x_test=x[:8], t_test=t[:8])
    np.savez(programs / "no_t.npz", x=x)
    want = python_run(cli, programs, "Regression", "--iters", "3", "--data", f"npz:{programs / 'reg.npz'}")
    got = java_json(programs / "build", "Regression", "--data", "npz:reg.npz", "--device", "cpu", "--iters", "3",
                    cwd=programs)  # fmt: skip
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    zeros = python_run(cli, programs, "Regression", "--iters", "1", "--data", "synthetic")
    assert got["losses"][0] != pytest.approx(zeros["losses"][0])  # the file's data, not the synthetic one
    source, sets = NETWORKS["Regression"]
    r = cli("run", str(programs / source), *sets, "--data", f"npz:{programs / 'no_t.npz'}", "--iters", "1")
    assert r.exit_code == 1 and "has no array 't' for the network's input t : [N, 4]" in r.stderr, r.stderr
    j = java(
        programs / "build", "Regression", "--data", "npz:no_t.npz", "--device", "cpu", "--iters", "1", cwd=programs
    )
    assert j.returncode == 1 and "has no array 't' for the network's input t : [N, 4]" in j.stderr, j.stderr


def test_initial_parameters_are_bit_identical(cli, programs: Path) -> None:
    java_run(programs, "Small", "--iters", "0", "--save", "java.npz")
    python_run(cli, programs, "Small", "--iters", "0", "--save", str(programs / "python.npz"))
    j, p = np.load(programs / "java.npz"), np.load(programs / "python.npz")
    assert j.files == p.files
    for name in p.files:
        assert j[name].dtype == p[name].dtype, name
        np.testing.assert_array_equal(j[name], p[name], err_msg=name)


def test_save_load_continue_equals_an_uninterrupted_run(programs: Path) -> None:
    whole = java_run(programs, "Small", "--iters", "5")["losses"]
    first = java_run(programs, "Small", "--iters", "3", "--save", "three.npz")["losses"]
    rest = java_run(programs, "Small", "--load", "three.npz", "--iters", "2")["losses"]
    assert first + rest == whole  # bit for bit


@pytest.mark.parametrize(
    "name, blas",  # LeNet on the Java SGEMM: 3.6 s, slow for the default's 4 minutes (Small keeps the check there)
    [
        pytest.param("LeNet", "java", marks=pytest.mark.slow),
        ("Small", "java"),
        pytest.param("LeNet", "openblas", marks=pytest.mark.slow),
    ],
)
def test_two_threads_give_the_same_bits_every_run(programs: Path, name: str, blas: str) -> None:
    # the pieces of a parallel loop and the order of every sum depend on the shapes and the thread count only,
    # never on which thread comes free first; OpenBLAS runs each piece's product on one thread
    cp = f"{programs / 'build'}:{openblas_classpath()}" if blas == "openblas" else str(programs / "build")
    cmd = ["java", "-XX:ActiveProcessorCount=2", "-cp", cp, name, "--data", "synthetic",
           "--device", "cpu", "--iters", "5", "--blas", blas, "--json"]  # fmt: skip
    runs = [subprocess.run(cmd, cwd=programs, capture_output=True, text=True, timeout=300, check=False) for _ in "ab"]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    first, second = (json.loads(r.stdout)["losses"] for r in runs)
    assert first == second


def test_parameter_files_move_between_python_and_java(cli, programs: Path) -> None:
    python_run(cli, programs, "Small", "--iters", "2", "--save", str(programs / "from_python.npz"))
    want = python_run(cli, programs, "Small", "--load", str(programs / "from_python.npz"), "--iters", "2")
    got = java_run(programs, "Small", "--load", "from_python.npz", "--iters", "2")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)

    java_run(programs, "Small", "--iters", "2", "--save", "from_java.npz")
    want = java_run(programs, "Small", "--load", "from_java.npz", "--iters", "2")
    got = python_run(cli, programs, "Small", "--load", str(programs / "from_java.npz"), "--iters", "2")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)


def test_a_file_without_optimizer_state_starts_the_optimizer_fresh(cli, programs: Path) -> None:
    from deepdsl.checkpoint import save_npz

    java_run(programs, "Small", "--iters", "2", "--save", "full.npz")
    with np.load(programs / "full.npz") as z:
        save_npz(programs / "weights.npz", {n: z[n] for n in z.files if "/" not in n})
    want = python_run(cli, programs, "Small", "--load", str(programs / "weights.npz"), "--iters", "2")
    got = java_run(programs, "Small", "--load", "weights.npz", "--iters", "2")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)


def test_a_mismatched_parameter_file_is_named(programs: Path) -> None:
    java_run(programs, "MLP", "--iters", "0", "--save", "mlp.npz")
    r = java(programs / "build", "LeNet", "--data", "synthetic", "--load", "mlp.npz", "--iters", "1", cwd=programs)
    assert r.returncode == 1
    assert "parameter file 'mlp.npz'" in r.stderr and "cv1.W" in r.stderr


def test_progress_lines_and_usage_errors(programs: Path) -> None:
    r = java(programs / "build", "MLP", "--data", "synthetic", "--iters", "2", "--device", "cpu", cwd=programs)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("device: cpu (Java")
    assert "iter 2/2  loss " in r.stdout and "images/s" in r.stdout and "test accuracy:" in r.stdout
    r = java(programs / "build", "Regression", "--data", "synthetic", "--iters", "1", cwd=programs)
    assert r.returncode == 0 and "samples/s" in r.stdout and "images/s" not in r.stdout, r.stderr  # x : [N, D]
    r = java(programs / "build", "MLP", "--iters", "many", cwd=programs)
    assert r.returncode == 2 and "--iters" in r.stderr
    assert java(programs / "build", "MLP", "--frobnicate", cwd=programs).returncode == 2


def test_devices(programs: Path) -> None:
    build = programs / "build"
    # without the JCuda jars: cuda is refused with the reason, auto runs on the CPU and says why
    r = java(build, "MLP", "--data", "synthetic", "--iters", "1", "--device", "cuda", cwd=programs)
    assert r.returncode == 1 and "JCuda" in r.stderr
    r = java(build, "MLP", "--data", "synthetic", "--iters", "1", "--device", "auto", "--json", cwd=programs)
    assert r.returncode == 0 and json.loads(r.stdout)["device"] == "cpu"
    # a CPU build (no JCuda classes) is no news under auto: the device line alone; `cpu` says nothing of CUDA either
    lines = r.stderr.splitlines()
    assert "CUDA" not in r.stderr, r.stderr
    assert lines[0].startswith("device: cpu (Java, ") and lines[0].endswith(
        "network MLP  batch 16  data synthetic (seed 1)  precision fp32"
    )
    r = java(build, "MLP", "--data", "synthetic", "--iters", "1", "--device", "cpu", cwd=programs)
    assert r.returncode == 0 and "CUDA" not in r.stdout + r.stderr
    # with them and no GPU (or no driver) cuda is refused cleanly too
    r = java(build, "MLP", "--data", "synthetic", "--iters", "1", "--device", "cuda", cwd=programs, jcuda=True)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "Exception" not in r.stderr.splitlines()[0][:20]


def test_save_is_checked_before_training_and_iters_0_tests_nothing(programs: Path) -> None:
    r = java(programs / "build", "MLP", "--data", "synthetic", "--iters", "2", "--save", "no/p.npz", cwd=programs)
    assert r.returncode == 1 and "cannot write parameter file 'no/p.npz': folder" in r.stderr
    assert "iter" not in r.stdout
    r = java(programs / "build", "MLP", "--data", "synthetic", "--iters", "0", "--save", "p0.npz", "--device", "cpu",
             cwd=programs)  # fmt: skip
    assert r.returncode == 0 and "test accuracy" not in r.stdout and "saved: p0.npz" in r.stdout
    assert "test_accuracy" not in java_run(programs, "MLP", "--iters", "0")


def test_synthetic_says_its_seed(programs: Path) -> None:
    r = java(programs / "build", "MLP", "--data", "synthetic:5", "--iters", "1", "--device", "cpu", cwd=programs)
    assert r.returncode == 0 and "data synthetic (seed 5)" in r.stdout.splitlines()[0]


def test_missing_data_says_how_to_get_it(programs: Path) -> None:
    r = java(programs / "build", "MLP", "--data", "mnist:no where", "--iters", "1", "--device", "cpu", cwd=programs)
    assert r.returncode == 1
    assert "MNIST directory not found: 'no where'; get them with `deepdsl data mnist 'no where'`, or train on " \
        "`--data synthetic`" in r.stderr  # fmt: skip


def test_threads_flag(programs: Path) -> None:
    """--threads N sizes the runtime's thread team (the device line says it); the losses do not depend on it."""
    one = java(programs / "build", "MLP", "--data", "synthetic", "--iters", "2", "--device", "cpu", "--threads", "1",
               "--json", cwd=programs)  # fmt: skip
    assert one.returncode == 0, one.stderr
    assert "device: cpu (Java, 1 thread, " in one.stderr
    three = java_run(programs, "MLP", "--iters", "2", "--threads=3")
    np.testing.assert_allclose(three["losses"], json.loads(one.stdout)["losses"], rtol=1e-5)
    for bad in ("0", "-1", "two"):
        r = java(programs / "build", "MLP", "--threads", bad, cwd=programs)
        assert r.returncode == 2 and "--threads takes a whole number in [1, 1024]" in r.stderr
    assert "[--threads N]" in java(programs / "build", "MLP", "--help", cwd=programs).stdout


@pytest.mark.slow  # two Java runs of a convolution network (8 s)
def test_workspace_limit_switches_the_convolution(programs: Path) -> None:
    fast = java_run(programs, "LeNet", "--iters", "2")["losses"]
    lean = java_run(programs, "LeNet", "--iters", "2", "--workspace-limit", "0")["losses"]
    np.testing.assert_allclose(lean, fast, rtol=1e-5)


# (class, source, --set) of a rematerialised program: the values recomputed must be over the planner's 64 KiB
# threshold, which SMALL's are from batch 32 on; ResNet-50 at a small size is the real thing (slow)
REMAT = [
    ("Small", "small.ddsl", ["--set", "N=32"]),
    pytest.param("ResNet50", str(ROOT / "networks" / "resnet50.ddsl"),
                 ["--set", "N=4", "--set", "H=64", "--set", "W=64"], marks=pytest.mark.slow),
]  # fmt: skip


@pytest.mark.parametrize("name, source, sets", REMAT, ids=["Small", "ResNet50"])
def test_a_rematerialised_program_gives_the_same_losses_in_less_memory(
    cli, programs: Path, name: str, source: str, sets: list[str]
) -> None:  # fmt: skip
    remat = "full"
    folder = programs / f"remat_{remat}_{name}"
    net = str(programs / source)  # an absolute path stays as it is
    r = cli("compile", net, *sets, "--remat", remat, "-o", str(folder))
    assert r.exit_code == 0, r.output
    javac(folder, [folder / f"{name}.java", *(folder / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    got = java_json(folder / "build", name, "--data", "synthetic", "--device", "cpu", "--iters", "1")
    want = cli("run", net, *sets, "--remat", remat, "--data", "synthetic", "--iters", "1", "--json")
    plain = cli("run", net, *sets, "--data", "synthetic", "--iters", "1", "--json")
    want, plain = json.loads(want.stdout), json.loads(plain.stdout)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["peak_bytes"] == want["peak_bytes"] < plain["peak_bytes"]


def test_the_learning_rate_is_a_setting_the_kernels_read(cli, programs: Path) -> None:
    """--lr changes what the update kernels read: the losses are those of the network written with that rate."""
    faster = programs / "lenet_faster.ddsl"
    faster.write_text((programs / "lenet_slow.ddsl").read_text().replace("lr=0.001,", "lr=0.003,"))
    r = cli("run", str(faster), "--set", "N=8", "--data", "synthetic", "--iters", "4", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)["losses"]
    got = java_run(programs, "LeNet", "--iters", "4", "--lr", "0.003")["losses"]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert not np.allclose(got, java_run(programs, "LeNet", "--iters", "4")["losses"], rtol=1e-4)


def test_a_setting_the_network_does_not_have_is_a_usage_error(programs: Path) -> None:
    r = java(programs / "build", "LeNet", "--data", "synthetic", "--iters", "1", "--beta1", "0.5", cwd=programs)
    assert r.returncode == 2
    assert "LeNet has no setting 'beta1' (it has lr, momentum, weight_decay)" in r.stderr
    r = java(programs / "build", "LeNet", "--iters", "1", "--lr", "fast", cwd=programs)
    assert r.returncode == 2 and "--lr takes a number in [0, 3.4e+38], not 'fast'" in r.stderr


def test_eval_reports_the_test_loss_of_saved_parameters_as_deepdsl_eval_does(cli, programs: Path) -> None:
    source, sets = NETWORKS["MLP"]
    saved = programs / "mlp_eval.npz"
    python_run(cli, programs, "MLP", "--iters", "2", "--save", str(saved))
    r = cli("eval", str(programs / source), *sets, "--load", str(saved), "--data", "synthetic", "--device", "cpu",
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_run(programs, "MLP", "--eval", "--load", str(saved))
    assert set(got) == set(want) == {"device", "precision", "test_loss", "test_accuracy", "test_top5_accuracy"}
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert got["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=0.02)
    bad = java(programs / "build", "MLP", "--eval", "--iters", "3", cwd=programs)
    assert bad.returncode == 2 and "--eval takes --load" in bad.stderr


def test_predict_writes_what_deepdsl_predict_writes(cli, programs: Path) -> None:
    source, sets = NETWORKS["Regression"]
    saved = programs / "reg_predict.npz"
    python_run(cli, programs, "Regression", "--iters", "2", "--save", str(saved))
    x = np.random.default_rng(4).random((11, 64), np.float32)  # 11 samples: the last batch of 8 is partial
    np.savez(programs / "x11.npz", x=x, y=np.zeros(11, np.int64))  # an array predict does not read: ignored
    want = programs / "python_predict.npz"
    r = cli("predict", str(programs / source), *sets, "--load", str(saved), "--data", f"npz:{programs / 'x11.npz'}",
            "-o", str(want), "--device", "cpu")  # fmt: skip
    assert r.exit_code == 0, r.output
    j = java(programs / "build", "Regression", "--predict", "java_predict.npz", "--load", str(saved), "--data",
             "npz:x11.npz", "--device", "cpu", cwd=programs)  # fmt: skip
    assert j.returncode == 0, j.stderr
    got = np.load(programs / "java_predict.npz")
    assert list(got) == ["predict"] and got["predict"].shape == (11, 4)
    np.testing.assert_allclose(got["predict"], np.load(want)["predict"], rtol=1e-5, atol=1e-6)
    bad = java(programs / "build", "Regression", "--predict", "o.npz", "--load", str(saved), cwd=programs)
    assert bad.returncode == 2 and "--predict OUT.npz takes --load FILE.npz and --data SOURCE" in bad.stderr


def test_a_network_without_predict_says_so_when_asked_to_predict(programs: Path) -> None:
    saved = programs / "no_predict.npz"
    assert java(programs / "build", "NoPredict", "--iters", "0", "--save", str(saved), cwd=programs).returncode == 0
    r = java(programs / "build", "NoPredict", "--predict", "o.npz", "--load", str(saved), "--data", "synthetic",
             cwd=programs)  # fmt: skip
    assert r.returncode == 1 and "the network defines no `predict`, so there is nothing to predict" in r.stderr
