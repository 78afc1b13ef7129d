"""cuDNN 9 through ctypes: a `ConvForward` (ir/vendor.py) as the legacy `cudnnConvolutionForward`.

Each convolution gets its descriptors once, when the runner starts, and its algorithm: the first that
`cudnnGetConvolutionForwardAlgorithm_v7` proposes (cuDNN's heuristic order) whose scratch fits the workspace the plan
gave the statement (memory/plan.py, bounded by --workspace-limit; zero where the plan gave none), so cuDNN's
scratch is arena the plan already counts. Math is `CUDNN_FMA_MATH`: float32 without TF32, as the other runners
compute. The legacy calls are deprecated in cuDNN 9 but exported; they live in this one module, so a move to the
graph API stays local.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from deepdsl.errors import DslProgramError
from deepdsl.ir.vendor import ConvForward

_NCHW, _FLOAT, _CROSS_CORRELATION, _FMA_MATH = 0, 0, 1, 3
ALGORITHMS = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
              "WINOGRAD_NONFUSED")  # fmt: skip


class _AlgoPerf(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]  # fmt: skip


@dataclass(frozen=True)
class Conv:
    """A convolution ready to run: its descriptors, its algorithm and the scratch that algorithm needs."""

    x: ctypes.c_void_p
    w: ctypes.c_void_p
    conv: ctypes.c_void_p
    y: ctypes.c_void_p
    algo: int
    workspace: int

    @property
    def algorithm(self) -> str:
        return ALGORITHMS[self.algo] if self.algo < len(ALGORITHMS) else str(self.algo)


class Cudnn:
    """One cuDNN handle on the current CUDA context, on `stream` (0: the default stream of our kernels)."""

    def __init__(self, lib: ctypes.CDLL, path: str, stream: int = 0):
        self.lib, self.path = lib, path
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        self.handle = ctypes.c_void_p()
        self._check(lib.cudnnCreate(ctypes.byref(self.handle)), "cudnnCreate")
        self._check(lib.cudnnSetStream(self.handle, ctypes.c_void_p(stream)), "cudnnSetStream")
        v = int(lib.cudnnGetVersion())
        self.version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.descriptors: list[tuple[str, ctypes.c_void_p]] = []  # (destroy call, descriptor), freed at close
        p, i, z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        lib.cudnnConvolutionForward.argtypes = [p, p, p, p, p, p, p, i, p, z, p, p, p]

    @property
    def description(self) -> str:
        return f"cuDNN {self.version} ({Path(self.path).name})"

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            text = self.lib.cudnnGetErrorString(status).decode()
            raise DslProgramError(f"--kernels vendor: {call} failed ({text})")

    def _descriptor(self, kind: str) -> ctypes.c_void_p:
        d = ctypes.c_void_p()
        self._check(getattr(self.lib, f"cudnnCreate{kind}Descriptor")(ctypes.byref(d)), f"cudnnCreate{kind}Descriptor")
        self.descriptors.append((f"cudnnDestroy{kind}Descriptor", d))
        return d

    def prepare(self, c: ConvForward, workspace: int) -> Conv:
        """The descriptors of `c`, checked against cuDNN's own output size, and the first proposed algorithm whose
        scratch is at most `workspace` bytes."""
        x, w, conv, y = (self._descriptor(k) for k in ("Tensor", "Filter", "Convolution", "Tensor"))
        lib, check = self.lib, self._check
        check(lib.cudnnSetTensor4dDescriptor(x, _NCHW, _FLOAT, c.n, c.c, c.h, c.w), "cudnnSetTensor4dDescriptor")
        check(lib.cudnnSetFilter4dDescriptor(w, _FLOAT, _NCHW, c.f, c.c // c.groups, c.kh, c.kw),
              "cudnnSetFilter4dDescriptor")  # fmt: skip
        (ph, pw), (sh, sw) = c.pad, c.stride
        check(lib.cudnnSetConvolution2dDescriptor(conv, ph, pw, sh, sw, 1, 1, _CROSS_CORRELATION, _FLOAT),
              "cudnnSetConvolution2dDescriptor")  # fmt: skip
        check(lib.cudnnSetConvolutionGroupCount(conv, c.groups), "cudnnSetConvolutionGroupCount")
        check(lib.cudnnSetConvolutionMathType(conv, _FMA_MATH), "cudnnSetConvolutionMathType")
        dims = [ctypes.c_int() for _ in range(4)]
        check(lib.cudnnGetConvolution2dForwardOutputDim(conv, x, w, *map(ctypes.byref, dims)),
              "cudnnGetConvolution2dForwardOutputDim")  # fmt: skip
        if tuple(d.value for d in dims) != (c.n, c.f, c.oh, c.ow):
            raise DslProgramError(f"--kernels vendor: cuDNN makes {c} an output of {[d.value for d in dims]}")
        check(lib.cudnnSetTensor4dDescriptor(y, _NCHW, _FLOAT, c.n, c.f, c.oh, c.ow), "cudnnSetTensor4dDescriptor")
        perf, count = (_AlgoPerf * len(ALGORITHMS))(), ctypes.c_int()
        check(lib.cudnnGetConvolutionForwardAlgorithm_v7(self.handle, x, w, conv, y, len(ALGORITHMS),
                                                         ctypes.byref(count), perf),
              "cudnnGetConvolutionForwardAlgorithm_v7")  # fmt: skip
        for p in perf[: count.value]:
            if p.status == 0 and p.memory <= workspace:
                return Conv(x, w, conv, y, p.algo, int(p.memory))
        raise DslProgramError(f"--kernels vendor: cuDNN proposes no algorithm for {c} within {workspace:,} bytes")

    def forward(self, conv: Conv, y: int, x: int, w: int, workspace: int) -> None:
        """y = conv(x, w) at device addresses, with `conv.workspace` bytes of scratch at `workspace`."""
        status = self.lib.cudnnConvolutionForward(self.handle, ctypes.byref(self.one), conv.x, x, conv.w, w, conv.conv,
                                                  conv.algo, workspace or None, conv.workspace, ctypes.byref(self.zero),
                                                  conv.y, y)  # fmt: skip
        self._check(status, "cudnnConvolutionForward")

    def close(self) -> None:
        for destroy, d in reversed(self.descriptors):
            getattr(self.lib, destroy)(d)
        self.descriptors.clear()
        if self.handle:
            self.lib.cudnnDestroy(self.handle)
            self.handle = ctypes.c_void_p()
