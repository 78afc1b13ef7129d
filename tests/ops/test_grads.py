"""Every differentiable op: its symbolic gradient against central finite differences in float64."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import check_op_gradient

RNG = np.random.default_rng(42)


def rand(*shape: int, positive: bool = False) -> np.ndarray:
    x = RNG.standard_normal(shape)
    return np.abs(x) + 0.5 if positive else x


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
    "relu": ([rand(3, 4)], {}),
    "sigmoid": ([rand(3, 4)], {}),
    "tanh": ([rand(3, 4)], {}),
    "exp": ([rand(3, 4)], {}),
    "log": ([rand(3, 4, positive=True)], {}),
    "sqrt": ([rand(3, 4, positive=True)], {}),
    "abs": ([rand(3, 4)], {}),
    "leaky_relu": ([rand(3, 4)], {"slope": 0.1}),
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
    "mse": ([rand(2, 3), rand(2, 3)], {}),
}


@pytest.mark.parametrize("op", sorted(CASES))
def test_gradient_matches_finite_differences(op: str) -> None:
    inputs, attrs = CASES[op]
    check_op_gradient(op, inputs, attrs)


def test_matmul_gradients_for_every_transpose_combination() -> None:
    for ta in (False, True):
        for tb in (False, True):
            a = rand(4, 3) if ta else rand(3, 4)
            b = rand(5, 4) if tb else rand(4, 5)
            check_op_gradient("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb})
