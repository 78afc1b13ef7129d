"""Import rules for the activations: Relu, Sigmoid, Tanh, LeakyRelu, Gelu (the exact form), Clip (`relu6`, `relu`
or `clip`), HardSigmoid, HardSwish, Softmax and LogSoftmax (over axis 1 of [N, K] or the last axis of any rank),
Dropout (the language's `dropout`; nothing at ratio 0); the activations the language has no built-in for (Elu,
Selu, Celu, Softplus, Softsign, Mish, ThresholdedRelu, Neg, Reciprocal) as element-wise tensor functions, and PRelu
as one whose parameter is the slope."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import import folded_ops
from deepdsl.onnx_import.rule_support import broadcast_read, inputs_const, positive_axis, signature
from deepdsl.onnx_import.writing import Node, call, need, num

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def unary(fn: str) -> Callable[..., None]:
    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")

    return rule


def leaky(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    alpha = float(attrs.get("alpha", 0.01))
    kw = {} if np.float32(alpha) == np.float32(0.01) else {"slope": num(alpha)}
    imp.bind(node, call(where, "leaky_relu", [imp.tensor(node.input[0], where)], kw))


def gelu(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    approx = attrs.get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else str(approx)
    if approx == "tanh":  # GPT-2's gelu_new: its formula as a tensor function
        formula(imp, k, node, where, attrs)
        return
    if approx != "none":
        raise where.refuse(f"approximate='{approx}': deepdsl imports the exact (erf) and the tanh forms")
    imp.bind(node, f"gelu({imp.tensor(node.input[0], where)})")


def clip(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    if imp.opset < 11 or len(node.input) > 1:
        low, high = (inputs_const(imp, node, where, 1) + [None, None])[:2]
        lo = None if low is None else float(low.reshape(-1)[0])
        hi = None if high is None else float(high.reshape(-1)[0])
    else:
        lo, hi = attrs.get("min"), attrs.get("max")
    x = imp.tensor(node.input[0], where)
    if lo == 0 and hi == 6:
        need(where, "relu6")
        imp.bind(node, f"relu6({x})")
    elif lo == 0 and hi is None:
        imp.bind(node, f"relu({x})")
    elif lo is None or hi is None:
        raise where.refuse("a Clip with one bound only (other than min=0): deepdsl's clip takes both")
    else:
        need(where, "clip")
        imp.bind(node, f"clip({x}, {num(lo)}, {num(hi)})")


def hard_sigmoid(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "hard_sigmoid")
    alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
    kw = []
    if np.float32(alpha) != np.float32(1 / 6):
        kw.append(f"alpha={num(alpha)}")
    if np.float32(beta) != np.float32(0.5):
        kw.append(f"beta={num(beta)}")
    imp.bind(node, f"hard_sigmoid({', '.join([imp.tensor(node.input[0], where), *kw])})")


def hard_swish(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    need(where, "hard_swish")
    imp.bind(node, f"hard_swish({imp.tensor(node.input[0], where)})")


def softmax(fn: str) -> Callable[..., None]:
    def rule(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
        if softmax_last(imp, node, where, attrs, fn):
            return
        rank = len(imp.shape(node.input[0], where))
        axis = int(attrs.get("axis", -1 if imp.opset >= 13 else 1))
        if rank != 2 or (axis + rank if axis < 0 else axis) != 1:
            raise where.refuse(f"axis={axis} of a rank-{rank} input: the language's {fn} is over axis 1 of [N, K]")
        imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")

    return rule


def softmax_last(imp: Importer, node: Any, where: Node, attrs: dict, fn: str) -> bool:
    """Softmax over the last axis of a rank > 2 input (attention's weights): `softmax(x, axis=-1)`; False where
    the node is something else."""
    rank = len(imp.shape(node.input[0], where))
    axis = int(attrs.get("axis", -1 if imp.opset >= 13 else 1))
    if rank <= 2 or positive_axis(axis, rank) != rank - 1:
        return False
    imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)}, axis=-1)")
    return True


def dropout(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    imp.only_output(node, where)
    ratio = float(attrs.get("ratio", 0.5))
    if len(node.input) > 1 and node.input[1]:
        r = imp.const(node.input[1])
        if r is None or r.size != 1:
            raise where.refuse("the ratio must be a constant number")
        ratio = float(r.reshape(-1)[0])
    if len(node.input) > 2 and node.input[2]:
        mode = imp.const(node.input[2])
        if mode is None or mode.size != 1 or bool(mode.reshape(-1)[0]):
            raise where.refuse("training_mode must be a constant false (export the model in eval mode)")
    if not 0 <= ratio < 1:
        raise where.refuse(f"ratio {ratio} lies outside [0, 1)")
    if ratio == 0:
        imp.env[node.output[0]] = x
        return
    imp.bind(node, call(where, "dropout", [x], {} if ratio == 0.5 else {"p": num(ratio)}))


# @ is the element `t[i0, ...]`; each formula is ONNX's definition (Softplus in the form that does not overflow)
_SOFTPLUS = "(max(@, 0) + log(1 + exp(-abs(@))))"
_FORMULAS: dict[str, Callable[[dict], str]] = {
    "Elu": lambda a: f"@ > 0 ? @ : {num(float(a.get('alpha', 1.0)))} * (exp(@) - 1)",
    "Celu": lambda a: (f"max(@, 0) + min(0, {num(float(a.get('alpha', 1.0)))} * (exp(@ / "
                       f"{num(float(a.get('alpha', 1.0)))}) - 1))"),
    "Selu": lambda a: (f"{num(float(a.get('gamma', 1.0507009873554805)))} * (@ > 0 ? @ : "
                       f"{num(float(a.get('alpha', 1.6732632423543772)))} * (exp(@) - 1))"),
    "Softplus": lambda a: _SOFTPLUS,
    "Softsign": lambda a: "@ / (1 + abs(@))",
    "Mish": lambda a: f"@ * tanh{_SOFTPLUS}",
    "ThresholdedRelu": lambda a: f"@ > {num(float(a.get('alpha', 1.0)))} ? @ : 0",
    "Neg": lambda a: "-@",
    "Gelu": lambda a: "0.5 * @ * (1 + tanh(0.7978845608028654 * (@ + 0.044715 * @ * @ * @)))",  # approximate='tanh'
    "Reciprocal": lambda a: "1 / @",
}  # fmt: skip


def formula(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """An element-wise activation as a tensor function of its ONNX formula, written once for each formula and rank
    and called for each node (its gradient derived like any other's)."""
    if imp.const(node.input[0]) is not None:  # Neg or Reciprocal of a constant (a shape computed): folded
        folded_ops.folded(imp, k, node, where, attrs)
        return
    shape = imp.shape(node.input[0], where)
    try:
        body = _FORMULAS[node.op_type](attrs)
    except ValueError as exc:  # num(): an attribute that is not finite
        raise where.refuse(str(exc)) from None
    idx = [f"i{d}" for d in range(len(shape))]
    key = (body, len(shape))
    if key not in imp.functions:
        fn = imp.functions[key] = imp.names.make(f"{node.op_type.lower()}_fn", "fn")
        element = f"t[{', '.join(idx)}]"
        imp.tensor_fns += [f"tensor {fn}({signature(len(shape))}) -> [{', '.join(idx)}] = "
                           f"{body.replace('@', element)}   # {node.op_type}", ""]  # fmt: skip
    imp.bind(node, f"{imp.functions[key]}({imp.tensor(node.input[0], where)})")


def prelu(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """PRelu: x where x >= 0, else slope · x, the slope (nn.PReLU's weight, one per channel or one for all) a
    trainable parameter of a tensor function, read where it broadcasts."""
    shape = imp.shape(node.input[0], where)
    slope = imp.const(node.input[1])
    if slope is None:
        raise where.refuse("the slope must be an initialiser (a constant)")
    try:
        if np.broadcast_shapes(shape, slope.shape) != tuple(shape) or slope.ndim > len(shape):
            raise ValueError
    except ValueError:
        raise where.refuse(f"the slope of shape {list(slope.shape)} would broadcast the input {list(shape)}") from None
    idx = [f"i{d}" for d in range(len(shape))]
    x = f"t[{', '.join(idx)}]"
    a = broadcast_read("a", slope.shape, len(shape))
    dims = ", ".join(map(str, slope.shape)) if slope.ndim else "1"
    fn = imp.names.make(f"{imp.names.clean(where.base, 'prelu')}_fn", "fn")
    imp.tensor_fns += [
        f"tensor {fn}({signature(len(shape))}) -> [{', '.join(idx)}] {{   # PRelu",
        f"  param a[{dims}] = constant(0.25)",
        f"  return {x} >= 0 ? {x} : {a} * {x}",
        "}",
        "",
    ]
    name = imp.layer(node, where, fn, {"a": slope.reshape(slope.shape or (1,))}, [node.input[1]])
    imp.bind(node, f"{name}({imp.tensor(node.input[0], where)})", name)
