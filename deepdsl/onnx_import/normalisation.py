"""Import rules for the normalisations: BatchNormalization (a trainable `batch_norm` with its running statistics,
epsilon and momentum), LRN (odd sizes), LayerNormalization over the last axis (a `layer_norm` layer, which
patterns.py writes for the decomposed form too) and InstanceNormalization (`instance_norm`; patterns.py writes
`group_norm` for the form PyTorch exports nn.GroupNorm in) and GroupNormalization (a trainable `group_norm`: opset
18's scale and bias per group repeated over each group's channels, opset 21's per channel; its output's shape is
its input's, which reading.py's skeleton supplies where ONNX's shape inference gives none)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.rule_support import inputs_const, module_parameter, positive_axis
from deepdsl.onnx_import.writing import Node, attr, call, num

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def batch_norm(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    stats = [imp.const(i) for i in node.input[1:5]]
    if len(stats) != 4 or any(s is None for s in stats):
        raise where.refuse("scale, B, mean and var must be initialisers (constants)")
    if int(attrs.get("training_mode", 0)):
        raise where.refuse("training_mode=1 is not supported; export the model in inference (eval) mode")
    imp.only_output(node, where)
    if len(imp.shape(node.input[0], where)) not in (2, 3, 4):
        raise where.refuse("deepdsl's batch_norm takes [N, C, H, W], [N, C, L] or [N, D]")
    scale, bias, mean, var = (np.asarray(s, np.float32).reshape(-1) for s in stats)  # type: ignore[arg-type]
    kw = {}
    eps, momentum = attr(attrs.get("epsilon", 1e-5)), attr(attrs.get("momentum", 0.9))
    if np.float32(eps) != np.float32(1e-5):
        kw["eps"] = num(eps)
    if np.float32(1 - momentum) != np.float32(0.1):
        kw["momentum"] = num(1 - momentum)  # ONNX keeps `momentum` of the old statistics, deepdsl (PyTorch) the new
    params = {"gamma": scale, "beta": bias, "running_mean": mean, "running_var": var}
    name = imp.layer(node, where, call(where, "batch_norm", [], kw), params, list(node.input[1:5]))
    imp.bind(node, f"{name}({x})", name)


def lrn(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    size = int(attrs["size"])
    if size % 2 == 0:
        raise where.refuse(f"size={size}: ONNX centres an even window differently from the language (PyTorch)")
    kw = {}
    if size != 5:
        kw["size"] = str(size)
    for key, ours, default in (("alpha", "alpha", 1e-4), ("beta", "beta", 0.75), ("bias", "k", 1.0)):
        v = float(attrs.get(key, default))
        if np.float32(v) != np.float32(default):
            kw[ours] = num(v)
    imp.bind(node, call(where, "lrn", [imp.tensor(node.input[0], where)], kw))


def layer_norm_layer(imp: Importer, node: Any, where: Node, x: str, gamma: np.ndarray, beta: np.ndarray,
                     eps: float, sources: list[str | None]) -> None:  # fmt: skip
    """A `layer_norm` layer; `sources` name the constants of gamma and beta (None for one the model does not hold)."""
    kw = {} if np.float32(eps) == np.float32(1e-5) else {"eps": num(eps)}
    name = imp.layer(node, where, call(where, "layer_norm", [], kw), {"gamma": gamma, "beta": beta}, sources)
    imp.bind(node, f"{name}({x})", name)


def layer_normalization(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    shape = imp.shape(node.input[0], where)
    axis = positive_axis(int(attrs.get("axis", -1)), len(shape))
    if axis != len(shape) - 1:
        raise where.refuse(f"axis={attrs.get('axis')} normalises over several axes; the language's layer_norm is "
                           "over the last axis")  # fmt: skip
    imp.only_output(node, where)
    scale, bias = (inputs_const(imp, node, where, 1) + [None])[:2]
    d = shape[-1]
    gamma = np.ones(d, np.float32) if scale is None else np.broadcast_to(scale, (d,))
    beta = np.zeros(d, np.float32) if bias is None else np.broadcast_to(bias, (d,))
    sources = [name or None for name in (*node.input[1:3], "", "")[:2]]  # an absent scale or bias: no source
    layer_norm_layer(imp, node, where, imp.tensor(node.input[0], where), gamma, beta, float(attrs.get("epsilon", 1e-5)),
                     sources)  # fmt: skip


def group_norm_layer(imp: Importer, node: Any, where: Node, x: str, shape: tuple[int, ...], groups: int,
                     gamma: np.ndarray, beta: np.ndarray, eps: float, affine: bool) -> None:  # fmt: skip
    """x [N, C, ...] normalised over `groups` groups of channels, then, with `affine`, scaled by gamma [C] and
    shifted by beta [C] (trainable parameters): `instance_norm` where each channel is its own group (as PyTorch's
    InstanceNorm), else `group_norm(groups)`. Without `affine`, gamma and beta must be 1 and 0."""
    c = shape[1]
    if len(shape) < 2 or c % groups or math.prod(shape[2:]) * (c // groups) == 1:
        raise where.refuse(f"{groups} groups of {list(shape)}: the language's group_norm and instance_norm take "
                           "[N, C, ...] with more than one value per group")  # fmt: skip
    kw = {} if np.float32(eps) == np.float32(1e-5) else {"eps": num(eps)}
    if not affine and not (np.all(gamma == 1) and np.all(beta == 0)):
        raise AssertionError("a scale and shift other than 1 and 0 without affine")
    fn = "instance_norm" if groups == c and len(shape) > 2 else "group_norm"
    if fn == "instance_norm" and affine:
        kw["affine"] = "true"
    if fn == "group_norm" and not affine:
        kw["affine"] = "false"
    args = [] if fn == "instance_norm" else [str(groups)]
    params = {"gamma": gamma.astype(np.float32), "beta": beta.astype(np.float32)} if affine else {}
    name = imp.layer(node, where, call(where, fn, args, kw), params)
    imp.bind(node, f"{name}({x})", name)


def instance_normalization(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """Each channel of each sample over its positions, with a scale and shift per channel (nn.InstanceNorm): a scale
    of ones and a shift of zeros are PyTorch's InstanceNorm without `affine` (its default; the exporters write them
    as constants, `val_3` or a Constant node), so `instance_norm()`, unless they are the module's own parameters
    (initialisers named `1.weight`: a fresh `affine=True`); any other values are trained, `affine=true`."""
    shape = imp.shape(node.input[0], where)
    scale, bias = inputs_const(imp, node, where, 1)
    c = shape[1] if len(shape) > 1 else 0
    if scale is None or bias is None or scale.size != c or bias.size != c:
        raise where.refuse(f"scale and B must be constants of the {c} channels")
    gamma, beta = scale.reshape(-1), bias.reshape(-1)
    affine = not (np.all(gamma == 1) and np.all(beta == 0)) or module_parameter(imp, node.input[1], where)
    group_norm_layer(imp, node, where, imp.tensor(node.input[0], where), shape, c, gamma, beta,
                     float(attrs.get("epsilon", 1e-5)), affine)  # fmt: skip


def group_normalization(imp: Importer, k: int, node: Any, where: Node, attrs: dict) -> None:
    """ONNX's GroupNormalization (the dynamo exporter's nn.GroupNorm from opset 21): `group_norm(num_groups)` whose
    gamma and beta are the scale and bias, trained; at opsets 18 to 20 one value per group (the operator's first
    form, which ONNX deprecated for that), repeated over the group's channels, from 21 one per channel. The
    statistics are float32, as stash_type's default says."""
    shape = imp.shape(node.input[0], where)
    if len(shape) < 2:
        raise where.refuse(f"an input of shape {list(shape)}: GroupNormalization takes [N, C, ...]")
    c, groups = shape[1], int(attrs.get("num_groups", 0))
    if groups < 1 or c % groups:
        raise where.refuse(f"num_groups={groups} does not divide the {c} channels")
    stash = int(attrs.get("stash_type", 1))
    if stash != 1:
        raise where.refuse(f"stash_type={stash}: deepdsl computes the statistics in float32 (stash_type=1)")
    if len(node.input) < 3 or not node.input[1] or not node.input[2]:
        raise where.refuse("it needs its scale and bias inputs")
    imp.only_output(node, where)
    scale, bias = inputs_const(imp, node, where, 1)[:2]
    per = groups if imp.opset < 21 else c  # GroupNormalization-18 scales each group, -21 each channel
    what = f"the {groups} groups (opset {imp.opset} < 21)" if imp.opset < 21 else f"the {c} channels (opset 21 on)"
    if scale is None or bias is None or scale.size != per or bias.size != per:
        sizes = [None if v is None else v.size for v in (scale, bias)]
        raise where.refuse(f"scale and bias of {sizes[0]} and {sizes[1]} values: GroupNormalization takes one for each "
                           f"of {what}")  # fmt: skip
    gamma, beta = (np.repeat(np.asarray(v, np.float32).reshape(-1), c // per) for v in (scale, bias))
    group_norm_layer(imp, node, where, imp.tensor(node.input[0], where), shape, groups, gamma, beta,
                     float(attrs.get("epsilon", 1e-5)), affine=True)  # fmt: skip
