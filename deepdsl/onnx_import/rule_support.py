"""What the import rule families share: an axis counted from the start (`positive_axis`), a node's constant inputs
(`inputs_const`), a shape as the language writes it, its first axis in terms of the batch N (`dims`, told by
`per_batch`), and a node standing for a later node's output (`Renamed`: the Add folded into a MatMul, the second of
two Resizes)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.onnx_import.inference import infer_shapes
from deepdsl.onnx_import.writing import Node

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def per_batch(imp: Importer) -> dict[str, int | None]:
    """Each value's first axis over the batch N (None where it does not scale with it), where the model's batch is
    symbolic: told apart by a second shape inference at another batch (at batch 1, [N·16, 32] and [16, 32] look
    alike), so that `dims` writes `N * 16`; empty where the batch is fixed or the model runs at one batch only (a
    constant shape), where `dims` guesses. Worked out when first asked (most models never ask) and kept."""
    if imp.multiples is None:
        imp.multiples = {}
        n = imp.n
        try:
            probe = infer_shapes(imp, imp.data_names, n + 1)[0] if imp.model_batch is None else {}
        except DslProgramError:
            probe = {}
        for v, got in imp.shapes.items():
            other = probe.get(v)
            if got and other and len(got) == len(other) and v not in imp.consts:
                scales = got[0] % n == 0 and other[0] == got[0] // n * (n + 1) and got[0] != other[0]
                imp.multiples[v] = got[0] // n if scales else None
    return imp.multiples


def value_readers(imp: Importer, name: str) -> list[tuple[int, Any]]:
    """The nodes reading `name`'s values: not a Shape, nor a CastLike whose type it gives, which read only what is
    known of it (the dynamo exporter's unoptimised graphs cast each constant like the tensor it meets)."""
    return [
        (j, r)
        for j, r in imp.readers.get(name, [])
        if r.op_type != "Shape" and not (r.op_type == "CastLike" and list(r.input[1:2]) == [name] != r.input[:1])
    ]


def vocabulary(imp: Importer, name: str) -> int | None:
    """The rows of the constant table every reader of integer input `name` gathers from (an embedding); None where
    another node reads it (the model's integer inputs are token ids, or refused)."""
    sizes = set()
    for node in imp.graph.node:
        if name in node.input:
            table = imp.consts.get(node.input[0])
            if node.op_type != "Gather" or list(node.input) != [node.input[0], name] or table is None:
                return None
            sizes.add(int(table.shape[0]))
    return sizes.pop() if len(sizes) == 1 else None


def initialisers_read(imp: Importer, name: str) -> set[str]:
    """The initialisers constant `name` is computed from (itself, where it is one), through the nodes folded here."""
    names = {t.name for t in imp.graph.initializer}
    found: set[str] = set()

    def walk(origin: tuple) -> None:
        if origin[0] == "tensor":
            found.update({origin[1]} & names)
        elif origin[0] != "value":
            for o in origin[2]:
                if o is not None:
                    walk(o)

    walk(imp.origin(name))
    return found


def module_parameter(imp: Importer, name: str, where: Node) -> bool:
    """Whether constant `name` is read from an initialiser named as a PyTorch module's parameter or buffer
    (`features.1.0.layer_scale`), not one an exporter made (`onnx::Mul_12`, `val_3`) nor a computed constant; and,
    where the node names its module (`where.base`: the dynamo exporter's `features.1.0`, the TorchScript exporter's
    `/features/features.1/features.1.0`), of that module: an exporter that merges equal initialisers gives a
    non-affine norm's ones another module's weight."""
    named = [n for n in initialisers_read(imp, name) if re.fullmatch(r"\w+(\.\w+)+", n)]
    if where.base == where.name:  # the node names no module (another exporter, or no metadata)
        return bool(named)
    module = where.base.rsplit("/", 1)[-1]
    return any(n.rsplit(".", 1)[0] == module for n in named)


def computed_zeros(imp: Importer, name: str) -> bool:
    """Whether constant `name` is all zeros and comes from no initialiser: a zero the exporter computed (PyTorch's
    dynamo exporter without its optimiser writes a convolution of `bias=False` with the bias
    `Expand(CastLike(0))`), which stands for no parameter of the model, unlike a zero bias held as an initialiser."""
    value = imp.consts.get(name)
    return value is not None and not value.any() and not initialisers_read(imp, name)


def folded_norm(imp: Importer, node: Any) -> bool:
    """Whether PyTorch's exporter folded a batch norm into convolution `node` (both exporters do in eval mode): the
    dynamo exporter says so in the node's metadata (its innermost module is the BatchNorm), the TorchScript one names
    the weight it computed `onnx::Conv_NNN` where a convolution's own weight keeps its module's name."""
    modules = re.findall(r"'([^']*)'", next((p.value[:4000] for p in node.metadata_props
                                              if p.key == "pkg.torch.onnx.class_hierarchy"), ""))  # fmt: skip
    if len(modules) >= 2:
        return "BatchNorm" in modules[-2]
    return imp.model.producer_name == "pytorch" and any(
        re.fullmatch(r"onnx::Conv_[0-9]+", n) for n in initialisers_read(imp, node.input[1])
    )


def dims(imp: Importer, shape: tuple[int, ...], value: str | None = None) -> str:
    """A shape as the language writes it, its first axis in terms of the batch N where it is N or a multiple of it
    (so that `--batch`, or an edited `const N`, changes it too): as the second shape inference of a model with a
    symbolic batch told for `value` (`per_batch`), else where the axis is a multiple of the batch."""
    n = imp.n
    parts = [str(d) for d in shape]
    multiples = per_batch(imp) if value is not None else {}
    if shape and value in multiples:
        per = multiples[value]
        if per is not None:
            parts[0] = "N" if per == 1 else f"N * {per}"
    elif shape and n > 1 and shape[0] % n == 0:
        parts[0] = "N" if shape[0] == n else f"N * {shape[0] // n}"
    elif shape and n == 1 and shape[0] == 1:
        parts[0] = "N"
    return f"({', '.join(parts)})"


def signature(rank: int) -> str:
    """A tensor function's one input of rank `rank`, its sizes named: `t[S0, S1, ...]`."""
    return f"t[{', '.join(f'S{d}' for d in range(rank))}]"


def broadcast_read(param: str, cshape: tuple[int, ...], rank: int) -> str:
    """The read of a tensor function's parameter `param` of shape `cshape` (a constant broadcast against the output
    of rank `rank`, aligned on the last axes) at the output's indices i0, i1, ...: index 0 where it has size 1."""
    at = [f"i{d}" for d in range(rank)][rank - len(cshape) :]
    return f"{param}[{', '.join('0' if n == 1 else at[d] for d, n in enumerate(cshape)) or '0'}]"


def positive_axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def inputs_const(imp: Importer, node: Any, where: Node, start: int) -> list[np.ndarray | None]:
    """The node's inputs from `start` on as constants (None where absent); a computed one is refused."""
    out: list[np.ndarray | None] = []
    for name in node.input[start:]:
        if not name:
            out.append(None)
            continue
        c = imp.const(name)
        if c is None:
            raise where.refuse(f"its input '{name}' must be a constant")
        out.append(c)
    return out


@dataclass
class Renamed:
    """A node whose result is another node's output (the Add folded into a MatMul)."""

    node: Any
    out: str

    def __getattr__(self, key: str) -> Any:
        return getattr(self.node, key)

    @property
    def output(self) -> list[str]:
        return [self.out]
