"""Dense layers: y = x W^T (the weight keeps PyTorch's [out, in] layout), and the bias add."""

from __future__ import annotations

from typing import Any

import numpy as np

from deepdsl.ir.registry import (
    defop,
    eager_saves,
    flops_rule,
    index_form,
    java_call,
    numpy_kernel,
    storage,
    vendor_rule,
    vjp_rule,
)
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ir.vendor import Gemm
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_float, need_rank
from deepdsl.ops._index_forms import ap, pointwise


@defop("linear", 2, accepts_epilogue=True)
def linear(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """x [N, D] times W [O, D] transposed -> [N, O]."""
    x, w = types
    need_float(x, "full")
    need_rank(x, (2,), "full", " (use `flatten` first to turn [N, C, H, W] into [N, C*H*W])")
    if w.rank != 2 or w.shape[1] != x.shape[1]:
        raise ShapeError(f"full: weight {w} does not fit input {x}")
    return TensorType((x.shape[0], w.shape[0]))


@defop("bias_add", 2, elementwise=True, cheap_to_recompute=True)
def bias_add(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """x + b broadcast along axis 1 (channels or features)."""
    x, b = types
    if x.rank < 2 or b.shape != (x.shape[1],):
        raise ShapeError(f"bias {b} does not fit {x} along axis 1")
    return x


@defop("matmul", 2, accepts_epilogue=True)
def matmul(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """op(a) @ op(b) for 2-D a, b, where op transposes when attrs transpose_a / transpose_b."""
    a, b = types
    if a.rank != 2 or b.rank != 2:
        raise ShapeError(f"matmul needs 2-D operands, got {a} and {b}")
    m, k = a.shape[::-1] if attrs.get("transpose_a") else a.shape
    k2, n = b.shape[::-1] if attrs.get("transpose_b") else b.shape
    if k != k2:
        raise ShapeError(f"matmul: inner sizes differ ({a} and {b})")
    return TensorType((m, n))


def _t(x: np.ndarray, flag: bool) -> np.ndarray:
    return x.T if flag else x


numpy_kernel("linear")(lambda xs, a: xs[0] @ xs[1].T)
numpy_kernel("matmul")(lambda xs, a: _t(xs[0], a.get("transpose_a", False)) @ _t(xs[1], a.get("transpose_b", False)))
numpy_kernel("bias_add")(lambda xs, a: xs[0] + xs[1].reshape((1, -1) + (1,) * (xs[0].ndim - 2)))


@flops_rule("linear")
def _linear_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 2 * out.numel * types[0].shape[1]


@flops_rule("matmul")
def _matmul_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    k = types[0].shape[0] if a.get("transpose_a") else types[0].shape[1]
    return 2 * out.numel * k


@flops_rule("bias_add")
def _bias_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return out.numel


@vjp_rule("linear")
def _linear_vjp(b: Any, s: Any, g: Any) -> tuple:
    x, w = s.inputs
    return (_e(b, s, "matmul", g, w), _e(b, s, "matmul", g, x, transpose_a=True))


@vjp_rule("matmul")
def _matmul_vjp(b: Any, s: Any, g: Any) -> tuple:
    x, w = s.inputs
    ta, tb = s.a.get("transpose_a", False), s.a.get("transpose_b", False)
    # C = op(A) op(B): dop(A) = G op(B)^T, dop(B) = op(A)^T G, then undo the op (per batch for batch_matmul)
    ga = _e(b, s, s.op, w, g, transpose_a=tb, transpose_b=True) if ta else _e(b, s, s.op, g, w, transpose_b=not tb)
    gb = _e(b, s, s.op, g, x, transpose_a=True, transpose_b=ta) if tb else _e(b, s, s.op, x, g, transpose_a=not ta)
    return (ga, gb)


@vjp_rule("bias_add")
def _bias_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (g, _e(b, s, "channel_sum", g))


index_form("bias_add")(pointwise(lambda a, x, b: ap("+", x, b)))


def _expanding(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> bool:
    """A batched product whose output [B, m, n] holds at least as many elements as its operands [B, m, k] and
    [B, k, n] (k·(m + n) <= m·n: attention's scores q·kᵀ, k the width of a head): recomputing it from operands
    that its gradient keeps anyway costs 2k FLOPs per element and saves the whole output."""
    a, b = types
    m, k = a.shape[:0:-1] if attrs.get("transpose_a") else a.shape[1:]
    n = b.shape[1] if attrs.get("transpose_b") else b.shape[2]
    return k * (m + n) <= m * n


@defop("batch_matmul", 2, accepts_epilogue=True, cheap_to_recompute=_expanding)
def batch_matmul(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """op(a[b]) @ op(b[b]) for each b of 3-D a, b (the built-in `matmul` of batches, and the GEMM a tensor
    function computes after vectorise)."""
    a, b = types
    if a.rank != 3 or b.rank != 3 or a.shape[0] != b.shape[0]:
        raise ShapeError(f"batch_matmul needs 3-D operands with one batch size, got {a} and {b}")
    m, k = a.shape[:0:-1] if attrs.get("transpose_a") else a.shape[1:]
    k2, n = b.shape[:0:-1] if attrs.get("transpose_b") else b.shape[1:]
    if k != k2:
        raise ShapeError(f"batch_matmul: inner sizes differ ({a} and {b})")
    return TensorType((a.shape[0], m, n))


def _bt(x: np.ndarray, flag: bool) -> np.ndarray:
    return np.swapaxes(x, 1, 2) if flag else x


numpy_kernel("batch_matmul")(
    lambda xs, a: _bt(xs[0], a.get("transpose_a", False)) @ _bt(xs[1], a.get("transpose_b", False))
)


@flops_rule("batch_matmul")
def _batch_matmul_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    k = types[0].shape[1] if a.get("transpose_a") else types[0].shape[2]
    return 2 * out.numel * k


@defop("transpose", 1)
def transpose(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Axes permuted: output axis i is input axis perm[i] (the built-ins `transpose` and `permute`)."""
    (x,) = types
    perm = tuple(attrs["perm"])
    if sorted(perm) != list(range(x.rank)):
        raise ShapeError(f"transpose: {perm} is not a permutation of the axes of {x}")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype)


numpy_kernel("transpose")(lambda xs, a: np.ascontiguousarray(np.transpose(xs[0], a["perm"])))
flops_rule("transpose")(lambda types, out, a: out.numel)


@vjp_rule("transpose")
def _transpose_vjp(b: Any, s: Any, g: Any) -> tuple:
    perm = tuple(s.a["perm"])
    return (_e(b, s, "transpose", g, perm=tuple(perm.index(k) for k in range(len(perm)))),)


vjp_rule("batch_matmul")(_matmul_vjp)


@vendor_rule("matmul", "batch_matmul")
def _matmul_gemm(types: tuple[TensorType, ...], out: TensorType, a: dict) -> Gemm:
    """One SGEMM (strided-batched for batch_matmul) with the statement's transposes."""
    ta, tb = bool(a.get("transpose_a", False)), bool(a.get("transpose_b", False))
    k = types[0].shape[-2] if ta else types[0].shape[-1]
    return Gemm(out.shape[0] if out.rank == 3 else 1, out.shape[-2], out.shape[-1], k, ta, tb)


vendor_rule("linear")(lambda types, out, a: Gemm(1, out.shape[0], out.shape[1], types[0].shape[1], False, True))
eager_saves("linear", "matmul", "batch_matmul", which=(0, 1))  # what eager autograd keeps


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("linear", "Buf x, Buf w", cls="CpuGemm")
java_call("matmul", "Buf a, Buf b, boolean transposeA, boolean transposeB", cls="CpuGemm")
java_call("batch_matmul", "Buf a, Buf b, boolean transposeA, boolean transposeB", cls="CpuGemm")
java_call("transpose", "Buf x, int[] perm", cls="CpuShapes")

# --precision bf16: operands and result in bf16, products accumulated in fp32 (cublasGemmEx, CUBLAS_COMPUTE_32F)
storage("bf16", "linear", "matmul")
storage("bf16", "batch_matmul")  # attention's products likewise
storage("follow", "transpose")  # a copy: its input's type
