"""conv_transpose (conv2d_backward_data as a layer) and upsample (resize_axis) against naive loops written from
PyTorch's definitions, and the builtins' shapes and errors."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import compile_text, error_text

import deepdsl.ops  # noqa: F401
from deepdsl.ir.registry import lookup

RNG = np.random.default_rng(3)


def naive_conv_transpose(x: np.ndarray, w: np.ndarray, stride: tuple, pad: tuple, groups: int) -> np.ndarray:
    """PyTorch's conv_transpose2d: every input element scatters its weight window into the output."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    oh, ow = (h - 1) * stride[0] - 2 * pad[0] + kh, (wd - 1) * stride[1] - 2 * pad[1] + kw
    y = np.zeros((n, og * groups, oh, ow))
    cg = c // groups
    for b, ci, i, j, o, p, q in itertools.product(range(n), range(c), range(h), range(wd), range(og), range(kh),
                                                  range(kw)):  # fmt: skip
        r, s = i * stride[0] - pad[0] + p, j * stride[1] - pad[1] + q
        if 0 <= r < oh and 0 <= s < ow:
            y[b, (ci // cg) * og + o, r, s] += x[b, ci, i, j] * w[ci, o, p, q]
    return y


@pytest.mark.parametrize("stride, pad, groups", [((1, 1), (0, 0), 1), ((2, 1), (1, 0), 2), ((3, 2), (1, 1), 1)])
def test_conv_transpose_is_pytorchs(stride: tuple, pad: tuple, groups: int) -> None:
    x = RNG.standard_normal((2, 4, 3, 4))
    w = RNG.standard_normal((4, 3, 3, 2))
    want = naive_conv_transpose(x, w, stride, pad, groups)
    attrs = {
        "stride": stride,
        "pad": pad,
        "groups": groups,
        "in_shape": want.shape[:1] + (3 * groups,) + want.shape[2:],
    }
    got = lookup("conv2d_backward_data").numpy((x, w), attrs)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def naive_bilinear(x: np.ndarray, f: int, align_corners: bool = False) -> np.ndarray:
    """PyTorch's upsample_bilinear2d: source index (align_corners=False: clamped; True: i·(n − 1)/(n·f − 1), the
    corners lined up), and its two neighbours."""
    n, c, h, w = x.shape

    def taps(size: int, i: int) -> tuple[int, int, float]:
        src = i * (size - 1) / max(size * f - 1, 1) if align_corners else max((i + 0.5) / f - 0.5, 0.0)
        i0 = math.floor(src)
        return i0, min(i0 + 1, size - 1), src - i0

    y = np.zeros((n, c, h * f, w * f))
    for i, j in itertools.product(range(h * f), range(w * f)):
        (a0, a1, la), (b0, b1, lb) = taps(h, i), taps(w, j)
        y[:, :, i, j] = ((1 - la) * ((1 - lb) * x[:, :, a0, b0] + lb * x[:, :, a0, b1])
                         + la * ((1 - lb) * x[:, :, a1, b0] + lb * x[:, :, a1, b1]))  # fmt: skip
    return y


def upsample(x: np.ndarray, f: int, mode: str) -> np.ndarray:
    op = lookup("resize_axis").numpy
    return op((op((x,), {"axis": 2, "factor": f, "mode": mode}),), {"axis": 3, "factor": f, "mode": mode})


@pytest.mark.parametrize("f", [1, 2, 3])
def test_upsample_is_pytorchs(f: int) -> None:
    x = RNG.standard_normal((2, 3, 4, 5))
    near = np.zeros((2, 3, 4 * f, 5 * f))
    for i, j in itertools.product(range(4 * f), range(5 * f)):
        near[:, :, i, j] = x[:, :, i // f, j // f]
    np.testing.assert_allclose(upsample(x, f, "nearest"), near, rtol=0, atol=0)
    np.testing.assert_allclose(upsample(x, f, "bilinear"), naive_bilinear(x, f), rtol=1e-12, atol=1e-12)
    corners = naive_bilinear(x, f, align_corners=True)
    np.testing.assert_allclose(upsample(x, f, "bilinear_align_corners"), corners, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["bilinear", "bilinear_align_corners"])
@pytest.mark.parametrize("op", ["resize_axis", "resize_axis_backward"])
def test_the_index_form_the_backends_compile_is_the_kernel(op: str, mode: str) -> None:
    """The CUDA and Java kernels are written from the index form: it computes the NumPy kernel's map, the short
    axis of one element (n = 1, where align_corners' denominator would be 0) included."""
    from deepdsl.ir.analysis import out_vars
    from deepdsl.ir.types import TensorType
    from deepdsl.ops.indexed import evaluate

    for size in (5, 1):
        attrs = {"axis": 2, "factor": 3, "mode": mode, "size": size}
        x = RNG.standard_normal((2, 3, size if op == "resize_axis" else 3 * size))
        types = (TensorType(x.shape),)
        out = lookup(op).shape(types, attrs)
        form = lookup(op).index_form(types, out, attrs)
        got = evaluate(form, tuple(zip(out_vars(out), out.shape)), (x,), np.float64)
        np.testing.assert_allclose(got, lookup(op).numpy((x,), attrs), rtol=1e-12, atol=1e-12)


NET = """network Img
const N = 2
input x : [N, 3, 4, 4]
label y : [N] classes 5
h = conv_transpose(x, 6, kernel=3, stride=2, pad=1, groups=3)   # [N, 6, 7, 7]
u = upsample(h, 2, mode="bilinear")                              # [N, 6, 14, 14]
v = upsample(conv(u, 2, kernel=3), 3)                           # [N, 2, 36, 36]
loss = softmax_cross_entropy(full(flatten(v), 5), y)
"""


def test_the_layers_give_their_shapes_and_parameters() -> None:
    g = compile_text(NET).program.graph
    shapes = {p.value.name: p.value.type.shape for p in g.trainable}
    assert shapes["h.W"] == (3, 2, 3, 3) and shapes["h.b"] == (6,)  # [in, out/groups, kh, kw], PyTorch's layout
    ops = [s.op for s in g.stmts]
    assert ops.count("resize_axis") == 4 and "conv2d_backward_data" in ops
    assert [s.out.type.shape for s in g.stmts if s.op == "resize_axis"][-1] == (2, 2, 36, 36)


@pytest.mark.parametrize(
    "change, message",
    [
        ('mode="bilinear"', 'upsample: mode must be "nearest" or "bilinear", got \'cubic\''),
        ("kernel=3), 3)", 'upsample: align_corners=true needs mode="bilinear"'),
        ("stride=2, pad=1,", "conv_transpose: padding (3, 3) leaves no output"),
        ("groups=3)", "conv_transpose: groups=4 must divide the 3 input channels"),
    ],
)
def test_bad_arguments_are_errors(change: str, message: str) -> None:
    broken = {
        'mode="bilinear"': 'mode="cubic"',
        "kernel=3), 3)": "kernel=3), 3, align_corners=true)",
        "stride=2, pad=1,": "stride=1, pad=3,",
        "groups=3)": "groups=4)",
    }
    assert message in error_text(NET.replace(change, broken[change]))
