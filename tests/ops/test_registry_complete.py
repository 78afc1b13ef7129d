"""Every registry entry has what issue 2 requires of it: a shape rule that works and a description."""

from __future__ import annotations

import pytest

import deepdsl.ops  # noqa: F401
from deepdsl.ir import REGISTRY, TensorType
from deepdsl.ir.registry import lookup
from deepdsl.ir.types import DType, ShapeError

X4 = TensorType((2, 4, 8, 8))
X2 = TensorType((2, 6))
LABELS = TensorType((2,), DType.I64)
C4 = TensorType((4,))

# a valid call of every op: inputs and attrs
EXAMPLES = {
    "add": ((X4, X4), {}), "sub": ((X4, X4), {}), "mul": ((X4, X4), {}), "div": ((X4, X4), {}),
    "add_scalar": ((X4,), {"value": 1.0}), "mul_scalar": ((X4,), {"value": 2.0}),
    "rsub_scalar": ((X4,), {"value": 1.0}), "rdiv_scalar": ((X4,), {"value": 1.0}),
    "pow_scalar": ((X4,), {"value": 2.0}),
    "neg": ((X4,), {}), "relu": ((X4,), {}), "sigmoid": ((X4,), {}), "tanh": ((X4,), {}), "exp": ((X4,), {}),
    "log": ((X4,), {}), "sqrt": ((X4,), {}), "abs": ((X4,), {}), "leaky_relu": ((X4,), {"slope": 0.1}),
    "linear": ((X2, TensorType((3, 6))), {}), "bias_add": ((X4, C4), {}),
    "conv2d": ((X4, TensorType((6, 2, 3, 3))), {"stride": (1, 1), "pad": (1, 1), "groups": 2}),
    "max_pool2d": ((X4,), {"kernel": (2, 2), "stride": (2, 2), "pad": (0, 0)}),
    "avg_pool2d": ((X4,), {"kernel": (3, 3), "stride": (2, 2), "pad": (1, 1)}),
    "global_avg_pool": ((X4,), {}),
    "batch_norm": ((X4, C4, C4, C4, C4), {"eps": 1e-5, "momentum": 0.1, "affine": True}),
    "lrn": ((X4,), {"size": 5, "alpha": 1e-4, "beta": 0.75, "k": 1.0}),
    "dropout": ((X4,), {"p": 0.5, "site": "d"}),
    "reshape": ((X4,), {"shape": (2, 256)}), "concat": ((X4, X4), {"axis": 1}),
    "softmax": ((X2,), {}), "log_softmax": ((X2,), {}),
    "softmax_cross_entropy": ((X2, LABELS), {}), "cross_entropy": ((X2, LABELS), {}),
    "accuracy": ((X2, LABELS), {}), "mse": ((X4, X4), {}), "argmax": ((X2,), {}),
    # backward and update ops
    "relu_grad": ((X4, X4), {}), "sigmoid_grad": ((X4, X4), {}), "tanh_grad": ((X4, X4), {}),
    "abs_grad": ((X4, X4), {}), "leaky_relu_grad": ((X4, X4), {"slope": 0.1}),
    "fill": ((), {"shape": (2, 3), "value": 1.0}), "matmul": ((X2, TensorType((6, 3))), {}),
    "sum": ((X4,), {}), "sum_squares": ((X4,), {}), "channel_sum": ((X4,), {}), "channel_mean": ((X4,), {}),
    "channel_var": ((X4, C4), {}), "broadcast_channel": ((C4,), {"shape": (2, 4, 8, 8)}),
    "broadcast_scalar": ((TensorType(()),), {"shape": (2, 4, 8, 8)}),
    "bn_apply": ((X4, C4, C4, C4, C4), {"eps": 1e-5}),
    "running_update": ((C4, C4), {"momentum": 0.1, "correction": 1.0}),
    "slice": ((X4,), {"axis": 1, "start": 1, "stop": 3}), "pad_axis": ((X4,), {"axis": 1, "start": 1, "size": 6}),
    "softmax_backward": ((X2, X2), {}), "log_softmax_backward": ((X2, X2), {}),
    "softmax_cross_entropy_backward": ((X2, LABELS, TensorType(())), {}),
    "cross_entropy_backward": ((X2, LABELS, TensorType(())), {}), "mse_backward": ((X4, X4, TensorType(())), {}),
    "sgd_plain": ((X4, X4), {"lr": 0.1, "weight_decay": 0.0}),
    "sgd_momentum": ((X4, X4, X4), {"momentum": 0.9, "weight_decay": 0.0}), "sgd_step": ((X4, X4), {"lr": 0.1}),
    "adam_moment": ((X4, X4), {"beta": 0.9, "power": 1}),
    "adam_step": ((X4, X4, X4, TensorType(())), {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    "scale_by": ((X4, TensorType(())), {}), "clip_scale": ((TensorType(()),), {"clip": 1.0}),
    "dropout_mask": ((TensorType((), DType.I64),), {"shape": (2, 4, 8, 8), "p": 0.5, "site": "d", "seed": 1}),
    "conv2d_backward_data": ((X4, TensorType((4, 2, 3, 3))),
                             {"stride": (1, 1), "pad": (1, 1), "groups": 2, "in_shape": (2, 4, 8, 8)}),
    "conv2d_backward_filter": ((X4, X4), {"stride": (1, 1), "pad": (1, 1), "groups": 2, "w_shape": (4, 2, 3, 3)}),
    "max_pool2d_backward": ((X4, TensorType((2, 4, 4, 4)), TensorType((2, 4, 4, 4))),
                            {"kernel": (2, 2), "stride": (2, 2), "pad": (0, 0)}),
    "avg_pool2d_backward": ((TensorType((2, 4, 4, 4)),),
                            {"kernel": (2, 2), "stride": (2, 2), "pad": (0, 0), "in_shape": (2, 4, 8, 8)}),
    "global_avg_pool_backward": ((TensorType((2, 4, 1, 1)),), {"in_shape": (2, 4, 8, 8)}),
    "lrn_backward": ((X4, X4, X4), {"size": 5, "alpha": 1e-4, "beta": 0.75, "k": 1.0}),
    # what vectorise maps tensor functions to
    "batch_matmul": ((TensorType((2, 3, 4)), TensorType((2, 5, 4))), {"transpose_b": True}),
    "sum_axes": ((X4,), {"axes": (0, 2)}),
    "transpose": ((X4,), {"perm": (0, 2, 3, 1)}),
}  # fmt: skip

EXPECTED = {
    "linear": (2, 3), "conv2d": (2, 6, 8, 8), "max_pool2d": (2, 4, 4, 4), "avg_pool2d": (2, 4, 4, 4),
    "global_avg_pool": (2, 4, 1, 1), "reshape": (2, 256), "concat": (2, 8, 8, 8), "softmax_cross_entropy": (),
    "cross_entropy": (), "accuracy": (), "mse": (), "argmax": (2,), "fill": (2, 3), "matmul": (2, 3), "sum": (),
    "sum_squares": (), "channel_sum": (4,), "channel_mean": (4,), "channel_var": (4,),
    "broadcast_channel": (2, 4, 8, 8),
    "broadcast_scalar": (2, 4, 8, 8), "slice": (2, 2, 8, 8), "pad_axis": (2, 6, 8, 8), "clip_scale": (),
    "dropout_mask": (2, 4, 8, 8), "conv2d_backward_data": (2, 4, 8, 8), "conv2d_backward_filter": (4, 2, 3, 3),
    "max_pool2d_backward": (2, 4, 8, 8),
    "batch_matmul": (2, 3, 5), "sum_axes": (4, 8), "transpose": (2, 8, 8, 4), "avg_pool2d_backward": (2, 4, 8, 8),
    "global_avg_pool_backward": (2, 4, 8, 8),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_op_has_a_working_shape_rule(name: str) -> None:
    op = lookup(name)
    assert op.doc, f"{name} has no description"
    if name in ("indexed", "fused"):
        pytest.skip("indexed is exercised through tensor functions in tests/frontend/test_elaborate.py")
    inputs, attrs = EXAMPLES[name]
    out = op.shape(inputs, attrs)
    assert out.shape == EXPECTED.get(name, inputs[0].shape if inputs else None)


def test_shape_rules_reject_what_does_not_fit() -> None:
    with pytest.raises(ShapeError, match="different shapes"):
        lookup("add").shape((X4, X2), {})
    with pytest.raises(ShapeError, match="does not fit"):
        lookup("max_pool2d").shape((X4,), {"kernel": (9, 9), "stride": (1, 1), "pad": (0, 0)})
    with pytest.raises(ShapeError, match="groups=3"):
        lookup("conv2d").shape((X4, TensorType((6, 1, 3, 3))), {"stride": (1, 1), "pad": (0, 0), "groups": 3})
    with pytest.raises(ShapeError, match="labels must be int"):
        lookup("softmax_cross_entropy").shape((X2, TensorType((3,), DType.I64)), {})


def test_lookup_suggests_the_nearest_op() -> None:
    with pytest.raises(KeyError, match="did you mean 'conv2d'"):
        lookup("conv2")
