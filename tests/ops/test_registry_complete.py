"""Every registry entry holds every fact its op needs, or the op is listed here as not needing it, with why.

`problems(registry)` is the checker: for each field of `OpDef` it knows which ops need it (the rest are exempt
by a named rule or an explicit entry below, each with its reason), reports a needed field that is missing and an
exemption that has gone stale (the field is there after all), and checks the yes/no facts against what the op
is. The tests below run it on the registry and on copies with one field broken, to show each check can fail.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from functools import partial

import numpy as np
import pytest
from oracle_inputs import op_inputs

import deepdsl.ops  # noqa: F401 — fills the registry

# isort: split
import deepdsl.backends.cuda  # noqa: F401 — attaches the CUDA fields to the entries
from deepdsl.backends.java import runtime_sources
from deepdsl.ir import REGISTRY, TensorType
from deepdsl.ir.indexexpr import IE, Apply, Reduce
from deepdsl.ir.registry import STORAGE, JavaCall, OpDef, lookup
from deepdsl.ir.types import DType, ShapeError
from deepdsl.ir.vendor import (
    BatchNorm,
    ConvBackwardBias,
    ConvBackwardData,
    ConvBackwardFilter,
    ConvForward,
    Gemm,
    Lrn,
    LrnBackward,
    Pool,
    PoolBackward,
    Softmax,
    SoftmaxBackward,
)

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
    "layer_norm_rows": ((X2,), {"eps": 1e-5}),
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
    "bn_apply": ((X4, C4, C4, C4, C4), {"eps": 1e-5}), "bn_train_apply": ((X4, C4, C4, C4, C4), {"eps": 1e-5}),
    "bn_train_backward": ((X4, X4, C4, C4, C4, C4, C4), {"eps": 1e-5}),
    "running_update": ((C4, C4), {"momentum": 0.1, "correction": 1.0}),
    "bn_invstd": ((C4,), {"eps": 1e-5}),
    "slice": ((X4,), {"axis": 1, "start": 1, "stop": 3}), "pad_axis": ((X4,), {"axis": 1, "start": 1, "size": 6}),
    "softmax_backward": ((X2, X2), {}), "log_softmax_backward": ((X2, X2), {}),
    "softmax_cross_entropy_backward": ((X2, LABELS, TensorType(())), {}),
    "cross_entropy_backward": ((X2, LABELS, TensorType(())), {}), "mse_backward": ((X4, X4, TensorType(())), {}),
    "sgd_plain": ((X4, X4), {"lr": 0.1, "weight_decay": 0.0}),
    "sgd_momentum": ((X4, X4, X4), {"momentum": 0.9, "weight_decay": 0.0}), "sgd_step": ((X4, X4), {"lr": 0.1}),
    "adam_moment": ((X4, X4), {"beta": 0.9, "power": 1}),
    "adam_step": ((X4, X4, X4, TensorType(())), {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    "adam_step_scheduled": ((X4, X4, X4, TensorType(()), TensorType(())), {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}),
    "sgd_plain_scheduled": ((X4, X4, TensorType(())), {"weight_decay": 0.0}),
    "sgd_step_scheduled": ((X4, X4, TensorType(())), {}),
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
    "layer_norm_rows_backward": ((X2, X2), {"eps": 1e-5}),
    # what vectorise maps tensor functions to
    "batch_matmul": ((TensorType((2, 3, 4)), TensorType((2, 5, 4))), {"transpose_b": True}),
    "sum_axes": ((X4,), {"axes": (0, 2)}),
    "transpose": ((X4,), {"perm": (0, 2, 3, 1)}),
    # the Transformer built-ins (issue 20)
    "gelu": ((X4,), {}), "gelu_grad": ((X4, X4), {}),
    "layer_norm": ((X2, TensorType((6,)), TensorType((6,))), {"eps": 1e-5}),
    "masked_softmax": ((X2,), {"scale": 0.5, "causal": True, "period": 2}),
    # token inputs
    "embedding": ((TensorType((2, 5), DType.I64), TensorType((7, 3))), {}),
    "embedding_backward": ((TensorType((2, 5), DType.I64), TensorType((2, 5, 3))), {"vocab": 7}),
    # image ops
    "resize_axis": ((X4,), {"axis": 2, "factor": 2, "mode": "bilinear"}),
    "resize_axis_backward": ((X4,), {"axis": 3, "factor": 2, "mode": "nearest", "size": 4}),
    # along axes (issue 34): explicit broadcasting, the maximum along axes and its gradient's arg-max mask
    "expand": ((TensorType((2, 1, 8, 1)),), {"shape": (2, 4, 8, 8)}), "max_axes": ((X4,), {"axes": (1, 3)}),
    "equal_mask": ((X4, X4), {}),
    # sampling in the graph (issue 34)
    "sample_normal": ((), {"shape": (2, 3), "site": "z"}),
    "sample_uniform": ((), {"shape": (2, 3), "site": "u", "low": -1.0, "high": 2.0}),
    "random_normal": ((TensorType((), DType.I64),), {"shape": (2, 3), "site": "z", "seed": 1}),
    "random_uniform": ((TensorType((), DType.I64),), {"shape": (2, 3), "site": "u", "seed": 1, "low": -1.0,
                                                      "high": 2.0}),
    # [optim] AdamW, RMSprop, Nesterov SGD (issue 34); lr_mult where an update reads the rate
    "adamw_step": ((X4, X4, X4, TensorType(())),
                   {"lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01, "lr_mult": 2.0}),
    "adamw_step_scheduled": ((X4, X4, X4, TensorType(()), TensorType(())),
                             {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}),
    "rmsprop_square": ((X4, X4, X4), {"alpha": 0.99, "weight_decay": 0.01}),
    "rmsprop_plain": ((X4, X4, X4), {"lr": 0.1, "eps": 1e-8, "weight_decay": 0.01}),
    "rmsprop_plain_scheduled": ((X4, X4, X4, TensorType(())), {"eps": 1e-8, "weight_decay": 0.0, "lr_mult": 0.5}),
    "rmsprop_momentum": ((X4, X4, X4, X4), {"momentum": 0.9, "eps": 1e-8, "weight_decay": 0.01}),
    "sgd_nesterov": ((X4, X4, X4), {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    "sgd_nesterov_scheduled": ((X4, X4, X4, TensorType(())), {"momentum": 0.9, "weight_decay": 0.0}),
    # activations and adaptive pooling (issue 34); clip at relu6's bounds, where its kinks are listed
    "hard_swish": ((X4,), {}), "hard_swish_grad": ((X4, X4), {}),
    "clip": ((X4,), {"low": 0.0, "high": 6.0}), "clip_grad": ((X4, X4), {"low": 0.0, "high": 6.0}),
    "silu": ((X4,), {}), "silu_grad": ((X4, X4), {}),
    "adaptive_pool_axis": ((X4,), {"axis": 2, "size": 3}),
    "adaptive_pool_axis_backward": ((TensorType((2, 4, 3, 8)),), {"axis": 2, "size": 8}),
    # data-parallel statements (issue 32, passes/data_parallel.py)
    "allreduce_start": ((TensorType(()), X2, C4), {"bucket": 0, "kind": "grad", "names": ("a", "b"), "sizes": (12, 4)}),
    "allreduce_wait": ((TensorType((16,)),), {"bucket": 0, "kind": "grad"}),
    "bucket_slice": ((TensorType((16,)),), {"offset": 12, "shape": (4,), "name": "b"}),
    "dropout_mask_at": ((TensorType((), DType.I64), TensorType((), DType.I64)),
                        {"shape": (2, 4, 8, 8), "p": 0.5, "site": "d", "seed": 1}),
    "random_normal_at": ((TensorType((), DType.I64), TensorType((), DType.I64)),
                         {"shape": (2, 3), "site": "z", "seed": 1}),
    "random_uniform_at": ((TensorType((), DType.I64), TensorType((), DType.I64)),
                          {"shape": (2, 3), "site": "u", "seed": 1, "low": -1.0, "high": 2.0}),
    "cast_bf16": ((X4,), {}),
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
    "global_avg_pool_backward": (2, 4, 8, 8), "embedding": (2, 5, 3), "embedding_backward": (7, 3),
    "resize_axis": (2, 4, 16, 8), "resize_axis_backward": (2, 4, 8, 4),
    "expand": (2, 4, 8, 8), "max_axes": (2, 8),
    "sample_normal": (2, 3), "sample_uniform": (2, 3), "random_normal": (2, 3), "random_uniform": (2, 3),
    "adaptive_pool_axis": (2, 4, 3, 8), "adaptive_pool_axis_backward": (2, 4, 8, 8),
    "allreduce_start": (16,), "allreduce_wait": (16,), "bucket_slice": (4,), "dropout_mask_at": (2, 4, 8, 8),
    "random_normal_at": (2, 3), "random_uniform_at": (2, 3),
}  # fmt: skip


# ---- who needs which field ----

# ops the train and infer programs rewrite into others (their `lower`): nothing runs them
LOWERED = {
    "batch_norm": "lowered to channel_mean, channel_var, running_update and bn_train_apply (bn_apply in inference)",
    "dropout": "lowered to dropout_mask * x in training, to x in inference",
    "layer_norm": "lowered to layer_norm_rows, then the scale and shift",
    "sample_normal": "lowered to random_normal in training, to a fill of 0 in inference",
    "sample_uniform": "lowered to random_uniform in training, to a fill of (low + high) / 2 in inference",
}
# ops whose statement carries its own index expression (attrs body, out): the backends compile that
FROM_BODY = {
    "fused": "its kernel is compiled from its body attribute",
    "indexed": "its kernel is compiled from its body attribute",
}
# ops only the NumPy runner runs: why the CUDA and Java backends have no kernel for them (yet)
NUMPY_ONLY = {
    "cast_bf16": "made only by passes/precision.py under --precision bf16; the CUDA runner and the Java program run it "
    "as its cuda_form's kernel (cuda/ops.py), which the Java CPU device runs as a copy (it runs bf16 programs in "
    "fp32)",
}
# differentiable ops of which eager autograd keeps no tensor for the backward pass (`saves` None)
KEEPS_NOTHING = {
    "add": "the gradients are g and g",
    "sub": "the gradients are g and -g",
    "neg": "the gradient is -g",
    "add_scalar": "the gradient is g",
    "mul_scalar": "the gradient is c * g, c an attribute",
    "rsub_scalar": "the gradient is -g",
    "bias_add": "the gradients are g and its channel sums",
    "reshape": "a view: the gradient is g reshaped",
    "concat": "the gradients are slices of g",
    "slice": "the gradient is g padded",
    "fill": "reads no input",
    "sum": "the gradient is g broadcast",
    "broadcast_channel": "the gradient is the channel sums of g",
    "broadcast_scalar": "the gradient is the sum of g",
    "channel_sum": "the gradient is g broadcast",
    "channel_mean": "the gradient is g broadcast and scaled",
    "bn_apply": "made only by batch_norm's lowering; the eager baseline counts batch_norm's own saves",
    "channel_var": "made only by batch_norm's lowering; the eager baseline counts batch_norm's own saves",
    "bn_train_apply": "made only by batch_norm's lowering; the eager baseline counts batch_norm's own saves",
    "layer_norm_rows": "made only by layer_norm's lowering; the eager baseline counts layer_norm's own saves",
    "transpose": "the gradient is g transposed back",
    "sum_axes": "the gradient is g expanded",
    "expand": "the gradient is the sums of g over the expanded axes",
}
NO_VJP = {"fill": "reads no input: there is nothing to differentiate"}
# data-parallel statements (ops/collective.py) that no shared kernel computes: each runner that trains data-parallel
# performs them itself (the NumPy runner in deepdsl/distributed/executor.py); a backend may still register a call
RUNNER_PERFORMS = {
    "allreduce_start": "a collective: the runner packs the bucket and starts its all-reduce (MPI, NCCL)",
    "dropout_mask_at": "a data-parallel draw: the NumPy runner's kernel and the Java CPU device's; no CUDA one yet",
    "random_normal_at": "a data-parallel draw: the NumPy runner's kernel and the Java CPU device's; no CUDA one yet",
    "random_uniform_at": "a data-parallel draw: the NumPy runner's kernel and the Java CPU device's; no CUDA one yet",
}
# cheap_to_recompute=True without an index form: why, and the FLOPs per output element it may cost
CHEAP_WITHOUT_INDEX_FORM = {
    "layer_norm_rows": ("a pass over its row: the sum, the centred squares, the scaling", 5),
    "dropout_mask": ("one random draw per element", 4),
    "dropout_mask_at": ("one random draw per element", 4),
    "masked_softmax": ("a softmax of each row: a max, an exp and a sum per element, no more", 6),
}
CHEAP_FLOPS = 4  # per output element: about one pass over the output
# a cheap_to_recompute rule (shapes decide): example calls where it must say yes and where it must say no
CHEAP_RULES = {
    "batch_matmul": (
        ((TensorType((8, 64, 16)), TensorType((8, 64, 16))), {"transpose_b": True}),  # attention's scores
        ((TensorType((8, 64, 64)), TensorType((8, 64, 16))), {}),  # probabilities times values
    ),
}

# Why an op needs no value in a field: (reason, whether the field must then be absent, because nothing would
# read it); None when the op needs the field.
Exemption = tuple[str, bool] | None


def _reduces(e: IE) -> bool:
    return isinstance(e, Reduce) or (isinstance(e, Apply) and any(_reduces(a) for a in e.args))


def _lowered(op: OpDef) -> Exemption:
    return (LOWERED[op.name], True) if op.name in LOWERED else None


def _exempt_vjp(op: OpDef) -> Exemption:
    if not op.differentiable:
        return "differentiable=False: never differentiated", True
    return _lowered(op) or ((NO_VJP[op.name], True) if op.name in NO_VJP else None)


def _exempt_saves(op: OpDef) -> Exemption:
    # lowered ops need theirs: the eager baseline is taken over the forward graph, before lowering
    if op.name in KEEPS_NOTHING:
        return KEEPS_NOTHING[op.name], True
    # an op made by a pass (batch_matmul) may say what eager autograd would keep of it: harmless
    return None if op.differentiable else ("differentiable=False: eager autograd keeps nothing of it", False)


def _exempt_index_form(op: OpDef) -> Exemption:
    return _lowered(op) or (None if op.elementwise else ("not element-wise: an index form is optional", False))


def _exempt_kernel(op: OpDef) -> Exemption:
    """Why the op needs no backend kernel of its own (CUDA rule, Java call): nothing would call one."""
    if op.view:
        return "a view: no kernel, its output aliases its input", True
    if op.index_form is not None:  # a Java call may serve it where it stands alone (`called`: bn_train_apply's)
        return "the backends write its kernel from its index form", not (op.java is not None and op.java.called)
    if op.name in RUNNER_PERFORMS:
        return RUNNER_PERFORMS[op.name], False
    if op.name in NUMPY_ONLY:
        return NUMPY_ONLY[op.name], False
    return _lowered(op) or ((FROM_BODY[op.name], True) if op.name in FROM_BODY else None)


# field -> (does the op have it, why it needs none)
NEEDS: dict[str, tuple[Callable[[OpDef], bool], Callable[[OpDef], Exemption]]] = {
    "doc": (lambda op: bool(op.doc), lambda op: None),
    "numpy": (lambda op: op.numpy is not None, _lowered),
    "flops": (lambda op: op.flops is not None, _lowered),
    "vjp": (lambda op: op.vjp is not None, _exempt_vjp),
    "saves": (lambda op: op.saves is not None, _exempt_saves),
    "index_form": (lambda op: op.index_form is not None, _exempt_index_form),
    "cuda": (lambda op: op.cuda is not None or op.cuda_form is not None, _exempt_kernel),
    "java": (lambda op: op.java is not None, _exempt_kernel),
    "numpy_ws": (
        lambda op: op.numpy_ws is not None,
        lambda op: None if op.workspace is not None else ("no workspace rule: no kernel runs in scratch", True),
    ),
}
FACTS = ("cheap_to_recompute", "accepts_epilogue", "inline_into_readers")  # checked by _fact_problems
# the other fields: what checks them
COVERED = {
    "cuda_form": "checked with cuda (a CUDA kernel or a CUDA index form)",
    "workspace": "optional (None: no scratch); checked with numpy_ws",
    "lower": "classifies the lowered ops: LOWERED must list exactly them",
    "name": "checked: the registry key",
    "shape": "run on EXAMPLES by test_every_op_has_a_working_shape_rule",
    "arity": "checked against EXAMPLES",
    "elementwise": "checked: an element-wise op's result has its first input's shape",
    "view": "checked: a view has no index form and no kernel fields",
    "differentiable": "decides who needs vjp and saves",
    "classifies": "checked: a classifying op is a differentiable scalar of (scores [N, K], labels [N])",
    "vendor": "optional (None: our kernels only); test_every_vendor_fact_computes_the_op runs it on EXAMPLES",
    "kinks": "optional (none: smooth); test_every_listed_kink_is_one and test_unlisted_ops_are_smooth check it",
    "storage": "optional (derived from view and elementwise); test_every_storage_fact_is_one_the_pass_knows",
}


def _fact_problems(op: OpDef) -> list[str]:
    """The yes/no facts against what the op is, on its example call."""
    if op.name in FROM_BODY:
        return []
    if op.name not in EXAMPLES:
        return ["no example call in EXAMPLES"]
    inputs, attrs = EXAMPLES[op.name]
    ex = (inputs, op.shape(inputs, attrs), attrs)
    form = op.index_form(*ex) if op.index_form else None
    per_element = op.flops(*ex) / max(ex[1].numel, 1) if op.flops else 0.0
    out = []
    if op.elementwise and op.index_form is not None and not op.cheap_to_recompute:
        out.append("element-wise with an index form but not cheap_to_recompute")
    if callable(op.cheap_to_recompute):
        if op.name not in CHEAP_RULES:
            out.append("a cheap_to_recompute rule without examples in CHEAP_RULES")
        elif [op.cheap_to_recompute(*call) for call in CHEAP_RULES[op.name]] != [True, False]:
            out.append("its cheap_to_recompute rule does not tell its CHEAP_RULES examples apart")
    elif op.cheap_to_recompute:
        listed = CHEAP_WITHOUT_INDEX_FORM.get(op.name)
        if form is None and not op.view and listed is None:
            out.append("cheap_to_recompute without an index form, not a view and not listed")
        if form is not None and _reduces(form):
            out.append("cheap_to_recompute but its index form reduces")
        if per_element > (listed[1] if listed else CHEAP_FLOPS):
            out.append(f"cheap_to_recompute but {per_element:g} FLOPs per output element")
    if op.accepts_epilogue and (op.index_form is not None or op.cuda is None or op.java is None):
        out.append("accepts_epilogue needs a library kernel: no index form, a CUDA kernel and a Java call")
    if op.inline_into_readers and (form is None or _reduces(form) or per_element > 1):
        out.append("inline_into_readers needs an index form without a reduction, at most one FLOP per element")
    if op.view and (op.index_form or op.cuda or op.cuda_form or op.java):
        out.append("a view with an index form or kernel fields")
    if op.elementwise and inputs and ex[1].shape != inputs[0].shape:
        out.append("element-wise but its result does not have its first input's shape")
    if op.classifies and not (op.differentiable and ex[1].shape == () and len(inputs) == 2
                              and inputs[0].rank == 2 and inputs[1].shape == inputs[0].shape[:1]):  # fmt: skip
        out.append("classifies, but it is not a differentiable scalar of (scores [N, K], labels [N])")
    if op.arity is not None and len(inputs) != op.arity:
        out.append(f"arity {op.arity} but its example has {len(inputs)} inputs")
    return out


def problems(registry: dict[str, OpDef]) -> list[str]:
    """Every missing field, stale exemption and wrong fact of `registry`, as "op: what"."""
    out = [f"{name}: registered as {op.name!r}" for name, op in registry.items() if op.name != name]
    lowered = {name for name, op in registry.items() if op.lower is not None}
    out += [f"{name}: has a lowering but is not in LOWERED" for name in sorted(lowered - set(LOWERED))]
    out += [f"{name}: in LOWERED but has no lowering" for name in sorted(set(LOWERED) & set(registry) - lowered)]
    for name, op in sorted(registry.items()):
        out += [f"{name}: {p}" for p in op_problems(op)]
    return out


def op_problems(op: OpDef) -> list[str]:
    """What one entry lacks, has although nothing reads it, or claims wrongly."""
    out = []
    for field, (has, exempt) in NEEDS.items():
        why = exempt(op)
        if why is None and not has(op):
            out.append(f"no {field}")
        elif why is not None and why[1] and has(op):
            out.append(f"has {field} although {why[0]}")
    return out + ([] if op.name in LOWERED else _fact_problems(op))


def test_every_op_has_every_fact() -> None:
    assert problems(REGISTRY) == []


def test_every_storage_fact_is_one_the_pass_knows() -> None:
    """--precision bf16 reads `stores` of every op: a known kind, and bf16 operands only for GEMMs and convolutions
    (ops that accumulate in fp32); no reduction or loss stores bf16 (the numerics of mixed precision)."""
    for name, op in REGISTRY.items():
        if callable(op.storage):  # a rule of the statement (fused, indexed): tests/test_precision_bf16.py
            continue
        assert op.stores() in STORAGE, name
        if op.stores() == "bf16":
            assert (
                op.accepts_epilogue and op.name in ("linear", "matmul", "batch_matmul") or op.name.startswith("conv2d")
            ), name
    fp32 = ("softmax_cross_entropy", "mse", "channel_sum", "channel_mean", "channel_var", "sum", "softmax",
            "layer_norm_rows", "running_update", "sgd_step", "sgd_momentum", "adam_moment", "adam_step")  # fmt: skip
    assert [name for name in fp32 if REGISTRY[name].stores() != "fp32"] == []
    assert REGISTRY["reshape"].stores() == "follow" and REGISTRY["relu"].stores() == "bf16_out"


def test_the_checker_covers_every_field_of_an_entry() -> None:
    fields = {f.name for f in dataclasses.fields(OpDef)}
    checked = set(NEEDS) | set(COVERED) | set(FACTS)
    assert fields == checked, f"fields no check covers: {fields - checked}; checks of no field: {checked - fields}"


def _without(name: str, **change: object) -> dict[str, OpDef]:
    copy = dict(REGISTRY)
    copy[name] = dataclasses.replace(REGISTRY[name], **change)
    return copy


@pytest.mark.parametrize(
    "name, change, reported",
    [
        ("relu", {"numpy": None}, "relu: no numpy"),
        ("conv2d", {"flops": None}, "conv2d: no flops"),
        ("tanh", {"vjp": None}, "tanh: no vjp"),
        ("max_pool2d", {"saves": None}, "max_pool2d: no saves"),
        ("softmax", {"cuda": None}, "softmax: no cuda"),
        ("slice", {"cuda_form": None}, "slice: no cuda"),
        ("lrn", {"java": None}, "lrn: no java"),
        ("mul", {"index_form": None}, "mul: no index_form"),
        ("conv2d", {"numpy_ws": None}, "conv2d: no numpy_ws"),
        ("argmax", {"doc": ""}, "argmax: no doc"),
        ("add", {"saves": REGISTRY["relu"].saves}, "add: has saves although the gradients are g and g"),
        ("relu", {"java": JavaCall("CpuLosses", ())}, "relu: has java although the backends write its kernel"),
        ("bn_apply", {"cheap_to_recompute": False}, None),  # not element-wise: may be either
        ("sigmoid", {"cheap_to_recompute": False}, "sigmoid: element-wise with an index form but not cheap"),
        ("channel_sum", {"cheap_to_recompute": True}, "channel_sum: cheap_to_recompute but its index form reduces"),
        ("softmax", {"cheap_to_recompute": True}, "softmax: cheap_to_recompute without an index form"),
        ("batch_matmul", {"cheap_to_recompute": True}, "batch_matmul: cheap_to_recompute without an index form"),
        ("matmul", {"cheap_to_recompute": lambda types, a: True}, "matmul: a cheap_to_recompute rule without"),
        ("batch_matmul", {"cheap_to_recompute": lambda types, a: True}, "batch_matmul: its cheap_to_recompute rule"),
        ("relu", {"accepts_epilogue": True}, "relu: accepts_epilogue needs a library kernel"),
        ("slice", {"accepts_epilogue": True}, "slice: accepts_epilogue needs a library kernel"),
        ("sum", {"inline_into_readers": True}, "sum: inline_into_readers needs an index form without a reduction"),
        ("dropout", {"lower": None}, "dropout: in LOWERED but has no lowering"),
        ("add", {"arity": 3}, "add: arity 3 but its example has 2 inputs"),
    ],
)
def test_the_checker_reports_a_broken_entry(name: str, change: dict, reported: str | None) -> None:
    found = problems(_without(name, **change))
    if reported is None:
        assert found == []
    else:
        assert any(p.startswith(reported) for p in found), found


# the OpDef fields behind each field of NEEDS, and the empty value that removes them
REMOVE = {"doc": {"doc": ""}, "cuda": {"cuda": None, "cuda_form": None}}


@pytest.mark.parametrize("field", sorted(NEEDS))
def test_removing_a_needed_field_from_any_entry_is_reported(field: str) -> None:
    has, exempt = NEEDS[field]
    needing = [op for op in REGISTRY.values() if exempt(op) is None]
    assert needing, f"no op needs {field}"
    for op in needing:
        broken = dataclasses.replace(op, **REMOVE.get(field, {field: None}))
        assert f"no {field}" in op_problems(broken), op.name


def test_the_checker_reports_an_op_missing_from_the_lists() -> None:
    copy = dict(REGISTRY)
    copy["softplus"] = dataclasses.replace(REGISTRY["softmax"], name="softplus", numpy=None, java=None)
    found = problems(copy)
    assert "softplus: no numpy" in found and "softplus: no java" in found


# ---- each Java call against the runtime's sources ----


def java_methods(text: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """Method -> its (type, name) parameters, of every `public static void` method of one Java source."""
    out = {}
    for method, params in re.findall(r"public static void (\w+)\(([^)]*)\)", text):
        out[method] = tuple(tuple(p.split()[-2:]) for p in params.split(",") if p.strip())
    return out


def java_mismatches(registry: dict[str, OpDef], sources: dict[str, str]) -> list[str]:
    """Every Java call of `registry` that is not a method of the runtime `sources` (file name -> text)."""
    classes = {op.java.cls for op in registry.values() if op.java is not None}
    methods = {(cls, m): ps for cls in classes for m, ps in java_methods(sources.get(f"{cls}.java", "")).items()}
    out = []
    for name, op in sorted(registry.items()):
        if op.java is None:
            continue
        params = methods.get((op.java.cls, name))
        if params is None:
            out.append(f"{name}: no method {op.java.cls}.{name} in the runtime")
            continue
        if params[:1] != (("Buf", "out"),) or params[1:] != op.java.params:
            out.append(f"{name}: declared {op.java.params}, {op.java.cls}.java has {params[1:]}")
        # the step counter and a data-parallel shard's sample offset are inputs passed as longs
        tensors = sum(t == "Buf" for t, _ in op.java.params) + sum(n in ("step", "offset") for _, n in op.java.params)
        if op.java.inputs_as_array != (op.arity is None) or (op.arity is not None and tensors != op.arity):
            out.append(f"{name}: {tensors} tensors in its Java call for arity {op.arity}")
    return out


def test_every_java_call_is_a_runtime_method() -> None:
    assert java_mismatches(REGISTRY, runtime_sources()) == []


def test_a_java_call_that_differs_from_the_runtime_is_reported() -> None:
    wrong = JavaCall("CpuNormalisation", (("Buf", "x"), ("int", "size"), ("float", "alpha")))
    moved = JavaCall("Workspace", REGISTRY["lrn"].java.params)
    assert java_mismatches(_without("lrn", java=wrong), runtime_sources())[0].startswith("lrn: declared")
    assert java_mismatches(_without("lrn", java=moved), runtime_sources()) == [
        "lrn: no method Workspace.lrn in the runtime"
    ]
    sources = dict(runtime_sources())
    sources["CpuNormalisation.java"] = sources["CpuNormalisation.java"].replace(
        "lrn(Buf out, Buf x, float alpha", "lrn(Buf out, Buf x, double alpha"
    )
    assert [p.split(":")[0] for p in java_mismatches(REGISTRY, sources)] == ["lrn"]


# ---- shape rules ----


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


def _slopes(op: OpDef, index: int, at: float, h: float = 1e-3) -> tuple[float, float, float]:
    """The op's one-sided slopes left and right of `at` in input `index` (the other inputs 1), and its jump."""
    types, attrs = EXAMPLES[op.name]

    def f(v: float) -> float:
        xs = [np.full(t.shape, v if k == index else 1.0) for k, t in enumerate(types)]
        return float(op.numpy(tuple(xs), attrs).ravel()[0])

    return (f(at) - f(at - h)) / h, (f(at + h) - f(at)) / h, f(at + h) - f(at - h)


def _is_kink(op: OpDef, index: int, at: float) -> bool:
    left, right, jump = _slopes(op, index, at)
    return not np.isclose(left, right, rtol=1e-2, atol=1e-2) or abs(jump) > 0.1


KINKED = [(name, i, v) for name, op in sorted(REGISTRY.items()) for i, v in op.kinks]


@pytest.mark.parametrize(("name", "index", "at"), KINKED, ids=[f"{n}-{i}-{v}" for n, i, v in KINKED])
def test_every_listed_kink_is_one(name: str, index: int, at: float) -> None:
    """Each (input, value) of an op's `kinks` is a point where its slope or value jumps: the oracles sample them."""
    assert _is_kink(REGISTRY[name], index, at)


SMOOTH_PROBES = (-3.0, -1.0, 0.0, 1.0, 3.0)  # ReLU's and hard-swish's kinks among them


def test_unlisted_ops_are_smooth() -> None:
    """An element-wise op of one input with no listed kink is smooth at the usual kink points (so a new op with a
    kink there, and no `kinks` entry, is reported); the check itself finds ReLU's."""
    from oracle_inputs import NONNEGATIVE, POSITIVE

    unary = [op for op in REGISTRY.values() if op.elementwise and op.arity == 1 and op.numpy]
    unary = [op for op in unary if op.name not in POSITIVE | NONNEGATIVE]  # log, sqrt: undefined left of 0
    assert len(unary) > 8
    missing = [(op.name, at) for op in unary if not op.kinks for at in SMOOTH_PROBES if _is_kink(op, 0, at)]
    assert missing == []
    assert _is_kink(REGISTRY["relu"], 0, 0.0) and not _is_kink(REGISTRY["relu"], 0, 1.0)
    assert not _is_kink(REGISTRY["sigmoid"], 0, 0.0)


def test_lookup_suggests_the_nearest_op() -> None:
    with pytest.raises(KeyError, match="did you mean 'conv2d'"):
        lookup("conv2")


def device_mismatches(registry: dict[str, OpDef], device_source: str) -> list[str]:
    """Every op a generated step calls as a library op (a Java call, no index form of its own or for CUDA) whose
    Device method is not in Device.java with the call's parameters (the workspace limit is the device's own; a call
    with `workspace` takes the statement's planned workspace last)."""
    methods = {
        m: tuple(tuple(p.split()[-2:]) for p in ps.split(",") if p.strip())
        for m, ps in re.findall(r"\bvoid (\w+)\(([^)]*)\);", device_source)
    }
    out = []
    for name, op in sorted(registry.items()):
        if op.java is None or op.index_form is not None or op.cuda_form is not None:
            continue
        params = methods.get(op.java.device)
        want = (("Buf", "out"), *(p for p in op.java.params if p != ("long", "limit")))
        want += (("Buf", "workspace"),) if op.java.workspace else ()  # the planned workspace, last
        if params != want:
            out.append(f"{name}: Device.{op.java.device} is {params}, its Java call {want}")
    return out


def test_every_library_call_names_its_device_method() -> None:
    device = runtime_sources()["Device.java"]
    assert device_mismatches(REGISTRY, device) == []
    assert all(len(op.java.keys) == len(op.java.attributes) for op in REGISTRY.values() if op.java is not None)
    renamed = dataclasses.replace(REGISTRY["lrn"].java, device="localResponseNorm")
    want = (("Buf", "out"), *REGISTRY["lrn"].java.params)
    assert device_mismatches(_without("lrn", java=renamed), device) == [
        f"lrn: Device.localResponseNorm is None, its Java call {want}"
    ]


# ---- vendor facts (ir/vendor.py) ----


def gemm_reference(g: Gemm, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What a Gemm fact says, on the flat row-major buffers of its operands (as cuBLAS gets them)."""
    a3 = a.reshape(g.batch, *((g.k, g.m) if g.transpose_a else (g.m, g.k)))
    b3 = b.reshape(g.batch, *((g.n, g.k) if g.transpose_b else (g.k, g.n)))
    return (np.swapaxes(a3, 1, 2) if g.transpose_a else a3) @ (np.swapaxes(b3, 1, 2) if g.transpose_b else b3)


def conv_reference(c: ConvForward, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """What a ConvForward fact says, on flat NCHW buffers: one output element at a time, from the definition."""
    x4, w4 = x.reshape(c.n, c.c, c.h, c.w), w.reshape(c.f, c.c // c.groups, c.kh, c.kw)
    (sh, sw), (ph, pw) = c.stride, c.pad
    xp = np.pad(x4, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((c.n, c.f, c.oh, c.ow), np.float32)
    per = c.f // c.groups
    for f in range(c.f):
        g = f // per
        channels = xp[:, g * (c.c // c.groups) : (g + 1) * (c.c // c.groups)]
        for i in range(c.oh):
            for j in range(c.ow):
                window = channels[:, :, i * sh : i * sh + c.kh, j * sw : j * sw + c.kw]
                y[:, f, i, j] = (window * w4[f]).sum(axis=(1, 2, 3))
    return y


def _windows(c: ConvForward | Pool, x4: np.ndarray, fill: float) -> np.ndarray:
    """x4 [n, c, h, w] padded with `fill`, as windows [n, c, oh, ow, kh, kw] (a copy)."""
    (kh, kw), (sh, sw), (ph, pw) = ((c.kh, c.kw) if isinstance(c, ConvForward) else c.kernel), c.stride, c.pad
    xp = np.pad(x4, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    out = np.empty((*x4.shape[:2], c.oh, c.ow, kh, kw), x4.dtype)
    for i in range(c.oh):
        for j in range(c.ow):
            out[:, :, i, j] = xp[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
    return out


def conv_data_reference(c: ConvForward, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    """What a ConvBackwardData fact says: every product of dY and W added onto the input element it multiplied."""
    g4, w4 = g.reshape(c.n, c.f, c.oh, c.ow), w.reshape(c.f, c.c // c.groups, c.kh, c.kw)
    (sh, sw), (ph, pw), cg, per = c.stride, c.pad, c.c // c.groups, c.f // c.groups
    dxp = np.zeros((c.n, c.c, c.h + 2 * ph, c.w + 2 * pw), np.float64)
    for f in range(c.f):
        channels = slice(f // per * cg, (f // per + 1) * cg)
        for i in range(c.oh):
            for j in range(c.ow):
                dxp[:, channels, i * sh : i * sh + c.kh, j * sw : j * sw + c.kw] += (
                    g4[:, f, i, j, None, None, None] * w4[f]
                )
    return dxp[:, :, ph : ph + c.h, pw : pw + c.w]


def conv_filter_reference(c: ConvForward, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """What a ConvBackwardFilter fact says: dW[f] = the sum over images and output pixels of dY times the window."""
    win = _windows(c, x.reshape(c.n, c.c, c.h, c.w), 0.0)  # n, c, oh, ow, kh, kw
    g4, cg, per = g.reshape(c.n, c.f, c.oh, c.ow), c.c // c.groups, c.f // c.groups
    dw = np.zeros((c.f, cg, c.kh, c.kw), np.float64)
    for f in range(c.f):
        dw[f] = np.einsum("nhw,nchwij->cij", g4[:, f], win[:, f // per * cg : (f // per + 1) * cg])
    return dw


def pool_reference(p: Pool, x: np.ndarray) -> np.ndarray:
    """What a Pool fact says: each window's maximum (padding never one) or its sum over kh * kw."""
    win = _windows(p, x.reshape(p.n, p.c, p.h, p.w), -np.inf if p.mode == "max" else 0.0)
    return win.max(axis=(4, 5)) if p.mode == "max" else win.sum(axis=(4, 5)) / (p.kernel[0] * p.kernel[1])


def pool_backward_reference(p: Pool, *inputs: np.ndarray) -> np.ndarray:
    """What a PoolBackward fact says: each dY to its window's first maximum in x (row-major), or spread evenly."""
    (kh, kw), (sh, sw), (ph, pw) = p.kernel, p.stride, p.pad
    g4 = inputs[-1].reshape(p.n, p.c, p.oh, p.ow)
    win = _windows(p, inputs[0].reshape(p.n, p.c, p.h, p.w), -np.inf) if p.mode == "max" else None
    dxp = np.zeros((p.n, p.c, p.h + 2 * ph, p.w + 2 * pw), np.float64)
    for n in range(p.n):
        for ch in range(p.c):
            for i in range(p.oh):
                for j in range(p.ow):
                    if win is None:
                        dxp[n, ch, i * sh : i * sh + kh, j * sw : j * sw + kw] += g4[n, ch, i, j] / (kh * kw)
                    else:
                        a, b = divmod(int(np.argmax(win[n, ch, i, j])), kw)  # argmax: the first maximum
                        dxp[n, ch, i * sh + a, j * sw + b] += g4[n, ch, i, j]
    return dxp[:, :, ph : ph + p.h, pw : pw + p.w]


def softmax_reference(s: Softmax, x: np.ndarray) -> np.ndarray:
    """What a Softmax fact says: each row's exp over the sum of its exps (or its log), in float64."""
    rows = x.reshape(s.rows, s.k).astype(np.float64)
    z = rows - rows.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True)) if s.log else np.exp(z) / np.exp(z).sum(1, keepdims=True)


def softmax_backward_reference(s: Softmax, y: np.ndarray, g: np.ndarray) -> np.ndarray:
    """What a SoftmaxBackward fact says: the Jacobian of each row's softmax (or log softmax) at y, applied to g."""
    y2, g2 = y.reshape(s.rows, s.k).astype(np.float64), g.reshape(s.rows, s.k).astype(np.float64)
    out = np.empty_like(y2)
    for r in range(s.rows):
        p = np.exp(y2[r]) if s.log else y2[r]
        jacobian = np.eye(s.k) - p[None, :] if s.log else np.diag(p) - np.outer(p, p)  # d out_i / d x_j
        out[r] = jacobian.T @ g2[r]
    return out


def lrn_reference(r: Lrn, x: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    """What an Lrn fact says (the window (size - 1) / 2 channels either side), and for LrnBackward (inputs x, y,
    dY) the exact gradient of that in float64, by the chain rule one channel pair at a time."""
    x4 = x.reshape(r.n, r.c, r.h, r.w).astype(np.float64)
    half = (r.size - 1) // 2
    window = [range(max(0, c - half), min(r.c, c + half + 1)) for c in range(r.c)]
    s = np.stack([r.k + r.alpha / r.size * sum(x4[:, j] ** 2 for j in window[c]) for c in range(r.c)], axis=1)
    if not rest:
        return x4 * s**-r.beta
    g4 = rest[-1].reshape(x4.shape).astype(np.float64)
    dx = g4 * s**-r.beta
    for c in range(r.c):  # y_c = x_c s_c^-beta: through s_c, every x_j of c's window
        for j in window[c]:
            dx[:, j] -= g4[:, c] * x4[:, c] * r.beta * s[:, c] ** (-r.beta - 1) * 2 * r.alpha / r.size * x4[:, j]
    return dx


def batch_norm_reference(fact: BatchNorm, x: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    """What a BatchNorm fact says (inputs x, mean, var, gamma, beta), in float64."""
    b = fact
    x3 = x.reshape(b.n, b.c, b.h * b.w).astype(np.float64)
    mean, var, gamma, beta = (v.astype(np.float64)[None, :, None] for v in rest)
    return (x3 - mean) / np.sqrt(var + b.eps) * gamma + beta


def test_bn_train_backward_is_dy_times_the_jacobian_of_the_normalised_values() -> None:
    """bn_train_backward (no vendor fact: our one pass on every device) on x's own saved statistics and sums: dY times
    the Jacobian of each channel's normalised values, written out element pair by element pair in float64."""
    rng = np.random.default_rng(0)
    n, c, h, w, eps = 2, 3, 2, 3, 1e-5
    x, g = rng.standard_normal((n, c, h, w)), rng.standard_normal((n, c, h, w))
    gamma = rng.standard_normal(c)
    axes = (0, 2, 3)
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    xh = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)
    xs = (x, g, mean, 1 / np.sqrt(var + eps), gamma, (g * xh).sum(axis=axes), g.sum(axis=axes))
    x3, g3 = x.reshape(n, c, h * w), g.reshape(n, c, h * w)
    want = np.zeros_like(x3)
    for k in range(c):
        v, dy = x3[:, k].ravel(), g3[:, k].ravel()
        centred, m = v - v.mean(), v.size
        r = 1 / np.sqrt(np.mean(centred**2) + eps)
        jacobian = r * (np.eye(m) - 1 / m) - r**3 * np.outer(centred, centred) / m  # d xh_i / d x_j
        want[:, k] = (gamma[k] * dy @ jacobian).reshape(n, -1)
    got = REGISTRY["bn_train_backward"].numpy(xs, {"eps": eps})
    np.testing.assert_allclose(got, want.reshape(x.shape), rtol=1e-9, atol=1e-12)


def _fact_check(fact: object) -> tuple[tuple[int, ...], Callable[..., np.ndarray]] | None:
    """The element counts a vendor fact expects of its inputs and output, and its reference; None: unknown."""
    if isinstance(fact, Gemm):
        f = fact
        return (f.batch * f.m * f.k, f.batch * f.k * f.n, f.batch * f.m * f.n), partial(gemm_reference, f)
    if isinstance(fact, ConvForward | ConvBackwardData | ConvBackwardFilter):
        c = fact if isinstance(fact, ConvForward) else fact.conv
        x, w, y = c.n * c.c * c.h * c.w, c.f * c.c // c.groups * c.kh * c.kw, c.n * c.f * c.oh * c.ow
        if isinstance(fact, ConvForward):
            return (x, w, y), partial(conv_reference, c)
        if isinstance(fact, ConvBackwardData):
            return (y, w, x), partial(conv_data_reference, c)
        return (x, y, w), partial(conv_filter_reference, c)
    if isinstance(fact, ConvBackwardBias):
        b = fact
        return (b.n * b.c * b.h * b.w, b.c), lambda g: g.reshape(b.n, b.c, b.h * b.w).sum(axis=(0, 2), dtype=np.float64)
    if isinstance(fact, Softmax | SoftmaxBackward):
        s = fact if isinstance(fact, Softmax) else fact.softmax
        size = s.rows * s.k
        if isinstance(fact, Softmax):
            return (size, size), partial(softmax_reference, s)
        return (size, size, size), partial(softmax_backward_reference, s)
    if isinstance(fact, Lrn | LrnBackward):
        r = fact if isinstance(fact, Lrn) else fact.lrn
        size = r.n * r.c * r.h * r.w
        return ((size,) * 2 if isinstance(fact, Lrn) else (size,) * 4), partial(lrn_reference, r)
    if isinstance(fact, BatchNorm):
        size = fact.n * fact.c * fact.h * fact.w
        return (size, *(fact.c,) * 4, size), partial(batch_norm_reference, fact)
    if isinstance(fact, Pool | PoolBackward):
        p = fact if isinstance(fact, Pool) else fact.pool
        x, y = p.n * p.c * p.h * p.w, p.n * p.c * p.oh * p.ow
        if isinstance(fact, Pool):
            return (x, y), partial(pool_reference, p)
        return ((x, y, y, x) if p.mode == "max" else (y, x)), partial(pool_backward_reference, p)
    return None


def vendor_problems(op: OpDef, inputs: tuple[TensorType, ...], attrs: dict) -> list[str]:
    """The op's vendor fact, interpreted on random inputs of the example call, against its NumPy kernel."""
    out_type = op.shape(inputs, attrs)
    fact = op.vendor(inputs, out_type, attrs) if op.vendor else None
    if fact is None:
        return []
    rng = np.random.default_rng(0)
    xs = op_inputs(op, inputs, rng)  # float64, both signs, zeros, kinks (tests/oracle_inputs.py)
    if isinstance(fact, PoolBackward) and len(xs) == 3:  # max: y must be the pooling of x, or nothing is routed
        xs = (xs[0], REGISTRY["max_pool2d"].numpy(xs[:1], attrs), xs[2])
    if isinstance(fact, SoftmaxBackward):  # y must be a softmax (log softmax) output
        xs = (REGISTRY["log_softmax" if fact.softmax.log else "softmax"].numpy(xs[:1], {}), xs[1])
    if isinstance(fact, LrnBackward):  # y must be the lrn of x
        xs = (xs[0], REGISTRY["lrn"].numpy(xs[:1], attrs), xs[2])
    check = _fact_check(fact)
    if check is None:
        return [f"{op.name}: a vendor fact no check knows ({type(fact).__name__})"]
    sizes, reference = check
    if sizes != (*(x.size for x in xs), out_type.numel):
        return [f"{op.name}: {fact} does not fit its inputs {inputs}"]
    got = reference(*(x.ravel() for x in xs)).reshape(out_type.shape)
    if np.allclose(got, op.numpy(xs, attrs), rtol=1e-5, atol=1e-6):
        return []
    return [f"{op.name}: {fact} is not what the op computes"]


VENDOR_CALLS = [(name, *EXAMPLES[name]) for name, op in sorted(REGISTRY.items()) if op.vendor is not None]
VENDOR_CALLS += [("matmul", (TensorType((6, 2)), TensorType((3, 6))), {"transpose_a": True, "transpose_b": True}),
                 ("batch_matmul", (TensorType((2, 4, 3)), TensorType((2, 4, 5))), {"transpose_a": True}),
                 ("conv2d", (TensorType((2, 4, 9, 8)), TensorType((6, 2, 3, 2))),
                  {"stride": (2, 1), "pad": (0, 1), "groups": 2}),
                 ("conv2d_backward_data", (TensorType((2, 6, 4, 9)), TensorType((6, 2, 3, 2))),
                  {"stride": (2, 1), "pad": (0, 1), "groups": 2, "in_shape": (2, 4, 9, 8)}),
                 ("conv2d_backward_filter", (TensorType((2, 4, 9, 8)), TensorType((2, 6, 4, 9))),
                  {"stride": (2, 1), "pad": (0, 1), "groups": 2, "w_shape": (6, 2, 3, 2)}),
                 ("max_pool2d_backward", (TensorType((2, 2, 9, 8)), TensorType((2, 2, 5, 8)), TensorType((2, 2, 5, 8))),
                  {"kernel": (3, 3), "stride": (2, 1), "pad": (1, 1)}),
                 ("lrn", (X4,), {"size": 3, "alpha": 0.3, "beta": 0.75, "k": 2.0}),
                 ("lrn_backward", (X4, X4, X4), {"size": 3, "alpha": 0.3, "beta": 0.75, "k": 2.0}),
                 ("channel_sum", (TensorType((2, 3)),), {}),
                 ("channel_sum", (TensorType((2, 3, 4)),), {}),
                 ("channel_sum", (TensorType((2, 3, 4, 2, 2)),), {}),
                 ("avg_pool2d_backward", (TensorType((1, 2, 5, 2)),),
                  {"kernel": (3, 2), "stride": (1, 2), "pad": (1, 0), "in_shape": (1, 2, 5, 5)})]  # fmt: skip


@pytest.mark.parametrize(("name", "inputs", "attrs"), VENDOR_CALLS, ids=[c[0] for c in VENDOR_CALLS])
def test_every_vendor_fact_computes_the_op(name: str, inputs: tuple, attrs: dict) -> None:
    assert vendor_problems(REGISTRY[name], inputs, attrs) == []


def test_a_wrong_vendor_fact_is_reported() -> None:
    """linear is x @ W^T: a fact without the transpose (or with the sizes swapped) computes something else."""
    inputs, attrs = (TensorType((2, 6)), TensorType((6, 6))), {}  # square W: the wrong fact fits the shapes
    wrong = dataclasses.replace(REGISTRY["linear"], vendor=lambda types, out, a: Gemm(1, 2, 6, 6, False, False))
    assert vendor_problems(wrong, inputs, attrs) == ["linear: Gemm(batch=1, m=2, n=6, k=6, transpose_a=False, "
                                                     "transpose_b=False) is not what the op computes"]  # fmt: skip
    misfit = dataclasses.replace(REGISTRY["linear"], vendor=lambda types, out, a: Gemm(1, 6, 2, 6, False, True))
    assert vendor_problems(misfit, *EXAMPLES["linear"])[0].startswith("linear: Gemm(batch=1, m=6, n=2")
    conv = REGISTRY["conv2d"]
    no_pad = dataclasses.replace(conv, vendor=lambda t, o, a: dataclasses.replace(conv.vendor(t, o, a), pad=(0, 0)))
    inputs, attrs = (TensorType((1, 2, 5, 5)), TensorType((3, 2, 1, 1))), {"stride": (1, 1), "pad": (1, 1), "groups": 1}
    assert vendor_problems(no_pad, inputs, attrs)[0].endswith("is not what the op computes")  # 1x1: sizes still fit
    data = REGISTRY["conv2d_backward_data"]
    shifted = dataclasses.replace(data, vendor=lambda t, o, a: ConvBackwardData(dataclasses.replace(
        data.vendor(t, o, a).conv, stride=(1, 1), pad=(1, 1))))  # fmt: skip
    inputs, attrs = next(c[1:] for c in VENDOR_CALLS if c[0] == "conv2d_backward_data" and c[2]["stride"] == (2, 1))
    assert vendor_problems(shifted, inputs, attrs)[0].endswith("is not what the op computes")
    pool = REGISTRY["avg_pool2d_backward"]
    as_max = dataclasses.replace(pool, vendor=lambda t, o, a: PoolBackward(dataclasses.replace(
        pool.vendor(t, o, a).pool, pad=(0, 1))))  # fmt: skip
    padded = next(c[1:] for c in VENDOR_CALLS if c[0] == "avg_pool2d_backward" and c[2]["pad"] == (1, 0))
    assert vendor_problems(as_max, *padded)[0].endswith("is not what the op computes")
    lrn = REGISTRY["lrn_backward"]  # an even window is not cuDNN's: no fact; a fact that claims one is wrong
    even = {"size": 4, "alpha": 0.3, "beta": 0.75, "k": 2.0}
    assert lrn.vendor((X4,) * 3, X4, even) is None and REGISTRY["lrn"].vendor((X4,), X4, even) is None
    claims = dataclasses.replace(lrn, vendor=lambda t, o, a: LrnBackward(Lrn(*o.shape, a["size"], a["alpha"],
                                                                             a["beta"], a["k"])))  # fmt: skip
    assert vendor_problems(claims, (X4,) * 3, even)[0].endswith("is not what the op computes")
    soft = REGISTRY["softmax_backward"]
    as_log = dataclasses.replace(soft, vendor=lambda t, o, a: SoftmaxBackward(Softmax(*o.shape, log=True)))
    assert vendor_problems(as_log, *EXAMPLES["softmax_backward"])[0].endswith("is not what the op computes")
    channels = REGISTRY["channel_sum"]  # the last axis read as the channels: sizes fit, sums do not
    last = dataclasses.replace(channels, vendor=lambda t, o, a: ConvBackwardBias(6, 3, 1, 1))
    assert vendor_problems(last, (TensorType((2, 3, 3)),), {})[0].endswith("is not what the op computes")
