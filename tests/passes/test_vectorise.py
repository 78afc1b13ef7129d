"""Vectorise maps GEMM-, reduction- and transpose-shaped tensor functions to library ops, same numbers."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import HEADER, compile_text

from deepdsl.backends.numpy_runner import run
from deepdsl.passes.vectorise import vectorise

CASES = {
    "gram": ("tensor gram(x[B, C, P]) -> [b, i, j] = sum[p] x[b, i, p] * x[b, j, p]\n"
             "h = gram(reshape3(x))\n", "batch_matmul", {"transpose_b": True}),
    "gemm": ("tensor mm(a[I, K], w[J, K]) -> [i, j] = sum[k] a[i, k] * w[j, k]\n"
             "h = mm(flatten(x), wgt(flatten(x)))\n", "matmul", {"transpose_b": True}),
    "mean": ("tensor row_mean(x[B, D]) -> [b] = sum[d] x[b, d] / D\nh = row_mean(flatten(x))\n", "sum_axes",
             {"axes": (1,)}),
    "transpose": ("tensor t(x[B, D]) -> [d, b] = x[b, d]\nh = t(flatten(x))\n", "transpose", {"perm": (1, 0)}),
}  # fmt: skip

PRELUDE = (
    "tensor reshape3(x[N, C, H, W]) -> [n, c, p: H] = x[n, c, p, 0] + x[n, c, p, 1]\n"
    "tensor wgt(x[B, D]) -> [j: 5, d: D] = 0.01 * (j + 1)\n"
)


@pytest.mark.parametrize("case", sorted(CASES))
def test_custom_function_becomes_the_library_op(case: str) -> None:
    src, op, attrs = CASES[case]
    g = compile_text(HEADER + (PRELUDE if case in ("gram", "gemm") else "") + src + "loss = mse(h, h * 0.5)\n"
                     ).program.graph  # fmt: skip
    v = vectorise(g)
    target = [s for s in v.stmts if s.op == op]
    assert len(target) == 1, [s.op for s in v.stmts]
    for k, value in attrs.items():
        assert target[0].a.get(k, False) == value
    rng = np.random.default_rng(1)
    feeds = {"x": rng.random((4, 3, 8, 8)), "y": rng.integers(0, 10, 4)}
    before = run(g, feeds, {}, np.float64).outputs["loss"]
    after = run(v, feeds, {}, np.float64).outputs["loss"]
    np.testing.assert_allclose(after, before, rtol=1e-12)


def test_a_division_by_zero_stays_element_wise() -> None:
    """A body scaled by `/ 0` (the front end rejects the literal; a rewrite could still make one) is not taken
    for a scaled reduction: vectorise leaves it as it is instead of failing on 1 / 0."""
    import dataclasses

    from deepdsl.ir.indexexpr import Apply, Const

    g = compile_text(HEADER + CASES["mean"][0] + "loss = mse(h, h * 0.5)\n").program.graph
    (s,) = [s for s in g.stmts if s.op == "indexed"]
    body = s.a["body"]
    zero = dataclasses.replace(body, body=Apply("/", (body.body.args[0], Const(0.0))))
    broken = g.replace(stmts=tuple(t.replace(attrs=tuple((k, zero if k == "body" else v) for k, v in t.attrs))
                                   if t is s else t for t in g.stmts))  # fmt: skip
    assert vectorise(broken) is broken
