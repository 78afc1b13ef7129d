"""cuDNN 9 through ctypes: the convolutions (`ConvForward`, `ConvBackwardData`, `ConvBackwardFilter`, ir/vendor.py)
as the legacy `cudnnConvolutionForward`, `...BackwardData` and `...BackwardFilter`, the bias gradient
(`ConvBackwardBias`) as `cudnnConvolutionBackwardBias`, pooling (`Pool`, `PoolBackward`) as `cudnnPoolingForward`
and `...Backward`, softmax (`Softmax`, `SoftmaxBackward`: accurate or log, over the channels of [rows, k, 1, 1]) as
`cudnnSoftmaxForward` / `...Backward`, LRN (`Lrn`, `LrnBackward`) as `cudnnLRNCrossChannelForward` / `...Backward`,
and batch norm's apply (`BatchNorm`) as `cudnnBatchNormalizationForwardInference` (SPATIAL; the given statistics:
the inference program's running ones, the training program's batch ones). Batch norm's training gradient is never
cuDNN's: `cudnnBatchNormalizationBackward` cannot take the scale and shift gradients the program computes anyway, so
it would sum them again (ops/norm.py `bn_train_backward`); our one pass runs it.

Each call gets its descriptors once, when the runner starts, and a convolution its algorithm, within the scratch the
caller allows (vendor.py: the workspace limit, or the statement's planned workspace where that is larger): by
timing (`prepare(..., find=...)`: `cudnnFind...AlgorithmEx` runs every algorithm on the caller's buffers, with a
temporary scratch; the fastest precise one that fits, deterministic or not), or under `--deterministic` the first
deterministic one the call's `_v7` query proposes (cuDNN's heuristic order). Find synchronises, so it never runs
while a stream is captured (the runner finds at its start, before any graph). Math is
`CUDNN_FMA_MATH`: float32 without TF32, as the other runners compute. The legacy calls are
deprecated in cuDNN 9 but exported; they live in this one module, so a move to the graph API stays local.

Under --precision bf16 a convolution whose operands and result the plan stores in bf16 has CUDNN_DATA_BFLOAT16
tensor and filter descriptors and a CUDNN_DATA_FLOAT convolution descriptor (cuDNN's PSEUDO_BFLOAT16_CONFIG: bf16
in memory, products accumulated in float32, the result rounded once) in CUDNN_TENSOR_OP_MATH, which the bf16
configurations run on (the operands are bf16 already: no TF32 rounding is involved).

Max pooling is `CUDNN_POOLING_MAX_DETERMINISTIC` with NaN propagated (as np.maximum does). Where a window holds
tied maxima our kernels send its gradient to the first in row-major order; cuDNN does not document which one it
picks, so on ties the two may differ in where (not how much) gradient goes. Average pooling is
`CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING`: every window divides by kh * kw, as ours. Its backward reads neither X
nor Y, but the call takes them; it is given dY for Y and dX for X (the right sizes, never read).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from deepdsl.errors import DslProgramError
from deepdsl.ir.vendor import (
    BatchNorm,
    ConvBackwardBias,
    ConvBackwardData,
    ConvBackwardFilter,
    ConvForward,
    Lrn,
    LrnBackward,
    Pool,
    PoolBackward,
    Softmax,
    SoftmaxBackward,
)

_NCHW, _FLOAT, _CROSS_CORRELATION, _FMA_MATH = 0, 0, 1, 3
_BFLOAT16 = 9  # cudnnDataType_t CUDNN_DATA_BFLOAT16
_TENSOR_OP_MATH = 1  # --precision tf32: float32 convolutions may run on TF32 tensor cores
_MAX_DETERMINISTIC, _AVG_INCLUDE_PADDING, _PROPAGATE_NAN = 3, 1, 1
_SOFTMAX_ACCURATE, _SOFTMAX_LOG, _SOFTMAX_CHANNEL, _LRN_CROSS_CHANNEL = 1, 2, 1, 0
_BATCHNORM_SPATIAL = 1
# per call: its algorithms (cudnn_cnn.h's order), the _v7 query that proposes them
ALGORITHMS = {
    "cudnnConvolutionForward": ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
                                "WINOGRAD", "WINOGRAD_NONFUSED"),
    "cudnnConvolutionBackwardData": ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"),
    "cudnnConvolutionBackwardFilter": ("ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                                       "FFT_TILING"),
}  # fmt: skip
_DETERMINISTIC = 1  # cudnnDeterminism_t CUDNN_DETERMINISTIC


def _PRECISE(call: str, algo: int) -> bool:  # noqa: N802 — a table read as a predicate
    names = ALGORITHMS[call]
    return algo < len(names) and names[algo] not in ("FFT", "FFT_TILING", "WINOGRAD_NONFUSED")


QUERY = {
    "cudnnConvolutionForward": "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnConvolutionBackwardData": "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnConvolutionBackwardFilter": "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
}
# per call: the timing query (cudnnFind...AlgorithmEx), which runs each algorithm on the given buffers and scratch
FIND = {
    "cudnnConvolutionForward": "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnConvolutionBackwardData": "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnConvolutionBackwardFilter": "cudnnFindConvolutionBackwardFilterAlgorithmEx",
}


class _AlgoPerf(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]  # fmt: skip


@dataclass(frozen=True)
class Conv:
    """A convolution call ready to run: its descriptors, its algorithm and the scratch that algorithm needs."""

    call: str  # cudnnConvolutionForward, ...BackwardData or ...BackwardFilter
    x: ctypes.c_void_p
    w: ctypes.c_void_p
    conv: ctypes.c_void_p
    y: ctypes.c_void_p
    algo: int
    workspace: int
    time_ms: float | None = None  # what Find measured (None: the heuristic's choice, not timed)
    shape: str = ""  # its sizes as both CUDA devices report them (conv_shape)

    @property
    def algorithm(self) -> str:
        names = ALGORITHMS[self.call]
        return names[self.algo] if self.algo < len(names) else str(self.algo)


@dataclass(frozen=True)
class Pooling:
    """A pooling call ready to run: its descriptors and whether it is the backward."""

    pool: ctypes.c_void_p
    x: ctypes.c_void_p
    y: ctypes.c_void_p
    mode: str
    backward: bool


def conv_shape(c: ConvForward) -> str:
    """A convolution's sizes as both CUDA devices report them (the Java device's CudaDnn.shape): x, w and y in
    forward terms, padding, stride, dilation, groups."""
    return (
        f"x {[c.n, c.c, c.h, c.w]} w {[c.f, c.c // c.groups, c.kh, c.kw]} y {[c.n, c.f, c.oh, c.ow]} "
        f"pad {list(c.pad)} stride {list(c.stride)} dilation {list(c.dilation)} groups {c.groups}"
    )


class Cudnn:
    """One cuDNN handle on the current CUDA context, on `stream` (the driver's, where our kernels go)."""

    def __init__(self, lib: ctypes.CDLL, path: str, stream: int = 0):
        self.lib, self.path = lib, path
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        self.handle = ctypes.c_void_p()
        self._check(lib.cudnnCreate(ctypes.byref(self.handle)), "cudnnCreate")
        self.set_stream(stream)
        v = int(lib.cudnnGetVersion())
        self.version = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
        self.one, self.zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self.math = _FMA_MATH  # the convolutions' math type: set_tf32 changes it for the descriptors made after
        self.descriptors: list[tuple[str, ctypes.c_void_p]] = []  # (destroy call, descriptor), freed at close
        p, i, z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        for call in ALGORITHMS:
            getattr(lib, call).argtypes = [p, p, p, p, p, p, p, i, p, z, p, p, p]
            # Find: handle, three (descriptor, pointer) pairs around the convolution descriptor, the count asked
            # for, the count returned, the results, the scratch and its bytes
            if hasattr(lib, FIND[call]):
                getattr(lib, FIND[call]).argtypes = [p, p, p, p, p, p, p, p, i, p, p, p, z]
        lib.cudnnPoolingForward.argtypes = [p] * 8
        lib.cudnnConvolutionBackwardBias.argtypes = [p] * 7
        lib.cudnnSoftmaxForward.argtypes = [p, i, i, p, p, p, p, p, p]
        lib.cudnnSoftmaxBackward.argtypes = [p, i, i, p, p, p, p, p, p, p, p]
        lib.cudnnLRNCrossChannelForward.argtypes = [p, p, i, p, p, p, p, p, p]
        lib.cudnnLRNCrossChannelBackward.argtypes = [p, p, i, p, p, p, p, p, p, p, p, p, p]
        lib.cudnnPoolingBackward.argtypes = [p] * 12
        d = ctypes.c_double
        lib.cudnnBatchNormalizationForwardInference.argtypes = [p, i, p, p, p, p, p, p, p, p, p, p, p, d]

    def set_stream(self, stream: int) -> None:
        """Issue every later call on `stream` (the driver's, so that a capture of it records them)."""
        self._check(self.lib.cudnnSetStream(self.handle, ctypes.c_void_p(stream)), "cudnnSetStream")

    def set_tf32(self, on: bool) -> None:
        """The convolutions prepared from now on in TF32 tensor-op math (--precision tf32), or FMA float32."""
        self.math = _TENSOR_OP_MATH if on else _FMA_MATH

    @property
    def description(self) -> str:
        return f"cuDNN {self.version} ({Path(self.path).name}{'; TF32' if self.math == _TENSOR_OP_MATH else ''})"

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            text = self.lib.cudnnGetErrorString(status).decode()
            raise DslProgramError(f"--kernels vendor: {call} failed ({text})")

    def _descriptor(self, kind: str) -> ctypes.c_void_p:
        d = ctypes.c_void_p()
        self._check(getattr(self.lib, f"cudnnCreate{kind}Descriptor")(ctypes.byref(d)), f"cudnnCreate{kind}Descriptor")
        self.descriptors.append((f"cudnnDestroy{kind}Descriptor", d))
        return d

    def prepare(self, call: ConvForward | ConvBackwardData | ConvBackwardFilter, workspace: int,
                find: tuple[int, int, int, Callable[[int], int]] | None = None,
                bf16: bool = False) -> Conv:  # fmt: skip
        """The descriptors of the convolution `call`, checked against cuDNN's own output size, and its algorithm
        within `workspace` bytes of scratch: with `find` (the call's output, its two inputs in the statement's order,
        as device addresses, and a function that gives the address of a temporary scratch of at least the bytes it
        is asked for) the fastest that cudnnFind...Ex times on them, given the most scratch any listed algorithm
        needs within `workspace` (Find writes arbitrary values to the output and the scratch, so neither may hold
        anything live); without, the first deterministic one the heuristic query proposes. `bf16`: the operands and
        result are bf16 (float32 compute, tensor-op math)."""
        name = {ConvForward: "cudnnConvolutionForward", ConvBackwardData: "cudnnConvolutionBackwardData",
                ConvBackwardFilter: "cudnnConvolutionBackwardFilter"}[type(call)]  # fmt: skip
        c = call if isinstance(call, ConvForward) else call.conv
        x, w, conv, y = (self._descriptor(k) for k in ("Tensor", "Filter", "Convolution", "Tensor"))
        lib, check = self.lib, self._check
        data = _BFLOAT16 if bf16 else _FLOAT  # the tensors' and filter's type; the computation's is float32
        check(lib.cudnnSetTensor4dDescriptor(x, _NCHW, data, c.n, c.c, c.h, c.w), "cudnnSetTensor4dDescriptor")
        check(lib.cudnnSetFilter4dDescriptor(w, data, _NCHW, c.f, c.c // c.groups, c.kh, c.kw),
              "cudnnSetFilter4dDescriptor")  # fmt: skip
        (ph, pw), (sh, sw), (dh, dw) = c.pad, c.stride, c.dilation
        check(lib.cudnnSetConvolution2dDescriptor(conv, ph, pw, sh, sw, dh, dw, _CROSS_CORRELATION, _FLOAT),
              "cudnnSetConvolution2dDescriptor")  # fmt: skip
        check(lib.cudnnSetConvolutionGroupCount(conv, c.groups), "cudnnSetConvolutionGroupCount")
        check(lib.cudnnSetConvolutionMathType(conv, _TENSOR_OP_MATH if bf16 else self.math),
              "cudnnSetConvolutionMathType")  # fmt: skip
        dims = [ctypes.c_int() for _ in range(4)]
        check(lib.cudnnGetConvolution2dForwardOutputDim(conv, x, w, *map(ctypes.byref, dims)),
              "cudnnGetConvolution2dForwardOutputDim")  # fmt: skip
        if tuple(d.value for d in dims) != (c.n, c.f, c.oh, c.ow):
            raise DslProgramError(f"--kernels vendor: cuDNN makes {c} an output of {[d.value for d in dims]}")
        check(lib.cudnnSetTensor4dDescriptor(y, _NCHW, data, c.n, c.f, c.oh, c.ow), "cudnnSetTensor4dDescriptor")
        sizes = conv_shape(c)
        algorithms = len(ALGORITHMS[name])
        perf, count = (_AlgoPerf * algorithms)(), ctypes.c_int()
        # the query's descriptors: forward (x, w, conv, y), data (w, dy, conv, dx), filter (x, dy, conv, dw)
        operands = {"cudnnConvolutionForward": (x, w, conv, y), "cudnnConvolutionBackwardData": (w, y, conv, x),
                    "cudnnConvolutionBackwardFilter": (x, y, conv, w)}[name]  # fmt: skip
        check(getattr(lib, QUERY[name])(self.handle, *operands, algorithms, ctypes.byref(count), perf), QUERY[name])
        if find is not None:
            out, a, b, scratch = find
            room = min(workspace, max((int(p.memory) for p in perf[: count.value] if p.status == 0), default=0))
            at = scratch(room) if room else None
            # Find's operands: forward (x, w -> y), data (w, dy -> dx), filter (x, dy -> dw); the statement's inputs
            # are forward (x, w), data (dy, w), filter (x, dy)
            pairs = {"cudnnConvolutionForward": ((x, a), (w, b), (y, out)),
                     "cudnnConvolutionBackwardData": ((w, b), (y, a), (x, out)),
                     "cudnnConvolutionBackwardFilter": ((x, a), (y, b), (w, out))}[name]  # fmt: skip
            (d1, p1), (d2, p2), (d3, p3) = pairs
            perf, count = (_AlgoPerf * algorithms)(), ctypes.c_int()
            check(getattr(lib, FIND[name])(self.handle, d1, p1, d2, p2, conv, d3, p3, algorithms, ctypes.byref(count),
                                           perf, at, room), FIND[name])  # fmt: skip
            ran = [p for p in perf[: count.value] if p.status == 0 and p.memory <= room and p.time >= 0]
            # fastest first (Find's order); a precise one where any fits (FFT loses float32 precision: the NumPy
            # runner's tolerance), deterministic or not (atomics make ALGO_0/ALGO_3 of the gradients vary run to run)
            for p in sorted(ran, key=lambda p: (not _PRECISE(name, p.algo), p.time)):
                return Conv(name, x, w, conv, y, p.algo, int(p.memory), float(p.time), sizes)
            raise DslProgramError(f"--kernels vendor: cuDNN finds no algorithm for {call} within {room:,} bytes")
        fits = [p for p in perf[: count.value] if p.status == 0 and p.memory <= workspace]
        # in cuDNN's order (fastest first), a deterministic algorithm outside the FFT and non-fused Winograd families
        # (atomics make ALGO_0/ALGO_3 of the gradients vary from run to run; FFT loses float32 precision), so that
        # the runner's results repeat and stay within the tolerance of the NumPy runner; else the first that fits
        for p in sorted(fits, key=lambda p: not (p.determinism == _DETERMINISTIC and _PRECISE(name, p.algo))):
            return Conv(name, x, w, conv, y, p.algo, int(p.memory), None, sizes)
        raise DslProgramError(f"--kernels vendor: cuDNN proposes no algorithm for {call} within {workspace:,} bytes")

    def convolve(self, conv: Conv, out: int, a: int, b: int, workspace: int) -> None:
        """out = the convolution call on inputs a, b (the statement's order: forward x, w; data dy, w; filter x,
        dy) at device addresses, with `conv.workspace` bytes of scratch at `workspace`."""
        operands = {"cudnnConvolutionForward": ((conv.x, a), (conv.w, b), conv.y),
                    "cudnnConvolutionBackwardData": ((conv.w, b), (conv.y, a), conv.x),
                    "cudnnConvolutionBackwardFilter": ((conv.x, a), (conv.y, b), conv.w)}  # fmt: skip
        first, second, result = operands[conv.call]
        status = getattr(self.lib, conv.call)(self.handle, ctypes.byref(self.one), *first, *second, conv.conv,
                                              conv.algo, workspace or None, conv.workspace, ctypes.byref(self.zero),
                                              result, out)  # fmt: skip
        self._check(status, conv.call)

    def prepare_bias(self, call: ConvBackwardBias) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        """The descriptors of dY [n, c, h, w] and db [1, c, 1, 1] for `cudnnConvolutionBackwardBias`."""
        dy, db = self._descriptor("Tensor"), self._descriptor("Tensor")
        b = call
        self._check(self.lib.cudnnSetTensor4dDescriptor(dy, _NCHW, _FLOAT, b.n, b.c, b.h, b.w),
                    "cudnnSetTensor4dDescriptor")  # fmt: skip
        self._check(self.lib.cudnnSetTensor4dDescriptor(db, _NCHW, _FLOAT, 1, b.c, 1, 1), "cudnnSetTensor4dDescriptor")
        return dy, db

    def bias(self, descriptors: tuple[ctypes.c_void_p, ctypes.c_void_p], db: int, dy: int) -> None:
        """db = the per-channel sum of dy, at device addresses."""
        one, zero = ctypes.byref(self.one), ctypes.byref(self.zero)
        status = self.lib.cudnnConvolutionBackwardBias(self.handle, one, descriptors[0], dy, zero, descriptors[1], db)
        self._check(status, "cudnnConvolutionBackwardBias")

    def prepare_pool(self, call: Pool | PoolBackward) -> Pooling:
        """The descriptors of the pooling `call`, checked against cuDNN's own output size."""
        p = call if isinstance(call, Pool) else call.pool
        pool, x, y = self._descriptor("Pooling"), self._descriptor("Tensor"), self._descriptor("Tensor")
        lib, check = self.lib, self._check
        mode = _MAX_DETERMINISTIC if p.mode == "max" else _AVG_INCLUDE_PADDING
        (kh, kw), (ph, pw), (sh, sw) = p.kernel, p.pad, p.stride
        check(lib.cudnnSetPooling2dDescriptor(pool, mode, _PROPAGATE_NAN, kh, kw, ph, pw, sh, sw),
              "cudnnSetPooling2dDescriptor")  # fmt: skip
        check(lib.cudnnSetTensor4dDescriptor(x, _NCHW, _FLOAT, p.n, p.c, p.h, p.w), "cudnnSetTensor4dDescriptor")
        dims = [ctypes.c_int() for _ in range(4)]
        check(lib.cudnnGetPooling2dForwardOutputDim(pool, x, *map(ctypes.byref, dims)),
              "cudnnGetPooling2dForwardOutputDim")  # fmt: skip
        if tuple(d.value for d in dims) != (p.n, p.c, p.oh, p.ow):
            raise DslProgramError(f"--kernels vendor: cuDNN makes {p} an output of {[d.value for d in dims]}")
        check(lib.cudnnSetTensor4dDescriptor(y, _NCHW, _FLOAT, p.n, p.c, p.oh, p.ow), "cudnnSetTensor4dDescriptor")
        return Pooling(pool, x, y, p.mode, isinstance(call, PoolBackward))

    def pool(self, p: Pooling, out: int, inputs: tuple[int, ...]) -> None:
        """out = the pooling call on `inputs` (the statement's: forward x; max backward x, y, dy; avg backward dy)."""
        one, zero = ctypes.byref(self.one), ctypes.byref(self.zero)
        if not p.backward:
            status = self.lib.cudnnPoolingForward(self.handle, p.pool, one, p.x, inputs[0], zero, p.y, out)
            return self._check(status, "cudnnPoolingForward")
        x, y, dy = inputs if p.mode == "max" else (out, inputs[0], inputs[0])  # avg: x and y are not read
        status = self.lib.cudnnPoolingBackward(self.handle, p.pool, one, p.y, y, p.y, dy, p.x, x, zero, p.x, out)
        self._check(status, "cudnnPoolingBackward")

    def prepare_softmax(self, call: Softmax | SoftmaxBackward) -> ctypes.c_void_p:
        """The descriptor of [rows, k, 1, 1] for the softmax `call`."""
        s = call if isinstance(call, Softmax) else call.softmax
        d = self._descriptor("Tensor")
        self._check(self.lib.cudnnSetTensor4dDescriptor(d, _NCHW, _FLOAT, s.rows, s.k, 1, 1),
                    "cudnnSetTensor4dDescriptor")  # fmt: skip
        return d

    def softmax(self, call: Softmax | SoftmaxBackward, d: ctypes.c_void_p, out: int, inputs: tuple[int, ...]) -> None:
        """out = the softmax `call` on `inputs` (forward x; backward y, dy) over the channels of descriptor `d`."""
        one, zero = ctypes.byref(self.one), ctypes.byref(self.zero)
        s = call if isinstance(call, Softmax) else call.softmax
        algo = _SOFTMAX_LOG if s.log else _SOFTMAX_ACCURATE
        if isinstance(call, Softmax):
            status = self.lib.cudnnSoftmaxForward(self.handle, algo, _SOFTMAX_CHANNEL, one, d, inputs[0], zero, d, out)
            return self._check(status, "cudnnSoftmaxForward")
        y, dy = inputs
        status = self.lib.cudnnSoftmaxBackward(self.handle, algo, _SOFTMAX_CHANNEL, one, d, y, d, dy, zero, d, out)
        self._check(status, "cudnnSoftmaxBackward")

    def prepare_lrn(self, call: Lrn | LrnBackward) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        """The LRN descriptor of `call` and its tensors' descriptor."""
        r = call if isinstance(call, Lrn) else call.lrn
        norm, d = self._descriptor("LRN"), self._descriptor("Tensor")
        self._check(self.lib.cudnnSetLRNDescriptor(norm, r.size, ctypes.c_double(r.alpha), ctypes.c_double(r.beta),
                                                   ctypes.c_double(r.k)), "cudnnSetLRNDescriptor")  # fmt: skip
        self._check(self.lib.cudnnSetTensor4dDescriptor(d, _NCHW, _FLOAT, r.n, r.c, r.h, r.w),
                    "cudnnSetTensor4dDescriptor")  # fmt: skip
        return norm, d

    def lrn(self, descriptors: tuple[ctypes.c_void_p, ctypes.c_void_p], out: int, inputs: tuple[int, ...]) -> None:
        """out = the LRN on `inputs` (forward x; backward x, y, dy)."""
        (norm, d), one, zero = descriptors, ctypes.byref(self.one), ctypes.byref(self.zero)
        if len(inputs) == 1:
            status = self.lib.cudnnLRNCrossChannelForward(self.handle, norm, _LRN_CROSS_CHANNEL, one, d, inputs[0],
                                                          zero, d, out)  # fmt: skip
            return self._check(status, "cudnnLRNCrossChannelForward")
        x, y, dy = inputs
        status = self.lib.cudnnLRNCrossChannelBackward(self.handle, norm, _LRN_CROSS_CHANNEL, one, d, y, d, dy, d, x,
                                                       zero, d, out)  # fmt: skip
        self._check(status, "cudnnLRNCrossChannelBackward")

    def prepare_batch_norm(self, call: BatchNorm) -> tuple[ctypes.c_void_p, ctypes.c_void_p]:
        """The descriptors of X [n, c, h, w] (and Y) and of the per-channel tensors [1, c, 1, 1]."""
        b = call
        x, per = self._descriptor("Tensor"), self._descriptor("Tensor")
        self._check(self.lib.cudnnSetTensor4dDescriptor(x, _NCHW, _FLOAT, b.n, b.c, b.h, b.w),
                    "cudnnSetTensor4dDescriptor")  # fmt: skip
        self._check(self.lib.cudnnSetTensor4dDescriptor(per, _NCHW, _FLOAT, 1, b.c, 1, 1), "cudnnSetTensor4dDescriptor")
        return x, per

    def batch_norm(self, call: BatchNorm, descriptors: tuple[ctypes.c_void_p, ctypes.c_void_p], out: int,
                   inputs: tuple[int, ...]) -> None:  # fmt: skip
        """out = the batch norm `call` on `inputs` (the statement's: x, mean, var, gamma, beta)."""
        (x, per), one, zero = descriptors, ctypes.byref(self.one), ctypes.byref(self.zero)
        xs, mean, var, gamma, beta = inputs
        status = self.lib.cudnnBatchNormalizationForwardInference(
            self.handle, _BATCHNORM_SPATIAL, one, zero, x, xs, x, out, per, gamma, beta, mean, var, call.eps
        )
        self._check(status, "cudnnBatchNormalizationForwardInference")

    def close(self) -> None:
        for destroy, d in reversed(self.descriptors):
            getattr(self.lib, destroy)(d)
        self.descriptors.clear()
        if self.handle:
            self.lib.cudnnDestroy(self.handle)
            self.handle = ctypes.c_void_p()
