"""What the import rule families share: an axis counted from the start (`positive_axis`), a node's constant inputs
(`inputs_const`), a shape as the language writes it, its first axis in terms of the batch N (`dims`), and a node
standing for a later node's output (`Renamed`: the Add folded into a MatMul, the second of two Resizes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from deepdsl.onnx_import.writing import Node

if TYPE_CHECKING:
    from deepdsl.onnx_import.importer import Importer


def dims(imp: Importer, shape: tuple[int, ...], value: str | None = None) -> str:
    """A shape as the language writes it, its first axis in terms of the batch N where it is N or a multiple of it
    (so that `--batch`, or an edited `const N`, changes it too): as the second shape inference of a model with a
    symbolic batch told for `value` (`Importer.per_batch`), else where the axis is a multiple of the batch."""
    n = imp.n
    parts = [str(d) for d in shape]
    if shape and value in imp.per_batch:
        per = imp.per_batch[value]
        if per is not None:
            parts[0] = "N" if per == 1 else f"N * {per}"
    elif shape and n > 1 and shape[0] % n == 0:
        parts[0] = "N" if shape[0] == n else f"N * {shape[0] // n}"
    elif shape and n == 1 and shape[0] == 1:
        parts[0] = "N"
    return f"({', '.join(parts)})"


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
