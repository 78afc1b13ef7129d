"""2-D convolution (cross-correlation, NCHW), weight [out, in/groups, kh, kw], and its two gradients.

Each of the three ops may carry `dilation` (dh, dw), the gap between the kernel's taps (PyTorch's and cuDNN's
dilation); a statement without it has none, (1, 1), so the many convolutions without dilation print and compile as
before. A dilated kernel of kh taps spans (kh - 1) * dh + 1 input rows.

The NumPy kernels lower each convolution to one batched matrix product per group over an im2col
matrix (a strided window view of the zero-padded input, copied once); the data gradient scatters its
columns back with one strided accumulation per kernel offset (col2im).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from deepdsl.ir.registry import (
    defop,
    eager_saves,
    flops_rule,
    java_call,
    numpy_kernel,
    numpy_workspace_kernel,
    storage,
    vendor_rule,
    vjp_rule,
    workspace_rule,
)
from deepdsl.ir.types import ShapeError, TensorType
from deepdsl.ir.vendor import ConvBackwardData, ConvBackwardFilter, ConvForward
from deepdsl.ops._helpers import emit_like as _e
from deepdsl.ops._helpers import need_float, need_rank, window_out


def dilation(a: dict) -> tuple[int, int]:
    """The dilation (dh, dw) of a convolution statement's attributes: (1, 1) where it carries none."""
    dh, dw = a.get("dilation", (1, 1))
    return int(dh), int(dw)


def conv_attrs(a: dict) -> dict[str, Any]:
    """The attributes that describe the convolution itself (stride, pad, groups and any dilation), which its
    gradients carry over."""
    out = {"stride": a["stride"], "pad": a["pad"], "groups": a["groups"]}
    if "dilation" in a:
        out["dilation"] = a["dilation"]
    return out


def _spans(kh: int, kw: int, a: dict) -> tuple[int, int]:
    """The input rows and columns a (dilated) kernel window covers."""
    dh, dw = dilation(a)
    return (kh - 1) * dh + 1, (kw - 1) * dw + 1


def _out_hw(h: int, w: int, kh: int, kw: int, a: dict) -> tuple[int, int]:
    eh, ew = _spans(kh, kw, a)
    (sh, sw), (ph, pw) = a["stride"], a["pad"]
    return window_out(h, eh, sh, ph, "conv"), window_out(w, ew, sw, pw, "conv")


@defop("conv2d", 2, accepts_epilogue=True)
def conv2d(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """attrs: stride (sh, sw), pad (ph, pw), groups, and optionally dilation (dh, dw)."""
    x, w = types
    need_float(x, "conv")
    need_rank(x, (4,), "conv", " ([N, C, H, W])")
    g = attrs["groups"]
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    if c % g or f % g:
        raise ShapeError(f"conv: groups={g} must divide both the input channels ({c}) and the output channels ({f})")
    if cg * g != c:
        raise ShapeError(f"conv: weight {w} expects {cg * g} input channels, the input {x} has {c}")
    if min(dilation(attrs)) < 1:
        raise ShapeError(f"conv: dilation {dilation(attrs)} must be at least 1")
    return TensorType((n, f, *_out_hw(h, wd, kh, kw, attrs)))


@defop("conv2d_backward_data", 2, accepts_epilogue=True)
def conv2d_backward_data(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d conv2d / d x: inputs g (d out), w; attrs stride, pad, groups and in_shape (the shape of x). It is also the
    transposed convolution of g by w (`conv_transpose`, PyTorch's conv_transpose2d), so it is differentiable."""
    g, w = types
    x = TensorType(tuple(attrs["in_shape"]))
    if conv2d((x, w), attrs).shape != g.shape:
        raise ShapeError(f"conv2d_backward_data: gradient {g} does not fit input {x} and weight {w}")
    return x


@defop("conv2d_backward_filter", 2, differentiable=False, accepts_epilogue=True)
def conv2d_backward_filter(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    """d conv2d / d w: inputs x, g (d out); attrs stride, pad, groups and w_shape (the shape of w)."""
    x, g = types
    w = TensorType(tuple(attrs["w_shape"]))
    if conv2d((x, w), attrs).shape != g.shape:
        raise ShapeError(f"conv2d_backward_filter: gradient {g} does not fit input {x} and weight {w}")
    return w


# ---- NumPy kernels ----


def _padded(x: np.ndarray, ph: int, pw: int) -> np.ndarray:
    if not (ph or pw):
        return x
    n, c, h, w = x.shape
    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    out[:, :, ph : ph + h, pw : pw + w] = x
    return out


def _cols(x: np.ndarray, kh: int, kw: int, a: dict) -> np.ndarray:
    """im2col, channel-major: [groups, C/groups*kh*kw, N*OH*OW], rows in (c, i, j) order, columns in (n, oh, ow);
    a dilated window's taps only."""
    (sh, sw), (ph, pw), groups = a["stride"], a["pad"], a["groups"]
    (dh, dw), c = dilation(a), x.shape[1]
    win = sliding_window_view(_padded(x, ph, pw), _spans(kh, kw, a), axis=(2, 3))[:, :, ::sh, ::sw, ::dh, ::dw]
    return np.ascontiguousarray(win.transpose(1, 4, 5, 0, 2, 3)).reshape(groups, c // groups * kh * kw, -1)


def _grad_cols(g: np.ndarray, groups: int) -> np.ndarray:
    """d out [N, F, OH, OW] as [groups, F/groups, N*OH*OW], the layout of the im2col product."""
    n, f = g.shape[:2]
    return np.ascontiguousarray(g.transpose(1, 0, 2, 3)).reshape(groups, f // groups, -1)


@numpy_kernel("conv2d")
def _conv2d_np(xs: tuple, a: dict) -> np.ndarray:
    x, w = xs
    groups = a["groups"]
    f, cg, kh, kw = w.shape
    oh, ow = _out_hw(x.shape[2], x.shape[3], kh, kw, a)
    y = np.matmul(w.reshape(groups, f // groups, cg * kh * kw), _cols(x, kh, kw, a))  # G, F/G, N*OH*OW
    return np.ascontiguousarray(y.reshape(f, x.shape[0], oh, ow).transpose(1, 0, 2, 3))


@numpy_kernel("conv2d_backward_filter")
def _conv2d_backward_filter_np(xs: tuple, a: dict) -> np.ndarray:
    x, g = xs
    f, cg, kh, kw = a["w_shape"]
    dw = np.matmul(_grad_cols(g, a["groups"]), _cols(x, kh, kw, a).transpose(0, 2, 1))  # G, F/G, C/G*kh*kw
    return dw.reshape(f, cg, kh, kw)


@numpy_kernel("conv2d_backward_data")
def _conv2d_backward_data_np(xs: tuple, a: dict) -> np.ndarray:
    g, w = xs
    n, c, h, wd = a["in_shape"]
    (sh, sw), (ph, pw), groups = a["stride"], a["pad"], a["groups"]
    f, cg, kh, kw = w.shape
    oh, ow = g.shape[2:]
    # the columns of d x with the batch innermost, [groups, C/G*kh*kw, OH*OW*N] = [C, kh, kw, OH, OW, N], so
    # that each kernel offset's block below is long contiguous runs (OW*N elements at stride 1)
    wt = w.reshape(groups, f // groups, cg * kh * kw).transpose(0, 2, 1)
    gt = np.ascontiguousarray(g.transpose(1, 2, 3, 0)).reshape(groups, f // groups, -1)
    dcols = np.matmul(wt, gt).reshape(c, kh, kw, oh, ow, n)
    # col2im: add each offset's columns onto its strided block of the padded input
    # (a dilated tap (i, j) reads row i * dh, column j * dw of its window; the rows of an output padding, past the
    # last window, get nothing)
    dh, dw = dilation(a)
    dxp = np.zeros((c, h + 2 * ph, wd + 2 * pw, n), dtype=g.dtype)
    for i in range(kh):
        for j in range(kw):
            r, q = i * dh, j * dw
            dxp[:, r : r + sh * (oh - 1) + 1 : sh, q : q + sw * (ow - 1) + 1 : sw] += dcols[:, i, j]
    return np.ascontiguousarray(dxp[:, ph : ph + h, pw : pw + wd].transpose(3, 0, 1, 2))


# ---- workspace: the im2col matrix of one image, [C*kh*kw, OH*OW], for the kernels that go image by image ----


def _geometry(types: tuple[TensorType, ...], out: TensorType, a: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x shape, w shape) of any of the three convolution ops."""
    if "w_shape" in a:
        return types[0].shape, tuple(a["w_shape"])
    if "in_shape" in a:
        return tuple(a["in_shape"]), types[1].shape
    return types[0].shape, types[1].shape


def _conv_fact(x: tuple[int, ...], w: tuple[int, ...], y: tuple[int, ...], a: dict) -> ConvForward:
    """The convolution of input shape `x` by weight shape `w` into output shape `y`, as cuDNN describes it."""
    (n, c, h, wd), (f, _, kh, kw) = x, w
    (sh, sw), (ph, pw) = a["stride"], a["pad"]
    return ConvForward(n, c, h, wd, f, kh, kw, y[2], y[3], (sh, sw), (ph, pw), a["groups"], dilation(a))


# cuDNN's three convolution calls, each in the plan's workspace for its statement
vendor_rule("conv2d")(lambda types, out, a: _conv_fact(types[0].shape, types[1].shape, out.shape, a))
vendor_rule("conv2d_backward_data")(
    lambda types, out, a: ConvBackwardData(_conv_fact(out.shape, types[1].shape, types[0].shape, a))
)
vendor_rule("conv2d_backward_filter")(
    lambda types, out, a: ConvBackwardFilter(_conv_fact(types[0].shape, out.shape, types[1].shape, a))
)


# the own CUDA convolutions' block tile (library.cu dd_tiled: DD_BM rows, DD_BN columns, DD_BK a step), and how the
# filter gradient splits its reduction over N*OH*OW: into enough slices that the grid fills a GPU (4 blocks for each
# of an H100's or H200's 132 SMs), each slice at least SPLIT_MIN long; its partial sums are the statement's workspace
OWN_TILE = (64, 128, 8)
SPLIT_BLOCKS = 528
SPLIT_MIN = 256


def filter_gradient_splits(filters: int, cols: int, groups: int, reduction: int) -> int:
    """The slices the own CUDA filter gradient splits its reduction (N*OH*OW, `reduction`) into, for `filters`
    filters per group, `cols` = C/groups*KH*KW weights per filter and `groups` groups (the Java CUDA device's
    CudaMemory.splits is the same)."""
    rows, columns, _ = OWN_TILE
    tiles = -(-filters // rows) * -(-cols // columns) * groups
    return max(1, min(-(-SPLIT_BLOCKS // tiles), reduction // SPLIT_MIN))


def filter_gradient_scratch(x: tuple[int, ...], w: tuple[int, ...], oh: int, ow: int, groups: int) -> int:
    """The bytes of the own CUDA filter gradient's partial sums (S slices of dW; 0 where it does not split)."""
    f, cg, kh, kw = w
    splits = filter_gradient_splits(f // groups, cg * kh * kw, groups, x[0] * oh * ow)
    return splits * f * cg * kh * kw * 4 if splits > 1 else 0


def _im2col_bytes(c: int, kh: int, kw: int, oh: int, ow: int, a: dict) -> int:
    if (kh, kw) == (1, 1) and tuple(a["stride"]) == (1, 1) and tuple(a["pad"]) == (0, 0):
        return 0  # the input is its own im2col matrix
    return c * kh * kw * oh * ow * 4


@workspace_rule("conv2d", "conv2d_backward_data", "conv2d_backward_filter")
def _conv_workspace(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    """One image's im2col matrix (the NumPy kernels', within which cuDNN picks its algorithm); for the filter gradient
    at least the own CUDA kernel's partial sums."""
    x, w = _geometry(types, out, a)
    (_, c, h, wd), (_, _, kh, kw) = x, w
    oh, ow = _out_hw(h, wd, kh, kw, a)
    need = _im2col_bytes(c, kh, kw, oh, ow, a)
    if "w_shape" in a:
        need = max(need, filter_gradient_scratch(x, w, oh, ow, a["groups"]))
    return need


def _image_cols(ws: np.ndarray, x1: np.ndarray, kh: int, kw: int, a: dict) -> np.ndarray:
    """The im2col matrix of one image [1, C, H, W], written into the workspace: [groups, C/groups*kh*kw, OH*OW]."""
    cols = _cols(x1, kh, kw, a)
    view = np.ndarray(cols.shape, dtype=x1.dtype, buffer=ws)
    np.copyto(view, cols)
    return view


@numpy_workspace_kernel("conv2d")
def _conv2d_ws(xs: tuple, a: dict, ws: np.ndarray) -> np.ndarray:
    x, w = xs
    groups = a["groups"]
    f, cg, kh, kw = w.shape
    oh, ow = _out_hw(x.shape[2], x.shape[3], kh, kw, a)
    wr = w.reshape(groups, f // groups, cg * kh * kw)
    y = np.empty((x.shape[0], f, oh, ow), dtype=x.dtype)
    for n in range(x.shape[0]):
        y[n] = np.matmul(wr, _image_cols(ws, x[n : n + 1], kh, kw, a)).reshape(f, oh, ow)
    return y


@numpy_workspace_kernel("conv2d_backward_filter")
def _conv2d_backward_filter_ws(xs: tuple, a: dict, ws: np.ndarray) -> np.ndarray:
    x, g = xs
    f, cg, kh, kw = a["w_shape"]
    if _im2col_bytes(x.shape[1], kh, kw, g.shape[2], g.shape[3], a) == 0:  # the workspace is the CUDA kernel's alone
        return _conv2d_backward_filter_np(xs, a)
    dw = np.zeros((a["groups"], f // a["groups"], cg * kh * kw), dtype=x.dtype)
    for n in range(x.shape[0]):
        cols = _image_cols(ws, x[n : n + 1], kh, kw, a)
        dw += np.matmul(_grad_cols(g[n : n + 1], a["groups"]), cols.transpose(0, 2, 1))
    return dw.reshape(f, cg, kh, kw)


@numpy_workspace_kernel("conv2d_backward_data")
def _conv2d_backward_data_ws(xs: tuple, a: dict, ws: np.ndarray) -> np.ndarray:
    g, w = xs
    n, c, h, wd = a["in_shape"]
    (sh, sw), (ph, pw), groups = a["stride"], a["pad"], a["groups"]
    f, cg, kh, kw = w.shape
    oh, ow = g.shape[2:]
    dh, dw = dilation(a)
    wt = w.reshape(groups, f // groups, cg * kh * kw).transpose(0, 2, 1)
    dx = np.empty((n, c, h, wd), dtype=g.dtype)
    dcols = np.ndarray((groups, cg * kh * kw, oh * ow), dtype=g.dtype, buffer=ws)
    for i in range(n):
        np.matmul(wt, g[i].reshape(groups, f // groups, oh * ow), out=dcols)
        d = dcols.reshape(c, kh, kw, oh, ow)
        dxp = np.zeros((c, h + 2 * ph, wd + 2 * pw), dtype=g.dtype)
        for p in range(kh):
            for q in range(kw):
                r, t = p * dh, q * dw
                dxp[:, r : r + sh * (oh - 1) + 1 : sh, t : t + sw * (ow - 1) + 1 : sw] += d[:, p, q]
        dx[i] = dxp[:, ph : ph + h, pw : pw + wd]
    return dx


@flops_rule("conv2d", "conv2d_backward_data", "conv2d_backward_filter")
def _conv_flops(types: tuple[TensorType, ...], out: TensorType, a: dict) -> int:
    # one multiply-add per (output element, weight element in its group), the same for all three
    if "w_shape" in a:
        _, g = types
        w_shape = tuple(a["w_shape"])
    elif "in_shape" in a:
        g, w = types
        w_shape = w.shape
    else:
        g, w_shape = out, types[1].shape
    _, cg, kh, kw = w_shape
    return 2 * g.numel * cg * kh * kw


@vjp_rule("conv2d")
def _conv2d_vjp(b: Any, s: Any, g: Any) -> tuple:
    x, w = s.inputs
    conv = conv_attrs(s.a)
    gx = _e(b, s, "conv2d_backward_data", g, w, in_shape=x.type.shape, **conv)
    gw = _e(b, s, "conv2d_backward_filter", x, g, w_shape=w.type.shape, **conv)
    return (gx, gw)


@vjp_rule("conv2d_backward_data")
def _conv2d_backward_data_vjp(b: Any, s: Any, g: Any) -> tuple:
    # y = A(w)^T x, with A(w) z = conv2d(z, w): so d x = A(w) g = conv2d(g, w), and since <g, A(w)^T x> =
    # <A(w) g, x>, d w is the filter gradient of a convolution of g whose output gradient is x
    x, w = s.inputs
    conv = conv_attrs(s.a)
    gx = _e(b, s, "conv2d", g, w, **conv)
    gw = _e(b, s, "conv2d_backward_filter", g, x, w_shape=w.type.shape, **conv)
    return (gx, gw)


# what eager autograd keeps: the input and the weight (DESIGN §5, the eager baseline)
eager_saves("conv2d", "conv2d_backward_data", which=(0, 1))


# the Java runtime's method for each op (deepdsl/runtime): its parameters after the output
# (a statement without dilation passes dilation(1, 1): backends/java/calls.py's DEFAULTS)
java_call("conv2d", "Buf x, Buf w, int groups, int[] pad, int[] stride, int[] dilation, long limit", cls="Workspace")
java_call(
    "conv2d_backward_data",
    "Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride, int[] dilation",
    cls="CpuConvolution",
)
# the CUDA device's own filter gradient splits its reduction within the statement's planned workspace (its partial
# sums in the arena, as the PyCUDA runner's), which the step passes it
java_call(
    "conv2d_backward_filter",
    "Buf x, Buf g, int groups, int[] pad, int[] stride, int[] dilation, int[] wShape",
    cls="CpuConvolution",
    workspace=True,
)

# --precision bf16: operands and result in bf16, products accumulated in fp32 (cuDNN's bf16 convolutions)
storage("bf16", "conv2d", "conv2d_backward_data", "conv2d_backward_filter")
