"""Integer division and remainder in the indices of tensor functions (`x[n, h / 2]`, `x[n, d % 2]`): the
floor semantics, the reads staying affine, and the gradients by finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op_gradient, compile_text, error_text

from deepdsl.ir.indexexpr import reads

HEAD = "network T\nconst N = 2\ninput x : [N, 3, 4, 6]\nlabel y : [N] classes 5\n"
FUNCTIONS = {
    "up2": "tensor f(x[B, C, H, W]) -> [n, c, h: 2 * H, w: 3 * W] = x[n, c, h / 2, w / 3]",
    "pool": "tensor f(x[B, C, H, W]) -> [n, c, i: H / 2, j: W / 2] = max[r: 4] x[n, c, 2 * i + r / 2, 2 * j + r % 2]",
    "shuffle": "tensor f(x[B, C, H, W]) -> [n, c, h, w: W] = x[n, c, h, (w % 2) * (W / 2) + w / 2]",
    "shifted": "tensor f(x[B, C, H, W]) -> [n, c, h, w: 2 * W + 1] = x[n, c, h, (w - 1) / 2] + x[n, c, h, (w + 3) % W]",
}


LOSS = "loss = softmax_cross_entropy(full(flatten(f(x)), 5), y)\n"


def naive(name: str, x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape

    def at(j: int) -> np.ndarray:  # a read outside x is 0
        return x[..., j] if 0 <= j < w else np.zeros(x.shape[:3])

    if name == "up2":
        return x.repeat(2, axis=2).repeat(3, axis=3)
    if name == "pool":
        return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    if name == "shuffle":
        return x[..., [(j % 2) * (w // 2) + j // 2 for j in range(w)]]
    return np.stack([at((j - 1) // 2) + at((j + 3) % w) for j in range(2 * w + 1)], axis=-1)  # Python's floor


def statement(name: str):  # noqa: ANN201
    g = compile_text(HEAD + FUNCTIONS[name] + "\n" + LOSS)
    return next(s for s in g.program.graph.stmts if s.layer.startswith("f"))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_division_and_remainder_read_where_python_would(name: str) -> None:
    s = statement(name)
    assert all(all(isinstance(c, int) for _, c in a.terms) for r in reads(s.a["body"]) for a in r.index)
    x = np.random.default_rng(2).standard_normal((2, 3, 4, 6))
    from deepdsl.ir.registry import lookup

    got = lookup("indexed").numpy((x,), s.a)
    np.testing.assert_allclose(got, naive(name, x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_their_gradients_match_finite_differences(name: str) -> None:
    s = statement(name)
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 6))
    check_op_gradient("indexed", [x], s.a)


@pytest.mark.parametrize(
    "index, message",
    [
        ("h / 0", "an index can be divided only by a positive integer constant"),
        ("h / w", "an index can be divided only by a positive integer constant"),
        ("h * w", "an index must be affine"),
    ],
)
def test_a_division_by_anything_but_a_positive_constant_is_an_error(index: str, message: str) -> None:
    text = HEAD + f"tensor f(x[B, C, H, W]) -> [n, c, h: H, w: W] = x[n, c, {index}, w]\n" + LOSS
    assert message in error_text(text)
