"""The GPU runner's vendor path (`--kernels vendor|own|auto`, backends/cuda/vendor.py) without a GPU: the stand-in
cuBLAS and cuDNN (fake_libcublas.c, fake_libcudnn.c, host memory) checked against NumPy first, then the runner with
them against the NumPy runner, the library search, and the messages where a library is missing."""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from cuda_emulator import EmulatedDriver, fake_vendor, same_bits
from helpers import NORMED, POOLED, ROOT, SMALL

import deepdsl.devices as devices
from deepdsl import api
from deepdsl.backends.cuda import runner as gpu_runner
from deepdsl.backends.cuda.vendor import (
    CUBLAS_SONAMES,
    OWN,
    MissingLibrary,
    Vendor,
    candidates,
    library_folders,
    open_vendor,
)
from deepdsl.cli import cli
from deepdsl.errors import DslProgramError
from deepdsl.ir import REGISTRY, TensorType
from deepdsl.ir.vendor import Gemm, Lrn, vendor_call
from deepdsl.running import run_training

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="no gcc/g++")
pytestmark = needs_gcc

OP_N, OP_T = 0, 1


@pytest.fixture(scope="module")
def cublas_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both stand-ins (the name: most tests here are about cuBLAS)."""
    return fake_vendor(tmp_path_factory.mktemp("vendor"))


@pytest.fixture(scope="module")
def lib(cublas_folder: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(cublas_folder / "libcublas.so.12"))


def _fp(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def _sgemm(lib: ctypes.CDLL, ta: int, tb: int, m: int, n: int, k: int, a: np.ndarray, lda: int, b: np.ndarray,
           ldb: int, c: np.ndarray, ldc: int, alpha: float = 1.0, beta: float = 0.0) -> int:  # fmt: skip
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    i = ctypes.c_int
    status = lib.cublasSgemm_v2(handle, i(ta), i(tb), i(m), i(n), i(k), ctypes.byref(ctypes.c_float(alpha)), _fp(a),
                                i(lda), _fp(b), i(ldb), ctypes.byref(ctypes.c_float(beta)), _fp(c), i(ldc))  # fmt: skip
    assert lib.cublasDestroy_v2(handle) == 0
    return int(status)


def _column_major(x: np.ndarray, ld: int) -> np.ndarray:
    """x (rows x cols) stored column-major with leading dimension ld >= rows; the padding rows are 1e6."""
    rows, cols = x.shape
    store = np.full((cols, ld), 1e6, np.float32)
    store[:, :rows] = x.T
    return store


@pytest.mark.parametrize("ta", [OP_N, OP_T])
@pytest.mark.parametrize("tb", [OP_N, OP_T])
def test_the_stand_in_sgemm_is_blas_sgemm(lib: ctypes.CDLL, ta: int, tb: int) -> None:
    """Column-major C = alpha op(A) op(B) + beta C with padded leading dimensions (padding 1e6, so a stand-in that
    ignored them would show), against NumPy."""
    rng = np.random.default_rng(ta * 2 + tb)
    m, n, k = 5, 4, 3
    a = rng.random((k, m) if ta else (m, k), np.float32)
    b = rng.random((n, k) if tb else (k, n), np.float32)
    c0 = rng.random((m, n), np.float32)
    lda, ldb, ldc = a.shape[0] + 2, b.shape[0] + 1, m + 3
    sa, sb, sc = _column_major(a, lda), _column_major(b, ldb), _column_major(c0, ldc)
    assert _sgemm(lib, ta, tb, m, n, k, sa, lda, sb, ldb, sc, ldc, alpha=2.0, beta=0.5) == 0
    want = 2.0 * ((a.T if ta else a) @ (b.T if tb else b)) + 0.5 * c0
    np.testing.assert_allclose(sc[:, :m].T, want, rtol=1e-5)
    assert (sc[:, m:] == 1e6).all()  # the padding of C untouched


def test_the_stand_in_checks_leading_dimensions_and_ignores_c_when_beta_is_zero(lib: ctypes.CDLL) -> None:
    m, n, k = 4, 3, 2
    a, b = np.ones((k, m), np.float32), np.ones((n, k), np.float32)  # column-major A [m, k] (ld m), B [k, n] (ld k)
    c = np.full((n, m), np.nan, np.float32)  # a NaN in C is not read when beta is 0 (as cuBLAS)
    assert _sgemm(lib, OP_N, OP_N, m, n, k, a, m, b, k, c, m) == 0
    np.testing.assert_array_equal(c, np.full((n, m), k, np.float32))
    assert _sgemm(lib, OP_N, OP_N, m, n, k, a, m - 1, b, k, c, m) == 7  # lda < m: CUBLAS_STATUS_INVALID_VALUE
    assert _sgemm(lib, OP_T, OP_N, m, n, k, a, k - 1, b, k, c, m) == 7  # op(A) = T needs lda >= k
    assert _sgemm(lib, OP_N, OP_N, m, n, k, a, m, b, k, c, m - 1) == 7


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_row_major_gemm_through_cublas_is_numpys(cublas_folder: Path, ta: bool, tb: bool, batch: int) -> None:
    """The runner's mapping of a row-major Gemm fact onto column-major cuBLAS (operands swapped, strided batches),
    on shapes where no two of M, N, K are equal (a swapped size or stride would read the wrong elements)."""
    vendor = open_vendor("vendor", [cublas_folder])
    m, n, k = 5, 7, 3
    rng = np.random.default_rng(batch)
    a = rng.random((batch, *((k, m) if ta else (m, k))), np.float32)
    b = rng.random((batch, *((n, k) if tb else (k, n))), np.float32)
    c = np.full((batch, m, n), np.nan, np.float32)
    bound = vendor.bind(Gemm(batch, m, n, k, ta, tb), [c.ctypes.data, a.ctypes.data, b.ctypes.data])
    assert bound is not None
    bound.run()
    want = (np.swapaxes(a, 1, 2) if ta else a) @ (np.swapaxes(b, 1, 2) if tb else b)
    np.testing.assert_allclose(c, want, rtol=1e-5)
    vendor.close()


def test_a_cublas_failure_is_a_message(cublas_folder: Path) -> None:
    vendor = open_vendor("vendor", [cublas_folder])
    assert vendor.cublas is not None
    x = np.zeros(4, np.float32)
    with pytest.raises(DslProgramError, match="cublasSgemm_v2 failed .CUBLAS_STATUS_INVALID_VALUE"):
        vendor.bind(Gemm(1, 2, 2, -1, False, False), [x.ctypes.data] * 3).run()  # type: ignore[union-attr]
    vendor.close()


# ---- finding the library ----


def test_the_library_is_found_where_users_have_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LD_LIBRARY_PATH first, then pip's nvidia/*/lib wheels in this Python, then the CUDA toolkit, then the bare
    sonames for the loader; CUDA 13 before CUDA 12 in each folder."""
    ld, site, toolkit = tmp_path / "ld", tmp_path / "site", tmp_path / "cuda"
    wheel = site / "nvidia" / "cublas" / "lib"
    for folder, name in ((ld, "libcublas.so.12"), (wheel, "libcublas.so.13"), (wheel, "libcublas.so.12"),
                         (toolkit / "lib64", "libcublas.so.12")):  # fmt: skip
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(ld))
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    folders = library_folders()
    assert folders.index(ld) < folders.index(wheel) < folders.index(toolkit / "lib64")
    assert candidates(CUBLAS_SONAMES) == [
        str(ld / "libcublas.so.12"), str(wheel / "libcublas.so.13"), str(wheel / "libcublas.so.12"),
        str(toolkit / "lib64" / "libcublas.so.12"), *CUBLAS_SONAMES,
    ]  # fmt: skip


def test_vendor_without_the_libraries_names_them_and_how_to_install_them(tmp_path: Path, cublas_folder: Path) -> None:
    with pytest.raises(MissingLibrary) as err:
        open_vendor("vendor", [tmp_path])
    text = err.value.message
    assert "no cuBLAS: libcublas.so.13 or libcublas.so.12 not found; no cuDNN: libcudnn.so.9 not found" in text
    assert "pip install nvidia-cublas-cu12" in text and "CUDA toolkit" in text and "--kernels own" in text
    assert "pip install nvidia-cudnn-cu12" in text
    only_cublas = fake_vendor(tmp_path / "cublas", ["libcublas.so.12"])
    with pytest.raises(MissingLibrary, match=r"^--kernels vendor: no cuDNN: libcudnn.so.9 not found; install cuDNN 9"):
        open_vendor("vendor", [only_cublas])
    auto = open_vendor("auto", [only_cublas])  # auto: what loads, and what did not
    assert auto.cublas is not None and auto.cudnn is None
    assert auto.description == ("GEMMs by cuBLAS 12.0.0 (libcublas.so.12), the rest our kernels "
                                "(no cuDNN: libcudnn.so.9 not found)")  # fmt: skip
    auto.close()
    assert open_vendor("auto", [tmp_path]).description.startswith("our kernels (no cuBLAS: libcublas.so.13 or")
    assert open_vendor("own", [cublas_folder]) is OWN and OWN.description == "our kernels"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "libcublas.so.12").write_text("not a library")  # there, but does not load: said so
    with pytest.raises(DslProgramError, match=r"no cuBLAS: \S*broken/libcublas.so.12: file too short; no cuDNN"):
        open_vendor("vendor", [broken])


# ---- the stand-in cuDNN: the convolutions ----

CONVS = [  # (x shape, w shape, stride, pad, groups)
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1), 1),
    ((2, 4, 9, 8), (6, 2, 3, 2), (2, 1), (0, 1), 2),
    ((1, 2, 5, 5), (3, 2, 1, 1), (1, 1), (0, 0), 1),
]
CONV_OPS = ("conv2d", "conv2d_backward_data", "conv2d_backward_filter")


def _conv_case(k: int, op: str = "conv2d") -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
    """Convolution `k` of CONVS as statement `op`: its vendor fact, its two inputs, a NaN output, its attributes."""
    xs, ws, stride, pad, groups = CONVS[k]
    conv = {"stride": stride, "pad": pad, "groups": groups}
    ys = REGISTRY["conv2d"].shape((TensorType(xs), TensorType(ws)), conv).shape
    types, attrs = {"conv2d": ((xs, ws), conv), "conv2d_backward_data": ((ys, ws), {**conv, "in_shape": xs}),
                    "conv2d_backward_filter": ((xs, ys), {**conv, "w_shape": ws})}[op]  # fmt: skip
    tensors = tuple(TensorType(s) for s in types)
    out = REGISTRY[op].shape(tensors, attrs)
    fact = REGISTRY[op].vendor(tensors, out, attrs)
    rng = np.random.default_rng(k)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in types)
    return fact, a, b, np.full(out.shape, np.nan, np.float32), attrs


@pytest.mark.parametrize("op", CONV_OPS)
@pytest.mark.parametrize("k", range(len(CONVS)))
@pytest.mark.parametrize("room", [0, 1 << 20])
def test_a_convolution_through_cudnn_is_numpys(cublas_folder: Path, op: str, k: int, room: int) -> None:
    """The facts of conv2d and its two gradients as cuDNN descriptors (stride, padding, groups) give the NumPy
    kernel's output, with the algorithm the workspace allows: none, direct loops (IMPLICIT_GEMM, ALGO_0); enough,
    im2col in the workspace (IMPLICIT_PRECOMP_GEMM, ALGO_1)."""
    vendor = open_vendor("vendor", [cublas_folder])
    assert vendor.cudnn is not None
    fact, a, b, out, attrs = _conv_case(k, op)
    conv = vendor.cudnn.prepare(fact, room)
    with_room = "IMPLICIT_PRECOMP_GEMM" if op == "conv2d" else "ALGO_1"
    assert conv.algorithm == (with_room if room else ("IMPLICIT_GEMM" if op == "conv2d" else "ALGO_0"))
    assert (conv.workspace > 0) == bool(room)
    ws = np.zeros(max(conv.workspace, 4), np.uint8)
    vendor.cudnn.convolve(conv, out.ctypes.data, a.ctypes.data, b.ctypes.data, ws.ctypes.data)
    np.testing.assert_allclose(out, REGISTRY[op].numpy((a, b), attrs), rtol=1e-4, atol=1e-5)
    vendor.close()


def test_the_stand_in_cudnn_refuses_what_does_not_fit(cublas_folder: Path) -> None:
    """A workspace smaller than the algorithm needs, and a fact whose output size is not cuDNN's, are errors; a
    workspace that is the input itself gives another result (so the stand-in really uses its scratch, and the runner's
    agreement shows the planned workspace overlaps nothing alive)."""
    vendor = open_vendor("vendor", [cublas_folder])
    assert vendor.cudnn is not None
    fact, x, w, y, attrs = _conv_case(0)
    conv = vendor.cudnn.prepare(fact, 1 << 20)
    small = dataclasses.replace(conv, workspace=conv.workspace - 4)
    ws = np.zeros(conv.workspace, np.uint8)
    with pytest.raises(DslProgramError, match=r"cudnnConvolutionForward failed \(CUDNN_STATUS_BAD_PARAM\)"):
        vendor.cudnn.convolve(small, y.ctypes.data, x.ctypes.data, w.ctypes.data, ws.ctypes.data)
    with pytest.raises(DslProgramError, match=r"cuDNN makes ConvForward.* an output of \[2, 4, 7, 6\]"):
        vendor.cudnn.prepare(dataclasses.replace(fact, oh=6), 0)
    big = np.zeros(conv.workspace // 4 + x.size, np.float32)  # x at the start of a buffer long enough to be scratch
    big[: x.size] = x.ravel()
    vendor.cudnn.convolve(conv, y.ctypes.data, big.ctypes.data, w.ctypes.data, big.ctypes.data)
    assert not np.allclose(y, REGISTRY["conv2d"].numpy((x, w), attrs), rtol=1e-4, atol=1e-5)
    for op in ("conv2d_backward_data", "conv2d_backward_filter"):  # the gradients likewise
        fact, a, b, out, attrs = _conv_case(0, op)
        conv = vendor.cudnn.prepare(fact, 1 << 20)
        call = "cudnnConvolutionBackward" + ("Data" if op.endswith("data") else "Filter")
        assert conv.call == call and conv.workspace > 0
        with pytest.raises(DslProgramError, match=rf"{call} failed \(CUDNN_STATUS_BAD_PARAM\)"):
            vendor.cudnn.convolve(dataclasses.replace(conv, workspace=conv.workspace - 4), out.ctypes.data,
                                  a.ctypes.data, b.ctypes.data, ws.ctypes.data)  # fmt: skip
        big = np.zeros(conv.workspace // 4 + a.size, np.float32)  # the first input as the scratch
        big[: a.size] = a.ravel()
        vendor.cudnn.convolve(conv, out.ctypes.data, big.ctypes.data, b.ctypes.data, big.ctypes.data)
        assert not np.allclose(out, REGISTRY[op].numpy((a, b), attrs), rtol=1e-4, atol=1e-5)
    vendor.close()


def test_a_call_cudnn_refuses_runs_our_kernel_under_auto_and_is_an_error_under_vendor(cublas_folder: Path) -> None:
    """`auto` takes the vendor routine where the library takes the call, our kernel where it refuses it (here: a fact
    whose output size is not cuDNN's); `vendor` says why instead."""
    fact, x, w, y, _ = _conv_case(0)
    wrong = dataclasses.replace(fact, oh=6)
    pointers = (y.ctypes.data, x.ctypes.data, w.ctypes.data)
    auto, strict = open_vendor("auto", [cublas_folder]), open_vendor("vendor", [cublas_folder])
    assert auto.bind(fact, pointers) is not None and auto.bind(wrong, pointers) is None
    with pytest.raises(DslProgramError, match=r"cuDNN makes ConvForward.* an output of \[2, 4, 7, 6\]"):
        strict.bind(wrong, pointers)
    auto.close()
    strict.close()


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 4), (2, 3, 4)])
def test_a_bias_gradient_through_cudnn_is_numpys(cublas_folder: Path, shape: tuple[int, ...]) -> None:
    """channel_sum (the bias gradient of a convolution or a linear layer) as cudnnConvolutionBackwardBias; a db
    descriptor that is not [1, C, 1, 1] is refused."""
    vendor = open_vendor("vendor", [cublas_folder])
    assert vendor.cudnn is not None
    g = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    fact = REGISTRY["channel_sum"].vendor((TensorType(shape),), TensorType((shape[1],)), {})
    db = np.full(shape[1], np.nan, np.float32)
    vendor.bind(fact, [db.ctypes.data, g.ctypes.data]).run()  # type: ignore[union-attr]
    np.testing.assert_allclose(db, REGISTRY["channel_sum"].numpy((g,), {}), rtol=1e-5, atol=1e-6)
    dy, wrong = vendor.cudnn.prepare_bias(dataclasses.replace(fact, n=1, c=shape[0]))  # the batch as channels
    with pytest.raises(DslProgramError, match=r"cudnnConvolutionBackwardBias failed \(CUDNN_STATUS_BAD_PARAM\)"):
        vendor.cudnn.bias((vendor.cudnn.prepare_bias(fact)[0], wrong), db.ctypes.data, g.ctypes.data)
    vendor.close()


# ---- the stand-in cuDNN: pooling ----

POOLS = [  # (x shape, kernel, stride, pad)
    ((2, 3, 7, 6), (2, 2), (2, 2), (0, 0)),
    ((2, 2, 9, 8), (3, 3), (2, 1), (1, 1)),
    ((1, 2, 5, 5), (3, 2), (1, 2), (1, 0)),
]


def _pool_case(k: int, op: str, ties: bool = False) -> tuple[Any, tuple[np.ndarray, ...], np.ndarray, dict]:
    """Pooling `k` of POOLS as statement `op`: its vendor fact, its inputs, a NaN output, its attributes; `ties`:
    small integers in x, so that windows hold tied maxima."""
    xs, kernel, stride, pad = POOLS[k]
    attrs = {"kernel": kernel, "stride": stride, "pad": pad}
    rng = np.random.default_rng(k)
    x = (rng.integers(0, 3, xs) if ties else rng.standard_normal(xs)).astype(np.float32)
    forward = "max_pool2d" if op.startswith("max") else "avg_pool2d"
    y = REGISTRY[forward].numpy((x,), attrs)
    g = rng.standard_normal(y.shape).astype(np.float32)
    inputs = {"max_pool2d": (x,), "avg_pool2d": (x,), "max_pool2d_backward": (x, y, g),
              "avg_pool2d_backward": (g,)}[op]  # fmt: skip
    if op == "avg_pool2d_backward":
        attrs["in_shape"] = xs
    types = tuple(TensorType(a.shape) for a in inputs)
    out = REGISTRY[op].shape(types, attrs)
    return REGISTRY[op].vendor(types, out, attrs), inputs, np.full(out.shape, np.nan, np.float32), attrs


POOL_OPS = ("max_pool2d", "avg_pool2d", "max_pool2d_backward", "avg_pool2d_backward")


@pytest.mark.parametrize("op", POOL_OPS)
@pytest.mark.parametrize("k", range(len(POOLS)))
def test_pooling_through_cudnn_is_numpys(cublas_folder: Path, op: str, k: int) -> None:
    """Max and average pooling and their gradients as cuDNN pooling descriptors (floor mode, padding never a
    maximum, the average counting the padding) give the NumPy kernels' outputs; max pooling's gradient goes to the
    first maximum of a window in row-major order, as ours, where windows hold ties."""
    vendor = open_vendor("vendor", [cublas_folder])
    assert vendor.cudnn is not None
    for ties in (False, True) if op == "max_pool2d_backward" else (False,):
        fact, inputs, out, attrs = _pool_case(k, op, ties)
        pool = vendor.cudnn.prepare_pool(fact)
        vendor.cudnn.pool(pool, out.ctypes.data, tuple(a.ctypes.data for a in inputs))
        np.testing.assert_allclose(out, REGISTRY[op].numpy(inputs, attrs), rtol=1e-5, atol=1e-6)
    vendor.close()


def test_the_stand_in_pooling_refuses_what_does_not_fit(cublas_folder: Path) -> None:
    """A fact whose output size is not cuDNN's is an error; the average's fact with the maximum's mode runs, and
    the comparison with NumPy rejects it."""
    vendor = open_vendor("vendor", [cublas_folder])
    assert vendor.cudnn is not None
    fact, (x,), y, attrs = _pool_case(1, "avg_pool2d")
    with pytest.raises(DslProgramError, match=r"cuDNN makes Pool.* an output of \[2, 2, 5, 8\]"):
        vendor.cudnn.prepare_pool(dataclasses.replace(fact, oh=4))
    vendor.cudnn.pool(vendor.cudnn.prepare_pool(dataclasses.replace(fact, mode="max")), y.ctypes.data, (x.ctypes.data,))
    assert not np.allclose(y, REGISTRY["avg_pool2d"].numpy((x,), attrs), rtol=1e-4, atol=1e-5)
    vendor.close()


# ---- the stand-in cuDNN: softmax and LRN ----

SOFTMAX_OPS = ("softmax", "log_softmax", "softmax_backward", "log_softmax_backward")
LRN = {"size": 5, "alpha": 0.3, "beta": 0.75, "k": 2.0}


def _run_vendor(vendor: Vendor, op: str, inputs: tuple[np.ndarray, ...], attrs: dict) -> np.ndarray:
    """Statement `op` on `inputs` through its vendor fact, as the runner binds it."""
    types = tuple(TensorType(a.shape) for a in inputs)
    out_type = REGISTRY[op].shape(types, attrs)
    out = np.full(out_type.shape, np.nan, np.float32)
    bound = vendor.bind(
        REGISTRY[op].vendor(types, out_type, attrs), [out.ctypes.data, *(a.ctypes.data for a in inputs)]
    )
    assert bound is not None
    bound.run()
    return out


@pytest.mark.parametrize("op", SOFTMAX_OPS)
def test_softmax_through_cudnn_is_numpys(cublas_folder: Path, op: str) -> None:
    """softmax and log_softmax (accurate, over the channels of [rows, k, 1, 1]) and their gradients, on rows with
    large entries (where an inaccurate softmax overflows)."""
    vendor = open_vendor("vendor", [cublas_folder])
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((5, 7)) * 40).astype(np.float32)
    forward = op.removesuffix("_backward")
    inputs = (
        (x,) if op == forward else (REGISTRY[forward].numpy((x,), {}), rng.standard_normal((5, 7)).astype(np.float32))
    )
    np.testing.assert_allclose(_run_vendor(vendor, op, inputs, {}), REGISTRY[op].numpy(inputs, {}), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    vendor.close()


@pytest.mark.parametrize("op", ["lrn", "lrn_backward"])
@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_through_cudnn_is_numpys(cublas_folder: Path, op: str, size: int) -> None:
    """Cross-channel LRN and its gradient: cuDNN's alpha is divided by the window inside the library, as ours."""
    vendor = open_vendor("vendor", [cublas_folder])
    rng = np.random.default_rng(size)
    attrs = {**LRN, "size": size}
    x = rng.standard_normal((2, 6, 3, 4)).astype(np.float32)
    inputs = (
        (x,)
        if op == "lrn"
        else (x, REGISTRY["lrn"].numpy((x,), attrs), rng.standard_normal(x.shape).astype(np.float32))
    )
    np.testing.assert_allclose(_run_vendor(vendor, op, inputs, attrs), REGISTRY[op].numpy(inputs, attrs), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    vendor.close()


def test_the_stand_in_lrn_refuses_what_is_not_ours(cublas_folder: Path) -> None:
    """An even window looks one channel further ahead in cuDNN than in PyTorch (and ours): run as a fact anyway, the
    comparison with NumPy rejects it, which is why the registry gives none; a window beyond cuDNN's 16 is refused."""
    vendor = open_vendor("vendor", [cublas_folder])
    assert vendor.cudnn is not None
    x = np.random.default_rng(0).standard_normal((2, 6, 3, 4)).astype(np.float32)
    even = {**LRN, "size": 4}
    assert REGISTRY["lrn"].vendor((TensorType(x.shape),), TensorType(x.shape), even) is None
    fact = Lrn(*x.shape, 4, LRN["alpha"], LRN["beta"], LRN["k"])
    y = np.full(x.shape, np.nan, np.float32)
    vendor.cudnn.lrn(vendor.cudnn.prepare_lrn(fact), y.ctypes.data, (x.ctypes.data,))
    assert not np.allclose(y, REGISTRY["lrn"].numpy((x,), even), rtol=1e-4, atol=1e-5)
    with pytest.raises(DslProgramError, match=r"cudnnSetLRNDescriptor failed \(CUDNN_STATUS_BAD_PARAM\)"):
        vendor.cudnn.prepare_lrn(dataclasses.replace(fact, size=17))
    vendor.close()


@pytest.mark.parametrize("op", ["bn_apply", "bn_train_apply"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (6, 4)])
def test_batch_norm_through_cudnn_is_numpys(cublas_folder: Path, op: str, shape: tuple[int, ...]) -> None:
    """Batch norm's apply (given statistics: the running ones in inference, the batch's in training), over the
    channels of an image batch and of features [N, C] (as [N, C, 1, 1])."""
    vendor = open_vendor("vendor", [cublas_folder])
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    c, axes = shape[1], (0, *range(2, len(shape)))
    per = [rng.standard_normal(c).astype(np.float32) for _ in range(2)]  # gamma, beta
    stats = (x.mean(axis=axes), x.var(axis=axes)) if op != "bn_apply" else (per[1], np.abs(per[0]) + 0.5)
    inputs = (x, *stats, *per)
    attrs = {"eps": 1e-5}
    np.testing.assert_allclose(_run_vendor(vendor, op, inputs, attrs), REGISTRY[op].numpy(inputs, attrs), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    types = tuple(TensorType(a.shape) for a in inputs)
    assert REGISTRY[op].vendor(types, TensorType(shape), attrs) is not None
    assert REGISTRY[op].vendor(types, TensorType(shape), {"eps": 1e-6}) is None  # below cuDNN's minimum
    vendor.close()


def test_batch_norm_backward_is_our_one_pass_not_cudnns() -> None:
    """The training gradient dx has no vendor fact: cuDNN's backward would compute dgamma and dbeta again (it cannot
    take the statements' sums), so our one element-wise pass runs it on the vendor path too (ops/norm.py)."""
    assert REGISTRY["bn_train_backward"].vendor is None
    assert REGISTRY["bn_train_backward"].cuda is not None  # library.cu's dd_bn_train_backward


# ---- the runner ----

TINY = """network Tiny
const N = 4
input x : [N, 3, 8, 8]
label y : [N] classes 10
layer cv = conv(6, kernel=3, pad=1)
layer fc1 = full(16)
layer fc2 = full(10)
net = fc2 o relu o fc1 o flatten o max_pool(2, stride=2) o relu o cv
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { data = synthetic(seed=2) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 3 seed = 1 }
"""


# batch norm standing alone in training: a pooling after it, which no loop takes in
BATCH_NORMED = """network BatchNormed
const N = 4
input x : [N, 3, 6, 6]
label y : [N] classes 10
layer cv = conv(5, kernel=3, pad=1)
layer fc = full(10)
net = fc o flatten o relu o max_pool(2, stride=2) o batch_norm o cv
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { data = synthetic(seed=3) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 3 seed = 5 }
"""


def _build(case: str) -> api.Build:
    if case in ("mlp", "lenet"):
        return api.build(api.compile_file(ROOT / "networks" / f"{case}.ddsl", {"N": 4}).program)
    source = {"tiny": TINY, "pooled": POOLED, "normed": NORMED, "batch_normed": BATCH_NORMED}.get(case, SMALL)
    return api.build(api.compile_source(source, f"{case}.ddsl", {}).program)


def _fake_calls(folder: Path) -> tuple[int, int]:
    """(GEMMs, cuDNN calls) the stand-ins have computed in this process."""
    cublas, cudnn = (ctypes.CDLL(str(folder / name)) for name in ("libcublas.so.12", "libcudnn.so.9"))
    return int(cublas.fake_cublas_calls()), int(cudnn.fake_cudnn_calls())


def _vendor_runner(build: api.Build, folder: Path, cublas_folder: Path, infer: bool = True,
                   deterministic: bool = False) -> gpu_runner.GpuRunner:  # fmt: skip
    """A GPU runner of `build` (its inference plan too where `infer`) on the emulated driver in `folder` and the
    stand-in libraries, its parameters zeros: for what `calls` says went where. `deterministic`: cuDNN's heuristic
    convolution algorithms (the stand-in's first proposal), not the fastest found (test_cudnn_find.py)."""
    arrays = {p.value.name: np.zeros(p.value.type.shape, np.float32) for p in build.train_plan.graph.params}
    driver = EmulatedDriver(folder, vendor=open_vendor("vendor", [cublas_folder]))
    return gpu_runner.GpuRunner(driver, build.train_plan, build.infer_plan if infer else None, arrays,
                                deterministic=deterministic)  # fmt: skip


def _agrees(case: str, kernels: str, folder: Path, cublas_folder: Path) -> None:
    build = _build(case)
    want = run_training(build, iters=3, data_flag="synthetic", device="cpu")
    before = _fake_calls(cublas_folder)
    driver = EmulatedDriver(folder, vendor=open_vendor(kernels, [cublas_folder]))
    lines: list[str] = []
    got = run_training(build, iters=3, data_flag="synthetic", driver=driver, report=lines.append)
    gemms, cudnn = (b - a for a, b in zip(before, _fake_calls(cublas_folder)))
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert got.get("test_accuracy") == pytest.approx(want.get("test_accuracy"))
    if kernels == "vendor":  # the GEMMs and cuDNN's calls of the 3 steps and the tests through the stand-ins
        assert (
            gemms > 0
            and "GEMMs by cuBLAS 12.0.0 (libcublas.so.12), convolutions, pooling, batch norm, softmax and LRN by "
            "cuDNN 9.0.0"
            in lines[0]
        )
        cudnn_facts = [c for s in build.train_plan.graph.stmts if (c := vendor_call(s)) and not isinstance(c, Gemm)]
        assert (cudnn > 0) == bool(cudnn_facts)  # a statement fused into another's loop may have a fact unused
        assert 0 <= got["gpu_vendor_workspace_bytes"] <= got["arena_bytes"]
    else:
        assert gemms == cudnn == 0 and "; our kernels; graph: on)  network" in lines[0]


@pytest.mark.parametrize("kernels", ["vendor", "own"])
def test_the_runner_with_cublas_agrees_with_numpy(kernels: str, tmp_path: Path, cublas_folder: Path) -> None:
    _agrees("tiny", kernels, tmp_path, cublas_folder)


def test_the_runner_with_cudnn_batch_norm_agrees_with_numpy(tmp_path: Path, cublas_folder: Path) -> None:
    """Batch norm standing alone in training (a pooling after it, which no loop takes in): its apply and its gradient
    through the stand-in cuDNN, the NumPy runner's losses and test figures."""
    cudnn = ctypes.CDLL(str(cublas_folder / "libcudnn.so.9"))
    cudnn.fake_cudnn_op_calls.restype = ctypes.c_longlong
    names = (b"cudnnBatchNormalizationForwardInference", b"cudnnBatchNormalizationBackward")
    before = [cudnn.fake_cudnn_op_calls(n) for n in names]
    _agrees("batch_normed", "vendor", tmp_path, cublas_folder)
    forward, backward = (cudnn.fake_cudnn_op_calls(n) - b for n, b in zip(names, before))
    assert forward >= 3 and backward == 0  # the apply of each of 3 steps; its gradient never computed by cuDNN
    build = _build("batch_normed")
    runner = _vendor_runner(build, tmp_path / "calls", cublas_folder)
    served = {x.op: b.what for x, _, b in runner.calls["train"] if b is not None}
    assert served["bn_train_apply"] == "cudnnBatchNormalizationForwardInference"
    # the gradient dx is our one element-wise pass on the statements' dgamma and dbeta (no sums computed twice)
    assert "bn_train_backward" not in served and "cudnnBatchNormalizationBackward" not in served.values()
    assert [x.op for x, _, b in runner.calls["train"] if b is None].count("bn_train_backward") == 1
    # in inference the apply (the running statistics) is the convolution's epilogue: one loop of ours
    assert "bn_apply" not in {x.op for x, _, b in runner.calls["infer"]}
    # the shared scratch is the convolutions' alone (no scale and shift gradients thrown away there)
    shared = [c["workspace_bytes"] for c in runner.convolutions if c["scratch"]]
    assert runner.vendor_scratch_bytes == max(shared, default=0)
    runner.close()


def test_the_runner_with_cudnn_gradients_and_pooling_agrees_with_numpy(tmp_path: Path, cublas_folder: Path) -> None:
    """Every convolution (forward, data and filter gradients), max pooling with padding and average pooling, and
    their gradients through the stand-in cuDNN: the NumPy runner's losses and test figures."""
    _agrees("pooled", "vendor", tmp_path, cublas_folder)
    build = _build("pooled")
    runner = _vendor_runner(build, tmp_path / "calls", cublas_folder, infer=False)
    served = {x.op for x, _, b in runner.calls["train"] if b is not None}
    assert {"conv2d", "conv2d_backward_data", "conv2d_backward_filter", "channel_sum", "max_pool2d",
            "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward"} <= served  # fmt: skip
    runner.close()


@pytest.mark.slow  # the stand-ins' softmax and LRN are checked through Vendor.bind in the default suite
def test_the_runner_with_cudnn_softmax_and_lrn_agrees_with_numpy(tmp_path: Path, cublas_folder: Path) -> None:
    """LRN, softmax and their gradients, and log softmax in the prediction, through the stand-in cuDNN: the NumPy
    runner's losses and test figures."""
    _agrees("normed", "vendor", tmp_path, cublas_folder)
    build = _build("normed")
    runner = _vendor_runner(build, tmp_path / "calls", cublas_folder)
    served = {x.op for x, _, b in runner.calls["train"] if b is not None}
    assert {"lrn", "lrn_backward", "softmax", "softmax_backward"} <= served
    assert "log_softmax" in {x.op for x, _, b in runner.calls["infer"] if b is not None}
    runner.close()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["mlp", "lenet", "small"])
def test_the_runner_with_cublas_agrees_with_numpy_on_more_networks(case: str, tmp_path: Path,
                                                                   cublas_folder: Path) -> None:  # fmt: skip
    _agrees(case, "vendor", tmp_path, cublas_folder)


def test_the_graph_holds_the_vendor_calls(tmp_path: Path, cublas_folder: Path) -> None:
    """With the libraries on the driver's stream, the captured train step holds every cuBLAS and cuDNN call
    (convolutions and their gradients, the bias gradient, pooling, GEMMs), recorded and not made, and each replay
    makes them: 4 steps give the bits of the run without the graph, with as many library calls. Libraries left on
    the default stream make their calls during the capture and never again, which the parameters show."""
    from deepdsl.backends.cuda.translation import program

    build = _build("pooled")
    runs = {}
    for name, graphs in (("off", False), ("on", True), ("default stream", True)):
        driver = EmulatedDriver(tmp_path, vendor=open_vendor("vendor", [cublas_folder]))
        if name == "default stream":
            driver.vendor.set_stream(0)
        before = _fake_calls(cublas_folder)
        got = run_training(build, iters=4, device="cpu", driver=driver, graphs=graphs, save=str(tmp_path / "p.npz"))
        calls = tuple(b - a for a, b in zip(before, _fake_calls(cublas_folder)))
        runs[name] = got, dict(np.load(tmp_path / "p.npz")), calls, driver
    (got, params, calls, on), (want, want_params, want_calls, off) = runs["on"], runs["off"]
    assert (on.captures, on.replays, off.captures) == (1, 3, 0) and on.recording is not None
    step = program(build.train_plan)
    vendor_nodes = [node for node in on.recording if node[0] == "vendor"]
    assert len(on.recording) == len(step.launches) + len(step.copies) and len(vendor_nodes) >= 8
    assert got["losses"] == want["losses"] and same_bits(params, want_params)
    assert calls == want_calls and min(calls) > 0
    assert not same_bits(runs["default stream"][1], want_params)


@pytest.mark.parametrize("limit", [None, 0])
def test_which_launches_go_to_the_vendor_libraries(tmp_path: Path, cublas_folder: Path, limit: int | None) -> None:
    """The runner asks each launch's registry fact, not its op name: the GEMM launches (linear and the matmuls of its
    gradient) run as cuBLAS calls, the convolution and its filter gradient as cuDNN's, in the workspace the plan gave
    each (none under --workspace-limit 0: then an algorithm without scratch), pooling and its gradient and the small
    bias gradients as cuDNN's, the rest (the epilogues, the loss, relu's gradient, the updates) as our kernels."""
    build = api.build(api.compile_source(TINY, "tiny.ddsl", {}).program, api.Options(workspace_limit=limit))
    runner = _vendor_runner(build, tmp_path, cublas_folder, deterministic=True)
    served = {x.op: b.what for x, _, b in runner.calls["train"] if b is not None}
    ops = sorted(x.op for x, _, b in runner.calls["train"] if b is not None)
    # forward; dW of cv, dx and dW of fc1 and fc2; the pooling and its gradient; the bias gradients of fc1, fc2 (cv's,
    # a sum of 256 values per channel, is a reduction pass of ours: ir/reductions.py)
    assert ops == ["channel_sum"] * 2 + ["conv2d", "conv2d_backward_filter"] + ["linear"] * 2 + ["matmul"] * 4 + [
        "max_pool2d",
        "max_pool2d_backward",
    ]
    planned = build.train_plan.workspace
    conv = next(s.out.name for s in build.train_plan.graph.stmts if s.op == "conv2d")
    assert (conv in planned) == (limit is None)
    if limit is None:
        assert served["conv2d"] == "cudnnConvolutionForward IMPLICIT_PRECOMP_GEMM"
        assert served["conv2d_backward_filter"] == "cudnnConvolutionBackwardFilter ALGO_1"
        assert 0 < runner.vendor_workspace_bytes <= max(w.nbytes for w in planned.values())
    else:
        assert served["conv2d"] == "cudnnConvolutionForward IMPLICIT_GEMM" and runner.vendor_workspace_bytes == 0
        assert served["conv2d_backward_filter"] == "cudnnConvolutionBackwardFilter ALGO_0"
    assert served["max_pool2d"] == "cudnnPoolingForward max"
    assert served["channel_sum"] == "cudnnConvolutionBackwardBias"
    kernels = [x for x, _, b in runner.calls["train"] if b is None]
    epilogues = [x.kernel for x in kernels if x.op in ("linear", "matmul", "conv2d")]  # bias (and relu) after it
    assert epilogues and all(k.endswith("_epilogue") for k in epilogues)
    assert {"relu_grad", "softmax_cross_entropy"} <= {x.op for x in kernels}
    assert sorted(x.op for x, _, b in runner.calls["infer"] if b is not None) == ["conv2d", "linear", "linear",
                                                                                   "max_pool2d"]  # fmt: skip
    runner.close()


ONE_BY_ONE = """network OneByOne
input x : [2, 3, 6, 6]
label y : [2] classes 4
layer cv = conv(5, kernel=1)
layer fc = full(4)
net = fc o flatten o relu o cv
loss = softmax_cross_entropy(net(x), y)
train { data = synthetic(seed=2) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 2 seed = 1 }
"""


@pytest.mark.parametrize("limit", [pytest.param(None, marks=pytest.mark.slow), 0])  # the unlimited case: 2.5 s more
def test_an_algorithm_wanting_more_than_the_plan_gave_takes_the_shared_scratch(
    tmp_path: Path, cublas_folder: Path, limit: int | None
) -> None:
    """A 1x1 convolution needs no workspace on the CPU, so the plan gives it none; cuDNN's first algorithm (the
    stand-in's IMPLICIT_PRECOMP_GEMM: one image's columns) wants some. Within the workspace limit (none set: 1 GiB)
    it runs in one scratch the runner allocates beside the arena, counted in the planned GPU bytes, and the losses
    are NumPy's; under --workspace-limit 0 cuDNN gets an algorithm without scratch and there is no scratch."""
    build = api.build(api.compile_source(ONE_BY_ONE, "one.ddsl", {}).program,
                      api.Options(workspace_limit=limit, deterministic=True))  # fmt: skip
    conv = next(s.out.name for s in build.train_plan.graph.stmts if s.op == "conv2d")
    assert conv not in build.train_plan.workspace
    runner = _vendor_runner(build, tmp_path / "r", cublas_folder, deterministic=True)
    served = {x.op: b for x, _, b in runner.calls["train"] if b is not None}
    if limit is None:
        assert served["conv2d"].what == "cudnnConvolutionForward IMPLICIT_PRECOMP_GEMM" and served["conv2d"].scratch
        assert runner.vendor_scratch_bytes == max(b.workspace for b in served.values() if b.scratch) > 0
    else:
        assert served["conv2d"].what == "cudnnConvolutionForward IMPLICIT_GEMM"
        assert runner.vendor_scratch_bytes == 0
    assert runner.planned_bytes == (
        runner.arena_bytes + runner.tensor_bytes + runner.table_bytes + runner.vendor_scratch_bytes
    )  # the table: the multi-tensor launch of the updates
    runner.close()
    want = run_training(build, iters=3, data_flag="synthetic", device="cpu")
    driver = EmulatedDriver(tmp_path / "t", vendor=open_vendor("vendor", [cublas_folder]))
    got = run_training(build, iters=3, data_flag="synthetic", driver=driver)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
    assert (got["gpu_vendor_scratch_bytes"] > 0) == (limit is None)
    assert got["gpu_memory_bytes"] == got["gpu_planned_bytes"]  # the stand-in counts bytes


# ---- --kernels on the command line ----


def _emulated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, folders: list[Path]) -> None:
    """`--device cuda` opens the emulated GPU, whose vendor libraries are searched in `folders` only."""
    monkeypatch.setattr(devices, "pycuda_available", lambda: True)

    def driver(kernels: str, tf32: bool = False) -> EmulatedDriver:
        return EmulatedDriver(tmp_path / "gpu", vendor=open_vendor(kernels, folders, tf32=tf32))

    monkeypatch.setattr(devices, "PyCudaDriver", driver)


def _run(*flags: str) -> tuple[int, str]:
    mlp = str(ROOT / "networks" / "mlp.ddsl")
    result = CliRunner().invoke(cli, ["run", mlp, "--set", "N=4", "--iters", "1", "--data", "synthetic", *flags])
    return result.exit_code, result.output


def test_kernels_vendor_on_the_command_line(tmp_path: Path, cublas_folder: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    _emulated(monkeypatch, tmp_path, [tmp_path / "nothing"])
    code, out = _run("--device", "cuda", "--kernels", "vendor")
    assert code == 1 and "--kernels vendor: no cuBLAS: libcublas.so.13 or libcublas.so.12 not found" in out
    assert "pip install nvidia-cublas-cu12" in out and "Traceback" not in out
    code, out = _run("--kernels", "vendor")  # device auto: the vendor libraries were asked for, so still an error
    assert code == 1 and "no cuBLAS" in out
    assert _run("--kernels", "blas")[0] == 2  # a usage error
    _emulated(monkeypatch, tmp_path, [cublas_folder])
    code, out = _run("--device", "cuda")  # auto: cuBLAS where it loads, said on the device line
    line = (
        "PyCUDA runner; GEMMs by cuBLAS 12.0.0 (libcublas.so.12), convolutions, pooling, batch norm, softmax and "
        "LRN by cuDNN 9.0.0 (libcudnn.so.9), the rest our kernels; graph: on)"
    )
    assert code == 0 and line in out


@pytest.mark.slow
def test_kernels_auto_and_own_on_the_command_line(tmp_path: Path, cublas_folder: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    _emulated(monkeypatch, tmp_path, [tmp_path / "nothing"])
    code, out = _run("--device", "cuda")  # auto without the library: our kernels, and why
    assert code == 0 and "; our kernels (no cuBLAS: libcublas.so.13 or libcublas.so.12 not found; no cuDNN" in out
    _emulated(monkeypatch, tmp_path, [cublas_folder])
    code, out = _run("--device", "cuda", "--kernels", "own")
    assert code == 0 and "PyCUDA runner; our kernels; graph: on)" in out
