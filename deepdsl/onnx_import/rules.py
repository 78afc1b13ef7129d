"""The import rules' table: one rule per ONNX operator (`RULES`; `SUPPORTED` lists them), each in the module of its
family. A rule writes the node as `.ddsl` lines through the importer, or refuses it, naming the node, its op type and
the opset, where the language cannot say exactly what it computes."""

from __future__ import annotations

from collections.abc import Callable

from deepdsl.onnx_import import activations, arithmetic, folded_ops, linear, normalisation, padding, shapes, spatial
from deepdsl.onnx_import.folding import FOLD_ONLY, FOLDED

SUPPORTED = (
    "Add", "AveragePool", "BatchNormalization", "Concat", "Constant", "Conv", "Div", "Dropout", "Flatten", "Gemm",
    "GlobalAveragePool", "Identity", "LRN", "LeakyRelu", "LogSoftmax", "MatMul", "MaxPool", "Mul", "ReduceMean",
    "Relu", "Reshape", "Sigmoid", "Softmax", "Sub", "Tanh",
    # issue 33
    "Clip", "ConvTranspose", "Expand", "Gelu", "HardSigmoid", "HardSwish", "LayerNormalization", "Pow", "Resize",
    "Slice", "Split", "Sqrt", "Transpose",
    # what deepdsl's own exports of networks/examples/ hold (siamese, vae, axis_ops, groupnorm_swish, ...)
    "Abs", "Exp", "Log", "ReduceMax", "ReduceSum",
    # instance normalisation (and nn.GroupNorm, which PyTorch exports through it: patterns.py), group normalisation
    "GroupNormalization", "InstanceNormalization",
    # activations as tensor functions of their formulas
    "Celu", "Elu", "Mish", "Neg", "PRelu", "Reciprocal", "Selu", "Softplus", "Softsign", "ThresholdedRelu",
    # padding: constant, reflect, edge and wrap modes
    "Pad",
    # the dynamo exporter's torch.split / chunk without its optimiser
    "SplitToSequence", "SequenceAt",
)  # fmt: skip


RULES: dict[str, Callable[..., None]] = {
    # spatial.py
    "Conv": spatial.conv, "ConvTranspose": spatial.conv_transpose, "MaxPool": spatial.pool("max_pool"),
    "AveragePool": spatial.pool("avg_pool"), "GlobalAveragePool": spatial.global_avg, "Resize": spatial.resize,
    # linear.py
    "Gemm": linear.gemm, "MatMul": linear.matmul,
    # arithmetic.py
    "Add": arithmetic.arith, "Sub": arithmetic.arith, "Mul": arithmetic.arith, "Div": arithmetic.arith,
    "Sqrt": arithmetic.sqrt, "Pow": arithmetic.pow_,
    # activations.py
    "Relu": activations.unary("relu"), "Sigmoid": activations.unary("sigmoid"), "Tanh": activations.unary("tanh"),
    "LeakyRelu": activations.leaky, "Gelu": activations.gelu, "Clip": activations.clip,
    "HardSigmoid": activations.hard_sigmoid, "HardSwish": activations.hard_swish,
    "Softmax": activations.softmax("softmax"), "LogSoftmax": activations.softmax("log_softmax"),
    "Dropout": activations.dropout, "Abs": activations.unary("abs"), "Exp": activations.unary("exp"),
    "Log": activations.unary("log"), "PRelu": activations.prelu,
    # normalisation.py
    "BatchNormalization": normalisation.batch_norm, "LRN": normalisation.lrn,
    "LayerNormalization": normalisation.layer_normalization,
    "InstanceNormalization": normalisation.instance_normalization,
    "GroupNormalization": normalisation.group_normalization,
    # shapes.py
    "Flatten": shapes.flatten, "Reshape": shapes.reshape, "Transpose": shapes.transpose, "Concat": shapes.concat,
    "Slice": shapes.slice_, "Split": shapes.split, "Expand": shapes.expand, "ReduceMean": shapes.reduce_mean,
    "ReduceSum": shapes.reduce_axes("sum"), "ReduceMax": shapes.reduce_axes("max"),
    "SplitToSequence": shapes.split_to_sequence, "SequenceAt": shapes.sequence_at,
    # padding.py
    "Pad": padding.pad,
    # folded_ops.py
    "Identity": folded_ops.identity, "Constant": folded_ops.constant,
    **{op: folded_ops.folded for op in (*FOLDED, *FOLD_ONLY)},
    # after the folded ones: Neg and Reciprocal of a computed tensor too (of constants, formula folds them)
    **{op: activations.formula for op in ("Celu", "Elu", "Mish", "Neg", "Reciprocal", "Selu", "Softplus", "Softsign",
                                          "ThresholdedRelu")},
}  # fmt: skip


assert set(RULES) == set(SUPPORTED) | set(FOLDED) | set(FOLD_ONLY)

# LSTM and GRU, and the nodes exporters write around them (deepdsl/onnx_import/recurrent.py)
from deepdsl.onnx_import import recurrent as _recurrent  # noqa: E402

RULES.update(_recurrent.rules(RULES))
SUPPORTED = tuple(sorted({*SUPPORTED, *_recurrent.SUPPORTED}))
