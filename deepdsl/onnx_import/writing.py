"""Writing the `.ddsl` text of an import: the names it makes (`Names`: sanitised, unique, none the language
takes), numbers and pairs as literals, a built-in's call with its keywords checked against the ranges the built-in
takes (`call`), the node being imported (`Node`, for messages), the one error that lists every node refused
(`refusals`) and the result (`Imported`)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.frontend.builtins import BUILTINS, QUERIES
from deepdsl.frontend.transformer import RESERVED
from deepdsl.ir.types import INT_MAX

MAX_NAME = 64  # characters of a name the import makes (the language takes 128; `_2` suffixes need room)


# what exporters call every graph: the network is named after the file instead
GENERIC_GRAPH_NAMES = frozenset({"main_graph", "torch_jit", "torch-jit-export", "torch_jit_export"})


# names a binding may not take: the language's reserved words and built-ins, and the train block's functions
TAKEN = frozenset(RESERVED | set(BUILTINS) | set(QUERIES)) | frozenset(
    "sum max he xavier gaussian uniform constant sgd adam synthetic mnist cifar10 npz".split()
)


@dataclass(frozen=True)
class Imported:
    text: str  # the .ddsl source
    arrays: dict[str, np.ndarray]  # every parameter and state array under its deepdsl name
    network: str
    shared: tuple[tuple[str, int], ...] = ()  # (layer, nodes) of each layer written once for several nodes
    folded_norms: tuple[str, ...] = ()  # convolution layers holding a batch norm the exporter folded into them
    tied: tuple[tuple[str, str], ...] = ()  # (head, embedding) of each head tied to an embedding's table


class Names:
    """Sanitised, unique names in the one top-level scope of the written file."""

    def __init__(self) -> None:
        self.used: set[str] = set(TAKEN)

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


def attr(v: float) -> float:
    """A float32 attribute as the decimal it was written as (0.8 stored as 0.800000011920929 reads 0.8)."""
    return float(str(np.float32(v)))


def num(v: float) -> str:
    """A float32 number as the shortest literal that reads back to the same float32 (`1e-05`, `0.1`, `2.0`)."""
    f = np.float32(v)
    if not np.isfinite(f):
        raise ValueError(f"{v} is not finite")
    text = repr(float(f)) if float(f).is_integer() else str(f)
    return text if any(c in text for c in ".e") else text + ".0"


def pair(values: tuple[int, ...]) -> str:
    return str(values[0]) if values[0] == values[1] else f"({values[0]}, {values[1]})"


def call(where: Node, fn: str, args: list[str], kw: dict[str, str]) -> str:
    """The call `fn(args, key=value, ...)`, each keyword's value (as written) checked against the range the built-in
    takes, so that an attribute the language refuses is refused here, at its node."""
    need(where, fn)
    specs = {a.name: a for a in BUILTINS[fn].args}
    for key, text in kw.items():
        spec = specs.get(key)
        if spec is None:
            raise where.refuse(f"it needs {fn}(..., {key}={text}), which the language has no {key}= for in this build")
        if text in ("true", "false") or spec.kind == "table":  # a flag, or a layer's name (tied=)
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


def need(where: Node, fn: str) -> None:
    """Refuse the node where the built-in `fn` that its text calls is not in this build of the language."""
    if fn not in BUILTINS:
        raise where.refuse(f"it needs the built-in `{fn}`, which is not in this build of the language")


@functools.cache
@dataclass
class Node:
    """The node being imported, for messages."""

    file: str
    name: str
    op: str
    opset: int
    base: str  # what names its layer: the node's name less PyTorch's trailing `/OpType`

    def refuse(self, why: str, hint: str | None = None) -> NodeRefused:
        return NodeRefused(self, why, hint)

    @property
    def label(self) -> str:
        return f"node '{self.name}' ({self.op}, opset {self.opset})"


class NodeRefused(DslProgramError):
    """One node the language cannot say: the node and why (the importer gathers every one before it reports)."""

    def __init__(self, node: Node, why: str, hint: str | None = None):
        super().__init__(f"{node.file}: {node.label}: {why}", hint=hint)
        self.node = node
        self.why = why


def refusals(file: str, opset: int, gaps: list[NodeRefused], after: list[NodeRefused]) -> DslProgramError:
    """One error listing every node that cannot be imported, grouped by op type (in the order each type first
    appears), each node with its name, opset and why; then the nodes refused only after reading such a node's
    output (they may follow from it)."""
    groups: dict[str, list[NodeRefused]] = {}
    for e in gaps:
        groups.setdefault(e.node.op, []).append(e)
    total = len(gaps) + len(after)
    lines = [f"{file}: {total} nodes cannot be imported (opset {opset}); by op type:"]
    for op, es in groups.items():
        lines.append(f"  {op} ({len(es)} node{'s' if len(es) > 1 else ''}):")
        lines += [f"    {e.node.label}: {e.why}" for e in es]
    if after:
        lines.append(f"  and {len(after)} that read the output of a node above (refused perhaps only for that):")
        lines += [f"    {e.node.label}: {e.why}" for e in after]
    hints = [e.hint for e in (*gaps, *after) if e.hint]
    return DslProgramError("\n".join(lines), hint=hints[0] if hints else None)
