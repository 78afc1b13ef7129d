"""The import of one model: its frame (the opset, the one data input and output, the network's name), a rule per
node in the graph's order (rules.RULES), the parameter arrays under the names the written layers give them."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.frontend.javanames import java_class, reserved_class_names
from deepdsl.onnx_import import patterns
from deepdsl.onnx_import.folding import FOLD_ONLY, FOLDABLE, FOLDED, fold
from deepdsl.onnx_import.inference import infer_shapes
from deepdsl.onnx_import.reading import (
    MIN_OPSET,
    load_model,
    newest_opset,
    require_onnx,
    tensor_array,
)
from deepdsl.onnx_import.rule_support import vocabulary
from deepdsl.onnx_import.rules import RULES, SUPPORTED
from deepdsl.onnx_import.writing import GENERIC_GRAPH_NAMES, TAKEN, Imported, Names, Node, NodeRefused, refusals


class Importer:
    def __init__(self, model: Any, file: str, batch: int | None, loss: bool, share: bool = True):
        self.onnx = require_onnx()
        self.model = model
        self.file = file
        self.loss = loss
        self.opset = self._opset()
        self.graph = model.graph
        self.consts: dict[str, np.ndarray] = {}
        self.folded: dict[str, np.ndarray] = {}  # constants shape inference computed (a Reshape of a weight): patterns
        self.names = Names()
        self.env: dict[str, str] = {}  # ONNX value -> the .ddsl tensor holding it
        self.producer: dict[str, str] = {}  # ONNX value -> the op type that made it
        self.layers: list[str] = []
        self.tensor_fns: list[str] = []
        self.functions: dict[tuple, str] = {}  # (what it computes, rank) -> a tensor function written once
        self.folded_norms: list[str] = []  # convolution layers the exporter folded a batch norm into (`folded_norm`)
        self.body: list[str] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.batch = batch
        self.absorbed: set[int] = set()  # nodes folded into an earlier one (MatMul + Add: one `full`)
        self.overrides: dict[int, Any] = {}  # node -> what writes the built-in a pattern ending there is (patterns)
        self.origins: dict[str, tuple] = {}  # constant folded here -> what it was computed from (`origin`)
        self.shared: dict[tuple, tuple[str, dict]] = {}  # (text, parameters' origins) -> the layer, its parameters
        self.share = share  # nodes reading the very same initialisers: one layer (`layer`), else a copy each
        self.calls: dict[str, list[int]] = {}  # a layer that may be shared -> [its line in self.layers, its callers]
        self.tables: dict[str, np.ndarray] = {}  # an embedding layer -> its table, which a head may be tied to
        self.sequences: dict[str, tuple] = {}  # SplitToSequence -> (tensor, axis, shape, bounds): shapes.sequence_at
        self.tied: list[tuple[str, str]] = []  # (head, embedding) of each head written as full(tied=embedding)

    # ---- the model's frame ----

    def _opset(self) -> int:
        versions = {o.domain or "ai.onnx": o.version for o in self.model.opset_import}
        if "ai.onnx" not in versions:
            raise DslProgramError(f"'{self.file}' imports no standard ONNX opset")
        v, newest = int(versions["ai.onnx"]), newest_opset()
        if not MIN_OPSET <= v <= newest:
            raise DslProgramError(f"'{self.file}' uses opset {v}; deepdsl imports opsets {MIN_OPSET} to {newest}")
        return v

    def run(self) -> Imported:
        g = self.graph
        for t in g.initializer:  # external data is read into the model by load_model
            self.consts[t.name] = tensor_array(t, f"'{self.file}': initialiser", self.onnx)
        data = [i for i in g.input if i.name not in self.consts]
        if not data:
            raise DslProgramError(f"'{self.file}': the model has no data input (every input is an initialiser)")
        if len(g.output) != 1:
            raise DslProgramError(f"'{self.file}': deepdsl imports a model with one output, this one has "
                                  f"{len(g.output)} ({', '.join(o.name for o in g.output)})")  # fmt: skip
        generic = not g.name or g.name in GENERIC_GRAPH_NAMES
        network = self.names.make(Path(self.file).stem if generic else g.name, "Net")
        if java_class(network) in reserved_class_names():  # the Java class would hide one the program uses
            network = self.names.make(f"{network}Net", "Net")
        self.names.used.add("N")
        dims = [self._input_dims(d) for d in data]  # every data input: [batch, ...], the first one's batch is N
        model_batch = dims[0][1]
        n = self.batch if self.batch is not None else (model_batch if model_batch is not None else 1)
        self.model_batch = model_batch
        self.n = n
        self.readers: dict[str, list[tuple[int, Any]]] = {}  # ONNX value -> the nodes that read it
        for j, node in enumerate(g.node):
            for i in set(node.input):
                self.readers.setdefault(i, []).append((j, node))
        self.used = set(self.readers) | {o.name for o in g.output}
        self.shapes, self.folded = infer_shapes(self, {d.name for d in data}, n)
        self.data_names = {d.name for d in data}
        self.multiples: dict[str, int | None] | None = None  # rule_support.per_batch's, worked out when first asked
        xs = []
        for d in data:
            x = self.names.make(d.name if Names.clean(d.name, "x") not in TAKEN else "x", "x")  # not input_2
            self.env[d.name] = x
            xs.append(x)
        patterns.find(self)
        self._nodes()
        out = g.output[0].name
        if out not in self.env:
            raise DslProgramError(f"'{self.file}': the output '{out}' is a constant, not computed from the input")
        result = self.env[out]
        out_shape = self.shapes.get(out)
        lines = [f"network {network}", ""]
        lines.append(f"const N = {n}" + ("   # the model's batch was symbolic" if model_batch is None else ""))
        for d, x, (x_dims, _) in zip(data, xs, dims):
            vocab = vocabulary(self, d.name) if d.type.tensor_type.elem_type != self.onnx.TensorProto.FLOAT else None
            kind = f" int vocab {vocab}" if vocab is not None else ""
            lines.append(f"input {x} : [{', '.join(['N', *map(str, x_dims[1:])])}]{kind}")
        tail: list[str] = []
        if self.loss:
            per_position = out_shape is not None and len(out_shape) == 3 and self.producer.get(out) != "Softmax"
            if out_shape is None or len(out_shape) != 2 and not per_position:
                raise DslProgramError(f"'{self.file}': the output '{out}' has shape {out_shape}, not [batch, classes] "
                                      "(or scores per position [batch, T, classes]); use --no-loss to import it for "
                                      "inference only")  # fmt: skip
            y = self.names.make("y", "y")
            lines.append(f"label {y} : [{', '.join(['N', *map(str, out_shape[1:-1])])}] classes {out_shape[-1]}")
            if self.producer.get(out) == "Softmax":
                tail.append(f"loss = cross_entropy({result}, {y})   # the model ends in Softmax: probabilities")
            else:
                tail.append(f"loss = softmax_cross_entropy({result}, {y})")
        else:
            if out_shape is None:
                raise DslProgramError(f"'{self.file}': the shape of the output '{out}' is unknown")
            target = self.names.make("target", "target")
            lines.append(f"input {target} : [{', '.join(['N', *map(str, out_shape[1:])])}]")
            tail.append("# the language needs a loss: a regression against `target` (`predict` ignores it)")
            tail.append(f"loss = mse({result}, {target})")
        tail.append(f"predict = {result}")
        source = f"# imported from {Path(self.file).name} (ONNX opset {self.opset}) by deepdsl import"
        text = "\n".join([source, *lines, "", *self.tensor_fns, *self.layers, "", *self.body, "", *tail, ""])
        shared = tuple((name, nodes) for name, (_, nodes) in self.calls.items() if nodes > 1)
        return Imported(text.replace("\n\n\n", "\n\n"), self.arrays, network, shared, tuple(self.folded_norms),
                        tuple(self.tied))  # fmt: skip

    def _input_dims(self, vi: Any) -> tuple[list[int], int | None]:
        t = vi.type.tensor_type
        ints = (self.onnx.TensorProto.INT64, self.onnx.TensorProto.INT32)
        if not vi.type.HasField("tensor_type") or t.elem_type != self.onnx.TensorProto.FLOAT and (
                t.elem_type not in ints or vocabulary(self, vi.name) is None):  # fmt: skip
            raise DslProgramError(f"'{self.file}': the input '{vi.name}' is not a float32 tensor (nor token ids that "
                                  "a Gather from a constant table reads)")  # fmt: skip
        dims = list(t.shape.dim)
        if len(dims) < 2:
            raise DslProgramError(f"'{self.file}': the input '{vi.name}' has rank {len(dims)}; deepdsl takes "
                                  "[batch, ...] (rank 2 or more)")  # fmt: skip
        out: list[int] = []
        for k, d in enumerate(dims):
            if d.HasField("dim_value") and d.dim_value > 0:
                out.append(int(d.dim_value))
            elif k == 0:
                out.append(0)
            else:
                raise DslProgramError(f"'{self.file}': dimension {k} of the input '{vi.name}' is symbolic "
                                      f"('{d.dim_param}'); only the batch may be")  # fmt: skip
        return out, (out[0] or None)

    def _nodes(self) -> None:
        """A rule per node in the graph's order. A node the language cannot say does not stop the import: its outputs
        stand for what they would hold, the nodes after it are still read, and then ONE error lists every node that
        cannot be imported, grouped by op type, before anything is written."""
        gaps: list[NodeRefused] = []
        after: list[NodeRefused] = []  # refused nodes that read an earlier refused node's output
        missing: set[str] = set()  # the outputs of refused nodes
        for k, node in enumerate(self.graph.node):
            if k in self.absorbed:
                continue
            try:
                self._node(k, node)
            except NodeRefused as e:
                downstream = any(i in missing for i in node.input) and node.op_type in RULES
                (after if downstream else gaps).append(e)
                for o in node.output:
                    if o and o not in self.env and o not in self.consts:
                        missing.add(o)
                        self.env[o] = GAP
        if not gaps and not after:
            return
        if len(gaps) == 1 and not after:
            raise gaps[0]
        raise refusals(self.file, self.opset, gaps, after)

    # ---- nodes ----

    def _where(self, k: int, node: Any) -> Node:
        # PyTorch's TorchScript exporter names a node by its module path and op type (`/layer1/layer1.0/conv1/Conv`):
        # the path names it; its dynamo exporter names nodes by op (`node_Conv_82`) and says the module in the
        # node's metadata (`pkg.torch.onnx.name_scopes`: ['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'conv2d']):
        # the innermost module names it (`layer1_0_conv1`)
        name = node.name or f"{node.op_type}_{k}"
        path = re.sub(rf"/{node.op_type}(_[0-9]+)?$", "", name)
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), "")
        modules = re.findall(r"'([^']*)'", scopes[:4000])  # a list of quoted names, read without evaluating it
        if len(modules) > 2 and modules[-2]:
            path = modules[-2]
        shown = name if len(name) <= 200 else f"{name[:100]}...({len(name):,} characters)"
        return Node(self.file, shown, node.op_type, self.opset, path if path.strip("/") else name)

    def _attrs(self, node: Any, where: Node) -> dict[str, Any]:
        """The node's attributes by name; a float that is not finite is refused (nothing the language takes)."""
        out = {}
        for a in node.attribute:
            v = self.onnx.helper.get_attribute_value(a)
            if a.type in (self.onnx.AttributeProto.FLOAT, self.onnx.AttributeProto.FLOATS):
                if not all(math.isfinite(f) for f in (v if isinstance(v, list) else [v])):
                    raise where.refuse(f"its attribute {a.name}={v} is not a finite number")
            out[a.name] = v
        return out

    def _node(self, k: int, node: Any) -> None:
        where = self._where(k, node)
        if node.domain not in ("", "ai.onnx"):
            raise where.refuse(f"operators of domain '{node.domain}' are not supported")
        rule = RULES.get(node.op_type)
        if rule is None:
            raise where.refuse("this operator is not supported", hint=f"deepdsl imports {', '.join(SUPPORTED)}, "
                               f"and folds {', '.join((*FOLDED, *FOLD_ONLY))} of constants and shapes")  # fmt: skip
        attrs = self._attrs(node, where)
        if self._folded(node, where, attrs):
            return
        if k in self.overrides:
            self.overrides[k](self, where)
        else:
            rule(self, k, node, where, attrs)
        for o in node.output:
            if o:
                self.producer[o] = node.op_type

    def _folded(self, node: Any, where: Node, attrs: dict) -> bool:
        """A node of constants computed here (a shape, a mask, a scale), as exporters write them: True if it was."""
        if node.op_type not in FOLDABLE or node.op_type == "Shape" or len(node.output) != 1:
            return False
        if not node.input or any(i and i not in self.consts for i in node.input):
            return False
        value = fold(node.op_type, attrs, [self.consts.get(i) if i else None for i in node.input], None, where)
        if value is None:
            return False
        self.consts[node.output[0]] = np.asarray(value)
        # an exporter may write a weight's Transpose or Reshape once for each use (a MatMul's Wᵀ): the same
        # computation of the same tensor is the same parameter (of values alone: `origin`'s default)
        ins = tuple(self.origin(i) if i else None for i in node.input)
        if any(o is not None and o[0] != "value" for o in ins):
            self.origins[node.output[0]] = (node.op_type, tuple(sorted((k, repr(v)) for k, v in attrs.items())), ins)
        return True

    def origin(self, name: str) -> tuple:
        """What constant `name` is, to tell the parameters of two nodes apart: a float tensor is itself (its name: two
        initialisers of equal values are two parameters), one folded from such a tensor the computation that made it,
        an integer one (a shape, an axis) its value, which each node may hold under its own name."""
        if name in self.origins:
            return self.origins[name]
        a = self.consts.get(name)
        if a is not None and a.dtype.kind in "biu":
            return ("value", a.dtype.str, a.shape, a.tobytes())
        return ("tensor", name)

    def tensor(self, name: str, where: Node) -> str:
        if name in self.env:
            return self.env[name]
        if name in self.consts:
            raise where.refuse(f"input '{name}' is a constant where deepdsl needs a computed tensor")
        raise where.refuse(f"input '{name}' is not computed before it is used")

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def shape(self, name: str, where: Node) -> tuple[int, ...]:
        if name not in self.shapes:
            raise where.refuse(f"the shape of '{name}' is unknown after ONNX shape inference")
        return self.shapes[name]

    def bind(self, node: Any, expr: str, layer: str | None = None) -> None:
        out = node.output[0]
        pytorch = re.fullmatch(rf"(.+)/{node.op_type}(_[0-9]+)?_output_[0-9]+", out)  # /layer1/relu/Relu_output_0
        name = self.names.make(f"{layer}_out" if layer else pytorch.group(1) if pytorch else out, "h")
        self.body.append(f"{name} = {expr}")
        self.env[out] = name

    def layer(self, node: Any, where: Node, text: str, params: dict[str, np.ndarray],
              sources: Sequence[str | None] | None = None) -> str:  # fmt: skip
        """The name of a `layer NAME = text` line holding `params`, written once for the nodes of one module: where an
        earlier node's layer has the same text, its parameters come from the very same constants (`sources`: the
        names they are computed from, by default the node's constant inputs; traced through the folded nodes to the
        initialisers by `origin`) and hold the same values, that layer is called again, as the model reads one
        initialiser twice (siamese's encoder), so that trained the two uses stay one (its line says for how many
        nodes). A source of None (a parameter the model does not hold, such as a LayerNormalization's absent scale)
        or sharing only some sources: a layer of its own. So is one without parameters, one whose every parameter
        holds one value throughout (a layer norm's ones and zeros, a zero bias: exporters that merge initialisers of
        equal values make untrained layers read one such constant, which says nothing of the model's modules), and
        every layer without `share` (`deepdsl import --no-share`)."""
        if sources is None:
            sources = [i for i in node.input if i in self.consts]
        telling = any(np.ptp(np.asarray(a, np.float64)) > 0 for a in params.values() if np.size(a))
        key = None
        if self.share and telling and sources and all(sources):
            key = (text, tuple(self.origin(s) for s in sources))
        if key in self.shared:
            name, theirs = self.shared[key]
            # the same constants may still give other values (a Gemm's alpha, its transB of a square B): a copy
            if params.keys() == theirs.keys() and all(np.array_equal(np.asarray(a, np.float32), theirs[p])
                                                      for p, a in params.items()):  # fmt: skip
                # said on its line: an exporter that merges initialisers of equal values (PyTorch's TorchScript
                # one in eval mode) makes separate layers that held the same values look like this one
                self.calls[name][1] += 1
                line, nodes = self.calls[name]
                self.layers[line] = f"layer {name} = {text}   # one set of weights for {nodes} nodes"
                return name
        name = self.names.make(where.base, node.op_type.lower())
        self.layers.append(f"layer {name} = {text}")
        for p, a in params.items():
            self.store(f"{name}.{p}", a, where)
        if key is not None and key not in self.shared:
            self.shared[key] = (name, {p: self.arrays[f"{name}.{p}"] for p in params})
            self.calls[name] = [len(self.layers) - 1, 1]
        return name

    def store(self, name: str, a: np.ndarray, where: Node) -> None:
        """Parameter `name` of the written file, float32; NaN or an infinity (a model's, or one a scale such as
        Gemm's alpha made) is refused: a non-finite parameter is never saved."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not np.isfinite(a).all():
            raise where.refuse(f"its parameter {name.split('.')[-1]} holds NaN or infinite values")
        self.arrays[name] = a

    def only_output(self, node: Any, where: Node, keep: int = 1) -> None:
        """The node's outputs past the first `keep` must go unused (a pool's indices, a dropout mask)."""
        for o in node.output[keep:]:
            if o and o in self.used:
                raise where.refuse(f"its output '{o}' is used; deepdsl computes only the first output")


GAP = "<not imported>"  # what the output of a refused node holds while the rest of the graph is read


def import_model(path: str | Path, batch: int | None = None, loss: bool = True, share: bool = True) -> Imported:
    """The model in `path` as `.ddsl` text and parameter arrays; `batch` fixes N (default: the model's, or 1 where
    it is symbolic); `loss` adds a label and a classification loss (else a regression against a `target` input);
    `share`: nodes that read the very same initialisers are one layer (else each its copy)."""
    return Importer(load_model(path), str(path), batch, loss, share).run()
