"""The tensor IR: typed SSA values, statements, graphs, and the op registry."""

from deepdsl.ir.builder import GraphBuilder
from deepdsl.ir.graph import Graph, Init, InputDef, ParamDef, Stmt, Value
from deepdsl.ir.registry import REGISTRY, OpDef, defop, lookup
from deepdsl.ir.types import DType, ShapeError, TensorType

__all__ = [
    "REGISTRY", "DType", "Graph", "GraphBuilder", "Init", "InputDef", "OpDef", "ParamDef", "ShapeError",
    "Stmt", "TensorType", "Value", "defop", "lookup",
]  # fmt: skip
