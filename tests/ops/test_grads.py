"""Every differentiable op: its symbolic gradient against central finite differences in float64."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op_gradient
from oracle_inputs import away_from_kinks

from deepdsl.ir import REGISTRY

RNG = np.random.default_rng(42)
KINK_MARGIN = 1e-3  # the finite differences' step is 1e-6


def rand(*shape: int, positive: bool = False) -> np.ndarray:
    x = RNG.standard_normal(shape)
    return np.abs(x) + 0.5 if positive else x


def kinked(*shape: int) -> np.ndarray:
    """Both signs, with some values at the kink 0 (which the test moves to a little either side of it)."""
    x = rand(*shape)
    x.reshape(-1)[::3] = 0.0
    return x


def labels(n: int, k: int) -> np.ndarray:
    return RNG.integers(0, k, size=n).astype(np.int64)


CASES = {
    "add": ([rand(2, 3), rand(2, 3)], {}),
    "sub": ([rand(2, 3), rand(2, 3)], {}),
    "mul": ([rand(2, 3), rand(2, 3)], {}),
    "div": ([rand(2, 3), rand(2, 3, positive=True)], {}),
    "add_scalar": ([rand(2, 3)], {"value": 1.5}),
    "mul_scalar": ([rand(2, 3)], {"value": -2.0}),
    "rsub_scalar": ([rand(2, 3)], {"value": 1.0}),
    "rdiv_scalar": ([rand(2, 3, positive=True)], {"value": 3.0}),
    "pow_scalar": ([rand(2, 3, positive=True)], {"value": 2.5}),
    "neg": ([rand(2, 3)], {}),
    "relu": ([kinked(3, 4)], {}),
    "sigmoid": ([rand(3, 4)], {}),
    "tanh": ([rand(3, 4)], {}),
    "exp": ([rand(3, 4)], {}),
    "log": ([rand(3, 4, positive=True)], {}),
    "sqrt": ([rand(3, 4, positive=True)], {}),
    "abs": ([kinked(3, 4)], {}),
    "leaky_relu": ([kinked(3, 4)], {"slope": 0.1}),
    "linear": ([rand(4, 5), rand(3, 5)], {}),
    "matmul": ([rand(5, 4), rand(3, 5)], {"transpose_a": True, "transpose_b": True}),
    "bias_add": ([rand(2, 3, 4, 4), rand(3)], {}),
    "sum": ([rand(2, 3)], {}),
    "sum_squares": ([rand(2, 3)], {}),
    "channel_sum": ([rand(2, 3, 2, 2)], {}),
    "channel_mean": ([rand(2, 3, 2, 2)], {}),
    "channel_var": ([rand(2, 3, 2, 2), rand(3)], {}),
    "broadcast_channel": ([rand(3)], {"shape": (2, 3, 2, 2)}),
    "broadcast_scalar": ([rand()], {"shape": (2, 3)}),
    "bn_apply": ([rand(4, 3, 2, 2), rand(3), rand(3, positive=True), rand(3), rand(3)], {"eps": 1e-5}),
    "reshape": ([rand(2, 3, 4)], {"shape": (2, 12)}),
    "concat": ([rand(2, 3, 2), rand(2, 1, 2)], {"axis": 1}),
    "slice": ([rand(2, 5)], {"axis": 1, "start": 1, "stop": 4}),
    "softmax": ([rand(3, 5)], {}),
    "log_softmax": ([rand(3, 5)], {}),
    "softmax_cross_entropy": ([rand(4, 6), labels(4, 6)], {}),
    "cross_entropy": ([rand(4, 6, positive=True), labels(4, 6)], {}),
    "softmax_cross_entropy/per_position": ([rand(2, 3, 6), labels(6, 6).reshape(2, 3)], {}),
    "embedding": ([labels(6, 5).reshape(2, 3), rand(5, 4)], {}),
    "resize_axis": ([rand(2, 3, 4)], {"axis": 1, "factor": 2, "mode": "nearest"}),
    "resize_axis/bilinear": ([rand(2, 3, 4)], {"axis": 2, "factor": 3, "mode": "bilinear"}),
    "resize_axis/align_corners": ([rand(2, 3, 4)], {"axis": 2, "factor": 3, "mode": "bilinear_align_corners"}),
    "conv2d_backward_data": (  # conv_transpose
        [rand(2, 4, 3, 3), rand(4, 3, 3, 2)],
        {"stride": (2, 1), "pad": (1, 0), "groups": 2, "in_shape": (2, 6, 5, 4)},
    ),
    "mse": ([rand(2, 3), rand(2, 3)], {}),
    "conv2d": ([rand(2, 4, 6, 5), rand(6, 2, 3, 3)], {"stride": (2, 1), "pad": (1, 0), "groups": 2}),
    "max_pool2d": ([rand(2, 2, 7, 7)], {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1)}),
    "avg_pool2d": ([rand(2, 2, 6, 5)], {"kernel": (3, 2), "stride": (2, 1), "pad": (1, 1)}),
    "global_avg_pool": ([rand(2, 3, 4, 5)], {}),
    "lrn": ([rand(2, 6, 3, 3)], {"size": 5, "alpha": 0.5, "beta": 0.75, "k": 2.0}),
    "layer_norm_rows": ([rand(3, 6) * 3], {"eps": 1e-5}),
    "gelu": ([rand(3, 4) * 2], {}),
    "batch_matmul": ([rand(2, 4, 3), rand(2, 5, 4)], {"transpose_a": True, "transpose_b": True}),
    "transpose": ([rand(2, 3, 4)], {"perm": (2, 0, 1)}),
    # along axes (issue 34); max_axes's ties: tests/frontend/test_axis_ops.py
    "sum_axes": ([rand(2, 3, 4)], {"axes": (0, 2)}),
    "sum_axes/all": ([rand(2, 3)], {"axes": (0, 1)}),
    "expand": ([rand(2, 1, 4, 1)], {"shape": (2, 3, 4, 5)}),
    "max_axes": ([rand(2, 3, 4)], {"axes": (1,)}),
    "max_axes/all": ([rand(3, 4)], {"axes": (0, 1)}),
    # activations and adaptive pooling (issue 34): values on both sides of the kinks
    "hard_swish": ([rand(3, 4) * 3], {}),
    "clip": ([rand(3, 5) * 4 + 2], {"low": 0.0, "high": 6.0}),
    "silu": ([rand(3, 4) * 3], {}),
    "adaptive_pool_axis": ([rand(2, 3, 7, 2)], {"axis": 2, "size": 3}),  # windows 0-2, 2-4, 4-6: overlapping
    "adaptive_pool_axis/grow": ([rand(2, 3, 4)], {"axis": 2, "size": 6}),  # more outputs than inputs
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_gradient_matches_finite_differences(op: str) -> None:
    inputs, attrs = CASES[op]
    name = op.split("/")[0]
    # the derivative is undefined at a kink: the samples there move KINK_MARGIN to its side, beyond the step
    kinks = REGISTRY[name].kinks
    inputs = [away_from_kinks(x, tuple(v for j, v in kinks if j == i), KINK_MARGIN) if kinks else x
              for i, x in enumerate(inputs)]  # fmt: skip
    check_op_gradient(name, inputs, attrs)


@pytest.mark.parametrize("shape", [(4, 3, 2, 2), (5, 3)])
def test_batch_norm_in_training_matches_finite_differences_through_its_statistics(shape: tuple) -> None:
    # bn_train_apply's gradient is batch norm's closed form, right only where mean and var are x's own statistics:
    # as batch_norm's lowering emits them, so that a change of x moves them too
    def build(b, values):  # noqa: ANN001, ANN202
        x, gamma, beta = values
        m = b.emit("channel_mean", x)
        return b.emit("bn_train_apply", x, m, b.emit("channel_var", x, m), gamma, beta, eps=1e-5)

    c = shape[1]
    check_op_gradient("bn_train_apply", [rand(*shape) * 2 + 1, rand(c), rand(c)], {}, samples=30, build=build)


def test_matmul_gradients_for_every_transpose_combination() -> None:
    for ta in (False, True):
        for tb in (False, True):
            a = rand(4, 3) if ta else rand(3, 4)
            b = rand(5, 4) if tb else rand(4, 5)
            check_op_gradient("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb})


def _tensor_fn_graph(src: str):  # noqa: ANN202
    from helpers import HEADER, compile_text

    return compile_text(HEADER + src).program.graph


@pytest.mark.parametrize(
    "body",
    [
        "x[n, d] * sigmoid(x[n, d])",  # swish
        "sum[e] x[n, e] * x[n, e] / D + max(x[n, d], 0.5)",
        "x[n, d] - (sum[e] x[n, e]) / D",
        "exp(x[n, d] - (max[e] x[n, e]))",  # max reduction
        "x[n, d] > 0 ? tanh(x[n, d]) : x[n, d] ^ 2",
        "abs(x[n, d]) + sqrt(x[n, d] * x[n, d] + 1) + log(1 + x[n, d] * x[n, d])",
    ],
)
def test_indexed_gradients_match_finite_differences(body: str) -> None:
    g = _tensor_fn_graph(f"tensor f(x[B, D]) -> [n, d] = {body}\nh = f(flatten(x))\nloss = mse(h, h)\n")
    (stmt,) = [s for s in g.stmts if s.op == "indexed"]
    check_op_gradient("indexed", [rand(3, 4)], stmt.a)


def test_indexed_gradient_of_a_convolution_inverts_the_shifted_access() -> None:
    g = _tensor_fn_graph(
        "tensor c(x[N, C, H, W], w[F, C, K, K]) -> [n, f, i: H - K + 1, j: W - K + 1] =\n"
        "  sum[c, kh: K, kw: K] x[n, c, i + kh, j + kw] * w[f, c, kh, kw]\n"
        "tensor wgt(x[N, C, H, W]) -> [f: 2, c: C, a: 3, b: 3] = 0.1\n"
        "h = c(x, wgt(x))\nloss = mse(h, h)\n"
    )
    stmt = g.stmts[-2]
    check_op_gradient("indexed", [rand(2, 3, 5, 5), rand(2, 3, 3, 3)], stmt.a)


def test_indexed_gradient_with_a_strided_access_and_a_diagonal() -> None:
    g = _tensor_fn_graph(
        "tensor down(x[N, C, H, W]) -> [n, c, i: H / 2, j: W / 2] = x[n, c, 2 * i, 2 * j + 1]\n"
        "h = down(x)\nloss = mse(h, h)\n"
    )
    down = g.stmts[0]
    check_op_gradient("indexed", [rand(2, 3, 6, 6)], down.a)


def test_indexed_gradient_of_a_diagonal_keeps_the_delta_as_an_indicator() -> None:
    from deepdsl.ir.indexexpr import Affine, Apply, Const, Read

    n = Affine.var("n")
    body = Apply("*", (Read(0, (n, n)), Const(3.0)))  # out[n] = 3 x[n, n]
    check_op_gradient("indexed", [rand(3, 3)], {"out": (("n", 3),), "body": body})


CONV_GRAD_CASES = [  # x shape, weight shape, stride, pad, groups
    ((2, 3, 5, 5), (4, 3, 3, 3), (1, 1), (0, 0), 1),
    ((2, 3, 6, 7), (2, 3, 3, 3), (2, 2), (1, 1), 1),
    ((1, 2, 7, 5), (3, 2, 3, 2), (2, 1), (1, 0), 1),
    ((2, 4, 5, 5), (4, 1, 3, 3), (1, 1), (1, 1), 4),  # depthwise
    ((1, 4, 6, 6), (4, 2, 2, 2), (2, 2), (0, 0), 2),
]


@pytest.mark.parametrize("case", CONV_GRAD_CASES, ids=[f"conv{i}" for i in range(len(CONV_GRAD_CASES))])
def test_conv2d_gradients_for_strides_pads_and_groups(case: tuple) -> None:
    xs, ws, stride, pad, groups = case
    check_op_gradient("conv2d", [rand(*xs), rand(*ws)], {"stride": stride, "pad": pad, "groups": groups})


@pytest.mark.parametrize(
    ("op", "kernel", "stride", "pad"),
    [
        ("max_pool2d", (2, 2), (2, 2), (0, 0)),
        ("max_pool2d", (3, 3), (2, 2), (0, 0)),  # overlapping windows
        ("max_pool2d", (3, 2), (1, 2), (1, 0)),
        ("avg_pool2d", (3, 3), (2, 2), (1, 1)),
        ("avg_pool2d", (2, 3), (1, 2), (0, 1)),
    ],
)
def test_pool_gradients(op: str, kernel: tuple, stride: tuple, pad: tuple) -> None:
    # random normal inputs: no two elements of a window tie, so max pool is differentiable there
    check_op_gradient(op, [rand(2, 2, 7, 6)], {"kernel": kernel, "stride": stride, "pad": pad})


@pytest.mark.parametrize("size", [1, 3, 4, 5])
def test_lrn_gradients(size: int) -> None:
    check_op_gradient("lrn", [rand(2, 5, 2, 3)], {"size": size, "alpha": 0.8, "beta": 0.75, "k": 1.0})


# ---- the convolution family (issue 34): dilated convolutions, their data gradient (conv_transpose) onto an image
# larger than the convolution reads (its output padding), and the explicit pads before a pooling (frontend/convs.py)


@pytest.mark.parametrize(
    ("xs", "ws", "stride", "pad", "groups", "dilation", "in_extra"),
    [
        ((2, 4, 9, 8), (6, 2, 3, 2), (2, 1), (1, 2), 2, (2, 3), (0, 0)),
        ((1, 3, 10, 7), (2, 3, 2, 3), (1, 2), (0, 1), 1, (3, 1), (0, 1)),
        ((2, 2, 8, 8), (2, 1, 3, 3), (2, 2), (1, 1), 2, (2, 2), (1, 1)),
    ],
)
def test_dilated_conv_gradients(xs, ws, stride, pad, groups, dilation, in_extra) -> None:  # noqa: ANN001
    a = {"stride": stride, "pad": pad, "groups": groups, "dilation": dilation}
    check_op_gradient("conv2d", [rand(*xs), rand(*ws)], a)
    from deepdsl.ir import TensorType

    x = TensorType((xs[0], xs[1], xs[2] + in_extra[0], xs[3] + in_extra[1]))  # the output padding's rows
    y = REGISTRY["conv2d"].shape((x, TensorType(ws)), a)
    check_op_gradient("conv2d_backward_data", [rand(*y.shape), rand(*ws)], a | {"in_shape": x.shape})


@pytest.mark.parametrize("fill", [0.0, float("-inf")])
def test_explicit_pad_gradient(fill: float) -> None:
    from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Var

    index = (Affine.var("n"), Affine.var("c"), Affine((("h", 1),), -1), Affine((("w", 1),), -2))
    body = Read(0, index)
    if fill:
        inside = Apply(
            "and",
            (
                Apply("and", (Apply(">=", (Var("h"), Const(1))), Apply("<", (Var("h"), Const(5))))),
                Apply("and", (Apply(">=", (Var("w"), Const(2))), Apply("<", (Var("w"), Const(5))))),
            ),
        )
        body = Apply("select", (inside, body, Const(fill)))
    out = (("n", 2), ("c", 3), ("h", 7), ("w", 6))
    # max pooling after it, so that the -inf never reaches the loss (every window holds part of x)
    build = lambda b, v: b.emit(
        "max_pool2d",
        b.emit("indexed", v[0], out=out, body=body),
        kernel=(3, 3),  # noqa: E731
        stride=(2, 2),
        pad=(0, 0),
    )
    check_op_gradient("indexed", [rand(2, 3, 4, 3)], {}, build=build)


# ---- the losses of issue 34: each one `indexed` statement (frontend/losses.py), its gradient derived ----

LOSS_Y = np.array([0, 3, 2, 1, 2, 3], dtype=np.int64)


def _loss_build(which: str):  # noqa: ANN202
    from deepdsl.frontend import losses

    def build(b, values):  # noqa: ANN001, ANN202
        shape = values[0].type.shape
        body = {
            "l1": lambda: losses.l1(shape),
            "huber": lambda: losses.huber(shape, 0.7),
            "bce_with_logits": lambda: losses.bce_with_logits(shape),
            "nll": lambda: losses.nll(*shape, None, -100, 0.0),
            "nll/weight_ignore": lambda: losses.nll(*shape, (1.0, 2.0, 0.5, 3.0), 2, 0.0),
            "nll/smoothing_weight": lambda: losses.nll(*shape, (1.0, 2.0, 0.5, 3.0), -100, 0.2),
            "nll/smoothing": lambda: losses.nll(*shape, None, 1, 0.3),
        }[which]()
        return b.emit("indexed", *values, out=body[0], body=body[1])

    return build


LOSS_CASES = {
    "l1": [kinked(3, 4) * 2, kinked(3, 4)],
    "huber": [rand(3, 4) * 2, rand(3, 4)],
    "bce_with_logits": [np.concatenate([rand(3, 4) * 30, np.zeros((1, 4))]), RNG.uniform(0, 1, (4, 4))],
    "nll": [rand(6, 4), LOSS_Y],
    "nll/weight_ignore": [rand(6, 4), LOSS_Y],
    "nll/smoothing_weight": [rand(6, 4), LOSS_Y],
    "nll/smoothing": [rand(6, 4), LOSS_Y],
}


@pytest.mark.parametrize("which", sorted(LOSS_CASES))
def test_loss_gradients_match_finite_differences(which: str) -> None:
    inputs = LOSS_CASES[which]
    if which in ("l1", "huber"):  # away from |d| = 0 and |d| = delta, where the slope jumps
        d = inputs[0] - inputs[1]
        inputs = [inputs[1] + np.where(np.abs(np.abs(d) - (0.7 if which == "huber" else 0)) < 1e-3, d + 0.01, d),
                  inputs[1]]  # fmt: skip
    check_op_gradient("indexed", inputs, {}, build=_loss_build(which))


def test_bce_with_logits_gradient_is_sigmoid_minus_target_at_zero() -> None:
    from helpers import op_graph

    from deepdsl.autodiff import gradients
    from deepdsl.backends.numpy_runner import run as run_graph

    x, t = np.array([[0.0, -800.0, 800.0, 1.5]]), np.array([[0.3, 0.2, 0.9, 1.0]])
    b, values, _ = op_graph("indexed", [x, t], {}, _loss_build("bce_with_logits"))
    loss = b.stmts[-3].out  # the loss statement itself, before op_graph's sum(out * r)
    grads = gradients(b, loss, {"p0"})
    b.output("d", grads["p0"])
    out = run_graph(b.build(), {"r": np.ones(())}, {"p0": x, "p1": t}, dtype=np.float64).outputs
    np.testing.assert_allclose(out["d"], (0.5 * (1 + np.tanh(x / 2)) - t) / x.size, atol=1e-15)
    assert np.isfinite(float(out["loss"]))
