"""The vendor libraries of the GPU runner, cuBLAS (cublas.py) and cuDNN (cudnn.py), through ctypes, called with the
runner's raw device pointers.

A launch whose registry entry names a vendor routine (`Launch.vendor`, ir/vendor.py) runs as that routine's call
when its library loads (`Vendor.bind`); every other launch, and every launch under `--kernels own`, runs our kernel.
ctypes on the libraries needs no dependency beyond them (PyCUDA stays the one optional import of the runner) and
takes the pointers the runner already has; the tests load stand-ins with the same entry points.

A library is found as users have it: the folders of LD_LIBRARY_PATH, the `nvidia/*/lib` folders of pip's CUDA
wheels in this Python (nvidia-cublas-cu12: nvidia/cublas/lib, nvidia-cublas: nvidia/cu13/lib, nvidia-cudnn-cu12 or
-cu13: nvidia/cudnn/lib), the CUDA toolkit ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda), then the dynamic loader's
own search by soname. CUDA 13's soname is tried before CUDA 12's in each place; the first library whose handle
opens is used.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepdsl.backends.cuda.cublas import Cublas
from deepdsl.backends.cuda.cudnn import Conv, Cudnn
from deepdsl.errors import DslProgramError
from deepdsl.ir.vendor import (
    BatchNorm,
    ConvBackwardBias,
    ConvBackwardData,
    ConvBackwardFilter,
    ConvForward,
    Gemm,
    Lrn,
    LrnBackward,
    Pool,
    PoolBackward,
    Softmax,
    SoftmaxBackward,
    VendorCall,
)

KERNELS = ("auto", "vendor", "own")
CUBLAS_SONAMES = ("libcublas.so.13", "libcublas.so.12")
CUBLAS_INSTALL = "cuBLAS (pip install nvidia-cublas-cu12 for CUDA 12, nvidia-cublas for CUDA 13, or the CUDA toolkit)"
CUDNN_SONAMES = ("libcudnn.so.9",)
CUDNN_INSTALL = "cuDNN 9 (pip install nvidia-cudnn-cu12 for CUDA 12, nvidia-cudnn-cu13 for CUDA 13)"


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
    """`--kernels vendor` where a vendor library does not load: an error wherever the GPU is opened (`--device cuda`, or
    `auto` with PyCUDA there), never a fallback to the NumPy runner."""


def _load(path: str) -> ctypes.CDLL:
    """The library at `path`; a file in a folder with its cuBLASLt beside it (pip's wheels, the toolkit) gets that
    one first, so that it need not be on the loader's path."""
    folder, name = os.path.split(path)
    lt = os.path.join(folder, name.replace("libcublas.", "libcublasLt.")) if folder and "libcublas." in name else ""
    if lt and os.path.exists(lt):
        ctypes.CDLL(lt, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(path)


@dataclass(frozen=True)
class Bound:
    """A launch served by a vendor routine: `run()` computes it; `workspace` bytes of the statement's planned
    workspace are the routine's scratch; `what` names the routine (and its algorithm)."""

    run: Callable[[], None]
    workspace: int
    what: str
    scratch: bool = False  # the routine's scratch is the runner's shared scratch (Vendor.scratch), not the arena's


class Vendor:
    """The vendor libraries a runner uses (cuBLAS for every GEMM, cuDNN for the convolutions, pooling, batch norm,
    softmax and LRN) and what it says about them."""

    def __init__(self, cublas: Cublas | None = None, cudnn: Cudnn | None = None, missing: Sequence[str] = (),
                 strict: bool = False):  # fmt: skip
        self.cublas, self.cudnn = cublas, cudnn
        self.strict = strict  # `--kernels vendor`: a call the library refuses is an error, not our kernel
        self.missing = tuple(missing)  # under auto: the libraries that did not load, and why
        # a convolution whose algorithm needs more scratch than the plan gave its statement takes this one, which the
        # runner allocates once (`scratch_bytes`, the most any such call needs) and whose address it sets here
        self.scratch_bytes = 0
        self.scratch = 0
        # while the runner binds, unless --deterministic: a temporary scratch for cuDNN's Find (bytes -> the address
        # of at least that many), which times every algorithm of a convolution on its real buffers; None: cuDNN's
        # heuristic choice (the deterministic one)
        self.find: Callable[[int], int] | None = None
        # each convolution prepared, by its fact, the most scratch it may take and whether by the heuristic (so found
        # once per shape): its call, algorithm and scratch, and whether that scratch is the shared one
        self.convolutions: dict[tuple[VendorCall, int, bool, bool], tuple[Conv, bool]] = {}  # last: bf16

    @property
    def description(self) -> str:
        """The device line's part: which kernels run."""
        used = [f"GEMMs by {self.cublas.description}"] if self.cublas else []
        if self.cudnn:
            used.append(f"convolutions, pooling, batch norm, softmax and LRN by {self.cudnn.description}")
        text = ", ".join([*used, "the rest our kernels"]) if used else "our kernels"
        return text + (f" ({'; '.join(self.missing)})" if self.missing else "")

    def bind(
        self, call: VendorCall | None, pointers: Sequence[int], workspace: tuple[int, int] = (0, 0), limit: int = 0,
        bf16: Sequence[bool] = (),
    ) -> Bound | None:  # fmt: skip
        """The vendor routine for a launch of `call` on `pointers` (its output, then its inputs), with the statement's
        planned workspace (address, bytes) and the most scratch a convolution's algorithm may take (`limit`, the
        plan's --workspace-limit; the planned workspace where it is larger); None where no loaded library serves it
        (our kernel runs), and under `auto` also where the library refuses the call (no algorithm within the limit, a
        descriptor it does not take); under `vendor` that refusal is the error. A convolution's algorithm is found
        by timing where `find` is set (Find writes over the output at `pointers[0]`: nothing live may be there), else
        cuDNN's heuristic one; either once per fact and limit.

        `bf16` says which of `pointers` hold bf16 values (--precision bf16; none where empty). A GEMM whose two
        operands are bf16 runs as cublasGemmEx (float32 compute, C as the plan stores it), a convolution whose
        operands and result are all bf16 on cuDNN's bf16 tensors and filters with float32 compute; any other call
        touching a bf16 value is left to our kernels, which load and store bf16 themselves (pooling, softmax, batch
        norm, the bias gradient: what the stand-ins and this module have no bf16 path for)."""
        try:
            return self._bind(call, pointers, workspace, limit, tuple(bf16))
        except DslProgramError:
            if self.strict:
                raise
            return None

    def _bind(self, call: VendorCall | None, pointers: Sequence[int], workspace: tuple[int, int],
              limit: int, bf16: tuple[bool, ...] = ()) -> Bound | None:  # fmt: skip
        typed = bf16[:3] if any(bf16) else ()  # the call's result and operands: which are bf16
        if isinstance(call, Gemm) and self.cublas is not None:
            gemm, cublas, (c, a, b) = call, self.cublas, pointers[:3]
            if not typed:
                return Bound(lambda: cublas.gemm(gemm, c, a, b), 0, "cuBLAS SGEMM")
            if typed[1] != typed[2] or not typed[1] or not cublas.ex:  # mixed operands: our kernel
                return None
            kinds = (True, typed[0])
            return Bound(lambda: cublas.gemm(gemm, c, a, b, kinds), 0, "cuBLAS GemmEx bf16")
        if isinstance(call, ConvForward | ConvBackwardData | ConvBackwardFilter) and self.cudnn is not None:
            if typed and not all(typed):  # cuDNN's bf16 convolutions take bf16 operands and result alike
                return None
            cudnn, (out, a, b), (at, nbytes) = self.cudnn, pointers[:3], workspace
            key = (call, max(nbytes, limit), self.find is None, bool(typed))
            known = self.convolutions.get(key)
            find = None if self.find is None else (out, a, b, self.find)
            conv = known[0] if known else cudnn.prepare(call, key[1], find, bf16=bool(typed))
            shared = conv.workspace > nbytes
            self.convolutions[key] = conv, shared or bool(known and known[1])
            what = f"{conv.call} {conv.algorithm}" + (" bf16" if typed else "")
            if not shared:  # in the statement's planned workspace
                return Bound(lambda: cudnn.convolve(conv, out, a, b, at), conv.workspace, what)
            self.scratch_bytes = max(self.scratch_bytes, conv.workspace)
            return Bound(lambda: cudnn.convolve(conv, out, a, b, self.scratch), conv.workspace, what, scratch=True)
        if any(bf16):  # the other routines on float32 only here: our kernel
            return None
        if isinstance(call, ConvBackwardBias) and self.cudnn is not None:
            cudnn, (db, dy), descriptors = self.cudnn, pointers[:2], self.cudnn.prepare_bias(call)
            return Bound(lambda: cudnn.bias(descriptors, db, dy), 0, "cudnnConvolutionBackwardBias")
        if isinstance(call, Softmax | SoftmaxBackward) and self.cudnn is not None:
            cudnn, out, inputs, d = self.cudnn, pointers[0], tuple(pointers[1:3]), self.cudnn.prepare_softmax(call)
            what = "cudnnSoftmax" + ("Forward" if isinstance(call, Softmax) else "Backward")
            return Bound(lambda: cudnn.softmax(call, d, out, inputs), 0, what)
        if isinstance(call, Lrn | LrnBackward) and self.cudnn is not None:
            cudnn, out, inputs, ds = self.cudnn, pointers[0], tuple(pointers[1:4]), self.cudnn.prepare_lrn(call)
            what = "cudnnLRNCrossChannel" + ("Forward" if isinstance(call, Lrn) else "Backward")
            return Bound(lambda: cudnn.lrn(ds, out, inputs[: 1 if isinstance(call, Lrn) else 3]), 0, what)
        if isinstance(call, Pool | PoolBackward) and self.cudnn is not None:
            cudnn, out, inputs = self.cudnn, pointers[0], tuple(pointers[1:])
            pool = cudnn.prepare_pool(call)
            what = f"cudnnPooling{'Backward' if pool.backward else 'Forward'} {pool.mode}"
            return Bound(lambda: cudnn.pool(pool, out, inputs), 0, what)
        if isinstance(call, BatchNorm) and self.cudnn is not None:
            cudnn, out, inputs, ds = self.cudnn, pointers[0], tuple(pointers[1:6]), self.cudnn.prepare_batch_norm(call)
            forward = "cudnnBatchNormalizationForwardInference"
            return Bound(lambda: cudnn.batch_norm(call, ds, out, inputs), 0, forward)
        return None

    def set_stream(self, stream: int) -> None:
        """Every later library call on `stream`: the driver's, where its launches go and a capture records."""
        for lib in (self.cublas, self.cudnn):
            if lib is not None:
                lib.set_stream(stream)

    def close(self) -> None:
        for lib in (self.cublas, self.cudnn):
            if lib is not None:
                lib.close()


OWN = Vendor()


def _open(kind: type, sonames: Sequence[str], folders: Sequence[Path] | None, stream: int) -> tuple[Any, str]:
    """The first candidate of `sonames` that loads and opens a handle (on the current context), as `kind`; else
    None and what went wrong with each."""
    tried = []
    for path in candidates(sonames, folders):
        try:
            lib = _load(path)
        except OSError as err:
            if "/" in path:  # a file that is there but does not load; a bare soname the loader did not find is not
                tried.append(str(err))  # the loader's message names the file
            continue
        try:
            return kind(lib, path, stream), ""
        except (DslProgramError, AttributeError) as err:
            tried.append(f"{path}: {getattr(err, 'message', err)}")
    return None, "; ".join(tried) or f"{' or '.join(sonames)} not found"


def open_vendor(kernels: str, folders: Sequence[Path] | None = None, stream: int = 0, tf32: bool = False) -> Vendor:
    """The vendor libraries for `--kernels` (call it with the GPU's context current): `own` none; `vendor` cuBLAS
    and cuDNN, or a MissingLibrary error naming what is missing and how to install it; `auto` those that load.
    `tf32`: their GEMMs and convolutions in TF32 tensor-op math (--precision tf32); our kernels stay float32."""
    assert kernels in KERNELS, kernels
    if kernels == "own":
        return OWN
    cublas, why_cublas = _open(Cublas, CUBLAS_SONAMES, folders, stream)
    cudnn, why_cudnn = _open(Cudnn, CUDNN_SONAMES, folders, stream)
    missing = [f"no cuBLAS: {why_cublas}"] * (cublas is None) + [f"no cuDNN: {why_cudnn}"] * (cudnn is None)
    if kernels == "vendor" and missing:
        for lib in (cublas, cudnn):
            if lib is not None:
                lib.close()
        installs = [CUBLAS_INSTALL] * (cublas is None) + [CUDNN_INSTALL] * (cudnn is None)
        raise MissingLibrary(f"--kernels vendor: {'; '.join(missing)}; install {' and '.join(installs)}, "
                             "or use --kernels own")  # fmt: skip
    for lib in (cublas, cudnn):
        if lib is not None and tf32:
            lib.set_tf32(True)
    return Vendor(cublas, cudnn, missing, strict=kernels == "vendor")


__all__ = ["CUBLAS_SONAMES", "CUDNN_SONAMES", "KERNELS", "OWN", "Bound", "MissingLibrary", "Vendor", "candidates",
           "library_folders", "open_vendor"]  # fmt: skip
