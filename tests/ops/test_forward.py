"""The NumPy kernels of the windowed ops (conv, pools, lrn) and their backward ops against naive loops.

Each reference below is written from the op's definition with plain Python loops over small shapes,
sharing no code with the kernels. float64 results must agree to 1e-10, float32 ones to 1e-5 relative.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import deepdsl.ops  # noqa: F401
from deepdsl.ir import REGISTRY, TensorType
from deepdsl.ir.registry import lookup
from deepdsl.ir.types import ShapeError

RNG = np.random.default_rng(7)
TOL = {np.float64: 1e-10, np.float32: 1e-5}


def run_op(op: str, inputs: list[np.ndarray], attrs: dict) -> np.ndarray:
    """The op's kernel on `inputs`, checked against its shape rule and for keeping the float dtype."""
    entry = lookup(op)
    out = np.asarray(entry.numpy(tuple(inputs), attrs))
    want = entry.shape(tuple(TensorType(x.shape) for x in inputs), attrs)
    assert out.shape == want.shape, f"{op}: kernel gave {out.shape}, the shape rule {want.shape}"
    assert out.dtype == inputs[0].dtype, f"{op}: {inputs[0].dtype} in, {out.dtype} out"
    return out


def close(got: np.ndarray, want: np.ndarray, dtype: type = np.float64) -> None:
    tol = TOL[dtype]
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def window_out(size: int, k: int, s: int, p: int) -> int:
    return (size + 2 * p - k) // s + 1


# ---- naive references ----


def naive_conv(x: np.ndarray, w: np.ndarray, stride: tuple, pad: tuple, groups: int) -> np.ndarray:
    n_, c_, h_, w_ = x.shape
    f_, cg, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, pad
    oh_, ow_ = window_out(h_, kh, sh, ph), window_out(w_, kw, sw, pw)
    xl, wl = x.tolist(), w.tolist()
    y = np.zeros((n_, f_, oh_, ow_))
    per_group = f_ // groups
    for n, f, oh, ow in itertools.product(range(n_), range(f_), range(oh_), range(ow_)):
        g = f // per_group
        acc = 0.0
        for c in range(cg):
            for i in range(kh):
                for j in range(kw):
                    h, v = oh * sh - ph + i, ow * sw - pw + j
                    if 0 <= h < h_ and 0 <= v < w_:
                        acc += xl[n][g * cg + c][h][v] * wl[f][c][i][j]
        y[n, f, oh, ow] = acc
    return y


def naive_conv_backward(x: np.ndarray, w: np.ndarray, gy: np.ndarray, stride: tuple, pad: tuple, groups: int):  # noqa: ANN201
    """(dx, dw) of sum(conv(x, w) * gy), by scattering each output's gradient over its window."""
    n_, c_, h_, w_ = x.shape
    f_, cg, kh, kw = w.shape
    (sh, sw), (ph, pw) = stride, pad
    dx, dw = np.zeros(x.shape), np.zeros(w.shape)
    per_group = f_ // groups
    for n, f, oh, ow in itertools.product(*(range(d) for d in gy.shape)):
        g = f // per_group
        for c, i, j in itertools.product(range(cg), range(kh), range(kw)):
            h, v = oh * sh - ph + i, ow * sw - pw + j
            if 0 <= h < h_ and 0 <= v < w_:
                dx[n, g * cg + c, h, v] += gy[n, f, oh, ow] * w[f, c, i, j]
                dw[f, c, i, j] += gy[n, f, oh, ow] * x[n, g * cg + c, h, v]
    return dx, dw


def pool_windows(x: np.ndarray, kernel: tuple, stride: tuple, pad: tuple):  # noqa: ANN201
    """Yield (n, c, oh, ow, positions): the in-bounds (h, w) of each window in row-major order, and how
    many window slots fall on padding."""
    n_, c_, h_, w_ = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    for n, c, oh, ow in itertools.product(
        range(n_), range(c_), range(window_out(h_, kh, sh, ph)), range(window_out(w_, kw, sw, pw))
    ):
        positions = []
        for i in range(kh):
            for j in range(kw):
                h, v = oh * sh - ph + i, ow * sw - pw + j
                if 0 <= h < h_ and 0 <= v < w_:
                    positions.append((h, v))
        yield n, c, oh, ow, positions


def pool_out_shape(x: np.ndarray, kernel: tuple, stride: tuple, pad: tuple) -> tuple:
    return (*x.shape[:2], window_out(x.shape[2], kernel[0], stride[0], pad[0]),
            window_out(x.shape[3], kernel[1], stride[1], pad[1]))  # fmt: skip


def naive_max_pool(x: np.ndarray, kernel: tuple, stride: tuple, pad: tuple, gy: np.ndarray | None = None):  # noqa: ANN201
    """(y, dx): the window maxima, and gy routed to the first maximum of each window (row-major)."""
    y = np.zeros(pool_out_shape(x, kernel, stride, pad))
    dx = np.zeros(x.shape)
    for n, c, oh, ow, positions in pool_windows(x, kernel, stride, pad):
        best = None
        for h, v in positions:
            if best is None or x[n, c, h, v] > x[n, c, best[0], best[1]]:
                best = (h, v)
        y[n, c, oh, ow] = x[n, c, best[0], best[1]]
        if gy is not None:
            dx[n, c, best[0], best[1]] += gy[n, c, oh, ow]
    return y, dx


def naive_avg_pool(x: np.ndarray, kernel: tuple, stride: tuple, pad: tuple, gy: np.ndarray | None = None):  # noqa: ANN201
    """(y, dx): window sums over the full window size (padding counts), and gy spread evenly back."""
    y = np.zeros(pool_out_shape(x, kernel, stride, pad))
    dx = np.zeros(x.shape)
    size = kernel[0] * kernel[1]
    for n, c, oh, ow, positions in pool_windows(x, kernel, stride, pad):
        y[n, c, oh, ow] = sum(x[n, c, h, v] for h, v in positions) / size
        if gy is not None:
            for h, v in positions:
                dx[n, c, h, v] += gy[n, c, oh, ow] / size
    return y, dx


def lrn_window(c: int, channels: int, size: int) -> list[int]:
    """PyTorch's LocalResponseNorm window: channels c - size//2 .. c + (size-1)//2 that exist."""
    return [j for j in range(c - size // 2, c + (size - 1) // 2 + 1) if 0 <= j < channels]


def naive_lrn(x: np.ndarray, size: int, alpha: float, beta: float, k: float, gy: np.ndarray | None = None):  # noqa: ANN201
    """(y, dx): dx from the Jacobian dy_c/dx_j written out element by element."""
    n_, c_, h_, w_ = x.shape
    y, dx = np.zeros(x.shape), np.zeros(x.shape)
    for n, h, v in itertools.product(range(n_), range(h_), range(w_)):
        col = [float(x[n, c, h, v]) for c in range(c_)]
        d = [k + alpha / size * sum(col[j] ** 2 for j in lrn_window(c, c_, size)) for c in range(c_)]
        for c in range(c_):
            y[n, c, h, v] = col[c] / d[c] ** beta
        if gy is None:
            continue
        for c in range(c_):  # y_c = x_c d_c^-beta, d_c depends on x_j for j in window(c)
            for j in range(c_):
                jac = d[c] ** -beta if j == c else 0.0
                if j in lrn_window(c, c_, size):
                    jac += col[c] * -beta * d[c] ** (-beta - 1) * alpha / size * 2 * col[j]
                dx[n, j, h, v] += gy[n, c, h, v] * jac
    return y, dx


# ---- conv2d ----

CONV_CASES = [  # x shape, weight shape, stride, pad, groups
    ((2, 3, 6, 6), (4, 3, 3, 3), (1, 1), (0, 0), 1),
    ((2, 3, 7, 6), (4, 3, 3, 3), (2, 2), (1, 1), 1),
    ((1, 2, 7, 5), (3, 2, 3, 2), (2, 1), (1, 0), 1),
    ((2, 4, 6, 7), (6, 2, 3, 3), (1, 1), (1, 1), 2),
    ((2, 4, 8, 8), (4, 1, 3, 3), (2, 2), (1, 1), 4),  # depthwise
    ((1, 3, 5, 5), (6, 1, 3, 3), (1, 2), (0, 1), 3),  # depthwise, channel multiplier 2
    ((2, 3, 5, 5), (2, 3, 1, 1), (1, 1), (0, 0), 1),  # 1x1
    ((1, 2, 4, 4), (2, 2, 4, 4), (1, 1), (0, 0), 1),  # the window covers the whole input
    ((1, 2, 9, 8), (2, 1, 3, 2), (3, 2), (2, 1), 2),  # stride leaves rows unread
]


def conv_attrs(stride: tuple, pad: tuple, groups: int) -> dict:
    return {"stride": stride, "pad": pad, "groups": groups}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", CONV_CASES, ids=[f"conv{i}" for i in range(len(CONV_CASES))])
def test_conv2d_and_its_gradients_match_naive_loops(case: tuple, dtype: type) -> None:
    xs, ws, stride, pad, groups = case
    x, w = RNG.standard_normal(xs), RNG.standard_normal(ws)
    a = conv_attrs(stride, pad, groups)
    want = naive_conv(x, w, stride, pad, groups)
    y = run_op("conv2d", [x.astype(dtype), w.astype(dtype)], a)
    close(y, want, dtype)
    gy = RNG.standard_normal(want.shape)
    dx_want, dw_want = naive_conv_backward(x, w, gy, stride, pad, groups)
    dx = run_op("conv2d_backward_data", [gy.astype(dtype), w.astype(dtype)], {**a, "in_shape": xs})
    dw = run_op("conv2d_backward_filter", [x.astype(dtype), gy.astype(dtype)], {**a, "w_shape": ws})
    close(dx, dx_want, dtype)
    close(dw, dw_want, dtype)


def test_conv2d_backward_ops_are_the_adjoints_of_conv2d() -> None:
    # <conv(x, w), g> = <x, backward_data(g, w)> = <w, backward_filter(x, g)>
    for xs, ws, stride, pad, groups in CONV_CASES:
        a = conv_attrs(stride, pad, groups)
        x, w = RNG.standard_normal(xs), RNG.standard_normal(ws)
        y = run_op("conv2d", [x, w], a)
        g = RNG.standard_normal(y.shape)
        inner = np.sum(y * g)
        dx = run_op("conv2d_backward_data", [g, w], {**a, "in_shape": xs})
        dw = run_op("conv2d_backward_filter", [x, g], {**a, "w_shape": ws})
        assert np.sum(x * dx) == pytest.approx(inner, rel=1e-10, abs=1e-10)
        assert np.sum(w * dw) == pytest.approx(inner, rel=1e-10, abs=1e-10)


def test_conv2d_flops_count_a_multiply_add_per_weight_use() -> None:
    x, w = TensorType((2, 4, 8, 8)), TensorType((6, 2, 3, 3))
    a = conv_attrs((2, 2), (1, 1), 2)
    y = lookup("conv2d").shape((x, w), a)
    assert y.shape == (2, 6, 4, 4)
    want = 2 * y.numel * 2 * 3 * 3
    assert lookup("conv2d").flops((x, w), y, a) == want
    assert lookup("conv2d_backward_data").flops((y, w), x, {**a, "in_shape": x.shape}) == want
    assert lookup("conv2d_backward_filter").flops((x, y), w, {**a, "w_shape": w.shape}) == want


def test_conv2d_backward_shape_rules_check_their_inputs() -> None:
    a = conv_attrs((1, 1), (0, 0), 1)
    w, g = TensorType((4, 3, 3, 3)), TensorType((2, 4, 4, 4))
    assert lookup("conv2d_backward_data").shape((g, w), {**a, "in_shape": (2, 3, 6, 6)}).shape == (2, 3, 6, 6)
    assert lookup("conv2d_backward_filter").shape((TensorType((2, 3, 6, 6)), g), {**a, "w_shape": w.shape}).shape == (
        4, 3, 3, 3,
    )  # fmt: skip
    with pytest.raises(ShapeError, match="does not fit"):
        lookup("conv2d_backward_data").shape((g, w), {**a, "in_shape": (2, 3, 7, 7)})
    with pytest.raises(ShapeError, match="does not fit"):
        lookup("conv2d_backward_filter").shape((TensorType((2, 3, 6, 6)), g), {**a, "w_shape": (5, 3, 3, 3)})


# ---- pooling ----

POOL_CASES = [  # x shape, kernel, stride, pad
    ((2, 3, 6, 6), (2, 2), (2, 2), (0, 0)),
    ((2, 2, 7, 7), (3, 3), (2, 2), (0, 0)),  # overlapping windows
    ((1, 2, 7, 6), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 5, 6), (3, 2), (1, 2), (1, 0)),
    ((2, 1, 6, 5), (2, 3), (2, 1), (0, 1)),
    ((1, 2, 5, 5), (3, 3), (1, 1), (1, 1)),  # every element in up to nine windows
    ((1, 1, 7, 7), (2, 2), (3, 3), (0, 0)),  # gaps between windows
]


def pool_attrs(kernel: tuple, stride: tuple, pad: tuple) -> dict:
    return {"kernel": kernel, "stride": stride, "pad": pad}


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", POOL_CASES, ids=[f"pool{i}" for i in range(len(POOL_CASES))])
def test_max_pool_and_its_gradient_match_naive_loops(case: tuple, dtype: type) -> None:
    xs, kernel, stride, pad = case
    a = pool_attrs(kernel, stride, pad)
    x = RNG.standard_normal(xs).astype(dtype).astype(np.float64)  # the same values in either precision
    gy = RNG.standard_normal(pool_out_shape(x, kernel, stride, pad))
    y_want, dx_want = naive_max_pool(x, kernel, stride, pad, gy)
    y = run_op("max_pool2d", [x.astype(dtype)], a)
    close(y, y_want, dtype)
    dx = run_op("max_pool2d_backward", [x.astype(dtype), y, gy.astype(dtype)], a)
    close(dx, dx_want, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", POOL_CASES, ids=[f"pool{i}" for i in range(len(POOL_CASES))])
def test_avg_pool_and_its_gradient_match_naive_loops(case: tuple, dtype: type) -> None:
    xs, kernel, stride, pad = case
    a = pool_attrs(kernel, stride, pad)
    x = RNG.standard_normal(xs)
    gy = RNG.standard_normal(pool_out_shape(x, kernel, stride, pad))
    y_want, dx_want = naive_avg_pool(x, kernel, stride, pad, gy)
    close(run_op("avg_pool2d", [x.astype(dtype)], a), y_want, dtype)
    close(run_op("avg_pool2d_backward", [gy.astype(dtype)], {**a, "in_shape": xs}), dx_want, dtype)


def test_max_pool_gradient_goes_to_the_first_maximum_of_tied_windows() -> None:
    # small integers: many ties, overlapping windows (kernel 3, stride 2) and padding
    for xs, kernel, stride, pad in [*POOL_CASES, ((2, 2, 9, 9), (3, 3), (2, 2), (1, 1))]:
        a = pool_attrs(kernel, stride, pad)
        x = RNG.integers(-2, 2, size=xs).astype(np.float64)
        gy = RNG.standard_normal(pool_out_shape(x, kernel, stride, pad))
        y_want, dx_want = naive_max_pool(x, kernel, stride, pad, gy)
        y = run_op("max_pool2d", [x], a)
        close(y, y_want)
        close(run_op("max_pool2d_backward", [x, y, gy], a), dx_want)
    # all equal: each window's gradient lands on its top-left element
    x = np.ones((1, 1, 4, 4))
    dx = run_op(
        "max_pool2d_backward", [x, np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2))], pool_attrs((2, 2), (2, 2), (0, 0))
    )
    assert dx[0, 0].tolist() == [[1, 0, 1, 0], [0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]


def test_max_pool_padding_never_wins() -> None:
    a = pool_attrs((3, 3), (2, 2), (1, 1))
    for x in (np.full((1, 2, 5, 5), -1e30), np.full((1, 2, 5, 5), -np.inf)):
        y = run_op("max_pool2d", [x], a)
        assert np.array_equal(y, np.full(y.shape, x.flat[0]))
        gy = RNG.standard_normal(y.shape)
        dx = run_op("max_pool2d_backward", [x, y, gy], a)
        _, dx_want = naive_max_pool(x, (3, 3), (2, 2), (1, 1), gy)
        close(dx, dx_want)
        assert np.sum(dx) == pytest.approx(np.sum(gy))  # none lost to the padding


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_global_avg_pool_and_its_gradient(dtype: type) -> None:
    x = RNG.standard_normal((2, 3, 4, 5))
    want = np.zeros((2, 3, 1, 1))
    for n, c in itertools.product(range(2), range(3)):
        want[n, c, 0, 0] = sum(x[n, c, h, v] for h in range(4) for v in range(5)) / 20
    close(run_op("global_avg_pool", [x.astype(dtype)], {}), want, dtype)
    gy = RNG.standard_normal((2, 3, 1, 1))
    dx = run_op("global_avg_pool_backward", [gy.astype(dtype)], {"in_shape": x.shape})
    close(dx, np.broadcast_to(gy / 20, x.shape), dtype)


def test_pool_flops_and_backward_shape_rules() -> None:
    x = TensorType((2, 3, 7, 7))
    a = pool_attrs((3, 3), (2, 2), (0, 0))
    y = lookup("max_pool2d").shape((x,), a)
    assert y.shape == (2, 3, 3, 3)
    assert lookup("max_pool2d").flops((x,), y, a) == y.numel * 9
    assert lookup("avg_pool2d").flops((x,), y, a) == y.numel * 9
    assert lookup("max_pool2d_backward").shape((x, y, y), a) == x
    assert lookup("avg_pool2d_backward").shape((y,), {**a, "in_shape": x.shape}) == x
    assert lookup("global_avg_pool_backward").shape((TensorType((2, 3, 1, 1)),), {"in_shape": x.shape}) == x
    with pytest.raises(ShapeError, match="do not fit"):
        lookup("max_pool2d_backward").shape((x, x, x), a)
    with pytest.raises(ShapeError, match="does not fit"):
        lookup("avg_pool2d_backward").shape((y,), {**a, "in_shape": (2, 3, 9, 9)})


# ---- lrn ----

LRN_CASES = [  # x shape, size, alpha, beta, k
    ((2, 6, 3, 3), 3, 0.5, 0.75, 2.0),
    ((2, 7, 2, 3), 5, 0.8, 0.75, 1.0),
    ((1, 6, 2, 2), 4, 0.6, 0.6, 1.5),  # even: one more channel below than above
    ((1, 3, 2, 2), 5, 0.7, 0.75, 1.0),  # window wider than the channels
    ((1, 4, 2, 2), 1, 0.3, 1.0, 1.0),
    ((2, 8, 3, 3), 5, 1e-4, 0.75, 1.0),  # AlexNet's constants
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("case", LRN_CASES, ids=[f"lrn{c[1]}-{i}" for i, c in enumerate(LRN_CASES)])
def test_lrn_and_its_gradient_match_naive_loops(case: tuple, dtype: type) -> None:
    xs, size, alpha, beta, k = case
    a = {"size": size, "alpha": alpha, "beta": beta, "k": k}
    x = RNG.standard_normal(xs) * 1.5
    gy = RNG.standard_normal(xs)
    y_want, dx_want = naive_lrn(x, size, alpha, beta, k, gy)
    y = run_op("lrn", [x.astype(dtype)], a)
    close(y, y_want, dtype)
    close(run_op("lrn_backward", [x.astype(dtype), y, gy.astype(dtype)], a), dx_want, dtype)


def test_lrn_window_is_pytorchs() -> None:
    # size 4: channel c sums channels c-2 .. c+1, so a 3 at channel 0 (ones elsewhere) is in the windows of
    # channels 0, 1 and 2 only, and the top channels see fewer neighbours
    x = np.ones((1, 6, 1, 1))
    x[0, 0] = 3.0
    y = run_op("lrn", [x], {"size": 4, "alpha": 4.0, "beta": 1.0, "k": 1.0})  # d_c = 1 + sum of x^2
    sums = np.array([9 + 1, 9 + 1 + 1, 9 + 1 + 1 + 1, 4, 4, 3])
    close(y.reshape(-1), x.reshape(-1) / (1 + sums))


# ---- the registry ----


def test_every_op_has_a_kernel_a_cost_and_a_gradient() -> None:
    """A kernel and a cost unless lowered away before anything runs; a gradient unless the op carries none."""
    missing = []
    for name, entry in sorted(REGISTRY.items()):
        if entry.lower is not None:  # rewritten into other ops in both programs
            continue
        if entry.numpy is None:
            missing.append(f"{name}: no NumPy kernel")
        if entry.flops is None:
            missing.append(f"{name}: no flops rule")
        if entry.vjp is None and entry.differentiable and entry.arity != 0:
            missing.append(f"{name}: no vjp (or mark it differentiable=False)")
    assert not missing, "\n".join(missing)


def test_backward_ops_are_marked_not_differentiable() -> None:
    for name in ("conv2d_backward_filter", "max_pool2d_backward", "avg_pool2d_backward",
                 "global_avg_pool_backward", "lrn_backward"):  # fmt: skip
        assert not lookup(name).differentiable
        assert lookup(name).doc
    # conv2d_backward_data is also the transposed convolution (conv_transpose), a layer of its own: it has a vjp
    assert lookup("conv2d_backward_data").differentiable and lookup("conv2d_backward_data").vjp is not None
