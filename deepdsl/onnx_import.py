"""`deepdsl import`: an ONNX model as readable `.ddsl` text, and its initialisers as deepdsl parameter arrays.

    import_model(path, batch=None, loss=True) -> Imported(text, arrays, network)

The model's one data input becomes `input x : [N, ...]` (a symbolic batch becomes `const N`, `--batch` sets it),
every parameterised node one `layer` line named after the node (sanitised and unique), every other node one
binding, in the graph's order. Where the `.ddsl` language cannot say exactly what an ONNX node computes (an
asymmetric pad, a dilation, a broadcast between two computed tensors, ...), the import is refused with the node,
its op type and the opset: never a silently different network. `onnx` is imported only when a model is read, so
the rest of deepdsl works without it.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.frontend.builtins import BUILTINS, QUERIES
from deepdsl.frontend.javanames import java_class, reserved_class_names
from deepdsl.frontend.transformer import RESERVED
from deepdsl.ir.types import INT_MAX, MAX_ELEMENTS

ONNX_EXTRA = "pip install 'deepdsl[onnx]'"
MIN_OPSET = 11
MAX_ONNX_BYTES = 2**31 - 1  # protobuf's limit for one message: a larger model keeps its weights in external files
MAX_EXTERNAL_BYTES = 2**34  # the external data of one model, all its tensors together
MAX_NAME = 64  # characters of a name the import makes (the language takes 128; `_2` suffixes need room)

# the element types deepdsl reads, as little-endian NumPy types (TensorProto's numbers); a string, bfloat16,
# float8, 4-bit or complex tensor is refused
_DTYPES = {1: "<f4", 2: "u1", 3: "i1", 4: "<u2", 5: "<i2", 6: "<i4", 7: "<i8", 9: "?", 10: "<f2", 11: "<f8",
           12: "<u4", 13: "<u8"}  # fmt: skip

# what exporters call every graph: the network is named after the file instead
GENERIC_GRAPH_NAMES = frozenset({"main_graph", "torch_jit", "torch-jit-export", "torch_jit_export"})

# the shape computations exporters write (`x.view(x.size(0), -1)`): folded, on constants and known shapes only
FOLDED = ("Cast", "Gather", "Shape", "Squeeze", "Unsqueeze")

SUPPORTED = (
    "Add", "AveragePool", "BatchNormalization", "Concat", "Constant", "Conv", "Div", "Dropout", "Flatten", "Gemm",
    "GlobalAveragePool", "Identity", "LRN", "LeakyRelu", "LogSoftmax", "MatMul", "MaxPool", "Mul", "ReduceMean",
    "Relu", "Reshape", "Sigmoid", "Softmax", "Sub", "Tanh",
)  # fmt: skip

# names a binding may not take: the language's reserved words and built-ins, and the train block's functions
_TAKEN = frozenset(RESERVED | set(BUILTINS) | set(QUERIES)) | frozenset(
    "sum max he xavier gaussian uniform constant sgd adam synthetic mnist cifar10 npz".split()
)


def require_onnx() -> Any:
    """The `onnx` module, or a user error saying how to install it."""
    try:
        import onnx
    except ImportError:
        raise DslProgramError(f"reading and writing ONNX needs the onnx package: {ONNX_EXTRA}") from None
    return onnx


def newest_opset() -> int:
    return int(require_onnx().defs.onnx_opset_version())


@dataclass(frozen=True)
class Imported:
    text: str  # the .ddsl source
    arrays: dict[str, np.ndarray]  # every parameter and state array under its deepdsl name
    network: str


class Names:
    """Sanitised, unique names in the one top-level scope of the written file."""

    def __init__(self) -> None:
        self.used: set[str] = set(_TAKEN)

    @staticmethod
    def clean(raw: str, fallback: str) -> str:
        """`raw` as a name of the language (`/layer1/conv.0` -> `layer1_conv_0`, `123` -> `h_123`)."""
        base = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", raw[: 4 * MAX_NAME])).strip("_") or fallback
        base = f"{fallback}_{base}" if base[0].isdigit() else base
        return base[:MAX_NAME].rstrip("_")

    def make(self, raw: str, fallback: str) -> str:
        base = self.clean(raw, fallback)
        name, k = base, 2
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name


def _attr(v: float) -> float:
    """A float32 attribute as the decimal it was written as (0.8 stored as 0.800000011920929 reads 0.8)."""
    return float(str(np.float32(v)))


def _num(v: float) -> str:
    """A float32 number as the shortest literal that reads back to the same float32 (`1e-05`, `0.1`, `2.0`)."""
    f = np.float32(v)
    if not np.isfinite(f):
        raise ValueError(f"{v} is not finite")
    text = repr(float(f)) if float(f).is_integer() else str(f)
    return text if any(c in text for c in ".e") else text + ".0"


def _pair(values: tuple[int, ...]) -> str:
    return str(values[0]) if values[0] == values[1] else f"({values[0]}, {values[1]})"


def _call(where: _Node, fn: str, args: list[str], kw: dict[str, str]) -> str:
    """The call `fn(args, key=value, ...)`, each keyword's value (as written) checked against the range the built-in
    takes, so that an attribute the language refuses is refused here, at its node."""
    specs = {a.name: a for a in BUILTINS[fn].args}
    for key, text in kw.items():
        spec = specs[key]
        if text in ("true", "false"):
            continue
        for v in (float(t) for t in text.strip("()").split(",")):
            if spec.kind in ("int", "pair", "ints") and abs(v) > INT_MAX:
                raise where.refuse(f"{key}={text}: the language's {fn} takes at most {INT_MAX:,} (2^31 - 1)")
            if (spec.low is not None and v < spec.low or spec.below is not None and v >= spec.below
                    or spec.high is not None and v > spec.high):  # fmt: skip
                bounds = [f">= {spec.low:g}" if spec.low is not None else "", f"< {spec.below:g}" if spec.below
                          is not None else "", f"<= {spec.high:g}" if spec.high is not None else ""]  # fmt: skip
                raise where.refuse(f"{key}={text}: the language's {fn} takes {' and '.join(b for b in bounds if b)}")
    return f"{fn}({', '.join([*args, *(f'{k}={v}' for k, v in kw.items())])})"


@dataclass
class _Node:
    """The node being imported, for messages."""

    file: str
    name: str
    op: str
    opset: int
    base: str  # what names its layer: the node's name less PyTorch's trailing `/OpType`

    def refuse(self, why: str, hint: str | None = None) -> DslProgramError:
        return DslProgramError(f"{self.file}: node '{self.name}' ({self.op}, opset {self.opset}): {why}", hint=hint)


class _Importer:
    def __init__(self, model: Any, file: str, batch: int | None, loss: bool):
        self.onnx = require_onnx()
        self.model = model
        self.file = file
        self.loss = loss
        self.opset = self._opset()
        self.graph = model.graph
        self.consts: dict[str, np.ndarray] = {}
        self.names = Names()
        self.env: dict[str, str] = {}  # ONNX value -> the .ddsl tensor holding it
        self.producer: dict[str, str] = {}  # ONNX value -> the op type that made it
        self.layers: list[str] = []
        self.tensor_fns: list[str] = []
        self.body: list[str] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.batch = batch
        self.absorbed: set[int] = set()  # nodes folded into an earlier one (MatMul + Add: one `full`)

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
        if len(data) != 1:
            names = ", ".join(i.name for i in data) or "none"
            raise DslProgramError(f"'{self.file}': deepdsl imports a model with one data input, this one has "
                                  f"{len(data)} ({names})")  # fmt: skip
        if len(g.output) != 1:
            raise DslProgramError(f"'{self.file}': deepdsl imports a model with one output, this one has "
                                  f"{len(g.output)} ({', '.join(o.name for o in g.output)})")  # fmt: skip
        generic = not g.name or g.name in GENERIC_GRAPH_NAMES
        network = self.names.make(Path(self.file).stem if generic else g.name, "Net")
        if java_class(network) in reserved_class_names():  # the Java class would hide one the program uses
            network = self.names.make(f"{network}Net", "Net")
        self.names.used.add("N")
        x_dims, model_batch = self._input_dims(data[0])
        n = self.batch if self.batch is not None else (model_batch if model_batch is not None else 1)
        self.model_batch = model_batch
        self.readers: dict[str, list[tuple[int, Any]]] = {}  # ONNX value -> the nodes that read it
        for j, node in enumerate(g.node):
            for i in set(node.input):
                self.readers.setdefault(i, []).append((j, node))
        self.used = set(self.readers) | {o.name for o in g.output}
        self.shapes = self._infer_shapes(data[0].name, n)
        x = self.names.make(data[0].name if Names.clean(data[0].name, "x") not in _TAKEN else "x", "x")  # not input_2
        self.env[data[0].name] = x
        for k, node in enumerate(g.node):
            if k in self.absorbed:
                continue
            self._node(k, node)
        out = g.output[0].name
        if out not in self.env:
            raise DslProgramError(f"'{self.file}': the output '{out}' is a constant, not computed from the input")
        result = self.env[out]
        out_shape = self.shapes.get(out)
        lines = [f"network {network}", ""]
        lines.append(f"const N = {n}" + ("   # the model's batch was symbolic" if model_batch is None else ""))
        lines.append(f"input {x} : [{', '.join(['N', *map(str, x_dims[1:])])}]")
        tail: list[str] = []
        if self.loss:
            if out_shape is None or len(out_shape) != 2:
                raise DslProgramError(f"'{self.file}': the output '{out}' has shape {out_shape}, not [batch, classes]; "
                                      "use --no-loss to import it for inference only")  # fmt: skip
            y = self.names.make("y", "y")
            lines.append(f"label {y} : [N] classes {out_shape[1]}")
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
        return Imported(text.replace("\n\n\n", "\n\n"), self.arrays, network)

    def _input_dims(self, vi: Any) -> tuple[list[int], int | None]:
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or t.elem_type != self.onnx.TensorProto.FLOAT:
            raise DslProgramError(f"'{self.file}': the input '{vi.name}' is not a float32 tensor")
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

    def _infer_shapes(self, x: str, n: int) -> dict[str, tuple[int, ...]]:
        """Every value's shape with the batch fixed at `n`: ONNX shape inference over the model's skeleton, again
        with the shape computations (Shape, Gather, Concat, ...) folded into constants until none is left, so
        that a Reshape to a computed shape has one."""
        onnx = self.onnx
        from onnx import numpy_helper

        folded: dict[str, np.ndarray] = {}
        for _ in range(len(self.graph.node) + 1):
            m = skeleton(self.model)
            del m.graph.value_info[:]
            for vi in (*m.graph.input, *m.graph.output):
                if vi.name == x:
                    vi.type.tensor_type.shape.dim[0].dim_value = n
                elif vi.name not in self.consts and vi.type.tensor_type.shape.dim:
                    vi.type.tensor_type.shape.dim[0].Clear()  # the output's batch follows from the input's
            m.graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in folded.items())
            try:
                m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
            except Exception as exc:  # noqa: BLE001 — onnx raises its own error kinds
                raise DslProgramError(f"'{self.file}': ONNX shape inference fails at batch {n}: {exc}") from None
            shapes: dict[str, tuple[int, ...]] = {}
            for vi in (*m.graph.value_info, *m.graph.input, *m.graph.output):
                dims = vi.type.tensor_type.shape.dim
                if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                    shapes[vi.name] = tuple(int(d.dim_value) for d in dims)
            for name, a in self.consts.items():
                shapes[name] = a.shape
            more = self._fold_shapes(shapes, folded)
            if not more:
                return shapes
            folded.update(more)
        raise AssertionError("shape folding did not converge")

    def _fold_shapes(self, shapes: dict[str, tuple[int, ...]], folded: dict[str, np.ndarray]) -> dict:
        """The shape computations that can be folded now and were not yet, by output name."""
        known = {**self.consts, **folded}
        more: dict[str, np.ndarray] = {}
        for k, node in enumerate(self.graph.node):
            if node.op_type not in (*FOLDED, "Concat", "Constant") or not node.output or node.output[0] in known:
                continue
            where = self._where(k, node)
            attrs = self._attrs(node, where)
            if node.op_type == "Constant":
                value = numpy_helper_value(attrs, where)
            else:
                shape = shapes.get(node.input[0]) if node.input else None
                value = fold(node.op_type, attrs, [known.get(i) for i in node.input], shape, where)
            if value is not None:
                known[node.output[0]] = more[node.output[0]] = np.asarray(value)
        return more

    # ---- nodes ----

    def _where(self, k: int, node: Any) -> _Node:
        # PyTorch names a node by its module path and op type (`/layer1/layer1.0/conv1/Conv`): the path names it
        name = node.name or f"{node.op_type}_{k}"
        path = re.sub(rf"/{node.op_type}(_[0-9]+)?$", "", name)
        shown = name if len(name) <= 200 else f"{name[:100]}...({len(name):,} characters)"
        return _Node(self.file, shown, node.op_type, self.opset, path if path.strip("/") else name)

    def _attrs(self, node: Any, where: _Node) -> dict[str, Any]:
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
        rule = _RULES.get(node.op_type)
        if rule is None:
            raise where.refuse("this operator is not supported", hint=f"deepdsl imports {', '.join(SUPPORTED)}, "
                               f"and folds {', '.join(FOLDED)} of constants and shapes")  # fmt: skip
        attrs = self._attrs(node, where)
        rule(self, k, node, where, attrs)
        for o in node.output:
            if o:
                self.producer[o] = node.op_type

    def tensor(self, name: str, where: _Node) -> str:
        if name in self.env:
            return self.env[name]
        if name in self.consts:
            raise where.refuse(f"input '{name}' is a constant where deepdsl needs a computed tensor")
        raise where.refuse(f"input '{name}' is not computed before it is used")

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def shape(self, name: str, where: _Node) -> tuple[int, ...]:
        if name not in self.shapes:
            raise where.refuse(f"the shape of '{name}' is unknown after ONNX shape inference")
        return self.shapes[name]

    def bind(self, node: Any, expr: str, layer: str | None = None) -> None:
        out = node.output[0]
        pytorch = re.fullmatch(rf"(.+)/{node.op_type}(_[0-9]+)?_output_[0-9]+", out)  # /layer1/relu/Relu_output_0
        name = self.names.make(f"{layer}_out" if layer else pytorch.group(1) if pytorch else out, "h")
        self.body.append(f"{name} = {expr}")
        self.env[out] = name

    def layer(self, node: Any, where: _Node, text: str, params: dict[str, np.ndarray]) -> str:
        name = self.names.make(where.base, node.op_type.lower())
        self.layers.append(f"layer {name} = {text}")
        for p, a in params.items():
            self.store(f"{name}.{p}", a, where)
        return name

    def store(self, name: str, a: np.ndarray, where: _Node) -> None:
        """Parameter `name` of the written file, float32; NaN or an infinity (a model's, or one a scale such as
        Gemm's alpha made) is refused: a non-finite parameter is never saved."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if not np.isfinite(a).all():
            raise where.refuse(f"its parameter {name.split('.')[-1]} holds NaN or infinite values")
        self.arrays[name] = a

    def only_output(self, node: Any, where: _Node, keep: int = 1) -> None:
        """The node's outputs past the first `keep` must go unused (a pool's indices, a dropout mask)."""
        for o in node.output[keep:]:
            if o and o in self.used:
                raise where.refuse(f"its output '{o}' is used; deepdsl computes only the first output")


def _ints(attrs: dict, key: str, default: list[int]) -> list[int]:
    return [int(v) for v in attrs.get(key, default)]


def _spatial(imp: _Importer, node: Any, where: _Node, attrs: dict, kernel: tuple[int, int]) -> tuple[tuple, tuple]:
    """(stride, pad) of a 2-D window op, refusing what the language cannot say (asymmetric pads, dilations)."""
    strides = tuple(_ints(attrs, "strides", [1, 1]))
    pads = _ints(attrs, "pads", [0, 0, 0, 0])
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        h, w = imp.shape(node.input[0], where)[2:]
        pads = []
        for size, k, s in zip((h, w), kernel, strides):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            pads.append(total)
        before = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in pads]
        pads = [before[0], before[1], pads[0] - before[0], pads[1] - before[1]]
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    if len(pads) != 4 or len(strides) != 2:
        raise where.refuse("only 2-D windows are supported (an NCHW input)")
    if pads[0] != pads[2] or pads[1] != pads[3]:
        raise where.refuse(f"pads {pads} are asymmetric; the language pads both sides alike")
    if any(d != 1 for d in _ints(attrs, "dilations", [1, 1])):
        raise where.refuse(f"dilations {_ints(attrs, 'dilations', [1, 1])}: the language has no dilated windows")
    return strides, (pads[0], pads[1])


def _conv(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    w = imp.const(node.input[1])
    if w is None:
        raise where.refuse("the weight must be an initialiser (a constant)")
    if w.ndim != 4 or len(imp.shape(node.input[0], where)) != 4:
        raise where.refuse(f"only 2-D convolutions are supported (weight of rank {w.ndim})")
    b = imp.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and b is None:
        raise where.refuse("the bias must be an initialiser (a constant)")
    kernel = (int(w.shape[2]), int(w.shape[3]))
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != kernel:
        raise where.refuse(f"kernel_shape {list(attrs['kernel_shape'])} differs from the weight's {list(kernel)}")
    stride, pad = _spatial(imp, node, where, attrs, kernel)
    kw = {"kernel": _pair(kernel)}
    if stride != (1, 1):
        kw["stride"] = _pair(stride)
    if pad != (0, 0):
        kw["pad"] = _pair(pad)
    groups = int(attrs.get("group", 1))
    if groups != 1:
        kw["groups"] = str(groups)
    if b is None:
        kw["bias"] = "false"
    params = {"W": w} if b is None else {"W": w, "b": b.reshape(-1)}
    name = imp.layer(node, where, _call(where, "conv", [str(w.shape[0])], kw), params)
    imp.bind(node, f"{name}({x})", name)


def _full(imp: _Importer, node: Any, where: _Node, x: str, w: np.ndarray, b: np.ndarray | None) -> None:
    """`full` with weight `w` [out, in] and optional bias [out]."""
    kw = {} if b is not None else {"bias": "false"}
    params = {"W": w} if b is None else {"W": w, "b": b}
    name = imp.layer(node, where, _call(where, "full", [str(w.shape[0])], kw), params)
    imp.bind(node, f"{name}({x})", name)


def _bias_vector(c: np.ndarray, m: int) -> np.ndarray | None:
    """`c` as a vector [m] when it broadcasts along the batch only ([m], [1, m] or a scalar), else None."""
    if c.ndim > 2 or (c.ndim == 2 and c.shape[0] != 1):
        return None
    try:
        return np.broadcast_to(c, (1, m)).reshape(m).astype(np.float32)
    except ValueError:
        return None


def _gemm(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    b = imp.const(node.input[1])
    if b is None:
        raise where.refuse("B must be an initialiser (a constant weight)")
    if int(attrs.get("transA", 0)):
        raise where.refuse("transA=1: the language's `full` takes its input as [batch, features]")
    if len(imp.shape(node.input[0], where)) != 2 or b.ndim != 2:
        raise where.refuse("A and B must be matrices")
    w = b if int(attrs.get("transB", 0)) else b.T
    w = w * np.float32(attrs.get("alpha", 1.0))
    c = imp.const(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if len(node.input) > 2 and node.input[2] and c is None:
        raise where.refuse("C must be an initialiser (a constant bias)")
    bias = None
    if c is not None:
        bias = _bias_vector(c, w.shape[0])
        if bias is None:
            raise where.refuse(f"C of shape {list(c.shape)} differs between samples; deepdsl's bias is one vector")
        bias = bias * np.float32(attrs.get("beta", 1.0))
    _full(imp, node, where, x, w, bias)


def _matmul(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    w = imp.const(node.input[1])
    if w is None:
        raise where.refuse("deepdsl imports MatMul with a constant weight (an initialiser) as B")
    if len(imp.shape(node.input[0], where)) != 2 or w.ndim != 2:
        raise where.refuse("deepdsl imports MatMul of a [batch, features] input by a matrix")
    bias = None
    users = imp.readers.get(node.output[0], [])
    graph_out = {o.name for o in imp.graph.output}
    if len(users) == 1 and users[0][1].op_type == "Add" and node.output[0] not in graph_out:
        j, add = users[0]  # MatMul + Add of a constant vector, as exporters write a linear layer: one `full`
        other = [i for i in add.input if i != node.output[0]]
        c = imp.const(other[0]) if len(other) == 1 else None
        bias = _bias_vector(c, w.shape[1]) if c is not None else None
        if bias is not None:
            imp.absorbed.add(j)
            node = _Rename(node, add.output[0])
    _full(imp, node, where, x, w.T, bias)


@dataclass
class _Rename:
    """A node whose result is another node's output (the Add folded into a MatMul)."""

    node: Any
    out: str

    def __getattr__(self, key: str) -> Any:
        return getattr(self.node, key)

    @property
    def output(self) -> list[str]:
        return [self.out]


_ARITH = {"Add": ("+", np.add), "Sub": ("-", np.subtract), "Mul": ("*", np.multiply), "Div": ("/", np.divide)}


def _arith(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    sym, fold = _ARITH[node.op_type]
    a, b = node.input[0], node.input[1]
    ca, cb = imp.const(a), imp.const(b)
    if ca is not None and cb is not None:
        try:
            with np.errstate(all="ignore"):
                imp.consts[node.output[0]] = fold(ca, cb).astype(np.result_type(ca, cb))
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise where.refuse(f"it cannot be folded: {exc}") from None
        return
    if ca is None and cb is None:
        sa, sb = imp.shape(a, where), imp.shape(b, where)
        if sa != sb:
            raise where.refuse(f"it broadcasts {list(sa)} with {list(sb)}; the language's {sym} needs equal shapes")
        imp.bind(node, f"{imp.tensor(a, where)} {sym} {imp.tensor(b, where)}")
        return
    t, c, left = (b, ca, True) if ca is not None else (a, cb, False)
    assert c is not None
    x, shape = imp.tensor(t, where), imp.shape(t, where)
    try:
        if np.broadcast_shapes(shape, c.shape) != shape:
            raise ValueError
    except ValueError:
        raise where.refuse(f"the constant of shape {list(c.shape)} would broadcast the input {list(shape)}") from None
    if c.size == 0 or not np.issubdtype(c.dtype, np.floating) and not np.issubdtype(c.dtype, np.integer):
        raise where.refuse(f"the constant holds {c.dtype}")
    flat = c.reshape(-1).astype(np.float32)
    if np.all(flat == flat[0]):  # one number: a literal
        try:
            v = _num(flat[0])
        except ValueError:
            raise where.refuse(f"the constant {flat[0]} is not finite") from None
        imp.bind(node, f"{v} {sym} {x}" if left else f"{x} {sym} {v}")
        return
    # a constant tensor broadcast over the input: a tensor function with the constant as its parameter
    kc = c.reshape(c.shape[len(c.shape) - len(shape) :] if c.ndim > len(shape) else c.shape).astype(np.float32)
    idx = [f"i{d}" for d in range(len(shape))]
    at = idx[len(shape) - kc.ndim :]
    k_idx = ", ".join("0" if kc.shape[d] == 1 else at[d] for d in range(kc.ndim))
    sizes = ", ".join(f"S{d}" for d in range(len(shape)))
    name = imp.names.make(where.base, node.op_type.lower())
    fn = imp.names.make(f"{name}_fn", "fn")
    xk, kk = f"t[{', '.join(idx)}]", f"k[{k_idx}]"
    expr = f"{kk} {sym} {xk}" if left else f"{xk} {sym} {kk}"
    imp.tensor_fns += [
        f"tensor {fn}(t[{sizes}]) -> [{', '.join(idx)}] {{   # {node.op_type} of a constant, broadcast",
        f"  param k[{', '.join(map(str, kc.shape))}] = constant(0)",
        f"  return {expr}",
        "}",
        "",
    ]
    imp.layers.append(f"layer {name} = {fn}")
    imp.store(f"{name}.k", kc, where)
    imp.bind(node, f"{name}({x})", name)


def _unary(fn: str) -> Callable[..., None]:
    def rule(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
        imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")

    return rule


def _leaky(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    alpha = float(attrs.get("alpha", 0.01))
    kw = {} if np.float32(alpha) == np.float32(0.01) else {"slope": _num(alpha)}
    imp.bind(node, _call(where, "leaky_relu", [imp.tensor(node.input[0], where)], kw))


def _pool(fn: str) -> Callable[..., None]:
    def rule(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
        x = imp.tensor(node.input[0], where)
        shape = imp.shape(node.input[0], where)
        if len(shape) != 4:
            raise where.refuse("only 2-D pooling is supported (an NCHW input)")
        kernel = tuple(_ints(attrs, "kernel_shape", []))
        if len(kernel) != 2:
            raise where.refuse(f"kernel_shape {list(kernel)}: only 2-D windows are supported")
        stride, pad = _spatial(imp, node, where, attrs, kernel)  # type: ignore[arg-type]
        if int(attrs.get("storage_order", 0)):
            raise where.refuse("storage_order=1 is not supported")
        imp.only_output(node, where)
        if fn == "avg_pool" and pad != (0, 0) and not int(attrs.get("count_include_pad", 0)):
            raise where.refuse("count_include_pad=0 with padding: the language's avg_pool counts the padding")
        if int(attrs.get("ceil_mode", 0)):
            floor = [(s + 2 * p - kk) // st + 1 for s, p, kk, st in zip(shape[2:], pad, kernel, stride)]
            if tuple(floor) != imp.shape(node.output[0], where)[2:]:
                raise where.refuse("ceil_mode=1 gives a larger output here; the language's windows round down")
        kw = {}
        if stride != kernel:
            kw["stride"] = _pair(stride)
        if pad != (0, 0):
            kw["pad"] = _pair(pad)
        imp.bind(node, _call(where, fn, [x, _pair(kernel)], kw))  # type: ignore[arg-type]

    return rule


def _global_avg(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    if len(imp.shape(node.input[0], where)) != 4:
        raise where.refuse("only an NCHW input is supported")
    imp.bind(node, f"global_avg_pool({imp.tensor(node.input[0], where)})")


def _reduce_mean(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    """The mean over H and W of an NCHW tensor (as exporters write adaptive average pooling to 1x1)."""
    rank = len(imp.shape(node.input[0], where))
    axes = attrs.get("axes")
    if len(node.input) > 1 and node.input[1]:  # opset 18: the axes are an input
        axes = imp.const(node.input[1])
        if axes is None:
            raise where.refuse("the axes must be a constant")
    got = sorted(int(a) + (rank if int(a) < 0 else 0) for a in np.ravel(axes)) if axes is not None else None
    if rank != 4 or got != [2, 3]:
        raise where.refuse(f"axes {got if got is not None else 'all'} of a rank-{rank} input: deepdsl imports the mean "
                           "over H and W of [N, C, H, W] (global_avg_pool)")  # fmt: skip
    pooled = f"global_avg_pool({imp.tensor(node.input[0], where)})"
    imp.bind(node, pooled if int(attrs.get("keepdims", 1)) else f"flatten({pooled})")


def _batch_norm(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    x = imp.tensor(node.input[0], where)
    stats = [imp.const(i) for i in node.input[1:5]]
    if len(stats) != 4 or any(s is None for s in stats):
        raise where.refuse("scale, B, mean and var must be initialisers (constants)")
    if int(attrs.get("training_mode", 0)):
        raise where.refuse("training_mode=1 is not supported; export the model in inference (eval) mode")
    imp.only_output(node, where)
    if len(imp.shape(node.input[0], where)) not in (2, 4):
        raise where.refuse("deepdsl's batch_norm takes [N, C, H, W] or [N, D]")
    scale, bias, mean, var = (np.asarray(s, np.float32).reshape(-1) for s in stats)  # type: ignore[arg-type]
    kw = {}
    eps, momentum = _attr(attrs.get("epsilon", 1e-5)), _attr(attrs.get("momentum", 0.9))
    if np.float32(eps) != np.float32(1e-5):
        kw["eps"] = _num(eps)
    if np.float32(1 - momentum) != np.float32(0.1):
        kw["momentum"] = _num(1 - momentum)  # ONNX keeps `momentum` of the old statistics, deepdsl (PyTorch) the new
    params = {"gamma": scale, "beta": bias, "running_mean": mean, "running_var": var}
    name = imp.layer(node, where, _call(where, "batch_norm", [], kw), params)
    imp.bind(node, f"{name}({x})", name)


def _flatten(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    rank = len(imp.shape(node.input[0], where))
    axis = int(attrs.get("axis", 1))
    if (axis + rank if axis < 0 else axis) != 1:
        raise where.refuse(f"axis={axis}: the language flattens everything after the batch (axis 1)")
    imp.bind(node, f"flatten({imp.tensor(node.input[0], where)})")


def _reshape(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    shape = imp.shape(node.input[0], where)
    target = imp.const(node.input[1])
    if target is None:
        raise where.refuse("the shape must be a constant (an initialiser or a Constant node)")
    t = [int(v) for v in target.reshape(-1)]
    if int(attrs.get("allowzero", 0)) and 0 in t:
        raise where.refuse(f"shape {t} with allowzero=1 makes an axis of size 0")
    rest = int(np.prod(shape[1:]))
    first_ok = t[0] in (0, shape[0]) or (imp.model_batch is not None and t[0] == imp.model_batch)
    if len(t) == 2 and (first_ok and t[1] in (-1, rest) or t[0] == -1 and t[1] == rest):
        imp.bind(node, f"flatten({imp.tensor(node.input[0], where)})")
        return
    raise where.refuse(f"shape {t} of an input {list(shape)}: deepdsl imports a Reshape to [batch, features] only")


def _concat(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    value = fold("Concat", attrs, [imp.const(i) for i in node.input], None, where)
    if value is not None:  # a shape being put together
        imp.consts[node.output[0]] = value
        return
    rank = len(imp.shape(node.input[0], where))
    axis = int(attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if axis == 0:
        raise where.refuse("axis=0 would concatenate batches")
    xs = [imp.tensor(i, where) for i in node.input]
    if len(xs) == 1:
        imp.env[node.output[0]] = xs[0]
        return
    imp.bind(node, _call(where, "concat", xs, {} if axis == 1 else {"axis": str(axis)}))


def _softmax(fn: str) -> Callable[..., None]:
    def rule(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
        rank = len(imp.shape(node.input[0], where))
        axis = int(attrs.get("axis", -1 if imp.opset >= 13 else 1))
        if rank != 2 or (axis + rank if axis < 0 else axis) != 1:
            raise where.refuse(f"axis={axis} of a rank-{rank} input: the language's {fn} is over axis 1 of [N, K]")
        imp.bind(node, f"{fn}({imp.tensor(node.input[0], where)})")

    return rule


def _lrn(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    size = int(attrs["size"])
    if size % 2 == 0:
        raise where.refuse(f"size={size}: ONNX centres an even window differently from the language (PyTorch)")
    kw = {}
    if size != 5:
        kw["size"] = str(size)
    for key, ours, default in (("alpha", "alpha", 1e-4), ("beta", "beta", 0.75), ("bias", "k", 1.0)):
        v = float(attrs.get(key, default))
        if np.float32(v) != np.float32(default):
            kw[ours] = _num(v)
    imp.bind(node, _call(where, "lrn", [imp.tensor(node.input[0], where)], kw))


def _dropout(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
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
    imp.bind(node, _call(where, "dropout", [x], {} if ratio == 0.5 else {"p": _num(ratio)}))


def _identity(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    c = imp.const(node.input[0])
    if c is not None:
        imp.consts[node.output[0]] = c
    else:
        imp.env[node.output[0]] = imp.tensor(node.input[0], where)


def numpy_helper_value(attrs: dict, where: _Node) -> np.ndarray | None:
    """The value of a Constant node with attributes `attrs`; None for a kind not supported (a sparse tensor)."""
    if "value" in attrs:
        return tensor_array(attrs["value"], f"{where.file}: node '{where.name}' (Constant): its value", require_onnx())
    if len(attrs) == 1 and next(iter(attrs)) in ("value_float", "value_floats", "value_int", "value_ints"):
        key, v = next(iter(attrs.items()))
        return np.asarray(v, dtype=np.float32 if "float" in key else np.int64)
    return None


def _constant(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    value = numpy_helper_value(attrs, where)
    if value is None:
        raise where.refuse(f"a constant given as {', '.join(attrs) or 'nothing'} is not supported")
    imp.consts[node.output[0]] = value


def fold(
    op: str, attrs: dict, xs: list[np.ndarray | None], shape: tuple[int, ...] | None, where: _Node
) -> np.ndarray | None:
    """The value of a shape computation: Shape of a tensor of `shape` (at the imported batch), Gather, Unsqueeze,
    Squeeze, Cast and Concat of constants `xs`; None where an input is not known. What cannot be computed (an index
    out of range, a Cast to a string) is refused at the node `where`."""
    try:
        return _fold(op, attrs, xs, shape, where)
    except (ValueError, IndexError, TypeError) as exc:  # numpy's: shapes that do not concatenate, an axis too far
        raise where.refuse(f"it cannot be computed: {str(exc)[:300]}") from None


def _fold(
    op: str, attrs: dict, xs: list[np.ndarray | None], shape: tuple[int, ...] | None, where: _Node
) -> np.ndarray | None:
    if op == "Shape":
        return None if shape is None else np.asarray(shape, np.int64)[int(attrs.get("start", 0)) : attrs.get("end")]
    if not xs or xs[0] is None:
        return None
    x = xs[0]
    if op == "Concat":
        return None if any(v is None for v in xs) else np.concatenate(xs, axis=int(attrs.get("axis", 0)))  # type: ignore
    if op == "Gather":
        if len(xs) < 2 or xs[1] is None:
            return None
        axis, index = int(attrs.get("axis", 0)), xs[1]
        if not -x.ndim <= axis < x.ndim:
            raise where.refuse(f"axis={axis} is out of range for a constant of rank {x.ndim}")
        size = x.shape[axis]
        if index.dtype.kind not in "iu" or index.size and not (-size <= index.min() and index.max() < size):
            raise where.refuse(f"indices {index.reshape(-1)[:8].tolist()} out of range for an axis of {size}")
        return np.take(x, index, axis=axis)
    if op in ("Unsqueeze", "Squeeze"):
        axes = attrs["axes"] if "axes" in attrs else xs[1] if len(xs) > 1 else None
        if op == "Squeeze":
            return np.squeeze(x, axis=None if axes is None else tuple(int(v) for v in np.ravel(axes)))
        if axes is None:
            return None
        rank = x.ndim + len(np.ravel(axes))
        for a in sorted(int(v) + (rank if int(v) < 0 else 0) for v in np.ravel(axes)):
            x = np.expand_dims(x, a)
        return x
    if op == "Cast":
        to = int(attrs.get("to", 0))
        if to not in _DTYPES:
            from onnx import TensorProto

            kind = TensorProto.DataType.Name(to) if to in TensorProto.DataType.values() else f"type {to}"
            raise where.refuse(f"a Cast to {kind}: deepdsl folds Casts to numbers only")
        return x.astype(np.dtype(_DTYPES[to]).newbyteorder("="))
    return None


def _folded(imp: _Importer, k: int, node: Any, where: _Node, attrs: dict) -> None:
    shape = imp.shape(node.input[0], where) if node.op_type == "Shape" else None
    value = fold(node.op_type, attrs, [imp.const(i) for i in node.input], shape, where)
    if value is None:
        raise where.refuse(f"deepdsl imports {node.op_type} of constants and shapes only (as exporters compute "
                           "shapes)")  # fmt: skip
    imp.consts[node.output[0]] = np.asarray(value)


_RULES: dict[str, Callable[..., None]] = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": _matmul, "Add": _arith, "Sub": _arith, "Mul": _arith, "Div": _arith,
    "Relu": _unary("relu"), "Sigmoid": _unary("sigmoid"), "Tanh": _unary("tanh"), "LeakyRelu": _leaky,
    "MaxPool": _pool("max_pool"), "AveragePool": _pool("avg_pool"), "GlobalAveragePool": _global_avg,
    "ReduceMean": _reduce_mean, "BatchNormalization": _batch_norm, "Flatten": _flatten, "Reshape": _reshape,
    "Concat": _concat,
    "Softmax": _softmax("softmax"), "LogSoftmax": _softmax("log_softmax"), "LRN": _lrn, "Dropout": _dropout,
    "Identity": _identity, "Constant": _constant, **{op: _folded for op in FOLDED},
}  # fmt: skip
assert set(_RULES) == set(SUPPORTED) | set(FOLDED)


SMALL_CONSTANT = 64  # elements: an initialiser this small (a shape, a ratio) stays a constant in the skeleton


def skeleton(model: Any) -> Any:
    """`model` without its weights' data: every initialiser larger than SMALL_CONSTANT becomes a graph input of its
    type, so that the checker and shape inference need not copy or read a 100 MB model."""
    onnx = require_onnx()
    from onnx import helper

    graph = model.graph
    m = onnx.ModelProto(**{f.name: v for f, v in model.ListFields() if f.name != "graph"})
    g = m.graph
    g.CopyFrom(onnx.GraphProto(**{f.name: v for f, v in graph.ListFields() if f.name != "initializer"}))
    listed = {i.name for i in g.input}
    for t in graph.initializer:
        if math.prod(t.dims) <= SMALL_CONSTANT:
            g.initializer.append(t)
        elif t.name not in listed:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return m


def load_model(path: str | Path) -> Any:
    """The ModelProto in `path`; a missing, huge or malformed file is a user error."""
    onnx = require_onnx()
    p = Path(path)
    if not p.is_file():
        raise DslProgramError(f"'{path}' is not a regular file" if p.exists() else f"file not found: '{path}'")
    if p.stat().st_size > MAX_ONNX_BYTES:
        raise DslProgramError(f"'{path}' is larger than 2 GiB; save the model with external data")
    try:
        model = onnx.load_model(str(p), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 — protobuf's DecodeError and friends
        raise DslProgramError(f"'{path}' is not an ONNX model: {type(exc).__name__}: {exc}") from None
    if not model.HasField("graph"):
        raise DslProgramError(f"'{path}' is not an ONNX model (it holds no graph)")
    read_external_data(model, p, onnx)  # before the checker, which would look for the files in the cwd
    try:
        onnx.checker.check_model(skeleton(model))
    except Exception as exc:  # noqa: BLE001 — onnx.checker.ValidationError
        raise DslProgramError(f"'{path}' is not a valid ONNX model: {str(exc).strip().splitlines()[0]}") from None
    return model


def tensor_array(t: Any, what: str, onnx: Any) -> np.ndarray:
    """The array `t` (a TensorProto whose data is in the model) holds, checked before anything is allocated: an
    element type deepdsl reads, at most MAX_ELEMENTS elements, and data of the length its dims need (dims that lie
    about it are refused, not reshaped)."""
    from onnx import numpy_helper

    name = t.name if len(t.name) <= 200 else f"{t.name[:100]}...({len(t.name):,} characters)"
    where = f"{what} '{name}'"
    dtype = _DTYPES.get(t.data_type)
    if dtype is None:
        kind = onnx.TensorProto.DataType.Name(t.data_type) if t.data_type in onnx.TensorProto.DataType.values() else (
            f"type {t.data_type}")  # fmt: skip
        raise DslProgramError(f"{where} holds {kind} elements; deepdsl reads tensors of numbers")
    dims = [int(d) for d in t.dims]
    count = math.prod(dims)
    if any(d < 0 for d in dims) or count > MAX_ELEMENTS:
        raise DslProgramError(f"{where} has dims {dims}; at most {MAX_ELEMENTS:,} elements, none negative")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise DslProgramError(f"{where} keeps its data in an external file")  # read_external_data reads them all
    if t.raw_data:
        held, need = len(t.raw_data), count * np.dtype(dtype).itemsize
        unit = "bytes"
    else:
        field = {1: "float_data", 7: "int64_data", 11: "double_data", 12: "uint64_data", 13: "uint64_data"}.get(
            t.data_type, "int32_data")  # fmt: skip
        held, need, unit = len(getattr(t, field)), count, "values"
    if held != need:
        raise DslProgramError(f"{where}: its dims {dims} need {need:,} {unit} of data, it holds {held:,}")
    try:
        return np.asarray(numpy_helper.to_array(t))
    except (ValueError, TypeError) as exc:
        raise DslProgramError(f"{where} cannot be read: {exc}") from None


def read_external_data(model: Any, path: Path, onnx: Any) -> None:
    """Every tensor of `model` that keeps its data in an external file (initialisers as PyTorch's exporter writes
    them for a large model, a Constant's value, anywhere in the model) given that data, read from the model's
    folder only: a location that is absolute, climbs out with `..` or leads out through a link is refused, and so
    is anything but a regular file, and an offset or length past the file's end; at most MAX_EXTERNAL_BYTES in
    all. Never onnx's own loader, which resolves the location against the current directory."""
    root = os.path.realpath(path.parent)
    total = 0
    todo: list[Any] = [model]  # every message of the model, without recursion (subgraphs may nest deep)
    while todo:
        m = todo.pop()
        if isinstance(m, onnx.TensorProto):
            if m.data_location == onnx.TensorProto.EXTERNAL:
                total += _read_external(m, root, str(path), MAX_EXTERNAL_BYTES - total)
            continue
        for f, v in m.ListFields():
            if f.message_type is None:
                continue
            if hasattr(v, "ListFields"):  # one message, else a repeated field of them
                todo.append(v)
            else:
                todo.extend(v)


def _read_external(t: Any, root: str, file: str, budget: int) -> int:
    """Read `t`'s external data into it (raw_data) and return its length; see read_external_data."""
    info = {e.key: e.value for e in t.external_data}
    name = t.name if len(t.name) <= 200 else f"{t.name[:100]}...({len(t.name):,} characters)"
    location = info.get("location", "")
    shown = location if len(location) <= 200 else f"{location[:100]}..."

    def refuse(why: str) -> DslProgramError:
        return DslProgramError(f"'{file}': tensor '{name}' keeps its data in '{shown}', {why}")

    if not location or "\x00" in location:
        raise refuse("which names no file")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", location):
        raise refuse("an absolute path; deepdsl reads external data from the model's own folder only")
    if ".." in re.split(r"[/\\]", location):
        raise refuse("which climbs out of the model's folder; deepdsl reads external data from that folder only")
    target = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, target]) != root or target == root:
        raise refuse("which leads out of the model's folder (through a link); deepdsl reads external data from "
                     "that folder only")  # fmt: skip
    numbers = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is not None and not (text.isascii() and text.isdigit() and len(text) <= 19):
            raise refuse(f"at {key} '{text[:40]}', which is not a byte count")
        numbers[key] = None if text is None else int(text)
    dtype = _DTYPES.get(t.data_type)
    if dtype is None:  # tensor_array says what it holds
        return 0
    need = math.prod(int(d) for d in t.dims) * np.dtype(dtype).itemsize
    if need > budget or any(d < 0 for d in t.dims):
        raise refuse(f"for dims {list(t.dims)}: more than the {MAX_EXTERNAL_BYTES:,} bytes deepdsl reads in all")
    fd = _open_below(root, os.path.relpath(target, root), refuse)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse("which is not a regular file")
        offset = numbers["offset"] or 0
        length = st.st_size - offset if numbers["length"] is None else numbers["length"]
        if offset > st.st_size or offset + length > st.st_size:
            raise refuse(f"at offset {offset:,}, {length:,} bytes, past the end of the file ({st.st_size:,} bytes)")
        if length != need:
            raise refuse(f"{length:,} bytes, but its dims {list(t.dims)} need {need:,}")
        chunks, at = [], offset
        while at < offset + length:  # the file may shrink meanwhile: a short read is an error, never a hang
            chunk = os.pread(fd, min(offset + length - at, 2**26), at)
            if not chunk:
                raise refuse("which ended early while it was read")
            chunks.append(chunk)
            at += len(chunk)
    finally:
        os.close(fd)
    t.raw_data = b"".join(chunks)
    del t.external_data[:]
    t.data_location = 0  # DEFAULT: the data is in the tensor now
    return length


def _open_below(root: str, rel: str, refuse: Callable[[str], DslProgramError]) -> int:
    """A descriptor of the file `rel` below the folder `root`, each part opened below the one before without
    following a link (`rel` was resolved already: a link put there since is refused), non-blocking (a FIFO)."""
    parts = rel.split(os.sep)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        if os.open not in os.supports_dir_fd:  # no openat: the resolved path, its last part not followed
            return os.open(os.path.join(root, rel), flags | getattr(os, "O_NONBLOCK", 0))
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            for part in parts[:-1]:
                inner = os.open(part, flags | getattr(os, "O_DIRECTORY", 0), dir_fd=fd)
                os.close(fd)
                fd = inner
            return os.open(parts[-1], flags | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise refuse(f"which cannot be read: {e.strerror or e}") from None


def import_model(path: str | Path, batch: int | None = None, loss: bool = True) -> Imported:
    """The model in `path` as `.ddsl` text and parameter arrays; `batch` fixes N (default: the model's, or 1 where
    it is symbolic); `loss` adds a label and a classification loss (else a regression against a `target` input)."""
    return _Importer(load_model(path), str(path), batch, loss).run()
