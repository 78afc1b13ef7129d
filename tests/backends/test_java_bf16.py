"""`deepdsl compile --precision bf16`: the Java program's CUDA device runs the bf16 plan on the stand-in driver (its
kernels compiled for the CPU), cuBLAS (GemmEx on bf16 operands) and cuDNN (bf16 convolutions), each bf16 call
counted, and agrees with the NumPy runner's bf16 run at tests/backends/test_bf16_cuda.py's tolerance; its CPU device
runs the same program in fp32 and says so; the plan is fixed when compiled (--precision cannot switch into or out of
bf16); a GPU of compute capability under 8.0 is refused by name."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from cuda13_stand_ins import fake_cuda13, fake_cudnn9
from helpers import ROOT, SMALL
from java_env import JAVA_MARKS, java
from test_bf16_cuda import AGREE, FIRST, MARGIN
from test_java_cuda import build_programs, cpu, run

from deepdsl import api
from deepdsl.backends import java as java_backend
from deepdsl.backends.cuda import nvrtc
from deepdsl.backends.java import bf16
from deepdsl.cli import cli
from deepdsl.running import run_training

pytestmark = [
    *JAVA_MARKS,
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++"),
]


def _build(name: str, precision: str) -> api.Build:
    """`name` as test_java_cuda.py compiles it (LeNet at batch 8 and a learning rate of 0.001), for `precision`."""
    if name == "LeNet":
        source = (ROOT / "networks" / "lenet.ddsl").read_text().replace("lr=0.01,", "lr=0.001,")
        program = api.compile_source(source, "lenet_slow.ddsl", {"N": 8}).program
    else:
        program = api.compile_source(SMALL, "small.ddsl").program
    return api.build(program, api.Options(precision=precision))


def test_a_bf16_program_types_its_kernels_and_arena_and_fp32_ones_are_unchanged() -> None:
    """The bf16 program's temporaries are placed as the bf16 plan places them (atBf16 where the plan stores bf16),
    its kernels store dd_bf16 and its library calls launch entries typed by their pointers; an fp32 program has none
    of it."""
    b, f = _build("Small", "bf16"), _build("Small", "fp32")
    prog = java_backend.java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan)
    arena = max(p.arena_bytes for p in (b.train_plan, b.infer_plan, b.eval_plan))
    assert f".arena({b.train_plan.arena_bytes}L, {arena}L)" in prog.java
    assert re.search(r"final Buf conv1_out = atBf16\(\d+, 8, 4, 12, 12\);", prog.java)
    assert re.search(r"final Buf loss = at\(\d+\);", prog.java)  # the loss stays fp32
    assert "dd_bf16* __restrict__ out" in prog.cuda
    for entry in ("dd_k_conv2d_hhh", "dd_k_gemm_hhh", "dd_k_max_pool2d_hh", "dd_k_softmax_cross_entropy_fhf",
                  "dd_k_conv2d_backward_filter_hhh", "dd_k_bn_train_backward_fhhfffff"):  # fmt: skip
        assert f"void {entry}(" in prog.cuda
    plain = java_backend.java_program(f.program, f.train_plan, f.infer_plan, f.eval_plan)
    assert "atBf16" not in plain.java and "dd_bf16* " not in plain.cuda.split("// ---- the program's kernels")[1]
    assert "_hhh(" not in plain.cuda


def test_typed_entries_come_from_entries_cu_and_name_only_its_entries() -> None:
    """Every entry ENTRIES names is one of entries.cu with at least as many pointers as it says the device passes;
    each of its float pointers can be made bf16 (library.cu's functions are templated on each), no other."""
    source = java_backend.entries_source()
    for entries in bf16.ENTRIES.values():
        for name, n in entries:
            params = re.search(rf"void {name}\((.*?)\)", source, re.S).group(1).split(",")  # type: ignore[union-attr]
            assert all("*" in p for p in params[:n]), name
            codes = "".join("h" if "float*" in p else "f" for p in params[:n])
            text = bf16.typed_entry(source, name, codes)
            assert text.startswith(f'extern "C" __global__ void {name}_{codes}(') and "dd_bf16*" in text
    with pytest.raises(ValueError, match="no float pointer"):  # a label pointer cannot be made bf16
        bf16.typed_entry(source, "dd_k_softmax_cross_entropy", "ffh")


@pytest.mark.skipif(nvrtc.nvrtc_version() is None, reason="needs NVRTC (the test extra)")
@pytest.mark.slow  # 2.5 s (the default suite's four minutes; test_bf16_cuda's NVRTC check of bf16 kernels stays)
@pytest.mark.parametrize("name", ["Small", "LeNet"])
def test_nvrtc_compiles_every_kernel_of_the_bf16_program(name: str) -> None:
    b = _build(name, "bf16")
    prog = java_backend.java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan)
    kernels = prog.cuda.split("// ---- the program's kernels")[1]
    assert "dd_bf16* __restrict__ out" in kernels and "void dd_k_gemm_hhh(" in prog.cuda  # bf16, not fp32 kernels
    assert nvrtc.ptx(prog.cuda, "sm_90", f"{name}.cu", strict=True)


@pytest.fixture(scope="module")
def bf16_programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_programs(tmp_path_factory, ("Small",), ("--precision", "bf16"))


@pytest.fixture(scope="module")
def cuda13(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cuda13(tmp_path_factory.mktemp("cuda13"))


@pytest.fixture(scope="module")
def cudnn9(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cudnn9(tmp_path_factory.mktemp("cudnn9"))


@pytest.fixture(scope="module")
def bf16_lenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_programs(tmp_path_factory, ("LeNet",), ("--precision", "bf16"))


def _counted(folder: Path, name: str) -> dict[str, str]:
    return {"FAKE_CUBLAS_BF16_CALLS": str(folder / f"{name}.bf16_gemms"),
            "FAKE_CUDNN_BF16_CALLS": str(folder / f"{name}.bf16_convolutions"),
            "FAKE_CUBLAS_TF32_CALLS": str(folder / f"{name}.tf32_gemms"),
            "FAKE_CUDNN_TF32_CALLS": str(folder / f"{name}.tf32_convolutions")}  # fmt: skip


def _counts(folder: Path, name: str) -> tuple[int, ...]:
    return tuple(int(Path(p).read_text()) for p in _counted(folder, name).values())


def _agrees(folder: Path, name: str, iters: int, vendor: list[Path], data: str) -> dict:
    """`name`'s bf16 program on the stand-in GPU with `vendor`'s libraries: the GEMMs and convolutions on bf16
    operands counted as bf16 calls (none as TF32), and the first steps' losses the NumPy runner's bf16 ones."""
    got = run(folder, name, "--iters", str(iters), "--kernels", "vendor", "--data", data, vendor=vendor,
              extra=_counted(folder, name))  # fmt: skip
    assert got["rc"] == 0, got["stderr"]
    assert got["precision"] == "bf16" and "precision_note" not in got
    assert "precision bf16" in got["stderr"] and "GemmEx on bf16 operands" in got["stderr"]
    gemms, convolutions, tf32_gemms, tf32_convolutions = _counts(folder, name)
    assert gemms > 0 and convolutions > 0 and tf32_gemms == tf32_convolutions == 0
    b = _build(name, "bf16")
    numpy_bf16 = run_training(b, iters=iters, data_flag=data, device="cpu")["losses"]
    np.testing.assert_allclose(got["losses"][:FIRST], numpy_bf16[:FIRST], rtol=AGREE)
    # bf16, not float32 under another name: the first step's loss is far nearer the bf16 one than the fp32 one
    fp32 = run_training(_build(name, "fp32"), iters=1, data_flag=data, device="cpu")["losses"]
    assert abs(got["losses"][0] - numpy_bf16[0]) < 0.25 * abs(got["losses"][0] - fp32[0])
    assert abs(np.mean(got["losses"][-5:]) - np.mean(numpy_bf16[-5:])) < MARGIN
    return got


def _allocates_the_bf16_plan(got: dict, folder: Path) -> None:
    """The arena is the bf16 plan's (smaller than the fp32 plan's: memcheck --precision bf16's figure) and the device
    takes exactly what it plans (the stand-in driver counts what cuMemAlloc took)."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    m = CliRunner().invoke(cli, ["memcheck", str(folder / "small.ddsl"), "--precision", "bf16", "--json"])
    assert m.exit_code == 0, m.output
    memcheck = json.loads(m.output)
    assert got["arena_bytes"] == memcheck["arena_bytes"] and got["peak_bytes"] == memcheck["peak_bytes"]
    b, f = _build("Small", "bf16"), _build("Small", "fp32")
    assert got["arena_bytes"] == max(p.arena_bytes for p in (b.train_plan, b.infer_plan, b.eval_plan))
    assert got["arena_bytes"] < max(p.arena_bytes for p in (f.train_plan, f.infer_plan, f.eval_plan))
    assert got["gpu_memory_bytes"] == got["gpu_planned_bytes"]


def test_the_bf16_program_on_the_cuda_device_agrees_with_the_numpy_runner(
    bf16_programs: Path, cuda13: Path, cudnn9: Path
) -> None:  # fmt: skip
    got = _agrees(bf16_programs, "Small", FIRST, [cuda13, cudnn9], "synthetic")
    _allocates_the_bf16_plan(got, bf16_programs)


@pytest.mark.slow  # a fifth Java run on the emulated GPU (4 s)
def test_the_bf16_program_with_its_own_kernels_agrees_with_the_numpy_runner(bf16_programs: Path) -> None:
    """No cuBLAS, no cuDNN: the GEMMs and convolutions are our typed entries on bf16 pointers."""
    got = run(bf16_programs, "Small", "--iters", str(FIRST), "--kernels", "own")
    assert got["rc"] == 0, got["stderr"]
    want = run_training(_build("Small", "bf16"), iters=FIRST, data_flag="synthetic", device="cpu")["losses"]
    np.testing.assert_allclose(got["losses"], want, rtol=AGREE)
    _allocates_the_bf16_plan(got, bf16_programs)


def test_the_cpu_device_runs_a_bf16_program_in_fp32_and_says_so(bf16_programs: Path) -> None:
    """Every value float32 (each at twice its bf16-plan offset, the casts copies): the fp32 losses, not bf16's."""
    got = cpu(bf16_programs, "Small", "--iters", "3")
    assert got["precision"] == "fp32" and "bf16 runs on the CUDA device" in got["precision_note"]
    fp32 = run_training(_build("Small", "fp32"), iters=3, data_flag="synthetic", device="cpu")["losses"]
    np.testing.assert_allclose(got["losses"], fp32, rtol=1e-4)
    numpy_bf16 = run_training(_build("Small", "bf16"), iters=1, data_flag="synthetic", device="cpu")["losses"]
    assert abs(got["losses"][0] - fp32[0]) < 0.1 * abs(got["losses"][0] - numpy_bf16[0])


def test_precision_is_fixed_when_compiled(bf16_programs: Path) -> None:
    """The plan is the compile's: --precision cannot switch a bf16 program to fp32 or tf32, nor (test_java_run.py's
    fp32 programs) an fp32 one to bf16; either is a usage error naming the compile that writes the other."""
    for asked in ("fp32", "tf32"):
        r = java(bf16_programs / "build", "Small", "--data", "synthetic", "--device", "cpu", "--precision", asked,
                 cwd=bf16_programs)  # fmt: skip
        assert r.returncode == 2
        assert "compiled for bf16" in r.stderr and f"deepdsl compile --precision {asked}" in r.stderr
    r = java(bf16_programs / "build", "Small", "--data", "synthetic", "--device", "cpu", "--precision", "bf16",
             "--iters", "1", cwd=bf16_programs)  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_a_gpu_without_bf16_tensor_cores_is_refused(bf16_programs: Path) -> None:
    got = run(bf16_programs, "Small", "--iters", "1", extra={"FAKE_CUDA_CAPABILITY": "75"})
    assert got["rc"] == 1
    assert "compute capability 8.0 or newer" in got["stderr"] and "compute capability 7.5" in got["stderr"]


@pytest.mark.slow  # LeNet's bf16 program built, and 30 steps on the emulated GPU and the NumPy runner (10 s)
def test_lenet_trains_in_bf16_on_the_cuda_device(bf16_lenet: Path, cuda13: Path, cudnn9: Path) -> None:
    """LeNet at test_java_cuda.py's learning rate (0.001): the loss falls (measured: the mean of the first 5 steps
    2.63, of the last 5 2.10) as the NumPy runner's bf16 run does."""
    losses = _agrees(bf16_lenet, "LeNet", 30, [cuda13, cudnn9], "synthetic")["losses"]
    assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5])


@pytest.mark.slow  # a third program built (javac, its kernels compiled for the CPU) and run twice (16 s)
def test_a_data_parallel_bf16_program_packs_its_bf16_gradients_into_float32_buckets(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    """--data-parallel: each bf16 weight gradient is widened into its float32 bucket (entries.cu's dd_k_dp_pack
    typed `fhf`); one rank's training is the plain bf16 program's on the NumPy runner."""
    folder = build_programs(tmp_path_factory, ("Small",), ("--precision", "bf16", "--data-parallel"))
    assert "void dd_k_dp_pack_fhf(float* out, const dd_bf16* in" in (folder / "src" / "Small.cu").read_text()
    log = folder / "launches.log"
    got = run(folder, "Small", "--iters", str(FIRST), "--kernels", "own", "--no-graph",
              extra={"FAKE_CUDA_LAUNCH_LOG": str(log)})  # fmt: skip
    assert got["rc"] == 0, got["stderr"]
    assert got["precision"] == "bf16"
    launched = log.read_text().split()
    assert "dd_k_dp_pack_fhf" in launched and "dd_k_gemm_hhh" in launched
    want = run_training(_build("Small", "bf16"), iters=FIRST, data_flag="synthetic", device="cpu")["losses"]
    np.testing.assert_allclose(got["losses"], want, rtol=AGREE)
    # gradient accumulation of a bf16 program: the float32 buckets accumulated on the GPU, as the NumPy runner's
    # --micro-batches 2 of the same program
    micro = run(folder, "Small", "--iters", str(FIRST), "--kernels", "own", "--micro-batches", "2")
    assert micro["rc"] == 0, micro["stderr"]
    assert micro["precision"] == "bf16" and "(--micro-batches 2)" in micro["stderr"]
    source = tmp_path_factory.mktemp("bf16_micro") / "small.ddsl"
    source.write_text(SMALL)
    r = CliRunner().invoke(cli, ["run", str(source), "--device", "cpu", "--precision", "bf16", "--micro-batches", "2",
                                 "--data", "synthetic", "--iters", str(FIRST), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    np.testing.assert_allclose(micro["losses"], json.loads(r.output.splitlines()[-1])["losses"], rtol=AGREE)


@pytest.mark.slow  # three more Java runs (train and save, predict on each device: 6 s)
def test_a_bf16_prediction_comes_back_widened_to_float32(bf16_programs: Path) -> None:
    """`predict` (Small's last linear layer, stored bf16) read from the GPU: float32 values that are bf16 ones (their
    low 16 bits zero), near the CPU device's fp32 prediction from the same parameters."""
    trained = run(bf16_programs, "Small", "--iters", "2", "--kernels", "own", "--save", "p.npz")
    assert trained["rc"] == 0, trained["stderr"]
    on_gpu = run(bf16_programs, "Small", "--kernels", "own", "--load", "p.npz", "--predict", "gpu.npz")
    assert on_gpu["rc"] == 0, on_gpu["stderr"]
    r = java(bf16_programs / "build", "Small", "--data", "synthetic", "--device", "cpu", "--load", "p.npz",
             "--predict", "cpu.npz", cwd=bf16_programs)  # fmt: skip
    assert r.returncode == 0, r.stderr
    with np.load(bf16_programs / "gpu.npz") as g, np.load(bf16_programs / "cpu.npz") as c:
        got, want = g["predict"], c["predict"]
    assert got.dtype == np.float32 and not (got.view(np.uint32) & 0xFFFF).any()
    np.testing.assert_allclose(got, want, atol=2e-2 * float(np.abs(want).max()))
    assert not np.array_equal(got, want)
