"""--precision bf16 on the PyCUDA runner without a GPU: our kernels' bf16 loads and stores (library.cu dd_bf16) round
as the NumPy runner does, bit for bit; NVRTC compiles the bf16 programs; the runner allocates the bf16 plan; and
LeNet and the small batch-norm/residual network train on the emulator with the stand-in cuBLAS (GemmEx on bf16
operands) and cuDNN (bf16 convolutions), agreeing with the NumPy runner's bf16 run."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver, emulate, fake_vendor
from helpers import ROOT, SMALL

from deepdsl import api
from deepdsl.backends.cuda import nvrtc
from deepdsl.backends.cuda.kernels import ie_kernel
from deepdsl.backends.cuda.runner import GpuRunner, check_bf16_arch
from deepdsl.backends.cuda.translation import program, translation_unit
from deepdsl.backends.cuda.vendor import open_vendor
from deepdsl.errors import DslProgramError
from deepdsl.ir.indexexpr import Affine, Read
from deepdsl.ops.precision import bf16_bits, from_bf16_bits
from deepdsl.passes.data_parallel import Bucketing
from deepdsl.running import run_training
from deepdsl.trainer import Trainer

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="no gcc/g++")

# |loss on the emulated GPU - loss on the NumPy runner| / loss, both bf16, over the first steps. Measured: at most
# 0.86e-3 over LeNet's first 4 steps (batch 8) and 1.0e-3 over the small network's first 5. The two round at the same
# points; they differ in the float32 sums' order (the stand-ins accumulate in double, our kernels in float), which
# moves a result across a bf16 rounding boundary now and then, and in the bias epilogue of a GEMM or convolution,
# which our kernels add to the bf16-rounded product (one rounding more than the NumPy runner, which rounds the
# statement's result once). Those differences of a bf16 ulp grow as training goes on (the trajectories drift apart:
# 6.9e-2 at worst over LeNet's 30 steps, 1.4e-2 over the small network's 40), so longer runs are compared as
# tests/test_precision_bf16.py compares bf16 with fp32: the mean of the last 5 losses within MARGIN (measured:
# LeNet 0.716 against the NumPy runner's 0.733, the small network 0.723 against 0.726).
AGREE = 5e-3
FIRST = 4  # the steps compared one by one
MARGIN = 0.05


def _edge_cases() -> np.ndarray:
    """float32 bit patterns where rounding to bf16 can go wrong: ties either way, carries into the exponent and to
    infinity, subnormals, signed zeros, infinities, quiet and signalling NaNs of both signs; then random bits."""
    bits = [
        0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # 1 + 2^-8 (a tie, to even: down), 1 + 3*2^-8 (up), near ties
        0xBF808000, 0xBF818000,  # the same, negative
        0x3FFFFFFF, 0x3F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF,  # carries: to 2, to 1, the largest finite, to inf
        0xFF7F8000, 0x00000001, 0x00008000, 0x00018000, 0x00017FFF, 0x007FFFFF, 0x807FFFFF,  # -inf; subnormals
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # zeros, infinities
        0x7FC00000, 0x7F800001, 0x7F80FFFF, 0xFF800001, 0xFFFFFFFF, 0x7FFFFFFF, 0x7FBFFFFF,  # NaNs (signalling ones)
    ]  # fmt: skip
    rng = np.random.default_rng(0)
    return np.concatenate([np.array(bits, np.uint32), rng.integers(0, 2**32, 4096, dtype=np.uint32)])


def _round_trip_kernels() -> tuple[str, tuple[str, ...]]:
    """Two kernels as the program writes them: a float32 input stored as bf16 (cast_bf16's copy) and a bf16 input
    stored as float32 (a bf16 value read by an fp32 statement)."""
    n = len(_edge_cases())
    out = (("i0", n),)
    body = Read(0, (Affine.var("i0"),))
    narrow = ie_kernel("to_bf16", body, out, ((n,),), ("float",), out_ctype="dd_bf16")
    widen = ie_kernel("from_bf16", body, out, ((n,),), ("dd_bf16",))
    return translation_unit("round trip", narrow.text + "\n\n" + widen.text), ("to_bf16", "from_bf16")


def _launch(lib: ctypes.CDLL, kernel: str, out: np.ndarray, x: np.ndarray) -> None:
    args = (ctypes.c_void_p * 2)(out.ctypes.data, x.ctypes.data)
    getattr(lib, f"run_{kernel}")(4, 1, 1, 64, 1, args)


def test_the_kernels_round_to_bf16_as_the_numpy_runner_does_bit_for_bit(tmp_path: Path) -> None:
    source, kernels = _round_trip_kernels()
    lib = emulate(source, kernels, tmp_path)
    x = _edge_cases()
    got = np.full(len(x), 0xDEAD, np.uint16)
    _launch(lib, "to_bf16", got, x)
    want = bf16_bits(x.view(np.float32))
    np.testing.assert_array_equal(got, want)  # the bits: NaN payloads, signs and infinities included
    assert got[9] == 0x7F80 and got[3] == 0x3F80 and got[2] == 0x3F81 and got[14] == 0x0002  # spot checks
    assert (got[[23, 24, 25, 26, 27]] & 0x7FC0 == 0x7FC0).all()  # every NaN stays a (quiet) NaN, signalling too
    b = np.random.default_rng(1).integers(0, 2**16, len(x), dtype=np.uint16)
    wide = np.zeros(len(x), np.float32)
    _launch(lib, "from_bf16", wide, b)
    np.testing.assert_array_equal(wide.view(np.uint32), from_bf16_bits(b).view(np.uint32))


def _programs(network: str, precision: str = "bf16") -> api.Build:
    program = (api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 8}).program if network == "lenet" else
               api.compile_source(SMALL, "small.ddsl").program)  # fmt: skip
    return api.build(program, api.Options(precision=precision))


@pytest.mark.skipif(nvrtc.nvrtc_version() is None, reason="needs NVRTC (the test extra)")
def test_nvrtc_compiles_the_bf16_kernels() -> None:
    source, _ = _round_trip_kernels()
    assert nvrtc.ptx(source, "sm_80", "round.cu", strict=True)
    # the small network: every library.cu function LeNet's program calls (convolutions, GEMMs, pooling, the loss)
    # and more (batch norm's backward), on bf16 pointers
    text = translation_unit("small", program(_programs("small").train_plan).body)
    assert "dd_bf16* __restrict__ out" in text and "const dd_bf16* __restrict__ in0" in text
    assert nvrtc.ptx(text, "sm_90", "small.cu", strict=True)
    # data-parallel: bf16 weight gradients packed into a float32 bucket (the pack kernel widens them)
    small = api.compile_source(SMALL, "small.ddsl").program
    build = api.build(small, api.Options(precision="bf16", buckets=Bucketing(1 << 20, 1 << 20)))
    text = translation_unit("small_dp", program(build.train_plan).body)
    assert "static_cast<const dd_bf16*>(parts[lo])" in text
    assert nvrtc.ptx(text, "sm_90", "small_dp.cu", strict=True)


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vendor(tmp_path_factory.mktemp("bf16_vendor"))


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the emulated programs: a program compiled once serves every test that runs it."""
    return tmp_path_factory.mktemp("bf16_emulated")


def _counts(folder: Path) -> tuple[int, int, int, int]:
    """The stand-ins' counts: (cuBLAS GEMMs on bf16 operands, cuDNN bf16 convolutions, TF32 GEMMs, TF32 convs)."""
    cublas, cudnn = (ctypes.CDLL(str(folder / name)) for name in ("libcublas.so.12", "libcudnn.so.9"))
    return (int(cublas.fake_cublas_bf16_calls()), int(cudnn.fake_cudnn_bf16_calls()),
            int(cublas.fake_cublas_tf32_calls()), int(cudnn.fake_cudnn_tf32_calls()))  # fmt: skip


def test_a_gemm_ex_on_bf16_operands_rounds_only_its_result(stand_ins: Path) -> None:
    """cuBLAS GemmEx with CUDA_R_16BF A, B and C, compute 32F: the exact products of the bf16 operands summed in float
    and rounded once, as the hardware; an SGEMM of the same (widened) operands differs only by that rounding."""
    from deepdsl.ir.vendor import Gemm

    rng = np.random.default_rng(0)
    a, b = (bf16_bits(rng.standard_normal(s).astype(np.float32)) for s in ((5, 7), (7, 3)))
    vendor = open_vendor("vendor", [stand_ins])
    try:
        before = _counts(stand_ins)
        c = np.full((5, 3), 0xFFFF, np.uint16)
        bound = vendor.bind(Gemm(1, 5, 3, 7, False, False), [c.ctypes.data, a.ctypes.data, b.ctypes.data],
                            bf16=[True, True, True])  # fmt: skip
        assert bound is not None and "GemmEx" in bound.what
        bound.run()
        assert _counts(stand_ins)[0] == before[0] + 1
        exact = from_bf16_bits(a).astype(np.float64) @ from_bf16_bits(b)
        np.testing.assert_array_equal(c, bf16_bits(exact.astype(np.float32)))
        # mixed operands have no GemmEx here: our kernel runs; a float32 call stays SGEMM
        assert vendor.bind(Gemm(1, 5, 3, 7, False, False), [0, 0, 0], bf16=[True, True, False]) is None
        assert vendor.bind(Gemm(1, 5, 3, 7, False, False), [0, 0, 0]).what == "cuBLAS SGEMM"  # type: ignore[union-attr]
    finally:
        vendor.close()


def test_the_runner_allocates_the_bf16_plan(emulated: Path) -> None:
    """The arena is the bf16 plan's (two bytes a bf16 value: smaller than fp32's), parameters and optimiser state
    stay float32 master copies, and the GPU memory the runner takes is exactly what it plans."""
    b, f = _programs("small"), _programs("small", "fp32")
    arrays = Trainer(b, data=None).arrays  # type: ignore[arg-type]
    runner = GpuRunner(EmulatedDriver(emulated / "small"), b.train_plan, b.infer_plan, arrays, b.eval_plan)
    try:
        plans = [p for p in (b.train_plan, b.infer_plan, b.eval_plan) if p is not None]
        assert runner.arena_bytes == max(p.arena_bytes for p in plans)
        assert b.train_plan.arena_bytes < f.train_plan.arena_bytes
        assert runner.measured_bytes == runner.planned_bytes
        assert all(a.dtype == np.float32 for a in runner.arrays().values())
    finally:
        runner.close()


def test_a_gpu_without_bf16_tensor_cores_is_refused_where_the_libraries_would_get_bf16(
    emulated: Path, stand_ins: Path
) -> None:  # fmt: skip
    """On sm_75 (Turing) cuBLAS and cuDNN refuse bf16 operands: a bf16 plan on the vendor libraries stops with an error
    naming the GPU and the way out; the fp32 plan, and the bf16 plan on our own kernels, start."""
    b, f = _programs("small"), _programs("small", "fp32")
    arrays = Trainer(b, data=None).arrays  # type: ignore[arg-type]

    class Turing(EmulatedDriver):
        arch = "sm_75"

    vendor = open_vendor("vendor", [stand_ins])
    try:
        with pytest.raises(DslProgramError, match=r"--precision bf16: the CPU emulating a GPU .* no bf16 tensor cores "
                           r"\(compute capability 8.0 or newer"):  # fmt: skip
            GpuRunner(Turing(emulated / "turing", vendor=vendor), b.train_plan, b.infer_plan, arrays, b.eval_plan)
        check_bf16_arch(Turing(emulated / "turing", vendor=vendor), f.train_plan)  # fp32 there: no error
        check_bf16_arch(EmulatedDriver(emulated / "hopper", vendor=vendor), b.train_plan)  # bf16 on sm_90
    finally:
        vendor.close()
    check_bf16_arch(Turing(emulated / "turing"), b.train_plan)  # our kernels alone: bf16 in software


def _agreement(network: str, iters: int, folder: Path, stand_ins: Path) -> tuple[list[float], list[float]]:
    """`network` in bf16 for `iters` steps on the NumPy runner and on the emulated GPU with the stand-ins: the GEMMs
    and convolutions on bf16 operands must go to GemmEx and cuDNN's bf16 convolutions, none to TF32 math."""
    b = _programs(network)
    cpu = run_training(b, iters=iters, data_flag="synthetic", device="cpu")
    before = _counts(stand_ins)
    driver = EmulatedDriver(folder, vendor=open_vendor("vendor", [stand_ins]))
    gpu = run_training(b, iters=iters, data_flag="synthetic", driver=driver)
    gemms, convs, tf32_gemms, tf32_convs = (after - was for was, after in zip(before, _counts(stand_ins)))
    assert gemms > 0 and convs > 0 and tf32_gemms == tf32_convs == 0
    assert gpu["device"] == "cuda" and gpu["precision"] == cpu["precision"] == "bf16"
    np.testing.assert_allclose(gpu["losses"][:FIRST], cpu["losses"][:FIRST], rtol=AGREE)
    # bf16, not float32 under another name: the first step's loss (before any update) is the NumPy runner's bf16 one
    # (LeNet: equal; the small network: 2.9e-5 relative), far nearer it than the fp32 one (1.6e-3, 2.7e-4)
    fp32 = run_training(_programs(network, "fp32"), iters=1, data_flag="synthetic", device="cpu")["losses"]
    assert abs(gpu["losses"][0] - cpu["losses"][0]) < 0.25 * abs(gpu["losses"][0] - fp32[0])
    assert abs(np.mean(gpu["losses"][-5:]) - np.mean(cpu["losses"][-5:])) < MARGIN
    return cpu["losses"], gpu["losses"]


def test_the_small_network_in_bf16_on_the_gpu_runner_agrees_with_the_numpy_runner(
    emulated: Path, stand_ins: Path
) -> None:  # fmt: skip
    """Batch norm (its statistics fp32, its apply bf16), a residual add, concat, dropout, pooling, convolutions and
    GEMMs: the first steps agree with the NumPy runner's bf16 run (LeNet too, in the slow tier)."""
    _agreement("small", FIRST, emulated / "small", stand_ins)


@pytest.mark.slow  # the slow tier: the default suite's four-minute budget
@pytest.mark.parametrize(("network", "iters"), [("lenet", 30), ("small", 40)])
def test_bf16_trains_on_the_gpu_runner(emulated: Path, stand_ins: Path, network: str, iters: int) -> None:
    """The loss falls to half its start in bf16 on the emulated GPU, ending as the NumPy runner's bf16 run does."""
    _, gpu = _agreement(network, iters, emulated / network, stand_ins)
    assert np.mean(gpu[-5:]) < 0.5 * np.mean(gpu[:5])
