"""What every part of `deepdsl export` writes through: `Writer`, the ONNX nodes and initialisers of one model,
each node named after its layer and carrying its statement's place in the source (onnx_export, onnx_nodes,
onnx_convs, onnx_recurrent and onnx_indexed all write with it). `onnx` is imported only when a model is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.ir import Graph, Stmt

DEFAULT_OPSET = 17
ONNX_EXTRA = "pip install 'deepdsl[onnx]'"


def require_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise DslProgramError(f"reading and writing ONNX needs the onnx package: {ONNX_EXTRA}") from None
    return onnx


class Writer:
    def __init__(self, g: Graph, arrays: Mapping[str, np.ndarray]):
        self.onnx = require_onnx()
        self.g = g
        self.arrays = arrays
        self.nodes: list[Any] = []
        self.inits: dict[str, np.ndarray] = {}
        self.count = 0
        self.names: set[str] = set()
        self.opset = DEFAULT_OPSET  # export_graph sets the one asked for
        self.users: dict[str, list[Stmt]] = {}

    def const(self, hint: str, value: np.ndarray) -> str:
        self.count += 1
        name = f"{hint}/const{self.count}"
        self.inits[name] = value
        return name

    def node(self, op: str, inputs: list[str], output: str, s: Stmt, **attrs: Any) -> None:
        """A node named after its layer (`cv1`), or `layer/Op`, `layer/Op_2`, ... where that is taken."""
        base = s.layer or op
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}/{op}" if k == 2 else f"{base}/{op}_{k - 1}"
        self.names.add(name)
        # where it comes from, the file without its folder (a model is shared; the folder is the user's business)
        where = f"{os.path.basename(s.span.file)}:{s.span.line}:{s.span.col} " if s.span else ""
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [output], name=name,
                                                     doc_string=f"{where}{s.op}", **attrs))  # fmt: skip


def users_of(g: Graph) -> dict[str, list[Stmt]]:
    users: dict[str, list[Stmt]] = {}
    for s in g.stmts:
        for v in s.inputs:
            users.setdefault(v.name, []).append(s)
    return users
