"""The convolution family of issues 33 and 34: dilation, asymmetric padding, conv_transpose's output padding,
pooling's ceil mode, conv1d and the 1-D pools, against independent float64 loops written from PyTorch's
definitions (scripts/pytorch_convs.py checks the same against PyTorch itself), their gradients against finite
differences, and their errors at the call."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import ROOT, compile_text, error_text

from deepdsl.autodiff import gradient_program
from deepdsl.backends.numpy_runner import run
from deepdsl.ir import REGISTRY

RNG = np.random.default_rng(7)


# ---- the references: plain loops over PyTorch's definitions ----


def ref_conv2d(x, w, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):  # noqa: ANN001, ANN201
    """PyTorch's conv2d (cross-correlation) of x zero-padded by (top, left, bottom, right)."""
    t, lft, b, r = pads
    x = np.pad(x, ((0, 0), (0, 0), (t, b), (lft, r)))
    n, c, h, wd = x.shape
    f, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    oh, ow = (h - (kh - 1) * dh - 1) // sh + 1, (wd - (kw - 1) * dw - 1) // sw + 1
    y = np.zeros((n, f, oh, ow))
    fg = f // groups
    for o in range(f):
        cs = slice(o // fg * cg, o // fg * cg + cg)
        for i in range(oh):
            for j in range(ow):
                win = x[:, cs, i * sh : i * sh + (kh - 1) * dh + 1 : dh, j * sw : j * sw + (kw - 1) * dw + 1 : dw]
                y[:, o, i, j] = np.einsum("nchw,chw->n", win, w[o])
    return y


def ref_conv_transpose(x, w, stride, pad, dilation, output_padding, groups=1):  # noqa: ANN001, ANN201
    """PyTorch's conv_transpose2d: each input pixel scatters its weighted kernel, weight [C, out/groups, kh, kw]."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw), (oph, opw) = stride, pad, dilation, output_padding
    full = np.zeros((n, og * groups, (h - 1) * sh + (kh - 1) * dh + 1 + oph, (wd - 1) * sw + (kw - 1) * dw + 1 + opw))
    cg = c // groups
    for ch in range(c):
        outs = slice(ch // cg * og, ch // cg * og + og)
        for i in range(h):
            for j in range(wd):
                for p in range(kh):
                    for q in range(kw):
                        full[:, outs, i * sh + p * dh, j * sw + q * dw] += x[:, ch, i, j][:, None] * w[ch, :, p, q]
    return full[:, :, ph : full.shape[2] - ph, pw : full.shape[3] - pw]


def pool_out(d: int, k: int, s: int, before: int, after: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output size (pooling_output_shape) with padding before and after."""
    o = (d + before + after - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= d + before:
        o -= 1
    return o


def ref_pool(x, kind, kernel, stride, pads=(0, 0, 0, 0), ceil_mode=False):  # noqa: ANN001, ANN201
    """PyTorch's max_pool2d / avg_pool2d (count_include_pad): window (oh * s - top, ...) clipped to the padded input
    for the divisor and to the input for the values."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (t, lft, b, r) = kernel, stride, pads
    oh, ow = pool_out(h, kh, sh, t, b, ceil_mode), pool_out(w, kw, sw, lft, r, ceil_mode)
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            h0, w0 = i * sh - t, j * sw - lft
            h1, w1 = min(h0 + kh, h + b), min(w0 + kw, w + r)
            count = (h1 - h0) * (w1 - w0)
            win = x[:, :, max(h0, 0) : min(h1, h), max(w0, 0) : min(w1, w)]
            if kind == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                y[:, :, i, j] = win.sum(axis=(2, 3)) / count
    return y


# ---- the NumPy kernels of the ops ----


@pytest.mark.parametrize(
    ("x", "w", "stride", "pad", "dilation", "groups"),
    [
        ((2, 3, 9, 8), (4, 3, 3, 3), (1, 1), (0, 0), (2, 2), 1),
        ((2, 4, 11, 10), (6, 2, 3, 2), (2, 1), (1, 2), (3, 2), 2),
        ((1, 2, 7, 7), (2, 2, 2, 3), (2, 3), (2, 1), (1, 3), 1),
    ],
)
def test_conv2d_with_dilation_matches_the_loops(x, w, stride, pad, dilation, groups) -> None:  # noqa: ANN001
    xs, ws = RNG.standard_normal(x), RNG.standard_normal(w)
    a = {"stride": stride, "pad": pad, "groups": groups, "dilation": dilation}
    want = ref_conv2d(xs, ws, stride, (*pad, *pad), dilation, groups)
    op = REGISTRY["conv2d"]
    np.testing.assert_allclose(op.numpy((xs, ws), a), want, atol=1e-10)
    # (the planned workspace is in float32 bytes; these float64 kernels take twice that)
    scratch = np.empty(2 * op.workspace(tuple(_t(v) for v in (xs, ws)), _t(want), a), dtype=np.uint8)
    np.testing.assert_allclose(op.numpy_ws((xs, ws), a, scratch), want, atol=1e-10)
    # the data and filter gradients are the adjoints of the forward pass: <conv(x, w), g> = <x, dx(g)> = <w, dw(g)>
    g = RNG.standard_normal(want.shape)
    for kernel in ("numpy", "numpy_workspace"):
        data, filt = REGISTRY["conv2d_backward_data"], REGISTRY["conv2d_backward_filter"]
        da, fa = a | {"in_shape": x}, a | {"w_shape": w}
        args = ((g, ws), da), ((xs, g), fa)
        if kernel == "numpy":
            dx, dw = data.numpy(*args[0]), filt.numpy(*args[1])
        else:
            dx = data.numpy_ws(*args[0], np.empty(2 * data.workspace((_t(g), _t(ws)), _t(xs), da), np.uint8))
            dw = filt.numpy_ws(*args[1], np.empty(2 * filt.workspace((_t(xs), _t(g)), _t(ws), fa), np.uint8))
        assert math.isclose(np.vdot(want, g), np.vdot(xs, dx), rel_tol=1e-10)
        assert math.isclose(np.vdot(want, g), np.vdot(ws, dw), rel_tol=1e-10)


def _t(x: np.ndarray):  # noqa: ANN202
    from deepdsl.ir import TensorType

    return TensorType(x.shape)


def test_the_shape_rule_takes_the_dilated_window_and_the_vendor_call_its_dilation() -> None:
    from deepdsl.ir import TensorType

    a = {"stride": (1, 2), "pad": (0, 1), "groups": 1, "dilation": (3, 2)}
    x, w = TensorType((1, 2, 10, 9)), TensorType((3, 2, 3, 4))
    y = REGISTRY["conv2d"].shape((x, w), a)
    assert y.shape == (1, 3, 4, 3)  # (10 - 7) + 1 rows, (9 + 2 - 7) // 2 + 1 columns
    assert REGISTRY["conv2d"].vendor((x, w), y, a).dilation == (3, 2)
    assert REGISTRY["conv2d"].vendor((x, w), y, {k: v for k, v in a.items() if k != "dilation"}).dilation == (1, 1)


# ---- the layers through the NumPy runner ----

HEAD = "network T\nconst N = 2\ninput x : [N, 3, 9, 8]\ninput s : [N, 2, 21]\nlabel y : [N] classes 10\n"


def _net(body: str) -> tuple:
    """The graph of `body` (defining h, the prediction) with a loss reading h, its parameters and inputs."""
    text = HEAD + body + "\nloss = softmax_cross_entropy(full(flatten(h), 10), y)\npredict = h\n"
    g = compile_text(text).program.graph
    params = {p.value.name: RNG.standard_normal(p.value.type.shape) for p in g.params}
    feeds = {"x": RNG.standard_normal((2, 3, 9, 8)), "s": RNG.standard_normal((2, 2, 21)), "y": np.array([1, 7])}
    return g, params, feeds


def _predict(body: str) -> tuple[np.ndarray, dict, dict]:
    g, params, feeds = _net(body)
    return run(g, feeds, params, np.float64).outputs["predict"], params, feeds


@pytest.mark.parametrize(
    ("args", "stride", "pads", "dilation"),
    [
        ("dilation=2", (1, 1), (0, 0, 0, 0), (2, 2)),
        ("dilation=(2, 1), pad=(1, 2, 3, 0), stride=2", (2, 2), (1, 2, 3, 0), (2, 1)),
        ("pad=(0, 1, 2, 1)", (1, 1), (0, 1, 2, 1), (1, 1)),
    ],
)
def test_conv_with_dilation_and_asymmetric_padding(args: str, stride: tuple, pads: tuple, dilation: tuple) -> None:
    got, p, f = _predict(f"h = conv(x, 4, kernel=3, {args})")
    want = ref_conv2d(f["x"], p["h.W"], stride, pads, dilation) + p["h.b"][None, :, None, None]
    np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.parametrize(
    ("args", "stride", "pad", "dilation", "op"),
    [
        ("stride=2, output_padding=1", (2, 2), (0, 0), (1, 1), (1, 1)),
        ("stride=(2, 3), pad=1, dilation=2, output_padding=(1, 2)", (2, 3), (1, 1), (2, 2), (1, 2)),
        ("dilation=3, output_padding=2", (1, 1), (0, 0), (3, 3), (2, 2)),  # below the dilation, not the stride
    ],
)
def test_conv_transpose_with_dilation_and_output_padding(args: str, stride, pad, dilation, op) -> None:  # noqa: ANN001
    got, p, f = _predict(f"h = conv_transpose(x, 4, kernel=3, {args})")
    want = ref_conv_transpose(f["x"], p["h.W"], stride, pad, dilation, op) + p["h.b"][None, :, None, None]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize(
    ("args", "kernel", "stride", "pads", "ceil"),
    [
        ("2, ceil_mode=true", (2, 2), (2, 2), (0, 0, 0, 0), True),  # 9 x 8: a last window of one row
        ("3, stride=2, pad=1, ceil_mode=true", (3, 3), (2, 2), (1, 1, 1, 1), True),
        ("(3, 2), stride=(2, 3), ceil_mode=true", (3, 2), (2, 3), (0, 0, 0, 0), True),
        ("3, stride=2, pad=(1, 0, 0, 1)", (3, 3), (2, 2), (1, 0, 0, 1), False),
        ("3, stride=2, pad=(0, 1, 1, 0), ceil_mode=true", (3, 3), (2, 2), (0, 1, 1, 0), True),
        ("4, stride=3, pad=2, ceil_mode=true", (4, 4), (3, 3), (2, 2, 2, 2), True),  # a window dropped at the end
    ],
)
def test_pools_with_ceil_mode_and_asymmetric_padding(kind: str, args: str, kernel, stride, pads, ceil) -> None:  # noqa: ANN001
    got, _, f = _predict(f"h = {kind}_pool(x, {args})")
    want = ref_pool(f["x"], kind, kernel, stride, pads, ceil)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-10)


def test_ceil_mode_that_adds_no_window_is_the_plain_pool() -> None:
    pool = "h = max_pool(x, (3, 2), stride=(3, 2), ceil_mode=true)\n"
    text = HEAD + pool + "loss = mse(flatten(h), flatten(h))\npredict = h\n"
    ops = [s.op for s in compile_text(text).program.graph.stmts]
    assert "indexed" not in ops and ops.count("max_pool2d") == 1  # 9 rows and 8 columns: 3 and 4 windows either way


def test_conv1d_keeps_nn_conv1d_weights_and_matches_the_2d_loops() -> None:
    got, p, f = _predict("h = conv1d(s, 4, 3, stride=2, pad=(2, 1), dilation=2, groups=2)")
    assert p["h.W"].shape == (4, 1, 3)
    want = ref_conv2d(f["s"][:, :, None, :], p["h.W"][:, :, None, :], (1, 2), (0, 2, 0, 1), (1, 2), 2)[:, :, 0]
    want += p["h.b"][None, :, None]
    np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_1d_pools_and_global_average_of_a_sequence(kind: str) -> None:
    got, _, f = _predict(f"h = {kind}_pool1d(s, 4, stride=3, pad=(2, 1), ceil_mode=true)")
    want = ref_pool(f["s"][:, :, None, :], kind, (1, 4), (1, 3), (0, 2, 0, 1), True)[:, :, 0]
    assert got.shape == want.shape == (2, 2, 8)
    np.testing.assert_allclose(got, want, atol=1e-10)
    got, _, f = _predict("h = global_avg_pool(s)")
    np.testing.assert_allclose(got, f["s"].mean(axis=2, keepdims=True), atol=1e-12)


# ---- gradients of the lowered layers against finite differences (float64) ----


@pytest.mark.parametrize(
    "body",
    [
        "h = max_pool(conv(x, 3, kernel=2, dilation=(2, 1), pad=(1, 0, 2, 1)), 3, stride=2, pad=1, ceil_mode=true)",
        "h = avg_pool(conv(x, 3, kernel=2, pad=(0, 1, 1, 0)), 3, stride=2, pad=(1, 0, 1, 1), ceil_mode=true)",
        "h = conv_transpose(x, 2, kernel=3, stride=2, pad=1, dilation=2, output_padding=1)",
        "h = conv_transpose(x, 2, kernel=2, dilation=3, output_padding=(2, 0))",
        "h = avg_pool1d(conv1d(s, 3, 3, stride=2, pad=(2, 0), dilation=2), 2, ceil_mode=true)",
        "h = max_pool1d(conv1d(s, 4, 2, groups=2), 3, stride=2, pad=1, ceil_mode=true)",
    ],
)
def test_gradients_of_the_lowered_layers_match_finite_differences(body: str) -> None:
    g, params, feeds = _net(body)
    grads = {k[5:]: v for k, v in run(gradient_program(g), feeds, params, np.float64).outputs.items()
             if k.startswith("grad:")}  # fmt: skip
    loss = lambda ps: float(run(g, feeds, ps, np.float64).outputs["loss"])  # noqa: E731
    for name in (n for n in params if n.startswith("h.")):
        flat = params[name].reshape(-1)
        for i in RNG.choice(flat.size, size=min(6, flat.size), replace=False):
            step = np.zeros_like(flat)
            step[i] = 1e-6
            up = params | {name: (flat + step).reshape(params[name].shape)}
            down = params | {name: (flat - step).reshape(params[name].shape)}
            numeric = (loss(up) - loss(down)) / 2e-6
            assert abs(grads[name].reshape(-1)[i] - numeric) <= 1e-5 * max(1.0, abs(numeric)), (name, i)


# ---- errors at the call ----


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("h = conv_transpose(x, 2, kernel=3, stride=2, output_padding=2)",
         "output_padding (2, 2) must be less than the stride (2, 2) or the dilation (1, 1)"),
        ("h = conv(x, 2, kernel=3, pad=(1, 2, 3))",
         "pad must be an integer, a pair (h, w) or (top, left, bottom, right), got 3 values"),
        ("h = conv(x, 2, kernel=3, dilation=4)", "conv: a window of 9 with padding 0 does not fit an input of size 8"),
        ("h = conv(x, 2, kernel=3, dilation=0)", "argument 'dilation' of conv must be at least 1"),
        ("h = max_pool(x, 2, pad=(0, 0, 2, 0))", "max_pool: padding 2 is more than half the window 2"),
        ("h = avg_pool1d(x, 2)", "avg_pool1d expects a 3-D input"),
        ("h = conv1d(s, 2, 3, pad=(1, 1, 1, 1))", "conv1d: pad must be an integer or a pair (left, right)"),
        ("h = conv_transpose(x, 2, kernel=3, pad=(1, 1, 0, 0))", "conv_transpose: pad must be an integer or a pair"),
        ("h = conv(x, 2, kernel=3, pad=(0, 0, 2147483647, 0))",
         "conv: input 'x' padded by (0, 0, 2147483647, 0) is 2147483656 x 8; at most 2,147,483,647"),
    ],
)  # fmt: skip
def test_errors_name_the_call(line: str, message: str) -> None:
    text = error_text(HEAD + line + "\nloss = mse(flatten(h), flatten(h))\npredict = h\n")
    assert message in text, text
    assert "t.ddsl:6:" in text, text  # the line of the call


# ---- the example network ----

EXAMPLE = ROOT / "networks" / "examples" / "audio_1d.ddsl"


def test_audio_example_checks_and_trains(cli) -> None:  # noqa: ANN001
    r = cli("check", str(EXAMPLE), "--layers")
    assert r.exit_code == 0, r.output
    assert "conv1d" in r.output and "max_pool1d" in r.output
    r = cli("run", str(EXAMPLE), "--data", "synthetic", "--iters", "3")
    assert r.exit_code == 0, r.output
    assert "iter 3/3" in r.output
    r = cli("memcheck", str(EXAMPLE), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["peak_bytes"] > 0
