"""Softmax, the losses, and the inference-only argmax / accuracy."""

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
    vendor_rule,
    vjp_rule,
)
from deepdsl.ir.types import DType, ShapeError, TensorType
from deepdsl.ir.vendor import Softmax, SoftmaxBackward
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_float, need_rank
from deepdsl.ops._index_forms import ap, c, read


def _softmax(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    (x,) = types
    need_float(x, "softmax")
    need_rank(x, (2,), "softmax", " ([N, K]; flatten first)")
    return x


defop("softmax", 1, doc="exp(x - max) / sum exp(x - max) over axis 1")(_softmax)
defop("log_softmax", 1, doc="x - max - log sum exp(x - max) over axis 1")(_softmax)


def _class_loss(what: str):  # noqa: ANN202
    def rule(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
        x, y = types
        need_float(x, what)
        need_rank(x, (2,), what, " ([N, K] scores)")
        if y.dtype is not DType.I64 or y.shape != (x.shape[0],):
            raise ShapeError(f"{what}: labels must be int [{x.shape[0]}] for scores {x}, got {y}")
        return TensorType(())

    return rule


@defop(
    "softmax_cross_entropy", 2, classifies=True,
    doc="mean over the batch of -log softmax(x)[label]; for scores [..., K], labels [...]: the mean over positions",
)  # fmt: skip
def _sce(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    # scores [N, K] and labels [N], or per position (a language model): scores [N, T, K] and labels [N, T], the
    # mean over all N·T rows (PyTorch's F.cross_entropy of the scores reshaped to [N·T, K])
    x, y = types
    need_float(x, "softmax_cross_entropy")
    if x.rank < 2:
        raise ShapeError(f"softmax_cross_entropy expects [N, K] scores (or [N, T, K] per position), got {x}")
    if y.dtype is not DType.I64 or y.shape != x.shape[:-1]:
        want = ", ".join(map(str, x.shape[:-1]))
        raise ShapeError(f"softmax_cross_entropy: labels must be int [{want}] for scores {x}, got {y}")
    return TensorType(())


defop("cross_entropy", 2, doc="mean over the batch of -log p[label] for probabilities p", classifies=True)(
    _class_loss("cross_entropy")
)
defop("accuracy", 2, doc="fraction of rows whose largest score is at the label", differentiable=False)(
    _class_loss("accuracy")
)


@defop("mse", 2)
def mse(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Mean of (pred - target)^2 over every element."""
    a, b = types
    if a.shape != b.shape:
        raise ShapeError(f"mse: prediction {a} and target {b} differ in shape")
    return TensorType(())


@defop("argmax", 1, differentiable=False)
def argmax(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """Index of the largest score per row: [N, K] -> int [N]."""
    (x,) = types
    need_rank(x, (2,), "argmax")
    return TensorType((x.shape[0],), DType.I64)


# ---- backward ops ----


def _like_second(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    return types[1] if len(types) == 2 else types[0]


defop("softmax_backward", 2, doc="y * (g - sum(g * y, axis 1)) for y = softmax(x)  (y, g)", differentiable=False)(
    _like_second
)
defop("log_softmax_backward", 2, doc="g - exp(y) * sum(g, axis 1) for y = log_softmax(x)  (y, g)",
      differentiable=False)(_like_second)  # fmt: skip


@defop("softmax_cross_entropy_backward", 3, differentiable=False)
def _sce_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """(softmax(x) - onehot(labels)) / N * g  (x, labels, g)"""
    return types[0]


@defop("cross_entropy_backward", 3, differentiable=False)
def _ce_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """-onehot(labels) / (p N) * g  (p, labels, g)"""
    return types[0]


@defop("mse_backward", 3, differentiable=False)
def _mse_backward(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """2 (a - b) / numel * g  (a, b, g)"""
    return types[0]


# ---- NumPy kernels ----


def _softmax_np(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _log_softmax_np(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def _rows(n: int) -> np.ndarray:
    return np.arange(n)


numpy_kernel("softmax")(lambda xs, a: _softmax_np(xs[0]))
numpy_kernel("log_softmax")(lambda xs, a: _log_softmax_np(xs[0]))


def _as_rows(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores [..., K] and labels [...] as [rows, K] and [rows]."""
    return x.reshape(-1, x.shape[-1]), labels.reshape(-1)


@numpy_kernel("softmax_cross_entropy")
def _sce_np(xs: tuple, a: dict) -> np.ndarray:
    x, labels = _as_rows(*xs)
    return -np.mean(_log_softmax_np(x)[_rows(len(labels)), labels]).astype(x.dtype)


numpy_kernel("cross_entropy")(lambda xs, a: -np.mean(np.log(xs[0][_rows(len(xs[1])), xs[1]])).astype(xs[0].dtype))
numpy_kernel("mse")(lambda xs, a: np.mean(np.square(xs[0] - xs[1])).astype(xs[0].dtype))
numpy_kernel("argmax")(lambda xs, a: np.argmax(xs[0], axis=1).astype(np.int64))
numpy_kernel("accuracy")(lambda xs, a: np.mean(np.argmax(xs[0], axis=1) == xs[1]).astype(xs[0].dtype))
numpy_kernel("softmax_backward")(lambda xs, a: xs[0] * (xs[1] - np.sum(xs[1] * xs[0], axis=1, keepdims=True)))
numpy_kernel("log_softmax_backward")(lambda xs, a: xs[1] - np.exp(xs[0]) * np.sum(xs[1], axis=1, keepdims=True))


# cuDNN's softmax (accurate, over the channels of [rows, k, 1, 1]) and its backward (ir/vendor.py)
vendor_rule("softmax")(lambda types, out, a: Softmax(*out.shape, log=False))
vendor_rule("log_softmax")(lambda types, out, a: Softmax(*out.shape, log=True))
vendor_rule("softmax_backward")(lambda types, out, a: SoftmaxBackward(Softmax(*out.shape, log=False)))
vendor_rule("log_softmax_backward")(lambda types, out, a: SoftmaxBackward(Softmax(*out.shape, log=True)))


@numpy_kernel("softmax_cross_entropy_backward")
def _sce_backward_np(xs: tuple, a: dict) -> np.ndarray:
    x, labels = _as_rows(xs[0], xs[1])
    g = xs[2]
    d = _softmax_np(x)
    d[_rows(len(labels)), labels] -= 1
    return (d * (g / len(labels))).reshape(xs[0].shape)


@numpy_kernel("cross_entropy_backward")
def _ce_backward_np(xs: tuple, a: dict) -> np.ndarray:
    p, labels, g = xs
    d = np.zeros_like(p)
    rows = _rows(len(labels))
    d[rows, labels] = -g / (p[rows, labels] * len(labels))
    return d


numpy_kernel("mse_backward")(lambda xs, a: (xs[0] - xs[1]) * (2 * xs[2] / xs[0].size))


# ---- costs and gradients ----


@flops_rule("softmax", "log_softmax", "softmax_backward", "log_softmax_backward", "softmax_cross_entropy",
            "softmax_cross_entropy_backward", "cross_entropy", "cross_entropy_backward", "mse", "mse_backward",
            "argmax", "accuracy")  # fmt: skip
def _flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    return 5 * types[0].numel


@vjp_rule("softmax", "log_softmax")
def _softmax_vjp(b: Any, s: Any, g: Any) -> tuple:
    return (_e(b, s, f"{s.op}_backward", s.out, g),)


@vjp_rule("softmax_cross_entropy", "cross_entropy")
def _class_loss_vjp(b: Any, s: Any, g: Any) -> tuple:
    x, labels = s.inputs
    return (_e(b, s, f"{s.op}_backward", x, labels, g), None)


@vjp_rule("mse")
def _mse_vjp(b: Any, s: Any, g: Any) -> tuple:
    x, t = s.inputs
    gx = _e(b, s, "mse_backward", x, t, g)
    return (gx, _e(b, s, "neg", gx))


@index_form("mse_backward")
def _mse_backward_form(types: tuple[TensorType, ...], out: TensorType, a: dict) -> Any:
    x, t, g = (read(k, ty, out) for k, ty in enumerate(types))
    return ap("*", ap("-", x, t), ap("/", ap("*", c(2), g), c(out.numel)))


# what eager autograd keeps: the log-probabilities and the labels (cross_entropy = log_softmax + nll_loss)
eager_saves("softmax_cross_entropy", which=(1,), extra=lambda types, out, a: types[0].nbytes)
eager_saves("softmax", "log_softmax", which=("out",))
eager_saves("cross_entropy", "mse", which=(0, 1))


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
java_call("softmax", "Buf x", cls="CpuLosses")
java_call("log_softmax", "Buf x", cls="CpuLosses")
java_call("softmax_backward", "Buf y, Buf g", cls="CpuLosses")
java_call("log_softmax_backward", "Buf y, Buf g", cls="CpuLosses")
java_call("softmax_cross_entropy", "Buf x, Buf labels", cls="CpuLosses")
java_call("softmax_cross_entropy_backward", "Buf x, Buf labels, Buf g", cls="CpuLosses")
java_call("cross_entropy", "Buf p, Buf labels", cls="CpuLosses")
java_call("cross_entropy_backward", "Buf p, Buf labels, Buf g", cls="CpuLosses")
java_call("mse", "Buf a, Buf b", cls="CpuLosses")
java_call("argmax", "Buf x", cls="CpuLosses")
java_call("accuracy", "Buf x, Buf labels", cls="CpuLosses")


# ---- attention's softmax: the scale and a causal mask folded in (made by passes/fuse_softmax.py) ----


@defop("masked_softmax", 1, differentiable=False, cheap_to_recompute=True)  # a few passes over each row
def masked_softmax(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """softmax over each row of x [R, T] of scale * x, where with causal the elements j > r mod period are -inf
    (row r is query r mod period of its head: the mask j <= i of attention, never stored). attrs: scale, causal,
    period. Made after autodiff by passes/fuse_softmax.py from softmax(mask(scale * x)), so it needs no gradient."""
    (x,) = types
    need_float(x, "masked_softmax")
    need_rank(x, (2,), "masked_softmax", " ([rows, keys])")
    if attrs["period"] < 1 or x.shape[0] % attrs["period"]:
        raise ShapeError(f"masked_softmax: period {attrs['period']} does not divide the rows of {x}")
    return x


@numpy_kernel("masked_softmax")
def _masked_softmax_np(xs: tuple, a: dict) -> np.ndarray:
    (x,) = xs
    z = x * x.dtype.type(a["scale"])
    if a["causal"]:
        query = np.arange(x.shape[0])[:, None] % a["period"]
        z = np.where(np.arange(x.shape[1])[None, :] > query, x.dtype.type(-np.inf), z)
    return _softmax_np(z)


flops_rule("masked_softmax")(lambda types, out, a: 6 * types[0].numel)
java_call("masked_softmax", "Buf x, float scale, boolean causal, int period", cls="CpuAttention")
