"""The vendor libraries of the GPU runner: cuBLAS through ctypes, called with the runner's raw device pointers.

A launch whose registry entry names a vendor routine (`Launch.vendor`, ir/vendor.py) runs as that routine's call
when the library loads; every other launch, and every launch under `--kernels own`, runs our kernel. ctypes on the
library itself needs no dependency beyond the library (PyCUDA stays the one optional import of the runner) and
takes the pointers the runner already has; the tests load a stand-in with the same entry points.

The library is found as users have it: the folders of LD_LIBRARY_PATH, the `nvidia/*/lib` folders of pip's CUDA
wheels in this Python (nvidia-cublas-cu12, nvidia-cublas), the CUDA toolkit ($CUDA_HOME, $CUDA_PATH,
/usr/local/cuda), then the dynamic loader's own search by soname. CUDA 13's soname is tried before CUDA 12's in
each place; the first library whose handle opens is used.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from deepdsl.errors import DslProgramError
from deepdsl.ir.vendor import Gemm, VendorCall

KERNELS = ("auto", "vendor", "own")
CUBLAS_SONAMES = ("libcublas.so.13", "libcublas.so.12")
CUBLAS_INSTALL = "pip install nvidia-cublas-cu12 (CUDA 12) or nvidia-cublas (CUDA 13), or the CUDA toolkit"
_OP_N, _OP_T = 0, 1
_STATUS = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH", 11: "MAPPING_ERROR",
           13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}  # fmt: skip


def library_folders() -> list[Path]:
    """Where a CUDA library may lie, in the order searched (before the loader's own search by soname)."""
    folders = [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    for entry in sys.path:  # pip's CUDA wheels: site-packages/nvidia/<package>/lib
        folders += sorted(Path(entry or ".").glob("nvidia/*/lib"))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            folders += [Path(os.environ[var]) / "lib64", Path(os.environ[var]) / "lib"]
    folders += [Path("/usr/local/cuda/lib64"), Path("/usr/local/cuda/targets/x86_64-linux/lib")]
    return list(dict.fromkeys(folders))


def candidates(sonames: Sequence[str], folders: Sequence[Path] | None = None) -> list[str]:
    """The files to try for a library: each folder's copy of each soname, then (searching the default folders) the
    bare sonames, which the dynamic loader resolves itself (its cache, the system folders)."""
    found = [str(f / name) for f in (library_folders() if folders is None else folders) for name in sonames
             if (f / name).exists()]  # fmt: skip
    return found + (list(sonames) if folders is None else [])


class MissingLibrary(DslProgramError):
    """`--kernels vendor` where a vendor library does not load: an error under every --device."""


def _load(path: str) -> ctypes.CDLL:
    """The library at `path`; a file in a folder with its cuBLASLt beside it (pip's wheels, the toolkit) gets that
    one first, so that it need not be on the loader's path."""
    folder, name = os.path.split(path)
    lt = os.path.join(folder, name.replace("libcublas.", "libcublasLt.")) if folder else ""
    if lt and os.path.exists(lt):
        ctypes.CDLL(lt, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path)


def _check(status: int, call: str) -> None:
    if status != 0:
        raise DslProgramError(f"--kernels vendor: {call} failed (CUBLAS_STATUS_{_STATUS.get(status, status)})")


class Cublas:
    """One cuBLAS handle on the current CUDA context (the runner's), on `stream` (0: the default stream, where
    the runner launches its kernels, so the two keep program order)."""

    def __init__(self, lib: ctypes.CDLL, path: str, stream: int = 0):
        self.lib, self.path = lib, path
        self.handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate_v2")
        _check(lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)), "cublasSetStream_v2")
        version = ctypes.c_int()
        _check(lib.cublasGetVersion_v2(self.handle, ctypes.byref(version)), "cublasGetVersion_v2")
        v = version.value
        self.version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}" if v >= 10000 else f"{v // 1000}.{v % 1000 // 10}"
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        i, p, ll = ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong
        lib.cublasSgemm_v2.argtypes = [p, i, i, i, i, i, p, p, i, p, i, p, p, i]
        lib.cublasSgemmStridedBatched.argtypes = [p, i, i, i, i, i, p, p, i, ll, p, i, ll, p, p, i, ll, i]

    @property
    def description(self) -> str:
        return f"cuBLAS {self.version} ({Path(self.path).name})"

    def gemm(self, g: Gemm, c: int, a: int, b: int) -> None:
        """C = op(A) @ op(B) of row-major matrices at device addresses c, a, b: cuBLAS is column-major, and a
        row-major matrix read column-major is its transpose, so it computes C^T = op(B)^T op(A)^T, B first."""
        m, n, k = g.m, g.n, g.k
        op_a, lda = (_OP_T, m) if g.transpose_a else (_OP_N, k)
        op_b, ldb = (_OP_T, k) if g.transpose_b else (_OP_N, n)
        one, zero = ctypes.byref(self.one), ctypes.byref(self.zero)
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


class Vendor:
    """The vendor libraries a runner uses (today cuBLAS for every GEMM) and what it says about them."""

    def __init__(self, cublas: Cublas | None, why_not: str | None = None):
        self.cublas = cublas
        self.why_not = why_not  # under auto without the library: what was missing

    @property
    def description(self) -> str:
        """The device line's part: which kernels run."""
        if self.cublas is not None:
            return f"GEMMs by {self.cublas.description}, the rest our kernels"
        return "our kernels" + (f" ({self.why_not})" if self.why_not else "")

    def serves(self, call: VendorCall | None) -> bool:
        return isinstance(call, Gemm) and self.cublas is not None

    def run(self, call: VendorCall, pointers: Sequence[int]) -> None:
        """Run `call` on a launch's pointers (the output first, then the inputs)."""
        assert self.cublas is not None and isinstance(call, Gemm)
        self.cublas.gemm(call, pointers[0], pointers[1], pointers[2])

    def close(self) -> None:
        if self.cublas is not None:
            self.cublas.close()


OWN = Vendor(None)


def load_cublas(folders: Sequence[Path] | None = None, stream: int = 0) -> tuple[Cublas | None, str]:
    """cuBLAS from the first candidate that loads and opens a handle (on the current context); else None and what
    went wrong with each."""
    tried = []
    for path in candidates(CUBLAS_SONAMES, folders):
        try:
            lib = _load(path)
        except OSError as err:
            if "/" in path:  # a file that is there but does not load; a bare soname the loader did not find is not
                tried.append(str(err))  # the loader's message names the file
            continue
        try:
            return Cublas(lib, path, stream), ""
        except (DslProgramError, AttributeError) as err:
            tried.append(f"{path}: {getattr(err, 'message', err)}")
    if not tried:
        return None, f"{' or '.join(CUBLAS_SONAMES)} not found"
    return None, "; ".join(tried)


def open_vendor(kernels: str, folders: Sequence[Path] | None = None, stream: int = 0) -> Vendor:
    """The vendor libraries for `--kernels` (call it with the GPU's context current): `own` none; `vendor` cuBLAS or
    a DslProgramError naming the missing library and how to install it; `auto` cuBLAS where it loads."""
    assert kernels in KERNELS, kernels
    if kernels == "own":
        return OWN
    cublas, why = load_cublas(folders, stream)
    if cublas is not None:
        return Vendor(cublas)
    if kernels == "vendor":
        raise MissingLibrary(f"--kernels vendor needs cuBLAS: {why}; install it ({CUBLAS_INSTALL}), "
                              "or use --kernels own")  # fmt: skip
    return Vendor(None, f"no cuBLAS: {why}")


__all__ = [
    "CUBLAS_SONAMES",
    "KERNELS",
    "OWN",
    "Cublas",
    "MissingLibrary",
    "Vendor",
    "candidates",
    "library_folders",
    "open_vendor",
]
