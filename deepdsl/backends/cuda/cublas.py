"""cuBLAS through ctypes: one handle, and a row-major `Gemm` (ir/vendor.py) as column-major SGEMM calls; a GEMM on
bf16 operands (--precision bf16) as `cublasGemmEx` / `cublasGemmStridedBatchedEx` with CUDA_R_16BF A and B, C bf16
or float32 as the plan stores it, and CUBLAS_COMPUTE_32F: the products accumulated in float32, C rounded once."""

from __future__ import annotations

import ctypes
from pathlib import Path

from deepdsl.errors import DslProgramError
from deepdsl.ir.vendor import Gemm

_OP_N, _OP_T = 0, 1
_DEFAULT_MATH, _TF32_TENSOR_OP_MATH = 0, 3  # cublasMath_t: float32 FMA, or TF32 tensor cores for float32 GEMMs
_R_32F, _R_16BF = 0, 14  # cudaDataType_t: CUDA_R_32F, CUDA_R_16BF
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1  # cublasComputeType_t CUBLAS_COMPUTE_32F, cublasGemmAlgo_t CUBLAS_GEMM_DEFAULT
_STATUS = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH", 11: "MAPPING_ERROR",
           13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}  # fmt: skip


def _check(status: int, call: str) -> None:
    if status != 0:
        raise DslProgramError(f"--kernels vendor: {call} failed (CUBLAS_STATUS_{_STATUS.get(status, status)})")


class Cublas:
    """One cuBLAS handle on the current CUDA context (the runner's), on `stream` (the driver's stream, where the
    runner launches its kernels, so the two keep program order and a capture of it records both)."""

    def __init__(self, lib: ctypes.CDLL, path: str, stream: int = 0):
        self.lib, self.path = lib, path
        self.handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        self.set_stream(stream)
        version = ctypes.c_int()
        _check(lib.cublasGetVersion_v2(self.handle, ctypes.byref(version)), "cublasGetVersion_v2")
        v = version.value
        self.version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v % 1000 // 10}"
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.tf32 = False
        i, p, ll = ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong
        lib.cublasSgemm_v2.argtypes = [p, i, i, i, i, i, p, p, i, p, i, p, p, i]
        lib.cublasSgemmStridedBatched.argtypes = [p, i, i, i, i, i, p, p, i, ll, p, i, ll, p, p, i, ll, i]
        self.ex = hasattr(lib, "cublasGemmEx") and hasattr(lib, "cublasGemmStridedBatchedEx")  # cuBLAS 11 on
        if self.ex:
            lib.cublasGemmEx.argtypes = [p, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i]
            lib.cublasGemmStridedBatchedEx.argtypes = [p, i, i, i, i, i, p, p, i, i, ll, p, i, i, ll, p, p, i, i, ll,
                                                       i, i, i]  # fmt: skip

    def set_stream(self, stream: int) -> None:
        """Issue every later call on `stream` (the driver's, so that a capture of it records them)."""
        _check(self.lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream_v2")

    def set_tf32(self, on: bool) -> None:
        """Every later GEMM in TF32 tensor-op math (--precision tf32: float32 storage, TF32 products) or not."""
        mode = _TF32_TENSOR_OP_MATH if on else _DEFAULT_MATH
        _check(self.lib.cublasSetMathMode(self.handle, ctypes.c_int(mode)), "cublasSetMathMode")
        self.tf32 = on

    @property
    def description(self) -> str:
        return f"cuBLAS {self.version} ({Path(self.path).name}{'; TF32' if self.tf32 else ''})"

    def gemm(self, g: Gemm, c: int, a: int, b: int, bf16: tuple[bool, bool] = (False, False)) -> None:
        """C = op(A) @ op(B) of row-major matrices at device addresses c, a, b: cuBLAS is column-major, and a
        row-major matrix read column-major is its transpose, so it computes C^T = op(B)^T op(A)^T, B first.
        `bf16`: (A and B are bf16, C is bf16): GemmEx with float32 compute; (False, False) is SGEMM."""
        m, n, k = g.m, g.n, g.k
        op_a, lda = (_OP_T, m) if g.transpose_a else (_OP_N, k)
        op_b, ldb = (_OP_T, k) if g.transpose_b else (_OP_N, n)
        one, zero = ctypes.byref(self.one), ctypes.byref(self.zero)
        if bf16[0]:
            ab, ct = _R_16BF, _R_16BF if bf16[1] else _R_32F
            if g.batch == 1:
                status = self.lib.cublasGemmEx(self.handle, op_b, op_a, n, m, k, one, b, ab, ldb, a, ab, lda, zero, c,
                                               ct, n, _COMPUTE_32F, _GEMM_DEFAULT)  # fmt: skip
                return _check(status, "cublasGemmEx")
            status = self.lib.cublasGemmStridedBatchedEx(self.handle, op_b, op_a, n, m, k, one, b, ab, ldb, k * n, a,
                                                         ab, lda, m * k, zero, c, ct, n, m * n, g.batch, _COMPUTE_32F,
                                                         _GEMM_DEFAULT)  # fmt: skip
            return _check(status, "cublasGemmStridedBatchedEx")
        if bf16[1]:
            raise DslProgramError("--kernels vendor: a bf16 GEMM result needs bf16 operands (cublasGemmEx)")
        if g.batch == 1:
            status = self.lib.cublasSgemm_v2(self.handle, op_b, op_a, n, m, k, one, b, ldb, a, lda, zero, c, n)
            _check(status, "cublasSgemm_v2")
        else:
            status = self.lib.cublasSgemmStridedBatched(self.handle, op_b, op_a, n, m, k, one, b, ldb, k * n, a, lda,
                                                        m * k, zero, c, n, m * n, g.batch)  # fmt: skip
            _check(status, "cublasSgemmStridedBatched")

    def close(self) -> None:
        if self.handle:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()
