"""--precision tf32 on the CUDA runner: cuBLAS in CUBLAS_TF32_TENSOR_OP_MATH and cuDNN's convolutions in
CUDNN_TENSOR_OP_MATH, checked on the stand-ins (fake_libcublas.c rounds a TF32 GEMM's operands as the tensor cores
do and counts those GEMMs; fake_libcudnn.c counts the convolutions whose math type allows TF32); only under the
setting, our kernels unchanged."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver, fake_vendor
from helpers import ROOT

import deepdsl.devices as devices
import deepdsl.running as running
from deepdsl import api
from deepdsl.backends.cuda.vendor import open_vendor
from deepdsl.ir.vendor import Gemm
from deepdsl.running import run_training

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vendor(tmp_path_factory.mktemp("tf32"))


def _tf32_calls(folder: Path) -> tuple[int, int]:
    cublas, cudnn = (ctypes.CDLL(str(folder / name)) for name in ("libcublas.so.12", "libcudnn.so.9"))
    return int(cublas.fake_cublas_tf32_calls()), int(cudnn.fake_cudnn_tf32_calls())


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 rounded to TF32 (10 mantissa bits, nearest even), as the stand-in and the tensor cores read it."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0xFFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)).astype(np.uint32).view(np.float32)


def test_a_tf32_gemm_rounds_its_operands_and_only_under_the_math_mode(folder: Path) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7), np.float32), rng.standard_normal((7, 3), np.float32)
    out = {}
    for tf32 in (False, True):
        vendor = open_vendor("vendor", [folder], tf32=tf32)
        assert ("TF32" in vendor.description) == tf32
        c = np.full((5, 3), np.nan, np.float32)
        before = _tf32_calls(folder)
        bound = vendor.bind(Gemm(1, 5, 3, 7, False, False), [c.ctypes.data, a.ctypes.data, b.ctypes.data])
        assert bound is not None
        bound.run()
        assert _tf32_calls(folder)[0] - before[0] == int(tf32)
        out[tf32] = c
        vendor.close()
    np.testing.assert_allclose(out[False], a.astype(np.float64) @ b, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out[True], _tf32(a).astype(np.float64) @ _tf32(b), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(out[False], out[True])  # TF32 is visibly not float32
    np.testing.assert_allclose(out[True], out[False], rtol=5e-3, atol=5e-3)


@pytest.mark.slow  # the slow tier: the default suite's four-minute budget
def test_lenet_under_tf32_runs_its_gemms_and_convolutions_in_tf32(tmp_path: Path, folder: Path) -> None:
    build = api.build(api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 4}).program)
    losses = {}
    for tf32 in (False, True):
        before = _tf32_calls(folder)
        driver = EmulatedDriver(tmp_path / str(tf32), vendor=open_vendor("vendor", [folder], tf32=tf32))
        got = run_training(build, iters=2, data_flag="synthetic", driver=driver)
        gemms, convs = (b - a for a, b in zip(before, _tf32_calls(folder)))
        assert (gemms > 0 and convs > 0) if tf32 else gemms == convs == 0
        losses[tf32] = got["losses"]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-2)  # TF32 keeps ~3 decimal digits


def test_tf32_before_ampere_runs_as_fp32() -> None:
    build = api.build(api.compile_file(ROOT / "networks" / "mlp.ddsl", {"N": 4}).program, api.Options(precision="tf32"))
    assert devices.precision_ran(build, "sm_90") == ("tf32", None)
    assert devices.precision_ran(build, "sm_80") == ("tf32", None)
    ran, note = devices.precision_ran(build, "sm_75")
    assert ran == "fp32" and note is not None and "(sm_75) has no TF32 tensor cores" in note


@pytest.mark.slow  # 8 s: an emulated run
def test_tf32_on_a_gpu_before_ampere_says_it_ran_fp32(tmp_path: Path) -> None:
    """cuBLAS and cuDNN ignore TF32 math before sm_80: the device line and --json say fp32 ran, and why."""

    class Turing(EmulatedDriver):
        arch = "sm_75"

    build = api.build(api.compile_file(ROOT / "networks" / "mlp.ddsl", {"N": 4}).program, api.Options(precision="tf32"))
    lines: list[str] = []
    got = run_training(build, iters=1, data_flag="synthetic", driver=Turing(tmp_path / "t"), report=lines.append)
    assert got["device"] == "cuda" and got["precision"] == "fp32" and "no TF32 tensor cores" in got["precision_note"]
    assert lines[0].endswith("precision fp32 (tf32 asked: this GPU (sm_75) has no TF32 tensor cores (compute "
                             "capability 8.0 or newer), so cuBLAS and cuDNN run it as fp32)")  # fmt: skip


def test_run_precision_tf32_opens_the_gpu_in_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting reaches the driver: --precision tf32 asks PyCudaDriver for TF32 math, fp32 does not."""
    asked: list[bool] = []

    class Refused(devices.DslProgramError):
        pass

    def driver(kernels: str, tf32: bool = False) -> None:
        asked.append(tf32)
        raise Refused("--device cuda: no GPU here (test)")

    monkeypatch.setattr(devices, "pycuda_available", lambda: True)
    monkeypatch.setattr(devices, "PyCudaDriver", driver)
    program = api.compile_file(ROOT / "networks" / "mlp.ddsl", {"N": 4}).program
    for precision in ("tf32", "fp32"):
        build = api.build(program, api.Options(precision=precision))
        got = run_training(build, iters=1, data_flag="synthetic", device="auto")
        assert got["device"] == "cpu"
    assert asked == [True, False]


@pytest.mark.slow  # two emulated bf16 builds (14 s); test_bf16_cuda.py keeps one in the default suite
def test_bf16_runs_on_the_gpu_runner_given_or_under_auto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA runner runs bf16 (its kernels load and store bf16: tests/backends/test_bf16_cuda.py): a driver given
    runs it, and `--device auto` takes the GPU for it as for fp32, saying `precision bf16` on the device line."""
    program = api.compile_file(ROOT / "networks" / "mlp.ddsl", {"N": 4}).program
    build = api.build(program, api.Options(precision="bf16"))
    got = run_training(build, iters=1, data_flag="synthetic", driver=EmulatedDriver(tmp_path / "given"))
    assert got["device"] == "cuda" and got["precision"] == "bf16" and "precision_note" not in got
    monkeypatch.setattr(running, "open_device", lambda device, double=False, kernels="auto", tf32=False:
                        (EmulatedDriver(tmp_path / "auto"), "cuda (emulated)", None))  # fmt: skip
    lines: list[str] = []
    auto = run_training(build, iters=1, data_flag="synthetic", device="auto", report=lines.append)
    assert auto["device"] == "cuda" and auto["precision"] == "bf16"
    assert not any(line.startswith("CUDA not used") for line in lines)
    assert lines[0].startswith("device: cuda (emulated") and lines[0].endswith("precision bf16")
    np.testing.assert_allclose(auto["losses"], got["losses"], rtol=1e-6)


def test_compile_writes_bf16_and_float64_refuses_it(tmp_path: Path) -> None:
    """compile --precision bf16 writes the bf16 program (tests/backends/test_java_bf16.py runs it); --float64 runs
    fp32 programs only."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    mlp = str(ROOT / "networks" / "mlp.ddsl")
    r = CliRunner().invoke(cli, ["compile", mlp, "--precision", "bf16", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert '.precision("bf16")' in (tmp_path / "out" / "MLP.java").read_text()
    r = CliRunner().invoke(cli, ["run", mlp, "--set", "N=4", "--iters", "1", "--data", "synthetic", "--float64",
                                 "--precision", "bf16"])  # fmt: skip
    assert r.exit_code == 1 and "--float64 runs fp32 programs" in r.output
