"""Patterns of several nodes that are one built-in of the language, found before the nodes are imported: the Erf
form of GELU, x * 0.5 * (1 + erf(x / sqrt 2)) (as exporters write it before opset 20); the layer norm the
TorchScript exporter writes before opset 17 (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, then Mul and Add of
its scale and shift); a group norm as exporters decompose it (a Reshape of [N, C, ...] into groups,
InstanceNormalization of them, a Reshape back, a Mul and Add per channel); and x * sigmoid(x)
as `silu` where the language has it. Each inner value must be read only
inside the pattern; the pattern's last node then writes the built-in and the others are absorbed."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import import normalisation
from deepdsl.onnx_import.rule_support import value_readers

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


class _Graph:
    def __init__(self, imp: Importer):
        self.imp = imp
        self.made: dict[str, tuple[int, Any]] = {}
        for k, node in enumerate(imp.graph.node):
            for o in node.output:
                self.made[o] = (k, node)
        self.outputs = {o.name for o in imp.graph.output}

    def only_reader(self, value: str, op: str | tuple[str, ...]) -> tuple[int, Any] | None:
        """The one node that reads `value`, where it is of type `op` and `value` is no graph output."""
        users = value_readers(self.imp, value)
        ops = (op,) if isinstance(op, str) else op
        if len(users) != 1 or value in self.outputs or users[0][1].op_type not in ops:
            return None
        return users[0]

    def number(self, name: str) -> float | None:
        """The value of a constant of one element (an initialiser or a Constant node's output), else None."""
        c = self.imp.consts.get(name)
        if c is None and name in self.made and self.made[name][1].op_type == "Constant":
            node = self.made[name][1]
            from onnx import helper, numpy_helper

            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if "value" in attrs:
                c = numpy_helper.to_array(attrs["value"])
            elif "value_float" in attrs:
                c = np.asarray(attrs["value_float"])
        if c is None or np.asarray(c).size != 1:
            return None
        return float(np.asarray(c).reshape(-1)[0])

    def constant(self, name: str) -> np.ndarray | None:
        """An initialiser, or a constant the shape folding computed (a weight reshaped to [C, 1, 1]); else None."""
        c = self.imp.consts.get(name)
        return self.imp.folded.get(name) if c is None else c

    def other(self, node: Any, value: str) -> str | None:
        """The input of binary `node` that is not `value`."""
        if len(node.input) != 2 or value not in node.input:
            return None
        return node.input[1] if node.input[0] == value else node.input[0]

    def last_axis_mean(self, node: Any) -> bool:
        from onnx import helper

        if node.op_type != "ReduceMean":
            return False
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        axes = attrs.get("axes")
        if len(node.input) > 1 and node.input[1]:
            axes = self.imp.consts.get(node.input[1])
        rank = len(self.imp.shapes.get(node.input[0], ()))
        if axes is None or rank == 0 or int(attrs.get("keepdims", 1)) != 1:
            return False
        got = [int(a) + (rank if int(a) < 0 else 0) for a in np.ravel(axes)]
        return got == [rank - 1]


def find(imp: Importer) -> None:
    """Mark the patterns of `imp`'s graph: imp.overrides[k] writes the built-in at node k, imp.absorbed the rest."""
    g = _Graph(imp)
    for k, node in enumerate(imp.graph.node):
        if node.op_type == "Erf":
            _gelu(g, k, node)
        elif node.op_type == "ReduceMean":
            _layer_norm(g, k, node)
        elif node.op_type == "Sigmoid":
            _silu(g, k, node)
        elif node.op_type == "InstanceNormalization":
            _group_norm(g, k, node)


def _claim(g: _Graph, inner: list[int], last: int, write: Any) -> None:
    if any(j in g.imp.absorbed or j in g.imp.overrides for j in (*inner, last)):
        return
    g.imp.absorbed.update(inner)
    g.imp.overrides[last] = write


def _gelu(g: _Graph, k: int, erf: Any) -> None:
    if erf.input[0] not in g.made:
        return
    j, scale = g.made[erf.input[0]]
    if g.only_reader(erf.input[0], "Erf") is None or scale.op_type not in ("Div", "Mul"):
        return
    x = next((i for i in scale.input if g.number(i) is None), None)
    c = g.number(g.other(scale, x) or "") if x is not None else None
    want = math.sqrt(2) if scale.op_type == "Div" else 1 / math.sqrt(2)
    if x is None or c is None or abs(c - want) > 1e-4 or scale.input[0] != x:
        return
    add = g.only_reader(erf.output[0], "Add")
    if add is None or g.number(g.other(add[1], erf.output[0]) or "") != 1.0:
        return
    m1 = g.only_reader(add[1].output[0], "Mul")
    if m1 is None:
        return
    other = g.other(m1[1], add[1].output[0])
    inner = [j, k, add[0]]
    if other == x:  # (x * (1 + erf)) * 0.5
        m2 = g.only_reader(m1[1].output[0], "Mul")
        if m2 is None or g.number(g.other(m2[1], m1[1].output[0]) or "") != 0.5:
            return
        inner.append(m1[0])
        last, node = m2
    else:  # (x * 0.5) * (1 + erf)
        if other not in g.made:
            return
        h, half = g.made[other]
        if half.op_type != "Mul" or x not in half.input or g.number(g.other(half, x) or "") != 0.5:
            return
        if g.only_reader(other, "Mul") is None:
            return
        inner.append(h)
        last, node = m1

    def write(imp: Importer, where: Any) -> None:
        imp.bind(node, f"gelu({imp.tensor(x, where)})")

    _claim(g, inner, last, write)


def _layer_norm(g: _Graph, k: int, mean: Any) -> None:
    if not g.last_axis_mean(mean):
        return
    x = mean.input[0]
    sub = g.only_reader(mean.output[0], "Sub")
    if sub is None or list(sub[1].input) != [x, mean.output[0]]:
        return
    d = sub[1].output[0]
    users = g.imp.readers.get(d, [])
    if len(users) != 2 or d in g.outputs:
        return
    sq = next(((j, n) for j, n in users if n.op_type in ("Pow", "Mul") and n.output[0] != d), None)
    div = next(((j, n) for j, n in users if n.op_type == "Div"), None)
    if sq is None or div is None or list(div[1].input)[0] != d:
        return
    if sq[1].op_type == "Pow" and (sq[1].input[0] != d or g.number(sq[1].input[1]) != 2.0):
        return
    if sq[1].op_type == "Mul" and list(sq[1].input) != [d, d]:
        return
    var = g.only_reader(sq[1].output[0], "ReduceMean")
    if var is None or not g.last_axis_mean(var[1]):
        return
    add = g.only_reader(var[1].output[0], "Add")
    eps = g.number(g.other(add[1], var[1].output[0]) or "") if add is not None else None
    if add is None or eps is None or eps <= 0:
        return
    root = g.only_reader(add[1].output[0], "Sqrt")
    if (
        root is None
        or list(div[1].input) != [d, root[1].output[0]]
        or len(g.imp.readers.get(root[1].output[0], [])) != 1
    ):
        return
    inner = [k, sub[0], sq[0], var[0], add[0], root[0]]
    last, node = div
    shape = g.imp.shapes.get(x)
    if not shape:
        return
    dim = shape[-1]
    gamma, beta = np.ones(dim, np.float32), np.zeros(dim, np.float32)
    sources: list[str | None] = [None, None]  # the constants of gamma and beta, where the model holds them
    mul = g.only_reader(div[1].output[0], "Mul")
    if mul is not None:  # the scale, then the shift
        c = g.imp.consts.get(g.other(mul[1], div[1].output[0]) or "")
        if c is not None and c.size == dim:
            gamma = c.reshape(-1).astype(np.float32)
            sources[0] = g.other(mul[1], div[1].output[0])
            inner.append(last)
            last, node = mul
            shift = g.only_reader(mul[1].output[0], "Add")
            b = g.imp.consts.get(g.other(shift[1], mul[1].output[0]) or "") if shift is not None else None
            if shift is not None and b is not None and b.size == dim:
                beta = b.reshape(-1).astype(np.float32)
                sources[1] = g.other(shift[1], mul[1].output[0])
                inner.append(last)
                last, node = shift

    def write(imp: Importer, where: Any) -> None:
        normalisation.layer_norm_layer(imp, node, where, imp.tensor(x, where), gamma, beta, eps, sources)

    _claim(g, inner, last, write)


def _silu(g: _Graph, k: int, sig: Any) -> None:
    x = sig.input[0]
    mul = g.only_reader(sig.output[0], "Mul")
    if mul is None or g.other(mul[1], sig.output[0]) != x:
        return
    node = mul[1]

    def write(imp: Importer, where: Any) -> None:
        imp.bind(node, f"silu({imp.tensor(x, where)})")

    _claim(g, [k], mul[0], write)


def _group_norm(g: _Graph, k: int, norm: Any) -> None:
    """x [N, C, ...] reshaped into groups of channels [N, G, D], InstanceNormalization of the groups, reshaped back to
    x's shape, then a Mul and an Add per channel ([C, 1, 1] or [1, C, 1, 1]): nn.GroupNorm as both PyTorch
    exporters write it (a scale of ones [G] and zeros to InstanceNormalization, the weight and bias after it) and
    as deepdsl exports `group_norm` and `instance_norm`: one `group_norm` (`instance_norm` where a group is a
    channel), trainable where a Mul or Add per channel follows (PyTorch's affine, its default), the normalisation's
    own scale and shift per group folded into them."""
    imp = g.imp
    rows = norm.input[0]
    if rows not in g.made or g.only_reader(rows, norm.op_type) is None:
        return
    j, reshape = g.made[rows]
    x = reshape.input[0]
    shape, view = imp.shapes.get(x), imp.shapes.get(rows)
    if reshape.op_type != "Reshape" or not shape or len(shape) < 2 or not view or len(view) != 3:
        return
    n, c, groups, d = shape[0], shape[1], view[1], view[2]
    from onnx import helper

    eps = next((float(helper.get_attribute_value(a)) for a in norm.attribute if a.name == "epsilon"), 1e-5)
    scale, bias = (g.constant(i) for i in norm.input[1:3])
    if view[0] != n or scale is None or bias is None or scale.size != groups or bias.size != groups:
        return
    per_group = (scale.reshape(-1), bias.reshape(-1))
    if groups < 1 or c % groups or d != c // groups * math.prod(shape[2:]):
        return
    back = g.only_reader(norm.output[0], "Reshape")
    if back is None or imp.shapes.get(back[1].output[0]) != shape:
        return
    inner, (last, node) = [j, k], back
    affine = False  # trainable where the model scales or shifts per channel (PyTorch's affine GroupNorm)
    gamma, beta = (np.repeat(v.astype(np.float64), c // groups) for v in per_group)
    channel = (1,) * (len(shape) - 1)
    for op in ("Mul", "Add"):  # the scale, then the shift, each per channel ([C, 1, 1] or [1, C, 1, 1])
        step = g.only_reader(node.output[0], op)
        v = g.constant(g.other(step[1], node.output[0]) or "") if step is not None else None
        if step is None or v is None or v.size != c or (1,) * (len(shape) - v.ndim) + v.shape != (1, c, *channel[1:]):
            continue
        if op == "Mul":
            gamma, beta = gamma * v.reshape(-1), beta * v.reshape(-1)
        else:
            beta = beta + v.reshape(-1)
        inner.append(last)
        last, node, affine = *step, True
    if not affine and (np.any(gamma != 1) or np.any(beta != 0)):
        return  # a scale per group alone: left to the nodes' own rules

    def write(imp: Importer, where: Any) -> None:
        normalisation.group_norm_layer(imp, node, where, imp.tensor(x, where), shape, groups, gamma, beta, eps, affine)

    _claim(g, inner, last, write)
